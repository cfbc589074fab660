//! pgwal → Apache Kafka.
//!
//! This crate turns the changes of a [`pgwal::LogicalStream`] into Kafka
//! records: which topic ([`routing`]), which key (the row's replica
//! identity) and which value ([`mod@format`]: pgwal's own JSON, or the envelope
//! Debezium's PostgreSQL connector writes, so that Kafka Connect sinks and
//! Debezium consumers read it unchanged). It does no I/O.
//!
//! The transactional producer that writes them exactly once is not here
//! yet (issue 23).
#![warn(missing_docs)]

pub mod format;
pub mod routing;

pub use format::{encode, DecimalMode, Format, Record, TxInfo};
pub use routing::{Routing, RoutingError};
