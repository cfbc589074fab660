//! Events as JSON objects.

use pgwal::protocol::pgoutput::ColumnValue;
use pgwal::{Change, Event, Row};
use serde_json::{json, Map, Value};

fn value(v: &ColumnValue) -> Value {
    match v {
        ColumnValue::Null => Value::Null,
        ColumnValue::UnchangedToast => json!({"unchanged_toast": true}),
        ColumnValue::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        ColumnValue::Binary(b) => {
            let mut s = String::with_capacity(2 + 2 * b.len());
            s.push_str("\\x");
            for x in b.iter() {
                s.push_str(&format!("{x:02x}"));
            }
            Value::String(s)
        }
        _ => Value::Null,
    }
}

fn row(r: &Row) -> Value {
    let mut m = Map::new();
    for (col, v) in r.iter() {
        m.insert(col.name.clone(), value(v));
    }
    Value::Object(m)
}

fn change(kind: &str, c: &Change) -> Value {
    let mut o = json!({
        "type": kind,
        "schema": c.relation.namespace,
        "table": c.relation.name,
        "lsn": c.lsn.to_string(),
    });
    if let Some(x) = c.xid {
        o["xid"] = json!(x);
    }
    if let Some(old) = &c.old {
        o[if c.old_is_key { "key" } else { "old" }] = row(old);
    }
    if let Some(new) = &c.new {
        o["new"] = row(new);
    }
    o
}

/// The JSON line for an event, or `None` for events not printed
/// (relation and type descriptions, stream block boundaries).
pub(crate) fn event(e: &Event) -> Option<Value> {
    Some(match e {
        Event::Begin(b) => {
            json!({"type": "begin", "xid": b.xid, "final_lsn": b.final_lsn.to_string(), "commit_time": b.commit_time.to_iso8601()})
        }
        Event::Commit(c) => {
            json!({"type": "commit", "lsn": c.commit_lsn.to_string(), "end_lsn": c.end_lsn.to_string(), "commit_time": c.commit_time.to_iso8601()})
        }
        Event::Origin(o) => {
            json!({"type": "origin", "name": o.name, "lsn": o.commit_lsn.to_string()})
        }
        Event::Insert(c) => change("insert", c),
        Event::Update(c) => change("update", c),
        Event::Delete(c) => change("delete", c),
        Event::Truncate(t) => json!({
            "type": "truncate",
            "lsn": t.lsn.to_string(),
            "tables": t.relations.iter().map(|r| format!("{}.{}", r.namespace, r.name)).collect::<Vec<_>>(),
            "cascade": t.options & 1 != 0,
            "restart_identity": t.options & 2 != 0,
        }),
        Event::Message(m) => json!({
            "type": "message", "transactional": m.is_transactional(), "lsn": m.lsn.to_string(),
            "prefix": m.prefix, "content": String::from_utf8_lossy(&m.content),
        }),
        Event::StreamCommit(c) => {
            json!({"type": "stream_commit", "xid": c.xid, "lsn": c.commit_lsn.to_string(), "end_lsn": c.end_lsn.to_string(), "commit_time": c.commit_time.to_iso8601()})
        }
        Event::StreamAbort(a) => json!({"type": "stream_abort", "xid": a.xid, "subxid": a.subxid}),
        Event::StreamStart(s) => {
            json!({"type": "stream_start", "xid": s.xid, "first": s.first_segment})
        }
        Event::BeginPrepare(b) => {
            json!({"type": "begin_prepare", "xid": b.xid, "gid": b.gid, "prepare_lsn": b.prepare_lsn.to_string()})
        }
        Event::Prepare(p) | Event::StreamPrepare(p) => {
            json!({"type": "prepare", "xid": p.xid, "gid": p.gid, "end_lsn": p.end_lsn.to_string()})
        }
        Event::CommitPrepared(c) => {
            json!({"type": "commit_prepared", "xid": c.xid, "gid": c.gid, "end_lsn": c.end_lsn.to_string()})
        }
        Event::RollbackPrepared(r) => {
            json!({"type": "rollback_prepared", "xid": r.xid, "gid": r.gid, "end_lsn": r.rollback_end_lsn.to_string()})
        }
        Event::Reconnected { restart_lsn } => {
            json!({"type": "reconnect", "restart_lsn": restart_lsn.to_string()})
        }
        _ => return None,
    })
}
