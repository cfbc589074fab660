//! Resumes after the consumer restarts, with every transaction in the
//! output exactly once.
//!
//! ```text
//! cargo run --example resume_after_restart -- \
//!     CONNINFO SLOT PUBLICATION STATE_FILE OUTPUT_FILE [STOP_LSN]
//! cargo run --example resume_after_restart -- "host=127.0.0.1 user=postgres dbname=app" \
//!     app_slot app_pub app.state changes.jsonl
//! ```
//!
//! As in `consume_with_acks`, each transaction is appended to OUTPUT_FILE
//! (JSON lines, fsynced) at its commit and acknowledged after that. In
//! addition the consumer keeps its own record of where it is: STATE_FILE
//! holds the end of the last transaction applied (`Commit::end_lsn`) and the
//! length of the output up to it, replaced atomically after each one. Kill
//! the program at any moment (`kill -9`, power loss) and run it again with
//! the same arguments: the output goes on with each transaction once.
//!
//! # Why the server sends transactions again
//!
//! The slot's confirmed position lags the consumer's own. An
//! acknowledgement reaches the server only with the next status update
//! (every `StreamConfig::status_interval`, 10 s by default), and the server
//! does not write each confirmation to disk at once, so after a crash of
//! the server the slot may even be further back. A consumer that stops
//! after applying a transaction but before the server recorded its
//! confirmation finds the slot at an earlier position when it starts again,
//! and from there the server decodes and sends those transactions again:
//! acknowledgements alone give at-least-once.
//!
//! # How the stored position makes it exactly-once
//!
//! * Output first, state second, acknowledgement last. On start the output
//!   is cut back to the length in STATE_FILE: lines appended by a run that
//!   stopped before it recorded them go (that transaction was not
//!   acknowledged either, so it comes again). The output then holds exactly
//!   the transactions up to the stored position.
//! * The stream starts at the stored position although the slot is behind
//!   it (`StreamConfig::consumer_position`), so the server skips the
//!   transactions that committed before it. Should one come again all the
//!   same, its commit ends at or before the stored position and it is
//!   dropped here without being written (the comparison in the
//!   `Event::Commit` arm: it costs nothing and does not trust the server).
//! * Transactions after the stored position are not in the output, and the
//!   slot is not past them (it is only ever confirmed at stored positions),
//!   so they come: once.
//!
//! `consumer_position` rather than `StreamConfig::start_lsn`, which would
//! also start there: it makes the stream refuse a slot that is *ahead* of
//! the stored position (`Error::SlotAhead`: dropped and created again, or
//! moved by another consumer), which would silently skip changes. For the
//! same reason the slot must be confirmed only at positions in STATE_FILE:
//! `idle_advance(false)` (no confirming of the server's WAL position while
//! idle), and `Event::Heartbeat`s recorded before they are acknowledged, so
//! that a publication whose tables are quiet does not hold WAL back.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use pgwal::protocol::pgoutput::ColumnValue;
use pgwal::{
    Change, Config, CreateSlotOptions, Event, LogicalStream, Lsn, ReplicationClient, Row,
    StreamConfig, TruncateEvent,
};
use serde_json::{json, Map, Value};

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
    const USAGE: &str =
        "usage: resume_after_restart CONNINFO SLOT PUBLICATION STATE_FILE OUTPUT_FILE [STOP_LSN]";
    if a.len() < 6 {
        return Err(USAGE.into());
    }
    let config: Config = a[1].parse()?;
    let (slot, publication) = (a[2].clone(), a[3].clone());
    let (state_path, output_path) = (PathBuf::from(&a[4]), PathBuf::from(&a[5]));
    let stop: Option<Lsn> = a.get(6).map(|s| s.parse()).transpose()?;

    // File operations block, so they run on tokio's blocking pool, never on
    // a runtime thread.
    let (s, o) = (state_path.clone(), output_path.clone());
    let opening = tokio::task::spawn_blocking(move || open_files(&s, &o));
    let (mut state, file) = opening.await??;
    let file = Arc::new(file);
    if state.lsn.is_invalid() {
        eprintln!("nothing applied yet: starting where the slot is");
    } else {
        eprintln!(
            "applied up to {} ({} bytes of output): resuming there",
            state.lsn, state.output_len
        );
    }

    let mut client = ReplicationClient::connect(&config).await?;
    if client.slot_confirmed_flush(&slot).await?.is_none() {
        if !state.lsn.is_invalid() {
            // A new slot starts now: whatever committed since the stored
            // position would never reach the output.
            return Err(format!(
                "slot {slot} is missing but {} says the output holds everything up to {}; \
                 a new slot would skip what came after (start over with new files)",
                state_path.display(),
                state.lsn
            )
            .into());
        }
        let info = client
            .create_logical_slot(&slot, &CreateSlotOptions::new())
            .await?;
        eprintln!("created slot {slot} at {}", info.consistent_point);
    }
    drop(client);

    // The slot moves only to stored positions (see the top of the file).
    let mut cfg = StreamConfig::new(slot, [publication])
        .idle_advance(false)
        .heartbeat(Duration::from_secs(10));
    if !state.lsn.is_invalid() {
        cfg = cfg.consumer_position(state.lsn);
    }
    if let Some(stop) = stop {
        cfg = cfg.stop_lsn(stop);
    }

    let mut stream = LogicalStream::start(config, cfg).await?;
    tokio::pin!(shutdown);
    let mut txn = Txn::default();
    let (mut applied, mut skipped, mut changes) = (0u64, 0u64, 0u64);
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            // An open transaction is neither written nor recorded: it comes
            // again on the next run.
            _ = &mut shutdown => None,
        };
        // None: STOP_LSN was reached (or Ctrl-C).
        let Some(event) = event else { break };
        let event = event?;
        match &event {
            Event::Begin(b) => txn = Txn::new(b.final_lsn),
            Event::Insert(c) => txn.change("insert", c)?,
            Event::Update(c) => txn.change("update", c)?,
            Event::Delete(c) => txn.change("delete", c)?,
            Event::Truncate(t) => txn.truncate(t)?,
            Event::Commit(commit) => {
                let t = std::mem::take(&mut txn);
                if commit.end_lsn <= state.lsn {
                    // Applied before (the output has it), but the slot had
                    // not been told: drop it.
                    skipped += 1;
                } else {
                    let next = State {
                        lsn: commit.end_lsn,
                        output_len: state.output_len + t.lines.len() as u64,
                    };
                    changes += t.changes;
                    let (file, path) = (Arc::clone(&file), state_path.clone());
                    tokio::task::spawn_blocking(move || apply(&file, &t.lines, &path, next))
                        .await??;
                    state = next;
                    applied += 1;
                }
            }
            // Only between transactions: the server's WAL reached `wal_end`
            // and every transaction that ended before it was delivered.
            // Recording it lets the slot move on over WAL that has nothing
            // for the publication.
            Event::Heartbeat { wal_end } if *wal_end > state.lsn => {
                let next = State {
                    lsn: *wal_end,
                    ..state
                };
                let path = state_path.clone();
                tokio::task::spawn_blocking(move || store_state(&path, next)).await??;
                state = next;
            }
            Event::Reconnected { restart_lsn } => {
                // Everything after the last acknowledged position comes
                // again, the open transaction from its Begin.
                txn = Txn::default();
                eprintln!("reconnected; everything after {restart_lsn} comes again");
            }
            // Relation and type descriptions are kept by the stream (each
            // change carries its relation); streamed, two-phase and message
            // events are not asked for in this configuration.
            _ => {}
        }
        // Every ack position is at or before the stored one by now (a
        // commit just recorded or skipped, a heartbeat recorded), so the slot
        // never gets ahead of STATE_FILE.
        if let Some(lsn) = event.ack_lsn() {
            stream.ack(lsn);
        }
    }
    eprintln!(
        "{applied} transactions ({changes} changes) appended, {skipped} received again and \
         skipped; applied up to {}",
        state.lsn
    );
    stream.shutdown().await?;
    Ok(())
}

