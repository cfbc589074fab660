//! What the publications publish of each table, as the initial copy must
//! copy it.

use crate::client::ReplicationClient;
use crate::error::{Error, Result};

/// A table as the publications publish it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishedTable {
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub table: String,
    /// The published columns, when a publication lists them (15+).
    pub columns: Option<Vec<String>>,
    /// The rows published: the publications' filters OR-ed, parenthesized
    /// (15+).
    pub row_filter: Option<String>,
    /// A partitioned table (published via its root).
    pub partitioned: bool,
}

/// What the publications publish of each table, combined as the server's
/// own table synchronization does: a table in several publications gets
/// the union of their column lists (all columns if one has none) and the
/// OR of their row filters (no filter if one has none).
/// `pg_publication_tables` already lists partitions or their root as
/// `publish_via_partition_root` says.
pub(crate) async fn published_tables(
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
