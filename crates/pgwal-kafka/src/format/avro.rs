//! Avro for Debezium's envelope, as Kafka Connect's Avro converter
//! (Confluent's `AvroData`, which Debezium users run) writes it: the Kafka
//! Connect schema of a key or value (see the module `connect_schema`, `--kafka-json-schemas`) becomes
//! an Avro schema, its payload an Avro datum of that schema.
//!
//! The mapping, as `AvroData`'s:
//!
//! | Connect | Avro |
//! |---|---|
//! | boolean, int32, int64, float, double, string, bytes | the same primitive (`int`, `long`, ...) |
//! | int8, int16 | `int`, with `"connect.type"` |
//! | struct | `record` named by the schema's name (each later use by name) |
//! | array | `array` |
//! | `org.apache.kafka.connect.data.Decimal` | `bytes`, `logicalType: decimal` with `precision` and `scale` |
//! | optional | `["null", T]`, default null; with a default `d`: `[T, "null"]`, default `d` |
//!
//! A named Connect schema keeps its name, version and parameters as
//! `connect.name`, `connect.version` and `connect.parameters`, so that a
//! consumer's converter rebuilds the same Connect schema (Debezium's
//! `io.debezium.time.*` stay plain `int` and `long` with their name).
//!
//! Names that Avro does not allow (a column `"order total"`, a table
//! `"Über"`) are adjusted as Debezium's `field.name.adjustment.mode=avro`
//! and `schema.name.adjustment.mode=avro` do: every character outside
//! `[A-Za-z0-9_]` becomes `_`, and a leading digit gets a `_` before it.
//! Two columns that adjust to the same name are an error, not a guess.
//!
//! No I/O: the schema's registry id comes from [`crate::registry`].

use std::collections::HashSet;

use apache_avro::types::Value as Avro;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::{Decimal, Schema};
use base64::Engine;
use serde_json::{json, Map, Value};

/// A Connect schema or payload that has no Avro form.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AvroError {
    /// A record that is not `{"schema": ..., "payload": ...}`.
    #[error("not a key or value with its Kafka Connect schema: {0}")]
    NotConnectJson(String),
    /// A schema that does not map to Avro.
    #[error("schema {name:?}: {reason}")]
    Schema {
        /// The Connect schema's name or field.
        name: String,
        /// Why.
        reason: String,
    },
    /// A payload that does not fit its schema.
    #[error("field {field:?}: {reason}")]
    Payload {
        /// The field's path.
        field: String,
        /// Why.
        reason: String,
    },
    /// From the Avro library: the mapped schema or datum it refused.
    #[error("Avro: {0}")]
    Avro(#[from] Box<apache_avro::Error>),
}

/// A Connect schema turned into Avro: the schema's JSON text (what is
/// registered), the parsed schema, and the Connect schema the payloads
/// follow.
#[derive(Debug)]
pub struct AvroSchema {
    /// The Avro schema as registered.
    pub text: String,
    /// Its full name (a record's; a primitive's type name).
    pub name: String,
    schema: Schema,
    connect: Value,
}

