//! Typed change events with relation metadata resolved.

use std::sync::Arc;

use pgwal_protocol::pgoutput::{
    Begin, BeginPrepare, ColumnValue, Commit, CommitPrepared, LogicalDecodingMessage, Origin,
    Prepare, Relation, RelationColumn, RollbackPrepared, StreamAbort, StreamCommit, StreamStart,
    TupleData, TypeMessage,
};
use pgwal_protocol::Lsn;

/// A row image bound to its relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    relation: Arc<Relation>,
    values: TupleData,
}

impl Row {
    /// A row of `relation` with `values` in its column order (one per
    /// column); for rows read outside the stream, such as a snapshot's.
    pub fn new(relation: Arc<Relation>, values: TupleData) -> Row {
        Row { relation, values }
    }

    /// The relation this row belongs to.
    pub fn relation(&self) -> &Arc<Relation> {
        &self.relation
    }

    /// Column values in relation column order.
    pub fn values(&self) -> &[ColumnValue] {
        &self.values.0
    }

    /// The raw tuple.
    pub fn tuple(&self) -> &TupleData {
        &self.values
    }

    /// The value of column `name`.
    pub fn get(&self, name: &str) -> Option<&ColumnValue> {
        let i = self.relation.columns.iter().position(|c| c.name == name)?;
        self.values.0.get(i)
    }

    /// The text value of column `name` (`None` for NULL, binary, unchanged
    /// TOAST or a missing column).
    pub fn text(&self, name: &str) -> Option<&str> {
        self.get(name)?.as_str()
    }

    /// Pairs of column description and value.
    pub fn iter(&self) -> impl Iterator<Item = (&RelationColumn, &ColumnValue)> {
        self.relation.columns.iter().zip(self.values.0.iter())
    }

    /// Whether any column is an unchanged TOAST value that could not be
    /// filled in from an old row image.
    pub fn has_unchanged_toast(&self) -> bool {
        self.values.0.contains(&ColumnValue::UnchangedToast)
    }
}

/// An insert, update or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Change {
    /// The (sub)transaction xid, for changes of a streamed transaction.
    pub xid: Option<u32>,
    /// The change's own WAL position (the walsender sends each change at
    /// the position of its WAL record). Changes of one transaction come in
    /// increasing positions; across transactions they do not (transactions
    /// come in commit order, their records interleave in the WAL), so
    /// order by (commit position, this) to order changes as the stream
    /// delivers them.
    pub lsn: Lsn,
    /// The table.
    pub relation: Arc<Relation>,
    /// Old image: the key only, or the full row with `REPLICA IDENTITY FULL`.
    pub old: Option<Row>,
    /// Whether `old` holds only key columns (other columns are NULL).
    pub old_is_key: bool,
    /// New image (insert, update). For updates, unchanged TOAST columns are
    /// filled from a full old image when the server sent one; otherwise they
    /// stay [`ColumnValue::UnchangedToast`].
    pub new: Option<Row>,
}

impl Change {
    /// An insert of `new` at `lsn`, for rows read outside the stream (a
    /// snapshot's), so that they go through the same encoders.
    pub fn insert(lsn: Lsn, new: Row) -> Change {
        Change {
            xid: None,
            lsn,
            relation: new.relation().clone(),
            old: None,
            old_is_key: false,
            new: Some(new),
        }
    }
}

/// Tables truncated together.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TruncateEvent {
    /// The (sub)transaction xid, in a streamed transaction.
    pub xid: Option<u32>,
    /// The truncate's WAL position (see [`Change::lsn`]).
    pub lsn: Lsn,
    /// 1 = CASCADE, 2 = RESTART IDENTITY.
    pub options: u8,
    /// The tables.
    pub relations: Vec<Arc<Relation>>,
}

/// One event of a logical replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A transaction begins.
    Begin(Begin),
    /// A transaction commits; acknowledge [`Commit::end_lsn`] once processed.
    Commit(Commit),
    /// The transaction's replication origin.
    Origin(Origin),
    /// A table's (new) schema; later changes of it refer to this.
    Relation(Arc<Relation>),
    /// A user-defined type.
    Type(TypeMessage),
    /// A row was inserted.
    Insert(Change),
    /// A row was updated.
    Update(Change),
    /// A row was deleted.
    Delete(Change),
    /// Tables were truncated.
    Truncate(TruncateEvent),
    /// A `pg_logical_emit_message` message.
    Message(LogicalDecodingMessage),
    /// A block of a streamed (in-progress) transaction starts.
    StreamStart(StreamStart),
    /// The block ends.
    StreamStop,
    /// A streamed transaction commits.
    StreamCommit(StreamCommit),
    /// A streamed transaction or one of its subtransactions aborts.
    StreamAbort(StreamAbort),
    /// A prepared transaction begins.
    BeginPrepare(BeginPrepare),
    /// The transaction was prepared.
    Prepare(Prepare),
    /// A prepared transaction was committed.
    CommitPrepared(CommitPrepared),
    /// A prepared transaction was rolled back.
    RollbackPrepared(RollbackPrepared),
    /// A streamed transaction was prepared.
    StreamPrepare(Prepare),
    /// The connection was lost and re-established; the stream restarts at
    /// `restart_lsn`, the last acknowledged position. Discard any partial
    /// transaction: everything after `restart_lsn` is delivered again.
    Reconnected {
        /// Where the new session starts.
        restart_lsn: Lsn,
    },
    /// Only with [`StreamConfig::heartbeat`](crate::StreamConfig::heartbeat):
    /// the server's WAL reached `wal_end` and every transaction that ended
    /// before it was delivered before this event (or had nothing for the
    /// publications). Acknowledge `wal_end` once the consumer's own record
    /// holds it.
    Heartbeat {
        /// The server's WAL position from its keepalive.
        wal_end: Lsn,
    },
}

impl Event {
    /// Sets a row change's or truncate's own position from the XLogData
    /// that carried it.
    pub(crate) fn set_wal_position(&mut self, lsn: Lsn) {
        match self {
            Event::Insert(c) | Event::Update(c) | Event::Delete(c) => c.lsn = lsn,
            Event::Truncate(t) => t.lsn = lsn,
            _ => {}
        }
    }

    /// The position to acknowledge once this event, and everything before
    /// it, is durably processed; `None` for events that end nothing.
    pub fn ack_lsn(&self) -> Option<Lsn> {
        match self {
            Event::Commit(c) => Some(c.end_lsn),
            Event::StreamCommit(c) => Some(c.end_lsn),
            Event::Prepare(p) | Event::StreamPrepare(p) => Some(p.end_lsn),
            Event::CommitPrepared(c) => Some(c.end_lsn),
            Event::RollbackPrepared(r) => Some(r.rollback_end_lsn),
            Event::Message(m) if !m.is_transactional() => Some(m.lsn),
            Event::StreamAbort(a) if a.xid == a.subxid => a.abort.map(|(lsn, _)| lsn),
            Event::Heartbeat { wal_end } => Some(*wal_end),
            _ => None,
        }
    }
}
