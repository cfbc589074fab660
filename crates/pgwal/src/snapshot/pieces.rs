//! The copy cut into pieces, whole tables or page ranges of large ones, and
//! the workers that copy them, each on a connection of its own in the same
//! exported snapshot.
//!
//! Memory stays bounded whatever the table sizes: a worker hands rows over
//! in batches of about [`BATCH_BYTES`] of COPY text through a channel of
//! `2 × jobs` batches, and waits while it is full.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::copy_text;
use super::publication::PublishedTable;
use crate::client::ReplicationClient;
use crate::commands::{quote_ident, quote_literal};
use crate::config::Config;
use crate::error::{Error, Result};

/// COPY text per batch handed to the sink's side.
pub(crate) const BATCH_BYTES: usize = 1 << 20;

/// One `COPY ... TO STDOUT` of (part of) a table.
pub(crate) struct Piece {
    /// Index into the copied tables.
    pub(crate) table: usize,
    pub(crate) sql: String,
}

/// Rows of one piece; `piece_done` on the piece's last batch.
pub(crate) struct Batch {
    pub(crate) table: usize,
    pub(crate) rows: Vec<Vec<Option<String>>>,
    pub(crate) piece_done: bool,
}

/// `BEGIN` a read-only repeatable-read transaction in `snapshot`.
pub(crate) async fn begin_in(sql: &mut ReplicationClient, snapshot: &str) -> Result<()> {
    sql.simple_query(&format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
        quote_literal(snapshot)
    ))
    .await
    .map(drop)
}

/// The columns copied of each table, and the pieces. A table of more than
/// `chunk_pages` pages (when not partitioned, and 14+, where a `ctid` range
/// is a TID range scan) is cut into page ranges; the last range is open, so
/// pages added after the size was read are not missed (none holds a row the
/// snapshot sees, but the plan does not rely on it).
pub(crate) async fn plan(
    sql: &mut ReplicationClient,
    tables: &[PublishedTable],
    chunk_pages: u32,
    major: u32,
) -> Result<(Vec<Vec<String>>, Vec<Piece>)> {
    let mut columns = Vec::with_capacity(tables.len());
    let mut pieces = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        let qualified = format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.table));
        let cols = match &t.columns {
            Some(c) => c.clone(),
            None => sql
                .simple_query(&format!(
                    "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = {}::regclass \
                     AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                    quote_literal(&qualified)
                ))
                .await?
                .iter()
                .map(|r| r.get_index(0).unwrap_or_default().to_owned())
                .collect(),
        };
        let list = cols
            .iter()
            .map(|c| quote_ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let pages: u64 = if !t.partitioned && major >= 14 && chunk_pages > 0 {
            sql.simple_query(&format!(
                "SELECT pg_catalog.pg_relation_size({}::regclass) \
                 / pg_catalog.current_setting('block_size')::int8",
                quote_literal(&qualified)
            ))
            .await?
            .first()
            .and_then(|r| r.get_index(0))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
        } else {
            0
        };
        let filter = t.row_filter.as_deref();
        let select = |range: Option<String>| {
            let conds: Vec<String> = range.into_iter().chain(filter.map(str::to_owned)).collect();
            let r#where = if conds.is_empty() {
                String::new()
            } else {
                format!(" WHERE {}", conds.join(" AND "))
            };
            format!("COPY (SELECT {list} FROM {qualified}{where}) TO STDOUT")
        };
        let chunk = u64::from(chunk_pages);
        if pages > chunk {
            let mut from = 0;
            while from < pages {
                let to = from + chunk;
                let range = if to >= pages {
                    format!("ctid >= '({from},0)'")
                } else {
                    format!("ctid >= '({from},0)' AND ctid < '({to},0)'")
                };
                pieces.push(Piece {
                    table: i,
                    sql: select(Some(range)),
                });
                from = to;
            }
        } else if filter.is_none() && !t.partitioned {
            pieces.push(Piece {
                table: i,
                sql: format!("COPY {qualified} ({list}) TO STDOUT"),
            });
        } else {
            // COPY refuses a partitioned table and has no WHERE: a query
            pieces.push(Piece {
                table: i,
                sql: select(None),
            });
        }
        columns.push(cols);
    }
    Ok((columns, pieces))
}

/// Copies pieces from `queue` until it is empty, on `conn` (already in the
/// snapshot) or a new connection that imports `snapshot`.
pub(crate) async fn work(
    conn: Option<ReplicationClient>,
    config: &Config,
    snapshot: &str,
    queue: &Mutex<VecDeque<Piece>>,
    tx: mpsc::Sender<Batch>,
) -> Result<()> {
    let mut sql = match conn {
        Some(c) => c,
        None => {
            let mut c = ReplicationClient::connect_sql(config).await?;
            begin_in(&mut c, snapshot).await?;
            c
        }
    };
    loop {
        let Some(piece) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else {
            break;
        };
        sql.copy_out_start(&piece.sql).await?;
        let (mut partial, mut rows, mut bytes) = (Vec::new(), Vec::new(), 0);
        while let Some(chunk) = sql.copy_out_next().await? {
            partial.extend_from_slice(&chunk);
            let mut start = 0;
            while let Some(n) = partial[start..].iter().position(|b| *b == b'\n') {
                rows.push(copy_text::fields(&partial[start..start + n])?);
                start += n + 1;
            }
            bytes += start;
            partial.drain(..start);
            if bytes >= BATCH_BYTES {
                let batch = Batch {
                    table: piece.table,
                    rows: std::mem::take(&mut rows),
                    piece_done: false,
                };
                tx.send(batch).await.map_err(|_| Error::Closed)?;
                bytes = 0;
            }
        }
        let batch = Batch {
            table: piece.table,
            rows,
            piece_done: true,
        };
        tx.send(batch).await.map_err(|_| Error::Closed)?;
    }
    sql.simple_query("COMMIT").await.map(drop)
}
