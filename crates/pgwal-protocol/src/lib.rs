//! Sans-IO building blocks for PostgreSQL logical replication.
//!
//! This crate performs no I/O and depends on no runtime. It provides:
//!
//! * [`Lsn`], a WAL position with PostgreSQL's `X/Y` text form;
//! * [`replication`], the CopyData payloads exchanged during `START_REPLICATION`
//!   (XLogData, primary keepalive, standby status update, hot standby feedback);
//! * [`pgoutput`], a decoder and an encoder for every message of the `pgoutput`
//!   plugin, protocol versions 1 to 4 (streaming and two-phase included);
//! * [`PgTimestamp`], PostgreSQL's microseconds-since-2000 timestamps;
//! * [`walfile`], WAL segment and timeline history file names.
//!
//! Decoding never panics on malformed input: every failure is a [`DecodeError`].
//!
//! ```
//! use bytes::Bytes;
//! use pgwal_protocol::pgoutput::{Decoder, LogicalMessage};
//!
//! // A pgoutput Begin message: final LSN, commit time, xid.
//! let mut raw = vec![b'B'];
//! raw.extend_from_slice(&0x1_6B37_4D48u64.to_be_bytes());
//! raw.extend_from_slice(&0i64.to_be_bytes());
//! raw.extend_from_slice(&742u32.to_be_bytes());
//! let msg = Decoder::new().decode(Bytes::from(raw.clone())).unwrap();
//! match &msg {
//!     LogicalMessage::Begin(b) => {
//!         assert_eq!(b.xid, 742);
//!         assert_eq!(b.final_lsn.to_string(), "1/6B374D48");
//!     }
//!     _ => unreachable!(),
//! }
//! // Encoding gives back the same bytes.
//! assert_eq!(msg.to_bytes(), raw);
//! ```
#![warn(missing_docs, rust_2018_idioms)]
#![forbid(unsafe_code)]

mod codec;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod lsn;
pub mod pgoutput;
pub mod replication;
mod timestamp;
pub mod walfile;

pub use error::DecodeError;
pub use lsn::{Lsn, ParseLsnError};
pub use timestamp::{format_pg_date, PgTimestamp};
