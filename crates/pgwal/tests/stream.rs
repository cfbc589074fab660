//! The logical change stream against real servers: events, ack semantics,
//! reconnect after the walsender is killed, idle slot advance, backpressure.

mod support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pgwal::{
    CreateSlotOptions, Event, LogicalStream, Lsn, ReplicationClient, RetryConfig, StreamConfig,
    Streaming,
};
use support::{block_on, config, Cluster, Options};

const SETUP: &str = "
CREATE TABLE t (id int PRIMARY KEY, v text, big text);
ALTER TABLE t REPLICA IDENTITY FULL;
CREATE TABLE other (id serial PRIMARY KEY, pad text);
CREATE PUBLICATION p FOR TABLE t;
";

async fn make_slot(c: &Cluster, name: &str) {
    let mut client = ReplicationClient::connect(&config(c, "postgres"))
        .await
        .unwrap();
    client
        .create_logical_slot(name, &CreateSlotOptions::new().two_phase(true))
        .await
        .unwrap();
}

fn fast(cfg: StreamConfig) -> StreamConfig {
    cfg.status_interval(Duration::from_millis(100)).retry(
        RetryConfig::default()
            .initial_backoff(Duration::from_millis(50))
            .max_attempts(Some(50)),
    )
}

async fn next(s: &mut LogicalStream) -> Event {
    tokio::time::timeout(Duration::from_secs(30), s.next())
        .await
        .expect("timed out waiting for an event")
        .expect("stream ended")
        .expect("stream error")
}

/// Reads events until a Commit (returns the inserted ids and the commit).
async fn next_txn(s: &mut LogicalStream) -> (Vec<i32>, Event, bool) {
    let mut ids = Vec::new();
    let mut reconnected = false;
    loop {
        let e = next(s).await;
        match &e {
            Event::Reconnected { .. } => {
                reconnected = true;
                ids.clear();
            }
            Event::Insert(ch) => ids.push(
                ch.new
                    .as_ref()
                    .unwrap()
                    .text("id")
                    .unwrap()
                    .parse()
                    .unwrap(),
            ),
            Event::Commit(_) => return (ids, e, reconnected),
            _ => {}
        }
    }
}

/// Reads the next transaction on the same session, checks its inserted
/// ids and acknowledges it.
async fn expect_txn(s: &mut LogicalStream, want: Vec<i32>, ctx: &str) {
    let (ids, commit, reconnected) = next_txn(s).await;
    assert!(!reconnected, "{ctx}: the session broke");
    assert_eq!(ids, want, "{ctx}");
    s.ack(commit.ack_lsn().unwrap());
}

#[test]
fn events_are_typed_and_resolved() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            c.psql(
                "INSERT INTO t VALUES (1, 'a', repeat('z', 5000) || md5('x'));
                 UPDATE t SET v = 'b' WHERE id = 1;
                 DELETE FROM t WHERE id = 1;
                 TRUNCATE t;
                 SELECT pg_logical_emit_message(false, 'pfx', 'hello');",
            );
            let end: Lsn = c.insert_lsn();
            let cfg = fast(StreamConfig::new("s", ["p"]).messages(true).stop_lsn(end));
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            let mut kinds = Vec::new();
            while let Some(e) = tokio::time::timeout(Duration::from_secs(30), s.next())
                .await
                .unwrap()
            {
                let e = e.unwrap();
                match &e {
                    Event::Insert(ch) => {
                        let row = ch.new.as_ref().unwrap();
                        assert_eq!(ch.relation.name, "t");
                        assert_eq!(row.text("v"), Some("a"));
                        assert_eq!(row.text("big").unwrap().len(), 5032);
                    }
                    Event::Update(ch) => {
                        // REPLICA IDENTITY FULL: the unchanged TOAST column is
                        // filled in from the old image.
                        let new = ch.new.as_ref().unwrap();
                        assert_eq!(new.text("v"), Some("b"));
                        assert!(!ch.old_is_key);
                        assert!(
                            !new.has_unchanged_toast(),
                            "{label}: TOAST not merged: {new:?}"
                        );
                        assert_eq!(new.text("big").unwrap().len(), 5032);
                    }
                    Event::Delete(ch) => assert_eq!(ch.old.as_ref().unwrap().text("id"), Some("1")),
                    Event::Truncate(t) => assert_eq!(t.relations[0].name, "t"),
                    Event::Message(m) => assert_eq!(&m.content[..], b"hello"),
                    _ => {}
                }
                if let Some(l) = e.ack_lsn() {
                    s.ack(l);
                }
                kinds.push(
                    format!("{e:?}")
                        .split(['(', ' '])
                        .next()
                        .unwrap()
                        .to_owned(),
                );
            }
            for k in [
                "Begin", "Relation", "Insert", "Update", "Delete", "Truncate", "Commit", "Message",
            ] {
                assert!(kinds.iter().any(|x| x == k), "{label}: no {k} in {kinds:?}");
            }
        });
    }
}

