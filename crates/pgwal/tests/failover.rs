//! Failover of a logical stream: a real primary and hot standby with
//! `sync_replication_slots` and `synchronized_standby_slots` (17+), the
//! primary crashed under load, the standby promoted, and the stream, given
//! both hosts with `target_session_attrs=read-write`, carrying on there.
//! Also the refusal to resume on a slot that is ahead of what the consumer
//! confirmed: a promoted server's synced slot, or one moved while the
//! stream was reconnecting.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pgwal::{
    Config, CreateSlotOptions, Error, Event, LogicalStream, Lsn, ReplicationClient, RetryConfig,
    StreamConfig,
};
use support::{config, Cluster, Options};

const SETUP: &str = "
CREATE TABLE t (id bigserial PRIMARY KEY, v int);
CREATE PUBLICATION p FOR TABLE t;
";

/// The standby's extra settings: slot synchronisation needs the feedback
/// and a database in `primary_conninfo` (set by [`Cluster::standby`]).
const STANDBY_CONF: &[&str] = &["sync_replication_slots = on", "hot_standby_feedback = on"];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A primary whose logical walsenders wait for the standby's slot `sb`,
/// and its standby; `None` on servers without failover slots (before 17).
fn pair(label: &'static str, bin: &std::path::Path) -> Option<(Cluster, Cluster)> {
    let primary = Cluster::start(label, bin, Options::default());
    if primary.major < 17 {
        eprintln!("NOTICE: {label}: no failover slots before 17; skipped");
        return None;
    }
    primary.psql(SETUP);
    let standby = primary.standby("sb", STANDBY_CONF);
    // after the base backup, which would copy it to the standby
    primary.psql("ALTER SYSTEM SET synchronized_standby_slots = 'sb'; SELECT pg_reload_conf();");
    Some((primary, standby))
}

/// Both servers, the primary first; reconnects pick the writable one.
fn both_hosts(primary: &Cluster, standby: &Cluster) -> Config {
    format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres sslmode=disable \
         target_session_attrs=read-write application_name=pgwal_failover",
        primary.port, standby.port
    )
    .parse()
    .unwrap()
}

fn retrying(cfg: StreamConfig) -> StreamConfig {
    cfg.status_interval(Duration::from_millis(100)).retry(
        RetryConfig::default()
            .initial_backoff(Duration::from_millis(100))
            .max_backoff(Duration::from_millis(500))
            .max_attempts(Some(400)),
    )
}

