//! `pgwal stream --sink kafka`: the options, and the run that hands the
//! stream to [`pgwal_kafka::sink`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use pgwal::{Config, StreamConfig};
use pgwal_kafka::{
    BadRecordPolicy, Compatibility, DecimalMode, Format, KeyColumns, RegistryConfig, Routing,
    SinkConfig, SubjectStrategy,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum FormatArg {
    /// Debezium's PostgreSQL connector envelope (before, after, source, op,
    /// ts_ms), as its JSON converter writes it with schemas.enable=false.
    Debezium,
    /// pgwal's own JSON: the change as `pgwal stream` prints it, plus xid,
    /// commit_lsn and commit_time.
    Pgwal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DecimalArg {
    /// Kafka Connect's Decimal: base64 of the unscaled value.
    Precise,
    /// The exact decimal text.
    String,
    /// A JSON number (may round).
    Double,
}

/// `--kafka-bad-records`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum BadRecordsArg {
    /// Stop with an error.
    Fail,
    /// Leave the change out, with a warning.
    Skip,
    /// Write it to the dead-letter topic instead.
    DeadLetter,
}

/// `--kafka-schema-compatibility`: the registry's compatibility modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[clap(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum CompatibilityArg {
    /// A new schema reads data written with the last one.
    Backward,
    /// ... with every earlier one.
    BackwardTransitive,
    /// The last schema reads data written with the new one.
    Forward,
    /// Every earlier schema reads data written with the new one.
    ForwardTransitive,
    /// Backward and forward, with the last schema.
    Full,
    /// ... with every earlier one.
    FullTransitive,
    /// No check.
    None,
}

/// `--kafka-schema-subject-strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum SubjectArg {
    /// <topic>-key and <topic>-value (Confluent's TopicNameStrategy).
    Topic,
    /// The record's full name, <server>.<schema>.<table>.Envelope (RecordNameStrategy).
    Record,
    /// <topic>-<record's full name> (TopicRecordNameStrategy).
    TopicRecord,
}

