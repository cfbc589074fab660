//! Records for changes streamed from real servers, in both formats: topics,
//! keys from the replica identity, a key change as delete + create in
//! Debezium's envelope, tombstones, truncates, typed values, and the refusal
//! to write an unchanged TOAST value as a placeholder.

#[path = "../../pgwal/tests/support/mod.rs"]
mod support;

use std::time::Duration;

use futures_util::StreamExt;
use pgwal::{CreateSlotOptions, Event, LogicalStream, Lsn, ReplicationClient, StreamConfig};
use pgwal_kafka::format::FormatError;
use pgwal_kafka::{encode, DecimalMode, Format, Record, Routing, TxInfo};
use serde_json::{json, Value};
use support::{block_on, config, Cluster, Options};

/// Streams everything up to now from a new slot made before `sql` ran,
/// and encodes each change.
fn records(c: &Cluster, sql: &str, format: &Format) -> Vec<Result<Vec<Record>, String>> {
    block_on(async {
        let mut client = ReplicationClient::connect(&config(c, "postgres"))
            .await
            .unwrap();
        let slot = format!("s{}", std::process::id() ^ rand_suffix());
        client
            .create_logical_slot(&slot, &CreateSlotOptions::new())
            .await
            .unwrap();
        c.psql(sql);
        let end: Lsn = c
            .query("SELECT pg_current_wal_insert_lsn()")
            .parse()
            .unwrap();
        let cfg = StreamConfig::new(slot, ["p"]).stop_lsn(end);
        let mut s = LogicalStream::start(config(c, "postgres"), cfg)
            .await
            .unwrap();
        let routing = Routing::new("app", "{prefix}.{schema}.{table}").unwrap();
        let (mut pending, mut out) = (Vec::new(), Vec::new());
        while let Some(e) = tokio::time::timeout(Duration::from_secs(30), s.next())
            .await
            .unwrap()
        {
            match e.unwrap() {
                Event::Begin(_) => pending.clear(),
                Event::Commit(commit) => {
                    let tx = TxInfo::new(1, commit.commit_lsn, commit.commit_time);
                    for e in pending.drain(..) {
                        out.push(
                            encode(format, &routing, &tx, &e, commit.commit_time)
                                .map_err(|e: FormatError| e.to_string()),
                        );
                    }
                }
                e => pending.push(e),
            }
        }
        out
    })
}

fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn json_of(b: &Option<Vec<u8>>) -> Value {
    b.as_ref()
        .map_or(Value::Null, |b| serde_json::from_slice(b).unwrap())
}

fn debezium(tombstones: bool) -> Format {
    Format::Debezium {
        server_name: "app".into(),
        database: "postgres".into(),
        decimal: DecimalMode::Precise,
        tombstones,
    }
}

const SETUP: &str = "
CREATE TABLE t (id int PRIMARY KEY, n numeric(10,2), ts timestamp, tz timestamptz, d date,
                b bytea, j jsonb, big text);
ALTER TABLE t ALTER big SET STORAGE EXTERNAL;
CREATE PUBLICATION p FOR TABLE t;
";

#[test]
fn debezium_envelope_from_a_real_stream() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        let recs = records(
            &c,
            "INSERT INTO t VALUES (1, 123.45, '2000-01-01 00:00:01.5', '2000-01-01 02:00:00+02', \
               '2000-01-02', '\\x0102', '{\"a\": [1]}', 'small');
             UPDATE t SET n = -0.5 WHERE id = 1;
             UPDATE t SET id = 2 WHERE id = 1;
             DELETE FROM t WHERE id = 2;
             TRUNCATE t;",
            &debezium(true),
        );
        let recs: Vec<Record> = recs.into_iter().flat_map(|r| r.unwrap()).collect();
        let ops: Vec<(Value, Value)> = recs
            .iter()
            .map(|r| {
                let v = json_of(&r.value);
                (json_of(&r.key), v.get("op").cloned().unwrap_or(Value::Null))
            })
            .collect();
        assert_eq!(
            ops,
            [
                (json!({"id": 1}), json!("c")),
                (json!({"id": 1}), json!("u")),
                // the key change: delete of 1, its tombstone, create of 2
                (json!({"id": 1}), json!("d")),
                (json!({"id": 1}), Value::Null),
                (json!({"id": 2}), json!("c")),
                (json!({"id": 2}), json!("d")),
                (json!({"id": 2}), Value::Null),
                (Value::Null, json!("t")),
            ],
            "{label}"
        );
        assert!(recs.iter().all(|r| r.topic == "app.public.t"), "{label}");
        let first = json_of(&recs[0].value);
        assert_eq!(
            first["after"],
            json!({
                "id": 1, "n": "MDk=", "ts": 946_684_801_500_000i64, "tz": "2000-01-01T00:00:00Z",
                "d": 10958, "b": "AQI=", "j": "{\"a\": [1]}", "big": "small"
            }),
            "{label}"
        );
        assert_eq!(first["before"], Value::Null);
        assert_eq!(first["source"]["connector"], "postgresql");
        assert_eq!(first["source"]["table"], "t");
        assert!(first["source"]["lsn"].as_u64().unwrap() > 0);
        // -0.5 at scale 2: unscaled -50, one byte 0xce
        assert_eq!(json_of(&recs[1].value)["after"]["n"], "zg==", "{label}");
        // the delete's before image is the key (default replica identity)
        assert_eq!(json_of(&recs[5].value)["before"]["id"], 2, "{label}");
        assert_eq!(json_of(&recs[5].value)["after"], Value::Null);
    }
}

#[test]
fn pgwal_format_and_unchanged_toast() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(SETUP);
        let recs = records(
            &c,
            "INSERT INTO t (id, n, big) VALUES (1, 1.50, repeat('x', 10000));
             UPDATE t SET n = 2 WHERE id = 1;",
            &Format::Pgwal,
        );
        // relation messages give no records
        let recs: Vec<_> = recs
            .into_iter()
            .filter(|r| !matches!(r, Ok(v) if v.is_empty()))
            .collect();
        let insert = recs[0].as_ref().unwrap();
        let v = json_of(&insert[0].value);
        assert_eq!(v["type"], "insert", "{label}");
        assert_eq!(v["key"], json!({"id": "1"}));
        assert_eq!(v["new"]["n"], "1.50");
        assert!(v["commit_lsn"].as_str().unwrap().contains('/'));
        // the update did not touch `big`, stored out of line: not sent
        let e = recs[1].as_ref().unwrap_err();
        assert!(
            e.contains("t.big") && e.contains("REPLICA IDENTITY FULL"),
            "{label}: {e}"
        );
        let recs = records(
            &c,
            "ALTER TABLE t REPLICA IDENTITY FULL; UPDATE t SET n = 3 WHERE id = 1;",
            &debezium(false),
        );
        // with a full old image the stream fills the unchanged value in
        let u = recs
            .iter()
            .find_map(|r| r.as_ref().ok().and_then(|r| r.first().cloned()));
        let v = json_of(&u.unwrap().value);
        assert_eq!(v["after"]["big"].as_str().unwrap().len(), 10000, "{label}");
        assert_eq!(v["before"]["n"], "AMg=", "{label}: 2.00 is unscaled 200");
    }
}