#[test]
fn reconnect_redelivers_only_unacked() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            let mut sql = String::new();
            for i in 1..=10 {
                sql.push_str(&format!("INSERT INTO t VALUES ({i}, 'v{i}');\n"));
            }
            c.psql(&sql);
            let mut s =
                LogicalStream::start(config(&c, "postgres"), fast(StreamConfig::new("s", ["p"])))
                    .await
                    .unwrap();
            let mut acked_upto = Lsn::INVALID;
            let mut first_unacked_end = Lsn::INVALID;
            for i in 1..=7 {
                let (ids, commit, reconnected) = next_txn(&mut s).await;
                assert!(!reconnected);
                assert_eq!(ids, vec![i]);
                if i <= 5 {
                    acked_upto = commit.ack_lsn().unwrap();
                    s.ack(acked_upto);
                } else if i == 6 {
                    first_unacked_end = commit.ack_lsn().unwrap();
                }
            }
            // Feedback may pass the acked commit only up to a keepalive
            // position before the next commit (idle advance), never to an
            // unacknowledged commit.
            let safe = |l: Lsn| l >= acked_upto && l < first_unacked_end;
            // Let feedback reach the server, then kill the walsender.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let confirmed = c.confirmed_flush("s");
            assert!(
                safe(confirmed),
                "{label}: confirmed {confirmed} outside [{acked_upto}, {first_unacked_end})"
            );
            let pid = c.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 's'");
            assert_eq!(c.query(&format!("SELECT pg_terminate_backend({pid})")), "t");
            c.psql("INSERT INTO t VALUES (11, 'v11'); INSERT INTO t VALUES (12, 'v12');");
            // The next event is the reconnect marker, at the acked position.
            let mut seen_marker = false;
            let mut after = Vec::new();
            while after.len() < 7 {
                let e = next(&mut s).await;
                match e {
                    Event::Reconnected { restart_lsn } => {
                        assert!(safe(restart_lsn), "{label}: restart at {restart_lsn} outside [{acked_upto}, {first_unacked_end}), confirmed before kill {confirmed}");
                        seen_marker = true;
                    }
                    // Events buffered before the loss may still arrive before the marker.
                    Event::Insert(_) if !seen_marker => {}
                    Event::Insert(ch) => {
                        after.push(ch.new.unwrap().text("id").unwrap().parse::<i32>().unwrap());
                    }
                    // Acks only for what was processed after the marker.
                    Event::Commit(cm) if seen_marker => s.ack(cm.end_lsn),
                    _ => {}
                }
            }
            assert_eq!(
                after,
                vec![6, 7, 8, 9, 10, 11, 12],
                "{label}: only unacked changes are redelivered, none lost"
            );
            s.shutdown().await.unwrap();
            assert!(c.confirmed_flush("s") >= acked_upto);
        });
    }
}

#[test]
fn idle_publication_advances_slot() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            c.psql("INSERT INTO t VALUES (1, 'published');");
            let mut s =
                LogicalStream::start(config(&c, "postgres"), fast(StreamConfig::new("s", ["p"])))
                    .await
                    .unwrap();
            let (_, commit, _) = next_txn(&mut s).await;
            s.ack(commit.ack_lsn().unwrap());
            let start = c.confirmed_flush("s");
            // Only unpublished tables are written from now on.
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut target = Lsn::INVALID;
            loop {
                c.psql(
                    "INSERT INTO other (pad) SELECT repeat('x', 100) FROM generate_series(1, 100);",
                );
                if target == Lsn::INVALID {
                    target = c.insert_lsn();
                }
                // Drain (and ack) whatever arrives, e.g. empty transactions on old servers.
                while let Ok(Some(Ok(e))) =
                    tokio::time::timeout(Duration::from_millis(200), s.next()).await
                {
                    if let Some(l) = e.ack_lsn() {
                        s.ack(l);
                    }
                }
                let now = c.confirmed_flush("s");
                if now >= target {
                    eprintln!("{label}: confirmed_flush_lsn advanced {start} -> {now} with no published change");
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{label}: slot stuck at {now} (< {target})"
                );
            }
            assert!(s.confirmed() >= target);
            s.shutdown().await.unwrap();
        });
    }
}