/// The consumer's record, in STATE_FILE as `LSN LENGTH`: the end of the last
/// transaction (or heartbeat) applied, and the output's length up to it.
#[derive(Debug, Clone, Copy)]
struct State {
    lsn: Lsn,
    output_len: u64,
}

fn parse_state(text: &str) -> Option<State> {
    let (lsn, len) = text.trim().split_once(' ')?;
    Some(State {
        lsn: lsn.parse().ok()?,
        output_len: len.parse().ok()?,
    })
}

/// Reads STATE_FILE (writing the initial one on a first run) and opens
/// OUTPUT_FILE for appending, cut back to the length the state records.
fn open_files(state_path: &Path, output: &Path) -> io::Result<(State, File)> {
    let state = match std::fs::read_to_string(state_path) {
        Ok(text) => parse_state(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: expected \"LSN LENGTH\"", state_path.display()),
            )
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A first run. The files belong together: an output without its
            // state is refused rather than cut to nothing.
            if std::fs::metadata(output).is_ok_and(|m| m.len() > 0) {
                return Err(io::Error::other(format!(
                    "{} is not empty but {} does not exist",
                    output.display(),
                    state_path.display()
                )));
            }
            // Recorded now, so that a crash before the first transaction is
            // recorded leaves a state saying "empty output" (not no state).
            let state = State {
                lsn: Lsn::INVALID,
                output_len: 0,
            };
            store_state(state_path, state)?;
            state
        }
        Err(e) => return Err(e),
    };
    let file = File::options().create(true).append(true).open(output)?;
    let len = file.metadata()?.len();
    if len < state.output_len {
        return Err(io::Error::other(format!(
            "{} has {len} bytes, fewer than the {} that {} records",
            output.display(),
            state.output_len,
            state_path.display()
        )));
    }
    if len > state.output_len {
        // Appended by a run that stopped before it recorded (and so before
        // it acknowledged) that transaction: it comes again.
        file.set_len(state.output_len)?;
        file.sync_all()?;
    }
    Ok((state, file))
}

