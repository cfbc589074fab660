//! Physical streaming (`PhysicalReceiver`) against real servers: segments
//! byte-identical to the primary's, acknowledgement points as a synchronous
//! standby, timeline switch after a promotion, typed errors.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgwal::{
    AckMode, Error, Gate, Lsn, PhysicalConfig, PhysicalProgress, PhysicalReceiver, Stage,
    StopReason,
};
use support::{Cluster, Options};
use tokio::sync::oneshot;

const APP: &str = "pgwal_recv";

fn sync_options() -> Options {
    Options {
        conf: vec![
            format!("synchronous_standby_names = '{APP}'"),
            "synchronous_commit = on".into(),
            "autovacuum = off".into(),
            "wal_sender_timeout = 60s".into(),
        ],
        ..Options::default()
    }
}

fn recv_config(c: &Cluster) -> pgwal::Config {
    format!(
        "{} sslmode=disable application_name={APP}",
        c.conninfo("postgres")
    )
    .parse()
    .unwrap()
}

/// A receiver running on its own runtime thread; stopped on `stop()`.
struct Running {
    progress: Arc<PhysicalProgress>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<pgwal::Result<StopReason>>>,
}

impl Running {
    fn start(config: pgwal::Config, pc: PhysicalConfig) -> Running {
        let receiver = PhysicalReceiver::new(config, pc);
        let progress = receiver.progress();
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            support::block_on(receiver.run(async {
                let _ = rx.await;
            }))
        });
        Running {
            progress,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> pgwal::Result<StopReason> {
        let _ = self.stop.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap()
    }

    fn wait_flushed(&self, lsn: Lsn, what: &str) {
        let t = Instant::now();
        while self.progress.flushed() < lsn {
            assert!(
                !self.thread.as_ref().unwrap().is_finished(),
                "{what}: receiver ended before flushing {lsn}"
            );
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{what}: flushed {} < {lsn}",
                self.progress.flushed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn lsn(c: &Cluster, sql: &str) -> Lsn {
    c.query(sql).parse().unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Compares every complete segment in `recv` with the same file in the
/// server's pg_wal; returns how many were compared.
fn compare_complete_segments(label: &str, recv: &Path, pg_wal: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(recv).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let ours = std::fs::read(recv.join(&name)).unwrap();
        let theirs = std::fs::read(pg_wal.join(&name))
            .unwrap_or_else(|e| panic!("{label}: {name} on server: {e}"));
        assert!(
            ours == theirs,
            "{label}: segment {name} differs from the server's"
        );
        n += 1;
    }
    n
}

fn recv_dir(c: &Cluster, name: &str) -> PathBuf {
    let d = c.dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn segments_are_byte_identical() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        let dir = recv_dir(&c, "recv");
        let r = Running::start(
            recv_config(&c),
            PhysicalConfig::new(&dir)
                .slot("recv")
                .create_slot(true)
                .status_interval(Duration::from_millis(200)),
        );
        wait_until("streaming", || {
            c.query("SELECT count(*) FROM pg_stat_replication") == "1"
        });
        for i in 0..3 {
            c.psql(&format!(
                "CREATE TABLE t{i} AS SELECT g, repeat('x', 100) AS v FROM generate_series(1, 20000) g; SELECT pg_switch_wal();"
            ));
        }
        let end = lsn(&c, "SELECT pg_current_wal_flush_lsn()");
        r.wait_flushed(end, label);
        assert_eq!(r.progress.timeline(), 1);
        assert_eq!(r.stop().unwrap(), StopReason::Shutdown);
        let n = compare_complete_segments(label, &dir, &c.dir.join("data/pg_wal"));
        assert!(n >= 3, "{label}: only {n} complete segments");
        // The slot followed the reported flush position.
        let restart = lsn(
            &c,
            "SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'recv'",
        );
        assert!(
            restart >= end,
            "{label}: slot restart_lsn {restart} < {end}"
        );

        // A second run resumes after the complete segments and the partial one.
        c.psql("CREATE TABLE more AS SELECT g FROM generate_series(1, 50000) g; SELECT pg_switch_wal();");
        let end2 = lsn(&c, "SELECT pg_current_wal_flush_lsn()");
        let r = Running::start(
            recv_config(&c),
            PhysicalConfig::new(&dir).slot("recv").end_lsn(end2),
        );
        r.wait_flushed(end2, label);
        assert_eq!(r.stop().unwrap(), StopReason::EndReached);
        assert!(compare_complete_segments(label, &dir, &c.dir.join("data/pg_wal")) > n);
    }
}

#[test]
fn reconnects_after_the_walsender_is_terminated() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        let dir = recv_dir(&c, "recv");
        let retry = pgwal::RetryConfig::default()
            .max_attempts(Some(50))
            .initial_backoff(Duration::from_millis(50));
        let r = Running::start(
            recv_config(&c),
            PhysicalConfig::new(&dir)
                .slot("recv")
                .create_slot(true)
                .retry(retry)
                .status_interval(Duration::from_millis(100)),
        );
        let walsender =
            || c.query("SELECT coalesce((SELECT pid::text FROM pg_stat_replication), 'none')");
        wait_until("streaming", || walsender() != "none");
        for round in 0..3 {
            let pid = walsender();
            c.psql(&format!("CREATE TABLE r{round} AS SELECT g, repeat('y', 100) AS v FROM generate_series(1, 30000) g"));
            // Kill the walsender mid-stream, then write more while it is gone.
            c.query(&format!("SELECT pg_terminate_backend({pid})"));
            c.psql(&format!("INSERT INTO r{round} SELECT g, 'z' FROM generate_series(1, 10000) g; SELECT pg_switch_wal();"));
            wait_until("a new walsender", || {
                !["none", pid.as_str()].contains(&walsender().as_str())
            });
            let end = lsn(&c, "SELECT pg_current_wal_flush_lsn()");
            r.wait_flushed(end, label);
        }
        assert_eq!(r.stop().unwrap(), StopReason::Shutdown);
        let n = compare_complete_segments(label, &dir, &c.dir.join("data/pg_wal"));
        assert!(n >= 3, "{label}: only {n} complete segments");

        // Without retries, the same failure ends run() with a transient error.
        let r = Running::start(recv_config(&c), PhysicalConfig::new(&dir).slot("recv"));
        wait_until("streaming", || walsender() != "none");
        c.query(&format!("SELECT pg_terminate_backend({})", walsender()));
        let t = Instant::now();
        while !r.thread.as_ref().unwrap().is_finished() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{label}: receiver kept running"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let e = r.stop().unwrap_err();
        assert!(e.is_transient(), "{label}: {e}");
    }
}