/// Heartbeats under a load that mixes published and unpublished writes:
/// never inside a transaction, and no transaction delivered after one
/// commits before its `wal_end` (a consumer that records a heartbeat as its
/// position would skip such a transaction after a restart).
#[test]
fn heartbeats_come_between_transactions_and_skip_nothing() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            let cfg = fast(StreamConfig::new("s", ["p"]))
                .idle_advance(false)
                .heartbeat(Duration::from_millis(50));
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            let load = {
                let mut psql = c.psql_command();
                psql.args(["-f", "-"]).stdout(std::process::Stdio::null());
                std::thread::spawn(move || {
                    // bounded: 60 rounds
                    for r in 0..60 {
                        let sql = format!(
                            "INSERT INTO other (pad) SELECT repeat('x', 500) FROM generate_series(1, 200);\n\
                             INSERT INTO t VALUES ({r}, 'r');\n\
                             BEGIN; INSERT INTO other (pad) VALUES ('y'); UPDATE t SET v = 'u' WHERE id = {r}; COMMIT;\n"
                        );
                        assert!(support::feed(&mut psql, &sql).status.success());
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            };
            let mut in_txn = false;
            let mut last_heartbeat = Lsn::INVALID;
            let (mut heartbeats, mut commits) = (0, 0);
            let deadline = Instant::now() + Duration::from_secs(120);
            while commits < 120 {
                assert!(
                    Instant::now() < deadline,
                    "{label}: {commits} of 120 commits in 120 s"
                );
                let e = next(&mut s).await;
                match &e {
                    Event::Begin(b) => {
                        assert!(
                            b.final_lsn >= last_heartbeat,
                            "{label}: a transaction committing at {} after a heartbeat at {last_heartbeat}",
                            b.final_lsn
                        );
                        in_txn = true;
                    }
                    Event::Commit(_) => {
                        in_txn = false;
                        commits += 1;
                    }
                    Event::Heartbeat { wal_end } => {
                        assert!(!in_txn, "{label}: a heartbeat inside a transaction");
                        assert!(*wal_end > last_heartbeat);
                        last_heartbeat = *wal_end;
                        heartbeats += 1;
                    }
                    _ => {}
                }
                if let Some(l) = e.ack_lsn() {
                    s.ack(l);
                }
            }
            load.join().unwrap();
            assert!(heartbeats > 0, "{label}: no heartbeat in {commits} commits");
            eprintln!("{label}: {heartbeats} heartbeats between {commits} transactions");
            s.shutdown().await.unwrap();
        });
    }
}

#[test]
fn slow_consumer_does_not_starve_feedback() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(
            label,
            &bin,
            Options {
                conf: vec!["wal_sender_timeout = '2s'".into()],
                ..Options::default()
            },
        );
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            c.psql("INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series(1, 30000) g;");
            let cfg = fast(
                StreamConfig::new("s", ["p"])
                    .buffer(4)
                    .retry(RetryConfig::never()),
            );
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            let first = next(&mut s).await;
            assert!(matches!(first, Event::Begin(_)));
            // Consumer stalls for longer than wal_sender_timeout.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let pid_before =
                c.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 's'");
            assert!(
                !pid_before.is_empty(),
                "{label}: walsender gone while the consumer stalled"
            );
            let mut inserts = 0;
            loop {
                match next(&mut s).await {
                    Event::Insert(_) => inserts += 1,
                    Event::Commit(cm) => {
                        s.ack(cm.end_lsn);
                        break;
                    }
                    Event::Reconnected { .. } => panic!("{label}: connection was lost"),
                    _ => {}
                }
            }
            assert_eq!(inserts, 30000);
            s.shutdown().await.unwrap();
            assert!(!c
                .server_log()
                .contains("terminating walsender process due to replication timeout"));
        });
    }
}

