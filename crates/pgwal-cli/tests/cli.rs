//! The `pgwal` binary against real servers.

#[path = "../../pgwal/tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Cluster, Options};

/// The `pgwal` binary with `-d` for the cluster.
fn pgwal_command(c: &Cluster) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgwal"));
    cmd.arg("-d")
        .arg(format!("{} sslmode=disable", c.conninfo("postgres")));
    cmd
}

/// Reads the address `--metrics` printed as its first line on stderr.
fn metrics_address(label: &str, err: &mut impl BufRead) -> String {
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    first
        .trim()
        .strip_prefix("pgwal: metrics at http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{label}: {first}"))
        .to_owned()
}

fn pgwal(c: &Cluster, args: &[&str]) -> (bool, String, String) {
    let out = pgwal_command(c).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn slot_commands_and_stream() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t;");

        let (ok, out, err) = pgwal(&c, &["slot", "create", "s1"]);
        assert!(ok, "{label}: {err}");
        assert_eq!(lines(&out)[0]["slot_name"], "s1");
        let (ok, _, err) = pgwal(&c, &["slot", "create", "s1"]);
        assert!(
            !ok && err.contains("42710"),
            "{label}: duplicate slot must fail with SQLSTATE: {err}"
        );

        c.psql("INSERT INTO t VALUES (1, 'a'), (2, NULL); UPDATE t SET v = 'b' WHERE id = 1; DELETE FROM t WHERE id = 2;");
        let stop = c.query("SELECT pg_current_wal_insert_lsn()");
        let (ok, out, err) = pgwal(&c, &["stream", "-S", "s1", "-P", "p", "--stop-lsn", &stop]);
        assert!(ok, "{label}: {err}");
        let ev = lines(&out);
        let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "begin", "insert", "insert", "commit", "begin", "update", "commit", "begin",
                "delete", "commit"
            ],
            "{label}"
        );
        assert_eq!(ev[1]["table"], "t");
        assert_eq!(ev[1]["new"]["v"], "a");
        assert_eq!(ev[2]["new"]["v"], Value::Null);
        assert_eq!(ev[8]["key"]["id"], "2");
        // Acked after the flush of each commit: the slot confirmed the last one.
        let last_end = ev[9]["end_lsn"].as_str().unwrap();
        let confirmed =
            c.query("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 's1'");
        let ge = c.query(&format!(
            "SELECT '{confirmed}'::pg_lsn >= '{last_end}'::pg_lsn"
        ));
        assert_eq!(
            ge, "t",
            "{label}: confirmed {confirmed} < last commit end {last_end}"
        );

        // Nothing new: a second run with the same stop position prints nothing.
        let (ok, out, err) = pgwal(&c, &["stream", "-S", "s1", "-P", "p", "--stop-lsn", &stop]);
        assert!(ok, "{label}: {err}");
        assert_eq!(
            out, "",
            "{label}: acked transactions must not be redelivered"
        );

        // --create-slot on a fresh slot.
        let stop = c.query("SELECT pg_current_wal_insert_lsn()");
        let (ok, _, err) = pgwal(
            &c,
            &[
                "stream",
                "-S",
                "s2",
                "-P",
                "p",
                "--create-slot",
                "--stop-lsn",
                &stop,
            ],
        );
        assert!(ok, "{label}: {err}");

        // --snapshot: the table as of the slot's snapshot, then the stream.
        c.psql("INSERT INTO t VALUES (3, 'c');");
        let stop = c.query("SELECT pg_current_wal_insert_lsn()");
        let (ok, out, err) = pgwal(
            &c,
            &[
                "stream",
                "-S",
                "s3",
                "-P",
                "p",
                "--snapshot",
                "--stop-lsn",
                &stop,
            ],
        );
        assert!(ok, "{label}: {err}");
        let ev = lines(&out);
        let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            ["snapshot", "snapshot", "snapshot_end"],
            "{label}: {out}"
        );
        assert_eq!(ev[0]["row"]["id"], "1");
        assert_eq!(ev[0]["row"]["v"], "b");
        assert_eq!(ev[2]["rows"], 2);

        let (ok, out, _) = pgwal(&c, &["slot", "list"]);
        assert!(ok);
        let names: Vec<String> = lines(&out)
            .iter()
            .map(|s| s["slot_name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["s1", "s2", "s3"], "{label}");
        // Health: how far behind the server's WAL, whether its WAL is kept.
        let health = &lines(&out)[0];
        assert!(
            health["lag_bytes"].as_i64().unwrap() >= 0,
            "{label}: {health}"
        );
        assert_eq!(health["wal_status"], "reserved", "{label}: {health}");
        assert!(
            health["active"] == false && health["active_pid"].is_null(),
            "{label}: {health}"
        );
        let v17 = c.query("SHOW server_version_num").parse::<u32>().unwrap() >= 170000;
        assert_eq!(
            health.get("invalidation_reason").is_some(),
            v17,
            "{label}: columns of 17+ where the server has them: {health}"
        );
        if v17 {
            assert_eq!(health["failover"], false, "{label}: {health}");
        }
        // (switching segments writes out WAL that an asynchronous commit may keep in buffers)
        c.psql("INSERT INTO t VALUES (10, 'lag'); SELECT pg_switch_wal();");
        let (ok, out2, _) = pgwal(&c, &["slot", "list"]);
        assert!(ok);
        assert!(
            lines(&out2)[0]["lag_bytes"].as_i64() > health["lag_bytes"].as_i64(),
            "{label}: the lag grows with WAL the slot has not confirmed: {health} then {out2}"
        );
        let (ok, tbl, err) = pgwal(&c, &["slot", "list", "--format", "table"]);
        assert!(ok, "{label}: {err}");
        let rows: Vec<&str> = tbl.lines().collect();
        assert!(
            rows[0].starts_with("slot") && rows[0].contains("lag") && rows.len() == 4,
            "{label}: {tbl}"
        );
        assert!(
            rows[1].starts_with("s1 ") && rows[1].contains("reserved"),
            "{label}: {tbl}"
        );
        for s in ["s1", "s2", "s3"] {
            let (ok, _, err) = pgwal(&c, &["slot", "drop", s]);
            assert!(ok, "{label}: {err}");
        }
        let (_, out, _) = pgwal(&c, &["slot", "list"]);
        assert_eq!(out, "");
    }
}

