//! PostgreSQL logical and physical replication on Tokio, with exact acknowledgements.
//!
//! Layers:
//!
//! * [`pgwal_protocol`] (re-exported as [`protocol`]): sans-IO messages;
//! * [`Config`]: connection strings, environment, password file, TLS modes;
//! * [`ReplicationClient`]: a replication connection (startup, cleartext /
//!   MD5 / SCRAM-SHA-256 authentication, TLS through rustls) and the
//!   replication commands;
//! * [`LogicalStream`]: a `futures::Stream` of typed [`Event`]s whose
//!   feedback reports only what the consumer acknowledged;
//! * [`PhysicalReceiver`]: physical WAL streaming into segment files like
//!   `pg_receivewal`, acknowledging on receipt, write or fsync ([`AckMode`]).
//!
//! # Acknowledgement semantics
//!
//! * The consumer calls [`LogicalStream::ack`] (or [`AckHandle::ack`]) with
//!   an event's [`Event::ack_lsn`] once that event and all before it are
//!   durably processed.
//! * Feedback (standby status updates, every
//!   [`StreamConfig::status_interval`] and whenever the server asks) reports
//!   the acknowledged position as write/flush/apply, never a merely received one.
//! * After a connection loss the stream reconnects and restarts at the
//!   acknowledged position; an [`Event::Reconnected`] marks the restart and
//!   every unacknowledged event is delivered again (at-least-once).
//! * When every received event is acknowledged and no transaction is open,
//!   the server's keepalive WAL position is confirmed, so an idle
//!   publication never pins WAL.
//! * Events pass through a bounded buffer: a slow consumer stops the reading
//!   of the socket (backpressure), never the feedback timer.
#![warn(missing_docs, rust_2018_idioms)]
// One module (low_water) sets a socket option through libc.
#![deny(unsafe_code)]

mod client;
mod commands;
mod config;
pub mod de;
mod error;
mod event;
mod framing;
mod logical_stream;
mod low_water;
mod pgpass;
mod physical_config;
mod physical_stream;
mod progress;
mod relations;
mod retry;
mod silence;
mod slot_state;
pub mod snapshot;
mod socket;
mod stage_hook;
mod startup;
mod stream_config;
mod tls;
pub mod types;
mod wal_dir;
mod worker;

pub use client::{ReplicationClient, SimpleRow};
pub use commands::{
    quote_ident, quote_literal, CreateSlotOptions, IdentifySystem, NextTimeline, SlotHealth,
    SlotInfo, SlotSnapshot, TimelineHistory,
};
pub use config::{ChannelBinding, Config, SslMode, TargetSessionAttrs};
pub use error::{DbError, Error, Result};
pub use event::{Change, Event, Row, TruncateEvent};
pub use logical_stream::LogicalStream;
pub use physical_config::{AckMode, PhysicalConfig};
pub use physical_stream::{PhysicalProgress, PhysicalReceiver, StopReason};
pub use progress::AckHandle;
pub use retry::RetryConfig;
pub use stage_hook::{Gate, Stage, StageHook};
pub use stream_config::{StreamConfig, Streaming};

pub use pgwal_protocol as protocol;
pub use pgwal_protocol::Lsn;
