//! `pgwal receive` as a process: kill -9 under `--ack flush` loses no
//! acknowledged WAL, resume, SIGTERM, unwritable directory, `--help`.

#[path = "../../pgwal/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Cluster, Options};

const APP: &str = "pgwal_recv";
const SEG: u64 = 16 << 20;

fn receiver(c: &Cluster, dir: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .arg("-d")
        .arg(format!(
            "{} sslmode=disable application_name={APP}",
            c.conninfo("postgres")
        ))
        .arg("receive")
        .arg("-D")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
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

fn lsn(s: &str) -> u64 {
    let (hi, lo) = s.trim().split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Every received segment file (complete or `.partial`) holds the server's
/// bytes up to `upto`; returns the number of bytes compared.
fn received_matches_server(dir: &Path, pg_wal: &Path, upto: u64) -> u64 {
    let mut compared = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let base = name.strip_suffix(".partial").unwrap_or(&name);
        if base.len() != 24 {
            continue;
        }
        let segno = u64::from_str_radix(&base[8..16], 16).unwrap() * 0x100
            + u64::from_str_radix(&base[16..], 16).unwrap();
        let start = segno * SEG;
        if upto <= start {
            continue;
        }
        let n = (upto - start).min(SEG) as usize;
        let ours = std::fs::read(dir.join(&name)).unwrap();
        let theirs = std::fs::read(pg_wal.join(base)).unwrap();
        assert!(
            ours[..n] == theirs[..n],
            "{name}: first {n} bytes differ from the server's"
        );
        compared += n as u64;
    }
    compared
}

/// pgbench inserting one row per transaction into `t` with 4 clients for 4 s.
fn insert_load(c: &Cluster) -> Child {
    std::fs::write(c.dir.join("insert.sql"), "INSERT INTO t VALUES (1);\n").unwrap();
    Command::new(c.bin.join("pgbench"))
        .args([
            "-n",
            "-c",
            "4",
            "-T",
            "4",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-p",
        ])
        .arg(c.port.to_string())
        .arg("-f")
        .arg(c.dir.join("insert.sql"))
        .arg("postgres")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn kill_9_under_ack_flush_loses_no_acknowledged_wal() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(
            label,
            &bin,
            Options {
                conf: vec![
                    format!("synchronous_standby_names = '{APP}'"),
                    "synchronous_commit = on".into(),
                    "autovacuum = off".into(),
                ],
                ..Options::default()
            },
        );
        c.psql("SET synchronous_commit = local; CREATE TABLE t (v int)");
        let dir = c.dir.join("recv");
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = receiver(
            &c,
            &dir,
            &["-S", "recv", "--create-slot", "--ack", "flush", "-s", "1"],
        );
        let sync = || {
            c.query(&format!(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{APP}'"
            ))
        };
        wait_until("sync standby", || sync() == "sync");
        let start = lsn(&c.query("SELECT pg_current_wal_lsn()"));
        let mut bench = insert_load(&c);
        std::thread::sleep(Duration::from_millis(1500));
        r.kill().unwrap(); // SIGKILL
        r.wait().unwrap();
        let committed_before_kill =
            c.query("SET synchronous_commit = local; SELECT count(*) FROM t");
        // The slot's restart_lsn is the last flush position the receiver
        // reported: every acknowledged commit is before it.
        let reported =
            lsn(&c.query("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'recv'"));
        assert!(
            reported > start,
            "{label}: flush never advanced ({committed_before_kill} rows)"
        );
        let n = received_matches_server(&dir, &c.dir.join("data/pg_wal"), reported);
        assert!(n > 0, "{label}");
        assert!(
            committed_before_kill.parse::<u64>().unwrap() > 0,
            "{label}: no commit acknowledged"
        );

        // Resume: the blocked commits are released, then a clean SIGTERM stop.
        let r = receiver(&c, &dir, &["-S", "recv", "--ack", "flush", "-s", "1"]);
        assert!(bench.wait().unwrap().success(), "{label}: pgbench");
        c.psql("SET synchronous_commit = local; SELECT pg_switch_wal(); CREATE TABLE after_switch (v int);");
        let end = c.query("SELECT pg_current_wal_flush_lsn()");
        wait_until("flush reported", || {
            c.query(&format!(
                "SELECT restart_lsn >= '{end}' FROM pg_replication_slots WHERE slot_name = 'recv'"
            )) == "t"
        });
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(r.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
        let out = r.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{label}: {err}");
        assert!(err.contains("stopped (Shutdown)"), "{label}: {err}");
        let upto = lsn(&end);
        assert!(
            received_matches_server(&dir, &c.dir.join("data/pg_wal"), upto) > n,
            "{label}"
        );
        let complete = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().len() == 24)
            .count();
        assert!(complete >= 1, "{label}: the switched segment is complete");
    }
}

