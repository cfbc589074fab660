//! Relation cache and conversion of pgoutput messages into [`Event`]s.

use std::collections::HashMap;
use std::sync::Arc;

use pgwal_protocol::pgoutput::{ColumnValue, LogicalMessage, OldTuple, Relation, TupleData};

use crate::error::{Error, Result};
use crate::event::{Change, Event, Row, TruncateEvent};

/// Relations described so far, by OID.
#[derive(Debug, Default)]
pub(crate) struct RelationCache {
    by_oid: HashMap<u32, Arc<Relation>>,
}

fn merge_toast(new: &mut TupleData, old: &TupleData) {
    for (n, o) in new.0.iter_mut().zip(old.0.iter()) {
        if *n == ColumnValue::UnchangedToast && matches!(o, ColumnValue::Text(_) | ColumnValue::Binary(_)) {
            *n = o.clone();
        }
    }
}

impl RelationCache {
    fn get(&self, oid: u32) -> Result<Arc<Relation>> {
        self.by_oid.get(&oid).cloned().ok_or(Error::UnknownRelation(oid))
    }

    /// Converts one decoded message, updating the cache on Relation messages.
    pub(crate) fn event_from(&mut self, m: LogicalMessage) -> Result<Event> {
        Ok(match m {
            LogicalMessage::Begin(b) => Event::Begin(b),
            LogicalMessage::Commit(c) => Event::Commit(c),
            LogicalMessage::Origin(o) => Event::Origin(o),
            LogicalMessage::Relation(r) => {
                let r = Arc::new(r);
                self.by_oid.insert(r.oid, r.clone());
                Event::Relation(r)
            }
            LogicalMessage::Type(t) => Event::Type(t),
            LogicalMessage::Insert(i) => {
                let rel = self.get(i.relation_oid)?;
                Event::Insert(Change {
                    xid: i.xid,
                    new: Some(Row::new(rel.clone(), i.new)),
                    old: None,
                    old_is_key: false,
                    relation: rel,
                })
            }
            LogicalMessage::Update(u) => {
                let rel = self.get(u.relation_oid)?;
                let mut new = u.new;
                let (old, old_is_key) = match u.old {
                    Some(OldTuple::Full(t)) => {
                        merge_toast(&mut new, &t);
                        (Some(t), false)
                    }
                    Some(OldTuple::Key(t)) => (Some(t), true),
                    Some(_) | None => (None, false),
                };
                Event::Update(Change {
                    xid: u.xid,
                    old: old.map(|t| Row::new(rel.clone(), t)),
                    old_is_key,
                    new: Some(Row::new(rel.clone(), new)),
                    relation: rel,
                })
            }
            LogicalMessage::Delete(d) => {
                let rel = self.get(d.relation_oid)?;
                let old_is_key = matches!(d.old, OldTuple::Key(_));
                Event::Delete(Change {
                    xid: d.xid,
                    old: Some(Row::new(rel.clone(), d.old.tuple().clone())),
                    old_is_key,
                    new: None,
                    relation: rel,
                })
            }
            LogicalMessage::Truncate(t) => Event::Truncate(TruncateEvent {
                xid: t.xid,
                options: t.options,
                relations: t.relation_oids.iter().map(|o| self.get(*o)).collect::<Result<_>>()?,
            }),
            LogicalMessage::Message(m) => Event::Message(m),
            LogicalMessage::StreamStart(s) => Event::StreamStart(s),
            LogicalMessage::StreamStop => Event::StreamStop,
            LogicalMessage::StreamCommit(c) => Event::StreamCommit(c),
            LogicalMessage::StreamAbort(a) => Event::StreamAbort(a),
            LogicalMessage::BeginPrepare(b) => Event::BeginPrepare(b),
            LogicalMessage::Prepare(p) => Event::Prepare(p),
            LogicalMessage::CommitPrepared(c) => Event::CommitPrepared(c),
            LogicalMessage::RollbackPrepared(r) => Event::RollbackPrepared(r),
            LogicalMessage::StreamPrepare(p) => Event::StreamPrepare(p),
            other => {
                return Err(Error::Decode(pgwal_protocol::DecodeError::UnknownTag {
                    context: "pgoutput message",
                    tag: other.tag(),
                }))
            }
        })
    }
}