/// Appends a transaction and fsyncs it, then records it in STATE_FILE. A
/// crash between the two leaves lines that the next start cuts off.
fn apply(file: &File, lines: &[u8], state_path: &Path, state: State) -> io::Result<()> {
    if !lines.is_empty() {
        let mut f = file;
        f.write_all(lines)?;
        f.sync_data()?;
    }
    store_state(state_path, state)
}

/// Replaces STATE_FILE atomically: a crash leaves the old state or the new
/// one, never a mix or nothing.
fn store_state(path: &Path, state: State) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = File::create(&tmp)?;
    writeln!(f, "{} {}", state.lsn, state.output_len)?;
    // The contents must be on disk before the rename makes them the state...
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // ...and the rename itself, an entry in the directory, too.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// The transaction being received: its changes as JSON lines, held until
/// its commit.
#[derive(Default)]
struct Txn {
    /// Where its commit record is (`Begin::final_lsn` = `Commit::commit_lsn`).
    commit_lsn: Lsn,
    lines: Vec<u8>,
    changes: u64,
}

impl Txn {
    fn new(commit_lsn: Lsn) -> Txn {
        Txn {
            commit_lsn,
            ..Txn::default()
        }
    }

    fn change(&mut self, op: &str, c: &Change) -> serde_json::Result<()> {
        self.line(json!({
            "commit_lsn": self.commit_lsn.to_string(),
            "op": op,
            "table": format!("{}.{}", c.relation.namespace, c.relation.name),
            "old": c.old.as_ref().map(row_json),
            "new": c.new.as_ref().map(row_json),
        }))
    }

    fn truncate(&mut self, t: &TruncateEvent) -> serde_json::Result<()> {
        let tables: Vec<String> = t
            .relations
            .iter()
            .map(|r| format!("{}.{}", r.namespace, r.name))
            .collect();
        self.line(json!({
            "commit_lsn": self.commit_lsn.to_string(),
            "op": "truncate",
            "tables": tables,
        }))
    }

    fn line(&mut self, v: Value) -> serde_json::Result<()> {
        serde_json::to_writer(&mut self.lines, &v)?;
        self.lines.push(b'\n');
        self.changes += 1;
        Ok(())
    }
}

/// A row image as `{"column": value, ...}`, values in PostgreSQL's text form
/// (`null` for NULL and for unchanged TOAST values, which were not sent).
fn row_json(row: &Row) -> Value {
    let columns: Map<String, Value> = row
        .iter()
        .map(|(column, value)| {
            let v = match value {
                ColumnValue::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
                _ => Value::Null,
            };
            (column.name.clone(), v)
        })
        .collect();
    Value::Object(columns)
}
