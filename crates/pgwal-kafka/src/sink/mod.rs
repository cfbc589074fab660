//! The loop that drives a logical stream into Kafka, exactly once.
//!
//! [`run`] reads a [`LogicalStream`], writes each PostgreSQL transaction's
//! records into an open Kafka transaction, and commits that Kafka
//! transaction, with a progress record naming the last PostgreSQL
//! transaction's end position, at a PostgreSQL commit boundary: after
//! `batch_bytes` of records or `batch_time`, or when the stream has
//! nothing more for now. Only when that commit completed is the slot
//! acknowledged. Meanwhile reading goes on: records that come during a
//! commit are held (up to `batch_bytes`) and open the next Kafka
//! transaction once it completed; at most one commit is in flight.
//!
//! Why every change is in Kafka exactly once, whatever is killed when:
//! - A read_committed consumer sees a Kafka transaction whole or not at
//!   all, and each holds whole PostgreSQL transactions.
//! - The progress record commits atomically with the records it covers,
//!   so it says exactly which PostgreSQL transactions Kafka holds.
//! - On every start (and after any Kafka error) the sink reads it back,
//!   has the stream start there, and drops every transaction whose commit
//!   record lies before it: those that the slot, acknowledged only after
//!   Kafka's commit, sends again.
//! - A new producer with the same transactional id fences the old one;
//!   the broker aborts whatever the old one left open. A session starts
//!   its producer only once it holds the slot's lock (the `slot_lock`
//!   module), so a second sink on the same slot waits instead of fencing
//!   the one that streams.
//! - A reconnect of the stream (which restarts at the acknowledged
//!   position) aborts the open Kafka transaction, whose PostgreSQL
//!   transactions then come again.
//!
//! Non-streamed transactions are written as their changes arrive (the
//! Kafka transaction is still open, so no consumer sees them before the
//! commit); streamed ones are held (the `spill` module) until their commit,
//! and dropped at their abort. Memory is bounded: librdkafka's queue (64
//! MiB) and `memory_limit` for the streamed transactions in progress.
//!
//! When the publications see nothing while the server's WAL moves on, a
//! heartbeat from the stream ([`SinkConfig::heartbeat`]) commits its WAL
//! position as the progress, so the slot need not hold that WAL.
//!
//! Two-phase decoding is refused: a transaction decoded at PREPARE may
//! still roll back. Without it, a prepared transaction is decoded at
//! `COMMIT PREPARED` as an ordinary transaction.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::FusedFuture;
use futures_util::{FutureExt, StreamExt};
use pgwal::{Config, Event, LogicalStream, Lsn, ReplicationClient, StreamConfig};
use pgwal_protocol::PgTimestamp;
use rdkafka::error::KafkaError;

use crate::avro_converter::{AvroConverter, ConvertError};
use crate::bad_records::{self, BadRecordPolicy, BadRecordReason};
use crate::format::{encode, encode_read, stamp, Format, FormatError, Record, TxInfo, TxOrder};
use crate::keys::{primary_key_query, KeyColumns};
use crate::live::SinkLive;
use crate::producer::{KafkaProducer, ProducerConfig, ProducerError};
use crate::progress::{self, Progress};
use crate::registry::RegistryConfig;
use crate::routing::Routing;
use crate::server_history::{self, ServerPosition, Verdict};
use crate::slot_lock::SlotLock;
use crate::snapshot::{self, Chunk, SnapshotCursor, SnapshotError};
use crate::spill::Spill;

mod commit;
mod config;
mod error;
mod snapshot_reads;

pub use config::{SinkConfig, SinkStats};
pub use error::SinkError;
use snapshot_reads::{in_window, WrittenRows};

