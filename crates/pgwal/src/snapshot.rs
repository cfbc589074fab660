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
        let tables = sql
            .simple_query(&format!(
                "SELECT DISTINCT schemaname, tablename FROM pg_catalog.pg_publication_tables \
                 WHERE pubname IN ({}) ORDER BY 1, 2",
                pubs.join(", ")
            ))
            .await?;
        let mut copied = InitialCopy {
            consistent_point: info.consistent_point,
            tables: Vec::new(),
            rows: 0,
        };
        for t in &tables {
            let (schema, table) = (
                t.get_index(0).unwrap_or_default().to_owned(),
                t.get_index(1).unwrap_or_default().to_owned(),
            );
            let qualified = format!("{}.{}", quote_ident(&schema), quote_ident(&table));
            let columns: Vec<String> = sql
                .simple_query(&format!(
                    "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = {}::regclass \
                     AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                    quote_literal(&qualified)
                ))
                .await?
                .iter()
                .map(|r| r.get_index(0).unwrap_or_default().to_owned())
                .collect();
            let cols: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
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
                .copy_out(
                    &format!("COPY {qualified} ({}) TO STDOUT", cols.join(", ")),
                    |chunk| {
                        partial.extend_from_slice(chunk);
                        while let Some(p) = partial.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = partial.drain(..=p).collect();
                            handle_line(&line[..line.len() - 1])?;
                        }
                        Ok(())
                    },
                )
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