fn confirmed(c: &Cluster, slot: &str) -> String {
    c.query(&format!(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ))
}

fn lsn_ge(c: &Cluster, a: &str, b: &str) -> bool {
    c.query(&format!("SELECT '{a}'::pg_lsn >= '{b}'::pg_lsn")) == "t"
}

fn stream_acking_on_stdin(c: &Cluster, slot: &str) -> std::process::Child {
    pgwal_command(c)
        .args([
            "stream",
            "-S",
            slot,
            "-P",
            "p",
            "--acks",
            "stdin",
            "--status-interval",
            "0.1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `--acks stdin`: only what the consumer writes back is acknowledged; a
/// position never written, or a line that is not one, is refused with
/// nothing acknowledged; end of stdin ends the stream.
#[test]
fn consumer_acknowledges_on_stdin() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;");
        let (ok, _, err) = pgwal(&c, &["slot", "create", "s"]);
        assert!(ok, "{label}: {err}");
        let start = confirmed(&c, "s");
        c.psql("INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); INSERT INTO t VALUES (3);");

        let mut p = stream_acking_on_stdin(&c, "s");
        let mut out = BufReader::new(p.stdout.take().unwrap());
        let mut ends = Vec::new();
        while ends.len() < 3 {
            let mut l = String::new();
            assert!(
                out.read_line(&mut l).unwrap() > 0,
                "{label}: stream ended early"
            );
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["type"] == "commit" {
                ends.push(v["end_lsn"].as_str().unwrap().to_owned());
            }
        }
        // Printed and flushed, but not acknowledged by the consumer: the slot stays.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            confirmed(&c, "s"),
            start,
            "{label}: acked without the consumer"
        );
        let mut stdin = p.stdin.take().unwrap();
        writeln!(stdin, "{}", ends[0]).unwrap();
        let t0 = Instant::now();
        while !lsn_ge(&c, &confirmed(&c, "s"), &ends[0]) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{label}: ack never confirmed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            !lsn_ge(&c, &confirmed(&c, "s"), &ends[1]),
            "{label}: confirmed beyond the ack"
        );
        drop(stdin); // end of acknowledgements: the stream ends cleanly
        let st = p.wait().unwrap();
        assert!(st.success(), "{label}: exit {st:?}");

        // The next run starts after the acked transaction: 2 and 3 again.
        let stop = c.query("SELECT pg_current_wal_insert_lsn()");
        let (ok, out, err) = pgwal(&c, &["stream", "-S", "s", "-P", "p", "--stop-lsn", &stop]);
        assert!(ok, "{label}: {err}");
        let ids: Vec<String> = lines(&out)
            .iter()
            .filter(|e| e["type"] == "insert")
            .map(|e| e["new"]["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids, ["2", "3"], "{label}");

        // Bad acknowledgements: refused with a clear error, nothing acked.
        c.psql("INSERT INTO t VALUES (4);");
        let before = confirmed(&c, "s");
        for (line, want) in [
            ("not-a-position", "stdin line 1: expected a position"),
            ("FF/0", "beyond the last position delivered"),
        ] {
            let mut p = stream_acking_on_stdin(&c, "s");
            writeln!(p.stdin.as_mut().unwrap(), "{line}").unwrap();
            let o = p.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                !o.status.success() && err.contains(want),
                "{label}: {line}: {err}"
            );
            assert_eq!(
                confirmed(&c, "s"),
                before,
                "{label}: {line} acknowledged something"
            );
        }
    }
}