/// Streams `stream` through `pg` into Kafka until `stop` completes, the
/// stream's `stop_lsn` is reached, or an error that retrying does not cure.
/// At a stop, complete transactions are committed to Kafka; a partial one
/// is aborted and comes again next time.
pub async fn run(
    pg: Config,
    stream: StreamConfig,
    sink: SinkConfig,
    stop: impl Future<Output = ()>,
) -> Result<SinkStats, SinkError> {
    if stream.two_phase {
        return Err(SinkError::TwoPhase);
    }
    let mut avro = match &sink.avro {
        Some(registry) => {
            if !matches!(
                sink.format,
                Format::Debezium {
                    json_schemas: true,
                    ..
                }
            ) {
                return Err(SinkError::AvroNeedsConnectSchemas);
            }
            Some(AvroConverter::new(registry.clone()).map_err(ConvertError::from)?)
        }
        None => None,
    };
    let (system_id, major) = {
        let mut c = ReplicationClient::connect(&pg).await?;
        let major = c.server_major_version().unwrap_or(0);
        // a slot that is two-phase decodes at PREPARE even when the stream
        // does not ask for it (PostgreSQL's CreateDecodingContext)
        if c.slot_two_phase(&stream.slot).await? == Some(true) {
            return Err(SinkError::TwoPhaseSlot {
                slot: stream.slot.clone(),
            });
        }
        (c.identify_system().await?.system_id, major)
    };
    if sink.initial_snapshot && major < 14 {
        return Err(SinkError::SnapshotUnsupported { major });
    }
    // snapshots' watermarks and signals are logical messages
    let messages = (sink.initial_snapshot || sink.snapshot_signals) && major >= 14;
    let key = progress::key(&system_id, &stream.slot);
    let mut pcfg = ProducerConfig::new(
        sink.brokers.clone(),
        sink.transactional_id
            .clone()
            .unwrap_or_else(|| format!("pgwal-{system_id}-{}", stream.slot)),
        sink.progress_topic.clone(),
        key,
    );
    pcfg.timeout = sink.timeout;
    pcfg.client_options = sink.client_options.clone();
    let mut stats = SinkStats::default();
    let mut failing_since: Option<Instant> = None;
    let mut backoff = Duration::from_millis(200);
    // fused: a stop that came while a session failed is seen as done, not
    // polled again by the next session
    let stop = stop.fuse();
    tokio::pin!(stop);
    // A refusal before the first connection is a configuration error; one
    // after pgwal got through once (a certificate rotated, a broker
    // restarting) is retried like any Kafka error.
    let mut ever_connected = false;
    let mut slot_lock: Option<SlotLock> = None;
    loop {
        let (result, connected) = {
            let mut session = Session::new(&sink, &mut stats);
            session.messages = messages;
            session.avro = avro.as_mut();
            // kept from one session to the next: a restart after a Kafka
            // error does not hand the slot to a waiting sink
            session.slot_lock = slot_lock.take();
            let r = session.run(&pg, &stream, &pcfg, &mut stop).await;
            slot_lock = session.slot_lock.take();
            (r, session.connected)
        };
        ever_connected |= connected;
        match result {
            Ok(()) => return Ok(stats),
            Err(Failure::Kafka(e @ ProducerError::Refused { .. }, _)) if !ever_connected => {
                return Err(SinkError::KafkaRefused(e))
            }
            Err(Failure::Kafka(e @ ProducerError::BadProgress { .. }, _)) => {
                return Err(SinkError::BadProgress(e))
            }
            Err(Failure::Kafka(e @ ProducerError::TopicUnusable { .. }, _)) => {
                return Err(SinkError::TopicUnusable(e))
            }
            // librdkafka refused the client configuration itself (options
            // that contradict each other): every retry would too
            Err(Failure::Kafka(ProducerError::Kafka(KafkaError::ClientCreation(reason)), _)) => {
                return Err(SinkError::KafkaOptions { reason })
            }
            Err(Failure::Kafka(e, progressed)) => {
                if stop.is_terminated() {
                    // stopped while the last Kafka commit failed: nothing
                    // after Kafka's position was acknowledged, so what it
                    // held comes again at the next start
                    tracing::warn!(error = %e, "stopped while Kafka failed; what was not committed comes again at the next start");
                    return Ok(stats);
                }
                if progressed {
                    failing_since = None;
                    backoff = Duration::from_millis(200);
                }
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > sink.retry_for {
                    let for_ = since.elapsed();
                    return Err(if ever_connected {
                        SinkError::Kafka { for_, last: e }
                    } else {
                        SinkError::KafkaNeverConnected { for_, last: e }
                    });
                }
                tracing::warn!(error = %e, retry_in = ?backoff, "Kafka failed; starting over from Kafka's progress");
                stats.kafka_restarts += 1;
                sink.live.kafka_restart();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = &mut stop => return Ok(stats),
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(Failure::Other(e)) => return Err(e),
        }
    }
}

/// Why a session ended: Kafka errors are retried from Kafka's progress
/// (with whether this session committed anything); others end the sink.
enum Failure {
    Kafka(ProducerError, bool),
    Other(SinkError),
}

impl From<pgwal::Error> for Failure {
    fn from(e: pgwal::Error) -> Failure {
        Failure::Other(e.into())
    }
}

impl From<FormatError> for Failure {
    fn from(e: FormatError) -> Failure {
        Failure::Other(e.into())
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::Other(e.into())
    }
}

/// One producer and one stream, from Kafka's progress on.
struct Session<'a> {
    sink: &'a SinkConfig,
    stats: &'a mut SinkStats,
    /// The slot's name, for errors.
    slot: String,
    /// Kafka holds every transaction whose commit record is before this.
    written: Lsn,
    /// The last complete PostgreSQL transaction in the open Kafka one.
    pending_end: Option<Lsn>,
    /// Record bytes in the open Kafka transaction, and when its first
    /// complete PostgreSQL transaction ended.
    batch_bytes: usize,
    batch_since: Option<tokio::time::Instant>,
    /// Records in the open Kafka transaction.
    batch_records: u64,
    /// The PostgreSQL transaction whose records are being written, for
    /// errors.
    writing_xid: Option<u32>,
    /// The non-streamed transaction being read, unless it is skipped.
    current: Option<TxInfo>,
    /// Changes of streamed transactions that cannot be written, under
    /// `BadRecordPolicy::Fail`, by top-level xid with their subtransaction:
    /// the error comes at the commit, unless they abort first.
    failed_streamed: HashMap<u32, Vec<(u32, SinkError)>>,
    /// Snapshot signals inside streamed transactions, by top-level xid,
    /// with their positions: acted on at the transaction's commit.
    streamed_signals: HashMap<u32, Vec<(bytes::Bytes, Lsn)>>,
    /// Where the current transaction's records stand in it.
    order: TxOrder,
    /// The server's commit time of the latest transaction written.
    tx_commit_time: Option<PgTimestamp>,
    /// When the commit in flight started, and `tx_commit_time` then.
    commit_started: Option<(Instant, Option<PgTimestamp>)>,
    /// The commit time of the open Kafka transaction's first PostgreSQL
    /// transaction: the oldest not in Kafka once the commit in flight is.
    batch_first_commit_time: Option<PgTimestamp>,
    skip_current: bool,
    /// Streamed transactions in progress, and the one whose block is open.
    streamed: HashMap<u32, Spill>,
    block: Option<u32>,
    streamed_bytes: usize,
    committed_any: bool,
    /// The producer connected (its transactions initialised).
    connected: bool,
    /// The Kafka commit in flight and the position it makes durable;
    /// records that come meanwhile wait in `held` (up to `batch_bytes`).
    committing: Option<(Commit, Lsn)>,
    held: Vec<Record>,
    held_bytes: usize,
    /// A position Kafka now holds, for the slot.
    to_ack: Option<Lsn>,
    /// Key columns, with the primary keys of FULL tables looked up so far
    /// over `catalog`, a plain SQL connection opened at the first lookup.
    keys: KeyColumns,
    pg: Option<Config>,
    catalog: Option<ReplicationClient>,
    /// The slot's lock ([`crate::slot_lock`]), taken before the producer
    /// may fence anyone.
    slot_lock: Option<SlotLock>,
    /// The server's timeline, recorded with each position written.
    timeline: Option<u32>,
    /// The stream's receive timeout, which bounds each lookup too.
    lookup_timeout: Option<Duration>,
    /// The stream carries logical messages (snapshots' watermarks and
    /// signals).
    messages: bool,
    publications: Vec<String>,
    /// The snapshot in progress as of the last event, as of the commit in
    /// flight, and as of the last completed commit (what Kafka holds).
    snapshot: Option<SnapshotCursor>,
    snapshot_in_flight: Option<SnapshotCursor>,
    snapshot_committed: Option<SnapshotCursor>,
    /// The chunk waiting for its watermark, and when the next may be read.
    chunk: Option<Chunk>,
    next_chunk_at: Instant,
    /// Rows the next chunk asks for (below `snapshot_chunk_rows` after a
    /// chunk cut at the byte limit or one that took too long).
    chunk_rows: usize,
    /// Chunks and rows of the snapshot's current table this session wrote
    /// (logged when the table is done).
    table_chunks: u64,
    table_rows: u64,
    /// Whether the sink's role was checked for `pg_read_all_stats` (once
    /// a session, before its first chunk).
    stats_role_checked: bool,
    /// When to ask the server for its position, for a read-only chunk.
    ask_position_at: Option<Instant>,
    /// Transactions written while a snapshot runs, with the rows they
    /// changed, as long as a chunk's read may still see them in progress
    /// (see [`crate::snapshot`]); and the current transaction's rows.
    written_rows: HashMap<u32, WrittenRows>,
    current_rows: WrittenRows,
    /// Transactions written before `written_rows` was kept may still be
    /// hidden: those waiting for a synchronous standby at the first chunk
    /// read since, until they finish (`None`: not known yet).
    unverified: bool,
    waiting_for: Option<Vec<u32>>,
    /// The tables each streamed transaction in progress touched.
    streamed_tables: HashMap<u32, HashSet<u32>>,
    /// Keys and values to Avro (kept across sessions: the schema ids).
    avro: Option<&'a mut AvroConverter>,
}