/// Options of `--sink kafka`.
#[derive(Args, Debug)]
pub(crate) struct KafkaArgs {
    /// Kafka's bootstrap servers (host:port,...).
    #[arg(long = "kafka-brokers", value_name = "HOSTS")]
    pub(crate) brokers: Option<String>,
    /// Topic prefix (Debezium's topic.prefix).
    #[arg(
        long = "kafka-topic-prefix",
        value_name = "PREFIX",
        default_value = "pgwal"
    )]
    topic_prefix: String,
    /// Topic of a table: {prefix}, {schema} and {table} are replaced.
    #[arg(
        long = "kafka-topic-template",
        default_value = "{prefix}.{schema}.{table}"
    )]
    topic_template: String,
    /// Record values.
    #[arg(long = "kafka-format", value_enum, default_value = "debezium")]
    format: FormatArg,
    /// Debezium's source.name (default: the topic prefix).
    #[arg(long = "kafka-server-name")]
    server_name: Option<String>,
    /// Numeric values in the Debezium format (decimal.handling.mode).
    #[arg(long = "kafka-decimal", value_enum, default_value = "precise")]
    decimal: DecimalArg,
    /// Write a tombstone (null value) after each delete, for log compaction.
    #[arg(long = "kafka-tombstones")]
    tombstones: bool,
    /// Debezium's transaction block in each record (provide.transaction.metadata):
    /// "<xid>:<commit LSN>" and the record's order in its transaction, overall
    /// and in its table. Off by default, as in Debezium (about 80 bytes more
    /// per record).
    #[arg(long = "kafka-transaction-metadata")]
    transaction_metadata: bool,
    /// Each key and value with its Kafka Connect schema, as Debezium's JSON
    /// converter writes them with schemas.enable=true: {"schema": ...,
    /// "payload": ...}. The schema follows the table's columns as they
    /// change. Debezium format only.
    #[arg(long = "kafka-json-schemas")]
    json_schemas: bool,
    /// Keys and values in Avro, as Kafka Connect's AvroConverter writes
    /// Debezium's records: each schema registered in the schema registry
    /// (--kafka-schema-registry), each datum framed with its schema's id
    /// (Confluent's wire format). Debezium format only; the schemas follow
    /// the table's columns as they change.
    #[arg(long = "kafka-avro", requires = "schema_registry")]
    avro: bool,
    /// The schema registry's Confluent-compatible API (e.g.
    /// http://127.0.0.1:8081, or Apicurio's .../apis/ccompat/v7); https
    /// verifies its certificate; user:password@ in the URL is basic
    /// authentication.
    #[arg(
        long = "kafka-schema-registry",
        value_name = "URL",
        env = "PGWAL_SCHEMA_REGISTRY_URL"
    )]
    schema_registry: Option<String>,
    /// Basic authentication with the registry (Confluent Cloud: the API
    /// key); the password from PGWAL_SCHEMA_REGISTRY_PASSWORD.
    #[arg(long = "kafka-schema-registry-user", value_name = "USER")]
    schema_registry_user: Option<String>,
    #[arg(
        long = "kafka-schema-registry-password",
        env = "PGWAL_SCHEMA_REGISTRY_PASSWORD",
        hide = true
    )]
    schema_registry_password: Option<String>,
    /// CA certificates (PEM) to trust for an https registry (default: the
    /// Mozilla roots).
    #[arg(long = "kafka-schema-registry-ca", value_name = "FILE")]
    schema_registry_ca: Option<PathBuf>,
    /// Set this compatibility mode on each subject before its first schema
    /// (default: leave the registry's setting). A schema change the mode
    /// refuses stops the sink with the registry's explanation; nothing of
    /// it is written or acknowledged.
    #[arg(long = "kafka-schema-compatibility", value_enum, value_name = "MODE")]
    schema_compatibility: Option<CompatibilityArg>,
    /// The subjects schemas are registered under.
    #[arg(
        long = "kafka-schema-subject-strategy",
        value_enum,
        default_value = "topic"
    )]
    subject_strategy: SubjectArg,
    /// The compacted topic where the stream's position commits with its
    /// records (created if missing; shared by streams, keyed by server and
    /// slot).
    #[arg(long = "kafka-progress-topic", default_value = "pgwal.progress")]
    progress_topic: String,
    /// The producer's transactional.id (default pgwal-<system id>-<slot>):
    /// stable across restarts of one stream, distinct between streams.
    #[arg(long = "kafka-transactional-id")]
    transactional_id: Option<String>,
    /// Commit a Kafka transaction once it holds this many bytes...
    #[arg(long = "kafka-batch-bytes", default_value_t = 4 << 20)]
    batch_bytes: usize,
    /// ... or its first PostgreSQL transaction waited this long (also when
    /// the stream is idle).
    #[arg(long = "kafka-batch-ms", default_value_t = 100)]
    batch_ms: u64,
    /// Memory for streamed (in-progress) transactions before they spill to
    /// disk.
    #[arg(long = "kafka-memory-mib", default_value_t = 64)]
    memory_mib: usize,
    /// Where streamed transactions spill (unlinked files; default: the
    /// temporary directory).
    #[arg(long = "kafka-spill-dir")]
    spill_dir: Option<PathBuf>,
    /// Seconds Kafka may keep failing before pgwal gives up; meanwhile it
    /// starts over from Kafka's committed position with backoff.
    #[arg(long = "kafka-retry-secs", default_value_t = 300)]
    retry_secs: u64,
    /// Limit of each Kafka call that waits on the brokers (connecting and
    /// initialising transactions, reading the progress topic, committing).
    /// A broker that refuses pgwal (TLS or SASL authentication failed)
    /// ends the wait at once.
    #[arg(long = "kafka-timeout-secs", default_value_t = 30.0, value_parser = parse_timeout)]
    timeout_secs: f64,
    /// While the publications see no changes but the server's WAL moves on,
    /// commit a progress record for its position at most this often, so
    /// the slot lets that WAL go (0: never; the slot then moves only with
    /// transactions written to Kafka).
    #[arg(long = "kafka-heartbeat-secs", default_value_t = 10.0, value_parser = parse_secs)]
    heartbeat_secs: f64,
    /// Key columns per table, "schema.table:col[,col...]" entries separated
    /// by ';' (Debezium's message.key.columns). Default: the replica
    /// identity; for REPLICA IDENTITY FULL tables the primary key.
    #[arg(long = "kafka-key-columns", value_name = "SPEC", value_parser = parse_key_columns)]
    key_columns: Option<KeyColumns>,
    /// A change that cannot be written (an unchanged TOAST value the server
    /// did not send, a value that does not decode, a record larger than
    /// --kafka-max-record-bytes): fail (stop with an error naming the table
    /// and position), skip (leave it out, with a warning), or dead-letter
    /// (write the change and the reason to --kafka-dead-letter-topic, in
    /// the same Kafka transaction).
    #[arg(long = "kafka-bad-records", value_enum, default_value = "fail")]
    bad_records: BadRecordsArg,
    /// The dead-letter topic (default: {prefix}.dead-letter).
    #[arg(long = "kafka-dead-letter-topic", value_name = "TOPIC")]
    dead_letter_topic: Option<String>,
    /// The largest record, key and value bytes (default: the
    /// message.max.bytes --kafka-option, else librdkafka's 1000000).
    #[arg(long = "kafka-max-record-bytes", value_name = "BYTES")]
    max_record_bytes: Option<usize>,
    /// Rows a snapshot (--snapshot, or a signal) reads at a time, each
    /// chunk in a transaction of its own.
    #[arg(long = "kafka-snapshot-chunk-rows", value_name = "ROWS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    snapshot_chunk_rows: u32,
    /// A snapshot chunk ends once its rows' values (as text) reach about
    /// this many bytes, bounding its memory and its Kafka transaction; the
    /// next chunk asks for as many rows as that one kept, and full chunks
    /// double it back up to --kafka-snapshot-chunk-rows.
    #[arg(long = "kafka-snapshot-chunk-bytes", value_name = "BYTES", default_value_t = 8 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_chunk_bytes: u64,
    /// Ignore snapshot signals (logical messages with prefix
    /// 'pgwal.snapshot' and content {"tables": ["schema.table", ...]},
    /// which otherwise start a snapshot of those tables while streaming).
    #[arg(long = "kafka-no-snapshot-signals")]
    no_snapshot_signals: bool,
    /// Snapshot chunks write nothing to the source (no watermark
    /// messages): each chunk ends where the stream passes the WAL position
    /// read with it. Always so on a hot standby.
    #[arg(long = "kafka-snapshot-read-only")]
    snapshot_read_only: bool,
    /// A librdkafka setting, KEY=VALUE (repeatable): security.protocol,
    /// sasl.*, ssl.*, compression.type, ...
    #[arg(long = "kafka-option", value_name = "KEY=VALUE", value_parser = parse_option)]
    options: Vec<(String, String)>,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!("expected seconds from 0 to 86400, got {s:?}")),
    }
}

