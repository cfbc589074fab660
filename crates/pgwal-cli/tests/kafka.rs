//! `pgwal stream --sink kafka` against a real broker (tools/kafka-broker):
//! every change exactly once, across SIGKILLs of pgwal, crashes of the
//! broker and terminated walsenders, under a mixed load (TOAST, key
//! changes, truncates, two-phase commits, large streamed transactions with
//! rolled-back savepoints and aborts).
//!
//! The verdicts, each from what a read_committed consumer sees at the end:
//! - no record twice;
//! - the records equal, as a multiset, those of a reference stream of the
//!   same changes (a slot made before the load, read once without faults
//!   and encoded alike);
//! - applied in order to an empty copy, they give the source tables.

#[path = "../../pgwal-kafka/tests/broker/mod.rs"]
mod broker;
#[path = "../../pgwal/tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker::{read_all, Broker, Consumed, KafkaCluster};
use futures_util::StreamExt;
use pgwal::{CreateSlotOptions, Event, LogicalStream, Lsn, ReplicationClient, StreamConfig};
use pgwal_kafka::keys::primary_key_query;
use pgwal_kafka::{encode, DecimalMode, Format, KeyColumns, Routing, TxInfo, TxOrder};
use serde_json::Value;
use support::netns::SilentNet;
use support::{block_on, config, Cluster, Options};

const TABLES: [&str; 4] = ["items", "docs", "scratch", "bulk"];
const PREFIX: &str = "pgwal";
const PROGRESS: &str = "pgwal.progress";

/// One broker at a time: the tests' brokers would share a directory name
/// and race for ports, and two JVMs with their clusters crowd two cores.
static ONE_BROKER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_broker() -> std::sync::MutexGuard<'static, ()> {
    ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner())
}

const SETUP: &str = "
CREATE TABLE items (id bigint PRIMARY KEY, ver int NOT NULL, note text);
CREATE TABLE docs (id int PRIMARY KEY, ver int NOT NULL, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE docs REPLICA IDENTITY FULL;
CREATE TABLE scratch (id int PRIMARY KEY, v int);
CREATE TABLE bulk (id bigint PRIMARY KEY, round int NOT NULL);
CREATE PUBLICATION p FOR TABLE items, docs, scratch, bulk;
";

/// One round of the load: about ten transactions, every change unique
/// (each update moves a version), so that a record seen twice is a
/// duplicate and not a second, equal change.
fn round_sql(r: u64) -> String {
    let b = r * 1000;
    let mut s = format!(
        "
INSERT INTO items SELECT g, 1, 'r{r}' FROM generate_series({b} + 1, {b} + 20) g;
BEGIN;
UPDATE items SET ver = ver + 1 WHERE id BETWEEN {b} + 3 AND {b} + 10;
UPDATE items SET ver = ver + 1, note = 'again' WHERE id = {b} + 4;
COMMIT;
UPDATE items SET id = id + 1000000000, ver = ver + 1 WHERE id = {b} + 1;
DELETE FROM items WHERE id = {b} + 2;
INSERT INTO docs VALUES ({r}, 1, (SELECT string_agg(md5(g::text || '{r}'), '') FROM generate_series(1, 300) g));
UPDATE docs SET ver = ver + 1 WHERE id = {r} - 1;
BEGIN; INSERT INTO items VALUES ({b} + 500, 1, '2pc'); PREPARE TRANSACTION 'c{r}'; COMMIT PREPARED 'c{r}';
BEGIN; INSERT INTO items VALUES ({b} + 501, 1, 'rolled back'); PREPARE TRANSACTION 'a{r}'; ROLLBACK PREPARED 'a{r}';
INSERT INTO scratch VALUES ({r}, 0);
"
    );
    if r.is_multiple_of(4) {
        s.push_str("TRUNCATE scratch;\n");
    }
    // a streamed transaction (above logical_decoding_work_mem) every
    // twelfth round: most of the records (and of the test's time in CI,
    // where catching up and checking them took minutes), so not more often
    if r.is_multiple_of(12) {
        let b = r * 10_000;
        s.push_str(&format!(
            "
BEGIN;
INSERT INTO bulk SELECT g, {r} FROM generate_series({b} + 1, {b} + 1000) g;
SAVEPOINT s;
INSERT INTO bulk SELECT g, -1 FROM generate_series({b} + 2001, {b} + 2500) g;
ROLLBACK TO s;
UPDATE bulk SET round = round + 1 WHERE id BETWEEN {b} + 1 AND {b} + 100;
COMMIT;
BEGIN;
INSERT INTO bulk SELECT g, -2 FROM generate_series({b} + 5001, {b} + 6000) g;
ROLLBACK;
"
        ));
    }
    s
}

/// The running `pgwal stream --sink kafka`.
struct Sink {
    child: Child,
    log: PathBuf,
}

fn start_sink(c: &Cluster, kafka: &[String], logs: &Path, n: usize, extra: &[&str]) -> Sink {
    start_sink_in(None, &c.conninfo("postgres"), kafka, logs, n, extra)
}

/// The sink connecting with `conninfo`, inside `net`'s namespace if given.
fn start_sink_in(
    net: Option<&SilentNet>,
    conninfo: &str,
    kafka: &[String],
    logs: &Path,
    n: usize,
    extra: &[&str],
) -> Sink {
    let log = logs.join(format!("pgwal-{n}.log"));
    let mut cmd = match net {
        Some(net) => net.command(env!("CARGO_BIN_EXE_pgwal")),
        None => Command::new(env!("CARGO_BIN_EXE_pgwal")),
    };
    cmd.arg("-d")
        .arg(format!("{conninfo} sslmode=disable"))
        .args([
            "stream",
            "-S",
            "kslot",
            "-P",
            "p",
            "--streaming",
            "on",
            "--sink",
            "kafka",
            "--kafka-topic-prefix",
            PREFIX,
            // compared with the reference stream, orders included
            "--kafka-transaction-metadata",
            // no memory for streamed transactions: every one goes
            // through the spill file, subtransaction aborts truncate it
            "--kafka-memory-mib",
            "0",
            "--kafka-spill-dir",
        ])
        .arg(logs)
        .args(kafka)
        .args(extra)
        .env("PGWAL_LOG", "pgwal=warn,pgwal_kafka=info,librdkafka=warn")
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap());
    Sink {
        child: cmd.spawn().unwrap(),
        log,
    }
}

impl Sink {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `limit` for the process to exit; its success and log.
    fn wait(self, limit: Duration) -> (bool, String) {
        let (code, log) = self.wait_code(limit);
        (code == Some(0), log)
    }

