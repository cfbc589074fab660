//! `pgwal stream`.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use futures_util::StreamExt;
use pgwal::{
    Config, CreateSlotOptions, Error, LogicalStream, Lsn, ReplicationClient, Result, StreamConfig,
    Streaming,
};
use tokio::io::AsyncWriteExt;

/// Who says that a position is processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum AcksArg {
    /// pgwal itself, once a transaction's lines were written and flushed to
    /// stdout.
    Output,
    /// The consumer, by writing positions back on pgwal's stdin, one per
    /// line (a commit line's `end_lsn`), once it has durably applied
    /// everything up to them. A position pgwal has not written yet is an
    /// error and nothing is acknowledged; end of stdin ends the stream.
    Stdin,
}

/// Where the changes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum SinkArg {
    /// JSON lines on stdout.
    Stdout,
    /// Apache Kafka, exactly once (see the --kafka-* options).
    Kafka,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum StreamingArg {
    Off,
    On,
    Parallel,
}

#[derive(Args, Debug)]
pub(crate) struct StreamArgs {
    /// Logical replication slot to stream from.
    #[arg(short = 'S', long)]
    slot: String,
    /// Publication to stream (repeatable).
    #[arg(short = 'P', long = "publication", required = true)]
    publications: Vec<String>,
    /// Create the slot first (no error if it exists).
    #[arg(long)]
    create_slot: bool,
    /// Create the slot with an exported snapshot and print a consistent copy
    /// of the published tables first ("snapshot" lines, then
    /// "snapshot_end"); streaming continues exactly where the copy ends.
    /// The slot must not exist yet. With --sink kafka: when Kafka holds
    /// nothing of this stream yet, write every row of the published tables
    /// as a read record, in chunks while streaming, exactly once across
    /// restarts (the slot is created if missing; PostgreSQL 14+).
    #[arg(long, conflicts_with_all = ["create_slot", "start_lsn"])]
    snapshot: bool,
    /// Backfill TABLE (repeatable; schema.table or table), added to a
    /// publication after the slot was created: print a consistent copy of
    /// it first ("snapshot" lines, then "snapshot_end" with the copy's
    /// consistent point), then stream, leaving out its changes in
    /// transactions that committed before that point (the copy has them).
    /// Needs --streaming off and no --two-phase, so that every transaction
    /// arrives whole, after its commit position is known.
    #[arg(long = "snapshot-table", value_name = "TABLE", conflicts_with_all = ["snapshot", "two_phase"])]
    snapshot_tables: Vec<String>,
    /// Connections copying at once for --snapshot or --snapshot-table, all
    /// in the same exported snapshot; tables over 128 MiB are split into
    /// page ranges that they share (14+). Memory stays bounded: about
    /// 3 MiB of rows per connection in flight.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    snapshot_jobs: u16,
    /// Start here, unless the slot has confirmed a later position.
    #[arg(long, value_parser = parse_lsn)]
    start_lsn: Option<Lsn>,
    /// Exit once a transaction ending at or after this position was written,
    /// or the server's WAL passed it with nothing pending.
    #[arg(long, value_parser = parse_lsn)]
    stop_lsn: Option<Lsn>,
    /// pgoutput protocol version (default: highest the server supports).
    #[arg(long)]
    proto_version: Option<u32>,
    /// Stream large in-progress transactions.
    #[arg(long, value_enum, default_value = "off")]
    streaming: StreamingArg,
    /// Decode prepared transactions at PREPARE (slot must be two-phase).
    #[arg(long)]
    two_phase: bool,
    /// Include pg_logical_emit_message messages.
    #[arg(long)]
    messages: bool,
    /// Record the position confirmed to the slot in FILE (fsynced, before
    /// the slot is told), and refuse to start when the slot is beyond it:
    /// a slot dropped and created again, or moved by another consumer,
    /// would skip changes never received here.
    #[arg(long, value_name = "FILE")]
    state: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics (OpenMetrics text) at http://ADDR/metrics:
    /// events by kind, output bytes, reconnects, time waiting for the
    /// consumer, acked/confirmed/server positions, lag in bytes and seconds
    /// (with --sink kafka: records by topic, Kafka commits and their time,
    /// skipped and dead-lettered changes, restarts), and health checks at
    /// /livez and /readyz (503 while not streaming). Port 0 picks one; the
    /// address is printed on stderr.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Seconds between checks of the slot's room under
    /// max_slot_wal_keep_size (on a connection of their own); below a
    /// quarter left, a warning on stderr. 0: no checks.
    #[arg(long, default_value_t = 30.0)]
    slot_check_interval: f64,
    /// With --create-slot: a failover slot (PostgreSQL 17+), which
    /// sync_replication_slots copies to standbys.
    #[arg(long, requires = "create_slot")]
    failover: bool,
    /// When a position counts as processed and is acknowledged to the
    /// server (the slot never goes back behind it).
    #[arg(long, value_enum, default_value = "output")]
    acks: AcksArg,
    /// Seconds between feedback messages.
    #[arg(long, default_value_t = 1.0)]
    status_interval: f64,
    /// Reconnect when the server sent nothing, not even a keepalive it was
    /// asked for after half this many seconds, for this long (a server,
    /// host or network gone without a reset); 0: never. Like the server's
    /// wal_receiver_timeout; keep it above half its wal_sender_timeout.
    #[arg(long, default_value_t = 60.0, value_parser = parse_timeout_secs)]
    receive_timeout: f64,
    /// During a burst, let changes accumulate in the socket for up to this
    /// many milliseconds before waking (TCP on Linux; 0 reads eagerly).
    #[arg(long, default_value_t = 1.0, value_parser = parse_batch_wait)]
    batch_wait_ms: f64,
    /// Runtime threads: 1 runs reading, decoding and output on one thread;
    /// more gives the stream's reader a thread of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) threads: u16,
    /// Where changes go. kafka: each PostgreSQL transaction into Kafka
    /// exactly once, in Kafka transactions that also record the stream's
    /// position in a progress topic; the slot is acknowledged only after
    /// Kafka committed, and a restart continues from Kafka's position.
    #[arg(long, value_enum, default_value = "stdout")]
    sink: SinkArg,
    #[command(flatten)]
    kafka: crate::kafka_sink::KafkaArgs,
}

