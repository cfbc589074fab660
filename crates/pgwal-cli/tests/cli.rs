//! The `pgwal` binary against real servers.

#[path = "../../pgwal/tests/support/mod.rs"]
mod support;

use std::process::Command;

use serde_json::Value;
use support::{Cluster, Options};

fn pgwal(c: &Cluster, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pgwal"))
        .arg("-d")
        .arg(format!("{} sslmode=disable", c.conninfo("postgres")))
        .args(args)
        .output()
        .unwrap();
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
        for s in ["s1", "s2", "s3"] {
            let (ok, _, err) = pgwal(&c, &["slot", "drop", s]);
            assert!(ok, "{label}: {err}");
        }
        let (_, out, _) = pgwal(&c, &["slot", "list"]);
        assert_eq!(out, "");
    }
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
