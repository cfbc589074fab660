//! Initial snapshot: a consistent copy of the published tables, handed off
//! to the stream with no gap and no duplicate.
//!
//! [`initial_copy`] creates the slot with an exported snapshot on a
//! replication connection, imports that snapshot into a `REPEATABLE READ`
//! transaction on a second (SQL) connection, copies every table of the
//! publications with `COPY ... TO STDOUT`, and returns the slot's consistent
//! point. Every change committed before that point is in the copy; every
//! change after it is streamed by a [`LogicalStream`](crate::LogicalStream)
//! on the same slot (which starts exactly there).

use crate::client::ReplicationClient;
use crate::commands::{quote_ident, quote_literal, CreateSlotOptions, SlotSnapshot};
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

/// Decodes one field of COPY's text format.
fn unescape(field: &[u8]) -> Result<Option<String>> {
    if field == b"\\N" {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' || i + 1 == field.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let n = field[i + 1];
        i += 2;
        match n {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(n - b'0');
                let mut k = 0;
                while k < 2 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + u32::from(field[i] - b'0');
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut k = 0;
                while k < 2 && i < field.len() && field[i].is_ascii_hexdigit() {
                    v = v * 16 + (field[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).map(Some).map_err(|_| Error::Column {
        column: "COPY field".into(),
        reason: "not UTF-8".into(),
    })
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
    mut sink: impl FnMut(SnapshotRow<'_>) -> Result<()>,
) -> Result<InitialCopy> {
    let mut repl = ReplicationClient::connect(config).await?;
    let info = repl
        .create_logical_slot(
            slot,
            &CreateSlotOptions::new()
                .two_phase(two_phase)
                .snapshot(SlotSnapshot::Export),
        )
        .await?;
    let snapshot = info
        .snapshot_name
        .clone()
        .ok_or(Error::BadResult("CREATE_REPLICATION_SLOT snapshot"))?;
    let result = async {
        let mut sql = ReplicationClient::connect_sql(config).await?;
        sql.simple_query(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
            quote_literal(&snapshot)
        ))
        .await?;
        let pubs: Vec<String> = publications.iter().map(|p| quote_literal(p)).collect();
        let major = sql.server_major_version().unwrap_or(10);
        let tables = published_tables(&mut sql, &pubs, major).await?;
        let mut copied = InitialCopy {
            consistent_point: info.consistent_point,
            tables: Vec::new(),
            rows: 0,
        };
        for t in &tables {
            let (schema, table) = (t.schema.clone(), t.table.clone());
            let qualified = format!("{}.{}", quote_ident(&schema), quote_ident(&table));
            let columns = match &t.columns {
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
            let cols: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
            // COPY of a table as is where it can; a query where the
            // publication filters rows or the table is a partitioned root
            // (COPY refuses those)
            let copy = match (&t.row_filter, t.partitioned) {
                (None, false) => format!("COPY {qualified} ({}) TO STDOUT", cols.join(", ")),
                (filter, _) => format!(
                    "COPY (SELECT {} FROM {qualified}{}) TO STDOUT",
                    cols.join(", "),
                    filter
                        .as_ref()
                        .map(|f| format!(" WHERE {f}"))
                        .unwrap_or_default()
                ),
            };
            let mut partial: Vec<u8> = Vec::new();
            let mut handle_line = |line: &[u8]| -> Result<()> {
                let values = line
                    .split(|b| *b == b'\t')
                    .map(unescape)
                    .collect::<Result<Vec<_>>>()?;
                sink(SnapshotRow {
                    schema: &schema,
                    table: &table,
                    columns: &columns,
                    values,
                })
            };
            let n = sql
                .copy_out(&copy, |chunk| {
                    partial.extend_from_slice(chunk);
                    while let Some(p) = partial.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = partial.drain(..=p).collect();
                        handle_line(&line[..line.len() - 1])?;
                    }
                    Ok(())
                })
                .await?;
            copied.rows += n;
            copied.tables.push(format!("{schema}.{table}"));
        }
        sql.simple_query("COMMIT").await?;
        Ok::<_, Error>(copied)
    }
    .await;
    match result {
        Ok(c) => Ok(c),
        Err(e) => {
            let _ = repl.drop_slot(slot, false).await;
            Err(e)
        }
    }
}

/// A table as the publications publish it.
struct PublishedTable {
    schema: String,
    table: String,
    /// The published columns, when a publication lists them (15+).
    columns: Option<Vec<String>>,
    /// The rows published: the publications' filters OR-ed (15+).
    row_filter: Option<String>,
    /// A partitioned table (published via its root).
    partitioned: bool,
}

/// What the publications publish of each table, combined as the server's
/// own table synchronization does: a table in several publications gets
/// the union of their column lists (all columns if one has none) and the
/// OR of their row filters (no filter if one has none).
/// `pg_publication_tables` already lists partitions or their root as
/// `publish_via_partition_root` says.
async fn published_tables(
    sql: &mut ReplicationClient,
    pubs: &[String],
    major: u32,
) -> Result<Vec<PublishedTable>> {
    let extra = if major >= 15 {
        "pg_catalog.array_to_json(t.attnames)::text, t.rowfilter"
    } else {
        "NULL::text, NULL::text"
    };
    let rows = sql
        .simple_query(&format!(
            "SELECT t.schemaname, t.tablename, {extra}, c.relkind = 'p' \
             FROM pg_catalog.pg_publication_tables t \
             JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname \
             JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename \
             WHERE t.pubname IN ({}) ORDER BY 1, 2",
            pubs.join(", ")
        ))
        .await?;
    let mut out: Vec<PublishedTable> = Vec::new();
    let mut unfiltered: Vec<bool> = Vec::new();
    for r in &rows {
        let schema = r.get_index(0).unwrap_or_default().to_owned();
        let table = r.get_index(1).unwrap_or_default().to_owned();
        // attnames lists every published column (15+), in column order
        let cols: Option<Vec<String>> = r
            .get_index(2)
            .map(|j| {
                serde_json::from_str(j).map_err(|e| Error::Column {
                    column: "pg_publication_tables.attnames".into(),
                    reason: e.to_string(),
                })
            })
            .transpose()?;
        let filter = r.get_index(3).map(str::to_owned);
        let partitioned = r.get_index(4) == Some("t");
        match out
            .iter()
            .position(|t| t.schema == schema && t.table == table)
        {
            None => {
                out.push(PublishedTable {
                    schema,
                    table,
                    columns: cols,
                    row_filter: filter.as_ref().map(|f| format!("({f})")),
                    partitioned,
                });
                unfiltered.push(filter.is_none());
            }
            Some(i) => {
                let t = &mut out[i];
                if let (Some(have), Some(more)) = (&mut t.columns, cols) {
                    for c in more {
                        if !have.contains(&c) {
                            have.push(c);
                        }
                    }
                }
                match filter {
                    None => unfiltered[i] = true,
                    Some(f) => {
                        if let Some(have) = &mut t.row_filter {
                            have.push_str(&format!(" OR ({f})"));
                        }
                    }
                }
            }
        }
    }
    for (i, t) in out.iter_mut().enumerate() {
        if unfiltered[i] {
            t.row_filter = None;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn copy_text_fields() {
        assert_eq!(unescape(b"\\N").unwrap(), None);
        assert_eq!(
            unescape(b"a\\tb\\\\c\\nd").unwrap().as_deref(),
            Some("a\tb\\c\nd")
        );
        assert_eq!(unescape(b"\\101\\x42").unwrap().as_deref(), Some("AB"));
    }
}
