//! Initial snapshot: a consistent copy of the published tables, handed off
//! to the stream with no gap and no duplicate.
//!
//! [`initial_copy`] creates the slot with an exported snapshot on a
//! replication connection, imports that snapshot into `REPEATABLE READ`
//! transactions on SQL connections ([`CopyOptions::jobs`] of them), copies
//! the tables of the publications with `COPY ... TO STDOUT`, and returns the
//! slot's consistent point. Every change committed before that point is in
//! the copy; every change after it is streamed by a
//! [`LogicalStream`](crate::LogicalStream) on the same slot (which starts
//! exactly there).
//!
//! [`table_copy`] does the same for tables added to a publication later,
//! on a temporary slot: the copy holds every transaction that committed
//! before its consistent point, so the running stream's changes to those
//! tables in transactions that committed before it are already in the copy.

mod copy_text;
mod pieces;
mod publication;

pub use publication::PublishedTable;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;

use crate::client::ReplicationClient;
use crate::commands::{quote_literal, CreateSlotOptions, SlotSnapshot};
use crate::config::Config;
use crate::error::{Error, Result};
use pgwal_protocol::Lsn;

/// One row of the initial copy, in text format.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotRow<'a> {
    /// Schema.
    pub schema: &'a str,
    /// Table.
    pub table: &'a str,
    /// Column names.
    pub columns: &'a [String],
    /// Values in text format (`None` for NULL).
    pub values: Vec<Option<String>>,
}

/// Result of [`initial_copy`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InitialCopy {
    /// Where streaming continues: the slot's consistent point.
    pub consistent_point: Lsn,
    /// Tables copied, as `schema.table`.
    pub tables: Vec<String>,
    /// Rows copied.
    pub rows: u64,
}

/// How to copy: parallel connections, chunk size, which tables.
///
/// ```
/// let opts = pgwal::snapshot::CopyOptions::default().jobs(4).tables(["public.orders"]);
/// assert_eq!(opts.jobs, 4);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyOptions {
    /// Create the slot with two-phase decoding ([`initial_copy_with`]).
    pub two_phase: bool,
    /// Connections copying at once, all in the same exported snapshot
    /// (default 1). Rows of one table then arrive in no particular order.
    pub jobs: usize,
    /// A table of more than this many pages is copied in page ranges of
    /// this size, which the jobs share (default 16384: 128 MiB of 8 kB
    /// pages; 0: whole tables only). Needs 14+ (TID range scans).
    pub chunk_pages: u32,
    /// Only these published tables (`schema.table`, or `table` in any
    /// schema); `None`: all. Naming a table the publications do not
    /// publish is [`Error::NotPublished`].
    pub tables: Option<Vec<String>>,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            two_phase: false,
            jobs: 1,
            chunk_pages: 16_384,
            tables: None,
        }
    }
}

impl CopyOptions {
    /// Sets `two_phase`.
    pub fn two_phase(mut self, v: bool) -> Self {
        self.two_phase = v;
        self
    }
    /// Sets `jobs` (at least 1).
    pub fn jobs(mut self, v: usize) -> Self {
        self.jobs = v.max(1);
        self
    }
    /// Sets `chunk_pages`.
    pub fn chunk_pages(mut self, v: u32) -> Self {
        self.chunk_pages = v;
        self
    }
    /// Sets `tables`.
    pub fn tables<I, S>(mut self, v: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tables = Some(v.into_iter().map(Into::into).collect());
        self
    }
}

/// How far a copy is, after each piece (a table, or a page range of one).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyProgress {
    /// Pieces copied.
    pub pieces_done: usize,
    /// Pieces in all.
    pub pieces_total: usize,
    /// Rows handed to the sink so far.
    pub rows: u64,
    /// The table of the piece just finished, as `schema.table`.
    pub table: String,
}