#[test]
fn streamed_and_two_phase_transactions() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(
            label,
            &bin,
            Options {
                conf: vec!["logical_decoding_work_mem = '64kB'".into()],
                ..Options::default()
            },
        );
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            c.psql(
                "BEGIN;
                 INSERT INTO t SELECT g, repeat('a', 100) FROM generate_series(1, 2000) g;
                 SAVEPOINT sp;
                 INSERT INTO t SELECT g, repeat('b', 100) FROM generate_series(2001, 4000) g;
                 ROLLBACK TO SAVEPOINT sp;
                 COMMIT;
                 BEGIN; INSERT INTO t VALUES (9001, 'prepared'); PREPARE TRANSACTION 'g1';
                 COMMIT PREPARED 'g1';",
            );
            let end: Lsn = c.insert_lsn();
            let streaming = if c.major >= 16 {
                Streaming::Parallel
            } else {
                Streaming::On
            };
            let cfg = fast(
                StreamConfig::new("s", ["p"])
                    .streaming(streaming)
                    .two_phase(true)
                    .stop_lsn(end),
            );
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            let mut live = std::collections::HashMap::<u32, Vec<i32>>::new();
            let mut committed = Vec::new();
            let (mut sub_abort, mut prepared, mut commit_prepared) = (false, false, false);
            while let Some(e) = tokio::time::timeout(Duration::from_secs(30), s.next())
                .await
                .unwrap()
            {
                let e = e.unwrap();
                match &e {
                    Event::Insert(ch) => {
                        let id = ch
                            .new
                            .as_ref()
                            .unwrap()
                            .text("id")
                            .unwrap()
                            .parse()
                            .unwrap();
                        live.entry(ch.xid.unwrap_or(0)).or_default().push(id);
                    }
                    Event::StreamAbort(a) => {
                        sub_abort |= a.subxid != a.xid;
                        live.remove(&a.subxid);
                    }
                    Event::StreamCommit(_) | Event::Commit(_) | Event::Prepare(_) => {
                        prepared |= matches!(e, Event::Prepare(_));
                        for (_, ids) in live.drain() {
                            committed.extend(ids);
                        }
                    }
                    Event::CommitPrepared(_) => commit_prepared = true,
                    _ => {}
                }
                if let Some(l) = e.ack_lsn() {
                    s.ack(l);
                }
            }
            committed.sort();
            let mut want: Vec<i32> = (1..=2000).collect();
            want.push(9001);
            assert_eq!(
                committed, want,
                "{label}: rolled-back savepoint rows must be discarded"
            );
            assert!(sub_abort, "{label}: no subtransaction abort");
            assert!(
                prepared && commit_prepared,
                "{label}: two-phase messages missing"
            );
        });
    }
}

#[test]
fn toast_cache_fills_unchanged_columns() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(
            "CREATE TABLE tt (id int PRIMARY KEY, v text, big text);
             ALTER TABLE tt ALTER COLUMN big SET STORAGE EXTERNAL;
             CREATE PUBLICATION pt FOR TABLE tt;
             INSERT INTO tt VALUES (1, 'before', repeat('b', 4000));",
        );
        block_on(async {
            make_slot(&c, "s").await;
            c.psql(
                "INSERT INTO tt VALUES (2, 'seen', repeat('s', 4000));
                 UPDATE tt SET v = 'x' WHERE id IN (1, 2);",
            );
            let end: Lsn = c.insert_lsn();
            let cfg = fast(
                StreamConfig::new("s", ["pt"])
                    .toast_cache_rows(100)
                    .stop_lsn(end),
            );
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            let mut updates = std::collections::BTreeMap::new();
            while let Some(e) = tokio::time::timeout(Duration::from_secs(30), s.next())
                .await
                .unwrap()
            {
                if let Event::Update(ch) = e.unwrap() {
                    let new = ch.new.unwrap();
                    updates.insert(
                        new.text("id").unwrap().to_owned(),
                        (new.has_unchanged_toast(), new.text("big").map(str::len)),
                    );
                }
            }
            // Row 2 was inserted while streaming: its TOAST value is filled in.
            assert_eq!(updates["2"], (false, Some(4000)), "{label}");
            // Row 1 predates the stream: the value stays flagged, never guessed.
            assert_eq!(updates["1"], (true, None), "{label}");
        });
    }
}

