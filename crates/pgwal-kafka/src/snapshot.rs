//! Snapshots into Kafka: the rows tables already hold, as read records
//! (`op: r`), consistent with the stream and exactly once.
//!
//! A snapshot reads each table in key order, a chunk at a time, while the
//! sink keeps streaming (the DBLog idea that Debezium's incremental
//! snapshots also use). A chunk is made consistent with the stream like
//! this:
//!
//! 1. The sink pauses between two transactions, at stream position P: all
//!    it wrote so far is before P.
//! 2. On a SQL connection, one `REPEATABLE READ` transaction with snapshot
//!    S reads the table's description and the chunk (`WHERE key > last
//!    ORDER BY key LIMIT n`), and emits a transactional logical message, the
//!    *watermark*, with the chunk's id. Its commit record follows every
//!    commit record of a transaction visible in S.
//! 3. The sink streams on. Every change between P and the watermark to a
//!    row in the chunk removes that row from the chunk: the stream carries
//!    its newer state. At the watermark the rows left are written as read
//!    records, then the cursor moves past the chunk in the progress record
//!    of the same Kafka transaction.
//!
//! Why the rows written are right: a row left in the chunk was not changed
//! between P and the watermark, and no transaction after the watermark is
//! visible in S; so it is as S saw it unless a change the sink wrote
//! *before* P is invisible in S. That happens when a transaction's commit
//! is decoded before it becomes visible: a synchronous standby has not
//! confirmed it yet (the walsender of a logical slot does not wait for
//! one). While a snapshot runs, the sink keeps the rows each transaction
//! it wrote changed, until a read sees that transaction committed; a chunk
//! whose S sees one of them in progress leaves those rows out (the stream
//! already carried their newer state), and is read again only when such a
//! transaction changed the table without keys kept (a truncate, a streamed
//! transaction). For what it wrote before (a previous run, or before the
//! snapshot began), only transactions waiting for a synchronous standby
//! (`wait_event` `SyncRep` in `pg_stat_activity`; their `backend_xid` needs
//! `pg_read_all_stats` to be seen) can be hidden, and chunks wait until the
//! ones waiting at the first chunk are visible to the read (a commit leaves
//! its wait a moment before it becomes visible; a prepared transaction,
//! which stays in progress until its COMMIT PREPARED, is not waited for).
//!
//! A streamed transaction's changes reach Kafka at its commit; when one
//! that touched the chunk's table commits inside the window, the chunk is
//! read again (its keys are not kept). A crash loses the chunk; the
//! restarted sink reads it again from the cursor in Kafka's progress and
//! ignores the old watermark, whose id is not its chunk's.
//!
//! **Read-only chunks** ([`SinkConfig::snapshot_read_only`](crate::SinkConfig::snapshot_read_only),
//! and every chunk on a hot standby) write no watermark. Step 2's first
//! query also reads a WAL position after S was taken (the insert position
//! on a primary, the replayed one on a standby): every commit S sees ends
//! at or before it. The window of step 3 then ends before the first
//! transaction whose commit starts at or after that position, or when the
//! server, asked for its position, reports that it has sent past it.
//!
//! Snapshots start with `--snapshot` when Kafka holds nothing of the stream
//! yet (every published table), or at a *signal*: a transactional logical
//! message with prefix [`SIGNAL_PREFIX`] and content `{"tables": ["schema.table", ...]}`,
//! which comes through the stream in commit order, exactly once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use pgwal::protocol::pgoutput::{
    ColumnValue, Relation, RelationColumn, ReplicaIdentity, TupleData,
};
use pgwal::{quote_ident, quote_literal, Lsn, ReplicationClient, Row};
use serde::{Deserialize, Serialize};

use crate::format::{key_names, key_object, Format};
use crate::keys::{primary_key_query, KeyColumns};

/// The prefix of the logical messages that start a snapshot.
pub const SIGNAL_PREFIX: &str = "pgwal.snapshot";

/// The prefix of the chunks' watermark messages.
pub const WATERMARK_PREFIX: &str = "pgwal.snapshot.watermark";

