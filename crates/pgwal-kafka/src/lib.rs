//! pgwal → Apache Kafka.
//!
//! This crate turns the changes of a [`pgwal::LogicalStream`] into Kafka
//! records: which topic ([`routing`]), which key (the row's replica
//! identity, or its primary key under `REPLICA IDENTITY FULL`: [`keys`])
//! and which value ([`mod@format`]: pgwal's own JSON, or the envelope
//! Debezium's PostgreSQL connector writes, so that Kafka Connect sinks and
//! Debezium consumers read it unchanged), all without I/O; and the
//! transactional [`producer`] that writes them together with a [`progress`]
//! record, so that a restart knows exactly what Kafka holds; and the
//! [`sink`] that drives a stream into it exactly once (`pgwal stream
//! --sink kafka`), its keys and values in JSON or, with a schema
//! [`registry`], in Avro ([`avro_converter`]).
#![warn(missing_docs)]

pub mod avro_converter;
pub mod bad_records;
mod client;
pub mod format;
pub mod keys;
pub mod live;
pub mod producer;
pub mod progress;
pub mod registry;
pub mod routing;
mod server_history;
pub mod sink;
mod slot_lock;
pub mod snapshot;
mod spill;

pub use bad_records::{BadRecordPolicy, BadRecordReason};
pub use format::{encode, encode_read, DecimalMode, Format, Record, TxInfo, TxOrder};
pub use keys::{KeyColumns, KeyColumnsError};
pub use live::SinkLive;
pub use registry::{Compatibility, RegistryConfig, SubjectStrategy};
pub use routing::{Routing, RoutingError};
pub use sink::{run, SinkConfig, SinkError, SinkStats};