impl StreamArgs {
    /// A combination clap cannot express, as its error message.
    pub(crate) fn conflict(&self) -> Option<&'static str> {
        if !self.snapshot_tables.is_empty() && !matches!(self.streaming, StreamingArg::Off) {
            return Some("--snapshot-table needs --streaming off: a streamed transaction's changes come before its commit position is known");
        }
        if self.sink == SinkArg::Kafka {
            if self.kafka.brokers.is_none() {
                return Some("--sink kafka needs --kafka-brokers");
            }
            if self.two_phase {
                return Some("--sink kafka cannot use --two-phase: a transaction decoded at PREPARE may still roll back (prepared transactions reach Kafka at COMMIT PREPARED without it)");
            }
            if !self.snapshot_tables.is_empty() {
                return Some("--sink kafka takes tables to snapshot as a signal while it streams: SELECT pg_logical_emit_message(true, 'pgwal.snapshot', '{\"tables\": [\"schema.table\"]}')");
            }
            if self.acks == AcksArg::Stdin {
                return Some(
                    "--sink kafka acknowledges after Kafka's commit; --acks stdin does not apply",
                );
            }
            if self.messages {
                return Some("--sink kafka does not write pg_logical_emit_message messages");
            }
            if let Some(why) = self.kafka.conflict() {
                return Some(why);
            }
        } else if self.kafka.brokers.is_some() {
            return Some("--kafka-brokers needs --sink kafka");
        }
        None
    }
}

/// Prints one snapshot row as a "snapshot" line.
fn snapshot_line(w: &mut impl Write, row: pgwal::snapshot::SnapshotRow<'_>) -> Result<()> {
    let mut obj = serde_json::Map::new();
    for (c, v) in row.columns.iter().zip(row.values) {
        obj.insert(
            c.clone(),
            v.map_or(serde_json::Value::Null, serde_json::Value::String),
        );
    }
    let line = serde_json::json!({"type": "snapshot", "schema": row.schema, "table": row.table, "row": obj});
    writeln!(w, "{line}").map_err(Error::Io)
}

/// Progress of a copy on stderr, when it is a terminal.
fn copy_progress() -> impl FnMut(&pgwal::snapshot::CopyProgress) {
    let tty = std::io::stderr().is_terminal();
    move |p| {
        if tty {
            eprint!(
                "\rsnapshot: {}/{} pieces, {} rows, last {}\x1b[K",
                p.pieces_done, p.pieces_total, p.rows, p.table
            );
            if p.pieces_done == p.pieces_total {
                eprintln!();
            }
        }
    }
}

fn parse_batch_wait(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=10_000.0).contains(&v) => Ok(v),
        _ => Err("expected milliseconds from 0 to 10000".into()),
    }
}

fn parse_lsn(s: &str) -> std::result::Result<Lsn, String> {
    s.parse::<Lsn>().map_err(|e| e.to_string())
}

/// A line on stdin (`--acks stdin`) that is not a position.
#[derive(Debug)]
struct BadAckLine {
    line: u64,
    text: String,
}

impl std::fmt::Display for BadAckLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stdin line {}: expected a position such as 0/16B3748, got {:?}; nothing was acknowledged",
            self.line, self.text
        )
    }
}