/// Where a snapshot stands, as the progress record carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SnapshotCursor {
    /// The tables still to read, as (schema, table); the first is being
    /// read.
    pub tables: Vec<(String, String)>,
    /// How far the first table has been read.
    #[serde(flatten)]
    pub position: TablePosition,
    /// Rows written so far by this snapshot.
    pub rows: u64,
}

/// How far a snapshot has read its current table. Records written before
/// the last three fields existed have `after` only, and are read as
/// before: without an upper bound, trusting that the table and its key
/// did not change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TablePosition {
    /// The key (its columns' text values) of the last row read; `None`:
    /// from the table's start.
    pub after: Option<Vec<String>>,
    /// The key columns `after` and `until` hold values of. A table whose
    /// key changed since is read again from its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_columns: Option<Vec<String>>,
    /// The table's largest key when its first chunk was read. Rows with a
    /// larger key were written later, so the stream carries them, and the
    /// snapshot stops here instead of chasing the table's tail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Vec<String>>,
    /// The table's OID when its first chunk was read. A table dropped and
    /// created again under its name is another table, read from its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oid: Option<u32>,
}

impl SnapshotCursor {
    /// A snapshot of `tables` (`schema.table`; the first dot separates)
    /// from their start.
    pub fn new(tables: Vec<String>) -> SnapshotCursor {
        SnapshotCursor {
            tables: tables
                .into_iter()
                .map(|t| match t.split_once('.') {
                    Some((s, t)) => (s.to_owned(), t.to_owned()),
                    None => ("public".to_owned(), t),
                })
                .collect(),
            position: TablePosition::default(),
            rows: 0,
        }
    }

    /// Adds tables not queued yet, in order.
    pub fn add(&mut self, tables: impl IntoIterator<Item = (String, String)>) {
        for t in tables {
            if !self.tables.contains(&t) {
                self.tables.push(t);
            }
        }
    }
}

/// Errors of reading a chunk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// From PostgreSQL.
    #[error(transparent)]
    Postgres(#[from] pgwal::Error),
    /// The table has no columns that identify its rows: no primary key or
    /// replica identity index, and none configured.
    #[error("{schema}.{table} cannot be snapshotted: its rows have no key (no primary key or replica identity index); name key columns with --kafka-key-columns")]
    NoKey {
        /// Schema.
        schema: String,
        /// Table.
        table: String,
    },
    /// The key columns cannot page through the table: keyset paging
    /// (`WHERE (key) > (last) ORDER BY key`) would skip rows whose key
    /// repeats across a chunk's end, and never reach rows with a NULL in
    /// it.
    #[error("{schema}.{table} cannot be snapshotted by its key columns ({}): they must be NOT NULL and hold the columns of a unique index (not partial, no expressions); add one, or name other key columns with --kafka-key-columns", columns.join(", "))]
    KeyNotUnique {
        /// Schema.
        schema: String,
        /// Table.
        table: String,
        /// The key columns.
        columns: Vec<String>,
    },
    /// A value the server returned that pgwal cannot read.
    #[error("snapshot of {table}: {what}")]
    BadResult {
        /// `schema.table`.
        table: String,
        /// What.
        what: String,
    },
}

/// The SQL that signals a snapshot of `tables` (`schema.table`) to a sink
/// streaming from this database: a transactional logical message, which
/// reaches the sink in commit order with the changes. With `slot`, only
/// the sink streaming from that slot acts on it; every sink on the
/// database sees a signal.
///
/// ```
/// let tables = ["public.orders".to_owned()];
/// let sql = pgwal_kafka::snapshot::signal_sql(&tables, None);
/// assert_eq!(sql, r#"SELECT pg_catalog.pg_logical_emit_message(true, 'pgwal.snapshot', '{"tables":["public.orders"]}')"#);
/// let sql = pgwal_kafka::snapshot::signal_sql(&tables, Some("orders_kafka"));
/// assert_eq!(sql, r#"SELECT pg_catalog.pg_logical_emit_message(true, 'pgwal.snapshot', '{"slot":"orders_kafka","tables":["public.orders"]}')"#);
/// ```
pub fn signal_sql(tables: &[String], slot: Option<&str>) -> String {
    let content = match slot {
        Some(slot) => serde_json::json!({ "tables": tables, "slot": slot }),
        None => serde_json::json!({ "tables": tables }),
    }
    .to_string();
    format!(
        "SELECT pg_catalog.pg_logical_emit_message(true, {}, {})",
        quote_literal(SIGNAL_PREFIX),
        quote_literal(&content)
    )
}

