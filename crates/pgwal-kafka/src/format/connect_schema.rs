//! Kafka Connect schemas for Debezium's envelope, as its JSON converter
//! writes them with `schemas.enable=true`: each key and value is
//! `{"schema": ..., "payload": ...}`, the schema describing exactly the
//! payload's fields and their types.
//!
//! A table's schema is built from its Relation message, so it follows the
//! table as columns are added, dropped, renamed or change type: the server
//! sends a new Relation message before the first change that uses the new
//! shape (also inside a streamed transaction).
//!
//! Column types are Debezium's (PostgreSQL connector, default
//! `time.precision.mode=adaptive`), matching the values [`super::debezium`]
//! writes:
//!
//! | PostgreSQL | Connect type | name |
//! |---|---|---|
//! | bool | boolean | |
//! | int2, int4, int8 | int16, int32, int64 | |
//! | oid, xid, cid, xid8 | int64 | |
//! | float4, float8 | float, double | |
//! | numeric(p, s) | bytes | `org.apache.kafka.connect.data.Decimal` (precise) |
//! | numeric | struct | `io.debezium.data.VariableScaleDecimal` (precise) |
//! | bytea | bytes | |
//! | json, jsonb | string | `io.debezium.data.Json` |
//! | uuid | string | `io.debezium.data.Uuid` |
//! | xml | string | `io.debezium.data.Xml` |
//! | date | int32 | `io.debezium.time.Date` |
//! | time(p ≤ 3), time | int32, int64 | `io.debezium.time.Time`, `MicroTime` |
//! | timetz | string | `io.debezium.time.ZonedTime` |
//! | timestamp(p ≤ 3), timestamp | int64 | `io.debezium.time.Timestamp`, `MicroTimestamp` |
//! | timestamptz | string | `io.debezium.time.ZonedTimestamp` |
//! | interval | int64 | `io.debezium.time.MicroDuration` |
//! | arrays | array of the element's schema | |
//! | others | string (the server's text) | |
//!
//! Differences from Debezium, because pgoutput does not carry them: every
//! value column is optional (the Relation message has no `NOT NULL`), and
//! no field has a `default`. Key columns are required.

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use pgwal::protocol::pgoutput::{Relation, RelationColumn};
use pgwal::types::oid;
use serde_json::{json, Value};

use super::DecimalMode;

/// A key or value with its schema, as the JSON converter writes it.
pub(super) fn with_schema(schema: &str, payload: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(schema.len() + 256);
    out.extend_from_slice(b"{\"schema\":");
    out.extend_from_slice(schema.as_bytes());
    out.extend_from_slice(b",\"payload\":");
    serde_json::to_writer(&mut out, payload).expect("a JSON value serializes");
    out.push(b'}');
    out
}

/// The serialized schemas of a table's records.
#[derive(Debug)]
pub(super) struct TableSchemas {
    /// The envelope's.
    pub envelope: String,
    /// The key's; or the key column the table does not publish.
    pub key: Result<String, String>,
}

/// What the schemas were made from: the relation without the xid of a
/// streamed transaction, the key columns and the options.
#[derive(Debug, PartialEq, Eq)]
struct Made {
    server_name: String,
    decimal: DecimalMode,
    key_names: Vec<String>,
    relation: Relation,
}

impl Made {
    fn is_for(
        &self,
        server_name: &str,
        rel: &Relation,
        key_names: &[&str],
        decimal: DecimalMode,
    ) -> bool {
        self.server_name == server_name
            && self.decimal == decimal
            && self
                .key_names
                .iter()
                .map(String::as_str)
                .eq(key_names.iter().copied())
            && self.relation.oid == rel.oid
            && self.relation.namespace == rel.namespace
            && self.relation.name == rel.name
            && self.relation.columns == rel.columns
    }
}

/// Schemas made, by a hash of what they were made from. A table's schema
/// is some kilobytes of JSON: made and serialized anew for every record,
/// it would cost more than the record. Bounded: cleared when it holds
/// more than this many (tables × shapes × options).
const CACHE_LIMIT: usize = 4096;

thread_local! {
    static CACHE: RefCell<HashMap<u64, (Made, Rc<TableSchemas>)>> = RefCell::new(HashMap::new());
}

