//! Drains a slot up to a stop position, acking every commit, and prints the
//! event count: the minimal consumer used by `benches/e2e.sh`.
//!
//! `cargo run --release --example drain -- CONNINFO SLOT PUBLICATION STOP_LSN [PROTO] [STREAMING]`
//! (env: `COALESCE_US`, `WORKER_THREADS`)

use futures_util::StreamExt;
use pgwal::{LogicalStream, StreamConfig, Streaming};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err(
            "usage: drain CONNINFO SLOT PUBLICATION STOP_LSN [PROTO] [off|on|parallel]".into(),
        );
    }
    let mut cfg = StreamConfig::new(a[2].clone(), [a[3].clone()]).stop_lsn(a[4].parse()?);
    if let Some(p) = a.get(5) {
        cfg = cfg.proto_version(p.parse()?);
    }
    cfg = cfg.streaming(match a.get(6).map(String::as_str) {
        Some("on") => Streaming::On,
        Some("parallel") => Streaming::Parallel,
        _ => Streaming::Off,
    });
    if let Ok(us) = std::env::var("COALESCE_US") {
        let us: u64 = us.parse()?;
        cfg = cfg.read_coalesce((us > 0).then(|| std::time::Duration::from_micros(us)));
    }
    // WORKER_THREADS=N: a multi-thread runtime, so that the stream's
    // reader task and this consumer can run on different threads.
    let rt = match std::env::var("WORKER_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) if n > 0 => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    };
    rt.block_on(async {
        let mut s = LogicalStream::start(a[1].parse()?, cfg).await?;
        let (mut events, mut inserts) = (0u64, 0u64);
        while let Some(e) = s.next().await {
            let e = e?;
            events += 1;
            if matches!(e, pgwal::Event::Insert(_)) {
                inserts += 1;
            }
            if let Some(l) = e.ack_lsn() {
                s.ack(l);
            }
        }
        s.shutdown().await?;
        eprintln!("events={events} inserts={inserts}");
        Ok(())
    })
}