/// Creates `slot` (pgoutput) with an exported snapshot, copies the tables of
/// `publications` as of that snapshot into `sink`, and returns the point
/// where streaming continues. Start a [`LogicalStream`](crate::LogicalStream)
/// on `slot` afterwards: it begins exactly at
/// [`InitialCopy::consistent_point`].
///
/// If the copy fails the slot is dropped, so a retry starts from scratch
/// (an exported snapshot cannot be resumed).
///
/// ```no_run
/// # async fn f() -> Result<(), pgwal::Error> {
/// let config: pgwal::Config = "host=127.0.0.1 user=postgres dbname=app".parse()?;
/// let copy = pgwal::snapshot::initial_copy(&config, "app_slot", &["app_pub"], false, |row| {
///     println!("{}.{}: {:?}", row.schema, row.table, row.values);
///     Ok(())
/// })
/// .await?;
/// let stream = pgwal::LogicalStream::start(config, pgwal::StreamConfig::new("app_slot", ["app_pub"])).await?;
/// # Ok(()) }
/// ```
pub async fn initial_copy(
    config: &Config,
    slot: &str,
    publications: &[&str],
    two_phase: bool,
    sink: impl FnMut(SnapshotRow<'_>) -> Result<()>,
) -> Result<InitialCopy> {
    let opts = CopyOptions::default().two_phase(two_phase);
    initial_copy_with(config, slot, publications, &opts, sink, |_| {}).await
}

/// [`initial_copy`] with [`CopyOptions`] (parallel jobs, chunks, a subset
/// of the tables) and a `progress` callback, called after each piece.
pub async fn initial_copy_with(
    config: &Config,
    slot: &str,
    publications: &[&str],
    opts: &CopyOptions,
    sink: impl FnMut(SnapshotRow<'_>) -> Result<()>,
    progress: impl FnMut(&CopyProgress),
) -> Result<InitialCopy> {
    let mut repl = ReplicationClient::connect(config).await?;
    let (point, snapshot) = export_snapshot(
        &mut repl,
        slot,
        CreateSlotOptions::new().two_phase(opts.two_phase),
    )
    .await?;
    let result =
        copy_in_snapshot(config, &snapshot, point, publications, opts, sink, progress).await;
    if result.is_err() {
        let _ = repl.drop_slot(slot, false).await;
    }
    result
}

/// Copies published tables (usually [`CopyOptions::tables`], added to a
/// publication after the stream began) as of a new consistent point, on a
/// temporary slot that ends with the copy; returns that point.
///
/// A stream already running on the publication delivers changes of those
/// tables from the transaction that added them on. Those of transactions
/// that committed before the returned point (their `Begin::final_lsn` is
/// below it) are already in the copy and must be skipped; the rest apply
/// on top of it. `pgwal stream --snapshot-table` does exactly that.
pub async fn table_copy(
    config: &Config,
    publications: &[&str],
    opts: &CopyOptions,
    sink: impl FnMut(SnapshotRow<'_>) -> Result<()>,
    progress: impl FnMut(&CopyProgress),
) -> Result<InitialCopy> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut repl = ReplicationClient::connect(config).await?;
    let name = format!(
        "pgwal_copy_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let (point, snapshot) =
        export_snapshot(&mut repl, &name, CreateSlotOptions::new().temporary(true)).await?;
    // the temporary slot goes with this connection, after the copy
    copy_in_snapshot(config, &snapshot, point, publications, opts, sink, progress).await
}

/// The tables `publications` publish, and what of each (columns, row
/// filter), combined over the publications as the server's own table
/// synchronization does; over a SQL connection (`sql`), in its snapshot.
pub async fn published_tables(
    sql: &mut ReplicationClient,
    publications: &[&str],
) -> Result<Vec<PublishedTable>> {
    let pubs: Vec<String> = publications.iter().map(|p| quote_literal(p)).collect();
    let major = sql.server_major_version().unwrap_or(10);
    publication::published_tables(sql, &pubs, major).await
}

/// Creates `slot` with an exported snapshot; returns its consistent point
/// and the snapshot's name. `repl` must stay idle while the snapshot is used.
async fn export_snapshot(
    repl: &mut ReplicationClient,
    slot: &str,
    opts: CreateSlotOptions,
) -> Result<(Lsn, String)> {
    let info = repl
        .create_logical_slot(slot, &opts.snapshot(SlotSnapshot::Export))
        .await?;
    let snapshot = info
        .snapshot_name
        .ok_or(Error::BadResult("CREATE_REPLICATION_SLOT snapshot"))?;
    Ok((info.consistent_point, snapshot))
}

/// The copy itself, while the exporting replication connection stays idle.
async fn copy_in_snapshot(
    config: &Config,
    snapshot: &str,
    consistent_point: Lsn,
    publications: &[&str],
    opts: &CopyOptions,
    mut sink: impl FnMut(SnapshotRow<'_>) -> Result<()>,
    mut progress: impl FnMut(&CopyProgress),
) -> Result<InitialCopy> {
    let mut sql = ReplicationClient::connect_sql(config).await?;
    pieces::begin_in(&mut sql, snapshot).await?;
    let pubs: Vec<String> = publications.iter().map(|p| quote_literal(p)).collect();
    let major = sql.server_major_version().unwrap_or(10);
    let mut tables = publication::published_tables(&mut sql, &pubs, major).await?;
    if let Some(want) = &opts.tables {
        let named = |t: &publication::PublishedTable, w: &str| {
            w == t.table || w == format!("{}.{}", t.schema, t.table)
        };
        if let Some(w) = want.iter().find(|w| !tables.iter().any(|t| named(t, w))) {
            return Err(Error::NotPublished { table: w.clone() });
        }
        tables.retain(|t| want.iter().any(|w| named(t, w)));
    }
    let (columns, plan) = pieces::plan(&mut sql, &tables, opts.chunk_pages, major).await?;
    let total = plan.len();
    let jobs = opts.jobs.clamp(1, total.max(1));
    let queue = Mutex::new(VecDeque::from(plan));
    let (tx, mut rx) = mpsc::channel::<pieces::Batch>(2 * jobs);
    let mut first = Some(sql);
    let workers = futures_util::future::try_join_all(
        (0..jobs).map(|_| pieces::work(first.take(), config, snapshot, &queue, tx.clone())),
    );
    drop(tx);
    let names: Vec<String> = tables
        .iter()
        .map(|t| format!("{}.{}", t.schema, t.table))
        .collect();
    let consume = async {
        let (mut rows, mut done) = (0u64, 0usize);
        while let Some(b) = rx.recv().await {
            let t = &tables[b.table];
            for values in b.rows {
                sink(SnapshotRow {
                    schema: &t.schema,
                    table: &t.table,
                    columns: &columns[b.table],
                    values,
                })?;
                rows += 1;
            }
            if b.piece_done {
                done += 1;
                progress(&CopyProgress {
                    pieces_done: done,
                    pieces_total: total,
                    rows,
                    table: names[b.table].clone(),
                });
            }
        }
        Ok::<_, Error>(rows)
    };
    // a failing sink drops the receiver, which stops the workers
    let (copied, rows) = tokio::join!(workers, consume);
    let rows = rows?;
    copied?;
    Ok(InitialCopy {
        consistent_point,
        tables: names,
        rows,
    })
}