/// The schemas of `rel`'s records, whose keys are `key_names` (made once
/// per shape of the table and kept).
pub(super) fn table_schemas(
    server_name: &str,
    rel: &Relation,
    key_names: &[&str],
    decimal: DecimalMode,
) -> Rc<TableSchemas> {
    let mut h = DefaultHasher::new();
    (
        server_name,
        decimal,
        key_names,
        rel.oid,
        &rel.namespace,
        &rel.name,
        &rel.columns,
    )
        .hash(&mut h);
    let hash = h.finish();
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((made, schemas)) = cache.get(&hash) {
            if made.is_for(server_name, rel, key_names, decimal) {
                return schemas.clone();
            }
        }
        let schemas = Rc::new(TableSchemas {
            envelope: envelope_schema(server_name, rel, decimal).to_string(),
            key: key_schema(server_name, rel, key_names.iter().copied(), decimal)
                .map(|k| k.to_string())
                .map_err(str::to_owned),
        });
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        let made = Made {
            server_name: server_name.to_owned(),
            decimal,
            key_names: key_names.iter().map(|k| (*k).to_owned()).collect(),
            relation: Relation {
                xid: None,
                ..rel.clone()
            },
        };
        cache.insert(hash, (made, schemas.clone()));
        schemas
    })
}

/// The schema of a column's values (without `field` and `optional`).
fn column_type(type_oid: u32, typmod: i32, decimal: DecimalMode) -> Value {
    if let Some(elem) = oid::array_element(type_oid) {
        let mut items = column_type(elem, typmod, decimal);
        items["optional"] = Value::Bool(true);
        return json!({ "type": "array", "items": items });
    }
    let named = |ty: &str, name: &str| json!({ "type": ty, "name": name, "version": 1 });
    let precision = if typmod < 0 { 6 } else { typmod };
    match type_oid {
        oid::BOOL => json!({ "type": "boolean" }),
        oid::INT2 => json!({ "type": "int16" }),
        oid::INT4 => json!({ "type": "int32" }),
        oid::INT8 | oid::OID | oid::XID | oid::CID | oid::XID8 => json!({ "type": "int64" }),
        oid::INT2VECTOR => {
            json!({ "type": "array", "items": { "type": "int16", "optional": true } })
        }
        oid::OIDVECTOR => {
            json!({ "type": "array", "items": { "type": "int64", "optional": true } })
        }
        oid::FLOAT4 => json!({ "type": "float" }),
        oid::FLOAT8 => json!({ "type": "double" }),
        oid::NUMERIC => match decimal {
            DecimalMode::String => json!({ "type": "string" }),
            DecimalMode::Double => json!({ "type": "double" }),
            DecimalMode::Precise if typmod >= 4 => {
                // numeric(p, s): typmod = ((p << 16) | s) + 4
                let p = ((typmod - 4) >> 16) & 0xffff;
                let s = (typmod - 4) & 0xffff;
                json!({
                    "type": "bytes",
                    "name": "org.apache.kafka.connect.data.Decimal",
                    "version": 1,
                    "parameters": { "scale": s.to_string(), "connect.decimal.precision": p.to_string() },
                })
            }
            DecimalMode::Precise => json!({
                "type": "struct",
                "fields": [
                    { "type": "int32", "optional": false, "field": "scale" },
                    { "type": "bytes", "optional": false, "field": "value" },
                ],
                "name": "io.debezium.data.VariableScaleDecimal",
                "version": 1,
                "doc": "Variable scaled decimal",
            }),
        },
        oid::BYTEA => json!({ "type": "bytes" }),
        oid::JSON | oid::JSONB => named("string", "io.debezium.data.Json"),
        oid::UUID => named("string", "io.debezium.data.Uuid"),
        oid::XML => named("string", "io.debezium.data.Xml"),
        oid::DATE => named("int32", "io.debezium.time.Date"),
        oid::TIME if precision <= 3 => named("int32", "io.debezium.time.Time"),
        oid::TIME => named("int64", "io.debezium.time.MicroTime"),
        oid::TIMETZ => named("string", "io.debezium.time.ZonedTime"),
        oid::TIMESTAMP if precision <= 3 => named("int64", "io.debezium.time.Timestamp"),
        oid::TIMESTAMP => named("int64", "io.debezium.time.MicroTimestamp"),
        oid::TIMESTAMPTZ => named("string", "io.debezium.time.ZonedTimestamp"),
        oid::INTERVAL => named("int64", "io.debezium.time.MicroDuration"),
        _ => json!({ "type": "string" }),
    }
}

/// A struct field: `schema` plus its name and whether it may be null.
fn field(name: &str, mut schema: Value, optional: bool) -> Value {
    schema["optional"] = Value::Bool(optional);
    schema["field"] = Value::String(name.to_owned());
    schema
}

fn column_field(col: &RelationColumn, optional: bool, decimal: DecimalMode) -> Value {
    field(
        &col.name,
        column_type(col.type_oid, col.type_modifier, decimal),
        optional,
    )
}