/// Starts `psql -c "SET synchronous_commit = mode; INSERT ..."`.
fn commit(c: &Cluster, mode: &str) -> Child {
    c.psql_command()
        .arg("-c")
        .arg(format!(
            "SET synchronous_commit = {mode}; INSERT INTO t VALUES (1)"
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Whether `child` exits within `d` (successfully).
fn returns_within(child: &mut Child, d: Duration) -> bool {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "psql failed");
            return true;
        }
        if t.elapsed() >= d {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A transaction that inserted a row and knows a position its commit
/// record will follow; committed on its own thread.
struct Pending {
    lsn: Lsn,
    go: oneshot::Sender<()>,
    done: std::sync::mpsc::Receiver<()>,
}

struct Committing {
    done: std::sync::mpsc::Receiver<()>,
}

impl Pending {
    fn begin(c: &Cluster, mode: &str) -> Pending {
        let cfg = support::config(c, "postgres");
        let sql = format!("SET synchronous_commit = {mode}; BEGIN; INSERT INTO t VALUES (1); SELECT pg_current_wal_insert_lsn()");
        let (lsn_tx, lsn_rx) = std::sync::mpsc::channel();
        let (go, go_rx) = oneshot::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            support::block_on(async move {
                let mut s = pgwal::ReplicationClient::connect_sql(&cfg).await.unwrap();
                let rows = s.simple_query(&sql).await.unwrap();
                lsn_tx
                    .send(rows[0].get_index(0).unwrap().parse::<Lsn>().unwrap())
                    .unwrap();
                if go_rx.await.is_ok() {
                    s.simple_query("COMMIT").await.unwrap();
                    let _ = done_tx.send(());
                }
            })
        });
        Pending {
            lsn: lsn_rx.recv_timeout(RELEASED).unwrap(),
            go,
            done,
        }
    }

    fn commit(self) -> Committing {
        self.go.send(()).unwrap();
        Committing { done: self.done }
    }
}

impl Committing {
    fn returns_within(&self, d: Duration) -> bool {
        self.done.recv_timeout(d).is_ok()
    }
}

const BLOCKED: Duration = Duration::from_millis(1500);
const RELEASED: Duration = Duration::from_secs(20);

fn wait_parked(gate: &Gate, stage: Stage, what: &str) {
    wait_until(what, || gate.parked().is_some_and(|(s, _)| s == stage));
}

#[test]
fn ack_modes_release_commits_at_the_right_moment() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, sync_options());
        c.psql("SET synchronous_commit = local; CREATE TABLE t (v int)");
        for mode in [AckMode::Receive, AckMode::Write, AckMode::Flush] {
            let what = format!("{label} ack {}", mode.as_str());
            let gate = Gate::new();
            let dir = recv_dir(&c, &format!("recv-{}", mode.as_str()));
            let r = Running::start(
                recv_config(&c),
                PhysicalConfig::new(&dir)
                    .ack(mode)
                    .status_interval(Duration::from_millis(200))
                    .hook(gate.clone()),
            );
            wait_until("sync standby", || {
                c.query(&format!(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{APP}'"
                )) == "sync"
            });
            let mut on = commit(&c, "on");
            assert!(
                returns_within(&mut on, RELEASED),
                "{what}: commit (on) with open gates"
            );
            match mode {
                AckMode::Receive => {
                    // Parked between receipt and write: remote_write returns.
                    let rw = Pending::begin(&c, "remote_write");
                    gate.close_after(Stage::BeforeWrite, rw.lsn);
                    let rw = rw.commit();
                    wait_parked(&gate, Stage::BeforeWrite, &what);
                    assert!(
                        rw.returns_within(RELEASED),
                        "{what}: remote_write must return on receipt"
                    );
                    gate.open(Stage::BeforeWrite);
                    if c.label == "pg18" {
                        // The patched server takes the trailing receive pointer.
                        let rr = Pending::begin(&c, "remote_receive");
                        gate.close_after(Stage::BeforeWrite, rr.lsn);
                        let rr = rr.commit();
                        wait_parked(&gate, Stage::BeforeWrite, &what);
                        assert!(
                            rr.returns_within(RELEASED),
                            "{what}: remote_receive must return on receipt"
                        );
                        let recv = c.query(&format!(
                            "SELECT receive_lsn IS NOT NULL FROM pg_stat_replication WHERE application_name = '{APP}'"
                        ));
                        assert_eq!(recv, "t", "{what}: receive_lsn reported");
                        gate.open(Stage::BeforeWrite);
                    }
                    // Written but not fsynced: on waits.
                    gate.close(Stage::BeforeFlush);
                    let mut on = commit(&c, "on");
                    wait_parked(&gate, Stage::BeforeFlush, &what);
                    assert!(
                        !returns_within(&mut on, BLOCKED),
                        "{what}: on must wait for fsync"
                    );
                    gate.open(Stage::BeforeFlush);
                    assert!(returns_within(&mut on, RELEASED), "{what}: on after fsync");
                }
                AckMode::Write => {
                    gate.close(Stage::BeforeWrite);
                    let mut rw = commit(&c, "remote_write");
                    wait_parked(&gate, Stage::BeforeWrite, &what);
                    assert!(
                        !returns_within(&mut rw, BLOCKED),
                        "{what}: remote_write must wait for the write"
                    );
                    gate.close(Stage::BeforeFlush);
                    gate.open(Stage::BeforeWrite);
                    assert!(
                        returns_within(&mut rw, RELEASED),
                        "{what}: remote_write after the write"
                    );
                    let mut on = commit(&c, "on");
                    wait_parked(&gate, Stage::BeforeFlush, &what);
                    assert!(
                        !returns_within(&mut on, BLOCKED),
                        "{what}: on must wait for fsync"
                    );
                    gate.open(Stage::BeforeFlush);
                    assert!(returns_within(&mut on, RELEASED), "{what}: on after fsync");
                }
                _ => {
                    gate.close(Stage::BeforeFlush);
                    let mut rw = commit(&c, "remote_write");
                    let mut on = commit(&c, "on");
                    wait_parked(&gate, Stage::BeforeFlush, &what);
                    assert!(
                        !returns_within(&mut rw, BLOCKED),
                        "{what}: remote_write must wait for fsync"
                    );
                    assert!(
                        !returns_within(&mut on, BLOCKED),
                        "{what}: on must wait for fsync"
                    );
                    gate.open(Stage::BeforeFlush);
                    assert!(
                        returns_within(&mut rw, RELEASED),
                        "{what}: remote_write after fsync"
                    );
                    assert!(returns_within(&mut on, RELEASED), "{what}: on after fsync");
                }
            }
            // Reported positions are ordered: flush <= write <= receive.
            let p = &r.progress;
            assert!(
                p.reported_flush() <= p.reported_write() && p.reported_write() <= p.received(),
                "{what}"
            );
            assert_eq!(r.stop().unwrap(), StopReason::Shutdown);
        }
    }
}

