//! What the sink is told, and what it reports.

use super::*;

/// Where and how the sink writes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SinkConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Topics.
    pub routing: Routing,
    /// Record values.
    pub format: Format,
    /// The compacted progress topic (created if missing).
    pub progress_topic: String,
    /// The producer's `transactional.id`; `None`: `pgwal-<system id>-<slot>`.
    /// It must be the same on every start of the same stream, and differ
    /// between streams.
    pub transactional_id: Option<String>,
    /// Commit the Kafka transaction once it holds this many bytes of
    /// records (at the next PostgreSQL commit).
    pub batch_bytes: usize,
    /// ... or once its first complete PostgreSQL transaction waited this
    /// long; also when the stream is idle.
    pub batch_time: Duration,
    /// Memory for streamed transactions in progress; beyond it the largest
    /// goes to an unlinked file in `spill_dir`.
    pub memory_limit: usize,
    /// Where streamed transactions spill.
    pub spill_dir: PathBuf,
    /// How long Kafka may fail (unreachable, restarting) before the sink
    /// gives up; it retries with backoff meanwhile.
    pub retry_for: Duration,
    /// Limit of each blocking Kafka transaction call.
    pub timeout: Duration,
    /// Further librdkafka settings (see [`ProducerConfig::client_options`]).
    pub client_options: Vec<(String, String)>,
    /// When the server's WAL moves on while the publications see no
    /// changes, commit a progress record for its position at most this
    /// often and acknowledge it, so the slot lets that WAL go; `None`: the
    /// slot moves only with transactions written to Kafka.
    pub heartbeat: Option<Duration>,
    /// Key columns where they are not the replica identity: configured
    /// ones, and for `REPLICA IDENTITY FULL` tables the primary key, which
    /// the sink looks up in the catalog (see [`KeyColumns`]).
    pub key_columns: KeyColumns,
    /// What to do with a change that cannot be written (see
    /// [`crate::bad_records`]).
    pub bad_records: BadRecordPolicy,
    /// The largest record (key and value bytes) the sink writes; a larger
    /// one is a bad record. Keep it at or below librdkafka's
    /// `message.max.bytes` and the topics' `max.message.bytes`.
    pub max_record_bytes: usize,
    /// Counters and positions while the sink runs, for metrics and health
    /// checks (see [`SinkLive`]).
    pub live: Arc<SinkLive>,
    /// When Kafka holds nothing of the stream yet, snapshot every published
    /// table first (see [`crate::snapshot`]); needs PostgreSQL 14+.
    pub initial_snapshot: bool,
    /// Follow snapshot signals: transactional logical messages with prefix
    /// [`snapshot::SIGNAL_PREFIX`] (14+; ignored before).
    pub snapshot_signals: bool,
    /// Rows a snapshot reads at a time, at most.
    pub snapshot_chunk_rows: usize,
    /// A snapshot chunk ends once its rows' values (as text) reach about
    /// this many bytes; the next chunk then asks for as many rows as this
    /// one kept, and later full chunks double it back up to
    /// `snapshot_chunk_rows`. Bounds the Kafka transaction of a chunk of
    /// wide rows.
    pub snapshot_chunk_bytes: usize,
    /// Snapshot chunks write nothing to the source: each chunk's window
    /// ends where the stream passes the WAL position read with it, instead
    /// of at a watermark message (see [`crate::snapshot`]). Chunks read
    /// from a hot standby are always read-only.
    pub snapshot_read_only: bool,
    /// Keys and values in Avro, their schemas registered in this schema
    /// registry (see [`crate::avro_converter`]); needs
    /// [`Format::Debezium`] with `json_schemas`, the form they are
    /// converted from. Dead-letter records stay JSON.
    pub avro: Option<RegistryConfig>,
}

impl SinkConfig {
    /// Defaults: progress topic `pgwal.progress`, 4 MiB or 100 ms per Kafka
    /// transaction, 64 MiB of streamed transactions in memory, spill to the
    /// system's temporary directory, retry Kafka for 5 minutes, a progress
    /// heartbeat at most every 10 seconds, stop at a change that cannot be
    /// written, records of at most 1,000,000 bytes (librdkafka's default
    /// `message.max.bytes`).
    pub fn new(brokers: impl Into<String>, routing: Routing, format: Format) -> SinkConfig {
        SinkConfig {
            brokers: brokers.into(),
            routing,
            format,
            progress_topic: "pgwal.progress".into(),
            transactional_id: None,
            batch_bytes: 4 << 20,
            batch_time: Duration::from_millis(100),
            memory_limit: 64 << 20,
            spill_dir: std::env::temp_dir(),
            retry_for: Duration::from_secs(300),
            timeout: Duration::from_secs(30),
            client_options: Vec::new(),
            heartbeat: Some(Duration::from_secs(10)),
            key_columns: KeyColumns::new(),
            bad_records: BadRecordPolicy::Fail,
            max_record_bytes: 1_000_000,
            live: Arc::new(SinkLive::new()),
            initial_snapshot: false,
            snapshot_signals: true,
            snapshot_chunk_rows: 4096,
            snapshot_chunk_bytes: 8 << 20,
            snapshot_read_only: false,
            avro: None,
        }
    }
}

/// What the sink did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkStats {
    /// PostgreSQL transactions written to Kafka.
    pub transactions: u64,
    /// Records written (progress records not counted).
    pub records: u64,
    /// Their key and value bytes.
    pub bytes: u64,
    /// Kafka transactions committed.
    pub kafka_commits: u64,
    /// PostgreSQL transactions received again that Kafka already held.
    pub skipped: u64,
    /// Streamed transactions that went to disk.
    pub spilled: u64,
    /// Restarts after a Kafka error.
    pub kafka_restarts: u64,
    /// Starts where Kafka held more than the slot had confirmed (the
    /// previous run stopped between a Kafka commit and the slot's
    /// acknowledgement): streaming began at Kafka's position.
    pub resumed_ahead_of_slot: u64,
    /// Progress records committed for WAL the publications had nothing in
    /// ([`SinkConfig::heartbeat`]).
    pub heartbeats: u64,
    /// Where Kafka's progress stands at the end.
    pub position: Option<Lsn>,
    /// Changes left out under [`BadRecordPolicy::Skip`].
    pub bad_skipped: u64,
    /// Changes written to the dead-letter topic instead.
    pub dead_lettered: u64,
    /// Rows snapshots wrote (read records).
    pub snapshot_rows: u64,
    /// Snapshot chunks read.
    pub snapshot_chunks: u64,
    /// Of those, chunks read without writing a watermark (read-only, or on
    /// a hot standby).
    pub snapshot_read_only_chunks: u64,
    /// Chunks thrown away and read again: a change the sink had written was
    /// not yet visible to the chunk's read, or a streamed transaction that
    /// touched the table committed while the chunk waited for its
    /// watermark.
    pub snapshot_rereads: u64,
    /// Tables a snapshot left out: no key, a key that cannot page through
    /// them, or (under a bad-record policy other than `Fail`) an error
    /// that would recur on every try.
    pub snapshot_tables_left_out: u64,
}