/// `<server>.<schema>.<table>`, the prefix of the schema names Debezium
/// gives a table's key, value and envelope.
fn table_name(server_name: &str, rel: &Relation) -> String {
    format!("{server_name}.{}.{}", rel.namespace, rel.name)
}

/// The row struct (`before`, `after`): every published column, optional.
fn value_struct(server_name: &str, rel: &Relation, decimal: DecimalMode) -> Value {
    let fields: Vec<Value> = rel
        .columns
        .iter()
        .map(|c| column_field(c, true, decimal))
        .collect();
    json!({
        "type": "struct",
        "fields": fields,
        "name": format!("{}.Value", table_name(server_name, rel)),
    })
}

/// The key's schema: `columns` (named in the order the key object has
/// them), all required; the name of the first one the table does not
/// publish, if any.
fn key_schema<'a>(
    server_name: &str,
    rel: &Relation,
    columns: impl Iterator<Item = &'a str>,
    decimal: DecimalMode,
) -> Result<Value, &'a str> {
    let fields = columns
        .map(|name| {
            rel.columns
                .iter()
                .find(|c| c.name == name)
                .map(|c| column_field(c, false, decimal))
                .ok_or(name)
        })
        .collect::<Result<Vec<Value>, &str>>()?;
    Ok(json!({
        "type": "struct",
        "fields": fields,
        "optional": false,
        "name": format!("{}.Key", table_name(server_name, rel)),
    }))
}

/// The source block's schema: the fields [`super::debezium::envelope`]
/// writes.
fn source_struct() -> Value {
    let s = |name: &str, optional: bool| field(name, json!({ "type": "string" }), optional);
    let i = |name: &str, optional: bool| field(name, json!({ "type": "int64" }), optional);
    let snapshot = json!({
        "type": "string",
        "optional": true,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": { "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental" },
        "default": "false",
        "field": "snapshot",
    });
    json!({
        "type": "struct",
        "fields": [
            s("version", false),
            s("connector", false),
            s("name", false),
            i("ts_ms", false),
            snapshot,
            s("db", false),
            s("sequence", true),
            s("schema", false),
            s("table", false),
            i("txId", true),
            i("lsn", true),
            i("xmin", true),
        ],
        "optional": false,
        "name": "io.debezium.connector.postgresql.Source",
        "field": "source",
    })
}

fn transaction_struct() -> Value {
    json!({
        "type": "struct",
        "fields": [
            { "type": "string", "optional": false, "field": "id" },
            { "type": "int64", "optional": false, "field": "total_order" },
            { "type": "int64", "optional": false, "field": "data_collection_order" },
        ],
        "optional": true,
        "name": "event.block",
        "version": 1,
        "field": "transaction",
    })
}

/// The envelope's schema for changes of `rel`.
fn envelope_schema(server_name: &str, rel: &Relation, decimal: DecimalMode) -> Value {
    let row = value_struct(server_name, rel, decimal);
    json!({
        "type": "struct",
        "fields": [
            field("before", row.clone(), true),
            field("after", row, true),
            source_struct(),
            { "type": "string", "optional": false, "field": "op" },
            { "type": "int64", "optional": true, "field": "ts_ms" },
            transaction_struct(),
        ],
        "optional": false,
        "name": format!("{}.Envelope", table_name(server_name, rel)),
        "version": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_types_follow_typmods_and_modes() {
        let t = |oid, typmod| column_type(oid, typmod, DecimalMode::Precise);
        assert_eq!(t(oid::INT4, -1), json!({ "type": "int32" }));
        assert_eq!(t(oid::TIMESTAMP, 3)["name"], "io.debezium.time.Timestamp");
        assert_eq!(
            t(oid::TIMESTAMP, -1)["name"],
            "io.debezium.time.MicroTimestamp"
        );
        assert_eq!(t(oid::TIME, 0)["type"], "int32");
        assert_eq!(t(oid::TIME, 6)["type"], "int64");
        let dec = t(oid::NUMERIC, (10 << 16 | 2) + 4);
        assert_eq!(
            dec["parameters"],
            json!({ "scale": "2", "connect.decimal.precision": "10" })
        );
        assert_eq!(
            t(oid::NUMERIC, -1)["name"],
            "io.debezium.data.VariableScaleDecimal"
        );
        assert_eq!(
            column_type(oid::NUMERIC, -1, DecimalMode::String),
            json!({ "type": "string" })
        );
        // int4[]: the element's schema, optional
        assert_eq!(
            t(1007, -1),
            json!({ "type": "array", "items": { "type": "int32", "optional": true } })
        );
    }
}