/// `--state`: a slot dropped and created again (ahead of what this consumer
/// confirmed) or invalidated is refused before anything is streamed.
#[test]
fn state_file_refuses_a_slot_moved_behind_its_back() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;");
        let dir =
            std::env::temp_dir().join(format!("pgwal-cli-state-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("s.state");
        let state_arg = state.to_str().unwrap();
        let (ok, _, err) = pgwal(&c, &["slot", "create", "s"]);
        assert!(ok, "{label}: {err}");

        // A normal run records where it confirmed; a second run continues.
        c.psql("INSERT INTO t VALUES (1)");
        let stop = c.query("SELECT pg_current_wal_insert_lsn()");
        let (ok, out, err) = pgwal(
            &c,
            &[
                "stream",
                "-S",
                "s",
                "-P",
                "p",
                "--state",
                state_arg,
                "--stop-lsn",
                &stop,
            ],
        );
        assert!(ok && out.contains("\"insert\""), "{label}: {err}");
        let file: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        assert_eq!(file["slot"], "s");
        assert!(
            lsn_ge(&c, file["confirmed"].as_str().unwrap(), &confirmed(&c, "s")),
            "{label}: {file}"
        );
        c.psql("INSERT INTO t VALUES (2)");
        let stop = c.query("SELECT pg_current_wal_insert_lsn()");
        let (ok, out, err) = pgwal(
            &c,
            &[
                "stream",
                "-S",
                "s",
                "-P",
                "p",
                "--state",
                state_arg,
                "--stop-lsn",
                &stop,
            ],
        );
        assert!(
            ok && out.contains("\"2\"") && !out.contains("\"1\""),
            "{label}: {err}\n{out}"
        );

        // Dropped and created again after more writes: row 3 was never received here.
        c.psql("INSERT INTO t VALUES (3)");
        let (ok, _, err) = pgwal(&c, &["slot", "drop", "s"]);
        assert!(ok, "{label}: {err}");
        let (ok, _, err) = pgwal(&c, &["slot", "create", "s"]);
        assert!(ok, "{label}: {err}");
        let recreated = confirmed(&c, "s");
        let (ok, out, err) = pgwal(
            &c,
            &[
                "stream",
                "-S",
                "s",
                "-P",
                "p",
                "--state",
                state_arg,
                "--stop-lsn",
                &stop,
            ],
        );
        assert!(
            !ok && out.is_empty()
                && err.contains("beyond")
                && err.contains("dropped and created again"),
            "{label}: {err}"
        );
        assert_eq!(
            confirmed(&c, "s"),
            recreated,
            "{label}: the refused run moved the slot"
        );

        // Another server's file is refused too.
        std::fs::write(
            &state,
            r#"{"system_identifier": "1", "slot": "s", "confirmed": "0/0"}"#,
        )
        .unwrap();
        let (ok, _, err) = pgwal(
            &c,
            &[
                "stream",
                "-S",
                "s",
                "-P",
                "p",
                "--state",
                state_arg,
                "--stop-lsn",
                &stop,
            ],
        );
        assert!(!ok && err.contains("system identifier"), "{label}: {err}");

        // An invalidated slot is refused, with or without a state file.
        c.psql("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'; SELECT pg_reload_conf();");
        std::thread::sleep(Duration::from_millis(300));
        c.psql("CREATE TABLE filler (x text)");
        for _ in 0..4 {
            c.psql("INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 20000); SELECT pg_switch_wal();");
        }
        c.psql("CHECKPOINT");
        let status = c.query("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 's'");
        assert_eq!(status, "lost", "{label}: the slot was not invalidated");
        let (ok, _, err) = pgwal(&c, &["stream", "-S", "s", "-P", "p", "--stop-lsn", &stop]);
        assert!(!ok && err.contains("was invalidated"), "{label}: {err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

fn scrape(addr: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `--metrics`: a Prometheus scrape during a stream shows what it did.
#[test]
fn metrics_are_served_during_a_stream() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;");
        let (ok, _, err) = pgwal(&c, &["slot", "create", "s"]);
        assert!(ok, "{label}: {err}");
        let mut p = pgwal_command(&c)
            .args([
                "stream",
                "-S",
                "s",
                "-P",
                "p",
                "--metrics",
                "127.0.0.1:0",
                "--status-interval",
                "0.2",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(p.stderr.take().unwrap());
        let addr = metrics_address(label, &mut err);
        c.psql("INSERT INTO t SELECT generate_series(1, 5); INSERT INTO t VALUES (6);");
        let mut out = BufReader::new(p.stdout.take().unwrap());
        let mut ends = Vec::new();
        while ends.len() < 2 {
            let mut l = String::new();
            assert!(out.read_line(&mut l).unwrap() > 0, "{label}: stream ended");
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["type"] == "commit" {
                let (hi, lo) = v["end_lsn"].as_str().unwrap().split_once('/').unwrap();
                ends.push(
                    ((u64::from_str_radix(hi, 16).unwrap() << 32)
                        | u64::from_str_radix(lo, 16).unwrap()) as f64,
                );
            }
        }
        // the positions are sampled every second: wait for a sample after both commits
        let t0 = Instant::now();
        let text = loop {
            let text = scrape(&addr);
            if metric(&text, "pgwal_acked_lsn").unwrap_or(0.0) >= ends[1]
                && metric(&text, "pgwal_server_wal_end_lsn").unwrap_or(0.0) > 0.0
            {
                break text;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{label}: {text}");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            text.starts_with("HTTP/1.1 200") && text.contains("application/openmetrics-text"),
            "{text}"
        );
        assert_eq!(
            metric(&text, "pgwal_events_total{kind=\"insert\"}"),
            Some(6.0),
            "{label}: {text}"
        );
        assert_eq!(
            metric(&text, "pgwal_events_total{kind=\"commit\"}"),
            Some(2.0),
            "{label}: {text}"
        );
        assert!(
            metric(&text, "pgwal_output_bytes_total").unwrap() > 100.0,
            "{label}: {text}"
        );
        assert_eq!(
            metric(&text, "pgwal_reconnects_total"),
            Some(0.0),
            "{label}: {text}"
        );
        assert!(
            metric(&text, "pgwal_lag_bytes").is_some()
                && metric(&text, "pgwal_lag_seconds").is_some()
        );
        // A terminated walsender is a reconnect.
        c.psql("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'");
        let t0 = Instant::now();
        while metric(&scrape(&addr), "pgwal_reconnects_total") != Some(1.0) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{label}: no reconnect counted"
            );
            c.psql("INSERT INTO t VALUES ((SELECT max(id) + 1 FROM t))");
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// `--config FILE`: the stream's options from TOML, with the command line's
/// validation, and the command line overriding the file.
#[test]
fn stream_options_from_a_config_file() {
    let (label, bin) = support::servers().into_iter().last().unwrap();
    let c = Cluster::start(label, &bin, Options::default());
    c.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;");
    let (ok, _, err) = pgwal(&c, &["slot", "create", "s"]);
    assert!(ok, "{label}: {err}");
    c.psql("INSERT INTO t VALUES (1)");
    let stop = c.query("SELECT pg_current_wal_insert_lsn()");
    let dir = std::env::temp_dir().join(format!("pgwal-cli-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("stream.toml");
    let file = f.to_str().unwrap();
    std::fs::write(
        &f,
        format!("slot = \"nonexistent\"\npublication = [\"p\"]\nstop_lsn = \"{stop}\"\nstatus_interval = 0.5\n"),
    )
    .unwrap();
    // --slot on the command line wins over the file's
    let (ok, out, err) = pgwal(&c, &["stream", "--config", file, "--slot", "s"]);
    assert!(ok && out.contains("\"insert\""), "{label}: {err}");
    std::fs::write(
        &f,
        "slot = \"s\"\npublication = \"p\"\nstatus_interval = \"soon\"\n",
    )
    .unwrap();
    let (ok, _, err) = pgwal(&c, &["stream", "--config", file]);
    assert!(
        !ok && err.contains("--status-interval") && err.contains("soon"),
        "{err}"
    );
    std::fs::write(&f, "slot = \"s\"\npublication = \"p\"\nbogus = 1\n").unwrap();
    let (ok, _, err) = pgwal(&c, &["stream", "--config", file]);
    assert!(!ok && err.contains("--bogus"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Multi-host connection strings: `target_session_attrs` picks the host,
/// like libpq (a server made read-only by `default_transaction_read_only`
/// stands in for a standby here; both report it at startup from 14 on).
#[test]
fn target_session_attrs_pick_the_host() {
    for (label, bin) in support::servers() {
        let ro = Cluster::start(label, &bin, Options::default());
        let rw = Cluster::start(label, &bin, Options::default());
        ro.psql("SELECT pg_create_logical_replication_slot('on_ro', 'pgoutput')");
        rw.psql("SELECT pg_create_logical_replication_slot('on_rw', 'pgoutput')");
        ro.psql("ALTER SYSTEM SET default_transaction_read_only = on; SELECT pg_reload_conf();");
        std::thread::sleep(Duration::from_millis(300));
        let list = |hosts: &str, ports: &str, attrs: &str| {
            let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
                .arg("-d")
                .arg(format!(
                    "host={hosts} port={ports} user=postgres dbname=postgres sslmode=disable \
                     target_session_attrs={attrs}"
                ))
                .args(["slot", "list"])
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let both = format!("{},{}", ro.port, rw.port);
        let (ok, out, err) = list("127.0.0.1,127.0.0.1", &both, "read-write");
        assert!(
            ok && out.contains("on_rw") && !out.contains("on_ro"),
            "{label}: {err}"
        );
        let (ok, out, err) = list("127.0.0.1,127.0.0.1", &both, "read-only");
        assert!(ok && out.contains("on_ro"), "{label}: {err}");
        let (ok, out, err) = list("127.0.0.1,127.0.0.1", &both, "any");
        assert!(
            ok && out.contains("on_ro"),
            "{label}: the first host: {err}"
        );
        // a host that is down is passed over
        let down = support::free_port();
        let (ok, out, err) = list("127.0.0.1,127.0.0.1", &format!("{down},{}", rw.port), "any");
        assert!(ok && out.contains("on_rw"), "{label}: {err}");
        // nothing suitable: every host and why
        let (ok, _, err) = list(
            "127.0.0.1,127.0.0.1",
            &format!("{},{down}", ro.port),
            "read-write",
        );
        assert!(
            !ok && err.contains("no server is read-write") && err.contains("is not read-write"),
            "{label}: {err}"
        );
    }
}

/// A slot near its `max_slot_wal_keep_size` limit is warned about, and its
/// room is a metric.
#[test]
fn stream_warns_before_the_slot_is_invalidated() {
    let (label, bin) = support::servers().into_iter().last().unwrap();
    let c = Cluster::start(label, &bin, Options::default());
    c.psql(
        "CREATE TABLE t (id int); CREATE PUBLICATION p FOR TABLE t; CREATE TABLE filler (x text);",
    );
    c.psql("ALTER SYSTEM SET max_slot_wal_keep_size = '64MB'; SELECT pg_reload_conf();");
    let (ok, _, err) = pgwal(&c, &["slot", "create", "s"]);
    assert!(ok, "{label}: {err}");
    // write WAL until less than a quarter of the 64 MB is left
    loop {
        c.psql("INSERT INTO filler SELECT repeat('x', 200) FROM generate_series(1, 10000)");
        let safe: i64 = c
            .query("SELECT safe_wal_size FROM pg_replication_slots WHERE slot_name = 's'")
            .parse()
            .unwrap();
        assert!(
            safe > 0,
            "{label}: the slot ran out before the test could look"
        );
        if safe < 12 << 20 {
            break;
        }
    }
    let mut p = pgwal_command(&c)
        .args([
            "stream",
            "-S",
            "s",
            "-P",
            "p",
            "--slot-check-interval",
            "0.2",
            "--metrics",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(p.stderr.take().unwrap());
    let addr = metrics_address(label, &mut err);
    let mut warning = String::new();
    err.read_line(&mut warning).unwrap();
    assert!(
        warning.contains("WARNING: slot \"s\" will be invalidated by max_slot_wal_keep_size"),
        "{label}: {warning}"
    );
    let room = metric(&scrape(&addr), "pgwal_slot_safe_wal_bytes").unwrap();
    // (the stream may have moved the slot on since the warning: only bounds)
    assert!(
        room >= 0.0 && room <= (64u64 << 20) as f64,
        "{label}: {room}"
    );
    let _ = p.kill();
    let _ = p.wait();
}

#[test]
fn help_is_complete() {
    let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for w in ["stream", "slot", "--dbname"] {
        assert!(help.contains(w), "{w} missing from --help");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .args(["stream", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for w in [
        "--slot",
        "--publication",
        "--start-lsn",
        "--stop-lsn",
        "--create-slot",
        "--snapshot",
        "--streaming",
    ] {
        assert!(help.contains(w), "{w} missing from stream --help");
    }
}

/// `--snapshot-table`: a table added to the publication while writes run
/// is copied at a consistent point, and its changes that committed before
/// that point are left out of the stream. Applying both gives the table
/// exactly: no insert of a row the copy has, no delete of a row it lacks.
#[test]
fn snapshot_table_backfills_a_table_added_later() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(
            "CREATE TABLE a (id int PRIMARY KEY, v text);
             CREATE TABLE b (id int PRIMARY KEY, v text);
             INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, 3000) g;
             CREATE PUBLICATION p FOR TABLE a;",
        );
        let (ok, _, err) = pgwal(&c, &["slot", "create", "s"]);
        assert!(ok, "{label}: {err}");
        c.psql("INSERT INTO a VALUES (1, 'before'); ALTER PUBLICATION p ADD TABLE b;");
        let (ok, _, err) = pgwal(
            &c,
            &["stream", "-S", "s", "-P", "p", "--snapshot-table", "nosuch"],
        );
        assert!(
            !ok && err.contains("not in the publications"),
            "{label}: {err}"
        );
        let (ok, _, err) = pgwal(
            &c,
            &[
                "stream",
                "-S",
                "s",
                "-P",
                "p",
                "--snapshot-table",
                "b",
                "--streaming",
                "on",
            ],
        );
        assert!(!ok && err.contains("--streaming off"), "{label}: {err}");
        let writer_sql: String = (0..400)
            .map(|i| {
                format!(
                    "INSERT INTO b VALUES ({}, 'new'); UPDATE b SET v = 'u{i}' WHERE id = {}; \
                     DELETE FROM b WHERE id = {}; SELECT pg_sleep(0.003);\n",
                    10_000 + i,
                    1 + 3 * i,
                    2 + 3 * i
                )
            })
            .collect();
        let writer = c.psql_in_background(writer_sql);
        std::thread::sleep(Duration::from_millis(400));
        let mut child = pgwal_command(&c)
            .args([
                "stream",
                "-S",
                "s",
                "-P",
                "p",
                "--snapshot-table",
                "public.b",
            ])
            .args(["--snapshot-jobs", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel::<Value>();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                if tx.send(serde_json::from_str(&l).unwrap()).is_err() {
                    break;
                }
            }
        });
        writer.join().unwrap();
        c.psql("INSERT INTO a VALUES (2, 'marker')");
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let e = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("{label}: the marker never came"));
            let marker = e["type"] == "insert" && e["new"]["v"] == "marker";
            events.push(e);
            if marker {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();

        let end = events
            .iter()
            .position(|e| e["type"] == "snapshot_end")
            .unwrap_or_else(|| panic!("{label}: no snapshot_end"));
        assert_eq!(
            events[end]["tables"],
            serde_json::json!(["public.b"]),
            "{label}"
        );
        let mut b: std::collections::BTreeMap<i64, String> = events[..end]
            .iter()
            .map(|e| {
                assert_eq!(e["table"], "b", "{label}");
                (
                    e["row"]["id"].as_str().unwrap().parse().unwrap(),
                    e["row"]["v"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(b.len() as u64, events[end]["rows"].as_u64().unwrap());
        let (mut streamed, mut a_rows) = (0, 0);
        for e in &events[end + 1..] {
            if e["table"] == "a" {
                a_rows += 1;
                continue;
            }
            if e["table"] != "b" {
                continue;
            }
            streamed += 1;
            let row = if e["type"] == "delete" {
                &e["key"]
            } else {
                &e["new"]
            };
            let id: i64 = row["id"].as_str().unwrap().parse().unwrap();
            match e["type"].as_str().unwrap() {
                "insert" => assert!(
                    b.insert(id, row["v"].as_str().unwrap().to_owned())
                        .is_none(),
                    "{label}: insert of {id}, which the copy has"
                ),
                "update" => assert!(
                    b.insert(id, row["v"].as_str().unwrap().to_owned())
                        .is_some(),
                    "{label}: update of {id}, which the copy lacks"
                ),
                "delete" => assert!(
                    b.remove(&id).is_some(),
                    "{label}: delete of {id}, which the copy lacks"
                ),
                t => panic!("{label}: {t}"),
            }
        }
        let want: std::collections::BTreeMap<i64, String> = c
            .psql("SELECT id || '|' || v FROM b")
            .lines()
            .map(|l| {
                let (id, v) = l.split_once('|').unwrap();
                (id.parse().unwrap(), v.to_owned())
            })
            .collect();
        assert_eq!(b, want, "{label}: copy + stream differ from the table");
        assert!(
            a_rows >= 2,
            "{label}: the published table's changes are missing"
        );
        eprintln!(
            "{label}: {} rows copied at {}, {streamed} changes of b streamed after it",
            events[end]["rows"], events[end]["consistent_point"]
        );
    }
}

/// SIGTERM, as systemd or Kubernetes send it, stops a stream to stdout as
/// Ctrl-C does: pgwal exits 0 after a last status update that acknowledges
/// everything it wrote out (with `--status-interval 600` only an answer to
/// a keepalive could have).
#[test]
fn sigterm_stops_a_stdout_stream_with_its_last_acknowledgement() {
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let c = Cluster::start(label, &bin, Options::default());
    c.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;");
    let (ok, _, err) = pgwal(&c, &["slot", "create", "term_slot"]);
    assert!(ok, "{err}");
    let mut p = pgwal_command(&c)
        .args([
            "stream",
            "-S",
            "term_slot",
            "-P",
            "p",
            "--status-interval",
            "600",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(p.stdout.take().unwrap());
    let mut last_end;
    let t0 = Instant::now();
    // pgwal answers the walsender's keepalives with whatever it has written
    // out since its last status update, and the walsender sends one as soon
    // as it is idle after a commit: if that keepalive arrives after pgwal
    // wrote the commit, the slot is confirmed before the SIGTERM and the test
    // would prove nothing. Commit again until a commit is seen unconfirmed.
    let mut attempts = 0;
    loop {
        attempts += 1;
        assert!(
            attempts <= 20,
            "{label}: every one of 20 commits was confirmed before the SIGTERM"
        );
        c.psql(&format!("INSERT INTO t VALUES ({attempts})"));
        loop {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{label}: commit {attempts} not streamed"
            );
            let mut l = String::new();
            assert!(out.read_line(&mut l).unwrap() > 0, "{label}: stdout ended");
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["type"] == "commit" {
                last_end = v["end_lsn"].as_str().unwrap().to_owned();
                break;
            }
        }
        // the status interval is ten minutes: only a keepalive's answer
        // can have confirmed this commit
        if !lsn_ge(&c, &confirmed(&c, "term_slot"), &last_end) {
            break;
        }
    }
    let pid = p.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = p.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{label}: pgwal still runs 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        status.success(),
        "{label}: pgwal after SIGTERM: {status}\n{err}"
    );
    assert!(
        lsn_ge(&c, &confirmed(&c, "term_slot"), &last_end),
        "{label}: the slot ({}) was not acknowledged up to the last commit written ({last_end})",
        confirmed(&c, "term_slot")
    );
}

/// The exit status says the class of what ended pgwal (exit_code.rs): 2
/// for configuration, 3 for a slot that cannot be used, 4 for retries
/// exhausted.
#[test]
fn exit_status_by_class() {
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let c = Cluster::start(label, &bin, Options::default());
    c.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;");
    let status = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // a slot that does not exist
    let (code, err) = status(pgwal_command(&c).args(["stream", "-S", "nosuch", "-P", "p"]));
    assert_eq!(code, Some(3), "{label}: missing slot: {err}");
    // a connection string pgwal cannot use
    let (code, err) = status(Command::new(env!("CARGO_BIN_EXE_pgwal")).args([
        "-d",
        "nosuchkeyword=1",
        "slot",
        "list",
    ]));
    assert_eq!(code, Some(2), "{label}: bad connection string: {err}");
    // a config file that is not there
    let (code, err) = status(pgwal_command(&c).args([
        "stream",
        "--config",
        "/nonexistent/pgwal.toml",
        "-S",
        "s",
        "-P",
        "p",
    ]));
    assert_eq!(code, Some(2), "{label}: missing config file: {err}");
    // a server that is not there, retried until the attempts run out
    let dir = std::env::temp_dir().join(format!("pgwal-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (code, err) = status(
        Command::new(env!("CARGO_BIN_EXE_pgwal"))
            .args([
                "-d",
                "host=127.0.0.1 port=1 user=x dbname=x connect_timeout=1",
            ])
            .args(["receive", "-D"])
            .arg(&dir)
            .args(["--max-retries", "1"]),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(4), "{label}: unreachable server: {err}");
}

/// A server that refuses connections: every retry says on stderr what
/// failed, where, which attempt it was and when the next one comes, in
/// the text log and in the JSON one.
#[test]
fn every_retry_says_what_failed_where_and_when_the_next_comes() {
    // a port nothing listens on: bound, then released
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let where_ = format!("127.0.0.1:{port}");
    for format in ["text", "json"] {
        let mut p = Command::new(env!("CARGO_BIN_EXE_pgwal"))
            .args(["-d", &format!("host=127.0.0.1 port={port} user=x dbname=x")])
            .args(["stream", "-S", "s", "-P", "p"])
            .env_remove("PGWAL_LOG")
            .env("PGWAL_LOG_FORMAT", format)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(p.stderr.take().unwrap());
        let t0 = Instant::now();
        let mut lines = Vec::new();
        // the first three tries come within 0.2 + 0.4 + 0.8 s
        while lines.len() < 3 && t0.elapsed() < Duration::from_secs(20) {
            let mut l = String::new();
            if err.read_line(&mut l).unwrap() == 0 {
                break;
            }
            lines.push(l);
        }
        let _ = p.kill();
        let _ = p.wait();
        assert_eq!(lines.len(), 3, "{format}: {lines:?}");
        for (n, l) in lines.iter().enumerate() {
            let attempt = n + 1;
            if format == "json" {
                let v: Value =
                    serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}"));
                assert_eq!(v["level"], "WARN", "{l}");
                assert_eq!(v["attempt"], attempt, "{l}");
                assert!(v["error"].as_str().unwrap().contains(&where_), "{l}");
                assert!(v["retry_in"].as_str().is_some(), "{l}");
            } else {
                assert!(l.contains(&where_), "{l}");
                assert!(l.contains("Connection refused"), "{l}");
                assert!(l.contains(&format!("attempt={attempt} ")), "{l}");
                assert!(l.contains("retry_in="), "{l}");
            }
        }
    }
    // a format pgwal does not write is refused as configuration
    let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .args(["slot", "list"])
        .env("PGWAL_LOG_FORMAT", "xml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PGWAL_LOG_FORMAT"));
}

/// A clean stop can hang (here on a stdout pipe nobody reads); a second
/// SIGTERM ends pgwal at once, with the status of a process that signal
/// killed, and what was not acknowledged comes again.
#[test]
fn a_second_sigterm_exits_at_once() {
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let c = Cluster::start(label, &bin, Options::default());
    c.psql("CREATE TABLE t (id int PRIMARY KEY, pad text); CREATE PUBLICATION p FOR TABLE t;");
    let (ok, _, err) = pgwal(&c, &["slot", "create", "stuck_slot"]);
    assert!(ok, "{err}");
    // stdout piped and never read: once the pipe's 64 kB are full, pgwal
    // waits on its write
    let mut p = pgwal_command(&c)
        .args(["stream", "-S", "stuck_slot", "-P", "p"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.psql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g");
    // it has read the rows when the walsender has sent them all
    let sent = |c: &Cluster| {
        c.query(
            "SELECT coalesce(sent_lsn >= pg_current_wal_lsn(), false)::text \
             FROM pg_stat_replication WHERE application_name = 'pgwal' OR true LIMIT 1",
        )
    };
    let t0 = Instant::now();
    while sent(&c) != "true" && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = p.id().to_string();
    let term = || {
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success())
    };
    term();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        p.try_wait().unwrap().is_none(),
        "{label}: pgwal ended on the first SIGTERM with its stdout full: the test proves nothing"
    );
    term();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = p.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = p.kill();
            panic!("{label}: pgwal still runs 10 s after a second SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(143), "{label}: {err}");
    assert!(
        err.contains("SIGTERM again: exiting at once"),
        "{label}: {err}"
    );
    // nothing it could not write was acknowledged: the next run gets the
    // whole transaction (the slot may have moved while the walsender still
    // decoded it, as PostgreSQL's own subscriber lets it: never past it)
    let end = c.query("SELECT pg_current_wal_insert_lsn()");
    let (ok, out, err) = pgwal(
        &c,
        &["stream", "-S", "stuck_slot", "-P", "p", "--stop-lsn", &end],
    );
    assert!(ok, "{label}: {err}");
    let inserts = lines(&out).iter().filter(|v| v["type"] == "insert").count();
    assert_eq!(
        inserts, 5000,
        "{label}: the transaction pgwal could not write out did not come again whole"
    );
}