/// The TOAST cache never fills a value from a transaction that aborted: a
/// streamed savepoint rolled back (its changes were sent before the
/// `StreamAbort`) and a prepared transaction rolled back (sent at PREPARE).
#[test]
fn toast_cache_forgets_aborted_values() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(
            label,
            &bin,
            Options {
                conf: vec!["logical_decoding_work_mem = '64kB'".into()],
                ..Options::default()
            },
        );
        c.psql(
            "CREATE TABLE tt (id int PRIMARY KEY, v text, big text);
             ALTER TABLE tt ALTER COLUMN big SET STORAGE EXTERNAL;
             CREATE TABLE filler (id int, pad text);
             CREATE PUBLICATION pt FOR TABLE tt, filler;",
        );
        block_on(async {
            make_slot(&c, "s").await;
            c.psql(
                "INSERT INTO tt VALUES (2, 'v1', repeat('s', 4000)), (3, 'v1', repeat('t', 4000));
                 BEGIN;
                 SAVEPOINT sp;
                 UPDATE tt SET big = repeat('r', 5000) WHERE id = 2;
                 INSERT INTO filler SELECT g, repeat('f', 100) FROM generate_series(1, 3000) g;
                 ROLLBACK TO SAVEPOINT sp;
                 UPDATE tt SET v = 'after-savepoint' WHERE id = 2;
                 COMMIT;
                 BEGIN;
                 UPDATE tt SET big = repeat('q', 4500) WHERE id = 3;
                 PREPARE TRANSACTION 'g1';
                 ROLLBACK PREPARED 'g1';
                 UPDATE tt SET v = 'after-prepared' WHERE id = 3;",
            );
            let end: Lsn = c.insert_lsn();
            let cfg = fast(
                StreamConfig::new("s", ["pt"])
                    .streaming(Streaming::On)
                    .two_phase(true)
                    .toast_cache_rows(100)
                    .stop_lsn(end),
            );
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            let (mut filled, mut sub_aborted, mut rolled_back) =
                (std::collections::BTreeMap::new(), false, false);
            while let Some(e) = tokio::time::timeout(Duration::from_secs(30), s.next())
                .await
                .unwrap()
            {
                match e.unwrap() {
                    Event::Update(ch) => {
                        let new = ch.new.unwrap();
                        if let Some(v) = new.text("v").filter(|v| v.starts_with("after")) {
                            let big = new.text("big").map(|b| (b.len(), b.as_bytes()[0] as char));
                            filled.insert(v.to_owned(), big);
                        }
                    }
                    Event::StreamAbort(a) => sub_aborted |= a.subxid != a.xid,
                    Event::RollbackPrepared(_) => rolled_back = true,
                    _ => {}
                }
            }
            // the rolled-back values were sent, then undone
            assert!(
                sub_aborted && rolled_back,
                "{label}: {sub_aborted} {rolled_back}"
            );
            assert_eq!(filled["after-savepoint"], Some((4000, 's')), "{label}");
            assert_eq!(filled["after-prepared"], Some((4000, 't')), "{label}");
        });
    }
}

#[test]
fn reconnect_inside_streamed_transaction() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(
            label,
            &bin,
            Options {
                conf: vec!["logical_decoding_work_mem = '64kB'".into()],
                ..Options::default()
            },
        );
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            let before = c.confirmed_flush("s");
            c.psql("INSERT INTO t SELECT g, repeat('z', 100) FROM generate_series(1, 5000) g;");
            let cfg = fast(StreamConfig::new("s", ["p"]).streaming(Streaming::On));
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            // Receive the first streamed block only, then lose the connection.
            loop {
                if let Event::StreamStop = next(&mut s).await {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let confirmed_at_kill = c.confirmed_flush("s");
            assert!(confirmed_at_kill >= before);
            let pid = c.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 's'");
            c.query(&format!("SELECT pg_terminate_backend({pid})"));
            let mut seen_marker = false;
            let mut rows = 0;
            loop {
                match next(&mut s).await {
                    Event::Reconnected { .. } => {
                        seen_marker = true;
                        rows = 0;
                    }
                    Event::Insert(_) if seen_marker => rows += 1,
                    Event::StreamCommit(sc) if seen_marker => {
                        assert!(
                            confirmed_at_kill < sc.commit_lsn,
                            "{label}: slot passed an unacked streamed commit"
                        );
                        s.ack(sc.end_lsn);
                        break;
                    }
                    _ => {}
                }
            }
            assert_eq!(
                rows, 5000,
                "{label}: the streamed transaction must be delivered whole after reconnect"
            );
            s.shutdown().await.unwrap();
        });
    }
}

