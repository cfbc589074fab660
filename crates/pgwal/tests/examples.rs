//! The examples in `examples/` run against real servers: consuming with
//! explicit acknowledgements, resuming exactly once after a restart (also
//! from a slot behind the stored position, and after a crash that left
//! unrecorded output), and receiving physical WAL to an end position.

mod support;

#[allow(dead_code)]
#[path = "../examples/consume_with_acks.rs"]
mod consume_with_acks;
#[allow(dead_code)]
#[path = "../examples/physical_receive.rs"]
mod physical_receive;
#[allow(dead_code)]
#[path = "../examples/resume_after_restart.rs"]
mod resume_after_restart;

use std::path::{Path, PathBuf};

use pgwal::Lsn;
use support::{Cluster, Options};

fn args(list: &[&str]) -> Vec<String> {
    std::iter::once("example")
        .chain(list.iter().copied())
        .map(String::from)
        .collect()
}

fn scratch(label: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "pgwal-example-{}-{label}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The ids of the inserted rows in an example's JSON lines output.
fn inserted_ids(path: &Path) -> Vec<i64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect(l))
        .filter(|v| v["op"] == "insert")
        .map(|v| v["new"]["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn consume_and_resume_examples() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        let conninfo = format!("{} sslmode=disable", c.conninfo("postgres"));
        c.psql(
            "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t;
             SELECT pg_create_logical_replication_slot(s, 'pgoutput')
               FROM unnest(ARRAY['s_acks', 's_resume', 's_behind']) s;",
        );
        c.psql("INSERT INTO t VALUES (1, 'a'); INSERT INTO t VALUES (2, 'b');");
        let stop1 = c.query("SELECT pg_current_wal_insert_lsn()");
        let d = scratch(label, "logical");

        // consume_with_acks: everything up to the stop, and the slot moved there.
        let out = d.join("acks.jsonl");
        support::block_on(consume_with_acks::run(
            args(&[&conninfo, "s_acks", "p", out.to_str().unwrap(), &stop1]),
            std::future::pending(),
        ))
        .unwrap();
        assert_eq!(inserted_ids(&out), [1, 2], "{label}");
        assert!(
            c.confirmed_flush("s_acks") >= stop1.parse().unwrap(),
            "{label}"
        );

        // resume_after_restart, first run.
        let (state, out) = (d.join("state"), d.join("resume.jsonl"));
        let resume = |slot: &str, state: &Path, out: &Path, stop: &str| {
            support::block_on(resume_after_restart::run(
                args(&[
                    &conninfo,
                    slot,
                    "p",
                    state.to_str().unwrap(),
                    out.to_str().unwrap(),
                    stop,
                ]),
                std::future::pending(),
            ))
            .unwrap()
        };
        resume("s_resume", &state, &out, &stop1);
        assert_eq!(inserted_ids(&out), [1, 2], "{label}");

        // A crash after the output was appended but before the state
        // recorded it: the next run cuts the unrecorded line off.
        std::fs::write(
            &out,
            std::fs::read_to_string(&out).unwrap()
                + "{\"op\":\"insert\",\"new\":{\"id\":\"99\"}}\n",
        )
        .unwrap();
        c.psql("INSERT INTO t VALUES (3, 'c');");
        let stop2 = c.query("SELECT pg_current_wal_insert_lsn()");
        resume("s_resume", &state, &out, &stop2);
        assert_eq!(inserted_ids(&out), [1, 2, 3], "{label}");

        // The acknowledgement lost in a crash: a slot behind the stored
        // position (s_behind was never acknowledged at all) resends nothing
        // the output already holds.
        let (state_b, out_b) = (d.join("state-b"), d.join("resume-b.jsonl"));
        std::fs::copy(&state, &state_b).unwrap();
        std::fs::copy(&out, &out_b).unwrap();
        c.psql("INSERT INTO t VALUES (4, 'd');");
        let stop3 = c.query("SELECT pg_current_wal_insert_lsn()");
        assert!(c.confirmed_flush("s_behind") < stop1.parse().unwrap());
        resume("s_behind", &state_b, &out_b, &stop3);
        assert_eq!(inserted_ids(&out_b), [1, 2, 3, 4], "{label}");
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[test]
fn physical_receive_example() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        let conninfo = format!("{} sslmode=disable", c.conninfo("postgres"));
        c.psql("CREATE TABLE w AS SELECT g FROM generate_series(1, 20000) g;");
        let end = c.query("SELECT pg_current_wal_insert_lsn()");
        let d = scratch(label, "physical");
        let dir = d.join("wal");
        support::block_on(physical_receive::run(
            args(&[&conninfo, dir.to_str().unwrap(), "write", &end]),
            std::future::pending(),
        ))
        .unwrap();
        // the slot the example made holds the server's WAL from where it stopped
        let restart: Lsn = c
            .query("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'pgwal_example'")
            .parse()
            .unwrap();
        assert!(
            restart >= end.parse().unwrap(),
            "{label}: slot at {restart}, end {end}"
        );
        let files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            files
                .iter()
                .any(|f| f.len() == 24 || f.ends_with(".partial")),
            "{label}: {files:?}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