impl AvroSchema {
    /// Maps a Connect schema (the `schema` of a Connect JSON key or value).
    pub fn from_connect(connect: &Value) -> Result<AvroSchema, AvroError> {
        let mut defined = HashSet::new();
        let avro = schema_of(connect, &mut defined, "")?;
        let name = match &avro {
            Value::String(s) => s.clone(),
            v => v
                .get("name")
                .or_else(|| v.get("type"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        let schema = Schema::parse(&avro).map_err(Box::new)?;
        Ok(AvroSchema {
            text: avro.to_string(),
            name,
            schema,
            connect: connect.clone(),
        })
    }

    /// The parsed schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The Avro binary datum of `payload` (no framing).
    pub fn datum(&self, payload: &Value) -> Result<Vec<u8>, AvroError> {
        let value = datum_of(&self.connect, payload, At::Top)?;
        let writer = GenericDatumWriter::builder(&self.schema)
            .build()
            .map_err(Box::new)?;
        Ok(writer.write_value_to_vec(value).map_err(Box::new)?)
    }
}

/// The Confluent wire format: magic byte 0, the schema's registry id
/// (4 bytes, big-endian), the datum.
pub fn framed(id: u32, datum: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + datum.len());
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(datum);
    out
}

/// `name` as an Avro name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn adjust_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.chars().next().is_none_or(|c| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    out
}

/// A full name (dotted): each part adjusted.
fn adjust_full_name(name: &str) -> String {
    name.split('.')
        .map(adjust_name)
        .collect::<Vec<_>>()
        .join(".")
}

fn connect_type(s: &Value) -> &str {
    s.get("type").and_then(Value::as_str).unwrap_or_default()
}

fn optional(s: &Value) -> bool {
    s.get("optional").and_then(Value::as_bool).unwrap_or(false)
}

const DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";

/// The Avro schema of a Connect schema, without its optionality; `defined`
/// holds the record names already defined (a later use names them only).
fn schema_of(s: &Value, defined: &mut HashSet<String>, at: &str) -> Result<Value, AvroError> {
    let bad = |reason: String| AvroError::Schema {
        name: at.to_owned(),
        reason,
    };
    let name = s.get("name").and_then(Value::as_str);
    let ty = connect_type(s);
    let mut out = match ty {
        "boolean" => json!({ "type": "boolean" }),
        "int8" | "int16" => json!({ "type": "int", "connect.type": ty }),
        "int32" => json!({ "type": "int" }),
        "int64" => json!({ "type": "long" }),
        "float" => json!({ "type": "float" }),
        "double" => json!({ "type": "double" }),
        "string" => json!({ "type": "string" }),
        "bytes" if name == Some(DECIMAL) => {
            let params = s.get("parameters");
            let param = |k: &str| {
                params
                    .and_then(|p| p.get(k))
                    .and_then(Value::as_str)
                    .and_then(|v| v.parse::<u32>().ok())
            };
            let scale = param("scale").ok_or_else(|| bad("a Decimal without its scale".into()))?;
            // AvroData's default when Connect gives no precision
            let precision = param("connect.decimal.precision").unwrap_or(64);
            json!({ "type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale })
        }
        "bytes" => json!({ "type": "bytes" }),
        "array" => {
            let items = s
                .get("items")
                .ok_or_else(|| bad("an array without items".into()))?;
            json!({ "type": "array", "items": optional_schema(items, defined, &format!("{at}[]"))? })
        }
        "struct" => {
            let full = adjust_full_name(name.unwrap_or("ConnectDefault"));
            if defined.contains(&full) {
                // Avro defines a name once; Connect repeats the struct
                // (before and after): later uses are references
                return Ok(Value::String(full));
            }
            defined.insert(full.clone());
            let mut names = HashSet::new();
            let mut fields = Vec::new();
            for f in s
                .get("fields")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("a struct without fields".into()))?
            {
                let field = f.get("field").and_then(Value::as_str).unwrap_or_default();
                let avro_name = adjust_name(field);
                if !names.insert(avro_name.clone()) {
                    return Err(bad(format!(
                        "two fields are {avro_name:?} in Avro (names outside [A-Za-z0-9_] become _)"
                    )));
                }
                let path = if at.is_empty() {
                    field.to_owned()
                } else {
                    format!("{at}.{field}")
                };
                let mut o = Map::new();
                o.insert("name".into(), Value::String(avro_name));
                if let Some(doc) = f.get("doc") {
                    o.insert("doc".into(), doc.clone());
                }
                let ty = optional_schema(f, defined, &path)?;
                o.insert("type".into(), ty);
                if optional(f) || f.get("default").is_some() {
                    o.insert(
                        "default".into(),
                        f.get("default").cloned().unwrap_or(Value::Null),
                    );
                }
                fields.push(Value::Object(o));
            }
            json!({ "type": "record", "name": full, "fields": fields })
        }
        other => {
            return Err(bad(format!(
                "Connect type {other:?} has no Avro mapping here"
            )))
        }
    };
    if let Some(name) = name {
        out["connect.name"] = json!(name);
    }
    if let Some(v) = s.get("version") {
        out["connect.version"] = v.clone();
    }
    if let Some(p) = s.get("parameters") {
        out["connect.parameters"] = p.clone();
    }
    if let Some(doc) = s.get("doc") {
        out["connect.doc"] = doc.clone();
    }
    // a primitive without properties is written by its name, as AvroData does
    if let Some(o) = out.as_object() {
        if o.len() == 1 {
            if let Some(Value::String(t)) = o.get("type") {
                return Ok(Value::String(t.clone()));
            }
        }
    }
    Ok(out)
}

/// [`schema_of`] with the optionality: a union with null.
fn optional_schema(s: &Value, defined: &mut HashSet<String>, at: &str) -> Result<Value, AvroError> {
    let inner = schema_of(s, defined, at)?;
    Ok(if !optional(s) {
        inner
    } else if s.get("default").is_some_and(|d| !d.is_null()) {
        // a union's default is of its first branch
        json!([inner, "null"])
    } else {
        json!(["null", inner])
    })
}

/// Where a payload value is, rendered only for an error (a string per
/// field and record would cost more than the encoding).
#[derive(Clone, Copy)]
enum At<'a> {
    Top,
    Field(&'a At<'a>, &'a str),
    Item(&'a At<'a>),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Top => Ok(()),
            At::Field(At::Top, name) => f.write_str(name),
            At::Field(parent, name) => write!(f, "{parent}.{name}"),
            At::Item(parent) => write!(f, "{parent}[]"),
        }
    }
}

