//! Records for changes streamed from real servers, in both formats: topics,
//! keys from the replica identity, a key change as delete + create in
//! Debezium's envelope, tombstones, truncates, typed values, the refusal
//! to write an unchanged TOAST value as a placeholder, and the keys of
//! `REPLICA IDENTITY FULL` tables (their primary key, as the sink looks it
//! up) and configured key columns.

#[path = "broker/mod.rs"]
mod broker;
#[path = "../../pgwal/tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;
use pgwal::{CreateSlotOptions, Event, LogicalStream, Lsn, ReplicationClient, StreamConfig};
use pgwal_kafka::format::FormatError;
use pgwal_kafka::keys::primary_key_query;
use pgwal_kafka::{encode, DecimalMode, Format, KeyColumns, Record, Routing, TxInfo, TxOrder};
use serde_json::{json, Value};
use support::{block_on, config, Cluster, Options};

/// Streams everything up to now from a new slot made before `sql` ran,
/// and encodes each change.
fn records(c: &Cluster, sql: &str, format: &Format) -> Vec<Result<Vec<Record>, String>> {
    records_keyed(c, sql, format, KeyColumns::new())
}

/// The same with `keys`, completed as the sink does: at a Relation message
/// of a FULL table, its primary key from the catalog.
fn records_keyed(
    c: &Cluster,
    sql: &str,
    format: &Format,
    mut keys: KeyColumns,
) -> Vec<Result<Vec<Record>, String>> {
    block_on(async {
        let mut catalog = ReplicationClient::connect_sql(&config(c, "postgres"))
            .await
            .unwrap();
        let mut client = ReplicationClient::connect(&config(c, "postgres"))
            .await
            .unwrap();
        let slot = format!("s{}", std::process::id() ^ rand_suffix());
        client
            .create_logical_slot(&slot, &CreateSlotOptions::new())
            .await
            .unwrap();
        c.psql(sql);
        let end: Lsn = c.insert_lsn();
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
                Event::Relation(rel) if keys.needs_lookup(&rel) => {
                    let rows = catalog
                        .simple_query(&primary_key_query(rel.oid))
                        .await
                        .unwrap();
                    let columns = rows
                        .iter()
                        .map(|r| r.get("attname").unwrap().to_owned())
                        .collect();
                    keys.set_primary_key(&rel, columns);
                }
                Event::Commit(commit) => {
                    let tx = TxInfo::new(1, commit.commit_lsn, commit.commit_time);
                    let mut order = TxOrder::new();
                    for e in pending.drain(..) {
                        out.push(
                            encode(
                                format,
                                &routing,
                                &keys,
                                &tx,
                                &mut order,
                                &e,
                                commit.commit_time,
                            )
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
        transaction_metadata: true,
        json_schemas: false,
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

/// Under REPLICA IDENTITY FULL pgoutput marks every column as key; the
/// records are keyed by the primary key instead, so an update stays an
/// update of one key. Without a primary key there is no key, unless key
/// columns are configured; a configured column the table lacks is refused.
#[test]
fn full_identity_tables_are_keyed_by_their_primary_key() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(
            "CREATE TABLE f (a int, b int, note text, PRIMARY KEY (b, a));
             ALTER TABLE f REPLICA IDENTITY FULL;
             CREATE TABLE nopk (x int, y text);
             ALTER TABLE nopk REPLICA IDENTITY FULL;
             CREATE PUBLICATION p FOR TABLE f, nopk;",
        );
        let sql = "INSERT INTO f VALUES (1, 10, NULL);
                   UPDATE f SET note = 'n' WHERE a = 1;
                   UPDATE f SET a = 2 WHERE a = 1;
                   DELETE FROM f;
                   INSERT INTO nopk VALUES (1, NULL);
                   UPDATE nopk SET y = 'y';";
        let ops = |recs: Vec<Result<Vec<Record>, String>>| -> Vec<(String, Value, Value)> {
            recs.into_iter()
                .flat_map(|r| r.unwrap())
                .map(|r| {
                    let v = json_of(&r.value);
                    (
                        r.topic,
                        json_of(&r.key),
                        v.get("op").cloned().unwrap_or(Value::Null),
                    )
                })
                .collect()
        };
        let recs = records(&c, sql, &debezium(false));
        // FULL still sends the whole old row: the update's before image
        let update = recs
            .iter()
            .flat_map(|r| r.as_ref().unwrap())
            .nth(1)
            .unwrap();
        assert_eq!(
            json_of(&update.value)["before"],
            json!({"a": 1, "b": 10, "note": null}),
            "{label}"
        );
        let got = ops(recs);
        assert_eq!(
            got,
            [
                // the key in the primary key's order, (b, a); a NULL column
                // elsewhere in the row does not matter
                ("app.public.f".into(), json!({"b": 10, "a": 1}), json!("c")),
                ("app.public.f".into(), json!({"b": 10, "a": 1}), json!("u")),
                // a primary key change is still a delete and a create
                ("app.public.f".into(), json!({"b": 10, "a": 1}), json!("d")),
                ("app.public.f".into(), json!({"b": 10, "a": 2}), json!("c")),
                ("app.public.f".into(), json!({"b": 10, "a": 2}), json!("d")),
                // no primary key: no key (Debezium's behaviour)
                ("app.public.nopk".into(), Value::Null, json!("c")),
                ("app.public.nopk".into(), Value::Null, json!("u")),
            ],
            "{label}"
        );
        let keyed = KeyColumns::parse("public.nopk:x").unwrap();
        let got = ops(records_keyed(&c, sql, &debezium(false), keyed));
        assert_eq!(
            got[5],
            ("app.public.nopk".into(), json!({"x": 1}), json!("c")),
            "{label}"
        );
        assert_eq!(
            got[6],
            ("app.public.nopk".into(), json!({"x": 1}), json!("u")),
            "{label}"
        );
        let wrong = KeyColumns::parse("public.nopk:missing").unwrap();
        let errs: Vec<String> = records_keyed(
            &c,
            "INSERT INTO nopk VALUES (2, 'z');",
            &debezium(false),
            wrong,
        )
        .into_iter()
        .filter_map(Result::err)
        .collect();
        assert!(
            errs.iter()
                .any(|e| e.contains("public.nopk") && e.contains("\"missing\"")),
            "{label}: {errs:?}"
        );
    }
}

/// Each record carries its change's own WAL position, the commit's in
/// `source.sequence`, and Debezium's transaction block: the transaction's
/// id and the record's place in it, overall and within its table.
#[test]
fn each_record_carries_its_position_and_its_place_in_the_transaction() {
    let Some((label, bin)) = support::servers().into_iter().last() else {
        panic!("no server");
    };
    let c = Cluster::start(label, &bin, Options::default());
    c.psql(SETUP);
    c.psql("CREATE TABLE u (id int PRIMARY KEY); ALTER PUBLICATION p ADD TABLE u;");
    let recs = records(
        &c,
        "BEGIN;
         INSERT INTO t (id) VALUES (1);
         INSERT INTO u VALUES (1);
         INSERT INTO t (id) VALUES (2);
         UPDATE u SET id = 2;
         COMMIT;",
        &debezium(false),
    );
    let values: Vec<Value> = recs
        .into_iter()
        .flat_map(|r| r.unwrap())
        .map(|r| json_of(&r.value))
        .collect();
    let seen: Vec<(&str, &str, u64, u64)> = values
        .iter()
        .map(|v| {
            (
                v["source"]["table"].as_str().unwrap(),
                v["op"].as_str().unwrap(),
                v["transaction"]["total_order"].as_u64().unwrap(),
                v["transaction"]["data_collection_order"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("t", "c", 1, 1),
            ("u", "c", 2, 1),
            ("t", "c", 3, 2),
            // the key change: a delete and a create, of one WAL record
            ("u", "d", 4, 2),
            ("u", "c", 5, 3),
        ],
        "{label}"
    );
    let lsns: Vec<u64> = values
        .iter()
        .map(|v| v["source"]["lsn"].as_u64().unwrap())
        .collect();
    assert!(
        lsns[0] < lsns[1] && lsns[1] < lsns[2] && lsns[2] < lsns[3] && lsns[3] == lsns[4],
        "{label}: change positions {lsns:?}"
    );
    let id = values[0]["transaction"]["id"].as_str().unwrap().to_owned();
    let commit: u64 = id.split_once(':').unwrap().1.parse().unwrap();
    assert!(commit > lsns[4], "{label}: commit {commit} before a change");
    for (v, lsn) in values.iter().zip(&lsns) {
        assert_eq!(v["transaction"]["id"], id.as_str(), "{label}");
        assert_eq!(
            v["source"]["sequence"],
            format!("[\"{commit}\",\"{lsn}\"]"),
            "{label}"
        );
    }
}

#[test]
fn debezium_json_schemas_follow_the_table() {
    let format = Format::Debezium {
        server_name: "app".into(),
        database: "postgres".into(),
        decimal: DecimalMode::Precise,
        tombstones: true,
        transaction_metadata: true,
        json_schemas: true,
    };
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(
            "CREATE TABLE s (id int PRIMARY KEY, n numeric(10,2), v numeric, ts3 timestamp(3),
                             ts timestamp, tz timestamptz, d date, tm3 time(3), tm time,
                             tt timetz, iv interval, b bytea, j jsonb, u uuid, f4 real,
                             f8 double precision, i2 smallint, i8 bigint, ok boolean,
                             ints int[], texts text[], note text);
             CREATE PUBLICATION p FOR TABLE s;",
        );
        let recs = records(
            &c,
            "INSERT INTO s VALUES (1, 12.34, -1.5, '2024-01-02 03:04:05.678', '2024-01-02 03:04:05.678901',
                                  '2024-01-02 03:04:05+02', '2024-01-02', '01:02:03.456', '01:02:03.456789',
                                  '01:02:03+02', '1 day 2 hours', '\\x00ff', '{\"a\": [1, null]}',
                                  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 1.5, 2.25, 7, 9000000000, true,
                                  '{1,NULL,3}', '{a,\"b c\"}', 'one');
             INSERT INTO s (id) VALUES (2);
             ALTER TABLE s ADD COLUMN extra text;
             INSERT INTO s (id, extra) VALUES (3, 'x');
             ALTER TABLE s DROP COLUMN note;
             ALTER TABLE s ALTER COLUMN n TYPE numeric(12,3);
             ALTER TABLE s RENAME COLUMN extra TO extra2;
             UPDATE s SET n = 1.5, extra2 = 'y' WHERE id = 3;
             UPDATE s SET id = 30 WHERE id = 3;
             DELETE FROM s WHERE id = 2;
             TRUNCATE s;",
            &format,
        );
        let recs: Vec<Record> = recs.into_iter().flat_map(|r| r.unwrap()).collect();
        // c c c u (d tombstone c) (d tombstone) t
        assert_eq!(recs.len(), 10, "{label}");

        // Every key and value is {schema, payload}, the payload's row has
        // exactly the schema's columns, and the key is required.
        let mut docs: Vec<&[u8]> = Vec::new();
        for r in &recs {
            if let Some(k) = &r.key {
                let k: Value = serde_json::from_slice(k).unwrap();
                assert_eq!(k["schema"]["name"], "app.public.s.Key", "{label}");
                assert_eq!(k["schema"]["optional"], false, "{label}");
                assert_eq!(
                    k["schema"]["fields"],
                    json!([{"type": "int32", "optional": false, "field": "id"}]),
                    "{label}"
                );
                docs.push(r.key.as_deref().unwrap());
            }
            let Some(v) = &r.value else { continue };
            docs.push(v);
            let v: Value = serde_json::from_slice(v).unwrap();
            assert_eq!(v["schema"]["name"], "app.public.s.Envelope", "{label}");
            for image in ["before", "after"] {
                if let Some(row) = v["payload"][image].as_object() {
                    let columns: BTreeSet<&str> = row.keys().map(String::as_str).collect();
                    assert_eq!(
                        columns,
                        broker::field_names(broker::row_schema(&v)),
                        "{label} {image}"
                    );
                }
            }
        }

        // The schema follows the table: ADD, DROP, ALTER TYPE, RENAME.
        let values: Vec<Value> = recs
            .iter()
            .filter_map(|r| r.value.as_ref())
            .map(|v| serde_json::from_slice(v).unwrap())
            .collect();
        let row = |i: usize| broker::row_schema(&values[i]).clone();
        let (first, added, updated) = (row(0), row(2), row(3));
        assert!(broker::field_schema(&first, "extra").is_none(), "{label}");
        assert_eq!(
            broker::field_schema(&added, "extra").unwrap()["type"],
            "string",
            "{label}"
        );
        assert!(broker::field_schema(&updated, "note").is_none(), "{label}");
        assert!(broker::field_schema(&updated, "extra").is_none(), "{label}");
        assert!(
            broker::field_schema(&updated, "extra2").is_some(),
            "{label}"
        );
        assert_eq!(
            broker::field_schema(&first, "n").unwrap()["parameters"]["scale"],
            "2",
            "{label}"
        );
        assert_eq!(
            broker::field_schema(&updated, "n").unwrap()["parameters"]["scale"],
            "3",
            "{label}"
        );
        // 1.500 at scale 3: unscaled 1500
        assert_eq!(values[3]["payload"]["after"]["n"], "Bdw=", "{label}");
        // Debezium's types, by name
        let expect: [(&str, &str, Option<&str>); 13] = [
            ("v", "struct", Some("io.debezium.data.VariableScaleDecimal")),
            ("ts3", "int64", Some("io.debezium.time.Timestamp")),
            ("ts", "int64", Some("io.debezium.time.MicroTimestamp")),
            ("tz", "string", Some("io.debezium.time.ZonedTimestamp")),
            ("d", "int32", Some("io.debezium.time.Date")),
            ("tm3", "int32", Some("io.debezium.time.Time")),
            ("tm", "int64", Some("io.debezium.time.MicroTime")),
            ("iv", "int64", Some("io.debezium.time.MicroDuration")),
            ("j", "string", Some("io.debezium.data.Json")),
            ("u", "string", Some("io.debezium.data.Uuid")),
            ("f4", "float", None),
            ("i2", "int16", None),
            ("ints", "array", None),
        ];
        for (column, ty, name) in expect {
            let got = broker::field_schema(&first, column).unwrap();
            assert_eq!(
                (got["type"].as_str(), got["name"].as_str()),
                (Some(ty), name),
                "{label} {column}"
            );
        }
        assert_eq!(
            broker::field_schema(&first, "texts").unwrap()["items"]["type"],
            "string"
        );

        // Kafka Connect reads each one as its schema says and writes it
        // back unchanged.
        if broker::have_java() {
            assert_eq!(
                broker::connect_json_check(docs.iter().copied()),
                Ok(docs.len() as u64),
                "{label}"
            );
            // and the check can fail: a string where the schema says int32
            let wrong = br#"{"schema": {"type": "int32", "optional": false}, "payload": "7"}"#;
            assert!(broker::connect_json_check([&wrong[..]]).is_err());
        } else {
            eprintln!("NOTICE: no java; the Kafka Connect reading of the schemas is skipped");
        }
    }
}
