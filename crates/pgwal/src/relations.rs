//! Relation cache and conversion of pgoutput messages into [`Event`]s.

use std::collections::HashMap;
use std::sync::Arc;

use pgwal_protocol::pgoutput::{ColumnValue, LogicalMessage, OldTuple, Relation, TupleData};

use crate::error::{Error, Result};
use crate::event::{Change, Event, Row, TruncateEvent};
use pgwal_protocol::Lsn;

/// Relations described so far, by OID, and optionally the last row image
/// seen per key, to fill in unchanged TOAST values.
#[derive(Debug, Default)]
pub(crate) struct RelationCache {
    by_oid: HashMap<u32, Arc<Relation>>,
    toast: Option<ToastCache>,
}

/// Last known new-row image per (relation, key), bounded in entries.
///
/// Only committed images are kept in `rows`.  A transaction's own images go
/// to a log of its own until it ends: pgoutput sends streamed transactions
/// (with their rolled-back subtransactions) and prepared ones before they
/// commit, and an image from a transaction that then aborts must never fill
/// a later change.  A plain transaction (`Begin` … `Commit`) is sent only
/// once committed, so its images go straight to `rows`.
#[derive(Debug)]
struct ToastCache {
    max: usize,
    rows: HashMap<CacheKey, TupleData>,
    /// Open transactions' images: streamed ones by top-level xid, prepared
    /// ones by xid until `CommitPrepared` or `RollbackPrepared`.
    open: HashMap<u32, TxnLog>,
    /// Where changes go now.
    current: Scope,
}

type CacheKey = (u32, Vec<ColumnValue>);

/// What an open transaction wrote, in order: `(subxid, key, image)`, where
/// `None` is a row deleted or moved to another key.
#[derive(Debug, Default)]
struct TxnLog {
    entries: Vec<(u32, CacheKey, Option<TupleData>)>,
    /// Set once the log outgrew the cache's bound: the entries are dropped,
    /// and these relations' committed images are forgotten at commit
    /// (and never used for this transaction meanwhile).
    overflowed: Option<std::collections::HashSet<u32>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scope {
    /// Outside a transaction, or in a plain one: straight to `rows`.
    Committed,
    /// Inside the transaction with this xid (streamed, or being prepared).
    Open(u32),
}

impl TxnLog {
    fn lookup(&self, k: &CacheKey) -> Option<Option<&TupleData>> {
        if self.overflowed.as_ref().is_some_and(|r| r.contains(&k.0)) {
            return Some(None);
        }
        self.entries
            .iter()
            .rev()
            .find(|(_, key, _)| key == k)
            .map(|(_, _, t)| t.as_ref())
    }

    fn push(&mut self, max: usize, sub: u32, k: CacheKey, t: Option<TupleData>) {
        if let Some(rels) = &mut self.overflowed {
            rels.insert(k.0);
            return;
        }
        if self.entries.len() >= max {
            let mut rels: std::collections::HashSet<u32> =
                self.entries.iter().map(|(_, key, _)| key.0).collect();
            rels.insert(k.0);
            self.entries.clear();
            self.overflowed = Some(rels);
            return;
        }
        self.entries.push((sub, k, t));
    }
}

impl ToastCache {
    fn new(max: usize) -> Self {
        ToastCache {
            max,
            rows: HashMap::new(),
            open: HashMap::new(),
            current: Scope::Committed,
        }
    }

    fn key(rel: &Relation, t: &TupleData) -> Option<CacheKey> {
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
        let Some(k) = Self::key(rel, new) else { return };
        let prev = match self.current {
            Scope::Open(xid) => match self.open.get(&xid).and_then(|l| l.lookup(&k)) {
                Some(own) => own,
                None => self.rows.get(&k),
            },
            Scope::Committed => self.rows.get(&k),
        };
        if let Some(prev) = prev {
            merge_toast(new, prev);
        }
    }