/// A snapshot signal's content.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Signal {
    /// The tables to snapshot, `schema.table`.
    pub tables: Vec<String>,
    /// The slot of the only sink that acts on it (`None`: every sink).
    #[serde(default)]
    pub slot: Option<String>,
}

/// The signal's content: which tables to snapshot, and for which slot.
pub fn parse_signal(content: &[u8]) -> Result<Signal, String> {
    serde_json::from_slice(content).map_err(|e| e.to_string())
}

/// One chunk read, waiting for its watermark.
#[derive(Debug)]
pub(crate) struct Chunk {
    /// The watermark's content.
    pub id: String,
    /// A read-only chunk (no watermark written): its window ends where the
    /// stream passes this position.
    pub high: Option<Lsn>,
    /// The table as the chunk read it.
    pub relation: Arc<Relation>,
    /// The rows still to write (`None`: changed in the window).
    pub rows: Vec<Option<Row>>,
    /// Each row's key (pgwal's JSON of its key columns) → index in `rows`.
    pub index: HashMap<Vec<u8>, usize>,
    /// The cursor after the chunk.
    pub position: TablePosition,
    /// The table is done after this chunk: fewer rows than asked for, or
    /// its last row is the table's largest key at its start.
    pub table_done: bool,
    /// The chunk ended early, at the byte limit.
    pub cut_by_bytes: bool,
    /// Read again: a streamed transaction that touched the table committed
    /// in the window.
    pub abandoned: bool,
    /// What S does not see: the transactions it lists in progress, and
    /// every xid from its xmax on (low 32 bits, as pgoutput's).
    pub in_progress: HashSet<u32>,
    pub xmax: u32,
    /// Transactions waiting for a synchronous standby when S was taken
    /// (committed, not yet visible).
    pub held: Vec<u32>,
    /// Prepared transactions when S was taken: in progress until their
    /// COMMIT PREPARED, however long that takes.
    pub prepared: HashSet<u32>,
    /// The table's primary key, when the key columns of its records are
    /// (a FULL table) and `KeyColumns` did not know it yet.
    pub primary_key: Option<Vec<String>>,
}

impl Chunk {
    /// Whether S does not see transaction `xid`.
    pub fn invisible(&self, xid: u32) -> bool {
        invisible(&self.in_progress, self.xmax, xid)
    }

    /// Removes the row with this key (pgwal's key JSON) from the chunk.
    pub fn changed(&mut self, key: &[u8]) {
        if let Some(i) = self.index.remove(key) {
            self.rows[i] = None;
        }
    }

    /// Every row goes (the table was truncated in the window).
    pub fn truncated(&mut self) {
        self.index.clear();
        self.rows.iter_mut().for_each(|r| *r = None);
    }
}

/// Whether a snapshot with these in-progress xids and this xmax does not
/// see `xid` (xids compare modulo 2^32, as TransactionIdFollowsOrEquals).
fn invisible(in_progress: &HashSet<u32>, xmax: u32, xid: u32) -> bool {
    in_progress.contains(&xid) || (xid.wrapping_sub(xmax) as i32) >= 0
}

/// The key of `row` as the chunk indexes it: its record key columns in
/// pgwal's JSON (`None`: a key column is NULL or missing).
pub(crate) fn row_key(row: &Row, keys: &KeyColumns) -> Option<Vec<u8>> {
    let k = key_object(&Format::Pgwal, row, keys.for_relation(row.relation())).ok()??;
    Some(serde_json::to_vec(&k).expect("JSON serializes"))
}