#[test]
fn batched_reads_lose_nothing_and_release_stragglers() {
    // read_coalesce raises the TCP socket's receive low-water mark during a
    // burst (a Unix-domain socket has none and reads eagerly). Either way
    // every change arrives once, rows larger than the mark included, and a
    // lone transaction after the burst is not left waiting for more bytes.
    // (The mark's own behaviour is unit-tested in framing.rs.)
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        let unix = format!(
            "host={} port={} user=postgres dbname=postgres",
            c.dir.display(),
            c.port
        );
        for (transport, conninfo) in [("tcp", None), ("unix", Some(unix))] {
            let cfg: pgwal::Config = match &conninfo {
                Some(s) => s.parse().unwrap(),
                None => config(&c, "postgres"),
            };
            c.psql("TRUNCATE t");
            block_on(async {
                let slot = format!("batched_{transport}");
                make_slot(&c, &slot).await;
                let mut s = LogicalStream::start(
                    cfg,
                    fast(StreamConfig::new(slot, ["p"]))
                        .read_coalesce(Some(Duration::from_millis(5))),
                )
                .await
                .unwrap();
                for round in 0..3 {
                    let base = round * 10_000;
                    // A burst: small rows, then rows of ~22 kB that do not
                    // compress (each message exceeds the 16 kB mark).
                    c.psql(&format!(
                        "INSERT INTO t SELECT g, 'x' FROM generate_series({}, {}) g;
                         INSERT INTO t SELECT g, 'y', (SELECT string_agg(md5(g::text || i::text), '')
                                                      FROM generate_series(1, 700) i)
                           FROM generate_series({}, {}) g;",
                        base + 1,
                        base + 5000,
                        base + 5001,
                        base + 5100
                    ));
                    let ctx = format!("{label}/{transport}");
                    expect_txn(&mut s, ((base + 1)..=(base + 5000)).collect(), &ctx).await;
                    expect_txn(&mut s, ((base + 5001)..=(base + 5100)).collect(), &ctx).await;
                    // Stragglers right after the burst: one small row each.
                    for k in 1..=5 {
                        let id = base + 9000 + k;
                        let t = Instant::now();
                        c.psql(&format!("INSERT INTO t VALUES ({id}, 'z')"));
                        expect_txn(&mut s, vec![id], &ctx).await;
                        // A mark left raised would hold it until the next
                        // keepalive (wal_sender_timeout / 2 = 30 s).
                        assert!(
                            t.elapsed() < Duration::from_secs(5),
                            "{ctx}: straggler took {:?}",
                            t.elapsed()
                        );
                    }
                }
                s.shutdown().await.unwrap();
            });
        }
    }
}

/// The receive timeout: an idle but live server keeps the session (it
/// answers the stream's request for a keepalive after half the timeout),
/// while a walsender that stops answering (SIGSTOP: the kernel still
/// acknowledges the bytes, nothing comes back) ends it, and the stream
/// reconnects and loses nothing.
#[test]
fn receive_timeout_keeps_an_idle_stream_and_ends_a_silent_one() {
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let c = Cluster::start(label, &bin, Options::default());
    c.psql(SETUP);
    block_on(async {
        make_slot(&c, "s").await;
        let timeout = Duration::from_secs(1);
        // feedback less often than the timeout: only the stream's request
        // makes the idle walsender speak
        let cfg = fast(StreamConfig::new("s", ["p"]))
            .status_interval(Duration::from_secs(30))
            .receive_timeout(Some(timeout));
        let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
            .await
            .unwrap();
        c.psql("INSERT INTO t VALUES (1, 'a')");
        expect_txn(&mut s, vec![1], "first").await;
        // idle for five timeouts: no event at all, in particular no
        // reconnection
        match tokio::time::timeout(timeout * 5, s.next()).await {
            Err(_) => {}
            Ok(e) => panic!("{label}: an idle stream delivered {e:?}"),
        }
        c.psql("INSERT INTO t VALUES (2, 'b')");
        expect_txn(&mut s, vec![2], "after idling").await;

        let pid = c.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 's'");
        let signal = |sig: &str| {
            assert!(std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success());
        };
        signal("-STOP");
        let stopped = Instant::now();
        c.psql("INSERT INTO t VALUES (3, 'c')");
        // the session ends after the timeout; the next one waits for the
        // stopped walsender to give up the slot
        tokio::time::sleep(timeout * 3).await;
        signal("-CONT");
        let (ids, _, reconnected) = next_txn(&mut s).await;
        assert!(
            reconnected,
            "{label}: no reconnection after the walsender fell silent"
        );
        assert_eq!(ids, vec![3], "{label}");
        eprintln!(
            "{label}: the stopped walsender's transaction arrived {:.1?} after the stop \
             (receive timeout {timeout:?})",
            stopped.elapsed()
        );
        s.shutdown().await.unwrap();
    });
}

