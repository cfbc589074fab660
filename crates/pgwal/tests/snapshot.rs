//! Initial snapshot + stream = exact table contents, with writes running
//! during the copy.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use pgwal::{Event, LogicalStream, Lsn, StreamConfig};
use support::{block_on, config, Cluster, Options};

#[test]
fn snapshot_then_stream_equals_table() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(
            "CREATE TABLE a (id int PRIMARY KEY, v text);
             CREATE TABLE b (id int PRIMARY KEY, v text);
             INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 3000) g;
             INSERT INTO b SELECT g, E'tab\\there ' || g FROM generate_series(1, 500) g;
             CREATE PUBLICATION p FOR TABLE a, b;",
        );
        // A writer that keeps changing both tables while the copy runs.
        let writer_sql: String = (0..300)
            .map(|i| {
                format!(
                    "INSERT INTO a VALUES ({}, 'new'); UPDATE a SET v = 'upd{i}' WHERE id = {}; DELETE FROM b WHERE id = {}; SELECT pg_sleep(0.002);\n",
                    10_000 + i,
                    1 + i * 7,
                    1 + i
                )
            })
            .collect();
        let mut psql = c.psql_command();
        psql.args(["-f", "-"]);
        let writer = std::thread::spawn(move || {
            let mut child = psql
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(writer_sql.as_bytes())
                .unwrap();
            assert!(child.wait().unwrap().success());
        });
        block_on(async {
            let cfg = config(&c, "postgres");
            // table -> id -> v
            let mut state: BTreeMap<String, BTreeMap<i32, String>> = BTreeMap::new();
            let copy = pgwal::snapshot::initial_copy(&cfg, "snap", &["p"], false, |row| {
                let id: i32 = row.values[0].as_deref().unwrap().parse().unwrap();
                state
                    .entry(row.table.to_owned())
                    .or_default()
                    .insert(id, row.values[1].clone().unwrap());
                Ok(())
            })
            .await
            .unwrap();
            assert_eq!(copy.tables, ["public.a", "public.b"]);
            writer.join().unwrap();
            let end: Lsn = c
                .query("SELECT pg_current_wal_insert_lsn()")
                .parse()
                .unwrap();
            let scfg = StreamConfig::new("snap", ["p"])
                .stop_lsn(end)
                .status_interval(Duration::from_millis(100));
            let mut s = LogicalStream::start(cfg, scfg).await.unwrap();
            let mut dup_inserts = 0;
            while let Some(e) = tokio::time::timeout(Duration::from_secs(60), s.next())
                .await
                .unwrap()
            {
                let e = e.unwrap();
                match &e {
                    Event::Insert(ch) | Event::Update(ch) => {
                        let row = ch.new.as_ref().unwrap();
                        let id = row.text("id").unwrap().parse().unwrap();
                        let prev = state
                            .entry(ch.relation.name.clone())
                            .or_default()
                            .insert(id, row.text("v").unwrap().to_owned());
                        if matches!(e, Event::Insert(_)) && prev.is_some() {
                            dup_inserts += 1;
                        }
                    }
                    Event::Delete(ch) => {
                        let id: i32 = ch
                            .old
                            .as_ref()
                            .unwrap()
                            .text("id")
                            .unwrap()
                            .parse()
                            .unwrap();
                        let gone = state.get_mut(&ch.relation.name).and_then(|t| t.remove(&id));
                        assert!(
                            gone.is_some(),
                            "{label}: delete of a row the copy did not have (gap)"
                        );
                    }
                    _ => {}
                }
                if let Some(l) = e.ack_lsn() {
                    s.ack(l);
                }
            }
            assert_eq!(
                dup_inserts, 0,
                "{label}: inserts already in the copy were streamed again"
            );
            for t in ["a", "b"] {
                let want: BTreeMap<i32, String> = c
                    .psql(&format!("SELECT id || '|' || v FROM {t} ORDER BY id"))
                    .lines()
                    .map(|l| {
                        let (id, v) = l.split_once('|').unwrap();
                        (id.parse().unwrap(), v.to_owned())
                    })
                    .collect();
                assert_eq!(
                    state.get(t).cloned().unwrap_or_default(),
                    want,
                    "{label}: table {t} differs"
                );
            }
            eprintln!(
                "{label}: copied {} rows at {}, then streamed the rest; contents match",
                copy.rows, copy.consistent_point
            );
        });
    }
}