    /// Records `t` (or, with `None`, that nothing is known) as the image of
    /// its key, written by (sub)transaction `sub` (0 outside streaming).
    fn record(&mut self, rel: &Relation, t: &TupleData, image: bool, sub: u32) {
        let Some(k) = Self::key(rel, t) else { return };
        match self.current {
            Scope::Open(xid) => {
                let max = self.max;
                self.open
                    .entry(xid)
                    .or_default()
                    .push(max, sub, k, image.then(|| t.clone()));
            }
            Scope::Committed => {
                if image {
                    self.store(k, t.clone());
                } else {
                    self.rows.remove(&k);
                }
            }
        }
    }

    fn store(&mut self, k: CacheKey, t: TupleData) {
        if self.rows.len() >= self.max && !self.rows.contains_key(&k) {
            // Bounded: forget an arbitrary entry.
            if let Some(victim) = self.rows.keys().next().cloned() {
                self.rows.remove(&victim);
            }
        }
        if self.max > 0 {
            self.rows.insert(k, t);
        }
    }

    fn forget_relation(&mut self, oid: u32) {
        self.rows.retain(|(o, _), _| *o != oid);
        for log in self.open.values_mut() {
            log.entries.retain(|(_, (o, _), _)| *o != oid);
        }
    }

    /// The open transaction `xid` committed: its images become the
    /// committed ones.
    fn commit(&mut self, xid: u32) {
        let Some(log) = self.open.remove(&xid) else {
            return;
        };
        if let Some(rels) = log.overflowed {
            for oid in rels {
                self.rows.retain(|(o, _), _| *o != oid);
            }
            return;
        }
        for (_, k, t) in log.entries {
            match t {
                Some(t) => self.store(k, t),
                None => {
                    self.rows.remove(&k);
                }
            }
        }
    }

    /// The open transaction `xid` (`subxid == xid`) or one of its
    /// subtransactions aborted: what it wrote is forgotten.
    fn abort(&mut self, xid: u32, subxid: u32) {
        if subxid == xid {
            self.open.remove(&xid);
        } else if let Some(log) = self.open.get_mut(&xid) {
            log.entries.retain(|(sub, _, _)| *sub != subxid);
        }
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
            toast: (max_rows > 0).then(|| ToastCache::new(max_rows)),
        }
    }

    fn scope(&mut self, s: Scope) {
        if let Some(tc) = &mut self.toast {
            tc.current = s;
        }
    }

    fn get(&self, oid: u32) -> Result<Arc<Relation>> {
        self.by_oid
            .get(&oid)
            .cloned()
            .ok_or(Error::UnknownRelation(oid))
    }