#[test]
fn wrong_timeline_and_missing_directory_are_typed_errors() {
    let (label, bin) = support::servers().remove(0);
    let c = Cluster::start(label, &bin, Options::default());
    let dir = recv_dir(&c, "recv");
    let rt = |pc: PhysicalConfig| {
        support::block_on(PhysicalReceiver::new(recv_config(&c), pc).run(std::future::pending()))
    };
    let e = rt(PhysicalConfig::new(&dir).start(Lsn(0x100_0000), 7)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TimelineNotOnServer {
                requested: 7,
                server: 1
            }
        ),
        "{e:?}"
    );
    let e = rt(PhysicalConfig::new(c.dir.join("missing"))).unwrap_err();
    assert!(matches!(e, Error::WalDir { .. }), "{e:?}");
    assert!(e.to_string().contains("missing"), "{e}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn follows_a_timeline_switch_after_promotion() {
    for (label, bin) in support::servers() {
        let p = Cluster::start(
            label,
            &bin,
            Options {
                conf: vec!["autovacuum = off".into()],
                ..Options::default()
            },
        );
        let s = p.standby("cascade_source", &[]);
        let dir = recv_dir(&p, "recv");
        // Cascading: the receiver streams from the standby.
        let r = Running::start(
            recv_config(&s),
            PhysicalConfig::new(&dir).status_interval(Duration::from_millis(200)),
        );
        p.psql("CREATE TABLE t AS SELECT g FROM generate_series(1, 10000) g");
        let before = lsn(&p, "SELECT pg_current_wal_flush_lsn()");
        r.wait_flushed(before, label);
        wait_until("standby replay", || {
            s.query(&format!("SELECT pg_last_wal_replay_lsn() >= '{before}'")) == "t"
        });
        s.promote();
        wait_until("timeline 2", || r.progress.timeline() == 2);
        s.psql("CREATE TABLE after AS SELECT g FROM generate_series(1, 10000) g; SELECT pg_switch_wal();");
        let end = lsn(&s, "SELECT pg_current_wal_flush_lsn()");
        r.wait_flushed(end, label);
        assert_eq!(r.stop().unwrap(), StopReason::Shutdown);
        let history =
            std::fs::read(dir.join("00000002.history")).expect("00000002.history written");
        assert_eq!(
            history,
            std::fs::read(s.dir.join("data/pg_wal/00000002.history")).unwrap(),
            "{label}"
        );
        let n = compare_complete_segments(label, &dir, &s.dir.join("data/pg_wal"));
        assert!(n >= 1, "{label}: complete segments compared: {n}");
        let tli2 = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name().into_string().unwrap();
                n.starts_with("00000002") && n.len() == 24
            })
            .count();
        assert!(tli2 >= 1, "{label}: a complete segment on timeline 2");
        // Timeline 1 ends at the switch point: streaming it from later is refused.
        let e = support::block_on(
            PhysicalReceiver::new(recv_config(&s), PhysicalConfig::new(&dir).start(end, 1))
                .run(std::future::pending()),
        )
        .unwrap_err();
        assert!(e.as_db_error().is_some(), "{label}: {e:?}");
    }
}