/// `request_position` without heartbeats configured: no heartbeat comes
/// unasked; asked on an idle server, the answer reaches the server's WAL
/// end; asked under load, answers come only between transactions, and no
/// transaction committing before an answer's `wal_end` is delivered after
/// it.
#[test]
fn requested_positions_come_between_transactions() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        block_on(async {
            make_slot(&c, "s").await;
            c.psql("INSERT INTO t VALUES (-1, 'first');");
            let cfg = fast(StreamConfig::new("s", ["p"])).idle_advance(false);
            let mut s = LogicalStream::start(config(&c, "postgres"), cfg)
                .await
                .unwrap();
            let (_, commit, _) = next_txn(&mut s).await;
            s.ack(commit.ack_lsn().unwrap());
            // unasked: nothing (the status updates every 100 ms draw
            // keepalives, none of which becomes an event)
            c.psql("INSERT INTO other (pad) VALUES ('unpublished');");
            while let Ok(e) = tokio::time::timeout(Duration::from_secs(1), next(&mut s)).await {
                assert!(
                    !matches!(e, Event::Heartbeat { .. }),
                    "{label}: a heartbeat nobody asked for"
                );
            }
            // asked on an idle server: the answer reaches its flushed WAL
            let target: Lsn = c
                .query("SELECT pg_current_wal_flush_lsn()")
                .parse()
                .unwrap();
            let t0 = Instant::now();
            let mut answers = 0;
            loop {
                s.request_position();
                match tokio::time::timeout(Duration::from_millis(500), next(&mut s)).await {
                    Ok(Event::Heartbeat { wal_end }) => {
                        answers += 1;
                        if wal_end >= target {
                            break;
                        }
                    }
                    Ok(e) => panic!("{label}: {e:?} on an idle server"),
                    Err(_) => {}
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "{label}: no answer reached {target} in 20 s ({answers} answers)"
                );
            }
            eprintln!(
                "{label}: idle: {answers} answer(s), the last past {target}, after {:?}",
                t0.elapsed()
            );
            // asked under load, at every transaction's begin
            let load = {
                let mut psql = c.psql_command();
                psql.args(["-f", "-"]).stdout(std::process::Stdio::null());
                std::thread::spawn(move || {
                    // bounded: 40 rounds
                    for r in 0..40 {
                        let sql = format!(
                            "INSERT INTO t VALUES ({r}, 'r');\n\
                             BEGIN; INSERT INTO other (pad) VALUES ('y'); UPDATE t SET v = 'u' WHERE id = {r}; COMMIT;\n"
                        );
                        assert!(support::feed(&mut psql, &sql).status.success());
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            };
            let (mut in_txn, mut last_answer) = (false, Lsn::INVALID);
            let (mut answers, mut commits) = (0, 0);
            let t0 = Instant::now();
            let deadline = t0 + Duration::from_secs(120);
            while commits < 80 {
                assert!(
                    Instant::now() < deadline,
                    "{label}: {commits} of 80 commits in 120 s"
                );
                let e = next(&mut s).await;
                match &e {
                    Event::Begin(b) => {
                        // asked inside the transaction: answered after it
                        s.request_position();
                        assert!(
                            b.final_lsn >= last_answer,
                            "{label}: a transaction committing at {} after an answer at {last_answer}",
                            b.final_lsn
                        );
                        in_txn = true;
                    }
                    Event::Commit(_) => {
                        in_txn = false;
                        commits += 1;
                    }
                    Event::Heartbeat { wal_end } => {
                        assert!(!in_txn, "{label}: an answer inside a transaction");
                        last_answer = last_answer.max(*wal_end);
                        answers += 1;
                    }
                    _ => {}
                }
                if let Some(l) = e.ack_lsn() {
                    s.ack(l);
                }
            }
            load.join().unwrap();
            assert!(answers > 0, "{label}: no answer in {commits} commits");
            eprintln!(
                "{label}: under load: {answers} answers between {commits} transactions in {:?}",
                t0.elapsed()
            );
            s.shutdown().await.unwrap();
        });
    }
}