impl std::error::Error for BadAckLine {}

/// The next position the consumer acknowledged on stdin; `None` at its end.
async fn next_ack(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>,
    count: &mut u64,
) -> Result<Option<Lsn>> {
    loop {
        let Some(text) = lines.next_line().await? else {
            return Ok(None);
        };
        *count += 1;
        let t = text.trim();
        if t.is_empty() {
            continue;
        }
        return t.parse::<Lsn>().map(Some).map_err(|_| {
            Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                BadAckLine {
                    line: *count,
                    text: text.clone(),
                },
            ))
        });
    }
}

pub(crate) async fn run(
    config: Config,
    a: StreamArgs,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    // the Kafka sink's snapshot reads in chunks, from any slot position
    let kafka_snapshot = a.snapshot && a.sink == SinkArg::Kafka;
    if a.create_slot || kafka_snapshot {
        let mut c = ReplicationClient::connect(&config).await?;
        match c
            .create_logical_slot(
                &a.slot,
                &CreateSlotOptions::new()
                    .two_phase(a.two_phase)
                    .failover(a.failover),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some("42710") => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Tables copied at a consistent point, whose changes in transactions
    // that committed before it are left out of the stream.
    let mut backfill: Option<(Lsn, Vec<String>)> = None;
    if (a.snapshot && !kafka_snapshot) || !a.snapshot_tables.is_empty() {
        // Nothing else runs yet, so plain blocking writes to stdout are fine here.
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::new(stdout.lock());
        let pubs: Vec<&str> = a.publications.iter().map(String::as_str).collect();
        let opts = pgwal::snapshot::CopyOptions::default()
            .two_phase(a.two_phase)
            .jobs(usize::from(a.snapshot_jobs));
        let sink = |row: pgwal::snapshot::SnapshotRow<'_>| snapshot_line(&mut w, row);
        let copy = if a.snapshot {
            pgwal::snapshot::initial_copy_with(
                &config,
                &a.slot,
                &pubs,
                &opts,
                sink,
                copy_progress(),
            )
            .await?
        } else {
            let opts = opts.tables(a.snapshot_tables.iter().cloned());
            let copy =
                pgwal::snapshot::table_copy(&config, &pubs, &opts, sink, copy_progress()).await?;
            backfill = Some((copy.consistent_point, copy.tables.clone()));
            copy
        };
        writeln!(
            w,
            "{}",
            serde_json::json!({"type": "snapshot_end", "consistent_point": copy.consistent_point.to_string(), "rows": copy.rows, "tables": copy.tables})
        )
        .map_err(Error::Io)?;
        w.flush().map_err(Error::Io)?;
    }
    let mut cfg = StreamConfig::new(a.slot, a.publications)
        .streaming(match a.streaming {
            StreamingArg::Off => Streaming::Off,
            StreamingArg::On => Streaming::On,
            StreamingArg::Parallel => Streaming::Parallel,
        })
        .two_phase(a.two_phase)
        .messages(a.messages)
        .status_interval(Duration::from_secs_f64(a.status_interval.max(0.01)))
        .receive_timeout(
            (a.receive_timeout > 0.0).then(|| Duration::from_secs_f64(a.receive_timeout)),
        )
        .read_coalesce(
            (a.batch_wait_ms > 0.0).then(|| Duration::from_secs_f64(a.batch_wait_ms / 1000.0)),
        );
    if let Some(v) = a.proto_version {
        cfg = cfg.proto_version(v);
    }
    if let Some(l) = a.start_lsn {
        cfg = cfg.start_lsn(l);
    }
    if let Some(l) = a.stop_lsn {
        cfg = cfg.stop_lsn(l);
    }
    if let Some(p) = a.state {
        cfg = cfg.state_file(p);
    }
    if a.sink == SinkArg::Kafka {
        return crate::kafka_sink::run(
            config,
            cfg,
            a.kafka,
            a.snapshot,
            a.slot_check_interval,
            a.metrics,
        )
        .await;
    }
    let metrics = crate::metrics::StreamMetrics::default();
    // ready once the stream started; it stays so while the stream retries
    // (when retrying gives up, pgwal exits)
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(addr) = a.metrics {
        let s = started.clone();
        let ready: crate::metrics::Ready =
            Arc::new(move || s.load(std::sync::atomic::Ordering::Relaxed));
        let bound = crate::metrics::serve(addr, metrics.registry(), ready)
            .await
            .map_err(Error::Io)?;
        eprintln!("pgwal: metrics at http://{bound}/metrics");
    }
    let watched = (a.slot_check_interval > 0.0).then(|| (config.clone(), cfg.slot.clone()));
    let mut stream = LogicalStream::start(config, cfg).await?;
    started.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some((config, slot)) = watched {
        let m = metrics.clone();
        crate::slot_watch::spawn(
            config,
            slot,
            Duration::from_secs_f64(a.slot_check_interval),
            move |r| m.slot_room(r),
        );
    }
    let mut out = tokio::io::BufWriter::with_capacity(256 * 1024, tokio::io::stdout());
    let progress = std::io::stderr().is_terminal();
    let (mut events, mut last_events, mut last_report) = (0u64, 0u64, Instant::now());
    let mut line = Vec::with_capacity(512);
    // Ctrl-C or SIGTERM (a supervisor's stop): end after the last
    // acknowledgement, as at the stop position
    let stop = crate::signals::stop_signal();
    tokio::pin!(stop);
    // The consumer's acknowledgements are read by a task of their own: were
    // they read between writes to stdout, a consumer that waits for its ack
    // to take effect before reading on would wait for a pgwal blocked on a
    // full stdout pipe.
    let mut acks_task = (a.acks == AcksArg::Stdin).then(|| {
        let acks = stream.ack_handle();
        tokio::spawn(async move {
            let mut lines =
                tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
            let mut count = 0u64;
            while let Some(lsn) = next_ack(&mut lines, &mut count).await? {
                acks.try_ack(lsn)?;
            }
            Ok::<(), Error>(())
        })
    });
    let consumer_acks = acks_task.is_some();
    // whether the transaction being read committed before the backfill's point
    let mut before_backfill = false;
    let mut report = tokio::time::interval(Duration::from_secs(1));
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = &mut stop => None,
            done = async { acks_task.as_mut().expect("guarded").await }, if consumer_acks => {
                // the consumer will acknowledge nothing more (end of stdin), or sent a bad line
                done.map_err(|_| Error::Closed)??;
                break;
            }
            _ = report.tick(), if progress || a.metrics.is_some() => {
                metrics.positions(stream.acked().0, stream.confirmed().0, stream.server_wal_end().0);
                if !progress {
                    continue;
                }
                let rate = (events - last_events) as f64 / last_report.elapsed().as_secs_f64();
                let lag = stream.server_wal_end() - stream.acked().max(stream.confirmed());
                eprint!("\r{events} events, {rate:.0}/s, acked {}, lag {} kB\x1b[K", stream.acked(), lag / 1024);
                last_events = events;
                last_report = Instant::now();
                continue;
            }
        };
        let Some(event) = event else { break };
        let mut event = event?;
        events += 1;
        let t0 = Instant::now();
        if let Some((point, tables)) = &backfill {
            // "schema.table" compared in place: no allocation per change
            let copied = |r: &pgwal::protocol::pgoutput::Relation| {
                tables.iter().any(|t| {
                    t.strip_prefix(r.namespace.as_str())
                        .and_then(|rest| rest.strip_prefix('.'))
                        == Some(r.name.as_str())
                })
            };
            match &mut event {
                pgwal::Event::Begin(b) => before_backfill = b.final_lsn < *point,
                pgwal::Event::Insert(c) | pgwal::Event::Update(c) | pgwal::Event::Delete(c)
                    if before_backfill && copied(&c.relation) =>
                {
                    continue;
                }
                pgwal::Event::Truncate(t) if before_backfill => {
                    t.relations.retain(|r| !copied(r));
                    if t.relations.is_empty() {
                        continue;
                    }
                }
                _ => {}
            }
        }
        if let Some(v) = crate::json::event(&event) {
            line.clear();
            serde_json::to_writer(&mut line, &v).map_err(|e| Error::Io(e.into()))?;
            line.push(b'\n');
            out.write_all(&line).await?;
            metrics.event(v["type"].as_str().unwrap_or("other"), line.len());
        }
        if let pgwal::Event::Commit(c) = &event {
            if let Ok(age) =
                std::time::SystemTime::now().duration_since(c.commit_time.to_system_time())
            {
                metrics.commit_lag(age.as_secs_f64());
            }
        }
        if let Some(lsn) = event.ack_lsn() {
            // Acknowledge only what has reached stdout (or, with --acks
            // stdin, what the consumer says it applied: it must see it first).
            out.flush().await?;
            if !consumer_acks {
                stream.ack(lsn);
            }
        }
        metrics.consumer_wait(t0.elapsed());
    }
    out.flush().await?;
    if progress {
        eprintln!();
    }
    Ok(stream.shutdown().await?)
}

/// A number of seconds, 0 or at least 0.1 (a shorter receive timeout would
/// time out a live server between its keepalives).
pub(crate) fn parse_timeout_secs(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v == 0.0 || (v.is_finite() && (0.1..=86_400.0).contains(&v)) => Ok(v),
        _ => Err(format!(
            "{s}: expected 0 (never) or seconds from 0.1 to 86400"
        )),
    }
}
