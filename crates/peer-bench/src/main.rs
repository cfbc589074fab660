//! Drains a logical slot up to a stop position with pg_walstream 0.10,
//! acknowledging every commit, and prints the event count: the pg_walstream
//! counterpart of `crates/pgwal/examples/drain.rs` in `e2e-peers.sh`.
//!
//! `walstream-drain CONNINFO SLOT PUBLICATION STOP_LSN [PROTO] [off|on|parallel]`
//!
//! Same settings as the pgwal side: existing slot, one publication, proto 1
//! (or 4 with parallel streaming), text format, no messages, a status update
//! every 10 s, current-thread runtime, stop after the commit reaching
//! STOP_LSN. Each commit's end LSN is acknowledged (written, flushed and
//! applied) as soon as the commit event is received.

use pg_walstream::{
    CancellationToken, EventType, LogicalReplicationStream, Lsn, ReplicationError,
    ReplicationStreamConfig, StreamingMode,
};
use std::time::Duration;

fn parse_lsn(s: &str) -> Result<Lsn, Box<dyn std::error::Error>> {
    let (hi, lo) = s.split_once('/').ok_or("LSN must be X/Y")?;
    Ok(Lsn::new((u64::from_str_radix(hi, 16)? << 32) | u64::from_str_radix(lo, 16)?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err("usage: walstream-drain CONNINFO SLOT PUBLICATION STOP_LSN [PROTO] [off|on|parallel]".into());
    }
    let conninfo = format!("{} replication=database", a[1]);
    let proto: u32 = a.get(5).map(|p| p.parse()).transpose()?.unwrap_or(1);
    let streaming = match a.get(6).map(String::as_str) {
        Some("on") => StreamingMode::On,
        Some("parallel") => StreamingMode::Parallel,
        _ => StreamingMode::Off,
    };
    let cfg = ReplicationStreamConfig::builder(a[2].clone(), a[3].clone())
        .with_protocol_version(proto)
        .with_streaming_mode(streaming)
        .with_feedback_interval(Duration::from_secs(10))
        .with_existing_slot_required(true)
        .with_stop_at_lsn(parse_lsn(&a[4])?);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut s = LogicalReplicationStream::new(&conninfo, cfg).await?;
        s.start(None).await?;
        let cancel = CancellationToken::new();
        let (mut events, mut inserts) = (0u64, 0u64);
        loop {
            let e = match s.next_event(&cancel).await {
                Ok(e) => e,
                Err(ReplicationError::StreamStopped(_)) => break,
                Err(e) => return Err(e.into()),
            };
            events += 1;
            match e.event_type {
                EventType::Insert { .. } => inserts += 1,
                EventType::Commit { end_lsn, .. } | EventType::StreamCommit { end_lsn, .. } => {
                    s.shared_lsn_feedback.update_flushed_lsn(end_lsn);
                    s.shared_lsn_feedback.update_applied_lsn(end_lsn);
                }
                _ => {}
            }
        }
        s.stop().await?;
        eprintln!("events={events} inserts={inserts}");
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