type Commit = std::pin::Pin<Box<dyn Future<Output = Result<(), ProducerError>> + Send>>;

impl<'a> Session<'a> {
    fn new(sink: &'a SinkConfig, stats: &'a mut SinkStats) -> Session<'a> {
        Session {
            sink,
            stats,
            slot: String::new(),
            written: Lsn(0),
            pending_end: None,
            batch_bytes: 0,
            batch_since: None,
            batch_records: 0,
            writing_xid: None,
            current: None,
            failed_streamed: HashMap::new(),
            streamed_signals: HashMap::new(),
            order: TxOrder::new(),
            tx_commit_time: None,
            batch_first_commit_time: None,
            commit_started: None,
            skip_current: false,
            streamed: HashMap::new(),
            block: None,
            streamed_bytes: 0,
            committed_any: false,
            connected: false,
            committing: None,
            held: Vec::new(),
            held_bytes: 0,
            to_ack: None,
            keys: sink.key_columns.clone(),
            pg: None,
            catalog: None,
            slot_lock: None,
            timeline: None,
            lookup_timeout: None,
            messages: false,
            publications: Vec::new(),
            snapshot: None,
            snapshot_in_flight: None,
            snapshot_committed: None,
            chunk: None,
            next_chunk_at: Instant::now(),
            chunk_rows: usize::MAX,
            table_chunks: 0,
            table_rows: 0,
            stats_role_checked: false,
            ask_position_at: None,
            written_rows: HashMap::new(),
            current_rows: WrittenRows::default(),
            unverified: true,
            waiting_for: None,
            streamed_tables: HashMap::new(),
            avro: None,
        }
    }

    /// The primary key columns of the table `oid`, in key order (empty: it
    /// has none), from the catalog as it is now. A connection that broke
    /// while idle (the server restarted, TCP keepalives found the peer
    /// gone) is made anew once.
    async fn primary_key(&mut self, oid: u32) -> Result<Vec<String>, pgwal::Error> {
        match self.primary_key_once(oid).await {
            Err(e) if e.is_transient() => {
                tracing::debug!(error = %e, "catalog connection broken; connecting again");
                self.primary_key_once(oid).await
            }
            r => r,
        }
    }

    /// One lookup, bounded by the stream's receive timeout.
    async fn primary_key_once(&mut self, oid: u32) -> Result<Vec<String>, pgwal::Error> {
        let limit = self.lookup_timeout;
        let lookup = async {
            if self.catalog.is_none() {
                let pg = self.pg.as_ref().expect("set when the session starts");
                self.catalog = Some(ReplicationClient::connect_sql(pg).await?);
            }
            let client = self.catalog.as_mut().expect("just connected");
            let rows = client.simple_query(&primary_key_query(oid)).await?;
            Ok(rows
                .iter()
                .filter_map(|r| r.get("attname").map(str::to_owned))
                .collect())
        };
        let r =
            match limit {
                Some(t) => tokio::time::timeout(t, lookup).await.unwrap_or(Err(
                    pgwal::Error::ReceiveTimeout {
                        after: t,
                        waiting_for: "a primary key lookup",
                    },
                )),
                None => lookup.await,
            };
        if r.is_err() {
            // a broken connection is made anew at the next lookup
            self.catalog = None;
        }
        r
    }

    /// The plain SQL connection for lookups and snapshot chunks, made at
    /// its first use and after it broke.
    async fn catalog(&mut self) -> Result<&mut ReplicationClient, pgwal::Error> {
        if self.catalog.is_none() {
            let pg = self.pg.as_ref().expect("set when the session starts");
            self.catalog = Some(ReplicationClient::connect_sql(pg).await?);
        }
        Ok(self.catalog.as_mut().expect("just connected"))
    }

    /// Where the server stands: its timeline, its WAL, whether a standby.
    async fn server_position(&self) -> Result<ServerPosition, pgwal::Error> {
        let pg = self.pg.as_ref().expect("set when the session starts");
        let mut c = ReplicationClient::connect(pg).await?;
        let id = c.identify_system().await?;
        let rows = c.simple_query("SELECT pg_is_in_recovery()").await?;
        Ok(ServerPosition {
            timeline: id.timeline,
            wal: id.xlog_pos,
            in_recovery: rows.first().and_then(|r| r.get_index(0)) == Some("t"),
        })
    }

    /// The server, once it has Kafka's position on its history: a standby
    /// still behind it is waited for; a server that cannot have it is
    /// refused ([`SinkError::ServerLacksKafkaPosition`]).
    async fn server_with(&self, kafka: Option<&Progress>) -> Result<ServerPosition, Failure> {
        let mut said: Option<Instant> = None;
        loop {
            let server = self.server_position().await?;
            let Some(p) = kafka else { return Ok(server) };
            let history = match p.timeline {
                Some(t) if t != server.timeline && server.timeline > 1 => {
                    let pg = self.pg.as_ref().expect("set when the session starts");
                    let mut c = ReplicationClient::connect(pg).await?;
                    Some(c.timeline_history(server.timeline).await?)
                }
                _ => None,
            };
            match server_history::check(p.end_lsn, p.timeline, &server, history.as_ref()) {
                Verdict::Holds => return Ok(server),
                Verdict::StandbyBehind => {
                    if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                        said = Some(Instant::now());
                        tracing::info!(kafka = %p.end_lsn, standby = %server.wal, "the standby has not yet received Kafka's position; waiting for it");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                verdict @ (Verdict::BeyondServer | Verdict::OffHistory { .. }) => {
                    let fork = match verdict {
                        Verdict::OffHistory { fork } => fork,
                        _ => None,
                    };
                    return Err(Failure::Other(SinkError::ServerLacksKafkaPosition {
                        slot: self.slot.clone(),
                        kafka: p.end_lsn,
                        kafka_timeline: p.timeline,
                        server: server.wal,
                        server_timeline: server.timeline,
                        fork,
                    }));
                }
            }
        }
    }

    fn kafka(&self, e: ProducerError) -> Failure {
        Failure::Kafka(e, self.committed_any)
    }

    async fn run(
        &mut self,
        pg: &Config,
        stream_cfg: &StreamConfig,
        pcfg: &ProducerConfig,
        stop: &mut (impl Future<Output = ()> + Unpin),
    ) -> Result<(), Failure> {
        self.pg = Some(pg.clone());
        self.lookup_timeout = stream_cfg.receive_timeout;
        self.slot.clone_from(&stream_cfg.slot);
        // One sink per slot: the slot's lock first, then the producer, whose
        // start fences the transactional id's earlier producers. A second
        // sink waits here and fences nobody.
        if let Some(lock) = &mut self.slot_lock {
            if !lock.held().await {
                self.slot_lock = None;
            }
        }
        if self.slot_lock.is_none() {
            self.slot_lock = Some(tokio::select! {
                l = SlotLock::acquire(pg, &stream_cfg.slot, &stream_cfg.retry) => l?,
                _ = &mut *stop => return Ok(()),
            });
        }
        // a stop before streaming began leaves nothing to finish
        let mut producer = tokio::select! {
            p = KafkaProducer::connect(pcfg.clone()) => p.map_err(|e| self.kafka(e))?,
            _ = &mut *stop => return Ok(()),
        };
        self.connected = true;
        let progress = tokio::select! {
            c = producer.committed_progress() => c.map_err(|e| self.kafka(e))?,
            _ = &mut *stop => return Ok(()),
        };
        // the server must have what Kafka holds, or the stream would start
        // past this server's own transactions below Kafka's position
        let server = tokio::select! {
            s = self.server_with(progress.as_ref()) => s?,
            _ = &mut *stop => return Ok(()),
        };
        self.timeline = Some(server.timeline);
        let committed = progress.as_ref().map(|p| p.end_lsn);
        self.stats.position = committed;
        self.publications = stream_cfg.publications.clone();
        self.snapshot = match progress {
            Some(p) => p.snapshot,
            None if self.sink.initial_snapshot => self.plan_initial_snapshot().await?,
            None => None,
        };
        self.snapshot_committed = self.snapshot.clone();
        if let Some(s) = &self.snapshot {
            tracing::info!(
                tables = s.tables.len(),
                rows_so_far = s.rows,
                "snapshot in progress"
            );
        }
        // the slot moves only at positions Kafka holds: an idle advance
        // would not be in the progress record, and the next start would
        // find the slot ahead of Kafka
        let mut cfg = stream_cfg.clone().idle_advance(false);
        if self.messages {
            cfg = cfg.messages(true);
        }
        if let Some(every) = self.sink.heartbeat {
            cfg = cfg.heartbeat(every);
        }
        if let Some(l) = committed {
            self.written = l;
            cfg = cfg.consumer_position(l);
        }
        let mut stream = tokio::select! {
            s = LogicalStream::start(pg.clone(), cfg) => s?,
            _ = &mut *stop => return Ok(()),
        };
        if committed.is_some_and(|k| k > stream.confirmed()) {
            self.stats.resumed_ahead_of_slot += 1;
        }
        tracing::info!(
            kafka = %committed.map_or_else(|| "nothing".to_owned(), |l| l.to_string()),
            slot = %stream.confirmed(),
            "streaming into Kafka from what it holds"
        );
        let live = &self.sink.live;
        live.positions(committed, stream.confirmed(), stream.server_wal_end());
        live.set_streaming(true);
        let result = self.pump(&mut stream, &mut producer, stop).await;
        self.sink.live.set_streaming(false);
        if result.is_err() {
            // nothing partial may commit; the broker aborts it anyway once
            // the next producer fences this one
            let _ = producer.abort().await;
        }
        let shutdown = stream.shutdown().await;
        result?;
        shutdown?;
        Ok(())
    }

    async fn pump(
        &mut self,
        stream: &mut LogicalStream,
        producer: &mut KafkaProducer,
        stop: &mut (impl Future<Output = ()> + Unpin),
    ) -> Result<(), Failure> {
        loop {
            let deadline = self
                .batch_since
                .map(|t| t + self.sink.batch_time)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            if let Some(l) = self.to_ack.take() {
                stream.ack(l);
            }
            // a chunk is read between transactions: everything written so
            // far is before its window
            if self.snapshot.is_some()
                && self.chunk.is_none()
                && self.current.is_none()
                && self.block.is_none()
                && Instant::now() >= self.next_chunk_at
            {
                self.read_chunk().await?;
            }
            self.sink.live.snapshot(
                self.stats,
                self.snapshot.as_ref().map_or(0, |s| s.tables.len()),
            );
            self.sink
                .live
                .positions(None, stream.confirmed(), stream.server_wal_end());
            let committing = self.committing.is_some();
            let chunk_later = self.snapshot.is_some()
                && self.chunk.is_none()
                && self.current.is_none()
                && self.block.is_none();
            let ask_at = self.ask_position_at.filter(|_| self.chunk.is_some());
            let event = tokio::select! {
                // reading goes on while Kafka commits
                r = async { self.committing.as_mut().expect("guarded").0.as_mut().await }, if committing => {
                    self.committed(r, producer, true).await?;
                    continue;
                }
                e = stream.next() => e,
                _ = tokio::time::sleep_until(deadline), if self.pending_end.is_some() && self.current.is_none() => {
                    self.commit(producer).await?;
                    continue;
                }
                // a chunk to read again later, while the stream is idle
                _ = tokio::time::sleep_until(self.next_chunk_at.into()), if chunk_later => continue,
                // a read-only chunk waits for the stream to pass its position
                _ = tokio::time::sleep_until(ask_at.unwrap_or_else(Instant::now).into()), if ask_at.is_some() => {
                    self.ask_position_at = None;
                    stream.request_position();
                    continue;
                }
                _ = &mut *stop => {
                    // complete transactions are kept; a partial one comes again
                    self.finish(producer).await?;
                    if let Some(l) = self.to_ack.take() {
                        stream.ack(l);
                    }
                    return Ok(());
                }
            };
            let Some(event) = event else {
                // stop_lsn reached
                self.finish(producer).await?;
                if let Some(l) = self.to_ack.take() {
                    stream.ack(l);
                }
                return Ok(());
            };
            self.event(event?, stream, producer).await?;
        }
    }

    async fn event(
        &mut self,
        event: Event,
        stream: &mut LogicalStream,
        producer: &mut KafkaProducer,
    ) -> Result<(), Failure> {
        if let Some(high) = self.chunk.as_ref().and_then(|c| c.high) {
            self.read_only_window(high, &event, producer).await?;
        }
        match &event {
            Event::Begin(b) => {
                self.current_rows = WrittenRows::default();
                self.skip_current = b.final_lsn < self.written;
                self.current = Some(TxInfo::new(b.xid, b.final_lsn, b.commit_time));
                self.writing_xid = Some(b.xid);
                self.order = TxOrder::new();
            }
            Event::Insert(c) | Event::Update(c) | Event::Delete(c) => {
                self.change(c.xid, &event, producer).await?;
            }
            Event::Truncate(t) => self.change(t.xid, &event, producer).await?,
            // it comes before the table's first change in this session and
            // again after DDL: a FULL table is keyed by its primary key
            Event::Relation(rel) if self.keys.needs_lookup(rel) => {
                let columns = self.primary_key(rel.oid).await?;
                if columns.is_empty() {
                    tracing::warn!(
                        table = %format!("{}.{}", rel.namespace, rel.name),
                        "REPLICA IDENTITY FULL and no primary key: its records have no key \
                         (name key columns with --kafka-key-columns to keep each row's changes in order)"
                    );
                }
                self.keys.set_primary_key(rel, columns);
            }
            Event::Commit(c) => {
                let xid = self.current.take().map(|t| t.xid);
                let rows = std::mem::take(&mut self.current_rows);
                if let (Some(xid), false) = (xid, rows.is_empty()) {
                    self.written_rows.insert(xid, rows);
                }
                if std::mem::take(&mut self.skip_current) {
                    self.stats.skipped += 1;
                    stream.ack(c.end_lsn);
                } else {
                    self.stats.transactions += 1;
                    self.sink.live.transaction();
                    self.tx_commit_time = Some(c.commit_time);
                    self.read_transaction(c.commit_time);
                    self.transaction_done(c.end_lsn, producer).await?;
                }
            }
            Event::StreamStart(s) => {
                self.block = Some(s.xid);
                self.streamed.entry(s.xid).or_insert_with(Spill::new);
            }
            Event::StreamStop => self.block = None,
            Event::StreamAbort(a) => {
                if let Some(f) = self.failed_streamed.get_mut(&a.xid) {
                    f.retain(|(sub, _)| a.xid != a.subxid && *sub != a.subxid);
                    if f.is_empty() {
                        self.failed_streamed.remove(&a.xid);
                    }
                }
                // a signal of a subtransaction that rolled back cannot be
                // told from the others (pgoutput gives a streamed message
                // its top-level xid), so it still counts at the commit
                if a.xid == a.subxid {
                    self.streamed_signals.remove(&a.xid);
                    self.streamed_tables.remove(&a.xid);
                    if let Some(s) = self.streamed.remove(&a.xid) {
                        self.streamed_bytes -= s.memory_bytes();
                    }
                } else if let Some(s) = self.streamed.get_mut(&a.xid) {
                    let before = s.memory_bytes();
                    s.abort_subxact(a.subxid).await?;
                    self.streamed_bytes -= before - s.memory_bytes();
                }
            }
            Event::StreamCommit(c) => {
                self.writing_xid = Some(c.xid);
                if let Some((_, e)) = self
                    .failed_streamed
                    .remove(&c.xid)
                    .and_then(|f| f.into_iter().next())
                {
                    return Err(Failure::Other(e));
                }
                let spill = self.streamed.remove(&c.xid).unwrap_or_else(Spill::new);
                self.streamed_bytes -= spill.memory_bytes();
                let touched = self.streamed_tables.remove(&c.xid).unwrap_or_default();
                let signals = self.streamed_signals.remove(&c.xid).unwrap_or_default();
                if c.commit_lsn < self.written {
                    self.stats.skipped += 1;
                    stream.ack(c.end_lsn);
                    return Ok(());
                }
                // its changes are written now, in the chunk's window, and
                // their keys were not kept: read the chunk again
                if let Some(chunk) = self.chunk.as_mut() {
                    if touched.contains(&chunk.relation.oid) {
                        chunk.abandoned = true;
                    }
                }
                if self.snapshot.is_some() && !touched.is_empty() {
                    self.written_rows.insert(
                        c.xid,
                        WrittenRows {
                            keys: Vec::new(),
                            unkeyed: touched,
                        },
                    );
                }
                let tx = TxInfo::new(c.xid, c.commit_lsn, c.commit_time);
                let mut order = TxOrder::new();
                let mut records = spill.into_reader().await?;
                while let Some(mut r) = records.next().await? {
                    if let Some(v) = &r.value {
                        // a dead-letter record has pgwal's commit fields
                        let format = match &self.sink.bad_records {
                            BadRecordPolicy::DeadLetter { topic } if *topic == r.topic => {
                                &Format::Pgwal
                            }
                            _ => &self.sink.format,
                        };
                        r.value =
                            Some(stamp(format, v, &tx, &mut order).map_err(std::io::Error::other)?);
                    }
                    self.send(&r, producer).await?;
                }
                // in commit order, in the Kafka transaction of its records
                for (content, lsn) in signals {
                    self.signal(&content, lsn);
                }
                self.stats.transactions += 1;
                self.sink.live.transaction();
                self.tx_commit_time = Some(c.commit_time);
                self.read_transaction(c.commit_time);
                self.transaction_done(c.end_lsn, producer).await?;
            }
            // delivered only between transactions (the stream holds it back
            // while a streamed one is open)
            Event::Heartbeat { wal_end }
                if self.current.is_none()
                    && self.streamed.is_empty()
                    && *wal_end > self.written.max(self.pending_end.unwrap_or_default()) =>
            {
                self.stats.heartbeats += 1;
                // no transaction: the lag stays that of the last one
                self.tx_commit_time = None;
                self.transaction_done(*wal_end, producer).await?;
            }
            Event::Reconnected { restart_lsn } => {
                // everything after the acknowledged position comes again
                tracing::info!(%restart_lsn, "stream reconnected; aborting the open Kafka transaction");
                // perhaps to a promoted standby: what comes now is on its
                // timeline
                self.timeline = match self.server_position().await {
                    Ok(s) => Some(s.timeline),
                    Err(e) => {
                        tracing::warn!(error = %e, "the server's timeline is not known; positions are written without it");
                        None
                    }
                };
                self.sink.live.reconnect();
                // what the commit in flight holds is complete; what came
                // after it comes again
                self.held.clear();
                self.held_bytes = 0;
                self.await_commit(producer, false).await?;
                producer.abort().await.map_err(|e| self.kafka(e))?;
                self.pending_end = None;
                self.batch_bytes = 0;
                self.batch_records = 0;
                self.batch_since = None;
                self.current = None;
                self.skip_current = false;
                self.streamed.clear();
                self.failed_streamed.clear();
                self.streamed_signals.clear();
                self.streamed_bytes = 0;
                self.block = None;
                // Kafka holds the snapshot as far as its last commit
                self.snapshot = self.snapshot_committed.clone();
                self.chunk = None;
                self.ask_position_at = None;
                self.streamed_tables.clear();
            }
            Event::Message(m)
                if m.is_transactional() && !self.skip_current && self.block.is_none() =>
            {
                if m.prefix == snapshot::WATERMARK_PREFIX {
                    if self
                        .chunk
                        .as_ref()
                        .is_some_and(|c| c.id.as_bytes() == &m.content[..])
                    {
                        let tx = self
                            .current
                            .expect("a transactional message is inside its transaction");
                        self.chunk_done(m.lsn, tx, producer).await?;
                    }
                } else if m.prefix == snapshot::SIGNAL_PREFIX && self.sink.snapshot_signals {
                    self.signal(&m.content, m.lsn);
                }
            }
            Event::Message(m)
                if m.is_transactional()
                    && m.prefix == snapshot::SIGNAL_PREFIX
                    && self.sink.snapshot_signals =>
            {
                if let Some(top) = self.block {
                    self.streamed_signals
                        .entry(top)
                        .or_default()
                        .push((m.content.clone(), m.lsn));
                }
            }
            // checked at the start: a slot made two-phase since
            Event::BeginPrepare(_)
            | Event::Prepare(_)
            | Event::StreamPrepare(_)
            | Event::CommitPrepared(_)
            | Event::RollbackPrepared(_) => {
                return Err(Failure::Other(SinkError::TwoPhaseSlot {
                    slot: self.slot.clone(),
                }));
            }
            // relations are in the stream's cache; messages and origins are
            // not written
            _ => {}
        }
        Ok(())
    }

    /// A row change or truncate: into Kafka now, or held with its streamed
    /// transaction.
    async fn change(
        &mut self,
        xid: Option<u32>,
        event: &Event,
        producer: &mut KafkaProducer,
    ) -> Result<(), Failure> {
        let now = PgTimestamp::now();
        if let (Some(top), Some(_)) = (self.block, xid) {
            let touched = self.streamed_tables.entry(top).or_default();
            match event {
                Event::Insert(c) | Event::Update(c) | Event::Delete(c) => {
                    touched.insert(c.relation.oid);
                }
                Event::Truncate(t) => touched.extend(t.relations.iter().map(|r| r.oid)),
                _ => {}
            }
        }
        if let (Some(top), Some(sub)) = (self.block, xid) {
            // the commit's fields are stamped in at the commit, and the
            // orders counted again there
            let tx = TxInfo::new(top, Lsn(0), PgTimestamp(0));
            let encoded = encode(
                &self.sink.format,
                &self.sink.routing,
                &self.keys,
                &tx,
                &mut TxOrder::new(),
                event,
                now,
            );
            let records = match self.writable(event, &tx, encoded.map_err(BadRecordReason::Format))
            {
                Ok(Some(records)) => records,
                Ok(None) => return Ok(()),
                // the transaction may still abort, or this subtransaction:
                // fail at its commit
                Err(Failure::Other(e @ SinkError::BadRecord { .. })) => {
                    self.failed_streamed.entry(top).or_default().push((sub, e));
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            let spill = self.streamed.get_mut(&top).expect("opened at StreamStart");
            let before = spill.memory_bytes();
            for r in records {
                spill.push(top, sub, r);
            }
            self.streamed_bytes += spill.memory_bytes() - before;
            if self.streamed_bytes > self.sink.memory_limit {
                self.spill_largest().await?;
            }
            return Ok(());
        }
        if self.skip_current {
            return Ok(());
        }
        let Some(tx) = self.current else {
            let lsn = match event {
                Event::Insert(c) | Event::Update(c) | Event::Delete(c) => c.lsn,
                Event::Truncate(t) => t.lsn,
                _ => Lsn(0),
            };
            return Err(Failure::Other(SinkError::Unexpected {
                what: "a row change",
                lsn,
            }));
        };
        if let Some(chunk) = self.chunk.as_mut() {
            in_window(chunk, event, &self.keys);
        }
        if self.snapshot.is_some() {
            self.current_rows.add(event, &self.keys);
        }
        let encoded = encode(
            &self.sink.format,
            &self.sink.routing,
            &self.keys,
            &tx,
            &mut self.order,
            event,
            now,
        );
        let Some(records) = self.admit(event, &tx, encoded).await? else {
            return Ok(());
        };
        for r in records {
            self.send_ready(&r, producer).await?;
        }
        Ok(())
    }

    /// The records to send for a change outside a streamed transaction,
    /// in their final form: converted to Avro first (with `--kafka-avro`),
    /// so that the size limit and the bad-record policy apply to the
    /// bytes Kafka gets. A value with no Avro form is a bad record; a
    /// registry that cannot be reached, or refuses a schema, still ends
    /// the session.
    // as `writable`
    #[allow(clippy::result_large_err)]
    async fn admit(
        &mut self,
        event: &Event,
        tx: &TxInfo,
        encoded: Result<Vec<Record>, FormatError>,
    ) -> Result<Option<Vec<Record>>, Failure> {
        let encoded = match (encoded, self.avro.as_deref_mut()) {
            (Err(e), _) => Err(BadRecordReason::Format(e)),
            (Ok(records), None) => Ok(records),
            (Ok(records), Some(c)) => {
                let mut converted = Vec::with_capacity(records.len());
                let mut failed = None;
                for r in &records {
                    match c.convert(r).await {
                        Ok(a) => converted.push(a),
                        Err(e @ ConvertError::Avro { .. }) => {
                            failed = Some(BadRecordReason::Avro(e));
                            break;
                        }
                        Err(e) => return Err(Failure::Other(SinkError::Avro(e))),
                    }
                }
                match failed {
                    Some(reason) => Err(reason),
                    None => Ok(converted),
                }
            }
        };
        self.writable(event, tx, encoded)
    }

    /// The records to write for a change: its own, or by the bad-record
    /// policy when it cannot be encoded or a record is too large (`None`:
    /// skipped).
    // the error ends the session: its size costs nothing on the way of
    // records that are written
    #[allow(clippy::result_large_err)]
    fn writable(
        &mut self,
        event: &Event,
        tx: &TxInfo,
        encoded: Result<Vec<Record>, BadRecordReason>,
    ) -> Result<Option<Vec<Record>>, Failure> {
        let limit = self.sink.max_record_bytes;
        let size =
            |r: &Record| r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len);
        let (reason, key) = match encoded {
            Ok(records) => match records.iter().find(|r| size(r) > limit) {
                None => return Ok(Some(records)),
                Some(big) => (
                    BadRecordReason::TooLarge {
                        bytes: size(big),
                        limit,
                    },
                    big.key.clone().filter(|k| k.len() <= limit / 2),
                ),
            },
            Err(reason) => (reason, None),
        };
        let (table, lsn) = bad_records::describe(event);
        match &self.sink.bad_records {
            BadRecordPolicy::Skip => {
                tracing::warn!(%table, %lsn, xid = tx.xid, reason = %reason, "change skipped (--kafka-bad-records skip)");
                self.stats.bad_skipped += 1;
                self.sink.live.bad_record(false);
                Ok(None)
            }
            BadRecordPolicy::DeadLetter { topic } => {
                tracing::warn!(%table, %lsn, xid = tx.xid, reason = %reason, %topic, "change written to the dead-letter topic");
                self.stats.dead_lettered += 1;
                self.sink.live.bad_record(true);
                let with_rows = !matches!(reason, BadRecordReason::TooLarge { .. });
                let r = bad_records::dead_letter(topic, event, tx, &reason, key, with_rows);
                Ok(Some(vec![r]))
            }
            _ => Err(Failure::Other(SinkError::BadRecord {
                table,
                lsn,
                reason: Box::new(reason),
            })),
        }
    }

    async fn spill_largest(&mut self) -> Result<(), Failure> {
        while self.streamed_bytes > self.sink.memory_limit / 2 {
            let Some((_, s)) = self
                .streamed
                .iter_mut()
                .max_by_key(|(_, s)| s.memory_bytes())
            else {
                break;
            };
            let b = s.memory_bytes();
            if b == 0 {
                break;
            }
            if !s.on_disk() {
                self.stats.spilled += 1;
            }
            s.spill(&self.sink.spill_dir).await?;
            self.streamed_bytes -= b;
        }
        Ok(())
    }
}
