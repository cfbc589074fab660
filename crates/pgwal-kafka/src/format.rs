//! Kafka records for row changes: topic, key (the replica identity) and
//! value, in pgwal's JSON or in Debezium's envelope.

pub mod avro;
mod connect_schema;
mod debezium;
mod temporal;

use pgwal::protocol::pgoutput::{ColumnValue, Relation};
use pgwal::{Event, Row};
use std::collections::HashMap;

use pgwal_protocol::{Lsn, PgTimestamp};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::keys::KeyColumns;
use crate::routing::{Routing, RoutingError};

/// How numeric values are written in the Debezium format, as Debezium's
/// `decimal.handling.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DecimalMode {
    /// Debezium's default: the unscaled value as big-endian two's-complement
    /// bytes in base64 (Kafka Connect's `Decimal`); a `numeric` without a
    /// declared scale as `{"scale": s, "value": base64}`
    /// (`VariableScaleDecimal`). `NaN` and infinities become null.
    #[default]
    Precise,
    /// The exact decimal text.
    String,
    /// A JSON number (f64; may round).
    Double,
}

/// The value format.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// pgwal's own JSON: the change as `pgwal stream` prints it, values as
    /// the server's text, plus the transaction's `xid`, `commit_lsn` and
    /// `commit_time` (its end position is in the progress topic: a record
    /// is written as its change arrives, before the commit's end is known).
    Pgwal,
    /// The envelope of Debezium's PostgreSQL connector, as its JSON
    /// converter writes it: `before`, `after`, `source`, `op`, `ts_ms`
    /// (`schemas.enable=false`), or each key and value as `{"schema",
    /// "payload"}` with `json_schemas`.
    Debezium {
        /// `source.name` (Debezium's `topic.prefix`).
        server_name: String,
        /// `source.db`.
        database: String,
        /// Numeric values.
        decimal: DecimalMode,
        /// A record with a null value after each delete (for log compaction).
        tombstones: bool,
        /// The transaction block (`id`, `total_order`,
        /// `data_collection_order`), Debezium's
        /// `provide.transaction.metadata`; off: `"transaction": null`, as
        /// Debezium's default (the block makes each record about 80 bytes
        /// larger).
        transaction_metadata: bool,
        /// Each key and value with its Kafka Connect schema (the JSON
        /// converter's `schemas.enable=true`), built from the table's
        /// Relation message, so it follows schema changes.
        json_schemas: bool,
    },
}

/// The transaction a change belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxInfo {
    /// Its xid.
    pub xid: u32,
    /// Its commit record's position.
    pub commit_lsn: Lsn,
    /// Its commit time.
    pub commit_time: PgTimestamp,
}

impl TxInfo {
    /// A transaction's description.
    pub fn new(xid: u32, commit_lsn: Lsn, commit_time: PgTimestamp) -> TxInfo {
        TxInfo {
            xid,
            commit_lsn,
            commit_time,
        }
    }
}

/// Where each record stands in its transaction, as Debezium's transaction
/// block gives it: `total_order` counts the transaction's records (not
/// tombstones) from 1, `data_collection_order` those of the record's table.
/// One per transaction, made anew at each `Begin`.
#[derive(Debug, Default, Clone)]
pub struct TxOrder {
    total: u64,
    by_table: HashMap<String, HashMap<String, u64>>,
}

impl TxOrder {
    /// An empty count.
    pub fn new() -> TxOrder {
        TxOrder::default()
    }

    /// The orders of the next record, of table `schema.table`.
    pub fn next(&mut self, schema: &str, table: &str) -> (u64, u64) {
        self.total += 1;
        let tables = match self.by_table.get_mut(schema) {
            Some(t) => t,
            None => self.by_table.entry(schema.to_owned()).or_default(),
        };
        let n = match tables.get_mut(table) {
            Some(n) => n,
            None => tables.entry(table.to_owned()).or_default(),
        };
        *n += 1;
        (self.total, *n)
    }
}

/// One Kafka record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The topic.
    pub topic: String,
    /// The key: the replica identity's columns as a JSON object; `None` for
    /// a table without one and for truncates.
    pub key: Option<Vec<u8>>,
    /// The value; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
}

/// A change that cannot be written faithfully.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// No valid topic for the table.
    #[error(transparent)]
    Routing(#[from] RoutingError),
    /// A value that does not decode as its type.
    #[error("{table}.{column}: {source}")]
    Value {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
        /// Why.
        source: Box<pgwal::Error>,
    },
    /// An update whose unchanged TOAST value the server did not send: the
    /// new row is incomplete, and a placeholder would be written into every
    /// destination. Use `REPLICA IDENTITY FULL` on the table; a library
    /// user may also fill such values from an earlier image of the row
    /// (`StreamConfig::toast_cache_rows`), which the CLI does not offer.
    #[error(
        "{table}.{column}: unchanged TOAST value not sent by the server; set REPLICA IDENTITY FULL \
         on the table, rather than write a placeholder"
    )]
    UnchangedToast {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
    },
    /// A configured key column the table does not publish.
    #[error("{table}: key column {column:?} is not among the table's published columns")]
    KeyColumn {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
    },
}