    /// Waits up to `limit` for the process to exit; its exit status and log.
    fn wait_code(mut self, limit: Duration) -> (Option<i32>, String) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (st.code(), self.log());
            }
            if t0.elapsed() > limit {
                let _ = self.child.kill();
                panic!("pgwal did not exit within {limit:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the process streams (its producer is connected and
    /// Kafka's position read).
    fn wait_streaming(&self) {
        let t0 = Instant::now();
        while !self.log().contains("streaming into Kafka") {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "pgwal did not start streaming within 120 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Panics with the log if the process has exited.
    fn assert_running(&mut self, what: &str) {
        if let Some(st) = self.child.try_wait().unwrap() {
            panic!("{what}: pgwal exited ({st}):\n{}", self.log());
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        Command::new("kill").args([sig, &pid]).status().unwrap();
    }

    fn terminate(self) -> (bool, String) {
        self.signal("-TERM");
        self.wait(Duration::from_secs(60))
    }

    /// SIGKILLs the sink at a moment when Kafka holds more than the slot
    /// confirmed, so that the next start must skip what it receives again.
    /// The sink acknowledges shortly after each Kafka commit (its reply to
    /// the walsender's next keepalive), so a kill at a random moment often
    /// finds the two equal; stopped (SIGSTOP) it sends nothing, both
    /// readings hold still, and if the slot had caught up it runs on until
    /// Kafka moves again.  Returns whether the slot was behind (false only
    /// if that did not happen within 60 s).
    /// `partition`: the stream's partition of the progress topic, where
    /// others may be unreadable (a cluster with nodes down); `None` reads
    /// them all.
    fn kill_with_slot_behind(
        mut self,
        c: &Cluster,
        addr: &str,
        partition: Option<i32>,
        load_over: &AtomicBool,
    ) -> bool {
        let t0 = Instant::now();
        loop {
            self.signal("-STOP");
            // a reply already on the wire reaches the slot first
            std::thread::sleep(Duration::from_millis(300));
            let kafka = kafka_progress_in(addr, partition);
            let slot: Lsn = c
                .query(
                    "SELECT confirmed_flush_lsn FROM pg_replication_slots \
                     WHERE slot_name = 'kslot'",
                )
                .parse()
                .unwrap();
            let behind = kafka > Some(slot);
            if behind || t0.elapsed() > Duration::from_secs(60) {
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                return behind;
            }
            self.signal("-CONT");
            wait_progress_in(addr, partition, &self, load_over);
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kafka's committed position of the stream, as a read_committed reader
/// of the progress topic finds it.
fn kafka_progress(addr: &str) -> Option<Lsn> {
    kafka_progress_in(addr, None)
}

/// [`kafka_progress`] from the progress topic's `partition` only (the
/// stream's), or from all of them.
fn kafka_progress_in(addr: &str, partition: Option<i32>) -> Option<Lsn> {
    let records = match partition {
        Some(p) => broker::read_partitions(
            addr,
            &[(PROGRESS, p)],
            "read_committed",
            Duration::from_secs(120),
        )
        .unwrap_or_else(|e| panic!("{e}")),
        None => read_all(addr, &[PROGRESS], "read_committed"),
    };
    records.last().map(|r| {
        let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        v["end_lsn"].as_str().unwrap().parse().unwrap()
    })
}

/// Waits until Kafka's progress passed what it is now (the running sink
/// committed something of its own), or the load is over.  Measured from
/// now, not from an earlier wait: a new sink starts where the last one
/// committed, which may already be past an earlier reading, and a wait
/// against that reading would let the next fault come before this sink
/// wrote anything.
fn wait_progress(addr: &str, sink: &Sink, load_over: &AtomicBool) {
    wait_progress_in(addr, None, sink, load_over)
}

/// [`wait_progress`] reading the progress topic's `partition` only.
fn wait_progress_in(addr: &str, partition: Option<i32>, sink: &Sink, load_over: &AtomicBool) {
    let t0 = Instant::now();
    let before = kafka_progress_in(addr, partition);
    loop {
        let p = kafka_progress_in(addr, partition);
        if p > before || load_over.load(Ordering::SeqCst) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "Kafka's progress stayed at {before:?} for 120 s; pgwal's log:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn topic(table: &str) -> String {
    format!("{PREFIX}.public.{table}")
}

fn debezium() -> Format {
    Format::Debezium {
        server_name: PREFIX.into(),
        database: "postgres".into(),
        decimal: DecimalMode::Precise,
        tombstones: false,
        transaction_metadata: true,
        json_schemas: false,
    }
}

/// (topic, key, value without the top-level `ts_ms`, which is the time of
/// writing).
type Change = (String, Option<Value>, Value);

fn comparable(topic: &str, key: Option<&[u8]>, value: &[u8]) -> Change {
    let mut v: Value = serde_json::from_slice(value).unwrap();
    v.as_object_mut().unwrap().remove("ts_ms");
    (
        topic.to_owned(),
        key.map(|k| serde_json::from_slice(k).unwrap()),
        v,
    )
}

/// The same changes, read once through the slot `ref` without faults and
/// encoded as the sink does (FULL tables keyed by their primary key).
fn reference(c: &Cluster, end: Lsn) -> Vec<Change> {
    block_on(async {
        let mut catalog = ReplicationClient::connect_sql(&config(c, "postgres"))
            .await
            .unwrap();
        let mut keys = KeyColumns::new();
        // Status updates every second: a test's wal_sender_timeout may be
        // 10 s, the default interval, and CI once saw this stream's
        // transactions twice and thrice, after reconnects (below).
        let cfg = StreamConfig::new("ref", ["p"])
            .stop_lsn(end)
            .status_interval(Duration::from_secs(1));
        let mut s = LogicalStream::start(config(c, "postgres"), cfg)
            .await
            .unwrap();
        let routing = Routing::new(PREFIX, "{prefix}.{schema}.{table}").unwrap();
        let format = debezium();
        let mut tx = None;
        let mut order = TxOrder::new();
        let mut out = Vec::new();
        while let Some(e) = tokio::time::timeout(Duration::from_secs(60), s.next())
            .await
            .unwrap()
        {
            let e = e.unwrap();
            if let Event::Reconnected { restart_lsn } = &e {
                // transactions committing from there on come again
                eprintln!("NOTICE: the reference stream reconnected; it restarts at {restart_lsn}");
                out.retain(|(commit, _)| commit < restart_lsn);
                tx = None;
                continue;
            }
            if let Event::Relation(rel) = &e {
                if keys.needs_lookup(rel) {
                    let rows = catalog
                        .simple_query(&primary_key_query(rel.oid))
                        .await
                        .unwrap();
                    let columns = rows
                        .iter()
                        .map(|r| r.get("attname").unwrap().to_owned())
                        .collect();
                    keys.set_primary_key(rel, columns);
                }
            }
            if let Event::Begin(b) = &e {
                tx = Some(TxInfo::new(b.xid, b.final_lsn, b.commit_time));
                order = TxOrder::new();
            }
            if let Some(tx) = &tx {
                for r in encode(
                    &format,
                    &routing,
                    &keys,
                    tx,
                    &mut order,
                    &e,
                    pgwal::protocol::PgTimestamp::now(),
                )
                .unwrap()
                {
                    out.push((
                        tx.commit_lsn,
                        comparable(&r.topic, r.key.as_deref(), r.value.as_deref().unwrap()),
                    ));
                }
            }
        }
        out.into_iter().map(|(_, change)| change).collect()
    })
}

/// Applies Debezium records in order to empty tables: table → id → row.
fn apply(records: &[Consumed]) -> BTreeMap<String, BTreeMap<String, Value>> {
    let mut db: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for r in records {
        let table = r.topic.rsplit('.').next().unwrap().to_owned();
        let t = db.entry(table).or_default();
        let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let id = |row: &Value| row["id"].to_string();
        match v["op"].as_str().unwrap() {
            "c" => {
                let prev = t.insert(id(&v["after"]), v["after"].clone());
                assert!(prev.is_none(), "a create of an existing row: {v}");
            }
            "u" => {
                let prev = t.insert(id(&v["after"]), v["after"].clone());
                assert!(prev.is_some(), "an update of a missing row: {v}");
            }
            "d" => {
                assert!(
                    t.remove(&id(&v["before"])).is_some(),
                    "a delete of a missing row: {v}"
                );
            }
            "t" => t.clear(),
            op => panic!("unknown op {op}"),
        }
    }
    db
}

fn source(c: &Cluster) -> BTreeMap<String, BTreeMap<String, Value>> {
    TABLES
        .iter()
        .map(|t| {
            let rows: Vec<Value> = serde_json::from_str(&c.query(&format!(
                "SELECT coalesce(json_agg(row_to_json(t)), '[]') FROM {t} t"
            )))
            .unwrap();
            let rows = rows
                .into_iter()
                .map(|r| (r["id"].to_string(), r))
                .collect::<BTreeMap<_, _>>();
            (t.to_string(), rows)
        })
        .filter(|(_, rows)| !rows.is_empty())
        .collect()
}

/// Rows that differ between the copy and the source (at most 5 per table).
fn differences(
    copy: &BTreeMap<String, BTreeMap<String, Value>>,
    src: &BTreeMap<String, BTreeMap<String, Value>>,
) -> Vec<String> {
    let mut out = Vec::new();
    let empty = BTreeMap::new();
    for t in TABLES {
        let (a, b) = (copy.get(t).unwrap_or(&empty), src.get(t).unwrap_or(&empty));
        let mut d: Vec<String> = Vec::new();
        for (id, row) in a {
            match b.get(id) {
                None => d.push(format!("{t} {id}: in the copy only: {row}")),
                Some(r) if r != row => d.push(format!("{t} {id}: copy {row}, source {r}")),
                _ => {}
            }
        }
        for (id, row) in b {
            if !a.contains_key(id) {
                d.push(format!("{t} {id}: in the source only: {row}"));
            }
        }
        if !d.is_empty() {
            out.push(format!("{t}: {} rows differ", d.len()));
            out.extend(d.into_iter().take(5));
        }
    }
    out
}

fn count_in(log: &str, what: &str) -> u64 {
    log.lines()
        .filter_map(|l| {
            l.split([',', ';'])
                .map(str::trim)
                .find(|p| p.ends_with(what))
        })
        .filter_map(|p| p.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The exactly-once test; `secure`: pgwal reaches the broker over TLS with
/// SCRAM-SHA-512 and zstd compression (the test's readers stay on the
/// plaintext listener).
fn exactly_once(label: &'static str, bin: &Path, rounds: usize, secure: bool) {
    let _one = one_broker();
    // where the time goes (shown with --nocapture or when the test fails)
    let t = Instant::now();
    let phase = |what: &str| eprintln!("{label}: {:6.1} s {what}", t.elapsed().as_secs_f64());
    let (b, kafka) = if secure {
        let b = Broker::start_secure(label);
        let s = b.secure.clone().unwrap();
        let mut options = s.sasl_options("SCRAM-SHA-512");
        options.push(("compression.type".into(), "zstd".into()));
        let kafka = broker::sink_args(&s.sasl_ssl, &options);
        (b, kafka)
    } else {
        let b = Broker::start(label);
        let kafka = broker::sink_args(&b.addr, &[]);
        (b, kafka)
    };
    let c = Cluster::start(
        label,
        bin,
        Options {
            conf: vec![
                "logical_decoding_work_mem = '64kB'".into(),
                // feedback only when pgwal sends it: a SIGKILLed pgwal
                // leaves the slot where it was when that pgwal started
                "wal_sender_timeout = 0".into(),
            ],
            ..Options::default()
        },
    );
    phase("broker and server started");
    // kept when the test fails
    let logs = setup_with_reference(&c, label, "sink");

    let load = Load::start(&c);
    let load_over = load.over.clone();

    // no status updates until a graceful stop: every restart after a
    // SIGKILL receives again what Kafka already holds
    // frequent heartbeats: between transactions under load they must move
    // Kafka's progress without skipping any
    let quiet = ["--status-interval", "600", "--kafka-heartbeat-secs", "0.5"];
    let mut n = 0;
    let mut sink = start_sink(&c, &kafka, &logs, n, &quiet);
    wait_progress(&b.addr, &sink, &load_over);
    phase("streaming into Kafka");
    for round in 0..rounds {
        b.crash_and_restart();
        phase("broker crashed and restarted");
        wait_progress(&b.addr, &sink, &load_over);
        phase("progress after the broker's restart");
        // the sink may be between two sessions (a Kafka error after the
        // broker's restart starts it over, stream included): wait for its
        // walsender
        let t0 = Instant::now();
        let killed = loop {
            let killed = c.query(
                "SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots \
                 WHERE slot_name = 'kslot' AND active_pid IS NOT NULL",
            );
            if killed != "0" || t0.elapsed() > Duration::from_secs(30) {
                break killed;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            killed,
            "1",
            "{label} round {round}: no walsender to terminate for 30 s; pgwal's log:\n{}",
            sink.log()
        );
        wait_progress(&b.addr, &sink, &load_over);
        phase("progress after the walsender's end");
        let behind = sink.kill_with_slot_behind(&c, &b.addr, None, &load_over);
        phase("pgwal SIGKILLed with the slot behind Kafka");
        assert!(
            behind,
            "{label} round {round}: Kafka never got ahead of the slot in 60 s"
        );
        n += 1;
        sink = start_sink(&c, &kafka, &logs, n, &quiet);
        sink.wait_streaming();
        wait_progress(&b.addr, &sink, &load_over);
        phase("progress after pgwal's restart");
    }
    let load_rounds = load.finish();
    phase("load finished");
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");
    let ahead = count_in(&log, "starts ahead of the slot");
    assert!(
        ahead > 0,
        "{label}: the pgwal started after a SIGKILL found the slot up to date with Kafka; \
         the case of a slot behind Kafka was not exercised:\n{log}"
    );
    let restarts = count_in(&log, "restarts after Kafka errors");
    let heartbeats = count_in(&log, "heartbeats");
    let end: Lsn = c.query("SELECT pg_current_wal_lsn()").parse().unwrap();
    let (ok, last_log) = start_sink(&c, &kafka, &logs, n + 1, &["--stop-lsn", &end.to_string()])
        .wait(Duration::from_secs(300));
    assert!(ok, "{label}: the catch-up run failed:\n{last_log}");
    phase("caught up");

    let (committed, uncommitted) = check_exactly_once(label, &c, &b.addr, end);
    phase("checked");
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: {load_rounds} load rounds, {} records read_committed, {} read_uncommitted \
         (aborted Kafka transactions), 0 duplicates; {rounds} × (broker crash, walsender \
         terminated, pgwal SIGKILLed); the last pgwal started ahead of the slot {ahead} times \
         and restarted {restarts} times after Kafka errors, and committed {heartbeats} heartbeats",
        committed, uncommitted
    );
}

/// SETUP, the slots `ref` (the reference stream) and `kslot` (the
/// sink's), made before any load, and an empty directory for pgwal's logs
/// named after `what`.
fn setup_with_reference(c: &Cluster, label: &str, what: &str) -> PathBuf {
    c.psql(SETUP);
    block_on(async {
        let mut rc = ReplicationClient::connect(&config(c, "postgres"))
            .await
            .unwrap();
        for slot in ["ref", "kslot"] {
            rc.create_logical_slot(slot, &CreateSlotOptions::new())
                .await
                .unwrap();
        }
    });
    fresh_log_dir(label, what)
}

/// An empty directory for pgwal's logs, named after `what` and `label`.
fn fresh_log_dir(label: &str, what: &str) -> PathBuf {
    let logs =
        std::env::temp_dir().join(format!("pgwal-kafka-{what}-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).unwrap();
    logs
}

/// The paced load (round_sql), on its own thread until `finish`.
struct Load {
    stop: Arc<AtomicBool>,
    /// Set when the load ended (stopped, or at its bound).
    over: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Load {
    /// At most 10 rounds a second, up to 2000 rounds or 10 minutes.
    fn start(c: &Cluster) -> Load {
        Load::start_paced(
            c,
            Duration::from_millis(100),
            2000,
            Duration::from_secs(600),
        )
    }

    /// A round at most every `period`, up to `rounds` rounds or `limit`.
    fn start_paced(c: &Cluster, period: Duration, rounds: u64, limit: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let over = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            let load_over = over.clone();
            let mut psql = c.psql_command();
            psql.args(["-f", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null());
            std::thread::spawn(move || {
                let mut r = 1;
                let t0 = Instant::now();
                // paced (each round about ten transactions and 500 row
                // changes) and bounded: the test ends it, or its bounds
                while !stop.load(Ordering::SeqCst) && r <= rounds && t0.elapsed() < limit {
                    let round_start = Instant::now();
                    assert!(
                        support::feed(&mut psql, &round_sql(r)).status.success(),
                        "load round {r} failed"
                    );
                    r += 1;
                    std::thread::sleep(period.saturating_sub(round_start.elapsed()));
                }
                load_over.store(true, Ordering::SeqCst);
                r - 1
            })
        };
        Load { stop, over, thread }
    }

    /// Stops the load; the number of rounds run.
    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// The verdicts on what Kafka at `addr` holds once the sink caught up to
/// `end`: no record twice for a read_committed consumer, the records those
/// of the reference stream, the copy built from them equal to the source,
/// and the slot acknowledged up to Kafka's progress. Returns the numbers of
/// records read committed and uncommitted.
fn check_exactly_once(label: &str, c: &Cluster, addr: &str, end: Lsn) -> (usize, usize) {
    let topics: Vec<String> = TABLES.iter().map(|t| topic(t)).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let committed = read_all(addr, &topics, "read_committed");
    let uncommitted = read_all(addr, &topics, "read_uncommitted");

    let mut seen: HashMap<Change, u32> = HashMap::new();
    for r in &committed {
        *seen
            .entry(comparable(
                &r.topic,
                r.key.as_deref(),
                r.value.as_deref().unwrap(),
            ))
            .or_default() += 1;
    }
    let duplicates: u32 = seen.values().map(|n| n - 1).sum();
    // docs has REPLICA IDENTITY FULL: its records are keyed by the primary
    // key, so an update of a row stays under that row's key
    for (topic, key, v) in seen
        .keys()
        .filter(|(t, _, v)| t.ends_with(".docs") && v["op"] != "t")
    {
        let row = if v["op"] == "d" {
            &v["before"]
        } else {
            &v["after"]
        };
        assert_eq!(
            key.as_ref(),
            Some(&serde_json::json!({ "id": row["id"] })),
            "{label}: {topic} record not keyed by its primary key: {v}"
        );
    }
    assert_eq!(
        duplicates, 0,
        "{label}: records seen twice by a read_committed consumer"
    );

    let mut expected: HashMap<Change, u32> = HashMap::new();
    for ch in reference(c, end) {
        *expected.entry(ch).or_default() += 1;
    }
    let missing = expected.keys().filter(|k| !seen.contains_key(*k)).count();
    let extra = seen.keys().filter(|k| !expected.contains_key(*k)).count();
    assert!(
        missing == 0 && extra == 0,
        "{label}: {missing} changes of the reference stream not in Kafka, {extra} in Kafka not in it"
    );
    assert_eq!(seen, expected);
    let diff = differences(&apply(&committed), &source(c));
    assert!(
        diff.is_empty(),
        "{label}: the copy differs from the source:\n{}",
        diff.join("\n")
    );

    let kafka = kafka_progress(addr).unwrap();
    let confirmed = kslot_position(c);
    assert!(
        confirmed >= kafka,
        "{label}: the slot ({confirmed}) was not acknowledged up to Kafka's progress ({kafka})"
    );
    (committed.len(), uncommitted.len())
}

#[test]
fn kafka_sink_exactly_once_across_crashes() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka sink test is skipped");
        return;
    }
    for (label, bin) in support::servers() {
        // one fault round on the patched 18 and one on 15 (pgoutput v3,
        // without v4's parallel streaming); not on 17, whose v4 stream is
        // 18's (the other tests run there). On 18 the sink also recovers
        // from silent peers, in kafka_sink_silent_peers.
        // 18's over TLS with SCRAM-SHA-512 (and zstd), 15's in plaintext
        let (rounds, secure) = match label {
            "pg18" => (1, true),
            "pg17" => continue,
            _ => (1, false),
        };
        exactly_once(label, &bin, rounds, secure);
    }
}

/// A cluster with SETUP and the slot `kslot` made, and an empty directory
/// for pgwal's logs (`what` names it; kept when the test fails).
fn cluster_with_kslot(label: &'static str, bin: &Path, what: &str) -> (Cluster, PathBuf) {
    cluster_with_kslot_for(label, bin, what, Options::default(), SETUP)
}

/// A cluster started with `options`, `setup` run, the slot `kslot` made,
/// and a fresh log directory.
fn cluster_with_kslot_for(
    label: &'static str,
    bin: &Path,
    what: &str,
    options: Options,
    setup: &str,
) -> (Cluster, PathBuf) {
    let c = Cluster::start(label, bin, options);
    c.psql(setup);
    block_on(async {
        let mut rc = ReplicationClient::connect(&config(&c, "postgres"))
            .await
            .unwrap();
        rc.create_logical_slot("kslot", &CreateSlotOptions::new())
            .await
            .unwrap();
    });
    let logs = fresh_log_dir(label, what);
    (c, logs)
}

/// A topic the cluster does not have and does not create on first use
/// (`auto.create.topics.enable=false`): the sink stops with exit 2 naming
/// the topic, after writing and acknowledging nothing, and once the topic
/// is created the next run writes the change exactly once. Before, the
/// commit failed without its cause and the sink started over from Kafka's
/// progress until `retry_for` ran out (exit 4), a loop under systemd.
#[test]
fn kafka_sink_stops_on_a_topic_the_cluster_does_not_create() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().find(|(l, _)| *l == "pg18") else {
        eprintln!("NOTICE: no PostgreSQL 18; skipped");
        return;
    };
    let _one = one_broker();
    let b = Broker::start_set("no-auto-create", &["auto.create.topics.enable=false"]);
    let kafka = broker::sink_args(&b.addr, &[]);
    let (c, logs) = cluster_with_kslot_for(
        label,
        &bin,
        "no-topic",
        Options::default(),
        "CREATE TABLE nt (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE nt;",
    );
    let before = c.insert_lsn();
    c.psql("INSERT INTO nt VALUES (1, 'one');");
    let t0 = Instant::now();
    let (code, log) = start_sink(&c, &kafka, &logs, 0, &[]).wait_code(Duration::from_secs(240));
    assert_eq!(
        code,
        Some(2),
        "{label}: not exit 2 on a missing topic:\n{log}"
    );
    assert!(
        log.contains("Kafka topic pgwal.public.nt cannot be written"),
        "{label}: the error does not name the topic:\n{log}"
    );
    let stopped_after = t0.elapsed();
    assert!(
        kslot_position(&c) <= before,
        "{label}: the slot moved past a change Kafka does not hold"
    );
    assert!(
        kafka_progress_value(&b.addr, &c).is_none(),
        "{label}: a progress record without the change"
    );
    b.create_topic(&topic("nt"));
    let end = c.insert_lsn();
    let (ok, log) = start_sink(&c, &kafka, &logs, 1, &["--stop-lsn", &end.to_string()])
        .wait(Duration::from_secs(120));
    assert!(
        ok,
        "{label}: the run after the topic was created failed:\n{log}"
    );
    let records = read_all(&b.addr, &[&topic("nt")], "read_committed");
    assert_eq!(records.len(), 1, "{label}: {} records", records.len());
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: stopped with exit 2 after {stopped_after:.1?}, naming the topic; \
         after it was created, 1 record, exactly once"
    );
}

/// `kslot`'s confirmed position.
fn kslot_position(c: &Cluster) -> Lsn {
    c.query("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'kslot'")
        .parse()
        .unwrap()
}

/// A publication that sees no changes while the server's WAL grows: the
/// heartbeat commits progress records for the WAL that passed, the slot
/// follows them, and a restart from them loses and repeats nothing.
#[test]
fn kafka_sink_heartbeat_lets_the_slot_move_on_a_quiet_publication() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka heartbeat test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start(label);
    let kafka = broker::sink_args(&b.addr, &[]);
    let (c, logs) = cluster_with_kslot(label, &bin, "heartbeat");
    c.psql("CREATE TABLE unpublished (id serial PRIMARY KEY, pad text)");
    let slot_position = || kslot_position(&c);

    let sink = start_sink(&c, &kafka, &logs, 0, &["--kafka-heartbeat-secs", "1"]);
    sink.wait_streaming();
    c.psql("INSERT INTO scratch VALUES (1, 1)");
    let first: Lsn = c.insert_lsn();
    // about 8 MB of WAL in 200 transactions the publication does not see,
    // over at least 4 s (bounded: one statement each)
    for i in 0..40 {
        c.psql(
            "INSERT INTO unpublished (pad) SELECT repeat('x', 2000) FROM generate_series(1, 100); \
             INSERT INTO unpublished (pad) VALUES ('a'); INSERT INTO unpublished (pad) VALUES ('b'); \
             INSERT INTO unpublished (pad) VALUES ('c'); INSERT INTO unpublished (pad) VALUES ('d');",
        );
        if i % 10 == 9 {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let quiet_end: Lsn = c.insert_lsn();
    assert!(
        quiet_end.0 - first.0 > 3 << 20,
        "the load wrote {first}..{quiet_end}"
    );
    // the slot follows Kafka's progress into the WAL the publication had nothing in
    let t0 = Instant::now();
    loop {
        let (kafka, slot) = (kafka_progress(&b.addr), slot_position());
        if slot.0 >= first.0 + (2 << 20) {
            assert!(
                kafka >= Some(slot),
                "the slot ({slot}) passed Kafka's progress ({kafka:?})"
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "after 60 s the slot is at {slot} and Kafka at {kafka:?}, the quiet WAL \
             ran from {first} to {quiet_end}; pgwal's log:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let before_second: Lsn = c.insert_lsn();
    c.psql("INSERT INTO scratch VALUES (2, 2)");
    let end: Lsn = c.insert_lsn();
    eprintln!("quiet WAL {first}..{quiet_end}, the second row's WAL {before_second}..{end}");
    let (ok, log) = sink.terminate();
    assert!(ok, "pgwal failed on SIGTERM:\n{log}");
    let heartbeats = count_in(&log, "heartbeats");
    assert!(heartbeats > 0, "no heartbeat counted:\n{log}");
    // a restart from Kafka's progress: the second row once, the first not again
    let (ok, log2) = start_sink(&c, &kafka, &logs, 1, &["--stop-lsn", &end.to_string()])
        .wait(Duration::from_secs(120));
    assert!(ok, "the restart failed:\n{log2}");
    let scratch = read_all(&b.addr, &[&topic("scratch")], "read_committed");
    let ids: Vec<i64> = scratch
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            v["after"]["id"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(
        ids,
        [1, 2],
        "scratch in Kafka; pgwal's logs:\n{log}\n{log2}"
    );
    assert!(slot_position() >= end.min(kafka_progress(&b.addr).unwrap()));
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: {heartbeats} heartbeats moved the slot through {} MB of WAL the publication \
         did not see; the restart wrote the next row once",
        (quiet_end.0 - first.0) >> 20
    );
}

/// A slot that is itself two-phase decodes prepared transactions at
/// PREPARE whatever the stream asks for (PostgreSQL's
/// `CreateDecodingContext`). The sink once dropped such a transaction's
/// changes silently and acknowledged past it: with one row, a prepared and
/// committed transaction of 50 rows and one more row, Kafka held 2 records
/// and the slot had moved past all 52. It must refuse the slot at the start
/// (exit 3), before anything is written or acknowledged.
#[test]
fn kafka_sink_refuses_a_two_phase_slot() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka two-phase slot test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start(label);
    let kafka = broker::sink_args(&b.addr, &[]);
    let c = Cluster::start(
        label,
        &bin,
        Options {
            conf: vec!["max_prepared_transactions = 2".into()],
            ..Options::default()
        },
    );
    if c.major < 14 {
        eprintln!("NOTICE: {label} has no two-phase slots; the test is skipped");
        return;
    }
    c.psql(SETUP);
    block_on(async {
        let mut rc = ReplicationClient::connect(&config(&c, "postgres"))
            .await
            .unwrap();
        rc.create_logical_slot("kslot", &CreateSlotOptions::new().two_phase(true))
            .await
            .unwrap();
    });
    let logs = fresh_log_dir(label, "two-phase-slot");
    let before = kslot_position(&c);
    c.psql("INSERT INTO scratch VALUES (1, 1)");
    c.psql(
        "BEGIN; INSERT INTO scratch SELECT g, g FROM generate_series(100, 149) g; \
         PREPARE TRANSACTION 'fifty'",
    );
    c.psql("COMMIT PREPARED 'fifty'");
    c.psql("INSERT INTO scratch VALUES (2, 2)");
    let end: Lsn = c.insert_lsn();
    let (code, log) = start_sink(&c, &kafka, &logs, 0, &["--stop-lsn", &end.to_string()])
        .wait_code(Duration::from_secs(120));
    assert_eq!(
        code,
        Some(3),
        "pgwal did not refuse the two-phase slot:\n{log}"
    );
    assert!(
        log.contains("decodes prepared transactions at PREPARE"),
        "the refusal does not say why:\n{log}"
    );
    let scratch = read_all(&b.addr, &[&topic("scratch")], "read_committed");
    assert!(
        scratch.is_empty(),
        "Kafka holds {} records:\n{log}",
        scratch.len()
    );
    assert_eq!(kslot_position(&c), before, "the slot moved:\n{log}");
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!("{label}: the two-phase slot was refused, nothing written or acknowledged");
}

/// A progress record of this stream that is not a position (written by
/// hand, or by another program on the same key) cannot be read by any
/// retry: the sink must stop at once with a permanent error (exit 3) that
/// names the topic, key and offset, writing and acknowledging nothing. It
/// used to retry the read until `--kafka-retry-secs` ran out.
#[test]
fn kafka_sink_stops_on_a_progress_record_that_is_not_a_position() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka bad progress test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start(label);
    let kafka = broker::sink_args(&b.addr, &[]);
    let (c, logs) = cluster_with_kslot(label, &bin, "bad-progress");
    let sysid = c.query("SELECT system_identifier FROM pg_control_system()");
    let key = pgwal_kafka::progress::key(sysid.trim(), "kslot");
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &b.addr)
        .create()
        .unwrap();
    p.send(BaseRecord::to(PROGRESS).key(&key).payload("not a position"))
        .map_err(|(e, _)| e)
        .unwrap();
    p.flush(Duration::from_secs(30)).unwrap();
    c.psql("INSERT INTO scratch VALUES (1, 1)");
    let before = kslot_position(&c);
    let t0 = Instant::now();
    let (code, log) = start_sink(&c, &kafka, &logs, 0, &[]).wait_code(Duration::from_secs(120));
    assert_eq!(
        code,
        Some(3),
        "pgwal did not stop on the bad record:\n{log}"
    );
    assert!(
        log.contains("is not a position") && log.contains(&key),
        "the error does not say why:\n{log}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "it took {:?}",
        t0.elapsed()
    );
    let scratch = read_all(&b.addr, &[&topic("scratch")], "read_committed");
    assert!(
        scratch.is_empty(),
        "Kafka holds {} records:\n{log}",
        scratch.len()
    );
    assert_eq!(kslot_position(&c), before, "the slot moved:\n{log}");
    let _ = std::fs::remove_dir_all(&logs);
}

/// Kafka options that librdkafka refuses together (here a socket timeout
/// above the transaction timeout) are a configuration error: pgwal exits 2
/// at once, naming librdkafka's reason, where it used to retry the client's
/// creation until `--kafka-retry-secs` ran out. No broker is needed: the
/// client is refused before it connects.
#[test]
fn kafka_sink_refuses_contradicting_kafka_options() {
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let (c, logs) = cluster_with_kslot(label, &bin, "kafka-options");
    let kafka = broker::sink_args(
        "127.0.0.1:1",
        &[
            ("transaction.timeout.ms".to_owned(), "5000".to_owned()),
            ("socket.timeout.ms".to_owned(), "60000".to_owned()),
        ],
    );
    let t0 = Instant::now();
    let (code, log) = start_sink(&c, &kafka, &logs, 0, &[]).wait_code(Duration::from_secs(60));
    assert_eq!(code, Some(2), "pgwal did not refuse the options:\n{log}");
    assert!(
        log.contains("refused its configuration") && log.contains("socket.timeout.ms"),
        "the error does not say why:\n{log}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "it took {:?}",
        t0.elapsed()
    );
    let _ = std::fs::remove_dir_all(&logs);
}

/// A PostgreSQL transaction is never split over Kafka transactions, so one
/// that takes longer to write than `transaction.timeout.ms` cannot commit:
/// the broker aborts it, and the sink used to write it again and again
/// while the slot held its WAL. With the timeout at 5 s and a transaction
/// of 400,000 rows, the sink must stop with a permanent error (exit 5) that
/// says so, after the row before it is in Kafka, and leave the slot before
/// the big transaction.
#[test]
fn kafka_sink_stops_on_a_transaction_longer_than_the_kafka_timeout() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka transaction timeout test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start(label);
    // librdkafka wants socket.timeout.ms at most transaction.timeout.ms + 100
    let kafka = broker::sink_args(
        &b.addr,
        &[
            ("transaction.timeout.ms".to_owned(), "5000".to_owned()),
            ("socket.timeout.ms".to_owned(), "5000".to_owned()),
        ],
    );
    let (c, logs) = cluster_with_kslot(label, &bin, "transaction-timeout");
    c.psql("INSERT INTO scratch VALUES (1, 1)");
    let before_big: Lsn = c.insert_lsn();
    c.psql("INSERT INTO bulk SELECT g, 1 FROM generate_series(1, 400000) g");
    let end: Lsn = c.insert_lsn();
    let t0 = Instant::now();
    let (code, log) = start_sink(&c, &kafka, &logs, 0, &["--stop-lsn", &end.to_string()])
        .wait_code(Duration::from_secs(300));
    assert_eq!(
        code,
        Some(5),
        "pgwal did not stop on the transaction too long for Kafka:\n{log}"
    );
    assert!(
        log.contains("past 80% of transaction.timeout.ms"),
        "the error does not say why:\n{log}"
    );
    let scratch = read_all(&b.addr, &[&topic("scratch")], "read_committed");
    assert_eq!(
        scratch.len(),
        1,
        "the row before it is not in Kafka once:\n{log}"
    );
    let bulk = read_all(&b.addr, &[&topic("bulk")], "read_committed");
    assert!(
        bulk.is_empty(),
        "Kafka holds {} of its rows:\n{log}",
        bulk.len()
    );
    // the slot may pass the transaction's first records (a transaction
    // that commits later is decoded again), never its commit
    let slot = kslot_position(&c);
    assert!(
        slot < end,
        "the slot ({slot}) moved past the big transaction's commit (before {end}):\n{log}"
    );
    assert!(
        kafka_progress(&b.addr).is_some_and(|p| p >= before_big && p < end),
        "Kafka's progress is not the first row's:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: stopped after {:.1} s with the transaction too long for Kafka's 5 s",
        t0.elapsed().as_secs_f64()
    );
}

/// pgwal reaches the broker over TLS (a client certificate), SASL_SSL with
/// SCRAM-SHA-256, SCRAM-SHA-512, PLAIN and OAUTHBEARER (librdkafka's
/// unsecured JWT), with zstd and lz4 compression; each run writes the next
/// row once. Then the refusals: a CA that did not sign the broker's
/// certificate, a wrong password, no client certificate where one is
/// required, a plaintext client at the TLS port. Each ends pgwal with an
/// error that names the cause, and neither Kafka nor the slot moves.
#[test]
fn kafka_sink_secure_listeners_and_their_refusals() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka TLS/SASL test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start_secure(&format!("{label}-secure"));
    let s = b.secure.clone().unwrap();
    let (c, logs) = cluster_with_kslot(label, &bin, "secure");
    let slot_position = || kslot_position(&c);
    let with = |mut o: Vec<(String, String)>, k: &str, v: &str| {
        o.push((k.to_owned(), v.to_owned()));
        o
    };
    let accepted: Vec<(&str, Vec<String>)> = vec![
        (
            "SSL with a client certificate, lz4",
            broker::sink_args(&s.ssl, &with(s.ssl_options(), "compression.type", "lz4")),
        ),
        (
            "SASL_SSL SCRAM-SHA-256",
            broker::sink_args(&s.sasl_ssl, &s.sasl_options("SCRAM-SHA-256")),
        ),
        (
            "SASL_SSL SCRAM-SHA-512, zstd",
            broker::sink_args(
                &s.sasl_ssl,
                &with(s.sasl_options("SCRAM-SHA-512"), "compression.type", "zstd"),
            ),
        ),
        (
            "SASL_SSL PLAIN",
            broker::sink_args(&s.sasl_ssl, &s.sasl_options("PLAIN")),
        ),
        (
            "SASL_SSL OAUTHBEARER (unsecured JWT)",
            broker::sink_args(&s.sasl_ssl, &s.sasl_options("OAUTHBEARER")),
        ),
    ];
    let mut n = 0;
    for (i, (what, kafka)) in accepted.iter().enumerate() {
        c.psql(&format!("INSERT INTO scratch VALUES ({i}, {i})"));
        let end: Lsn = c.insert_lsn();
        let (ok, log) = start_sink(&c, kafka, &logs, n, &["--stop-lsn", &end.to_string()])
            .wait(Duration::from_secs(120));
        n += 1;
        assert!(ok, "{what}: pgwal failed:\n{log}");
        // a topic the broker just created may be missing from a new
        // reader's first metadata: read until the row is there, or 30 s
        let t0 = Instant::now();
        let ids = loop {
            let ids: Vec<i64> = read_all(&b.addr, &[&topic("scratch")], "read_committed")
                .iter()
                .map(|r| {
                    let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
                    v["after"]["id"].as_i64().unwrap()
                })
                .collect();
            if ids.len() > i || t0.elapsed() > Duration::from_secs(30) {
                break ids;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        assert_eq!(
            ids,
            (0..=i as i64).collect::<Vec<_>>(),
            "{what}: scratch in Kafka; pgwal's log:\n{log}"
        );
    }

    // the refusals: one more row waits, and stays unwritten
    c.psql("INSERT INTO scratch VALUES (100, 100)");
    let end: Lsn = c.insert_lsn();
    let (kafka_before, slot_before) = (kafka_progress(&b.addr), slot_position());
    let wrong_password: Vec<(String, String)> = s
        .sasl_options("SCRAM-SHA-512")
        .into_iter()
        .map(|(k, v)| {
            let v = if k == "sasl.password" {
                "not-the-password".into()
            } else {
                v
            };
            (k, v)
        })
        .collect();
    // (what, pgwal's arguments, the cause its error must name, its exit
    // status: 2 configuration, 4 retries exhausted)
    let refused: Vec<(&str, Vec<String>, &str, i32)> = vec![
        (
            "a CA that did not sign the broker's certificate",
            broker::sink_args(
                &s.sasl_ssl,
                &with(
                    s.sasl_options("SCRAM-SHA-512"),
                    "ssl.ca.location",
                    &s.other_ca,
                ),
            ),
            "certificate verify failed",
            2,
        ),
        (
            "a wrong password",
            broker::sink_args(&s.sasl_ssl, &wrong_password),
            "SCRAM-SHA-512",
            2,
        ),
        (
            "no client certificate at a listener that requires one",
            broker::sink_args(
                &s.ssl,
                &[
                    ("security.protocol".to_owned(), "SSL".to_owned()),
                    ("ssl.ca.location".to_owned(), s.ca.clone()),
                ],
            ),
            "alert bad certificate",
            2,
        ),
        (
            "a plaintext client at the TLS port",
            broker::sink_args(&s.sasl_ssl, &[]),
            "none ever was: check --kafka-brokers and that security.protocol matches",
            4,
        ),
    ];
    for (what, kafka, cause, status) in &refused {
        let t0 = Instant::now();
        let mut extra = vec!["--stop-lsn", &end.to_string()]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        // a refusal is not retried; other failures are, for this long
        // (librdkafka's request for the broker's API versions times out
        // after 10 s: a plaintext client at a TLS port waits that long)
        extra.extend(["--kafka-retry-secs", "0", "--kafka-timeout-secs", "11"].map(str::to_owned));
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let (code, log) =
            start_sink(&c, kafka, &logs, n, &extra).wait_code(Duration::from_secs(60));
        n += 1;
        assert_eq!(code, Some(*status), "{what}: pgwal's exit status:\n{log}");
        assert!(
            log.contains(cause),
            "{what}: pgwal's error does not name the cause ({cause:?}):\n{log}"
        );
        assert_eq!(
            (kafka_progress(&b.addr), slot_position()),
            (kafka_before, slot_before),
            "{what}: Kafka or the slot moved"
        );
        eprintln!(
            "{what}: refused in {:.1} s: {}",
            t0.elapsed().as_secs_f64(),
            log.lines()
                .rev()
                .find(|l| l.contains("error"))
                .unwrap_or_default()
        );
    }
    let _ = std::fs::remove_dir_all(&logs);
}

/// `GET path` from the HTTP server at `addr`: the status code and body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

/// The value of the sample `name` (with its labels, if any) in an
/// OpenMetrics text.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{metrics}"))
}

/// How long the silent-peer test waits for the sink to notice a silent
/// peer before it calls that a hang.
const NOTICE_LIMIT: Duration = Duration::from_secs(120);

/// Waits up to `limit` for `what` to appear in the sink's log after its
/// `before` first bytes; how long it took.
fn wait_for_log(sink: &Sink, before: usize, what: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let log = sink.log();
        if log.get(before..).is_some_and(|l| l.contains(what)) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "pgwal's log did not say {what:?} within {limit:?}:\n{}",
            log.get(before..).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Silent peers: PostgreSQL, then the broker, vanish without a reset (the
/// link to each is cut: packets are dropped, nothing answers), while the
/// load runs on. pgwal must notice each within its bound (the replication
/// connection's receive timeout; the Kafka call timeout), reconnect once
/// the link heals, and Kafka must end up with every change exactly once.
#[test]
fn kafka_sink_silent_peers() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka silent-peer test is skipped");
        return;
    }
    if !support::is_root() {
        eprintln!("NOTICE: not root, no network namespaces; the Kafka silent-peer test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let net = SilentNet::new("silent", 2);
    let (to_pg, to_kafka) = (0, 1);
    let pg_addr = net.links[to_pg].host_addr.clone();
    let from = net.links[to_pg].ns_addr.clone();
    let b = Broker::start_on(label, &net.links[to_kafka].host_addr);
    let kafka = broker::sink_args(&b.addr, &[]);
    let c = Cluster::start(
        label,
        &bin,
        Options {
            conf: vec![
                format!("listen_addresses = '127.0.0.1,{pg_addr}'"),
                "logical_decoding_work_mem = '64kB'".into(),
                // the walsender of a vanished pgwal holds the slot until
                // it notices; PostgreSQL's default is 60 s
                "wal_sender_timeout = '10s'".into(),
            ],
            hba: vec![
                format!("host all all {from}/32 trust"),
                format!("host replication all {from}/32 trust"),
            ],
            ..Options::default()
        },
    );
    let logs = setup_with_reference(&c, label, "silent");

    let load = Load::start(&c);
    let receive_timeout = 4.0;
    let kafka_timeout = 10.0;
    let args = [
        "--receive-timeout",
        "4",
        "--kafka-timeout-secs",
        "10",
        "--kafka-heartbeat-secs",
        "0.5",
        "--metrics",
        "0.0.0.0:0",
    ];
    let conninfo = format!(
        "host={pg_addr} port={} user=postgres dbname=postgres connect_timeout=3 \
         keepalives_idle=5 keepalives_interval=1 keepalives_count=3",
        c.port
    );
    let sink = start_sink_in(Some(&net), &conninfo, &kafka, &logs, 0, &args);
    sink.wait_streaming();
    wait_progress(&b.addr, &sink, &load.over);
    // the metrics, reached over PostgreSQL's link while the broker's is cut
    let port = sink
        .log()
        .lines()
        .find_map(|l| l.strip_prefix("pgwal: metrics at http://0.0.0.0:"))
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in\n{}", sink.log()))
        .to_owned();
    let metrics_at = format!("{from}:{port}");
    assert_eq!(
        http_get(&metrics_at, "/readyz").0,
        200,
        "{label}: not ready while streaming"
    );

    // PostgreSQL falls silent: the receive timeout ends the session
    let before = sink.log().len();
    net.cut(to_pg);
    // the bounds catch a sink that never notices; how long it took is
    // reported, not asserted: received WAL still buffered when the link
    // went silent is consumed first, and on a loaded machine (CI once
    // took more than 16 s) that takes a while
    let noticed_pg = wait_for_log(&sink, before, "(receive timeout)", NOTICE_LIMIT);
    std::thread::sleep(Duration::from_secs(8));
    net.heal(to_pg);
    let healed = Instant::now();
    wait_progress(&b.addr, &sink, &load.over);
    let resumed_pg = healed.elapsed();

    // the broker falls silent: a Kafka call times out, the sink starts over
    let before = sink.log().len();
    net.cut(to_kafka);
    let noticed_kafka = wait_for_log(&sink, before, "Kafka failed; starting over", NOTICE_LIMIT);
    // starting over, the sink does not stream: a supervisor's readiness
    // probe says so
    // and the lag, computed when scraped, grows while nothing reaches
    // Kafka (it used to keep the last commit's value: an alert on it
    // would never fire)
    let t0 = Instant::now();
    let mut unready = false;
    let mut lags = Vec::new();
    while t0.elapsed() < Duration::from_secs(5) {
        let (code, _) = http_get(&metrics_at, "/readyz");
        unready |= code == 503;
        let (_, m) = http_get(&metrics_at, "/metrics");
        lags.push((t0.elapsed(), sample(&m, "pgwal_lag_seconds")));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        unready,
        "{label}: /readyz said ready all through the broker's silence"
    );
    let (first, last) = (lags[0], lags[lags.len() - 1]);
    assert!(
        last.1 - first.1 >= (last.0 - first.0).as_secs_f64() * 0.9,
        "{label}: pgwal_lag_seconds did not grow with the broker's silence: {lags:?}"
    );
    net.heal(to_kafka);
    let healed = Instant::now();
    wait_progress(&b.addr, &sink, &load.over);
    let resumed_kafka = healed.elapsed();

    assert_eq!(http_get(&metrics_at, "/livez").0, 200, "{label}: /livez");
    // ready again once streaming resumed (it may start over once more
    // after the heal; a supervisor's probe retries)
    let t0 = Instant::now();
    while http_get(&metrics_at, "/readyz").0 != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: /readyz not 200 within 60 s of the heal:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, m) = http_get(&metrics_at, "/metrics");
    assert_eq!(code, 200, "{label}: /metrics");
    assert_eq!(sample(&m, "pgwal_kafka_streaming"), 1.0, "{label}");
    assert!(sample(&m, "pgwal_reconnects_total") >= 1.0, "{label}: {m}");
    assert!(
        sample(&m, "pgwal_kafka_restarts_total") >= 1.0,
        "{label}: {m}"
    );
    assert!(
        sample(&m, "pgwal_kafka_commits_total") >= 1.0,
        "{label}: {m}"
    );
    assert!(
        sample(&m, "pgwal_kafka_commit_seconds_total") > 0.0,
        "{label}: {m}"
    );
    assert!(
        sample(
            &m,
            "pgwal_kafka_records_total{topic=\"pgwal.public.items\"}"
        ) > 0.0,
        "{label}: {m}"
    );
    assert!(sample(&m, "pgwal_kafka_position_lsn") > 0.0, "{label}: {m}");
    let load_rounds = load.finish();
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");
    for l in log.lines().filter(|l| l.contains(" WARN ")) {
        eprintln!("{label}: pgwal: {l}");
    }
    let end: Lsn = c.query("SELECT pg_current_wal_lsn()").parse().unwrap();
    let (ok, last_log) = start_sink(&c, &kafka, &logs, 1, &["--stop-lsn", &end.to_string()])
        .wait(Duration::from_secs(300));
    assert!(ok, "{label}: the catch-up run failed:\n{last_log}");
    let (committed, _) = check_exactly_once(label, &c, &b.addr, end);
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: {load_rounds} load rounds, {committed} records, 0 duplicates; PostgreSQL's link \
         cut: noticed after {noticed_pg:.1?} (receive timeout {receive_timeout} s), streaming \
         {resumed_pg:.1?} after the link healed; the broker's link cut: noticed after \
         {noticed_kafka:.1?} (Kafka timeout {kafka_timeout} s), streaming {resumed_kafka:.1?} \
         after it healed"
    );
}

/// Changes that cannot be written, under each `--kafka-bad-records`
/// policy: an update that leaves a TOAST value unchanged under `REPLICA
/// IDENTITY DEFAULT` (the server does not send it), and a record larger
/// than `--kafka-max-record-bytes`. A bad change in a rolled-back
/// subtransaction of a streamed transaction fails nothing.
#[test]
fn kafka_sink_bad_records_by_policy() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka bad-record test is skipped");
        return;
    }
    let _one = one_broker();
    let b = Broker::start("badrec");
    for (label, bin) in support::servers() {
        bad_records(label, &bin, &b);
    }
}

fn bad_records(label: &'static str, bin: &Path, b: &Broker) {
    let c = Cluster::start(
        label,
        bin,
        Options {
            conf: vec!["logical_decoding_work_mem = '64kB'".into()],
            ..Options::default()
        },
    );
    c.psql(
        "CREATE TABLE doc (id int PRIMARY KEY, n int, body text);
         ALTER TABLE doc ALTER COLUMN body SET STORAGE EXTERNAL;
         CREATE TABLE big (id int PRIMARY KEY, payload text);
         CREATE PUBLICATION p FOR TABLE doc, big;",
    );
    let policies = ["fail", "skip", "dead-letter"];
    block_on(async {
        let mut rc = ReplicationClient::connect(&config(&c, "postgres"))
            .await
            .unwrap();
        for p in policies {
            rc.create_logical_slot(
                &format!("bad_{}", p.replace('-', "_")),
                &CreateSlotOptions::new(),
            )
            .await
            .unwrap();
        }
    });
    let xid_of = |sql: &str| -> String {
        c.query(&format!("BEGIN; {sql} SELECT txid_current(); COMMIT;"))
            .lines()
            .find(|l| l.trim().parse::<u64>().is_ok())
            .unwrap()
            .trim()
            .to_owned()
    };
    // A: fine; E: streamed, its bad change rolled back; B: a bad update
    // beside a good insert; C: a record too large; D: fine
    c.psql("INSERT INTO doc VALUES (1, 0, repeat('x', 5000));");
    c.psql(
        "BEGIN;
         INSERT INTO big SELECT g, 'streamed' FROM generate_series(100, 2000) g;
         SAVEPOINT s;
         UPDATE doc SET n = 100 WHERE id = 1;
         ROLLBACK TO s;
         INSERT INTO big VALUES (4, 'e');
         COMMIT;",
    );
    let bad_xid =
        xid_of("UPDATE doc SET n = 1 WHERE id = 1; INSERT INTO big VALUES (1, 'beside');");
    // where B's commit record ends: a slot confirmed up to there would not
    // give B again (a heartbeat may confirm a position inside B)
    let after_b: Lsn = c.insert_lsn();
    c.psql("INSERT INTO big VALUES (2, repeat('y', 300000));");
    c.psql("INSERT INTO big VALUES (3, 'after');");
    let end: Lsn = c.insert_lsn();

    let logs = std::env::temp_dir().join(format!("pgwal-kafka-bad-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).unwrap();
    let run = |policy: &str| -> (Option<i32>, String) {
        let slot = format!("bad_{}", policy.replace('-', "_"));
        let prefix = format!("{label}-{slot}");
        let log = logs.join(format!("{policy}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgwal"));
        cmd.arg("-d")
            .arg(format!("{} sslmode=disable", c.conninfo("postgres")))
            .args([
                "stream",
                "-S",
                &slot,
                "-P",
                "p",
                "--streaming",
                "on",
                "--sink",
                "kafka",
            ])
            .args([
                "--kafka-topic-prefix",
                &prefix,
                "--kafka-bad-records",
                policy,
            ])
            .args([
                "--kafka-max-record-bytes",
                "100000",
                "--stop-lsn",
                &end.to_string(),
            ])
            .args(["--kafka-memory-mib", "0", "--kafka-spill-dir"])
            .arg(&logs)
            .args(broker::sink_args(&b.addr, &[]))
            .env("PGWAL_LOG", "pgwal_kafka=warn")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        Sink {
            child: cmd.spawn().unwrap(),
            log,
        }
        .wait_code(Duration::from_secs(120))
    };
    let ids = |prefix: &str| -> Vec<i64> {
        let mut v: Vec<i64> = read_all(
            &b.addr,
            &[&format!("{prefix}.public.big")],
            "read_committed",
        )
        .iter()
        .filter_map(|r| {
            let v: Value = serde_json::from_slice(r.value.as_deref()?).ok()?;
            v["after"]["id"].as_i64()
        })
        .collect();
        v.sort();
        v
    };
    let streamed: Vec<i64> = (100..=2000).collect();

    // fail: the error names the table, the position and the ways out;
    // nothing of B or after it is written or acknowledged
    let (code, log) = run("fail");
    assert_eq!(code, Some(5), "{label}: fail: {log}");
    assert!(
        log.contains("public.doc: the change at")
            && log.contains("unchanged TOAST")
            && log.contains("--kafka-bad-records skip or dead-letter"),
        "{label}: fail: {log}"
    );
    // the Kafka transaction open at the failure is aborted: it may have
    // held E too, which comes again at the next start
    let written = ids(&format!("{label}-bad_fail"));
    assert!(
        written.iter().all(|i| *i == 4 || streamed.contains(i)),
        "{label}: fail: Kafka holds records of the bad transaction or after it"
    );
    assert!(
        c.confirmed_flush("bad_fail") < after_b,
        "{label}: fail: the slot passed the bad transaction: confirmed {}, its commit ends at \
         {after_b}",
        c.confirmed_flush("bad_fail")
    );

    // skip: B's update and C left out, the rest written
    let (code, log) = run("skip");
    assert_eq!(code, Some(0), "{label}: skip: {log}");
    assert_eq!(
        log.matches("change skipped").count(),
        2,
        "{label}: skip: {log}"
    );
    assert!(
        log.contains("2 bad changes skipped"),
        "{label}: skip: {log}"
    );
    let mut want = vec![1, 3, 4];
    want.extend(&streamed);
    want.sort();
    assert_eq!(
        ids(&format!("{label}-bad_skip")),
        want,
        "{label}: skip: big"
    );

    // dead-letter: the two in the dead-letter topic, B's beside B's insert
    let (code, log) = run("dead-letter");
    assert_eq!(code, Some(0), "{label}: dead-letter: {log}");
    let prefix = format!("{label}-bad_dead_letter");
    let mut want = vec![1, 3, 4];
    want.extend(&streamed);
    want.sort();
    assert_eq!(ids(&prefix), want, "{label}: dead-letter: big");
    let dead: Vec<Value> = read_all(
        &b.addr,
        &[&format!("{prefix}.dead-letter")],
        "read_committed",
    )
    .iter()
    .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
    .collect();
    assert_eq!(dead.len(), 2, "{label}: dead letters {dead:?}");
    let (toast, large) = (&dead[0], &dead[1]);
    assert_eq!(toast["table"], "public.doc", "{label}");
    assert_eq!(toast["op"], "update");
    assert_eq!(toast["xid"].to_string(), bad_xid, "{label}");
    assert_eq!(
        toast["unchanged_toast"],
        serde_json::json!(["body"]),
        "{label}"
    );
    assert_eq!(
        toast["new"],
        serde_json::json!({"id": "1", "n": "1"}),
        "{label}"
    );
    assert!(toast["reason"]
        .as_str()
        .unwrap()
        .contains("unchanged TOAST"));
    // the insert beside it is of the same PostgreSQL transaction, so of the
    // same Kafka transaction
    let beside = read_all(
        &b.addr,
        &[&format!("{prefix}.public.big")],
        "read_committed",
    )
    .into_iter()
    .map(|r| serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap())
    .find(|v| v["after"]["id"] == 1)
    .unwrap();
    assert_eq!(beside["source"]["txId"].to_string(), bad_xid, "{label}");
    assert_eq!(
        toast["commit_lsn"]
            .as_str()
            .unwrap()
            .parse::<Lsn>()
            .unwrap()
            .0
            .to_string(),
        // source.sequence: ["<commit LSN>","<change LSN>"]
        beside["source"]["sequence"]
            .as_str()
            .unwrap()
            .split('"')
            .nth(1)
            .unwrap(),
        "{label}"
    );
    assert!(
        beside["transaction"].is_null(),
        "{label}: a transaction block by default"
    );
    assert_eq!(large["table"], "public.big");
    assert_eq!(large["op"], "insert");
    assert!(
        large.get("new").is_none(),
        "{label}: a record too large keeps no row"
    );
    assert!(
        large["reason"]
            .as_str()
            .unwrap()
            .contains("larger than the limit of 100000 bytes"),
        "{label}: {large}"
    );
    assert!(
        log.contains("2 dead-lettered"),
        "{label}: dead-letter: {log}"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!("{label}: bad records: fail stopped with exit 5 before the bad transaction; skip and dead-letter wrote the rest");
}

/// `--kafka-json-schemas`: each key and value with its Kafka Connect
/// schema, through the sink (a streamed transaction goes through the spill
/// file and is stamped at its commit). The table changes shape outside and
/// inside a streamed transaction: ADD COLUMN, ALTER TYPE, DROP COLUMN.
/// Each record's schema describes its own payload, and Kafka Connect's
/// JsonConverter reads every key and value as their schema says; a copy
/// built from the topic equals the table.
#[test]
fn kafka_sink_json_schemas_follow_schema_changes() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka schema test is skipped");
        return;
    }
    let _one = one_broker();
    let b = Broker::start("schemas");
    let kafka = broker::sink_args(&b.addr, &[]);
    for (label, bin) in support::servers() {
        let t0 = Instant::now();
        let table = format!("evolving_{label}");
        let (c, logs) = cluster_with_kslot_for(
            label,
            &bin,
            "schemas",
            Options {
                conf: vec!["logical_decoding_work_mem = '64kB'".into()],
                ..Options::default()
            },
            &format!(
                "CREATE TABLE {table} (id int PRIMARY KEY, v int);
                 CREATE PUBLICATION p FOR TABLE {table};"
            ),
        );
        c.psql(&format!(
            "INSERT INTO {table} VALUES (1, 1);
             BEGIN;
             INSERT INTO {table} SELECT g, g FROM generate_series(2, 2000) g;
             ALTER TABLE {table} ADD COLUMN note text;
             INSERT INTO {table} SELECT g, g, 'n' || g FROM generate_series(2001, 4000) g;
             ALTER TABLE {table} ALTER COLUMN v TYPE bigint;
             UPDATE {table} SET v = v + 10000000000 WHERE id % 500 = 0;
             COMMIT;
             ALTER TABLE {table} DROP COLUMN note;
             INSERT INTO {table} VALUES (4001, 1);
             DELETE FROM {table} WHERE id = 1;"
        ));
        let end: Lsn = c.insert_lsn();
        let (ok, log) = start_sink(
            &c,
            &kafka,
            &logs,
            0,
            &["--kafka-json-schemas", "--stop-lsn", &end.to_string()],
        )
        .wait(Duration::from_secs(120));
        assert!(ok, "{label}: pgwal failed:\n{log}");
        assert!(
            count_in(&log, "spilled") >= 1,
            "{label}: the big transaction was not streamed through the spill file:\n{log}"
        );

        let records = read_all(&b.addr, &[&topic(&table)], "read_committed");
        // 1 + 1999 + 2000 inserts, 8 updates, 1 insert, 1 delete
        assert_eq!(records.len(), 4010, "{label}");
        let mut docs: Vec<&[u8]> = Vec::new();
        let mut copy: BTreeMap<i64, Value> = BTreeMap::new();
        let mut shapes: BTreeMap<(bool, String), u32> = BTreeMap::new();
        for r in &records {
            docs.extend(r.key.as_deref());
            let Some(value) = r.value.as_deref() else {
                continue;
            };
            docs.push(value);
            let v: Value = serde_json::from_slice(value).unwrap();
            let row_schema = broker::row_schema(&v);
            let fields = broker::field_names(row_schema);
            let v_type = broker::field_schema(row_schema, "v").unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned();
            let p = &v["payload"];
            // stamped at the commit, also in the streamed transaction
            assert!(p["source"]["txId"].as_u64().unwrap() > 1, "{label}: {p}");
            match p["op"].as_str().unwrap() {
                "d" => {
                    copy.remove(&p["before"]["id"].as_i64().unwrap());
                }
                _ => {
                    let after = p["after"].as_object().unwrap();
                    let keys: BTreeSet<&str> = after.keys().map(String::as_str).collect();
                    assert_eq!(
                        keys, fields,
                        "{label}: the payload's columns are the schema's"
                    );
                    *shapes.entry((fields.contains("note"), v_type)).or_default() += 1;
                    copy.insert(after["id"].as_i64().unwrap(), p["after"]["v"].clone());
                }
            }
        }
        // 1999 + 1 without note, 2000 with it and v int32, 8 updates with
        // v int64 (inside the streamed transaction), and one after the drop
        let want: BTreeMap<(bool, String), u32> = [
            ((false, "int32".to_owned()), 2000),
            ((true, "int32".to_owned()), 2000),
            ((true, "int64".to_owned()), 8),
            ((false, "int64".to_owned()), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(shapes, want, "{label}: records by (note, type of v)");
        let source: BTreeMap<i64, Value> = c
            .query(&format!("SELECT id || ' ' || v FROM {table} ORDER BY id"))
            .lines()
            .map(|l| {
                let (id, v) = l.trim().split_once(' ').unwrap();
                (id.parse().unwrap(), Value::from(v.parse::<i64>().unwrap()))
            })
            .collect();
        assert!(
            copy == source,
            "{label}: the copy built from the topic differs from the table"
        );
        let checked = broker::connect_json_check(docs.iter().copied())
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(checked, docs.len() as u64, "{label}");
        let _ = std::fs::remove_dir_all(&logs);
        eprintln!(
            "{label}: {} records with their schemas, {checked} keys and values read by Kafka \
             Connect, in {:.1?}",
            records.len(),
            t0.elapsed()
        );
    }
}

/// Avro with a real schema registry (Apicurio Registry's Confluent API,
/// tools/schema-registry-server), read back by Confluent's own
/// deserializer (its Python client, tools/schema-registry/avro_consume.py):
/// a table with rows snapshotted as Avro, then schema changes mid-stream,
/// two of them inside a streamed transaction, each a new compatible schema
/// version under BACKWARD; then a change BACKWARD refuses, which stops the
/// sink with the registry's explanation and writes nothing, and comes
/// again when the mode allows it. The copy a consumer builds from the
/// deserialized records equals the table.
#[test]
fn kafka_sink_avro_with_a_schema_registry() {
    if !broker::have_java() || !broker::have_registry() {
        eprintln!("NOTICE: no java or no schema registry; the Kafka Avro test is skipped");
        return;
    }
    let _one = one_broker();
    let b = Broker::start("avro");
    let registry = broker::Registry::start("avro");
    let kafka = broker::sink_args(&b.addr, &[]);
    for (label, bin) in support::servers() {
        let t0 = Instant::now();
        let phase = |what: &str| eprintln!("{label}: {:6.1} s {what}", t0.elapsed().as_secs_f64());
        let table = format!("avro_{label}");
        let topic = topic(&table);
        let (c, logs) = cluster_with_kslot_for(
            label,
            &bin,
            "avro",
            Options {
                conf: vec!["logical_decoding_work_mem = '64kB'".into()],
                ..Options::default()
            },
            &format!(
                "CREATE TABLE {table} (id int PRIMARY KEY, v int, price numeric(10,2),
                    amount numeric, tags text[], at timestamptz, day date, raw bytea,
                    doc jsonb, \"Order Total\" text, ratio float8);
                 INSERT INTO {table} SELECT g, g, g * 1.25, g / 7.0, ARRAY['a' || g, NULL],
                    '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 minute',
                    '2026-01-01'::date + g % 300, decode(md5(g::text), 'hex'),
                    jsonb_build_object('g', g), 'T' || g, g / 3.0
                    FROM generate_series(1, 500) g;
                 CREATE PUBLICATION p FOR TABLE {table};"
            ),
        );
        let avro = [
            "--kafka-avro",
            "--kafka-schema-registry",
            &registry.url,
            "--kafka-schema-compatibility",
            "BACKWARD",
        ];
        // the rows the table holds, as read records
        let sink = start_sink(&c, &kafka, &logs, 0, &[&avro[..], &["--snapshot"]].concat());
        wait_for_log(&sink, 0, "snapshot finished", Duration::from_secs(120));
        let (ok, log) = sink.terminate();
        assert!(ok, "{label}: the snapshot run failed:\n{log}");
        phase("snapshot in Avro");

        c.psql(&format!(
            "UPDATE {table} SET v = v + 1 WHERE id <= 10;
             DELETE FROM {table} WHERE id = 11;
             BEGIN;
             INSERT INTO {table} (id, v, price) SELECT g, g, 0.5 FROM generate_series(1001, 3000) g;
             ALTER TABLE {table} ADD COLUMN note text;
             INSERT INTO {table} (id, v, note) SELECT g, g, 'n' || g FROM generate_series(3001, 3100) g;
             ALTER TABLE {table} ALTER COLUMN v TYPE bigint;
             UPDATE {table} SET v = v + 10000000000 WHERE id % 500 = 0;
             COMMIT;
             ALTER TABLE {table} RENAME COLUMN \"Order Total\" TO total;
             UPDATE {table} SET total = 'renamed' WHERE id = 2;
             ALTER TABLE {table} DROP COLUMN amount;
             INSERT INTO {table} (id, v, note) VALUES (4001, 1, 'after the drop');
             UPDATE {table} SET id = 5000 WHERE id = 3;"
        ));
        let end = c.insert_lsn();
        let (ok, log) = start_sink(
            &c,
            &kafka,
            &logs,
            1,
            &[&avro[..], &["--stop-lsn", &end.to_string()]].concat(),
        )
        .wait(Duration::from_secs(120));
        assert!(ok, "{label}: the streaming run failed:\n{log}");
        assert!(
            count_in(&log, "spilled") >= 1,
            "{label}: the big transaction was not streamed through the spill file:\n{log}"
        );
        phase("changes in Avro");
        let records = broker::avro_read_all(&b.addr, &registry.url, &[&topic]);
        let ops = |op: &str| records.iter().filter(|r| r["value"]["op"] == op).count();
        assert_eq!(ops("r"), 500, "{label}: read records");
        // shapes: which columns each record's row has
        let mut shapes: BTreeMap<String, usize> = BTreeMap::new();
        for r in &records {
            let row = if r["value"]["after"].is_object() {
                &r["value"]["after"]
            } else {
                &r["value"]["before"]
            };
            let cols: Vec<&str> = ["note", "amount", "Order_Total", "total"]
                .into_iter()
                .filter(|c| row.get(*c).is_some())
                .collect();
            *shapes.entry(cols.join(",")).or_default() += 1;
        }
        let want: BTreeMap<String, usize> = [
            // the snapshot, 10 updates, a delete and 2,000 inserts
            ("amount,Order_Total", 500 + 10 + 1 + 2000),
            // 100 inserts and 5 updates (v) before the rename
            ("note,amount,Order_Total", 100 + 5),
            // the update of the renamed column
            ("note,amount,total", 1),
            // after the drop: an insert, and the key change's delete and create
            ("note,total", 3),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
        assert_eq!(shapes, want, "{label}: records by shape");
        let ids = |k: &str| {
            records
                .iter()
                .filter_map(|r| r[k].as_u64())
                .collect::<BTreeSet<u64>>()
        };
        // the value schema: first, +note, v bigint, renamed, dropped
        assert_eq!(
            ids("value_schema_id").len(),
            5,
            "{label}: value schema versions"
        );
        assert_eq!(
            ids("key_schema_id").len(),
            1,
            "{label}: key schema versions"
        );
        // the last update of row 2 (the first moved its v)
        let renamed = records
            .iter()
            .rev()
            .find(|r| r["value"]["op"] == "u" && r["value"]["after"]["id"] == 2)
            .map(|r| r["value"]["after"]["total"].clone());
        assert_eq!(renamed, Some(Value::from("renamed")), "{label}");

        // a change BACKWARD refuses (ratio: double to string): the sink
        // stops, naming the subject, and Kafka gets nothing of it
        c.psql(&format!(
            "ALTER TABLE {table} ALTER COLUMN ratio TYPE text;
             INSERT INTO {table} (id, v, note, ratio) VALUES (6000, 6, 'six', 'six');"
        ));
        let end = c.insert_lsn();
        let held = kafka_progress_value(&b.addr, &c).unwrap();
        let (code, log) = start_sink(
            &c,
            &kafka,
            &logs,
            2,
            // no heartbeat may move the progress meanwhile
            &[
                &avro[..],
                &[
                    "--stop-lsn",
                    &end.to_string(),
                    "--kafka-heartbeat-secs",
                    "0",
                ],
            ]
            .concat(),
        )
        .wait_code(Duration::from_secs(120));
        // 5: a change that cannot be written (crates/README.md, exit statuses)
        assert_eq!(
            code,
            Some(5),
            "{label}: the incompatible change was taken, or failed otherwise:\n{log}"
        );
        let subject = format!("refuses the new schema of subject \"{topic}-value\"");
        assert!(log.contains(&subject), "{label}: {subject} not in:\n{log}");
        assert_eq!(kafka_progress_value(&b.addr, &c).unwrap(), held, "{label}");
        let now = broker::avro_read_all(&b.addr, &registry.url, &[&topic]);
        assert_eq!(
            now.len(),
            records.len(),
            "{label}: written after the refusal"
        );
        let refusal = log
            .lines()
            .find(|l| l.contains("refuses"))
            .unwrap_or_default();
        phase(&format!("the incompatible change refused: {refusal}"));

        // with the check off, the change comes again
        let mut none = avro.to_vec();
        none[4] = "NONE";
        let (ok, log) = start_sink(
            &c,
            &kafka,
            &logs,
            3,
            &[&none[..], &["--stop-lsn", &end.to_string()]].concat(),
        )
        .wait(Duration::from_secs(120));
        assert!(
            ok,
            "{label}: the run with compatibility NONE failed:\n{log}"
        );
        let records = broker::avro_read_all(&b.addr, &registry.url, &[&topic]);
        let mut copy: BTreeMap<i64, Value> = BTreeMap::new();
        for r in &records {
            let v = &r["value"];
            match v["op"].as_str().unwrap() {
                "d" => {
                    copy.remove(&r["key"]["id"].as_i64().unwrap());
                }
                _ => {
                    let a = &v["after"];
                    let text = |x: &Value| match x {
                        Value::Null => Value::Null,
                        Value::String(s) => Value::from(s.clone()),
                        x => Value::from(x.to_string()),
                    };
                    copy.insert(
                        r["key"]["id"].as_i64().unwrap(),
                        serde_json::json!({
                            "v": text(&a["v"]),
                            "price": text(&a["price"]),
                            "note": text(&a["note"]),
                        }),
                    );
                }
            }
        }
        let source: BTreeMap<i64, Value> = c
            .query(&format!(
                "SELECT json_build_object('id', id, 'v', v::text, 'price', price::text,
                        'note', note::text) FROM {table} ORDER BY id"
            ))
            .lines()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                let id = v["id"].as_i64().unwrap();
                v.as_object_mut().unwrap().remove("id");
                (id, v)
            })
            .collect();
        assert_eq!(copy.len(), source.len(), "{label}: rows");
        let differing: Vec<_> = source
            .iter()
            .filter(|(k, v)| copy.get(k) != Some(v))
            .take(5)
            .map(|(k, v)| format!("{k}: table {v}, copy {:?}", copy.get(k)))
            .collect();
        assert!(
            differing.is_empty(),
            "{label}: the copy built from the topic differs from the table: {differing:?}"
        );
        let _ = std::fs::remove_dir_all(&logs);
        phase(&format!(
            "{} records deserialized by Confluent's AvroDeserializer, copy equal",
            records.len()
        ));
    }
}

/// The last committed progress record of `c`'s sink (slot `kslot`).  Keyed:
/// servers tested one after another share the broker, and until this one's
/// sink commits, the topic's last record is the previous server's.
fn kafka_progress_value(addr: &str, c: &Cluster) -> Option<Value> {
    let system = c.query("SELECT system_identifier FROM pg_control_system()");
    let key = pgwal_kafka::progress::key(&system, "kslot");
    read_all(addr, &[PROGRESS], "read_committed")
        .iter()
        .rev()
        .find(|r| r.key.as_deref() == Some(key.as_bytes()))
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
}

/// The snapshot test's tables: a large one, one with a two-column key, and
/// a REPLICA IDENTITY FULL one (keyed by its primary key), each with rows
/// before the sink ever ran.
const SNAPSHOT_ROWS: u64 = 40_000;

fn snapshot_setup(label: &str) -> String {
    format!(
        "CREATE TABLE snap_{label} (id bigint PRIMARY KEY, ver int NOT NULL, note text);
         INSERT INTO snap_{label} SELECT g, 1, 'before ' || g FROM generate_series(1, {SNAPSHOT_ROWS}) g;
         CREATE TABLE comp_{label} (a int, b text, ver int NOT NULL, PRIMARY KEY (a, b));
         INSERT INTO comp_{label} SELECT g / 3, 'k' || (g % 3), 1 FROM generate_series(1, 3000) g;
         CREATE TABLE full_{label} (id int PRIMARY KEY, ver int NOT NULL, body text);
         ALTER TABLE full_{label} REPLICA IDENTITY FULL;
         INSERT INTO full_{label} SELECT g, 1, repeat('x', g % 50) FROM generate_series(1, 2000) g;
         CREATE PUBLICATION p FOR TABLE snap_{label}, comp_{label}, full_{label};"
    )
}

/// One round of writes over the whole key range, ahead of and behind the
/// snapshot's cursor: updates (each moves a version, so every change is
/// unique), deletes, inserts, key changes, and every tenth round a
/// transaction large enough to be streamed.
fn snapshot_round_sql(label: &str, r: u64) -> String {
    let n = SNAPSHOT_ROWS;
    let pick = |k: u64| (r * 7919 + k * 104_729) % n + 1;
    let mut s = format!(
        "UPDATE snap_{label} SET ver = ver + 1 WHERE id IN ({}, {}, {}, {});
         DELETE FROM snap_{label} WHERE id = {};
         INSERT INTO snap_{label} VALUES ({}, 1, 'new');
         UPDATE snap_{label} SET id = id + 100000000, ver = ver + 1 WHERE id = {};
         UPDATE comp_{label} SET ver = ver + 1 WHERE a = {};
         DELETE FROM comp_{label} WHERE a = {} AND b = 'k1';
         UPDATE full_{label} SET ver = ver + 1 WHERE id = {};
         DELETE FROM full_{label} WHERE id = {};\n",
        pick(1),
        pick(2),
        pick(3),
        pick(4),
        pick(5),
        n + r,
        pick(6),
        pick(7) % 1000,
        pick(8) % 1000,
        pick(9) % 2000 + 1,
        pick(10) % 2000 + 1,
    );
    if r.is_multiple_of(10) {
        s.push_str(&format!(
            "UPDATE snap_{label} SET ver = ver + 1 WHERE id % 100 = {};\n",
            r % 100
        ));
    }
    s
}

/// Records applied in order, keyed by their record key, as a Debezium
/// consumer does: reads and creates and updates put the row, deletes
/// remove it.
fn materialize(records: &[Consumed]) -> BTreeMap<String, BTreeMap<String, Value>> {
    let mut db: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for r in records {
        let Some(value) = r.value.as_deref() else {
            continue;
        };
        let t = db.entry(r.topic.clone()).or_default();
        let v: Value = serde_json::from_slice(value).unwrap();
        let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
        match v["op"].as_str().unwrap() {
            "r" | "c" | "u" => {
                t.insert(key, v["after"].clone());
            }
            "d" => {
                t.remove(&key);
            }
            op => panic!("unexpected op {op}: {v}"),
        }
    }
    db
}

/// Rows of `table` keyed as the sink keys them (`key` columns).
fn keyed_rows(c: &Cluster, table: &str, key: &[&str]) -> BTreeMap<String, Value> {
    let rows: Vec<Value> = serde_json::from_str(&c.query(&format!(
        "SELECT coalesce(json_agg(row_to_json(t)), '[]') FROM {table} t"
    )))
    .unwrap();
    rows.into_iter()
        .map(|r| {
            let k: serde_json::Map<String, Value> =
                key.iter().map(|c| (c.to_string(), r[c].clone())).collect();
            (serde_json::to_string(&k).unwrap(), r)
        })
        .collect()
}

/// `--snapshot` into Kafka of tables that hold rows and are written to all
/// along, with the sink SIGKILLed and restarted in the middle of the
/// snapshot, then a signal that snapshots one table again. A read_committed
/// consumer sees every change of the reference stream exactly once, each
/// row read at most once per snapshot, and builds copies equal to the
/// tables. On 15 the chunks are read-only (`--kafka-snapshot-read-only`:
/// their windows end at a WAL position, not at a watermark message), on 18
/// they write watermarks.
#[test]
fn kafka_sink_snapshot_while_written_and_killed() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka snapshot test is skipped");
        return;
    }
    let _one = one_broker();
    let b = Broker::start("snapshot");
    let kafka = broker::sink_args(&b.addr, &[]);
    for (label, bin) in support::servers() {
        // 15 (pgoutput v3) and 18; 17's v4 stream is 18's (CI's time):
        // PGWAL_KAFKA_SNAPSHOT_ALL=1 runs it on 17 too
        if label == "pg17" && std::env::var_os("PGWAL_KAFKA_SNAPSHOT_ALL").is_none() {
            eprintln!("NOTICE: pg17 skipped (PGWAL_KAFKA_SNAPSHOT_ALL=1 runs it)");
            continue;
        }
        let t = Instant::now();
        let phase = |what: &str| eprintln!("{label}: {:6.1} s {what}", t.elapsed().as_secs_f64());
        let c = Cluster::start(
            label,
            &bin,
            Options {
                conf: vec![
                    "logical_decoding_work_mem = '64kB'".into(),
                    // the held PREPARE of snapshot_behind_a_held_commit
                    "max_prepared_transactions = 2".into(),
                ],
                ..Options::default()
            },
        );
        c.psql(&snapshot_setup(label));
        // the reference stream starts where the sink's slot does
        block_on(async {
            let mut rc = ReplicationClient::connect(&config(&c, "postgres"))
                .await
                .unwrap();
            for slot in ["ref", "kslot"] {
                rc.create_logical_slot(slot, &CreateSlotOptions::new())
                    .await
                    .unwrap();
            }
        });
        let logs = fresh_log_dir(label, "snapshot");
        let tables = [
            (format!("snap_{label}"), vec!["id"]),
            (format!("comp_{label}"), vec!["a", "b"]),
            (format!("full_{label}"), vec!["id"]),
        ];
        phase("server started, tables filled");

        // the load, paced and bounded
        let stop = Arc::new(AtomicBool::new(false));
        let load = {
            let stop = stop.clone();
            let label = label.to_owned();
            let mut psql = c.psql_command();
            psql.args(["-f", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null());
            std::thread::spawn(move || {
                let mut r = 1;
                let t0 = Instant::now();
                while !stop.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(300) {
                    let round = Instant::now();
                    assert!(
                        support::feed(&mut psql, &snapshot_round_sql(&label, r))
                            .status
                            .success(),
                        "load round {r} failed"
                    );
                    r += 1;
                    std::thread::sleep(Duration::from_millis(50).saturating_sub(round.elapsed()));
                }
                r - 1
            })
        };

        let read_only = label == "pg15";
        let mode: &[&str] = if read_only {
            &["--kafka-snapshot-read-only"]
        } else {
            &[]
        };
        let args = [&["--snapshot", "--kafka-snapshot-chunk-rows", "500"], mode].concat();
        let mut n = 0;
        let mut sink = start_sink(&c, &kafka, &logs, n, &args);
        // SIGKILLed three times while the snapshot is under way
        let mut killed_mid_snapshot = 0;
        for at_rows in [4_000, 16_000, 28_000] {
            let t0 = Instant::now();
            let rows = loop {
                let p = kafka_progress_value(&b.addr, &c);
                let rows = p.as_ref().map(|p| p["snapshot"]["rows"].as_u64());
                match rows {
                    Some(Some(r)) if r >= at_rows => break Some(r),
                    // the snapshot is over
                    Some(None) => break None,
                    _ => {}
                }
                sink.assert_running(label);
                assert!(
                    t0.elapsed() < Duration::from_secs(120),
                    "{label}: the snapshot did not reach {at_rows} rows in 120 s:\n{}",
                    sink.log()
                );
                std::thread::sleep(Duration::from_millis(100));
            };
            sink.signal("-KILL");
            let _ = sink.wait_code(Duration::from_secs(30));
            phase(&format!(
                "pgwal SIGKILLed with {rows:?} snapshot rows in Kafka"
            ));
            killed_mid_snapshot += u32::from(rows.is_some());
            n += 1;
            sink = start_sink(&c, &kafka, &logs, n, &args);
            sink.wait_streaming();
        }
        assert!(
            killed_mid_snapshot >= 2,
            "{label}: the snapshot ran past most kills; restarts in its middle were not tested"
        );
        // the snapshot ends
        let t0 = Instant::now();
        while kafka_progress_value(&b.addr, &c).is_some_and(|p| p.get("snapshot").is_some()) {
            sink.assert_running(label);
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{label}: the snapshot did not end in 120 s:\n{}",
                sink.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        phase("initial snapshot done");
        // a signal (`pgwal snapshot`) snapshots the FULL table again, still
        // under load
        let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
            .arg("-d")
            .arg(format!("{} sslmode=disable", c.conninfo("postgres")))
            .args(["snapshot", "--table", &format!("public.full_{label}")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{label}: pgwal snapshot failed: {out:?}"
        );
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        let signal: Lsn = printed["lsn"].as_str().unwrap().parse().unwrap();
        let t0 = Instant::now();
        loop {
            let p = kafka_progress_value(&b.addr, &c).unwrap();
            let end: Lsn = p["end_lsn"].as_str().unwrap().parse().unwrap();
            if end > signal && p.get("snapshot").is_none() {
                break;
            }
            sink.assert_running(label);
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{label}: the signalled snapshot did not end in 120 s:\n{}",
                sink.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        phase("signalled snapshot done");
        stop.store(true, Ordering::SeqCst);
        let rounds = load.join().unwrap();
        let (ok, log) = sink.terminate();
        assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");
        let end: Lsn = c.insert_lsn();
        let (ok, log) = start_sink(&c, &kafka, &logs, n + 1, &["--stop-lsn", &end.to_string()])
            .wait(Duration::from_secs(120));
        assert!(ok, "{label}: the catch-up run failed:\n{log}");
        phase(&format!("{rounds} load rounds; caught up"));

        let (reads, changes) = check_snapshot_topics(label, &c, &c, &b.addr, &tables, end);
        let rereads = snapshot_behind_a_held_commit(label, &c, &b.addr, &kafka, &logs, n + 2, mode);
        phase(&format!(
            "a snapshot behind a commit a synchronous standby held: read again {rereads} times"
        ));
        let _ = std::fs::remove_dir_all(&logs);
        eprintln!(
            "{label}: {} read records and {} changes read_committed; {killed_mid_snapshot} \
             SIGKILLs mid-snapshot, 0 duplicates, copies equal; {rounds} load rounds; {:.1?}",
            reads,
            changes,
            t.elapsed()
        );
    }
}

/// A snapshot from a hot standby (logical decoding there needs 16+; run on
/// 18): the sink streams from a slot on the standby and reads its chunks
/// there, where no watermark can be written, so every chunk is read-only.
/// The primary is written to all along, the sink is SIGKILLed in the middle
/// of the snapshot, and a signal sent to the primary (a logical message
/// the standby replays) snapshots one table again. The verdicts of the
/// snapshot test, with the reference stream from a slot on the standby and
/// the copies compared with the primary's tables.
#[test]
fn kafka_sink_snapshot_from_a_hot_standby() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka standby snapshot test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().find(|(l, _)| *l == "pg18") else {
        eprintln!("NOTICE: no PostgreSQL 18; the Kafka standby snapshot test is skipped");
        return;
    };
    let _one = one_broker();
    let b = Broker::start("standby");
    let kafka = broker::sink_args(&b.addr, &[]);
    let t = Instant::now();
    let phase = |what: &str| eprintln!("{label}: {:6.1} s {what}", t.elapsed().as_secs_f64());
    let p = Cluster::start(
        label,
        &bin,
        Options {
            conf: vec!["logical_decoding_work_mem = '64kB'".into()],
            ..Options::default()
        },
    );
    p.psql(&snapshot_setup(label));
    let s = p.standby("phys", &["hot_standby_feedback = on"]);
    // a slot on a standby waits for the primary's next running-xacts
    // record: ask for one until both slots exist
    let slots_made = Arc::new(AtomicBool::new(false));
    let nudge = {
        let done = slots_made.clone();
        let mut psql = p.psql_command();
        psql.args(["-f", "-"]).stdout(Stdio::null());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !done.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(60) {
                support::feed(&mut psql, "SELECT pg_log_standby_snapshot();");
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    block_on(async {
        let mut rc = ReplicationClient::connect(&config(&s, "postgres"))
            .await
            .unwrap();
        for slot in ["ref", "kslot"] {
            rc.create_logical_slot(slot, &CreateSlotOptions::new())
                .await
                .unwrap();
        }
    });
    slots_made.store(true, Ordering::SeqCst);
    nudge.join().unwrap();
    let logs = fresh_log_dir(label, "standby-snapshot");
    let tables = [
        (format!("snap_{label}"), vec!["id"]),
        (format!("comp_{label}"), vec!["a", "b"]),
        (format!("full_{label}"), vec!["id"]),
    ];
    phase("primary and standby started, slots made on the standby");

    // the load on the primary, paced and bounded
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let mut psql = p.psql_command();
        psql.args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null());
        std::thread::spawn(move || {
            let mut r = 1;
            let t0 = Instant::now();
            while !stop.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(300) {
                let round = Instant::now();
                assert!(
                    support::feed(&mut psql, &snapshot_round_sql(label, r))
                        .status
                        .success(),
                    "load round {r} failed"
                );
                r += 1;
                std::thread::sleep(Duration::from_millis(50).saturating_sub(round.elapsed()));
            }
            r - 1
        })
    };
    // larger chunks than the snapshot test's: fewer windows, a shorter test
    let args = ["--snapshot", "--kafka-snapshot-chunk-rows", "2000"];
    let mut sink = start_sink(&s, &kafka, &logs, 0, &args);
    let t0 = Instant::now();
    let rows = loop {
        let rows = kafka_progress_value(&b.addr, &s).map(|p| p["snapshot"]["rows"].as_u64());
        match rows {
            Some(Some(r)) if r >= 8_000 => break r,
            Some(None) => panic!("{label}: the snapshot ended before 8,000 rows"),
            _ => {}
        }
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{label}: the snapshot did not reach 8,000 rows in 120 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    sink.signal("-KILL");
    let _ = sink.wait_code(Duration::from_secs(30));
    phase(&format!(
        "pgwal SIGKILLed with {rows} snapshot rows in Kafka"
    ));
    let mut sink = start_sink(&s, &kafka, &logs, 1, &args);
    sink.wait_streaming();
    let t0 = Instant::now();
    while kafka_progress_value(&b.addr, &s).is_some_and(|p| p.get("snapshot").is_some()) {
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{label}: the snapshot did not end in 120 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    phase("initial snapshot done");
    // the signal goes to the primary; the standby's stream carries it
    let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .arg("-d")
        .arg(format!("{} sslmode=disable", p.conninfo("postgres")))
        .args(["snapshot", "--table", &format!("public.full_{label}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{label}: pgwal snapshot failed: {out:?}"
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let signal: Lsn = printed["lsn"].as_str().unwrap().parse().unwrap();
    let t0 = Instant::now();
    loop {
        let v = kafka_progress_value(&b.addr, &s).unwrap();
        let end: Lsn = v["end_lsn"].as_str().unwrap().parse().unwrap();
        if end > signal && v.get("snapshot").is_none() {
            break;
        }
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{label}: the signalled snapshot did not end in 120 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    phase("signalled snapshot done");
    stop.store(true, Ordering::SeqCst);
    let rounds = load.join().unwrap();
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");
    let (read_only, _) = chunks_read_only_and_again(&log);
    assert!(
        read_only > 0,
        "{label}: no read-only chunk on the standby:\n{log}"
    );
    // the standby replays the load's end before the catch-up run
    let end = p.insert_lsn();
    let t0 = Instant::now();
    while s
        .query("SELECT pg_last_wal_replay_lsn()")
        .parse::<Lsn>()
        .unwrap()
        < end
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the standby did not replay {end} in 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, log) = start_sink(&s, &kafka, &logs, 2, &["--stop-lsn", &end.to_string()])
        .wait(Duration::from_secs(120));
    assert!(ok, "{label}: the catch-up run failed:\n{log}");
    phase(&format!("{rounds} load rounds; caught up"));
    let (reads, changes) = check_snapshot_topics(label, &s, &p, &b.addr, &tables, end);
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: from a hot standby: {reads} read records and {changes} changes \
         read_committed ({read_only} read-only chunks in the last run); a SIGKILL \
         mid-snapshot, 0 duplicates, copies equal to the primary's tables; {rounds} load \
         rounds; {:.1?}",
        t.elapsed()
    );
}

/// Tables a snapshot cannot page through as it is told to, and tables that
/// change under it, on 18. A table whose primary key changes between two
/// chunks (the sink SIGKILLed in its middle) is read again from its start
/// under the new key; a configured key that no unique index backs is left
/// out with an error, not half read; a table written at its tail from its
/// first chunk on is read up to its largest key then (the stream carries
/// the rest); a
/// table of 100 kB rows is read in chunks of about 1 MB. Before, the key
/// change stopped the sink on every restart ("the cursor has 1 key
/// values"), a repeated key straddling a chunk's end was skipped
/// silently, and the snapshot chased the tail.
#[test]
fn kafka_sink_snapshot_through_key_changes_unpageable_keys_a_growing_tail_and_wide_rows() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka snapshot test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().find(|(l, _)| *l == "pg18") else {
        eprintln!("NOTICE: no PostgreSQL 18; skipped");
        return;
    };
    let _one = one_broker();
    let b = Broker::start("snapshot-keys");
    let kafka = broker::sink_args(&b.addr, &[]);
    let t = Instant::now();
    let phase = |what: &str| eprintln!("{label}: {:6.1} s {what}", t.elapsed().as_secs_f64());
    let c = Cluster::start(label, &bin, Options::default());
    c.psql(
        "CREATE TABLE a_pk (a int PRIMARY KEY, b int NOT NULL, note text);
         INSERT INTO a_pk SELECT g, g % 7, 'x' FROM generate_series(1, 40000) g;
         CREATE TABLE b_dup (k int NOT NULL, v text);
         INSERT INTO b_dup SELECT g / 2, 'v' || g FROM generate_series(1, 1000) g;
         CREATE TABLE c_tail (id bigint PRIMARY KEY, note text);
         INSERT INTO c_tail SELECT g, 'before' FROM generate_series(1, 60000) g;
         CREATE TABLE d_wide (id int PRIMARY KEY, body text);
         INSERT INTO d_wide SELECT g, repeat(md5(g::text), 3200) FROM generate_series(1, 300) g;
         CREATE PUBLICATION p FOR TABLE a_pk, b_dup, c_tail, d_wide;",
    );
    block_on(async {
        let mut rc = ReplicationClient::connect(&config(&c, "postgres"))
            .await
            .unwrap();
        rc.create_logical_slot("kslot", &CreateSlotOptions::new())
            .await
            .unwrap();
    });
    let logs = fresh_log_dir(label, "snapshot-keys");
    let args = [
        "--snapshot",
        "--kafka-snapshot-chunk-rows",
        "200",
        "--kafka-snapshot-chunk-bytes",
        "1000000",
        "--kafka-key-columns",
        "public.b_dup:k",
    ];
    let mut sink = start_sink(&c, &kafka, &logs, 0, &args);
    // SIGKILLed in the middle of a_pk, whose key then changes
    let t0 = Instant::now();
    loop {
        let p = kafka_progress_value(&b.addr, &c);
        let snap = p.as_ref().and_then(|p| p.get("snapshot").cloned());
        if let Some(s) = &snap {
            if s["rows"].as_u64().unwrap_or(0) >= 2_000 {
                assert_eq!(
                    s["tables"][0][1], "a_pk",
                    "a_pk was read before the kill could come: {s}"
                );
                break;
            }
        }
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no 2,000 snapshot rows in 120 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sink.signal("-KILL");
    let _ = sink.wait_code(Duration::from_secs(30));
    c.psql("ALTER TABLE a_pk DROP CONSTRAINT a_pk_pkey, ADD PRIMARY KEY (b, a);");
    phase("SIGKILLed in the middle of a_pk; its key is now (b, a)");
    let with_metrics = [&args[..], &["--metrics", "127.0.0.1:0"]].concat();
    let mut sink = start_sink(&c, &kafka, &logs, 1, &with_metrics);
    // once c_tail's first chunk is in Kafka, its bound is set
    let t0 = Instant::now();
    loop {
        let p = kafka_progress_value(&b.addr, &c);
        let s = p.as_ref().and_then(|p| p.get("snapshot").cloned());
        let s = s.unwrap_or_else(|| panic!("the snapshot ended before c_tail was seen"));
        if s["tables"][0][1] == "c_tail" && !s["after"].is_null() {
            assert!(
                s["after"][0].as_str().unwrap().parse::<u64>().unwrap() < 50_000,
                "c_tail nearly read before the load began: {s}"
            );
            break;
        }
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "c_tail's snapshot not seen in 120 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // inserts at c_tail's tail from its first chunk on, bounded in time
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let mut psql = c.psql_command();
        psql.args(["-f", "-"]).stdout(Stdio::null());
        std::thread::spawn(move || {
            let mut r = 0;
            let t0 = Instant::now();
            while !stop.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(240) {
                let from = 60_001 + r * 10;
                let sql = format!(
                    "INSERT INTO c_tail SELECT g, 'during' FROM generate_series({from}, {}) g;",
                    from + 9
                );
                assert!(support::feed(&mut psql, &sql).status.success());
                r += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r
        })
    };
    let t0 = Instant::now();
    while kafka_progress_value(&b.addr, &c).is_none_or(|p| p.get("snapshot").is_some()) {
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the snapshot did not end in 180 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::SeqCst);
    let rounds = load.join().unwrap();
    phase(&format!("snapshot done; {rounds} inserts at the tail"));
    let end = c.insert_lsn();
    let t0 = Instant::now();
    loop {
        let p = kafka_progress_value(&b.addr, &c).unwrap();
        let at: Lsn = p["end_lsn"].as_str().unwrap().parse().unwrap();
        if at >= end {
            break;
        }
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no catch-up in 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // the snapshot's metrics, of this process
    let port = sink
        .log()
        .lines()
        .find_map(|l| l.strip_prefix("pgwal: metrics at http://127.0.0.1:"))
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in\n{}", sink.log()))
        .to_owned();
    let (code, m) = http_get(&format!("127.0.0.1:{port}"), "/metrics");
    assert_eq!(code, 200);
    assert_eq!(
        sample(&m, "pgwal_kafka_snapshot_tables_left_out_total"),
        1.0
    );
    assert_eq!(sample(&m, "pgwal_kafka_snapshot_tables_queued"), 0.0);
    assert!(
        sample(&m, "pgwal_kafka_snapshot_rows_total") >= 100_300.0,
        "{m}"
    );
    assert!(
        sample(&m, "pgwal_kafka_snapshot_chunks_total") >= 30.0,
        "{m}"
    );
    let (ok, log) = sink.terminate();
    assert!(ok, "pgwal failed on SIGTERM:\n{log}");

    assert!(
        log.contains("its key changed since the snapshot's last chunk; reading it again"),
        "no restart of a_pk under its new key:\n{log}"
    );
    assert!(
        log.contains("public.b_dup cannot be snapshotted by its key columns (k)"),
        "b_dup was not refused:\n{log}"
    );
    let wide_chunks: u64 = log
        .lines()
        .find(|l| l.contains("snapshot of a table done") && l.contains("public.d_wide"))
        .and_then(|l| l.split("chunks=").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary of d_wide:\n{log}"));
    let records = read_all(
        &b.addr,
        &[
            &topic("a_pk"),
            &topic("b_dup"),
            &topic("c_tail"),
            &topic("d_wide"),
        ],
        "read_committed",
    );
    let reads = |t: &str| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r.topic == topic(t))
            .map(|r| serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap())
            .filter(|v| v["op"] == "r")
            .collect()
    };
    let ids = |rows: &[Value], col: &str| -> BTreeMap<i64, u32> {
        let mut m = BTreeMap::new();
        for v in rows {
            *m.entry(v["after"][col].as_i64().unwrap()).or_default() += 1;
        }
        m
    };
    // a_pk: every row read, under the new key from the restart on
    let a = ids(&reads("a_pk"), "a");
    assert_eq!(a.len(), 40_000, "a_pk rows read: {}", a.len());
    // b_dup: left out, nothing half read
    assert_eq!(reads("b_dup").len(), 0, "b_dup was read in part");
    // c_tail: the 60,000 rows there at its first chunk, once each; none of
    // the tail's inserts since as reads (they are changes)
    let tail = ids(&reads("c_tail"), "id");
    let beyond = tail.keys().filter(|k| **k > 60_000).count();
    assert_eq!(
        beyond,
        0,
        "{beyond} rows past the bound read as snapshot rows (of {} read, the first {:?})",
        tail.len(),
        tail.keys().find(|k| **k > 60_000),
    );
    assert_eq!(tail.len(), 60_000);
    assert!(tail.values().all(|n| *n == 1), "a c_tail row read twice");
    let copy = materialize(&records);
    let src = keyed_rows(&c, "c_tail", &["id"]);
    assert_eq!(
        copy[&topic("c_tail")].len(),
        src.len(),
        "c_tail's copy differs"
    );
    assert!(copy[&topic("c_tail")] == src, "c_tail's copy differs");
    // d_wide: 300 rows of 100 kB in chunks of about 1 MB
    let wide = ids(&reads("d_wide"), "id");
    assert_eq!(wide.len(), 300);
    assert!(
        wide_chunks >= 30,
        "d_wide read in {wide_chunks} chunks, not in chunks of about 1 MB"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: a_pk read again under its new key ({} reads), b_dup left out, c_tail bounded \
         at 60,000 ({rounds} tail inserts), d_wide in {wide_chunks} chunks; {:.1?}",
        a.values().sum::<u32>(),
        t.elapsed()
    );
}

/// A snapshot by a role that cannot see other roles' transactions in
/// `pg_stat_activity` (not a superuser, not in `pg_read_all_stats`) cannot
/// tell that a commit waits for a synchronous standby: the sink says so
/// in its log, once, and not after the role is granted
/// `pg_read_all_stats`.
#[test]
fn kafka_sink_snapshot_warns_a_role_without_pg_read_all_stats() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka snapshot test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().find(|(l, _)| *l == "pg18") else {
        eprintln!("NOTICE: no PostgreSQL 18; skipped");
        return;
    };
    let _one = one_broker();
    let b = Broker::start("snapshot-role");
    let kafka = broker::sink_args(&b.addr, &[]);
    let (c, logs) = cluster_with_kslot_for(
        label,
        &bin,
        "snapshot-role",
        Options::default(),
        "CREATE TABLE w (id int PRIMARY KEY);
         INSERT INTO w SELECT generate_series(1, 100);
         CREATE PUBLICATION p FOR TABLE w;
         CREATE ROLE snapper LOGIN REPLICATION;
         GRANT SELECT ON w TO snapper;",
    );
    let conninfo = c.conninfo("snapper");
    let warning = "neither a superuser nor a member of pg_read_all_stats";
    let snapshot_done = |sink: &mut Sink, after: Lsn| {
        let t0 = Instant::now();
        loop {
            let p = kafka_progress_value(&b.addr, &c);
            if let Some(p) = p {
                let end: Lsn = p["end_lsn"].as_str().unwrap().parse().unwrap();
                if end > after && p.get("snapshot").is_none() {
                    return;
                }
            }
            sink.assert_running(label);
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{label}: no snapshot in 60 s:\n{}",
                sink.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let args = ["--snapshot", "--kafka-snapshot-read-only"];
    let mut sink = start_sink_in(None, &conninfo, &kafka, &logs, 0, &args);
    snapshot_done(&mut sink, Lsn(0));
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed:\n{log}");
    assert_eq!(
        log.matches(warning).count(),
        1,
        "{label}: not warned once:\n{log}"
    );
    assert!(
        log.contains(r#"role="snapper""#),
        "{label}: the role is not named:\n{log}"
    );
    // granted, a signalled snapshot reads without the warning
    c.psql("GRANT pg_read_all_stats TO snapper;");
    let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .arg("-d")
        .arg(format!("{} sslmode=disable", c.conninfo("postgres")))
        .args(["snapshot", "--table", "public.w"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{label}: pgwal snapshot failed: {out:?}"
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let signal: Lsn = printed["lsn"].as_str().unwrap().parse().unwrap();
    let mut sink = start_sink_in(None, &conninfo, &kafka, &logs, 1, &args);
    snapshot_done(&mut sink, signal);
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed:\n{log}");
    assert!(
        log.contains("snapshot of a table done"),
        "{label}: no snapshot:\n{log}"
    );
    assert!(
        !log.contains(warning),
        "{label}: warned with the role granted:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!("{label}: warned once without pg_read_all_stats, not with it");
}

/// A snapshot signal sent inside a transaction large enough to be streamed
/// (`logical_decoding_work_mem` 64 kB): the sink acts on it at the
/// transaction's commit, and not at all when the transaction aborts.
/// Before, a signal inside a streamed block was dropped without a word.
#[test]
fn kafka_sink_snapshot_signal_inside_a_streamed_transaction() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka snapshot test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().find(|(l, _)| *l == "pg18") else {
        eprintln!("NOTICE: no PostgreSQL 18; skipped");
        return;
    };
    let _one = one_broker();
    let b = Broker::start("streamed-signal");
    let kafka = broker::sink_args(&b.addr, &[]);
    let (c, logs) = cluster_with_kslot_for(
        label,
        &bin,
        "streamed-signal",
        Options {
            conf: vec!["logical_decoding_work_mem = '64kB'".into()],
            ..Options::default()
        },
        "CREATE TABLE bulk (id int PRIMARY KEY, note text);
         CREATE TABLE sig_a (id int PRIMARY KEY);
         INSERT INTO sig_a SELECT generate_series(1, 10);
         CREATE TABLE sig_b (id int PRIMARY KEY);
         INSERT INTO sig_b SELECT generate_series(1, 5);
         CREATE PUBLICATION p FOR TABLE bulk, sig_a, sig_b;",
    );
    let signal = |table: &str| {
        format!(
            "SELECT pg_logical_emit_message(true, 'pgwal.snapshot', '{{\"tables\": [\"public.{table}\"]}}');"
        )
    };
    let mut sink = start_sink(&c, &kafka, &logs, 0, &[]);
    sink.wait_streaming();
    // committed, the signal after the first streamed block
    c.psql(&format!(
        "BEGIN;
         INSERT INTO bulk SELECT g, repeat('x', 50) FROM generate_series(1, 5000) g;
         {}
         INSERT INTO bulk SELECT g, 'after' FROM generate_series(5001, 5010) g;
         COMMIT;",
        signal("sig_a")
    ));
    // aborted: its signal must not count. It is streamed only if decoded
    // while it is still in progress (an aborted transaction's changes are
    // dropped, not streamed), and its signal only in a block before the
    // abort: so both halves wait for the walsender
    c.psql(&format!(
        "BEGIN;
         INSERT INTO bulk SELECT g, repeat('x', 50) FROM generate_series(10001, 15000) g;
         SELECT pg_sleep(1);
         {}
         INSERT INTO bulk SELECT g, repeat('x', 50) FROM generate_series(15001, 20000) g;
         SELECT pg_sleep(1);
         ROLLBACK;
         INSERT INTO bulk VALUES (40000, 'last');",
        signal("sig_b")
    ));
    let end = c.insert_lsn();
    let t0 = Instant::now();
    loop {
        let p = kafka_progress_value(&b.addr, &c);
        if let Some(p) = p {
            let at: Lsn = p["end_lsn"].as_str().unwrap().parse().unwrap();
            if at >= end && p.get("snapshot").is_none() {
                break;
            }
        }
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: not caught up in 60 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed:\n{log}");
    // the walsender reports its counts when it exits, a moment after pgwal
    let streamed_txns = || -> u64 {
        c.query("SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'kslot'")
            .parse()
            .unwrap()
    };
    let t0 = Instant::now();
    while streamed_txns() < 2 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let streamed = streamed_txns();
    assert!(
        streamed >= 2,
        "{label}: {streamed} transactions streamed, not both"
    );
    let records = read_all(
        &b.addr,
        &[&topic("bulk"), &topic("sig_a"), &topic("sig_b")],
        "read_committed",
    );
    let count = |t: &str| records.iter().filter(|r| r.topic == topic(t)).count();
    assert_eq!(count("bulk"), 5011, "{label}: bulk");
    assert_eq!(
        count("sig_a"),
        10,
        "{label}: sig_a not snapshotted at the commit:\n{log}"
    );
    assert_eq!(
        count("sig_b"),
        0,
        "{label}: the aborted transaction's signal counted"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!("{label}: {streamed} streamed transactions; the committed one's signal snapshotted sig_a (10 rows), the aborted one's none");
}

/// A signal for another slot's sink (`pgwal snapshot --slot`) is seen by
/// every sink on the database and acted on only by the one it names.
#[test]
fn kafka_sink_snapshot_signal_for_another_slot_is_ignored() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka snapshot test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().find(|(l, _)| *l == "pg18") else {
        eprintln!("NOTICE: no PostgreSQL 18; skipped");
        return;
    };
    let _one = one_broker();
    let b = Broker::start("slot-signal");
    let kafka = broker::sink_args(&b.addr, &[]);
    let (c, logs) = cluster_with_kslot_for(
        label,
        &bin,
        "slot-signal",
        Options::default(),
        "CREATE TABLE st (id int PRIMARY KEY);
         INSERT INTO st SELECT generate_series(1, 7);
         CREATE PUBLICATION p FOR TABLE st;",
    );
    let mut sink = start_sink(&c, &kafka, &logs, 0, &[]);
    sink.wait_streaming();
    let mut signal_and_wait = |slot: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
            .arg("-d")
            .arg(format!("{} sslmode=disable", c.conninfo("postgres")))
            .args(["snapshot", "--table", "public.st", "--slot", slot])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{label}: pgwal snapshot failed: {out:?}"
        );
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(printed["slot"], slot);
        let signal: Lsn = printed["lsn"].as_str().unwrap().parse().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(p) = kafka_progress_value(&b.addr, &c) {
                let end: Lsn = p["end_lsn"].as_str().unwrap().parse().unwrap();
                if end > signal && p.get("snapshot").is_none() {
                    break;
                }
            }
            sink.assert_running(label);
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{label}: the signal for {slot} not passed in 60 s:\n{}",
                sink.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        read_all(&b.addr, &[&topic("st")], "read_committed").len()
    };
    assert_eq!(
        signal_and_wait("another"),
        0,
        "{label}: a signal for another slot was acted on"
    );
    assert_eq!(
        signal_and_wait("kslot"),
        7,
        "{label}: the signal for this slot was not"
    );
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed:\n{log}");
    assert!(
        log.contains("snapshot signal for another slot's sink; ignored"),
        "{label}: no word of the ignored signal:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!("{label}: the signal for another slot ignored, the one for kslot snapshotted 7 rows");
}

/// With `--kafka-avro` the size limit applies to the Avro record, not to
/// the Connect JSON it is converted from: a row with 800 kB of bytea
/// (about 1.07 MB as base64 JSON with its schema, about 800 kB in Avro)
/// is written, snapshotted and streamed, under the default limit of
/// 1,000,000 bytes. Before, it was refused as too large (exit 5).
#[test]
fn kafka_sink_avro_sizes_records_as_avro() {
    if !broker::have_java() || !broker::have_registry() {
        eprintln!("NOTICE: no java or no schema registry; the Kafka Avro test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().find(|(l, _)| *l == "pg18") else {
        eprintln!("NOTICE: no PostgreSQL 18; skipped");
        return;
    };
    let _one = one_broker();
    let b = Broker::start("avro-size");
    let registry = broker::Registry::start("avro-size");
    let kafka = broker::sink_args(&b.addr, &[]);
    let (c, logs) = cluster_with_kslot_for(
        label,
        &bin,
        "avro-size",
        Options::default(),
        "CREATE TABLE blob (id int PRIMARY KEY, raw bytea);
         ALTER TABLE blob ALTER COLUMN raw SET STORAGE EXTERNAL;
         INSERT INTO blob SELECT 1, decode(string_agg(md5(g::text), ''), 'hex')
             FROM generate_series(1, 50000) g;
         CREATE PUBLICATION p FOR TABLE blob;",
    );
    let avro = ["--kafka-avro", "--kafka-schema-registry", &registry.url];
    // snapshotted, then an insert streamed
    let sink = start_sink(&c, &kafka, &logs, 0, &[&avro[..], &["--snapshot"]].concat());
    wait_for_log(&sink, 0, "snapshot finished", Duration::from_secs(120));
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: the snapshot run failed:\n{log}");
    c.psql("INSERT INTO blob SELECT 2, raw FROM blob WHERE id = 1;");
    let end = c.insert_lsn();
    let (code, log) = start_sink(
        &c,
        &kafka,
        &logs,
        1,
        &[&avro[..], &["--stop-lsn", &end.to_string()]].concat(),
    )
    .wait_code(Duration::from_secs(120));
    assert_eq!(code, Some(0), "{label}: the streaming run failed:\n{log}");
    let records = read_all(&b.addr, &[&topic("blob")], "read_committed");
    let sizes: Vec<usize> = records
        .iter()
        .map(|r| r.value.as_ref().map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes.len(), 2, "{label}: {} records", sizes.len());
    assert!(
        sizes.iter().all(|n| (800_000..1_000_000).contains(n)),
        "{label}: Avro values of {sizes:?} bytes"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: two 800 kB bytea rows written in Avro ({sizes:?} bytes), a snapshot and a change"
    );
}

/// The verdicts on a snapshot test's topics once the sink caught up to
/// `end`: every change of the reference stream (slot `ref` on
/// `stream_from`) exactly once, each row read at most once per snapshot
/// (the FULL table's twice: a signal snapshots it again), at least 90 %
/// of the first table's rows read, and the copies built from the records
/// equal to `source`'s tables. Returns the numbers of read records and
/// changes.
fn check_snapshot_topics(
    label: &str,
    stream_from: &Cluster,
    source: &Cluster,
    addr: &str,
    tables: &[(String, Vec<&str>)],
    end: Lsn,
) -> (usize, usize) {
    let topics: Vec<String> = tables.iter().map(|(t, _)| topic(t)).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let committed = read_all(addr, &topics, "read_committed");
    let (reads, changes): (Vec<&Consumed>, Vec<&Consumed>) = committed.iter().partition(|r| {
        r.value
            .as_deref()
            .is_some_and(|v| serde_json::from_slice::<Value>(v).unwrap()["op"] == "r")
    });
    // every change of the stream exactly once
    let mut seen: HashMap<Change, u32> = HashMap::new();
    for r in &changes {
        *seen
            .entry(comparable(
                &r.topic,
                r.key.as_deref(),
                r.value.as_deref().unwrap(),
            ))
            .or_default() += 1;
    }
    let mut expected: HashMap<Change, u32> = HashMap::new();
    for ch in reference(stream_from, end) {
        *expected.entry(ch).or_default() += 1;
    }
    let missing = expected.keys().filter(|k| !seen.contains_key(*k)).count();
    let extra = seen.keys().filter(|k| !expected.contains_key(*k)).count();
    assert!(
        missing == 0 && extra == 0 && seen == expected,
        "{label}: {missing} changes of the reference stream not in Kafka, {extra} in Kafka \
         not in it (or some twice)"
    );
    // each row read at most once per snapshot (the FULL table twice)
    let mut read_count: HashMap<(&str, &[u8]), u32> = HashMap::new();
    for r in &reads {
        *read_count
            .entry((&r.topic, r.key.as_deref().unwrap()))
            .or_default() += 1;
    }
    for ((topic, key), n) in &read_count {
        let most = if topic.contains(".full_") { 2 } else { 1 };
        assert!(
            *n <= most,
            "{label}: {topic} row {} read {n} times",
            String::from_utf8_lossy(key)
        );
    }
    let reads_of = |t: &str| reads.iter().filter(|r| r.topic == topic(t)).count();
    // the rows there at the start and never touched are all read
    assert!(
        reads_of(&tables[0].0) as u64 > SNAPSHOT_ROWS * 9 / 10,
        "{label}: only {} rows of {} read",
        reads_of(&tables[0].0),
        tables[0].0
    );
    // the copies equal the tables
    let copy = materialize(&committed);
    for (table, key) in tables {
        let src = keyed_rows(source, table, key);
        let empty = BTreeMap::new();
        let got = copy.get(&topic(table)).unwrap_or(&empty);
        let differ: Vec<String> = src
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: source {v}, copy {:?}", got.get(k)))
            .chain(
                got.keys()
                    .filter(|k| !src.contains_key(*k))
                    .map(|k| format!("{k}: in the copy only")),
            )
            .collect();
        assert!(
            differ.is_empty(),
            "{label}: {} rows of {table} differ, e.g.:\n{}",
            differ.len(),
            differ
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    (reads.len(), changes.len())
}

/// The numbers in `log`'s last summary of snapshot chunks read-only and
/// read again ("... chunks (R read-only, A read again)").
fn chunks_read_only_and_again(log: &str) -> (u64, u64) {
    let numbers: Vec<u64> = log
        .rsplit(" chunks (")
        .next()
        .and_then(|s| s.split(')').next())
        .map(|s| {
            s.split(',')
                .filter_map(|p| p.split_whitespace().next()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    match numbers[..] {
        [read_only, again] => (read_only, again),
        _ => panic!("no snapshot summary in the log:\n{log}"),
    }
}

/// A transaction whose commit the stream carries while the server still
/// hides it (a synchronous standby has not confirmed it): a chunk read
/// then must not be written, or the row's older state would follow its
/// newer one into Kafka. The sink reads the chunk again until the commit is
/// visible; the copy then has the newer state. A PREPARE TRANSACTION that
/// waited for the standby too stays in progress after its wait, until its
/// COMMIT PREPARED: the snapshot must not wait for it (the stream carries
/// it at COMMIT PREPARED, after the chunk's older state). Returns how often
/// the chunk was read again.
fn snapshot_behind_a_held_commit(
    label: &str,
    c: &Cluster,
    addr: &str,
    kafka: &[String],
    logs: &Path,
    n: usize,
    mode: &[&str],
) -> u64 {
    let table = format!("held_{label}");
    let t = Instant::now();
    let phase = |what: &str| eprintln!("{label}: held: {:6.1} s {what}", t.elapsed().as_secs_f64());
    c.psql(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, ver int NOT NULL);
         INSERT INTO {table} SELECT g, 1 FROM generate_series(1, 1000) g;
         ALTER PUBLICATION p ADD TABLE {table};
         ALTER SYSTEM SET synchronous_standby_names = 'ghost';
         SELECT pg_reload_conf();"
    ));
    // waits for a standby that is not there
    while c.query("SHOW synchronous_standby_names") != "ghost" {
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = c.psql_in_background(format!(
        "SET synchronous_commit = on; UPDATE {table} SET ver = 2 WHERE id = 5;"
    ));
    let held_prepare = c.psql_in_background(format!(
        "SET synchronous_commit = on; BEGIN; UPDATE {table} SET ver = 4 WHERE id = 9; \
         PREPARE TRANSACTION 'held_{label}';"
    ));
    let t0 = Instant::now();
    while c.query("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") != "2" {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{label}: the commit and the PREPARE did not wait"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    phase("a commit and a PREPARE wait for the standby");
    // no heartbeats: on this idle server a read-only chunk's window can
    // end only through the position requests (without them it never does)
    let mut sink = start_sink(
        c,
        kafka,
        logs,
        n,
        &[
            &[
                "--kafka-snapshot-chunk-rows",
                "500",
                "--kafka-heartbeat-secs",
                "0",
            ],
            mode,
        ]
        .concat(),
    );
    sink.wait_streaming();
    phase("streaming");
    let signal: Lsn = c
        .query(&format!(
            "SET synchronous_commit = local; \
             SELECT pg_logical_emit_message(true, 'pgwal.snapshot', '{{\"tables\": [\"public.{table}\"]}}')"
        ))
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // the snapshot cannot move while the update is hidden
    let t0 = Instant::now();
    loop {
        let p = kafka_progress_value(addr, c).unwrap();
        let end: Lsn = p["end_lsn"].as_str().unwrap().parse().unwrap();
        if end > signal {
            assert_eq!(
                p["snapshot"]["rows"], 0,
                "{label}: the snapshot wrote rows while a commit it saw in the stream was hidden"
            );
            if t0.elapsed() > Duration::from_secs(3) {
                break;
            }
        }
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the signal was not committed to Kafka in 60 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    phase("the snapshot waited");
    // a second commit the standby holds, written while the snapshot runs:
    // its row must be left out of the chunk, and the snapshot go on
    let held_too = c.psql_in_background(format!(
        "SET synchronous_commit = on; SET application_name = 'held_too'; \
         UPDATE {table} SET ver = 3 WHERE id = 7;"
    ));
    let t0 = Instant::now();
    while !read_all(addr, &[&topic(&table)], "read_committed")
        .iter()
        .any(|r| r.key.as_deref() == Some(br#"{"id":7}"#.as_slice()))
    {
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the second held commit did not reach Kafka in 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    phase("a second held commit is in Kafka");
    // the standby "confirms" the first and the PREPARE: the commit becomes
    // visible, the prepared transaction stays in progress
    c.psql(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity \
         WHERE wait_event = 'SyncRep' AND application_name <> 'held_too';",
    );
    held.join().unwrap();
    held_prepare.join().unwrap();
    assert_eq!(
        c.query(&format!(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'held_{label}'"
        )),
        "1",
        "{label}: the PREPARE did not complete"
    );
    let t0 = Instant::now();
    while kafka_progress_value(addr, c).is_some_and(|p| p.get("snapshot").is_some()) {
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the snapshot did not end in 60 s after the commit became visible:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    phase("the snapshot ended, the second commit still held, the transaction still prepared");
    c.psql(
        "ALTER SYSTEM RESET synchronous_standby_names; SELECT pg_reload_conf();
         SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep';",
    );
    held_too.join().unwrap();
    c.psql(&format!(
        "SET synchronous_commit = local; COMMIT PREPARED 'held_{label}';"
    ));
    let t0 = Instant::now();
    while !read_all(addr, &[&topic(&table)], "read_committed")
        .iter()
        .any(|r| {
            r.key.as_deref() == Some(br#"{"id":9}"#.as_slice())
                && r.value.as_deref().is_some_and(|v| {
                    serde_json::from_slice::<Value>(v).unwrap()["after"]["ver"] == 4
                })
        })
    {
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the committed prepared transaction did not reach Kafka in 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // a table without a key is left out, and the sink goes on
    c.psql(&format!(
        "CREATE TABLE nokey_{label} (v int); INSERT INTO nokey_{label} VALUES (1);
         ALTER PUBLICATION p ADD TABLE nokey_{label};
         SELECT pg_logical_emit_message(true, 'pgwal.snapshot', '{{\"tables\": [\"public.nokey_{label}\"]}}');"
    ));
    let t0 = Instant::now();
    while !sink.log().contains("left out of the snapshot") {
        sink.assert_running(label);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: a table without a key was not left out in 60 s:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        sink.log()
            .contains(&format!("public.nokey_{label} cannot be snapshotted")),
        "{label}: the error does not name the table:\n{}",
        sink.log()
    );
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");
    phase("pgwal stopped");
    let records = read_all(addr, &[&topic(&table)], "read_committed");
    let copy = materialize(&records);
    let copy = copy.get(&topic(&table)).expect("records of the table");
    assert_eq!(copy.len(), 1000, "{label}");
    assert_eq!(
        copy[r#"{"id":5}"#]["ver"], 2,
        "{label}: the row's state from before the hidden commit was written after it"
    );
    assert_eq!(
        copy[r#"{"id":7}"#]["ver"], 3,
        "{label}: the row of the commit held while the snapshot ran was read in its older state"
    );
    assert_eq!(
        copy[r#"{"id":9}"#]["ver"], 4,
        "{label}: the prepared transaction's row is not in its committed state"
    );
    let reads = records
        .iter()
        .filter(|r| {
            r.value
                .as_deref()
                .is_some_and(|v| serde_json::from_slice::<Value>(v).unwrap()["op"] == "r")
        })
        .count();
    assert_eq!(reads, 999, "{label}: every row but the held one read once");
    let (read_only, rereads) = chunks_read_only_and_again(&log);
    assert!(rereads > 0, "{label}: no chunk was read again:\n{log}");
    if mode.contains(&"--kafka-snapshot-read-only") {
        assert!(read_only > 0, "{label}: no chunk was read-only:\n{log}");
    } else {
        assert_eq!(read_only, 0, "{label}: a chunk was read-only:\n{log}");
    }
    rereads
}

/// The server for the three-broker tests (the patched 18), or `None` (and
/// a notice) where they cannot run: no JDK for Kafka, or no 18.
fn three_broker_setting() -> Option<(&'static str, PathBuf)> {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the three-broker test is skipped");
        return None;
    }
    let found = support::servers().into_iter().find(|(l, _)| *l == "pg18");
    if found.is_none() {
        eprintln!("NOTICE: no PostgreSQL 18; the three-broker test is skipped");
    }
    found
}

/// How many lines of `log` contain `what`.
fn count_lines(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

/// The faults of the three-broker suite, each one that a production Kafka
/// cluster meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum BrokerFault {
    /// SIGKILL of the progress partition's leader; Kafka's progress must
    /// move on without it before it comes back.
    KillProgressLeader,
    /// SIGKILL of the leader of a data topic's partition.
    KillDataLeader,
    /// SIGSTOP of the progress partition's leader for 12 s: silent with its
    /// connections open, as behind a partition; the controller fences it and
    /// the in-sync replicas shrink without it.
    PauseProgressLeader,
    /// SIGTERM of the progress partition's leader: a controlled shutdown,
    /// whose leaderships move first.
    StopProgressLeader,
    /// SIGKILL of the node leading the controller quorum.
    KillActiveController,
    /// Two nodes SIGKILLed: the in-sync replicas fall below
    /// `min.insync.replicas`, and no write can commit until one is back.
    BelowMinInsync,
    /// The progress and data partitions' leaders moved by a preferred
    /// election, without a failure.
    MoveLeaders,
    /// pgwal SIGKILLed with the slot behind Kafka, the progress partition's
    /// leader SIGSTOPped, and pgwal started again at once, its calls
    /// limited to 4 s. In the runs so far its start waited on the
    /// transaction log (whose replicas include the silent node) until the
    /// controller had fenced it, so its read of Kafka's position never met
    /// the silent leader; the read's own test is
    /// `kafka_sink_waits_for_a_progress_partition_without_a_leader`.
    RestartWithSilentProgressLeader,
}

const BROKER_FAULTS: [BrokerFault; 8] = [
    BrokerFault::KillProgressLeader,
    BrokerFault::KillDataLeader,
    BrokerFault::PauseProgressLeader,
    BrokerFault::StopProgressLeader,
    BrokerFault::KillActiveController,
    BrokerFault::BelowMinInsync,
    BrokerFault::MoveLeaders,
    BrokerFault::RestartWithSilentProgressLeader,
];

/// The faults to inject, `n` of them: every kind once in each run of eight,
/// in an order drawn from `seed`.
fn draw_faults(seed: u64, n: usize) -> Vec<BrokerFault> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut out = Vec::new();
    while out.len() < n {
        let mut round = BROKER_FAULTS.to_vec();
        for i in (1..round.len()).rev() {
            round.swap(i, next() % (i + 1));
        }
        out.extend(round);
    }
    out.truncate(n);
    out
}

const CLUSTER_TXN_ID: &str = "pgwal-cluster-test";

/// Waits until Kafka's progress is past `before`, or the load is over. A
/// read that fails (the progress partition between leaders) is tried
/// again; after 180 s the cluster's state and pgwal's log are shown.
fn wait_progress_past(
    k: &KafkaCluster,
    progress_partition: i32,
    before: Option<Lsn>,
    sink: &Sink,
    load_over: &AtomicBool,
    what: &str,
) {
    let t0 = Instant::now();
    loop {
        let last = match broker::read_partitions(
            &k.addr,
            &[(PROGRESS, progress_partition)],
            "read_committed",
            Duration::from_secs(20),
        ) {
            Ok(records) => {
                let now = records.last().map(|r| {
                    let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
                    v["end_lsn"].as_str().unwrap().parse::<Lsn>().unwrap()
                });
                if now > before {
                    return;
                }
                format!("at {now:?}")
            }
            Err(e) => e,
        };
        if load_over.load(Ordering::SeqCst) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "{what}: Kafka's progress stayed at {before:?} for 180 s (the last read: {last}); \
             the progress partition's leader and in-sync replicas: {:?}, the data partition's: {:?}; \
             pgwal's log:\n{}",
            k.partition_leader(PROGRESS, progress_partition),
            k.leader(&topic("items")),
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Waits until `topic`'s partition has a leader and all three replicas in
/// sync: the state every fault starts from.
fn wait_healthy(k: &KafkaCluster, topic: &str, partition: i32) {
    let t0 = Instant::now();
    loop {
        if let Some((_, isr)) = k.partition_leader(topic, partition) {
            if isr.len() == 3 {
                return;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{topic} [{partition}]: not all three replicas in sync within 120 s ({:?})",
            k.partition_leader(topic, partition)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The sink on a cluster of three brokers through `faults` faults drawn
/// from `seed`, under the mixed load, with an initial snapshot (of tables
/// still empty, so a snapshot taken again would show as records of its
/// own): every change exactly once, none read again by a snapshot.
fn exactly_once_on_three_brokers(label: &'static str, bin: &Path, seed: u64, faults: usize) {
    let _one = one_broker();
    let t = Instant::now();
    let phase = |what: &str| eprintln!("{label}: {:6.1} s {what}", t.elapsed().as_secs_f64());
    let k = KafkaCluster::start(label);
    let kafka = broker::sink_args(&k.addr, &[]);
    let c = Cluster::start(
        label,
        bin,
        Options {
            conf: vec![
                "logical_decoding_work_mem = '64kB'".into(),
                "wal_sender_timeout = 0".into(),
            ],
            ..Options::default()
        },
    );
    phase("three brokers and the server started");
    let logs = setup_with_reference(&c, label, "cluster");
    let args = [
        "--status-interval",
        "600",
        "--kafka-heartbeat-secs",
        "0.5",
        "--snapshot",
        "--kafka-transactional-id",
        CLUSTER_TXN_ID,
    ];
    let mut n = 0;
    let mut sink = start_sink(&c, &kafka, &logs, n, &args);
    sink.wait_streaming();
    // the snapshot of the empty tables ends before the load begins, so
    // that no row is ever read by a snapshot
    wait_for_log(&sink, 0, "snapshot finished", Duration::from_secs(60));
    // two rounds a second, for as long as the faults take (each a minute or
    // two at most): Kafka's progress must move under every fault
    let load = Load::start_paced(
        &c,
        Duration::from_millis(500),
        u64::MAX,
        Duration::from_secs(180 * faults as u64 + 300),
    );
    let load_over = load.over.clone();
    // the progress topic's partition this stream writes to (the sink made
    // the topic): the only one read while nodes are down, as the sink does
    let sysid = c.query("SELECT system_identifier FROM pg_control_system()");
    let pp = pgwal_kafka::progress::partition(
        &pgwal_kafka::progress::key(sysid.trim(), "kslot"),
        k.partitions(PROGRESS),
    );
    wait_progress_in(&k.addr, Some(pp), &sink, &load_over);
    let data = topic("items");
    wait_healthy(&k, PROGRESS, pp);
    wait_healthy(&k, &data, 0);
    phase("streaming into Kafka");
    let plan = draw_faults(seed, faults);
    // how often a restarted pgwal found the progress partition's end
    // unknown and asked again
    let mut asked_again = 0;
    for (i, fault) in plan.iter().enumerate() {
        let what = format!("{label} fault {i} ({fault:?})");
        let before = kafka_progress_in(&k.addr, Some(pp));
        let (progress_leader, _) = k
            .partition_leader(PROGRESS, pp)
            .expect("the progress partition has a leader");
        match fault {
            BrokerFault::KillProgressLeader | BrokerFault::KillDataLeader => {
                let (t, partition) = if *fault == BrokerFault::KillDataLeader {
                    (data.as_str(), 0)
                } else {
                    (PROGRESS, pp)
                };
                let (leader, _) = k.partition_leader(t, partition).unwrap();
                k.kill(leader);
                wait_progress_past(&k, pp, before, &sink, &load_over, &what);
                k.restart(leader);
            }
            BrokerFault::PauseProgressLeader => {
                k.pause(progress_leader);
                std::thread::sleep(Duration::from_secs(12));
                k.resume(progress_leader);
                wait_progress_past(&k, pp, before, &sink, &load_over, &what);
            }
            BrokerFault::StopProgressLeader => {
                k.stop(progress_leader);
                wait_progress_past(&k, pp, before, &sink, &load_over, &what);
                k.restart(progress_leader);
            }
            BrokerFault::KillActiveController => {
                let active = k
                    .active_controller()
                    .expect("a controller leads the quorum");
                k.kill(active);
                wait_progress_past(&k, pp, before, &sink, &load_over, &what);
                k.restart(active);
            }
            BrokerFault::BelowMinInsync => {
                let others: Vec<i32> = (1..=3).filter(|x| *x != progress_leader).collect();
                let (a, b) = (others[0], others[1]);
                k.kill(a);
                k.kill(b);
                // nothing can commit now; the sink retries
                std::thread::sleep(Duration::from_secs(8));
                let stalled = kafka_progress_in(&k.addr, Some(pp));
                k.restart(a);
                wait_progress_past(&k, pp, stalled.max(before), &sink, &load_over, &what);
                k.restart(b);
            }
            BrokerFault::MoveLeaders => {
                let to = progress_leader % 3 + 1;
                k.move_partition_leader(PROGRESS, pp, to);
                let (data_leader, _) = k.leader(&data).unwrap();
                k.move_leader(&data, data_leader % 3 + 1);
                wait_progress_past(&k, pp, before, &sink, &load_over, &what);
            }
            BrokerFault::RestartWithSilentProgressLeader => {
                // a progress leader that is not also the transaction
                // coordinator: else the new pgwal waits for the
                // coordinator to move, and by then the leader moved too
                let coordinator = k.transaction_coordinator(CLUSTER_TXN_ID);
                if coordinator == Some(progress_leader) {
                    let to = (1..=3).find(|x| Some(*x) != coordinator).unwrap();
                    k.move_partition_leader(PROGRESS, pp, to);
                }
                let (leader, _) = k.partition_leader(PROGRESS, pp).unwrap();
                let behind = sink.kill_with_slot_behind(&c, &k.addr, Some(pp), &load_over);
                assert!(behind, "{what}: Kafka never got ahead of the slot in 60 s");
                k.pause(leader);
                // calls limited to 4 s, shorter than the controller takes
                // to fence the silent leader (6 s)
                n += 1;
                let short = [&args[..], &["--kafka-timeout-secs", "4"]].concat();
                sink = start_sink(&c, &kafka, &logs, n, &short);
                sink.wait_streaming();
                wait_progress_past(&k, pp, before, &sink, &load_over, &what);
                k.resume(leader);
                let (ok, log) = sink.terminate();
                assert!(ok, "{what}: pgwal failed on SIGTERM:\n{log}");
                asked_again += count_lines(&log, "the progress topic's end is not known yet");
                n += 1;
                sink = start_sink(&c, &kafka, &logs, n, &args);
                sink.wait_streaming();
            }
        }
        sink.assert_running(&what);
        assert!(
            !load_over.load(Ordering::SeqCst),
            "{what}: the load ended before the fault did"
        );
        wait_healthy(&k, PROGRESS, pp);
        wait_healthy(&k, &data, 0);
        let t0 = Instant::now();
        while !k.quorum_caught_up() {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{what}: the three controllers did not catch up within 120 s"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        phase(&format!(
            "fault {i}: {fault:?}, and Kafka's progress moved on"
        ));
    }
    let load_rounds = load.finish();
    phase("load finished");
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");
    let end: Lsn = c.query("SELECT pg_current_wal_lsn()").parse().unwrap();
    let (ok, last_log) = start_sink(
        &c,
        &kafka,
        &logs,
        n + 1,
        &[&args[..], &["--stop-lsn", &end.to_string()]].concat(),
    )
    .wait(Duration::from_secs(300));
    assert!(ok, "{label}: the catch-up run failed:\n{last_log}");
    phase("caught up");
    let (committed, uncommitted) = check_exactly_once(label, &c, &k.addr, end);
    let topics: Vec<String> = TABLES.iter().map(|t| topic(t)).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let reads = read_all(&k.addr, &topics, "read_committed")
        .iter()
        .filter(|r| {
            serde_json::from_slice::<Value>(r.value.as_deref().unwrap_or(b"null"))
                .is_ok_and(|v| v["op"] == "r")
        })
        .count();
    assert_eq!(
        reads, 0,
        "{label}: a snapshot was taken again after a fault"
    );
    let restarts: u64 = (0..=n + 1)
        .map(|i| {
            count_in(
                &std::fs::read_to_string(logs.join(format!("pgwal-{i}.log"))).unwrap_or_default(),
                "restarts after Kafka errors",
            )
        })
        .sum();
    phase("checked");
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: seed {seed}: {faults} broker faults ({:?}), {load_rounds} load rounds, \
         {committed} records read_committed, {uncommitted} read_uncommitted, 0 duplicates, \
         0 lost, no snapshot again; {restarts} session restarts after Kafka errors; \
         the progress partition's end asked again {asked_again} times at restarts without its leader",
        plan
    );
}

/// The sink on three brokers (each also a controller) through leader
/// kills, pauses and moves, a controlled shutdown, the controller's loss,
/// in-sync replicas below the minimum, and its own restart without the
/// progress partition's leader. PGWAL_KAFKA_FAULTS sets how many (4 by
/// default, half of the kinds, which the seed picks; 8 run each once),
/// PGWAL_KAFKA_SEED their order (else drawn from the clock and printed).
#[test]
fn kafka_sink_exactly_once_through_broker_faults() {
    let faults = std::env::var("PGWAL_KAFKA_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let seed = std::env::var("PGWAL_KAFKA_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    eprintln!("kafka_sink_exactly_once_through_broker_faults: PGWAL_KAFKA_SEED={seed} PGWAL_KAFKA_FAULTS={faults}");
    let Some((label, bin)) = three_broker_setting() else {
        return;
    };
    exactly_once_on_three_brokers(label, &bin, seed, faults);
}

#[test]
fn broker_faults_are_drawn_each_once_per_eight() {
    let plan = draw_faults(7, 16);
    for half in plan.chunks(8) {
        let kinds: std::collections::HashSet<_> = half.iter().collect();
        assert_eq!(kinds.len(), 8, "{plan:?}");
    }
    assert_ne!(draw_faults(7, 8), draw_faults(8, 8));
}

/// The ids of `items` rows in the records of its topic, by Debezium op.
fn items_by_op(addr: &str) -> BTreeMap<String, Vec<i64>> {
    let mut by_op: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in read_all(addr, &[&topic("items")], "read_committed") {
        let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let op = v["op"].as_str().unwrap().to_owned();
        by_op
            .entry(op)
            .or_default()
            .push(v["after"]["id"].as_i64().unwrap());
    }
    by_op
}

/// A progress partition without any leader (made by hand with one replica,
/// whose broker is down) while the rest of the cluster works: a restarted
/// sink asks for its end again, starting its session over, and waits; it
/// neither writes again what Kafka holds nor snapshots again. Before, the
/// failed query read as "Kafka holds nothing of this stream": the restart
/// snapshotted every table again and wrote from the slot's position.
#[test]
fn kafka_sink_waits_for_a_progress_partition_without_a_leader() {
    let Some((label, bin)) = three_broker_setting() else {
        return;
    };
    let _one = one_broker();
    let k = KafkaCluster::start("leaderless");
    k.create_topic(
        PROGRESS,
        &[
            "--replica-assignment",
            "3",
            "--config",
            "cleanup.policy=compact",
        ],
    );
    let (c, logs) = cluster_with_kslot(label, &bin, "leaderless");
    c.psql("INSERT INTO items SELECT g, 1, 'before' FROM generate_series(1, 50) g");
    let kafka = broker::sink_args(&k.addr, &[]);
    let args = ["--snapshot"];
    let wait_items = |n: usize, sink: &Sink| {
        let t0 = Instant::now();
        loop {
            let got: usize = items_by_op(&k.addr).values().map(Vec::len).sum();
            if got >= n {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{got} of {n} items records in Kafka after 120 s; pgwal's log:\n{}",
                sink.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let sink = start_sink(&c, &kafka, &logs, 0, &args);
    sink.wait_streaming();
    // the snapshot in Kafka before more rows come (a session that failed
    // before its commit would snapshot them too)
    wait_items(50, &sink);
    c.psql("INSERT INTO items SELECT g, 1, 'streamed' FROM generate_series(51, 60) g");
    wait_items(60, &sink);
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");

    // the progress partition's only replica down, once the last commit's
    // marker is written there (else the coordinator holds the stream's
    // transactional id until it is, and the restart waits for that first)
    broker::wait_stable(&k.addr, PROGRESS);
    k.kill(3);
    // calls limited to 4 s: each session's try ends soon
    let sink = start_sink(
        &c,
        &kafka,
        &logs,
        1,
        &["--snapshot", "--kafka-timeout-secs", "4"],
    );
    c.psql("INSERT INTO items SELECT g, 1, 'while leaderless' FROM generate_series(61, 70) g");
    wait_for_log(
        &sink,
        0,
        "its end could not be read",
        Duration::from_secs(120),
    );
    std::thread::sleep(Duration::from_secs(5));
    let log = sink.log();
    assert!(
        !log.contains("streaming into Kafka") && !log.contains("Kafka holds nothing"),
        "{label}: pgwal went on without knowing Kafka's position:\n{log}"
    );
    let tries = count_lines(&log, "its end could not be read");
    k.restart(3);
    sink.wait_streaming();
    wait_items(70, &sink);
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: pgwal failed on SIGTERM:\n{log}");

    let by_op = items_by_op(&k.addr);
    let reads: Vec<i64> = by_op.get("r").cloned().unwrap_or_default();
    let creates: Vec<i64> = by_op.get("c").cloned().unwrap_or_default();
    assert_eq!(
        reads,
        (1..=50).collect::<Vec<_>>(),
        "{label}: the snapshot's rows, each once (a second snapshot repeats them)"
    );
    // the slot was made before the first rows: all 70 inserts stream
    assert_eq!(
        creates,
        (1..=70).collect::<Vec<_>>(),
        "{label}: the inserts, each once"
    );
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: a restart with the progress partition leaderless tried {tries} sessions, \
         then went on once its broker was back: 50 snapshot rows and 70 inserts, each once"
    );
}

/// A second sink started on a slot another one streams from waits for the
/// slot's lock and fences nobody: the first runs on without a single Kafka
/// restart, the second takes over when the first stops, and Kafka holds
/// every change once. (Before the lock, the second's producer fenced the
/// first before it could own the slot, and the two took turns aborting
/// each other's transactions.)
#[test]
fn kafka_sink_second_instance_waits_without_fencing_the_first() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the second-instance test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start(label);
    let kafka = broker::sink_args(&b.addr, &[]);
    let c = Cluster::start(label, &bin, Options::default());
    let logs = setup_with_reference(&c, label, "second");
    let load = Load::start(&c);

    let first = start_sink(&c, &kafka, &logs, 0, &[]);
    first.wait_streaming();
    wait_progress(&b.addr, &first, &load.over);
    let mut second = start_sink(&c, &kafka, &logs, 1, &[]);
    let t0 = Instant::now();
    while !second.log().contains("another sink holds this slot") {
        second.assert_running("the second sink");
        assert_eq!(
            count_lines(&first.log(), "Kafka failed; starting over"),
            0,
            "{label}: the second sink fenced the first:\n{}\nthe second:\n{}",
            first.log(),
            second.log()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the second sink never said it waits for the slot:\n{}",
            second.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // a while of both running: the first keeps committing, unfenced
    let waited = Instant::now();
    for _ in 0..3 {
        wait_progress(&b.addr, &first, &load.over);
        std::thread::sleep(Duration::from_secs(2));
    }
    let waited = waited.elapsed();
    assert_eq!(
        count_lines(&first.log(), "Kafka failed; starting over"),
        0,
        "{label}: the first sink started over while the second waited (fenced?):\n{}",
        first.log()
    );
    assert!(
        !second.log().contains("streaming into Kafka"),
        "{label}: the second sink streamed while the first held the slot:\n{}",
        second.log()
    );
    // the first stops; the second takes the slot and goes on from Kafka
    let (ok, log) = first.terminate();
    assert!(ok, "{label}: the first sink failed on SIGTERM:\n{log}");
    let stopped = Instant::now();
    second.wait_streaming();
    let took_over = stopped.elapsed();
    assert!(
        second.log().contains("this sink takes over"),
        "{label}:\n{}",
        second.log()
    );
    wait_progress(&b.addr, &second, &load.over);
    let rounds = load.finish();
    let (ok, log) = second.terminate();
    assert!(ok, "{label}: the second sink failed on SIGTERM:\n{log}");
    let end: Lsn = c.query("SELECT pg_current_wal_lsn()").parse().unwrap();
    let (ok, last_log) = start_sink(&c, &kafka, &logs, 2, &["--stop-lsn", &end.to_string()])
        .wait(Duration::from_secs(300));
    assert!(ok, "{label}: the catch-up run failed:\n{last_log}");
    let (committed, _) = check_exactly_once(label, &c, &b.addr, end);
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: {rounds} load rounds, {committed} records, 0 duplicates; the second sink \
         waited {:.1} s beside the first without a restart of either, and streamed {:.1} s \
         after the first stopped",
        waited.as_secs_f64(),
        took_over.as_secs_f64()
    );
}

/// A standby promoted before it received everything the sink wrote (no
/// `synchronized_standby_slots`): Kafka holds the stream on timeline 1
/// beyond the point where the standby's timeline 2 forked. Started against
/// it, the sink refuses (exit 3) instead of starting at Kafka's position
/// and skipping the new primary's transactions below it: first while the
/// promoted server's WAL is still short of Kafka's position, then again
/// once it has written past it, which only the timeline tells.
#[test]
fn kafka_sink_refuses_a_server_without_kafkas_position() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the timeline test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start(label);
    let kafka = broker::sink_args(&b.addr, &[]);
    let (primary, logs) = cluster_with_kslot(label, &bin, "timeline");
    let standby = primary.standby("to_standby", &[]);
    let load = Load::start(&primary);
    let sink = start_sink(&primary, &kafka, &logs, 0, &[]);
    sink.wait_streaming();
    wait_progress(&b.addr, &sink, &load.over);
    // the standby stops receiving; the sink writes on
    standby.psql("ALTER SYSTEM SET primary_conninfo = ''; SELECT pg_reload_conf();");
    let t0 = Instant::now();
    while standby.query("SELECT count(*) FROM pg_stat_wal_receiver") != "0" {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{label}: the walreceiver runs on"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let fork: Lsn = standby
        .query("SELECT pg_last_wal_receive_lsn()")
        .parse()
        .unwrap();
    while kafka_progress(&b.addr).is_none_or(|k| k.0 < fork.0 + (1 << 20)) {
        wait_progress(&b.addr, &sink, &load.over);
        assert!(
            !load.over.load(Ordering::SeqCst),
            "{label}: the load ended first"
        );
    }
    load.finish();
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: the sink failed on SIGTERM:\n{log}");
    let kafka_at = kafka_progress(&b.addr).unwrap();
    primary.crash();
    standby.promote();
    standby.psql("SELECT pg_create_logical_replication_slot('kslot', 'pgoutput')");
    let refused = |n: usize| {
        let (code, log) =
            start_sink(&standby, &kafka, &logs, n, &[]).wait_code(Duration::from_secs(120));
        assert_eq!(
            code,
            Some(3),
            "{label}: the sink against the promoted standby (forked at {fork}, Kafka at \
             {kafka_at}) did not refuse:\n{log}"
        );
        assert!(log.contains("which this server does not have"), "{log}");
        log
    };
    // its WAL ends below Kafka's position
    let below = standby.insert_lsn();
    assert!(below < kafka_at, "{label}: {below} {kafka_at}");
    let log = refused(1);
    assert!(log.contains("on timeline 1"), "{log}");
    // it writes past Kafka's position: only the timeline tells now
    let t0 = Instant::now();
    while standby.insert_lsn() <= kafka_at {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: WAL did not grow"
        );
        standby.psql("INSERT INTO scratch SELECT g, g FROM generate_series(1, 10000) g ON CONFLICT (id) DO UPDATE SET v = scratch.v + 1");
    }
    let log = refused(2);
    assert!(log.contains("and it left that timeline at"), "{log}");
    // nothing was acknowledged on the new primary's slot
    let slot: Lsn = standby
        .query("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'kslot'")
        .parse()
        .unwrap();
    assert!(slot < kafka_at, "{label}: the slot moved to {slot}");
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: the standby forked at {fork} (timeline 2), Kafka held timeline 1 up to \
         {kafka_at}; the sink refused it with its WAL at {below} and again past it"
    );
}

/// Another stream that died with a Kafka transaction open in the progress
/// topic does not hold this stream's start: each stream's records go to a
/// partition of its own (of the 32 a topic pgwal creates has), and a
/// read_committed read stops only at transactions open in the partition it
/// reads. (With every stream on one partition the start waited until the
/// broker aborted the other transaction, up to its timeout: 5 minutes by
/// default.)
#[test]
fn kafka_sink_start_does_not_wait_for_another_streams_open_transaction() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the progress-partition test is skipped");
        return;
    }
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let _one = one_broker();
    let b = Broker::start(label);
    let kafka = broker::sink_args(&b.addr, &[]);
    let c = Cluster::start(label, &bin, Options::default());
    let logs = setup_with_reference(&c, label, "other-stream");
    // the sink makes the progress topic
    let sink = start_sink(&c, &kafka, &logs, 0, &[]);
    sink.wait_streaming();
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: {log}");
    let sysid = c.query("SELECT system_identifier FROM pg_control_system()");
    let ours = pgwal_kafka::progress::partition(
        &pgwal_kafka::progress::key(sysid.trim(), "kslot"),
        pgwal_kafka::progress::PARTITIONS,
    );
    // another stream's transaction, left open in a partition of its own
    let theirs = (ours + 1) % pgwal_kafka::progress::PARTITIONS;
    let other: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &b.addr)
        .set("transactional.id", "another-stream")
        .set("transaction.timeout.ms", "180000")
        .create()
        .unwrap();
    other.init_transactions(Duration::from_secs(30)).unwrap();
    other.begin_transaction().unwrap();
    other
        .send(
            BaseRecord::to(PROGRESS)
                .partition(theirs)
                .key("another/stream")
                .payload(r#"{"end_lsn":"0/1"}"#),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    other.flush(Duration::from_secs(30)).unwrap();
    // this stream starts at once and writes on
    c.psql("INSERT INTO scratch VALUES (1, 1)");
    let t0 = Instant::now();
    let sink = start_sink(&c, &kafka, &logs, 1, &["--kafka-timeout-secs", "5"]);
    while !sink.log().contains("streaming into Kafka") {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the sink did not start within 60 s beside another stream's open \
             transaction in partition {theirs} (its own: {ours}):\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let started = t0.elapsed();
    // the slot is acknowledged only at positions Kafka committed (a
    // read_committed reader of the whole topic would wait for the other
    // transaction too)
    c.psql("INSERT INTO scratch VALUES (2, 2)");
    let end: Lsn = c.query("SELECT pg_current_wal_lsn()").parse().unwrap();
    let t0 = Instant::now();
    while kslot_position(&c) < end {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{label}: the slot was not acknowledged up to {end}:\n{}",
            sink.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (ok, log) = sink.terminate();
    assert!(ok, "{label}: {log}");
    other.abort_transaction(Duration::from_secs(30)).unwrap();
    let _ = std::fs::remove_dir_all(&logs);
    eprintln!(
        "{label}: started in {:.1} s beside another stream's open transaction (partition \
         {theirs}; this stream's: {ours})",
        started.as_secs_f64()
    );
}
