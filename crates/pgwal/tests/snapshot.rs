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
    snapshot_then_stream(1, 16_384);
}

/// The same with three connections sharing page ranges of 4 pages: rows of
/// one table come from several connections in one snapshot.
#[test]
fn parallel_chunked_snapshot_then_stream_equals_table() {
    snapshot_then_stream(3, 4);
}

fn snapshot_then_stream(jobs: usize, chunk_pages: u32) {
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
        let writer = c.psql_in_background(writer_sql);
        block_on(async {
            let cfg = config(&c, "postgres");
            // table -> id -> v
            let mut state: BTreeMap<String, BTreeMap<i32, String>> = BTreeMap::new();
            let opts = pgwal::snapshot::CopyOptions::default()
                .jobs(jobs)
                .chunk_pages(chunk_pages);
            let mut pieces = (0, 0);
            let copy = pgwal::snapshot::initial_copy_with(
                &cfg,
                "snap",
                &["p"],
                &opts,
                |row| {
                    let id: i32 = row.values[0].as_deref().unwrap().parse().unwrap();
                    let again = state
                        .entry(row.table.to_owned())
                        .or_default()
                        .insert(id, row.values[1].clone().unwrap());
                    assert!(again.is_none(), "{label}: row {id} copied twice");
                    Ok(())
                },
                |p| pieces = (p.pieces_done, p.pieces_total),
            )
            .await
            .unwrap();
            assert_eq!(pieces.0, pieces.1, "{label}");
            if chunk_pages < 16 && c.major >= 14 {
                assert!(
                    pieces.1 > 4,
                    "{label}: table a was not cut into ranges: {pieces:?}"
                );
            }
            assert_eq!(copy.tables, ["public.a", "public.b"]);
            writer.join().unwrap();
            let end: Lsn = c.insert_lsn();
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
                "{label}: copied {} rows at {} ({} pieces, {jobs} jobs), then streamed the rest; \
                 contents match",
                copy.rows, copy.consistent_point, pieces.1
            );
        });
    }
}

/// The copy holds what the publications publish: row filters (OR-ed across
/// publications, none if one has none), column lists (their union), and
/// partitioned tables as their root or as their partitions, as
/// `publish_via_partition_root` says.
#[test]
fn snapshot_honours_the_publication() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        c.psql(
            "CREATE TABLE f (id int PRIMARY KEY, a text, secret text);
             INSERT INTO f SELECT g, 'a' || g, 's' || g FROM generate_series(1, 20) g;
             CREATE TABLE m (id int PRIMARY KEY, k int);
             INSERT INTO m SELECT g, g % 3 FROM generate_series(1, 30) g;
             CREATE TABLE pt (id int, region text) PARTITION BY LIST (region);
             CREATE TABLE pt_eu PARTITION OF pt FOR VALUES IN ('eu');
             CREATE TABLE pt_us PARTITION OF pt FOR VALUES IN ('us');
             INSERT INTO pt SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END FROM generate_series(1, 10) g;
             CREATE PUBLICATION p1 FOR TABLE f (id, a) WHERE (id <= 5), m WHERE (k = 0);
             CREATE PUBLICATION p2 FOR TABLE m WHERE (k = 1);
             CREATE PUBLICATION proot FOR TABLE pt WITH (publish_via_partition_root = true);
             CREATE PUBLICATION pleaf FOR TABLE pt WITH (publish_via_partition_root = false);",
        );
        let copy = |slot: &'static str, pubs: &'static [&'static str]| {
            block_on(async {
                let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
                pgwal::snapshot::initial_copy(&config(&c, "postgres"), slot, pubs, false, |row| {
                    let line: Vec<String> = row
                        .columns
                        .iter()
                        .zip(&row.values)
                        .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("NULL")))
                        .collect();
                    rows.entry(row.table.to_owned())
                        .or_default()
                        .push(line.join(","));
                    Ok(())
                })
                .await
                .unwrap();
                rows
            })
        };
        let r = copy("s1", &["p1", "p2"]);
        assert_eq!(r["f"].len(), 5, "{label}: row filter id <= 5");
        assert!(
            r["f"].iter().all(|l| !l.contains("secret")),
            "{label}: column list: {:?}",
            r["f"]
        );
        assert_eq!(r["f"][0], "id=1,a=a1", "{label}");
        assert_eq!(r["m"].len(), 20, "{label}: k = 0 OR k = 1");
        c.psql("CREATE PUBLICATION pall FOR TABLE m");
        let r = copy("s3", &["p1", "pall"]);
        assert_eq!(
            r["m"].len(),
            30,
            "{label}: a publication without a filter publishes every row"
        );
        let r = copy("s4", &["proot"]);
        assert_eq!(
            r.keys().collect::<Vec<_>>(),
            ["pt"],
            "{label}: via the root"
        );
        assert_eq!(r["pt"].len(), 10, "{label}");
        let r = copy("s5", &["pleaf"]);
        assert_eq!(
            r.keys().collect::<Vec<_>>(),
            ["pt_eu", "pt_us"],
            "{label}: the partitions"
        );
        assert_eq!(r["pt_eu"].len() + r["pt_us"].len(), 10, "{label}");
    }
}
