//! Changes that cannot be written, and what the sink does with them.
//!
//! A change can be impossible to write faithfully: an update whose
//! unchanged TOAST value the server did not send (`REPLICA IDENTITY
//! DEFAULT`), a value that does not decode as its type, a table whose name
//! gives no valid topic, a configured key column the table lacks, or a
//! record larger than Kafka takes. Retrying cannot cure any of them: every
//! restart meets the same change again. The user chooses
//! ([`BadRecordPolicy`]):
//! - `Fail` (default): the sink stops with an error naming the table, the
//!   change's position and the ways out; nothing after the last complete
//!   transaction before it is acknowledged.
//! - `Skip`: the change is left out, with a warning naming it, and counted.
//! - `DeadLetter`: instead of its records, one record goes to a dead-letter
//!   topic, in the same Kafka transaction as the rest of its PostgreSQL
//!   transaction, so a read_committed consumer sees both or neither. It
//!   carries the reason and the change as the server sent it: values as
//!   text, unchanged TOAST columns listed rather than invented, and for a
//!   record too large only the change's description and key.

use pgwal::protocol::pgoutput::ColumnValue;
use pgwal::{Event, Lsn, Row};
use serde_json::{json, Map, Value};

use crate::format::{FormatError, Record, TxInfo};

/// What to do with a change that cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BadRecordPolicy {
    /// Stop with an error (the default).
    #[default]
    Fail,
    /// Leave the change out, with a warning, and count it.
    Skip,
    /// Write a description of the change and the reason to this topic
    /// instead, in the same Kafka transaction.
    DeadLetter {
        /// The dead-letter topic.
        topic: String,
    },
}

/// Why a change cannot be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BadRecordReason {
    /// It cannot be encoded faithfully.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// One of its records is larger than Kafka takes.
    #[error("a record of {bytes} bytes (key and value) is larger than the limit of {limit} bytes (--kafka-max-record-bytes; librdkafka's message.max.bytes and the topic's max.message.bytes)")]
    TooLarge {
        /// The record's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// Its key or value has no Avro form (`--kafka-avro`).
    #[error(transparent)]
    Avro(crate::avro_converter::ConvertError),
}

/// `schema.table` (for a truncate, its tables) and the position of a
/// change.
pub(crate) fn describe(event: &Event) -> (String, Lsn) {
    match event {
        Event::Insert(c) | Event::Update(c) | Event::Delete(c) => (
            format!("{}.{}", c.relation.namespace, c.relation.name),
            c.lsn,
        ),
        Event::Truncate(t) => (
            t.relations
                .iter()
                .map(|r| format!("{}.{}", r.namespace, r.name))
                .collect::<Vec<_>>()
                .join(", "),
            t.lsn,
        ),
        _ => (String::new(), Lsn(0)),
    }
}

/// A row as the server sent it: text values (binary ones in hex), and the
/// names of the unchanged TOAST columns it did not send.
fn raw_row(row: &Row, unchanged: &mut Vec<String>) -> Value {
    let mut m = Map::new();
    for (col, v) in row.iter() {
        let value = match v {
            ColumnValue::Null => Value::Null,
            ColumnValue::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
            ColumnValue::Binary(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                Value::String(format!("\\x{hex}"))
            }
            ColumnValue::UnchangedToast => {
                if !unchanged.contains(&col.name) {
                    unchanged.push(col.name.clone());
                }
                continue;
            }
            _ => Value::Null,
        };
        m.insert(col.name.clone(), value);
    }
    Value::Object(m)
}

/// The dead-letter record for `event`: keyed like the change's own records
/// when `key` is given, its value the reason and the change. `with_rows`:
/// include the row images (not for a record too large to write).
pub(crate) fn dead_letter(
    topic: &str,
    event: &Event,
    tx: &TxInfo,
    reason: &BadRecordReason,
    key: Option<Vec<u8>>,
    with_rows: bool,
) -> Record {
    let (table, lsn) = describe(event);
    let mut v = json!({
        "reason": reason.to_string(),
        "table": table,
        "lsn": lsn.to_string(),
        "xid": tx.xid,
        "commit_lsn": tx.commit_lsn.to_string(),
        "commit_time": tx.commit_time.to_iso8601(),
    });
    let mut unchanged = Vec::new();
    match event {
        Event::Insert(c) | Event::Update(c) | Event::Delete(c) => {
            v["op"] = json!(match event {
                Event::Insert(_) => "insert",
                Event::Update(_) => "update",
                _ => "delete",
            });
            if with_rows {
                if let Some(old) = &c.old {
                    v[if c.old_is_key { "key" } else { "old" }] = raw_row(old, &mut unchanged);
                }
                if let Some(new) = &c.new {
                    v["new"] = raw_row(new, &mut unchanged);
                }
                v["unchanged_toast"] = json!(unchanged);
            }
        }
        Event::Truncate(_) => v["op"] = json!("truncate"),
        _ => {}
    }
    Record {
        topic: topic.to_owned(),
        key,
        value: Some(serde_json::to_vec(&v).expect("a JSON value serializes")),
    }
}