/// A fresh watermark id: process, time and a counter.
fn watermark_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}-{t:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// What the catalog says of a table, in the chunk's snapshot.
struct Described {
    relation: Arc<Relation>,
    /// Each column's type name without modifier, for the cursor's casts.
    type_names: Vec<String>,
    partitioned: bool,
}

/// How a chunk is read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkLimits {
    /// At most this many rows.
    pub rows: usize,
    /// Rows up to about this many bytes of values (the first row always).
    pub bytes: usize,
    /// The server cancels the chunk's queries after this long, so that a
    /// chunk the sink gave up on does not run on in the server.
    pub statement_timeout: Option<std::time::Duration>,
    /// Chunks end at a WAL position, not at a watermark.
    pub read_only: bool,
}

/// Reads the next chunk of `table` from `position` in one transaction on
/// `sql`, and emits its watermark. `publications` say which columns and
/// rows are published. `None`: the table is no longer there or no longer
/// published (it is left out of the snapshot).
pub(crate) async fn read_chunk(
    sql: &mut ReplicationClient,
    publications: &[String],
    (schema, table): (&str, &str),
    position: &TablePosition,
    limits: ChunkLimits,
    keys: &KeyColumns,
) -> Result<Option<Chunk>, SnapshotError> {
    sql.simple_query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await?;
    let r = match limits.statement_timeout {
        Some(t) => sql
            .simple_query(&format!(
                "SET LOCAL statement_timeout = {}",
                t.as_millis().max(1)
            ))
            .await
            .map(drop)
            .map_err(SnapshotError::from),
        None => Ok(()),
    };
    let r = match r {
        Ok(()) => read_chunk_in(sql, publications, (schema, table), position, limits, keys).await,
        Err(e) => Err(e),
    };
    let end = if r.as_ref().is_ok_and(Option::is_some) {
        "COMMIT"
    } else {
        "ROLLBACK"
    };
    match r {
        Ok(c) => {
            sql.simple_query(end).await?;
            Ok(c)
        }
        Err(e) => {
            let _ = sql.simple_query(end).await;
            Err(e)
        }
    }
}