fn qualified(r: &Relation) -> String {
    format!("{}.{}", r.namespace, r.name)
}

/// The key columns of `row` as a JSON object (text values for
/// [`Format::Pgwal`], Debezium's types otherwise): `columns` if given (see
/// [`KeyColumns::for_relation`]), else the replica identity the Relation
/// message marks; `None` when there are none or one of them is missing.
pub(crate) fn key_object(
    format: &Format,
    row: &Row,
    columns: Option<&[String]>,
) -> Result<Option<Value>, FormatError> {
    let rel = row.relation();
    let mut m = Map::new();
    for name in key_names(rel, columns) {
        let Some((col, v)) = row.iter().find(|(c, _)| c.name == name) else {
            return Err(FormatError::KeyColumn {
                table: qualified(rel),
                column: name.to_owned(),
            });
        };
        if matches!(v, ColumnValue::Null | ColumnValue::UnchangedToast) {
            return Ok(None);
        }
        m.insert(col.name.clone(), column_value(format, rel, col, v)?);
    }
    Ok((!m.is_empty()).then_some(Value::Object(m)))
}

fn column_value(
    format: &Format,
    rel: &Relation,
    col: &pgwal::protocol::pgoutput::RelationColumn,
    v: &ColumnValue,
) -> Result<Value, FormatError> {
    match format {
        Format::Pgwal => Ok(match v {
            ColumnValue::Null => Value::Null,
            ColumnValue::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
            ColumnValue::UnchangedToast => {
                return Err(FormatError::UnchangedToast {
                    table: qualified(rel),
                    column: col.name.clone(),
                })
            }
            // binary mode: the bytes in hex, as `pgwal stream` prints them
            ColumnValue::Binary(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                Value::String(format!("\\x{hex}"))
            }
            _ => Value::Null,
        }),
        Format::Debezium { decimal, .. } => {
            if matches!(v, ColumnValue::UnchangedToast) {
                return Err(FormatError::UnchangedToast {
                    table: qualified(rel),
                    column: col.name.clone(),
                });
            }
            debezium::value(col, v, *decimal).map_err(|source| FormatError::Value {
                table: qualified(rel),
                column: col.name.clone(),
                source: Box::new(source),
            })
        }
    }
}

fn row_object(format: &Format, row: &Row) -> Result<Value, FormatError> {
    let mut m = Map::new();
    for (col, v) in row.iter() {
        m.insert(
            col.name.clone(),
            column_value(format, row.relation(), col, v)?,
        );
    }
    Ok(Value::Object(m))
}

