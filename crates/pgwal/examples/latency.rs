//! Commit-to-receive latency: commits single-row transactions at a steady
//! rate on one connection while a `LogicalStream` receives them, and reports
//! percentiles of (time the Commit event reached the consumer − the commit
//! timestamp the server recorded). Both clocks are this machine's.
//!
//! `cargo run --release --example latency -- CONNINFO SLOT PUBLICATION TABLE [COUNT] [INTERVAL_MS]`
//! (the slot and the publication on TABLE(id int, v text) must exist;
//! env `COALESCE_US` sets `StreamConfig::read_coalesce`).

use std::time::Duration;

use futures_util::StreamExt;
use pgwal::protocol::PgTimestamp;
use pgwal::{Event, LogicalStream, ReplicationClient, StreamConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err("usage: latency CONNINFO SLOT PUBLICATION TABLE [COUNT] [INTERVAL_MS]".into());
    }
    let count: usize = a.get(5).map(|v| v.parse()).transpose()?.unwrap_or(1000);
    let interval = Duration::from_millis(a.get(6).map(|v| v.parse()).transpose()?.unwrap_or(5));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let config: pgwal::Config = a[1].parse()?;
        let mut cfg = StreamConfig::new(a[2].clone(), [a[3].clone()]);
        if let Ok(us) = std::env::var("COALESCE_US") {
            let us: u64 = us.parse()?;
            cfg = cfg.read_coalesce((us > 0).then(|| Duration::from_micros(us)));
        }
        let mut stream = LogicalStream::start(config.clone(), cfg).await?;
        let table = a[4].clone();
        let writer = tokio::spawn(async move {
            let mut sql = ReplicationClient::connect_sql(&config).await?;
            // WAL is sent once flushed: make each commit flush it.
            sql.simple_query("SET synchronous_commit = on").await?;
            let mut tick = tokio::time::interval(interval);
            for i in 0..count {
                tick.tick().await;
                sql.simple_query(&format!("INSERT INTO {table} VALUES ({i}, 'x')")).await?;
            }
            Ok::<_, pgwal::Error>(())
        });
        let mut lat = Vec::with_capacity(count);
        while lat.len() < count {
            let e = tokio::time::timeout(Duration::from_secs(30), stream.next()).await?.ok_or("stream ended")??;
            if let Event::Commit(c) = &e {
                lat.push((PgTimestamp::now().0 - c.commit_time.0) as f64);
                stream.ack(c.end_lsn);
            }
        }
        writer.await??;
        stream.shutdown().await?;
        lat.sort_by(|x, y| x.total_cmp(y));
        let p = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
        println!(
            "commit-to-receive latency over {count} transactions every {interval:?}: p50 {:.0} us, p90 {:.0} us, p99 {:.0} us, max {:.0} us",
            p(0.5),
            p(0.9),
            p(0.99),
            lat[lat.len() - 1]
        );
        Ok(())
    })
}
