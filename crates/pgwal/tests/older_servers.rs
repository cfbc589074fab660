//! PostgreSQL 14, outside the main matrix: replication slots in the 10–14
//! grammar (bare keywords), the initial copy through an exported snapshot,
//! and a stream (pgoutput protocol 2). Runs when `PGWAL_PG14_BIN` or
//! `.build/install/pg14/bin` has a server (`tools/postgres-major 14.19.0`).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use pgwal::{CreateSlotOptions, Error, Event, LogicalStream, Lsn, ReplicationClient, StreamConfig};
use support::{block_on, config, Cluster, Options};

fn pg14() -> Option<PathBuf> {
    let bin = std::env::var_os("PGWAL_PG14_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::repo_root().join(".build/install/pg14/bin"));
    if bin.join("postgres").exists() {
        Some(bin)
    } else {
        eprintln!("NOTICE: skipping pg14: no server in {}", bin.display());
        None
    }
}

#[test]
fn slots_copy_and_stream_on_14() {
    let Some(bin) = pg14() else { return };
    let c = Cluster::start("pg14", &bin, Options::default());
    assert_eq!(c.major, 14);
    c.psql(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g;
         CREATE PUBLICATION p FOR TABLE t;",
    );
    block_on(async {
        let cfg = config(&c, "postgres");
        let mut rows = 0;
        let copy = pgwal::snapshot::initial_copy(&cfg, "s14", &["p"], false, |_| {
            rows += 1;
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!((rows, copy.rows), (100, 100));
        let mut client = ReplicationClient::connect(&cfg).await.unwrap();
        client
            .create_logical_slot("plain14", &CreateSlotOptions::new().temporary(true))
            .await
            .unwrap();
        let e = client
            .create_logical_slot("two14", &CreateSlotOptions::new().two_phase(true))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::ServerTooOld {
                    needs: 15,
                    server: 14,
                    ..
                }
            ),
            "{e}"
        );
        let e = client
            .create_logical_slot("fail14", &CreateSlotOptions::new().failover(true))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::ServerTooOld {
                    needs: 17,
                    server: 14,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            c.query("SELECT string_agg(slot_name || ':' || temporary, ',' ORDER BY slot_name) FROM pg_replication_slots"),
            "plain14:true,s14:false"
        );
        c.psql("INSERT INTO t VALUES (101, 'streamed')");
        let end: Lsn = c.insert_lsn();
        let mut s = LogicalStream::start(cfg, StreamConfig::new("s14", ["p"]).stop_lsn(end))
            .await
            .unwrap();
        let mut inserted = Vec::new();
        while let Some(e) = tokio::time::timeout(Duration::from_secs(30), s.next())
            .await
            .unwrap()
        {
            if let Event::Insert(ch) = e.unwrap() {
                inserted.push(ch.new.unwrap().text("v").unwrap().to_owned());
            }
        }
        assert_eq!(inserted, ["streamed"]);
    });
}