/// The Avro value of a Connect payload, with its optionality.
fn datum_of(s: &Value, v: &Value, at: At<'_>) -> Result<Avro, AvroError> {
    if !optional(s) {
        if v.is_null() {
            if let Some(d) = s.get("default").filter(|d| !d.is_null()) {
                return plain_datum(s, d, at);
            }
            return Err(AvroError::Payload {
                field: at.to_string(),
                reason: "null in a required field".into(),
            });
        }
        return plain_datum(s, v, at);
    }
    let null_first = s.get("default").is_none_or(|d| d.is_null());
    Ok(match (v.is_null(), null_first) {
        (true, true) => Avro::Union(0, Box::new(Avro::Null)),
        (true, false) => Avro::Union(1, Box::new(Avro::Null)),
        (false, true) => Avro::Union(1, Box::new(plain_datum(s, v, at)?)),
        (false, false) => Avro::Union(0, Box::new(plain_datum(s, v, at)?)),
    })
}

fn plain_datum(s: &Value, v: &Value, at: At<'_>) -> Result<Avro, AvroError> {
    let bad = |reason: &str| AvroError::Payload {
        field: at.to_string(),
        reason: format!("{reason}: {v}"),
    };
    let float = |v: &Value| -> Option<f64> {
        match v {
            Value::Number(n) => n.as_f64(),
            // the JSON form's non-finite numbers
            Value::String(s) => match s.as_str() {
                "NaN" => Some(f64::NAN),
                "Infinity" => Some(f64::INFINITY),
                "-Infinity" => Some(f64::NEG_INFINITY),
                _ => None,
            },
            _ => None,
        }
    };
    let b64 = |v: &Value| {
        v.as_str()
            .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
    };
    Ok(match connect_type(s) {
        "boolean" => Avro::Boolean(v.as_bool().ok_or_else(|| bad("not a boolean"))?),
        "int8" | "int16" | "int32" => Avro::Int(
            v.as_i64()
                .and_then(|i| i32::try_from(i).ok())
                .ok_or_else(|| bad("not a 32-bit integer"))?,
        ),
        "int64" => Avro::Long(v.as_i64().ok_or_else(|| bad("not a 64-bit integer"))?),
        "float" => Avro::Float(float(v).ok_or_else(|| bad("not a number"))? as f32),
        "double" => Avro::Double(float(v).ok_or_else(|| bad("not a number"))?),
        "string" => Avro::String(v.as_str().ok_or_else(|| bad("not a string"))?.to_owned()),
        "bytes" if s.get("name").and_then(Value::as_str) == Some(DECIMAL) => {
            Avro::Decimal(Decimal::from(b64(v).ok_or_else(|| bad("not base64"))?))
        }
        "bytes" => Avro::Bytes(b64(v).ok_or_else(|| bad("not base64"))?),
        "array" => {
            let items = &s["items"];
            Avro::Array(
                v.as_array()
                    .ok_or_else(|| bad("not an array"))?
                    .iter()
                    .map(|e| datum_of(items, e, At::Item(&at)))
                    .collect::<Result<_, _>>()?,
            )
        }
        "struct" => {
            let o = v.as_object().ok_or_else(|| bad("not an object"))?;
            let fields = s["fields"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            let mut out = Vec::with_capacity(fields.len());
            for f in fields {
                let name = f.get("field").and_then(Value::as_str).unwrap_or_default();
                let fv = o.get(name).unwrap_or(&Value::Null);
                out.push((adjust_name(name), datum_of(f, fv, At::Field(&at, name))?));
            }
            Avro::Record(out)
        }
        other => return Err(bad(&format!("Connect type {other:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(deprecated)]
    use apache_avro::from_avro_datum;

    fn envelope_like() -> Value {
        let row = json!({
            "type": "struct",
            "name": "srv.public.t-1.Value",
            "fields": [
                { "type": "int32", "optional": false, "field": "id" },
                { "type": "int16", "optional": true, "field": "small" },
                { "type": "bytes", "optional": true, "field": "price",
                  "name": DECIMAL, "version": 1,
                  "parameters": { "scale": "2", "connect.decimal.precision": "10" } },
                { "type": "int32", "optional": true, "field": "day",
                  "name": "io.debezium.time.Date", "version": 1 },
                { "type": "array", "optional": true, "field": "tags",
                  "items": { "type": "string", "optional": true } },
                { "type": "double", "optional": true, "field": "ratio" },
                { "type": "string", "optional": true, "field": "order total" },
            ],
        });
        let mut before = row.clone();
        before["optional"] = json!(true);
        before["field"] = json!("before");
        let mut after = row;
        after["optional"] = json!(true);
        after["field"] = json!("after");
        json!({
            "type": "struct",
            "name": "srv.public.t-1.Envelope",
            "version": 1,
            "optional": false,
            "fields": [
                before,
                after,
                { "type": "string", "optional": true, "default": "false", "field": "snapshot" },
                { "type": "string", "optional": false, "field": "op" },
            ],
        })
    }

    #[test]
    fn a_connect_schema_maps_as_avrodata_maps_it() {
        let s = AvroSchema::from_connect(&envelope_like()).unwrap();
        let v: Value = serde_json::from_str(&s.text).unwrap();
        assert_eq!(s.name, "srv.public.t_1.Envelope");
        assert_eq!(v["connect.version"], 1);
        // after is a reference to before's record
        assert_eq!(
            v["fields"][1]["type"],
            json!(["null", "srv.public.t_1.Value"])
        );
        let row = &v["fields"][0]["type"][1];
        assert_eq!(row["type"], "record");
        assert_eq!(row["fields"][0], json!({ "name": "id", "type": "int" }));
        assert_eq!(
            row["fields"][1]["type"][1],
            json!({ "type": "int", "connect.type": "int16" })
        );
        let price = &row["fields"][2]["type"][1];
        assert_eq!(price["logicalType"], "decimal");
        assert_eq!(
            (price["precision"].clone(), price["scale"].clone()),
            (json!(10), json!(2))
        );
        assert_eq!(
            row["fields"][3]["type"][1]["connect.name"],
            "io.debezium.time.Date"
        );
        assert_eq!(row["fields"][6]["name"], "order_total");
        // a default other than null: its type first
        assert_eq!(v["fields"][2]["type"], json!(["string", "null"]));
        assert_eq!(v["fields"][2]["default"], "false");
    }

    #[test]
    #[allow(deprecated)]
    fn a_payload_round_trips_through_the_avro_library() {
        let s = AvroSchema::from_connect(&envelope_like()).unwrap();
        let payload = json!({
            "before": null,
            "after": {
                "id": 7, "small": -3, "price": "AeI=", "day": 19000,
                "tags": ["a", null], "ratio": "NaN", "order total": "12",
            },
            "snapshot": "false",
            "op": "c",
        });
        let bytes = s.datum(&payload).unwrap();
        let back = from_avro_datum(s.schema(), &mut &bytes[..], None).unwrap();
        let Avro::Record(fields) = back else {
            panic!("{back:?}")
        };
        assert_eq!(
            fields[0],
            ("before".into(), Avro::Union(0, Box::new(Avro::Null)))
        );
        let Avro::Union(1, after) = &fields[1].1 else {
            panic!("{:?}", fields[1])
        };
        let Avro::Record(after) = after.as_ref() else {
            panic!()
        };
        assert_eq!(after[0].1, Avro::Int(7));
        assert_eq!(after[1].1, Avro::Union(1, Box::new(Avro::Int(-3))));
        // 0x01e2 = 482: 4.82 at scale 2
        assert_eq!(
            after[2].1,
            Avro::Union(1, Box::new(Avro::Decimal(Decimal::from(vec![0x01, 0xe2]))))
        );
        assert!(
            matches!(&after[5].1, Avro::Union(1, d) if matches!(**d, Avro::Double(f) if f.is_nan()))
        );
        assert_eq!(after[6].0, "order_total");
        assert_eq!(fields[3].1, Avro::String("c".into()));
    }

    #[test]
    fn bad_payloads_and_names_are_errors() {
        let s = AvroSchema::from_connect(&envelope_like()).unwrap();
        let e = s
            .datum(&json!({ "after": { "id": "seven" }, "op": "c" }))
            .unwrap_err();
        assert!(e.to_string().contains("after.id"), "{e}");
        let e = s.datum(&json!({ "op": null })).unwrap_err();
        assert!(e.to_string().contains("required"), "{e}");
        let clash = json!({
            "type": "struct", "name": "k",
            "fields": [
                { "type": "int32", "field": "a b" },
                { "type": "int32", "field": "a-b" },
            ],
        });
        let e = AvroSchema::from_connect(&clash).unwrap_err();
        assert!(e.to_string().contains("\"a_b\""), "{e}");
        assert_eq!(adjust_name("1st"), "_1st");
        assert_eq!(adjust_name("Über"), "_ber");
    }

    #[test]
    fn the_wire_format_is_confluents() {
        assert_eq!(framed(258, &[9]), vec![0, 0, 0, 1, 2, 9]);
    }
}