async fn read_chunk_in(
    sql: &mut ReplicationClient,
    publications: &[String],
    (schema, table): (&str, &str),
    position: &TablePosition,
    limits: ChunkLimits,
    keys: &KeyColumns,
) -> Result<Option<Chunk>, SnapshotError> {
    let ChunkLimits {
        rows: limit,
        read_only,
        ..
    } = limits;
    let name = format!("{schema}.{table}");
    let bad = |what: String| SnapshotError::BadResult {
        table: name.clone(),
        what,
    };
    // The first query takes S; an xid at or past its xmax is not listed
    // in progress, and not seen either. The WAL position it reads is read
    // after S was taken, so every commit S sees ends at or before it: on
    // a primary the insert position, on a standby the replayed one.
    let r = sql
        .simple_query(
            "SELECT pg_catalog.pg_snapshot_xmax(s)::text, \
                    (SELECT pg_catalog.string_agg(x::text, ',') FROM pg_catalog.pg_snapshot_xip(s) x), \
                    (SELECT pg_catalog.string_agg(a.backend_xid::text, ',') \
                     FROM pg_catalog.pg_stat_activity a \
                     WHERE a.wait_event = 'SyncRep' AND a.backend_xid IS NOT NULL), \
                    pg_catalog.pg_is_in_recovery()::text, \
                    (CASE WHEN pg_catalog.pg_is_in_recovery() \
                          THEN pg_catalog.pg_last_wal_replay_lsn() \
                          ELSE pg_catalog.pg_current_wal_insert_lsn() END)::text, \
                    pg_catalog.current_setting('wal_block_size'), \
                    (SELECT pg_catalog.string_agg(p.transaction::text, ',') \
                     FROM pg_catalog.pg_prepared_xacts p) \
             FROM (SELECT pg_catalog.pg_current_snapshot() AS s) q",
        )
        .await?;
    let r = r.first().ok_or_else(|| bad("no snapshot".into()))?;
    // a standby cannot write a watermark: its chunks end at a position
    let in_recovery = r.get_index(3) == Some("true");
    let high = if read_only || in_recovery {
        let lsn: Lsn = r
            .get_index(4)
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| bad("no WAL position".into()))?;
        let block: u64 = r
            .get_index(5)
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| bad("no wal_block_size".into()))?;
        Some(window_end(lsn, block))
    } else {
        // the watermark needs no synchronous standby: it is only a position
        sql.simple_query("SET LOCAL synchronous_commit = local")
            .await?;
        None
    };
    // pgoutput's xids are the low 32 bits of the xid8s
    let xids = |i: usize| -> Result<Vec<u32>, SnapshotError> {
        r.get_index(i)
            .unwrap_or_default()
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse::<u64>().map(|x| x as u32))
            .collect::<Result<_, _>>()
            .map_err(|_| bad("an xid that is not a number".into()))
    };
    let xmax = *xids(0)?.first().ok_or_else(|| bad("no xmax".into()))?;
    let in_progress: HashSet<u32> = xids(1)?.into_iter().collect();
    let held = xids(2)?;
    let prepared: HashSet<u32> = xids(6)?.into_iter().collect();
    let pubs: Vec<&str> = publications.iter().map(String::as_str).collect();
    let published = pgwal::snapshot::published_tables(sql, &pubs).await?;
    let Some(p) = published
        .iter()
        .find(|t| t.schema == schema && t.table == table)
    else {
        return Ok(None);
    };
    let Some(d) = describe(sql, schema, table, p.columns.as_deref()).await? else {
        return Ok(None);
    };
    let rel = &d.relation;
    let mut primary_key = None;
    let mut keys = keys.clone();
    if keys.needs_lookup(rel) {
        let pk: Vec<String> = sql
            .simple_query(&primary_key_query(rel.oid))
            .await?
            .iter()
            .filter_map(|r| r.get("attname").map(str::to_owned))
            .collect();
        keys.set_primary_key(rel, pk.clone());
        primary_key = Some(pk);
    }
    let key_cols: Vec<String> = key_names(rel, keys.for_relation(rel))
        .into_iter()
        .map(str::to_owned)
        .collect();
    if key_cols.is_empty() {
        return Err(SnapshotError::NoKey {
            schema: schema.into(),
            table: table.into(),
        });
    }
    let key_types: Vec<&str> = key_cols
        .iter()
        .map(|k| {
            rel.columns
                .iter()
                .position(|c| &c.name == k)
                .map(|i| d.type_names[i].as_str())
                .ok_or_else(|| SnapshotError::NoKey {
                    schema: schema.into(),
                    table: table.into(),
                })
        })
        .collect::<Result<_, _>>()?;
    let list: Vec<String> = rel
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .chain(key_cols.iter().map(|k| quote_ident(k)))
        .collect();
    let key_list: Vec<String> = key_cols.iter().map(|k| quote_ident(k)).collect();
    key_pages_through(sql, rel.oid, &key_cols, schema, table).await?;
    // a cursor of another table under this name, or of another key, says
    // nothing of this one: read it from its start
    let same_table = position.oid.is_none_or(|o| o == rel.oid);
    let same_key = position.key_columns.as_ref().is_none_or(|k| *k == key_cols)
        && position
            .after
            .as_ref()
            .is_none_or(|a| a.len() == key_cols.len());
    let mut position = position.clone();
    if !(same_table && same_key) {
        tracing::warn!(
            table = %name,
            key = %key_cols.join(", "),
            "the table was created again or its key changed since the snapshot's last chunk; reading it again from its start"
        );
        position = TablePosition::default();
    }
    let cast = |values: &[String]| -> String {
        values
            .iter()
            .zip(&key_types)
            .map(|(v, t)| format!("{}::{t}", quote_literal(v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let from = format!(
        "{}{}.{}",
        if d.partitioned { "" } else { "ONLY " },
        quote_ident(schema),
        quote_ident(table),
    );
    let filter = p.row_filter.clone();
    let where_clause = |conditions: &[String]| {
        if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        }
    };
    if position.after.is_none() {
        // the table's first chunk: its largest key now bounds the snapshot
        let q = format!(
            "SELECT {} FROM {from}{} ORDER BY {} LIMIT 1",
            key_list.join(", "),
            where_clause(filter.as_slice()),
            key_list
                .iter()
                .map(|k| format!("{k} DESC"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        position.until = sql.simple_query(&q).await?.first().map(|r| {
            (0..key_cols.len())
                .map(|i| r.get_index(i).unwrap_or_default().to_owned())
                .collect()
        });
    }
    let mut conditions: Vec<String> = filter.into_iter().collect();
    if let Some(after) = &position.after {
        conditions.push(format!("({}) > ({})", key_list.join(", "), cast(after)));
    }
    if let Some(until) = &position.until {
        conditions.push(format!("({}) <= ({})", key_list.join(", "), cast(until)));
    }
    let query = format!(
        "SELECT {} FROM {from}{} ORDER BY {} LIMIT {limit}",
        list.join(", "),
        where_clause(&conditions),
        key_list.join(", "),
    );
    let result = sql.simple_query(&query).await?;
    let n = rel.columns.len();
    let mut rows = Vec::with_capacity(result.len());
    let mut index = HashMap::with_capacity(result.len());
    let mut last_key = None;
    let mut bytes = 0;
    let mut cut_by_bytes = false;
    for r in &result {
        let values: Vec<ColumnValue> = (0..n)
            .map(|i| match r.get_index(i) {
                Some(v) => ColumnValue::Text(Bytes::copy_from_slice(v.as_bytes())),
                None => ColumnValue::Null,
            })
            .collect();
        let size: usize = (0..n).map(|i| r.get_index(i).map_or(0, str::len)).sum();
        if !rows.is_empty() && bytes + size > limits.bytes {
            cut_by_bytes = true;
            break;
        }
        bytes += size;
        let row = Row::new(rel.clone(), TupleData(values));
        let key: Option<Vec<String>> = (n..n + key_cols.len())
            .map(|i| r.get_index(i).map(str::to_owned))
            .collect();
        let key =
            key.ok_or_else(|| bad(format!("a NULL in key columns {}", key_cols.join(", "))))?;
        let k = row_key(&row, &keys).ok_or_else(|| {
            bad(format!(
                "a row without its key columns {}",
                key_cols.join(", ")
            ))
        })?;
        if index.insert(k, rows.len()).is_some() {
            return Err(bad(format!(
                "two rows with the same key ({}): the key columns must be unique",
                key.join(", ")
            )));
        }
        rows.push(Some(row));
        last_key = Some(key);
    }
    let table_done = !cut_by_bytes
        && (result.len() < limit || (last_key.is_some() && last_key == position.until));
    let position = TablePosition {
        after: last_key.or(position.after),
        key_columns: Some(key_cols),
        until: position.until,
        oid: Some(rel.oid),
    };
    let id = watermark_id();
    if high.is_none() {
        sql.simple_query(&format!(
            "SELECT pg_catalog.pg_logical_emit_message(true, {}, {})",
            quote_literal(WATERMARK_PREFIX),
            quote_literal(&id)
        ))
        .await?;
    }
    Ok(Some(Chunk {
        id,
        high,
        relation: d.relation,
        table_done,
        cut_by_bytes,
        rows,
        index,
        position,
        abandoned: false,
        in_progress,
        xmax,
        held,
        prepared,
        primary_key,
    }))
}

/// Refuses key columns that cannot page through the table: they must be
/// NOT NULL and hold every key column of a valid unique index that is not
/// partial and has no expressions (a primary key or a replica identity
/// index always does). Keyset paging over anything else skips rows whose
/// key repeats across a chunk's end, or that have a NULL in it.
async fn key_pages_through(
    sql: &mut ReplicationClient,
    oid: u32,
    key_cols: &[String],
    schema: &str,
    table: &str,
) -> Result<(), SnapshotError> {
    let names = format!(
        "ARRAY[{}]::pg_catalog.name[]",
        key_cols
            .iter()
            .map(|k| quote_literal(k))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let r = sql
        .simple_query(&format!(
            "SELECT (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute a \
                     WHERE a.attrelid = {oid} AND a.attname = ANY ({names}) \
                       AND a.attnotnull AND NOT a.attisdropped)::text, \
                    EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
                            WHERE i.indrelid = {oid} AND i.indisunique AND i.indisvalid \
                              AND i.indpred IS NULL AND i.indexprs IS NULL \
                              AND NOT EXISTS ( \
                                SELECT 1 FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) \
                                         WITH ORDINALITY k(attnum, n) \
                                JOIN pg_catalog.pg_attribute a \
                                  ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                                WHERE k.n <= i.indnkeyatts \
                                  AND a.attname <> ALL ({names})))::text"
        ))
        .await?;
    let not_null = r
        .first()
        .and_then(|r| r.get_index(0))
        .and_then(|n| n.parse::<usize>().ok());
    let unique = r.first().and_then(|r| r.get_index(1)) == Some("true");
    if not_null == Some(key_cols.len()) && unique {
        return Ok(());
    }
    Err(SnapshotError::KeyNotUnique {
        schema: schema.into(),
        table: table.into(),
        columns: key_cols.to_vec(),
    })
}

/// The end of a read-only chunk's window for a WAL position `lsn` read
/// after its snapshot: every commit the snapshot sees ends at or before
/// it. At a page's start the insert position is reported past the page
/// header, where no record ends; the stream, which reports the end of
/// the last record it sent, could then wait for the next record to pass
/// it. The page's start serves instead: no record starts or ends inside
/// a header.
fn window_end(lsn: Lsn, block: u64) -> Lsn {
    // the long header of a segment's first page is the larger
    const LONG_PAGE_HEADER: u64 = 40;
    let offset = lsn.0 % block.max(1);
    if offset != 0 && offset <= LONG_PAGE_HEADER {
        Lsn(lsn.0 - offset)
    } else {
        lsn
    }
}

/// The table's description as pgoutput's Relation message would give it:
/// the published columns in order, the replica identity's flagged.
async fn describe(
    sql: &mut ReplicationClient,
    schema: &str,
    table: &str,
    published: Option<&[String]>,
) -> Result<Option<Described>, SnapshotError> {
    let rel = sql
        .simple_query(&format!(
            "SELECT c.oid, c.relreplident, c.relkind = 'p' FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = {} AND c.relname = {}",
            quote_literal(schema),
            quote_literal(table)
        ))
        .await?;
    let Some(r) = rel.first() else {
        return Ok(None);
    };
    let bad = |what: &str| SnapshotError::BadResult {
        table: format!("{schema}.{table}"),
        what: what.into(),
    };
    let oid: u32 = r
        .get_index(0)
        .and_then(|o| o.parse().ok())
        .ok_or_else(|| bad("pg_class.oid"))?;
    let identity = match r.get_index(1) {
        Some("d") => ReplicaIdentity::Default,
        Some("f") => ReplicaIdentity::Full,
        Some("i") => ReplicaIdentity::Index,
        Some("n") => ReplicaIdentity::Nothing,
        _ => return Err(bad("pg_class.relreplident")),
    };
    let partitioned = r.get_index(2) == Some("t");
    let columns_filter = match published {
        Some(cols) => format!(
            "a.attname = ANY (ARRAY[{}]::text[])",
            cols.iter()
                .map(|c| quote_literal(c))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "a.attgenerated = ''".into(),
    };
    let cols = sql
        .simple_query(&format!(
            "SELECT a.attname, a.atttypid, a.atttypmod, \
                    pg_catalog.format_type(a.atttypid, NULL), \
                    c.relreplident = 'f' OR EXISTS (SELECT FROM pg_catalog.pg_index i \
                        WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey) \
                        AND CASE c.relreplident WHEN 'd' THEN i.indisprimary \
                                 WHEN 'i' THEN i.indisreplident ELSE false END) \
             FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             WHERE c.oid = {oid} AND a.attnum > 0 AND NOT a.attisdropped AND {columns_filter} \
             ORDER BY a.attnum"
        ))
        .await?;
    let mut columns = Vec::with_capacity(cols.len());
    let mut type_names = Vec::with_capacity(cols.len());
    for c in &cols {
        let parse = |i: usize, what: &str| -> Result<i64, SnapshotError> {
            c.get_index(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(what))
        };
        columns.push(RelationColumn {
            flags: u8::from(c.get_index(4) == Some("t")),
            name: c.get_index(0).ok_or_else(|| bad("attname"))?.to_owned(),
            type_oid: parse(1, "atttypid")? as u32,
            type_modifier: parse(2, "atttypmod")? as i32,
        });
        type_names.push(c.get_index(3).ok_or_else(|| bad("format_type"))?.to_owned());
    }
    Ok(Some(Described {
        relation: Arc::new(Relation {
            xid: None,
            oid,
            namespace: schema.to_owned(),
            name: table.to_owned(),
            replica_identity: identity,
            columns,
        }),
        type_names,
        partitioned,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_end_moves_off_a_page_header() {
        let b = 8192;
        // inside a page: as read
        assert_eq!(window_end(Lsn(0x1_2345), b), Lsn(0x1_2345));
        assert_eq!(window_end(Lsn(3 * b + 48), b), Lsn(3 * b + 48));
        // just past a page's header (short, or a segment's long one)
        assert_eq!(window_end(Lsn(3 * b + 24), b), Lsn(3 * b));
        assert_eq!(window_end(Lsn(0x100_0000 + 40), b), Lsn(0x100_0000));
        // a page's start itself
        assert_eq!(window_end(Lsn(5 * b), b), Lsn(5 * b));
        // other block sizes
        assert_eq!(window_end(Lsn(2 * 32768 + 24), 32768), Lsn(2 * 32768));
    }

    #[test]
    fn cursor_names_and_queue() {
        let mut c = SnapshotCursor::new(vec!["public.a".into(), "b".into(), "s.c.d".into()]);
        assert_eq!(
            c.tables,
            vec![
                ("public".into(), "a".into()),
                ("public".into(), "b".into()),
                ("s".into(), "c.d".into())
            ]
        );
        c.add([("public".into(), "b".into()), ("x".into(), "y".into())]);
        assert_eq!(c.tables.len(), 4);
    }

    #[test]
    fn cursors_of_earlier_versions_still_read() {
        // written before the key columns, the bound and the OID were kept
        let old: SnapshotCursor =
            serde_json::from_str(r#"{"tables":[["public","t"]],"after":["5"],"rows":3}"#).unwrap();
        assert_eq!(old.position.after, Some(vec!["5".to_owned()]));
        assert_eq!(old.position.until, None);
        assert_eq!(old.position.key_columns, None);
        assert_eq!(old.position.oid, None);
        // a fresh cursor writes what earlier versions read
        let fresh = serde_json::to_string(&SnapshotCursor::new(vec!["t".into()])).unwrap();
        assert_eq!(
            fresh,
            r#"{"tables":[["public","t"]],"after":null,"rows":0}"#
        );
        let mut c = SnapshotCursor::new(vec!["t".into()]);
        c.position = TablePosition {
            after: Some(vec!["1".into(), "a".into()]),
            key_columns: Some(vec!["id".into(), "k".into()]),
            until: Some(vec!["9".into(), "z".into()]),
            oid: Some(16384),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<SnapshotCursor>(&text).unwrap(), c);
    }

    #[test]
    fn what_a_snapshot_does_not_see() {
        let ip: HashSet<u32> = [90].into_iter().collect();
        assert!(invisible(&ip, 100, 90));
        assert!(!invisible(&ip, 100, 91));
        // at and past xmax: not listed, not seen
        assert!(invisible(&ip, 100, 100));
        assert!(invisible(&ip, 100, 150));
        // across the wraparound
        assert!(invisible(&ip, u32::MAX - 5, 3));
        assert!(!invisible(&ip, 3, u32::MAX - 5));
    }

    #[test]
    fn signals() {
        let s = parse_signal(br#"{"tables": ["public.t"]}"#).unwrap();
        assert_eq!(s.tables, vec!["public.t".to_owned()]);
        assert_eq!(s.slot, None);
        let s = parse_signal(br#"{"tables": ["public.t"], "slot": "k"}"#).unwrap();
        assert_eq!(s.slot.as_deref(), Some("k"));
        assert!(parse_signal(b"public.t").is_err());
    }
}
