//! Relation cache and conversion of pgoutput messages into [`Event`]s.

use std::collections::HashMap;
use std::sync::Arc;

use pgwal_protocol::pgoutput::{ColumnValue, LogicalMessage, OldTuple, Relation, TupleData};

use crate::error::{Error, Result};
use crate::event::{Change, Event, Row, TruncateEvent};

/// Relations described so far, by OID, and optionally the last row image
/// seen per key, to fill in unchanged TOAST values.
#[derive(Debug, Default)]
pub(crate) struct RelationCache {
    by_oid: HashMap<u32, Arc<Relation>>,
    toast: Option<ToastCache>,
}

/// Last known new-row image per (relation, key), bounded in entries.
#[derive(Debug)]
struct ToastCache {
    max: usize,
    rows: HashMap<(u32, Vec<ColumnValue>), TupleData>,
}

impl ToastCache {
    fn key(rel: &Relation, t: &TupleData) -> Option<(u32, Vec<ColumnValue>)> {
        let k: Vec<ColumnValue> = rel
            .columns
            .iter()
            .zip(t.0.iter())
            .filter(|(c, _)| c.is_key())
            .map(|(_, v)| v.clone())
            .collect();
        (!k.is_empty() && !k.iter().any(|v| matches!(v, ColumnValue::UnchangedToast)))
            .then_some((rel.oid, k))
    }

    fn fill(&self, rel: &Relation, new: &mut TupleData) {
        if !new.0.contains(&ColumnValue::UnchangedToast) {
            return;
        }
        if let Some(prev) = Self::key(rel, new).and_then(|k| self.rows.get(&k)) {
            merge_toast(new, prev);
        }
    }

    fn remember(&mut self, rel: &Relation, t: &TupleData) {
        let Some(k) = Self::key(rel, t) else { return };
        if self.rows.len() >= self.max && !self.rows.contains_key(&k) {
            // Bounded: forget an arbitrary entry.
            if let Some(victim) = self.rows.keys().next().cloned() {
                self.rows.remove(&victim);
            }
        }
        if self.max > 0 {
            self.rows.insert(k, t.clone());
        }
    }

    fn forget(&mut self, rel: &Relation, t: &TupleData) {
        if let Some(k) = Self::key(rel, t) {
            self.rows.remove(&k);
        }
    }

    fn forget_relation(&mut self, oid: u32) {
        self.rows.retain(|(o, _), _| *o != oid);
    }
}

fn merge_toast(new: &mut TupleData, old: &TupleData) {
    for (n, o) in new.0.iter_mut().zip(old.0.iter()) {
        if *n == ColumnValue::UnchangedToast
            && matches!(o, ColumnValue::Text(_) | ColumnValue::Binary(_))
        {
            *n = o.clone();
        }
    }
}

impl RelationCache {
    /// Remember up to `max_rows` row images to fill unchanged TOAST values.
    pub(crate) fn with_toast_cache(max_rows: usize) -> Self {
        RelationCache {
            by_oid: HashMap::new(),
            toast: (max_rows > 0).then(|| ToastCache {
                max: max_rows,
                rows: HashMap::new(),
            }),
        }
    }

    fn get(&self, oid: u32) -> Result<Arc<Relation>> {
        self.by_oid
            .get(&oid)
            .cloned()
            .ok_or(Error::UnknownRelation(oid))
    }

    /// Converts one decoded message, updating the cache on Relation messages.
    pub(crate) fn event_from(&mut self, m: LogicalMessage) -> Result<Event> {
        Ok(match m {
            LogicalMessage::Begin(b) => Event::Begin(b),
            LogicalMessage::Commit(c) => Event::Commit(c),
            LogicalMessage::Origin(o) => Event::Origin(o),
            LogicalMessage::Relation(r) => {
                let r = Arc::new(r);
                if let Some(tc) = &mut self.toast {
                    tc.forget_relation(r.oid);
                }
                self.by_oid.insert(r.oid, r.clone());
                Event::Relation(r)
            }
            LogicalMessage::Type(t) => Event::Type(t),
            LogicalMessage::Insert(i) => {
                let rel = self.get(i.relation_oid)?;
                if let Some(tc) = &mut self.toast {
                    tc.remember(&rel, &i.new);
                }
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
                if let Some(tc) = &mut self.toast {
                    tc.fill(&rel, &mut new);
                    if let Some(o) = old.as_ref().filter(|_| old_is_key) {
                        tc.forget(&rel, o);
                    }
                    tc.remember(&rel, &new);
                }
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
                if let Some(tc) = &mut self.toast {
                    tc.forget(&rel, d.old.tuple());
                }
                Event::Delete(Change {
                    xid: d.xid,
                    old: Some(Row::new(rel.clone(), d.old.tuple().clone())),
                    old_is_key,
                    new: None,
                    relation: rel,
                })
            }
            LogicalMessage::Truncate(t) => Event::Truncate(TruncateEvent {
                relations: {
                    if let Some(tc) = &mut self.toast {
                        for o in &t.relation_oids {
                            tc.forget_relation(*o);
                        }
                    }
                    t.relation_oids
                        .iter()
                        .map(|o| self.get(*o))
                        .collect::<Result<_>>()?
                },
                xid: t.xid,
                options: t.options,
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