/// The names of a table's key columns: `columns` if given, else the
/// replica identity the Relation message marks.
pub(crate) fn key_names<'a>(rel: &'a Relation, columns: Option<&'a [String]>) -> Vec<&'a str> {
    match columns {
        Some(names) => names.iter().map(String::as_str).collect(),
        None => rel
            .columns
            .iter()
            .filter(|c| c.is_key())
            .map(|c| c.name.as_str())
            .collect(),
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a JSON value serializes")
}

/// The records for one event of a transaction: one per row change (a
/// Debezium update that changes the key gives a delete of the old key, its
/// tombstone if asked for, and a create of the new one), one per table of a
/// truncate, none for other events. `keys` says which columns key a
/// table's records where that is not the marked replica identity (FULL
/// tables; see [`KeyColumns`]). `now` becomes Debezium's top-level `ts_ms`.
///
/// ```
/// use pgwal_kafka::{encode, Format, KeyColumns, Routing, TxInfo, TxOrder};
/// # fn f(event: &pgwal::Event) -> Result<(), Box<dyn std::error::Error>> {
/// let routing = Routing::new("app", "{prefix}.{schema}.{table}")?;
/// let keys = KeyColumns::new();
/// let tx = TxInfo::new(740, "0/16B3748".parse()?, pgwal::protocol::PgTimestamp::now());
/// // one per transaction: where each record stands in it
/// let mut order = TxOrder::new();
/// for r in encode(&Format::Pgwal, &routing, &keys, &tx, &mut order, event, pgwal::protocol::PgTimestamp::now())? {
///     println!("{} {:?}", r.topic, r.value.map(String::from_utf8));
/// }
/// # Ok(()) }
/// ```
pub fn encode(
    format: &Format,
    routing: &Routing,
    keys: &KeyColumns,
    tx: &TxInfo,
    order: &mut TxOrder,
    event: &Event,
    now: PgTimestamp,
) -> Result<Vec<Record>, FormatError> {
    encode_event(format, routing, keys, tx, order, event, now, false)
}

/// The record for a row a snapshot read (see [`crate::snapshot`]): Debezium's
/// `op: r` with `source.snapshot` `"incremental"`, or pgwal's `"type":
/// "snapshot"`. `tx` and `lsn` are the transaction and position of the
/// chunk's watermark, where the row stands in the stream.
pub fn encode_read(
    format: &Format,
    routing: &Routing,
    keys: &KeyColumns,
    tx: &TxInfo,
    lsn: Lsn,
    row: &Row,
    now: PgTimestamp,
) -> Result<Vec<Record>, FormatError> {
    let event = Event::Insert(pgwal::Change::insert(lsn, row.clone()));
    encode_event(
        format,
        routing,
        keys,
        tx,
        &mut TxOrder::new(),
        &event,
        now,
        true,
    )
}

/// [`encode`]; `read`: an insert event that is a snapshot's row.
#[allow(clippy::too_many_arguments)]
fn encode_event(
    format: &Format,
    routing: &Routing,
    keys: &KeyColumns,
    tx: &TxInfo,
    order: &mut TxOrder,
    event: &Event,
    now: PgTimestamp,
    read: bool,
) -> Result<Vec<Record>, FormatError> {
    let (op, change) = match event {
        Event::Insert(c) => ("c", c),
        Event::Update(c) => ("u", c),
        Event::Delete(c) => ("d", c),
        Event::Truncate(t) => {
            return t
                .relations
                .iter()
                .map(|r| {
                    let value = match format {
                        Format::Pgwal => {
                            bytes(&pgwal_envelope("truncate", r, tx, t.lsn, None, None, None))
                        }
                        Format::Debezium {
                            server_name,
                            database,
                            decimal,
                            transaction_metadata,
                            json_schemas,
                            ..
                        } => {
                            let v = debezium::envelope(
                                (server_name, database),
                                "t",
                                r,
                                tx,
                                (
                                    t.lsn,
                                    transaction_metadata.then(|| order.next(&r.namespace, &r.name)),
                                ),
                                Value::Null,
                                Value::Null,
                                now,
                            );
                            if *json_schemas {
                                let names = key_names(r, keys.for_relation(r));
                                let schemas =
                                    connect_schema::table_schemas(server_name, r, &names, *decimal);
                                connect_schema::with_schema(&schemas.envelope, &v)
                            } else {
                                bytes(&v)
                            }
                        }
                    };
                    Ok(Record {
                        topic: routing.topic(&r.namespace, &r.name)?,
                        key: None,
                        value: Some(value),
                    })
                })
                .collect();
        }
        _ => return Ok(Vec::new()),
    };
    let rel = &change.relation;
    let topic = routing.topic(&rel.namespace, &rel.name)?;
    let key_columns = keys.for_relation(rel);
    let new_key = change
        .new
        .as_ref()
        .map(|r| key_object(format, r, key_columns))
        .transpose()?
        .flatten();
    let old_key = change
        .old
        .as_ref()
        .map(|r| key_object(format, r, key_columns))
        .transpose()?
        .flatten();
    let key = if op == "d" {
        old_key.clone()
    } else {
        new_key.clone()
    };
    let before = change
        .old
        .as_ref()
        .map(|r| row_object(format, r))
        .transpose()?;
    let after = change
        .new
        .as_ref()
        .map(|r| row_object(format, r))
        .transpose()?;
    let tombstones = matches!(
        format,
        Format::Debezium {
            tombstones: true,
            ..
        }
    );
    // With json_schemas: the envelope's schema, and the key's.
    let schemas = match format {
        Format::Debezium {
            server_name,
            decimal,
            json_schemas: true,
            ..
        } => {
            let s = connect_schema::table_schemas(
                server_name,
                rel,
                &key_names(rel, key_columns),
                *decimal,
            );
            if let (Err(column), true) = (&s.key, new_key.is_some() || old_key.is_some()) {
                return Err(FormatError::KeyColumn {
                    table: qualified(rel),
                    column: column.clone(),
                });
            }
            Some(s)
        }
        _ => None,
    };
    let key_bytes = |key: &Option<Value>| {
        key.as_ref().map(|k| match schemas.as_deref() {
            Some(connect_schema::TableSchemas {
                key: Ok(schema), ..
            }) => connect_schema::with_schema(schema, k),
            _ => bytes(k),
        })
    };
    let mut out = Vec::new();
    let mut record =
        |op: &str, key: &Option<Value>, before: Option<Value>, after: Option<Value>| {
            let value = match format {
                Format::Pgwal => pgwal_envelope(
                    match op {
                        "c" if read => "snapshot",
                        "c" => "insert",
                        "u" => "update",
                        _ => "delete",
                    },
                    rel,
                    tx,
                    change.lsn,
                    key.clone(),
                    before.filter(|_| !change.old_is_key),
                    after,
                ),
                Format::Debezium {
                    server_name,
                    database,
                    ..
                } if read => {
                    let mut v = debezium::envelope(
                        (server_name, database),
                        "r",
                        rel,
                        tx,
                        (change.lsn, None),
                        Value::Null,
                        after.unwrap_or(Value::Null),
                        now,
                    );
                    v["source"]["snapshot"] = json!("incremental");
                    v
                }
                Format::Debezium {
                    server_name,
                    database,
                    transaction_metadata,
                    ..
                } => debezium::envelope(
                    (server_name, database),
                    op,
                    rel,
                    tx,
                    (
                        change.lsn,
                        transaction_metadata.then(|| order.next(&rel.namespace, &rel.name)),
                    ),
                    before.unwrap_or(Value::Null),
                    after.unwrap_or(Value::Null),
                    now,
                ),
            };
            let value = match &schemas {
                Some(s) => connect_schema::with_schema(&s.envelope, &value),
                None => bytes(&value),
            };
            Record {
                topic: topic.clone(),
                key: key_bytes(key),
                value: Some(value),
            }
        };
    let key_changed = op == "u" && old_key.is_some() && old_key != new_key;
    if key_changed && matches!(format, Format::Debezium { .. }) {
        // Debezium: a key change is a delete of the old key and a create
        out.push(record("d", &old_key, before, None));
        if tombstones {
            out.push(Record {
                topic: topic.clone(),
                key: key_bytes(&old_key),
                value: None,
            });
        }
        out.push(record("c", &new_key, None, after));
        return Ok(out);
    }
    out.push(record(op, &key, before, after));
    if op == "d" && tombstones && key.is_some() {
        out.push(Record {
            topic,
            key: key_bytes(&key),
            value: None,
        });
    }
    Ok(out)
}

/// pgwal's JSON: the change as `pgwal stream` prints it, with its transaction.
fn pgwal_envelope(
    kind: &str,
    rel: &Relation,
    tx: &TxInfo,
    lsn: Lsn,
    key: Option<Value>,
    old: Option<Value>,
    new: Option<Value>,
) -> Value {
    let mut o = json!({
        "type": kind,
        "schema": rel.namespace,
        "table": rel.name,
        "lsn": lsn.to_string(),
        "xid": tx.xid,
        "commit_lsn": tx.commit_lsn.to_string(),
        "commit_time": tx.commit_time.to_iso8601(),
    });
    if let Some(k) = key {
        o["key"] = k;
    }
    if let Some(v) = old {
        o["old"] = v;
    }
    if let Some(v) = new {
        o["new"] = v;
    }
    o
}

/// Writes a transaction's commit fields into a record value encoded before
/// its commit was known (a streamed transaction's changes arrive first):
/// pgwal's `xid`, `commit_lsn` and `commit_time`; Debezium's `source.txId`,
/// `source.ts_ms`, `source.sequence` and transaction block, its orders
/// counted again by `order` (records of aborted subtransactions were
/// dropped since they were encoded). The value must be one that [`encode`]
/// wrote for `format`; stamp a transaction's records in their order.
pub fn stamp(
    format: &Format,
    value: &[u8],
    tx: &TxInfo,
    order: &mut TxOrder,
) -> Result<Vec<u8>, serde_json::Error> {
    if let Format::Debezium {
        transaction_metadata,
        json_schemas: true,
        ..
    } = format
    {
        // the schema as it is, the payload stamped
        let parts: HashMap<&str, &RawValue> = serde_json::from_slice(value)?;
        let (Some(schema), Some(payload)) = (parts.get("schema"), parts.get("payload")) else {
            return Err(serde::de::Error::custom(
                "a value without its schema and payload",
            ));
        };
        let mut payload: Value = serde_json::from_str(payload.get())?;
        debezium::stamp(&mut payload, tx, transaction_metadata.then_some(order));
        return Ok(connect_schema::with_schema(schema.get(), &payload));
    }
    let mut v: Value = serde_json::from_slice(value)?;
    match format {
        Format::Pgwal => {
            v["xid"] = json!(tx.xid);
            v["commit_lsn"] = json!(tx.commit_lsn.to_string());
            v["commit_time"] = json!(tx.commit_time.to_iso8601());
        }
        Format::Debezium {
            transaction_metadata,
            ..
        } => debezium::stamp(&mut v, tx, transaction_metadata.then_some(order)),
    }
    serde_json::to_vec(&v)
}
