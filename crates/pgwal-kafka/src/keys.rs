//! Which columns make a record's key.
//!
//! By default the key is the replica identity that pgoutput marks in each
//! Relation message. That is the primary key under `REPLICA IDENTITY
//! DEFAULT` and a chosen unique index under `USING INDEX`. Under `REPLICA
//! IDENTITY FULL`, though, pgoutput marks *every* column. A key made of the
//! whole row changes with every update: each update would be written as a
//! delete plus a create, and the changes of one row would spread over
//! partitions, with no order between them. Tables get FULL identity to send
//! complete old rows, not to change their key.
//!
//! So for a FULL table the sink asks the catalog for the table's primary key
//! ([`primary_key_query`]) and keys by it, as Debezium does. A FULL table
//! without a primary key gets no key (Debezium's behaviour too), unless its
//! key columns are configured. Configured key columns
//! ([`KeyColumns::parse`], Debezium's `message.key.columns` syntax) take
//! precedence over both.

use std::collections::HashMap;

use pgwal::protocol::pgoutput::{Relation, ReplicaIdentity};

/// Key columns by table: configured ones, and the primary keys the sink
/// looked up for FULL tables.
///
/// ```
/// use pgwal_kafka::KeyColumns;
/// let k = KeyColumns::parse("public.orders:id;shop.items:order_id,line").unwrap();
/// assert_eq!(k.configured("shop", "items"), Some(&["order_id".to_string(), "line".into()][..]));
/// assert_eq!(k.configured("public", "other"), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyColumns {
    configured: HashMap<(String, String), Vec<String>>,
    /// Primary keys of FULL tables by relation OID (empty: none).
    looked_up: HashMap<u32, Vec<String>>,
}

/// A key column specification that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyColumnsError {
    /// An entry is not `schema.table:column[,column...]`.
    #[error(
        "key columns {0:?}: expected schema.table:column[,column...] (entries separated by ';')"
    )]
    Syntax(String),
    /// A table given twice.
    #[error("key columns: {0} is given twice")]
    Duplicate(String),
}

impl KeyColumns {
    /// No configured key columns: keys come from the replica identity, and
    /// from the primary key for FULL tables.
    pub fn new() -> KeyColumns {
        KeyColumns::default()
    }

    /// `schema.table:col[,col...]` entries separated by `;` (Debezium's
    /// `message.key.columns`). Names are taken as written (no quoting; a
    /// name with `.`, `:`, `,` or `;` cannot be given here).
    pub fn parse(spec: &str) -> Result<KeyColumns, KeyColumnsError> {
        let mut k = KeyColumns::new();
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || KeyColumnsError::Syntax(entry.to_string());
            let (table, cols) = entry.split_once(':').ok_or_else(bad)?;
            let (schema, name) = table.trim().split_once('.').ok_or_else(bad)?;
            let cols: Vec<String> = cols.split(',').map(|c| c.trim().to_string()).collect();
            if schema.is_empty() || name.is_empty() || cols.iter().any(String::is_empty) {
                return Err(bad());
            }
            if k.configured
                .insert((schema.to_string(), name.to_string()), cols)
                .is_some()
            {
                return Err(KeyColumnsError::Duplicate(format!("{schema}.{name}")));
            }
        }
        Ok(k)
    }

    /// The configured key columns of `schema.table`, if any.
    pub fn configured(&self, schema: &str, table: &str) -> Option<&[String]> {
        self.configured
            .get(&(schema.to_string(), table.to_string()))
            .map(Vec::as_slice)
    }

    /// Whether the sink must look up `rel`'s primary key before encoding its
    /// changes: a FULL table without configured key columns. Asked at every
    /// Relation message, so a key changed by DDL is seen again.
    pub fn needs_lookup(&self, rel: &Relation) -> bool {
        rel.replica_identity == ReplicaIdentity::Full
            && self.configured(&rel.namespace, &rel.name).is_none()
    }

    /// Record `rel`'s primary key columns (empty: it has none).
    pub fn set_primary_key(&mut self, rel: &Relation, columns: Vec<String>) {
        self.looked_up.insert(rel.oid, columns);
    }

    /// The columns that key `rel`'s records, when they are not the replica
    /// identity pgoutput marks: configured ones, else for a FULL table its
    /// primary key as looked up (empty: no key). `None`: the marked
    /// identity.
    pub fn for_relation(&self, rel: &Relation) -> Option<&[String]> {
        if let Some(c) = self.configured(&rel.namespace, &rel.name) {
            return Some(c);
        }
        if rel.replica_identity == ReplicaIdentity::Full {
            return self.looked_up.get(&rel.oid).map(Vec::as_slice);
        }
        None
    }
}

/// The query that lists `oid`'s primary key columns in key order, one per
/// row, in a column named `attname`; no rows if it has none.
pub fn primary_key_query(oid: u32) -> String {
    format!(
        "SELECT a.attname FROM pg_catalog.pg_index i \
         JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
         WHERE i.indrelid = {oid} AND i.indisprimary \
         ORDER BY array_position(i.indkey::int2[], a.attnum)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_debezium_syntax_and_refuses_the_rest() {
        let k = KeyColumns::parse(" public.a : x ; s.b:y, z;").unwrap();
        assert_eq!(k.configured("public", "a"), Some(&["x".to_string()][..]));
        assert_eq!(
            k.configured("s", "b"),
            Some(&["y".to_string(), "z".into()][..])
        );
        assert_eq!(KeyColumns::parse("").unwrap(), KeyColumns::new());
        for bad in [
            "a:x",
            "public.a",
            "public.a:",
            "public.a:x,,y",
            ".a:x",
            "s.:x",
        ] {
            assert!(
                matches!(KeyColumns::parse(bad), Err(KeyColumnsError::Syntax(_))),
                "{bad}"
            );
        }
        assert_eq!(
            KeyColumns::parse("s.a:x;s.a:y"),
            Err(KeyColumnsError::Duplicate("s.a".into()))
        );
    }

    fn relation(oid: u32, identity: ReplicaIdentity) -> Relation {
        Relation {
            xid: None,
            oid,
            namespace: "public".into(),
            name: format!("t{oid}"),
            replica_identity: identity,
            columns: Vec::new(),
        }
    }

    #[test]
    fn configured_beats_looked_up_beats_the_marked_identity() {
        let mut k = KeyColumns::parse("public.t1:a").unwrap();
        let (t1, t2, t3) = (
            relation(1, ReplicaIdentity::Full),
            relation(2, ReplicaIdentity::Full),
            relation(3, ReplicaIdentity::Default),
        );
        assert!(!k.needs_lookup(&t1) && k.needs_lookup(&t2) && !k.needs_lookup(&t3));
        assert_eq!(k.for_relation(&t1), Some(&["a".to_string()][..]));
        // not looked up yet: the marked identity (the sink looks up first)
        assert_eq!(k.for_relation(&t2), None);
        k.set_primary_key(&t2, vec!["id".into()]);
        assert_eq!(k.for_relation(&t2), Some(&["id".to_string()][..]));
        // a FULL table without a primary key: no key columns, so no key
        k.set_primary_key(&t2, Vec::new());
        assert_eq!(k.for_relation(&t2), Some(&[][..]));
        // a lookup recorded for a table that is no longer FULL is not used
        k.set_primary_key(&t3, vec!["x".into()]);
        assert_eq!(k.for_relation(&t3), None);
    }

    #[test]
    fn primary_key_query_orders_by_key_position() {
        let q = primary_key_query(16384);
        assert!(q.contains("i.indrelid = 16384") && q.contains("indisprimary"));
        assert!(q.contains("array_position"));
    }
}