/// Regression: in the receive and write modes the first fsync may be a whole
/// status interval away; the start position is reported as flushed at once,
/// so the receiver is a synchronous standby candidate from the start.
#[test]
fn sync_candidate_before_the_first_fsync() {
    let (label, bin) = support::servers().remove(0);
    let c = Cluster::start(label, &bin, sync_options());
    c.psql("SET synchronous_commit = local; CREATE TABLE t (v int)");
    for mode in [AckMode::Receive, AckMode::Write] {
        let dir = recv_dir(&c, &format!("recv-{}", mode.as_str()));
        let r = Running::start(
            recv_config(&c),
            PhysicalConfig::new(&dir)
                .ack(mode)
                .status_interval(Duration::from_secs(600)),
        );
        let t = Instant::now();
        wait_until("sync standby", || {
            c.query(&format!(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{APP}'"
            )) == "sync"
        });
        let mut rw = commit(&c, "remote_write");
        assert!(
            returns_within(&mut rw, Duration::from_secs(20)),
            "{label} {}",
            mode.as_str()
        );
        assert!(t.elapsed() < Duration::from_secs(30));
        assert_eq!(r.stop().unwrap(), StopReason::Shutdown);
    }
}

/// The receive timeout: an idle server answers the receiver's request for
/// a keepalive, so the session stays; a walsender that stops answering
/// (SIGSTOP) ends it with `ReceiveTimeout` (without retries, as the error
/// of `run`), and with retries the receiver connects again and every
/// segment stays byte-identical.
#[test]
fn receive_timeout_ends_a_silent_session_only() {
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let c = Cluster::start(label, &bin, Options::default());
    let dir = recv_dir(&c, "recv");
    let timeout = Duration::from_secs(1);
    let walsender =
        || c.query("SELECT coalesce((SELECT pid::text FROM pg_stat_replication), 'none')");
    let signal = |pid: &str, sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, pid])
            .status()
            .unwrap()
            .success());
    };

    // no retries: idle for five timeouts, then silent
    let r = Running::start(
        recv_config(&c),
        PhysicalConfig::new(&dir)
            .slot("recv")
            .create_slot(true)
            .status_interval(Duration::from_secs(30))
            .receive_timeout(Some(timeout)),
    );
    wait_until("streaming", || walsender() != "none");
    let first = walsender();
    std::thread::sleep(timeout * 5);
    assert!(
        !r.thread.as_ref().unwrap().is_finished(),
        "{label}: an idle session ended"
    );
    assert_eq!(walsender(), first, "{label}: an idle session was replaced");
    signal(&first, "-STOP");
    let t = Instant::now();
    while !r.thread.as_ref().unwrap().is_finished() {
        assert!(
            t.elapsed() < timeout * 10,
            "{label}: the receiver kept waiting for a stopped walsender"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let noticed = t.elapsed();
    signal(&first, "-CONT");
    let e = r.stop().unwrap_err();
    assert!(
        matches!(e, pgwal::Error::ReceiveTimeout { .. }) && e.is_transient(),
        "{label}: {e}"
    );

    // with retries: the stream goes on after a silent spell
    let retry = pgwal::RetryConfig::default()
        .max_attempts(Some(50))
        .initial_backoff(Duration::from_millis(50));
    wait_until("the old walsender gone", || walsender() == "none");
    let r = Running::start(
        recv_config(&c),
        PhysicalConfig::new(&dir)
            .slot("recv")
            .retry(retry)
            .status_interval(Duration::from_millis(100))
            .receive_timeout(Some(timeout)),
    );
    wait_until("streaming", || walsender() != "none");
    let pid = walsender();
    signal(&pid, "-STOP");
    c.psql("CREATE TABLE silent AS SELECT g, repeat('s', 100) AS v FROM generate_series(1, 30000) g; SELECT pg_switch_wal();");
    std::thread::sleep(timeout * 3);
    signal(&pid, "-CONT");
    let end = lsn(&c, "SELECT pg_current_wal_flush_lsn()");
    r.wait_flushed(end, label);
    assert_ne!(walsender(), pid, "{label}: no new session");
    assert_eq!(r.stop().unwrap(), StopReason::Shutdown);
    let n = compare_complete_segments(label, &dir, &c.dir.join("data/pg_wal"));
    assert!(n >= 1, "{label}: no complete segment");
    eprintln!(
        "{label}: a stopped walsender noticed after {noticed:.1?} (receive timeout {timeout:?})"
    );
}
