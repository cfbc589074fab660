//! Consumes logical changes (pgoutput) and acknowledges each transaction
//! only once it is durable.
//!
//! ```text
//! cargo run --example consume_with_acks -- CONNINFO SLOT PUBLICATION OUTPUT_FILE [STOP_LSN]
//! cargo run --example consume_with_acks -- "host=127.0.0.1 user=postgres dbname=app" \
//!     app_slot app_pub changes.jsonl
//! ```
//!
//! The server needs `wal_level = logical` and the publication must exist
//! (`CREATE PUBLICATION app_pub FOR TABLE ...`); the slot is created if it
//! is missing (it then starts at its creation point).
//!
//! The changes of a transaction are collected in memory. At its commit they
//! are appended to OUTPUT_FILE, one JSON object per line, the file is
//! fsynced, and only then is the commit's position (`Event::ack_lsn`, here
//! `Commit::end_lsn`) acknowledged with `LogicalStream::ack`. The stream
//! reports nothing but acknowledged positions to the server, so the slot
//! never moves past a transaction that is not on disk: a crash of this
//! program, of the server or of the network loses nothing. A transaction
//! may come twice, though: one written but whose acknowledgement had not
//! reached the server yet is sent again after a restart (at-least-once; the
//! `resume_after_restart` example makes the output exactly-once).
//!
//! A lost connection is re-established inside the stream, which then
//! delivers `Event::Reconnected { restart_lsn }` and everything after the
//! last acknowledged position again: the transaction being collected is
//! dropped and comes again whole.
//!
//! The program stops at STOP_LSN when given (after the first transaction
//! that ends at or after it), or on Ctrl-C (an open transaction is then
//! left unacknowledged, for the next run). Either way the last
//! acknowledgement is sent to the server before it exits.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

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
    if a.len() < 5 {
        return Err(
            "usage: consume_with_acks CONNINFO SLOT PUBLICATION OUTPUT_FILE [STOP_LSN]".into(),
        );
    }
    let config: Config = a[1].parse()?;
    let (slot, publication, output) = (a[2].clone(), a[3].clone(), a[4].clone());
    let stop: Option<Lsn> = a.get(5).map(|s| s.parse()).transpose()?;

    // The slot must exist before streaming starts.
    let mut client = ReplicationClient::connect(&config).await?;
    if client.slot_confirmed_flush(&slot).await?.is_none() {
        let info = client
            .create_logical_slot(&slot, &CreateSlotOptions::new())
            .await?;
        eprintln!("created slot {slot} at {}", info.consistent_point);
    }
    drop(client);

    let mut cfg = StreamConfig::new(slot, [publication]);
    if let Some(stop) = stop {
        cfg = cfg.stop_lsn(stop);
    }

    // File operations block, so they run on tokio's blocking pool, never on
    // a runtime thread (that would stall every task scheduled on it).
    let path = output.clone();
    let open = move || File::options().create(true).append(true).open(path);
    let file = Arc::new(tokio::task::spawn_blocking(open).await??);

    let mut stream = LogicalStream::start(config, cfg).await?;
    tokio::pin!(shutdown);
    let mut txn = Txn::default();
    let (mut transactions, mut changes) = (0u64, 0u64);
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = &mut shutdown => None,
        };
        // None: STOP_LSN was reached (or Ctrl-C).
        let Some(event) = event else { break };
        // Transient failures are retried inside the stream (see Reconnected
        // below); an error that gets here is permanent.
        let event = event?;
        match &event {
            Event::Begin(b) => txn = Txn::new(b.xid, b.final_lsn),
            Event::Insert(c) => txn.change("insert", c)?,
            Event::Update(c) => txn.change("update", c)?,
            Event::Delete(c) => txn.change("delete", c)?,
            Event::Truncate(t) => txn.truncate(t)?,
            Event::Commit(_) => {
                let t = std::mem::take(&mut txn);
                changes += t.changes;
                if !t.lines.is_empty() {
                    let file = Arc::clone(&file);
                    // Append and fdatasync: after this the transaction
                    // survives a crash, and may be acknowledged (below).
                    tokio::task::spawn_blocking(move || {
                        let mut f: &File = &file;
                        f.write_all(&t.lines)?;
                        f.sync_data()
                    })
                    .await??;
                }
                transactions += 1;
            }
            Event::Reconnected { restart_lsn } => {
                // The new session starts at the last acknowledged commit, so
                // the transaction being collected comes again from its Begin.
                txn = Txn::default();
                eprintln!("reconnected; everything after {restart_lsn} comes again");
            }
            // Relation and type descriptions are kept by the stream (each
            // change carries its relation); streamed, two-phase and message
            // events are not asked for in this configuration.
            _ => {}
        }
        // Acknowledge only what is durable. With this configuration only a
        // commit has an ack position, and its transaction was just fsynced.
        if let Some(lsn) = event.ack_lsn() {
            stream.ack(lsn);
        }
    }
    eprintln!(
        "{transactions} transactions ({changes} changes) appended to {output}; \
         acknowledged up to {}",
        stream.acked()
    );
    // Sends a final status update with the last acknowledgement and ends
    // replication cleanly (dropping the stream would also send it, without
    // waiting).
    stream.shutdown().await?;
    Ok(())
}

/// The transaction being received: its changes as JSON lines, held until
/// its commit.
#[derive(Default)]
struct Txn {
    xid: u32,
    /// Where its commit record is (`Begin::final_lsn` = `Commit::commit_lsn`).
    commit_lsn: Lsn,
    lines: Vec<u8>,
    changes: u64,
}

impl Txn {
    fn new(xid: u32, commit_lsn: Lsn) -> Txn {
        Txn {
            xid,
            commit_lsn,
            ..Txn::default()
        }
    }

    fn change(&mut self, op: &str, c: &Change) -> serde_json::Result<()> {
        self.line(json!({
            "xid": self.xid,
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
            "xid": self.xid,
            "commit_lsn": self.commit_lsn.to_string(),
            "op": "truncate",
            "tables": tables,
            "cascade": t.options & 1 != 0,
            "restart_identity": t.options & 2 != 0,
        }))
    }

    fn line(&mut self, v: Value) -> serde_json::Result<()> {
        serde_json::to_writer(&mut self.lines, &v)?;
        self.lines.push(b'\n');
        self.changes += 1;
        Ok(())
    }
}

/// A row image as `{"column": value, ...}`, values in PostgreSQL's text form.
fn row_json(row: &Row) -> Value {
    let columns: Map<String, Value> = row
        .iter()
        .map(|(column, value)| (column.name.clone(), value_json(value)))
        .collect();
    Value::Object(columns)
}

fn value_json(v: &ColumnValue) -> Value {
    match v {
        ColumnValue::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        // A TOASTed value the update did not change: the server did not send
        // it (a full old image, `REPLICA IDENTITY FULL`, fills it in).
        ColumnValue::UnchangedToast => json!({ "unchanged_toast": true }),
        // NULL; binary values are not asked for (`StreamConfig::binary`).
        _ => Value::Null,
    }
}