/// `--ack write` fsyncs at least every status interval even under steady
/// load, when every batch sends a status update of its own (the lab's
/// audit-receiver found that it did not: acknowledged WAL stayed unsynced
/// until its segment was complete).
#[test]
fn ack_write_fsyncs_every_status_interval_under_load() {
    let (label, bin) = support::servers().into_iter().last().unwrap();
    let c = Cluster::start(
        label,
        &bin,
        Options {
            conf: vec![
                format!("synchronous_standby_names = '{APP}'"),
                "synchronous_commit = remote_write".into(),
                "autovacuum = off".into(),
            ],
            ..Options::default()
        },
    );
    c.psql("SET synchronous_commit = local; CREATE TABLE t (v int)");
    let dir = c.dir.join("recv");
    std::fs::create_dir_all(&dir).unwrap();
    let mut r = receiver(&c, &dir, &["--ack", "write", "-s", "0.5"]);
    let flush = || {
        lsn(&c.query(&format!(
            "SELECT flush_lsn FROM pg_stat_replication WHERE application_name = '{APP}'"
        )))
    };
    wait_until("sync standby", || {
        c.query(&format!(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{APP}'"
        )) == "sync"
    });
    let mut bench = insert_load(&c);
    std::thread::sleep(Duration::from_millis(1000));
    let first = flush();
    std::thread::sleep(Duration::from_millis(1500));
    let second = flush();
    assert!(bench.wait().unwrap().success(), "{label}: pgbench");
    assert!(
        second > first,
        "{label}: under load the flush position stayed at {first:X} for 1.5 s (status interval 0.5 s)"
    );
    r.kill().unwrap();
    r.wait().unwrap();
}

#[test]
fn unwritable_directory_is_refused_and_left_alone() {
    let dir = std::env::temp_dir().join(format!("pgwal-ro-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("000000010000000000000001"), b"not touched").unwrap();
    let mut cmd = if support::is_root() {
        // root may write anywhere: run as the unprivileged user on a root-owned directory.
        let _ = Command::new(support::repo_root().join("tools/as-user"))
            .arg("--ensure")
            .output();
        let mut c = Command::new(support::repo_root().join("tools/as-user"));
        c.arg(env!("CARGO_BIN_EXE_pgwal"));
        c
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        Command::new(env!("CARGO_BIN_EXE_pgwal"))
    };
    // No server is needed: the directory is checked before connecting.
    let out = cmd
        .args([
            "-d",
            "host=127.0.0.1 port=1 sslmode=disable",
            "receive",
            "-D",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot create a file in") && err.contains("ermission denied"),
        "{err}"
    );
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["000000010000000000000001"]);
    assert_eq!(
        std::fs::read(dir.join("000000010000000000000001")).unwrap(),
        b"not touched"
    );
    if !support::is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn receive_help_documents_the_ack_modes() {
    let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .args(["receive", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "--ack",
        "receive",
        "write",
        "flush",
        "remote_write",
        "Deliberate",
        "fsync",
        "--status-interval",
    ] {
        assert!(help.contains(needle), "missing {needle:?} in:\n{help}");
    }
}