fn parse_timeout(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=3_600.0).contains(&v) => Ok(v),
        _ => Err(format!("expected seconds from 0.1 to 3600, got {s:?}")),
    }
}

fn parse_key_columns(s: &str) -> Result<KeyColumns, String> {
    KeyColumns::parse(s).map_err(|e| e.to_string())
}

fn parse_option(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if matches!(k, "transactional.id" | "enable.idempotence") {
        return Err(format!(
            "{k} is set by pgwal: exactly-once needs it (use --kafka-transactional-id)"
        ));
    }
    Ok((k.to_owned(), v.to_owned()))
}

impl KafkaArgs {
    /// A combination of Kafka options clap cannot express, as its error
    /// message.
    pub(crate) fn conflict(&self) -> Option<&'static str> {
        if self.json_schemas && self.format != FormatArg::Debezium {
            return Some("--kafka-json-schemas needs --kafka-format debezium");
        }
        if self.avro && self.format != FormatArg::Debezium {
            return Some("--kafka-avro needs --kafka-format debezium");
        }
        if self.avro && self.json_schemas {
            return Some("--kafka-avro and --kafka-json-schemas exclude each other: the schemas are in the registry");
        }
        if !self.avro
            && (self.schema_compatibility.is_some() || self.schema_registry_user.is_some())
        {
            return Some("the --kafka-schema-* options need --kafka-avro");
        }
        None
    }
}