/// Waits until the standby has the slot synchronised (persistent, not
/// temporary) with a confirmed position at or beyond `at`. The standby
/// keeps it temporary until the primary's slot has a catalog xmin it can
/// honour, which needs a decoded running-transactions record: `nudge`
/// (run every second) logs one, and moves the slot if the test needs that.
fn wait_synced(standby: &Cluster, slot: &str, at: Lsn, nudge: &dyn Fn()) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let row = standby.query(&format!(
            "SELECT synced AND NOT temporary, confirmed_flush_lsn FROM pg_replication_slots \
             WHERE slot_name = '{slot}'"
        ));
        if let Some(("t", lsn)) = row.split_once('|') {
            if lsn.parse::<Lsn>().unwrap() >= at {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "slot {slot} not synchronised to {at} on the standby: {row:?}"
        );
        nudge();
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn log_snapshot(primary: &Cluster) {
    primary.query("SELECT pg_log_standby_snapshot()");
}

/// The logical slot `s` on `c`, a failover slot if asked.
async fn make_slot(c: &Cluster, failover: bool) {
    let mut client = ReplicationClient::connect(&config(c, "postgres"))
        .await
        .unwrap();
    client
        .create_logical_slot("s", &CreateSlotOptions::new().failover(failover))
        .await
        .unwrap();
}

/// `pgbench` inserting small transactions into `t` for `secs` seconds
/// (it stops early, with an error, when the server goes away).
fn insert_load(c: &Cluster, dir: &std::path::Path, secs: u32) -> Child {
    let script: PathBuf = dir.join("insert.sql");
    std::fs::write(
        &script,
        "INSERT INTO t (v) SELECT g FROM generate_series(1, 3) g;\n",
    )
    .unwrap();
    Command::new(c.bin.join("pgbench"))
        .args(["-n", "-h", "127.0.0.1", "-U", "postgres", "-c", "2", "-T"])
        .arg(secs.to_string())
        .arg("-p")
        .arg(c.port.to_string())
        .arg("-f")
        .arg(&script)
        .arg("postgres")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// What the consumer saw.
#[derive(Default)]
struct Seen {
    /// Inserted ids, each with how often it was delivered.
    ids: HashMap<i64, u32>,
    /// Transactions delivered again whose commit was at or before a
    /// position already acknowledged when they arrived (must stay empty).
    redelivered_acked: Vec<(Lsn, Lsn)>,
    /// Transactions delivered again (unacknowledged ones, after a reconnect).
    redelivered: usize,
    reconnects: usize,
    acked: Lsn,
}

/// Reads the stream and acknowledges each transaction after recording it,
/// until the task is aborted or the stream ends.
async fn consume(mut s: LogicalStream, seen: Arc<Mutex<Seen>>) -> Option<Error> {
    let mut txn = Vec::new();
    loop {
        let e = match s.next().await {
            None => return None,
            Some(Err(e)) => return Some(e),
            Some(Ok(e)) => e,
        };
        match &e {
            Event::Reconnected { .. } => {
                txn.clear();
                seen.lock().unwrap().reconnects += 1;
            }
            Event::Begin(_) => txn.clear(),
            Event::Insert(ch) => txn.push(
                ch.new
                    .as_ref()
                    .unwrap()
                    .text("id")
                    .unwrap()
                    .parse::<i64>()
                    .unwrap(),
            ),
            Event::Commit(_) => {
                let lsn = e.ack_lsn().unwrap();
                let mut g = seen.lock().unwrap();
                let mut again = false;
                for id in txn.drain(..) {
                    let n = g.ids.entry(id).or_default();
                    *n += 1;
                    again |= *n > 1;
                }
                if again {
                    g.redelivered += 1;
                    if lsn <= g.acked {
                        let acked = g.acked;
                        g.redelivered_acked.push((lsn, acked));
                    }
                }
                g.acked = g.acked.max(lsn);
                drop(g);
                s.ack(lsn);
            }
            _ => {}
        }
    }
}

fn ids_in(c: &Cluster) -> BTreeSet<i64> {
    c.psql("SELECT id FROM t")
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// Waits until the consumer has seen every row of `c`'s table.
fn wait_caught_up(c: &Cluster, seen: &Mutex<Seen>) {
    let want = ids_in(c);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let have: BTreeSet<i64> = seen.lock().unwrap().ids.keys().copied().collect();
        if want.is_subset(&have) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the stream did not catch up: {} of {} rows",
            want.intersection(&have).count(),
            want.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Promotion under load: every row on the promoted server reached the
/// consumer, none that the promoted server lacks did (the primary waited
/// for the standby's slot), and only unacknowledged transactions came again.
#[test]
fn stream_follows_a_promotion_under_load() {
    for (label, bin) in support::servers() {
        let Some((primary, standby)) = pair(label, &bin) else {
            continue;
        };
        let rt = runtime();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stream = rt.block_on(async {
            make_slot(&primary, true).await;
            let cfg = retrying(StreamConfig::new("s", ["p"]));
            LogicalStream::start(both_hosts(&primary, &standby), cfg)
                .await
                .unwrap()
        });
        let consumer = rt.spawn(consume(stream, seen.clone()));
        primary.psql("INSERT INTO t (v) SELECT g FROM generate_series(1, 10) g");
        wait_caught_up(&primary, &seen);
        let acked = seen.lock().unwrap().acked;
        let deadline = Instant::now() + Duration::from_secs(30);
        while primary.confirmed_flush("s") < acked {
            assert!(Instant::now() < deadline, "{label}: ack not confirmed");
            std::thread::sleep(Duration::from_millis(100));
        }
        wait_synced(&standby, "s", acked, &|| log_snapshot(&primary));

        let mut load = insert_load(&primary, &primary.dir, 8);
        std::thread::sleep(Duration::from_secs(3));
        let before = seen.lock().unwrap().ids.len();
        primary.crash();
        let _ = load.wait();
        standby.promote();
        let mut load = insert_load(&standby, &standby.dir, 2);
        assert!(
            load.wait().unwrap().success(),
            "{label}: load on the promoted server"
        );
        wait_caught_up(&standby, &seen);
        consumer.abort();
        let _ = rt.block_on(consumer);

        let g = seen.lock().unwrap();
        let on_promoted = ids_in(&standby);
        let received: BTreeSet<i64> = g.ids.keys().copied().collect();
        let phantoms: Vec<_> = received.difference(&on_promoted).collect();
        eprintln!(
            "{label}: {before} rows before the crash, {} on the promoted server, {} received, \
             {} transactions delivered again, {} reconnects",
            on_promoted.len(),
            received.len(),
            g.redelivered,
            g.reconnects
        );
        assert!(
            before > 10,
            "{label}: no load reached the consumer before the crash"
        );
        assert!(g.reconnects >= 1, "{label}: the stream never reconnected");
        assert!(
            phantoms.is_empty(),
            "{label}: {} rows delivered that the promoted server lacks, e.g. {:?}",
            phantoms.len(),
            &phantoms[..phantoms.len().min(5)]
        );
        assert!(
            g.redelivered_acked.is_empty(),
            "{label}: acknowledged transactions delivered again: {:?}",
            g.redelivered_acked
        );
    }
}

/// A slot synchronised ahead of the consumer's state file (another
/// consumer advanced it on the old primary) is refused on the promoted
/// server, saying by how much; nothing is streamed.
#[test]
fn promoted_slot_ahead_of_the_state_file_is_refused() {
    for (label, bin) in support::servers() {
        let Some((primary, standby)) = pair(label, &bin) else {
            continue;
        };
        let state = primary.dir.join("state.json");
        let rt = runtime();
        let acked = rt.block_on(async {
            make_slot(&primary, true).await;
            primary.psql("INSERT INTO t (v) VALUES (1)");
            let cfg = retrying(StreamConfig::new("s", ["p"]).state_file(state.clone()));
            let mut s = LogicalStream::start(both_hosts(&primary, &standby), cfg)
                .await
                .unwrap();
            let lsn = loop {
                let e = tokio::time::timeout(Duration::from_secs(30), s.next())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                if let Event::Commit(_) = e {
                    break e.ack_lsn().unwrap();
                }
            };
            s.ack(lsn);
            let deadline = Instant::now() + Duration::from_secs(30);
            while primary.confirmed_flush("s") < lsn {
                assert!(Instant::now() < deadline, "{label}: ack not confirmed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            s.shutdown().await.unwrap();
            // what it confirmed, idle keepalives included
            primary.confirmed_flush("s")
        });
        // Another consumer moves the slot past changes this one never saw
        // (flushed: the slot cannot be advanced beyond the WAL flushed).
        let advance = || -> Lsn {
            primary
                .query(
                    "SET synchronous_commit = on;
                     SELECT pg_log_standby_snapshot();
                     SELECT end_lsn FROM pg_replication_slot_advance('s', pg_current_wal_flush_lsn())",
                )
                .lines()
                .last()
                .unwrap()
                .parse()
                .unwrap()
        };
        primary.psql("SET synchronous_commit = on; INSERT INTO t (v) VALUES (2)");
        let moved = advance();
        assert!(moved > acked, "{label}: {moved} {acked}");
        wait_synced(&standby, "s", moved, &|| {
            advance();
        });
        primary.crash();
        standby.promote();
        let err = rt.block_on(async {
            let cfg = retrying(StreamConfig::new("s", ["p"]).state_file(state.clone()));
            match LogicalStream::start(both_hosts(&primary, &standby), cfg).await {
                Ok(_) => panic!("{label}: streamed from a slot ahead of the state file"),
                Err(e) => e,
            }
        });
        match &err {
            Error::SlotAhead {
                confirmed,
                acknowledged,
                ..
            } => {
                assert_eq!(*acknowledged, acked, "{label}");
                assert!(*confirmed >= moved, "{label}: {err}");
            }
            e => panic!("{label}: expected SlotAhead, got {e}"),
        }
        assert!(err.to_string().contains("bytes beyond"), "{label}: {err}");
        // the promoted server's slot was left where it was
        assert_eq!(standby.confirmed_flush("s"), err_confirmed(&err));
    }
}

fn err_confirmed(e: &Error) -> Lsn {
    match e {
        Error::SlotAhead { confirmed, .. } => *confirmed,
        _ => unreachable!(),
    }
}

/// Without a state file, a reconnect that finds the slot moved past what
/// this stream confirmed ends the stream with `SlotAhead`. The reconnect is
/// held off deterministically: while the server is read-only, a
/// `target_session_attrs=read-write` stream keeps retrying.
#[test]
fn reconnect_refuses_a_slot_moved_meanwhile() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        let rt = runtime();
        let err = rt.block_on(async {
            make_slot(&c, false).await;
            let cfg: Config = format!(
                "{} sslmode=disable target_session_attrs=read-write",
                c.conninfo("postgres")
            )
            .parse()
            .unwrap();
            c.psql("INSERT INTO t (v) VALUES (1)");
            let mut s = LogicalStream::start(cfg, retrying(StreamConfig::new("s", ["p"])))
                .await
                .unwrap();
            loop {
                let e = tokio::time::timeout(Duration::from_secs(30), s.next())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                if let Event::Commit(_) = e {
                    s.ack(e.ack_lsn().unwrap());
                    break;
                }
            }
            let blocking = {
                let c = &c;
                move || {
                    c.psql(
                        "ALTER SYSTEM SET default_transaction_read_only = on;
                         SELECT pg_reload_conf();",
                    );
                    // once the walsender is gone, no reconnect can take the slot
                    let deadline = Instant::now() + Duration::from_secs(30);
                    loop {
                        c.query(
                            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                             WHERE slot_name = 's' AND active_pid IS NOT NULL",
                        );
                        if c.query("SELECT active FROM pg_replication_slots WHERE slot_name = 's'")
                            == "f"
                        {
                            break;
                        }
                        assert!(Instant::now() < deadline, "slot stayed active");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    c.psql(
                        "SET default_transaction_read_only = off;
                         SET synchronous_commit = on;
                         INSERT INTO t (v) VALUES (2);
                         SELECT pg_replication_slot_advance('s', pg_current_wal_flush_lsn());
                         ALTER SYSTEM RESET default_transaction_read_only;
                         SELECT pg_reload_conf();",
                    );
                }
            };
            tokio::task::block_in_place(blocking);
            loop {
                match tokio::time::timeout(Duration::from_secs(60), s.next())
                    .await
                    .unwrap()
                {
                    Some(Ok(Event::Insert(_))) => panic!("{label}: streamed past the moved slot"),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break e,
                    None => panic!("{label}: the stream ended without an error"),
                }
            }
        });
        assert!(
            matches!(err, Error::SlotAhead { .. }),
            "{label}: expected SlotAhead, got {err}"
        );
    }
}
