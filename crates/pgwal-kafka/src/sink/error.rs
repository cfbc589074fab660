//! Why the sink stopped.

use super::*;

/// Errors of the sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// From PostgreSQL or the stream (with its SQLSTATE, if any).
    #[error(transparent)]
    Postgres(#[from] pgwal::Error),
    /// Kafka kept failing for longer than `retry_for`.
    #[error("Kafka failed for {:.0?} (retry_for); last error: {last}", .for_)]
    Kafka {
        /// How long.
        for_: Duration,
        /// The last error.
        last: ProducerError,
    },
    /// No broker could be used for longer than `retry_for`, and none ever
    /// was: the brokers' addresses, or the listener's protocol, may be
    /// wrong. Nothing was written or acknowledged.
    #[error("no Kafka broker could be used for {:.0?} (retry_for), and none ever was: check --kafka-brokers and that security.protocol matches the listener at that port; last error: {last}", .for_)]
    KafkaNeverConnected {
        /// How long.
        for_: Duration,
        /// The last error.
        last: ProducerError,
    },
    /// A broker refused pgwal before it had ever connected (TLS or SASL
    /// authentication failed): a configuration error, not retried. Nothing
    /// was written to Kafka or acknowledged to the slot.
    #[error("{0} (nothing was written or acknowledged; check security.protocol and the ssl.* and sasl.* options)")]
    KafkaRefused(ProducerError),
    /// A change that cannot be written faithfully; nothing after it was
    /// acknowledged.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A change that cannot be written, under [`BadRecordPolicy::Fail`];
    /// nothing from its transaction on was written or acknowledged.
    #[error("{table}: the change at {lsn} cannot be written: {reason}; nothing from its transaction on was written or acknowledged. Remove the cause, or run with --kafka-bad-records skip or dead-letter to go on without it")]
    BadRecord {
        /// `schema.table`.
        table: String,
        /// The change's position.
        lsn: Lsn,
        /// Why.
        reason: Box<BadRecordReason>,
    },
    /// The spill file.
    #[error("spilling a streamed transaction: {0}")]
    Spill(#[from] std::io::Error),
    /// A snapshot could not read a table.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// `initial_snapshot` on a server before 14 (no logical messages in
    /// pgoutput, which the snapshot's watermarks are).
    #[error("--snapshot with --sink kafka needs PostgreSQL 14 or later (the server is {major})")]
    SnapshotUnsupported {
        /// The server's major version.
        major: u32,
    },
    /// A record could not be written in Avro: a schema the registry
    /// refused under its compatibility mode, an unreachable registry, or
    /// a key or value with no Avro form. Nothing from the transaction
    /// that record belongs to on was written or acknowledged.
    #[error(transparent)]
    Avro(#[from] ConvertError),
    /// `avro` with a format other than Debezium's with `json_schemas`.
    #[error(
        "Avro needs the Debezium format with its Kafka Connect schemas (--kafka-format debezium)"
    )]
    AvroNeedsConnectSchemas,
    /// This stream's record in the progress topic is not a position: what
    /// Kafka holds is unknown, and every retry would read the same record.
    #[error("{0}: what Kafka holds of this stream is unknown, so nothing was written or acknowledged. Write a valid record for the key, or delete it with a tombstone (the sink then starts at the slot's position and may write again what Kafka already holds)")]
    BadProgress(ProducerError),
    /// The Kafka client refused its configuration (`--kafka-option`s that
    /// contradict each other or the sink's own settings). Nothing was
    /// written or acknowledged.
    #[error("the Kafka client refused its configuration: {reason} (check the --kafka-option values; nothing was written or acknowledged)")]
    KafkaOptions {
        /// librdkafka's reason.
        reason: String,
    },
    /// A topic the records go to does not exist and is not created on
    /// first use, or pgwal may not write it. Nothing of the transactions
    /// that needed it was committed or acknowledged.
    #[error(transparent)]
    TopicUnusable(ProducerError),
    /// The stream asks for two-phase decoding (see the module docs).
    #[error("the Kafka sink needs a stream without two-phase decoding: a transaction decoded at PREPARE may still roll back")]
    TwoPhase,
    /// The slot itself is two-phase (created with two-phase decoding, or
    /// streamed with it once): PostgreSQL then decodes prepared
    /// transactions at PREPARE whatever the stream asks for, and sends
    /// their changes before their outcome is known.
    #[error("slot {slot:?} decodes prepared transactions at PREPARE (it was created, or once streamed, with two-phase decoding), and the Kafka sink writes only committed transactions; nothing was written or acknowledged. Use a slot created without --two-phase")]
    TwoPhaseSlot {
        /// The slot's name.
        slot: String,
    },
    /// Kafka holds the stream up to a position this server does not have:
    /// beyond its WAL, or on a timeline it left below that position (a
    /// standby promoted before it received everything the sink wrote, a
    /// restore from a backup). Starting there would skip this server's own
    /// transactions below it.
    #[error(
        "Kafka holds slot {slot}'s stream up to {kafka}{}, which this server does not have          (its WAL ends at {server} on timeline {server_timeline}{}); starting there would skip          this server's transactions below it. This follows a restore from a backup, or a          promotion of a standby that had not received everything the sink wrote (use failover          slots with synchronized_standby_slots). Point the sink at the server that has the          position; or, to stream this server's history as it is, give the sink a new slot          (or a new --kafka-progress-topic)",
        .kafka_timeline.map(|t| format!(" on timeline {t}")).unwrap_or_default(),
        .fork.map(|f| format!(", and it left that timeline at {f}")).unwrap_or_default()
    )]
    ServerLacksKafkaPosition {
        /// The slot's name.
        slot: String,
        /// Kafka's position.
        kafka: Lsn,
        /// Its timeline, if the progress record has one.
        kafka_timeline: Option<u32>,
        /// The WAL the server has.
        server: Lsn,
        /// The server's timeline.
        server_timeline: u32,
        /// Where the server left Kafka's timeline, if it was on it.
        fork: Option<Lsn>,
    },
    /// The open Kafka transaction has been open for most of
    /// `transaction.timeout.ms`: the broker's coordinator would abort it,
    /// and the same PostgreSQL transaction would be written again and
    /// again. A PostgreSQL transaction is never split over Kafka
    /// transactions, so one that takes longer to write than the timeout
    /// cannot be written. Nothing of it was committed or acknowledged.
    #[error("the Kafka transaction writing PostgreSQL transaction {xid} has been open for {:.1?}, past 80% of transaction.timeout.ms ({:.0?}), after {records} records ({bytes} bytes); the broker would abort it, and it would be written again and again. Raise transaction.timeout.ms (--kafka-option transaction.timeout.ms=MS, at most the brokers' transaction.max.timeout.ms, 15 min by default); nothing of it was committed or acknowledged", .open, .timeout, xid = .xid.map_or("(unknown)".to_owned(), |x| x.to_string()))]
    TransactionTooLong {
        /// The PostgreSQL transaction being written, where known.
        xid: Option<u32>,
        /// How long the Kafka transaction had been open.
        open: Duration,
        /// `transaction.timeout.ms`.
        timeout: Duration,
        /// Records in the Kafka transaction so far.
        records: u64,
        /// Their key and value bytes.
        bytes: usize,
    },
    /// A row change or a prepared transaction's message where the sink had
    /// no transaction open for it: writing it would put it in no
    /// transaction, and leaving it out would acknowledge past it.
    #[error("{what} at {lsn} outside a transaction the sink had opened; nothing from it on was written or acknowledged")]
    Unexpected {
        /// What arrived.
        what: &'static str,
        /// Its position.
        lsn: Lsn,
    },
}