/// Runs the sink until Ctrl-C, SIGTERM, `--stop-lsn` or an error; prints
/// what it did on stderr.
pub(crate) async fn run(
    config: Config,
    stream: StreamConfig,
    a: KafkaArgs,
    initial_snapshot: bool,
    slot_check_interval: f64,
    metrics: Option<std::net::SocketAddr>,
) -> Result<(), Box<dyn std::error::Error>> {
    let stop = crate::signals::stop_signal();
    let routing = Routing::new(&a.topic_prefix, &a.topic_template)?;
    let format = match a.format {
        FormatArg::Pgwal => Format::Pgwal,
        FormatArg::Debezium => Format::Debezium {
            server_name: a.server_name.unwrap_or_else(|| a.topic_prefix.clone()),
            database: config.dbname.clone(),
            decimal: match a.decimal {
                DecimalArg::Precise => DecimalMode::Precise,
                DecimalArg::String => DecimalMode::String,
                DecimalArg::Double => DecimalMode::Double,
            },
            tombstones: a.tombstones,
            transaction_metadata: a.transaction_metadata,
            // Avro is converted from the records with their Connect schemas
            json_schemas: a.json_schemas || a.avro,
        },
    };
    let mut sink = SinkConfig::new(a.brokers.expect("checked by conflict()"), routing, format);
    sink.progress_topic = a.progress_topic;
    sink.transactional_id = a.transactional_id;
    sink.batch_bytes = a.batch_bytes;
    sink.batch_time = Duration::from_millis(a.batch_ms);
    sink.memory_limit = a.memory_mib << 20;
    if let Some(d) = a.spill_dir {
        sink.spill_dir = d;
    }
    sink.retry_for = Duration::from_secs(a.retry_secs);
    sink.timeout = Duration::from_secs_f64(a.timeout_secs);
    let message_max = a
        .options
        .iter()
        .rev()
        .find(|(k, _)| k == "message.max.bytes")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    if let Some(n) = a.max_record_bytes.or(message_max) {
        sink.max_record_bytes = n;
    }
    sink.bad_records = match a.bad_records {
        BadRecordsArg::Fail => BadRecordPolicy::Fail,
        BadRecordsArg::Skip => BadRecordPolicy::Skip,
        BadRecordsArg::DeadLetter => BadRecordPolicy::DeadLetter {
            topic: a
                .dead_letter_topic
                .unwrap_or_else(|| format!("{}.dead-letter", a.topic_prefix)),
        },
    };
    sink.client_options = a.options;
    sink.heartbeat = (a.heartbeat_secs > 0.0).then(|| Duration::from_secs_f64(a.heartbeat_secs));
    if let Some(k) = a.key_columns {
        sink.key_columns = k;
    }
    sink.initial_snapshot = initial_snapshot;
    sink.snapshot_signals = !a.no_snapshot_signals;
    sink.snapshot_chunk_rows = a.snapshot_chunk_rows as usize;
    sink.snapshot_chunk_bytes = usize::try_from(a.snapshot_chunk_bytes).unwrap_or(usize::MAX);
    sink.snapshot_read_only = a.snapshot_read_only;
    if a.avro {
        let mut r = RegistryConfig::new(a.schema_registry.expect("required by --kafka-avro"));
        if let Some(user) = a.schema_registry_user {
            r.basic_auth = Some((user, a.schema_registry_password.unwrap_or_default()));
        }
        r.ca_file = a.schema_registry_ca;
        r.compatibility = a.schema_compatibility.map(|m| match m {
            CompatibilityArg::Backward => Compatibility::Backward,
            CompatibilityArg::BackwardTransitive => Compatibility::BackwardTransitive,
            CompatibilityArg::Forward => Compatibility::Forward,
            CompatibilityArg::ForwardTransitive => Compatibility::ForwardTransitive,
            CompatibilityArg::Full => Compatibility::Full,
            CompatibilityArg::FullTransitive => Compatibility::FullTransitive,
            CompatibilityArg::None => Compatibility::None,
        });
        r.subject_strategy = match a.subject_strategy {
            SubjectArg::Topic => SubjectStrategy::TopicName,
            SubjectArg::Record => SubjectStrategy::RecordName,
            SubjectArg::TopicRecord => SubjectStrategy::TopicRecordName,
        };
        r.timeout = sink.timeout;
        r.retry_for = sink.retry_for;
        sink.avro = Some(r);
    }
    let slot_metrics = crate::metrics::StreamMetrics::default();
    if let Some(addr) = metrics {
        let live = sink.live.clone();
        let registry = crate::kafka_metrics::registry(sink.live.clone(), &slot_metrics);
        let bound =
            crate::metrics::serve(addr, registry, Arc::new(move || live.streaming())).await?;
        eprintln!("pgwal: metrics at http://{bound}/metrics");
    }
    if slot_check_interval > 0.0 {
        let m = slot_metrics.clone();
        crate::slot_watch::spawn(
            config.clone(),
            stream.slot.clone(),
            Duration::from_secs_f64(slot_check_interval),
            move |r| m.slot_room(r),
        );
    }
    let stats = pgwal_kafka::run(config, stream, sink, stop).await?;
    eprintln!(
        "pgwal: kafka: {} transactions, {} records ({} bytes) in {} Kafka transactions; {} received again and skipped, {} spilled, {} restarts after Kafka errors, {} starts ahead of the slot, {} heartbeats, {} bad changes skipped, {} dead-lettered, {} snapshot rows in {} chunks ({} read-only, {} read again), {} tables left out of snapshots; Kafka holds everything up to {}",
        stats.transactions,
        stats.records,
        stats.bytes,
        stats.kafka_commits,
        stats.skipped,
        stats.spilled,
        stats.kafka_restarts,
        stats.resumed_ahead_of_slot,
        stats.heartbeats,
        stats.bad_skipped,
        stats.dead_lettered,
        stats.snapshot_rows,
        stats.snapshot_chunks,
        stats.snapshot_read_only_chunks,
        stats.snapshot_rereads,
        stats.snapshot_tables_left_out,
        stats
            .position
            .map_or_else(|| "nothing yet".to_owned(), |l| l.to_string())
    );
    Ok(())
}