    /// Converts one decoded message, updating the cache on Relation messages.
    /// The event for one message; a change's position is set by the
    /// caller, who has the message's XLogData header
    /// ([`Event::set_wal_position`]).
    pub(crate) fn event_from(&mut self, m: LogicalMessage) -> Result<Event> {
        Ok(match m {
            LogicalMessage::Begin(b) => {
                self.scope(Scope::Committed);
                Event::Begin(b)
            }
            LogicalMessage::Commit(c) => Event::Commit(c),
            LogicalMessage::Origin(o) => Event::Origin(o),
            LogicalMessage::Relation(r) => {
                let r = Arc::new(r);
                // pgoutput describes a relation again in every streamed
                // transaction and after a reconnect; only a changed
                // definition makes the images stale
                let changed = self.by_oid.get(&r.oid).map_or(true, |old| {
                    (
                        &old.namespace,
                        &old.name,
                        old.replica_identity,
                        &old.columns,
                    ) != (&r.namespace, &r.name, r.replica_identity, &r.columns)
                });
                if let Some(tc) = &mut self.toast {
                    if changed {
                        tc.forget_relation(r.oid);
                    }
                }
                self.by_oid.insert(r.oid, r.clone());
                Event::Relation(r)
            }
            LogicalMessage::Type(t) => Event::Type(t),
            LogicalMessage::Insert(i) => {
                let rel = self.get(i.relation_oid)?;
                if let Some(tc) = &mut self.toast {
                    tc.record(&rel, &i.new, true, i.xid.unwrap_or(0));
                }
                Event::Insert(Change {
                    xid: i.xid,
                    lsn: Lsn::INVALID,
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
                    let sub = u.xid.unwrap_or(0);
                    if let Some(o) = old.as_ref().filter(|_| old_is_key) {
                        tc.record(&rel, o, false, sub);
                    }
                    tc.record(&rel, &new, true, sub);
                }
                Event::Update(Change {
                    xid: u.xid,
                    lsn: Lsn::INVALID,
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
                    tc.record(&rel, d.old.tuple(), false, d.xid.unwrap_or(0));
                }
                Event::Delete(Change {
                    xid: d.xid,
                    lsn: Lsn::INVALID,
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
                lsn: Lsn::INVALID,
                options: t.options,
            }),
            LogicalMessage::Message(m) => Event::Message(m),
            // A transaction's images wait in its own log until it ends
            // (ToastCache): streamed and prepared transactions may abort.
            LogicalMessage::StreamStart(s) => {
                self.scope(Scope::Open(s.xid));
                Event::StreamStart(s)
            }
            LogicalMessage::StreamStop => {
                self.scope(Scope::Committed);
                Event::StreamStop
            }
            LogicalMessage::StreamCommit(c) => {
                if let Some(tc) = &mut self.toast {
                    tc.commit(c.xid);
                }
                Event::StreamCommit(c)
            }
            LogicalMessage::StreamAbort(a) => {
                if let Some(tc) = &mut self.toast {
                    tc.abort(a.xid, a.subxid);
                }
                Event::StreamAbort(a)
            }
            LogicalMessage::BeginPrepare(b) => {
                self.scope(Scope::Open(b.xid));
                Event::BeginPrepare(b)
            }
            LogicalMessage::Prepare(p) => {
                self.scope(Scope::Committed);
                Event::Prepare(p)
            }
            LogicalMessage::CommitPrepared(c) => {
                if let Some(tc) = &mut self.toast {
                    tc.commit(c.xid);
                }
                Event::CommitPrepared(c)
            }
            LogicalMessage::RollbackPrepared(r) => {
                if let Some(tc) = &mut self.toast {
                    tc.abort(r.xid, r.xid);
                }
                Event::RollbackPrepared(r)
            }
            LogicalMessage::StreamPrepare(p) => {
                self.scope(Scope::Committed);
                Event::StreamPrepare(p)
            }
            other => {
                return Err(Error::Decode(pgwal_protocol::DecodeError::UnknownTag {
                    context: "pgoutput message",
                    tag: other.tag(),
                }))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use pgwal_protocol::pgoutput::{
        BeginPrepare, Insert, Prepare, RelationColumn, ReplicaIdentity, RollbackPrepared,
        StreamAbort, StreamCommit, StreamStart, Update,
    };
    use pgwal_protocol::{Lsn, PgTimestamp};

    fn rel() -> LogicalMessage {
        let col = |flags, name: &str| RelationColumn {
            flags,
            name: name.into(),
            type_oid: 25,
            type_modifier: -1,
        };
        LogicalMessage::Relation(Relation {
            xid: None,
            oid: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![col(1, "id"), col(0, "big")],
        })
    }

    fn text(s: &str) -> ColumnValue {
        ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn insert(big: &str) -> LogicalMessage {
        LogicalMessage::Insert(Insert {
            xid: None,
            relation_oid: 1,
            new: TupleData(vec![text("1"), text(big)]),
        })
    }

    fn update(xid: Option<u32>, big: Option<&str>) -> LogicalMessage {
        LogicalMessage::Update(Update {
            xid,
            relation_oid: 1,
            old: None,
            new: TupleData(vec![
                text("1"),
                big.map_or(ColumnValue::UnchangedToast, text),
            ]),
        })
    }

    /// The value an update with an unchanged TOAST column gets.
    fn filled(c: &mut RelationCache, xid: Option<u32>) -> Option<String> {
        match c.event_from(update(xid, None)).unwrap() {
            Event::Update(ch) => ch.new.unwrap().text("big").map(str::to_owned),
            _ => unreachable!(),
        }
    }

    fn cache() -> RelationCache {
        let mut c = RelationCache::with_toast_cache(10);
        c.event_from(rel()).unwrap();
        c.event_from(insert("v1")).unwrap();
        c
    }

    fn start(xid: u32) -> LogicalMessage {
        LogicalMessage::StreamStart(StreamStart {
            xid,
            first_segment: false,
        })
    }

    fn stream_commit(xid: u32) -> LogicalMessage {
        LogicalMessage::StreamCommit(StreamCommit {
            xid,
            flags: 0,
            commit_lsn: Lsn(1),
            end_lsn: Lsn(2),
            commit_time: PgTimestamp(0),
        })
    }

    #[test]
    fn a_rolled_back_savepoint_does_not_fill() {
        let mut c = cache();
        c.event_from(start(100)).unwrap();
        c.event_from(update(Some(101), Some("v2"))).unwrap();
        // the subtransaction sees its own value until it aborts
        assert_eq!(filled(&mut c, Some(101)).as_deref(), Some("v2"));
        c.event_from(LogicalMessage::StreamAbort(StreamAbort {
            xid: 100,
            subxid: 101,
            abort: None,
        }))
        .unwrap();
        assert_eq!(filled(&mut c, Some(100)).as_deref(), Some("v1"));
        c.event_from(LogicalMessage::StreamStop).unwrap();
        // others see committed values only, also while it is open
        assert_eq!(filled(&mut c, None).as_deref(), Some("v1"));
        c.event_from(start(100)).unwrap();
        c.event_from(update(Some(100), Some("v3"))).unwrap();
        c.event_from(LogicalMessage::StreamStop).unwrap();
        assert_eq!(filled(&mut c, None).as_deref(), Some("v1"));
        c.event_from(stream_commit(100)).unwrap();
        assert_eq!(filled(&mut c, None).as_deref(), Some("v3"));
    }

    #[test]
    fn an_aborted_streamed_transaction_does_not_fill() {
        let mut c = cache();
        c.event_from(start(100)).unwrap();
        c.event_from(update(Some(100), Some("v2"))).unwrap();
        c.event_from(LogicalMessage::StreamStop).unwrap();
        c.event_from(LogicalMessage::StreamAbort(StreamAbort {
            xid: 100,
            subxid: 100,
            abort: None,
        }))
        .unwrap();
        assert_eq!(filled(&mut c, None).as_deref(), Some("v1"));
    }

    #[test]
    fn a_rolled_back_prepared_transaction_does_not_fill() {
        let mut c = cache();
        c.event_from(LogicalMessage::BeginPrepare(BeginPrepare {
            prepare_lsn: Lsn(1),
            end_lsn: Lsn(2),
            prepare_time: PgTimestamp(0),
            xid: 200,
            gid: "g".into(),
        }))
        .unwrap();
        c.event_from(update(None, Some("v2"))).unwrap();
        c.event_from(LogicalMessage::Prepare(Prepare {
            flags: 0,
            prepare_lsn: Lsn(1),
            end_lsn: Lsn(2),
            prepare_time: PgTimestamp(0),
            xid: 200,
            gid: "g".into(),
        }))
        .unwrap();
        c.event_from(LogicalMessage::RollbackPrepared(RollbackPrepared {
            flags: 0,
            prepare_end_lsn: Lsn(2),
            rollback_end_lsn: Lsn(3),
            prepare_time: PgTimestamp(0),
            rollback_time: PgTimestamp(0),
            xid: 200,
            gid: "g".into(),
        }))
        .unwrap();
        assert_eq!(filled(&mut c, None).as_deref(), Some("v1"));
    }

    #[test]
    fn an_overflowing_transaction_fills_nothing_it_touched() {
        let mut c = RelationCache::with_toast_cache(2);
        c.event_from(rel()).unwrap();
        c.event_from(insert("v1")).unwrap();
        c.event_from(start(100)).unwrap();
        for _ in 0..3 {
            c.event_from(update(Some(100), Some("v2"))).unwrap();
        }
        assert_eq!(filled(&mut c, Some(100)), None);
        c.event_from(LogicalMessage::StreamStop).unwrap();
        c.event_from(stream_commit(100)).unwrap();
        assert_eq!(filled(&mut c, None), None);
    }

    #[test]
    fn the_same_relation_described_again_keeps_the_images() {
        let mut c = cache();
        c.event_from(rel()).unwrap();
        assert_eq!(filled(&mut c, None).as_deref(), Some("v1"));
    }
}
