//! Receives physical WAL into a directory of segment files, like
//! `pg_receivewal`, acknowledging it to the server at a chosen point.
//!
//! ```text
//! cargo run --example physical_receive -- CONNINFO DIR receive|write|flush [END_LSN]
//! cargo run --example physical_receive -- "host=db user=repl application_name=archiver" \
//!     /srv/wal flush
//! ```
//!
//! DIR is created if missing. Streaming goes through a physical slot, created
//! if missing: `pgwal_example`, or the name in the environment variable
//! `SLOT`. The slot keeps the primary's WAL until this receiver has it, so
//! drop it when done (`pgwal -d CONNINFO slot drop pgwal_example`). The
//! receiver starts at the directory's highest segment, else at the slot's
//! `restart_lsn`, else at the server's current position; the segment being
//! written is named `.partial` until it is complete. It stops once WAL up to
//! END_LSN is written and fsynced, or on Ctrl-C, and prints the received,
//! written and fsynced positions and what it last reported to the server.
//!
//! # What the acknowledgement modes promise
//!
//! To a primary that lists this receiver in `synchronous_standby_names`
//! (matched by the `application_name` of CONNINFO), the status updates say
//! how far a commit's WAL got. Every update reports `flush` = the end of the
//! WAL fsynced here (never earlier) and `apply` = `0/0` (nothing is applied,
//! so `synchronous_commit = remote_apply` would wait for ever). The mode sets
//! the `write` field, which `synchronous_commit = remote_write` waits for:
//!
//! * `receive`: `write` = the WAL received into memory, reported before it
//!   is written. A deliberate lie: `remote_write` commits return on receipt
//!   (`remote_receive` semantics), and such a commit survives the loss of
//!   the primary only if this process lives long enough to write it out.
//! * `write`: `write` = the WAL written to the segment files (`pwrite` done,
//!   in the operating system's cache, not fsynced): a `remote_write` commit
//!   survives a crash of this process but not of its machine. Like
//!   `pg_receivewal` without `--synchronous`.
//! * `flush` (the default): `write` = `flush` = the fsynced position; each
//!   batch is written and fsynced before it is acknowledged, so
//!   `remote_write` and `on` commits return only once their WAL is on this
//!   machine's disk. Like `pg_receivewal --synchronous`.
//!
//! With `synchronous_commit = on` the primary waits for `flush` in every
//! mode. In `receive` and `write` the WAL is fsynced every status interval
//! (10 s by default), at the end of each segment and at the stop, so there
//! such commits wait up to a status interval. (Against pgwal's patched
//! server a trailing receive pointer in the update also drives
//! `synchronous_commit = remote_receive`; stock servers ignore it.)

use pgwal::{AckMode, Config, PhysicalConfig, PhysicalReceiver, RetryConfig, StopReason};

/// The physical slot, unless the environment variable `SLOT` names another.
const SLOT: &str = "pgwal_example";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    run(std::env::args().collect(), ctrl_c).await
}

/// The example with its command line (`a[0]` is the program name),
/// stopping early when `shutdown` completes (Ctrl-C in `main`); the crate's
/// tests call it against a real server.
pub async fn run(
    a: Vec<String>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Box<dyn std::error::Error>> {
    if a.len() < 4 {
        return Err("usage: physical_receive CONNINFO DIR receive|write|flush [END_LSN]".into());
    }
    let config: Config = a[1].parse()?;
    let dir = a[2].clone();
    let ack = match a[3].as_str() {
        "receive" => AckMode::Receive,
        "write" => AckMode::Write,
        "flush" => AckMode::Flush,
        other => return Err(format!("ack mode {other:?}: receive, write or flush").into()),
    };
    let slot = std::env::var("SLOT").unwrap_or_else(|_| SLOT.into());

    // The receiver wants an existing directory. Creating it blocks, so it
    // runs on tokio's blocking pool (as the receiver's own file I/O does).
    let d = dir.clone();
    tokio::task::spawn_blocking(move || std::fs::create_dir_all(d)).await??;

    let mut pc = PhysicalConfig::new(dir.clone())
        .slot(slot)
        .create_slot(true)
        .ack(ack)
        // Reconnect after a lost connection or a restarting server, resuming
        // at the segment being written (by default the first failure ends
        // `run`).
        .retry(RetryConfig::default());
    if let Some(end) = a.get(4) {
        pc = pc.end_lsn(end.parse()?);
    }
    let receiver = PhysicalReceiver::new(config, pc);
    // Positions readable while `run` owns the receiver, and after it.
    let progress = receiver.progress();
    eprintln!("receiving into {dir}, acknowledging on {}", ack.as_str());
    let result = receiver
        // On `shutdown` (Ctrl-C) the open segment is fsynced (it stays
        // `.partial`) and a final status update is sent.
        .run(shutdown)
        .await;
    match &result {
        Ok(StopReason::EndReached) => eprintln!("stopped: END_LSN reached"),
        Ok(_) => eprintln!("stopped: Ctrl-C"),
        // Returned below, after the positions.
        Err(_) => {}
    }
    println!(
        "received {}, written {}, flushed {} (timeline {})",
        progress.received(),
        progress.written(),
        progress.flushed(),
        progress.timeline()
    );
    println!(
        "last reported to the server: write {}, flush {} ({} status updates)",
        progress.reported_write(),
        progress.reported_flush(),
        progress.status_updates()
    );
    result?;
    Ok(())
}
