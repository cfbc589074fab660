//! The `pgoutput` logical decoding output plugin's messages, versions 1 to 4.
//!
//! | version | server | adds |
//! |---|---|---|
//! | 1 | 10+ | transactions, relations, types, DML, truncate, origin, messages |
//! | 2 | 14+ | streaming of in-progress transactions (`streaming 'on'`) |
//! | 3 | 15+ | two-phase commit (`two_phase 'on'`) |
//! | 4 | 16+ | parallel streaming (`streaming 'parallel'`): abort LSN and time |
//!
//! A [`Decoder`] turns the payload of each XLogData message into a
//! [`LogicalMessage`]; [`LogicalMessage::encode`] produces the exact bytes
//! pgoutput would send. The decoder keeps one bit of state: whether it is
//! inside a Stream Start/Stream Stop block, where data messages carry the
//! (sub)transaction xid.
//!
//! Column values keep their wire form ([`ColumnValue`]); an unchanged TOASTed
//! column is [`ColumnValue::UnchangedToast`], never dropped and never confused
//! with NULL.

mod change;
mod decoder;
mod logical_message;
mod message;
mod relation;
mod stream;
mod transaction;
mod tuple;
mod two_phase;
mod type_message;

pub use change::{Delete, Insert, OldTuple, Truncate, Update};
pub use decoder::Decoder;
pub use logical_message::LogicalDecodingMessage;
pub use message::LogicalMessage;
pub use relation::{Relation, RelationColumn, ReplicaIdentity};
pub use stream::{StreamAbort, StreamCommit, StreamStart};
pub use transaction::{Begin, Commit, Origin};
pub use tuple::{ColumnValue, TupleData};
pub use two_phase::{BeginPrepare, CommitPrepared, Prepare, RollbackPrepared};
pub use type_message::TypeMessage;

use bytes::{BufMut, BytesMut};

use crate::codec::Reader;
use crate::{DecodeError, Lsn, PgTimestamp};

/// Reads the leading xid that data messages carry inside a streaming block.
fn read_stream_xid(r: &mut Reader, streamed: bool) -> Result<Option<u32>, DecodeError> {
    if streamed {
        Ok(Some(r.u32("xid")?))
    } else {
        Ok(None)
    }
}

fn put_stream_xid(buf: &mut BytesMut, xid: Option<u32>) {
    if let Some(x) = xid {
        buf.put_u32(x);
    }
}

/// Reads the `lsn, end_lsn, timestamp` run that Commit, Stream Commit, Begin
/// Prepare, Prepare and Commit Prepared carry: a record's LSN, the end of
/// that record and its time. `fields` names the three in errors.
fn read_span(
    r: &mut Reader,
    fields: [&'static str; 3],
) -> Result<(Lsn, Lsn, PgTimestamp), DecodeError> {
    let [lsn, end_lsn, time] = fields;
    Ok((r.lsn(lsn)?, r.lsn(end_lsn)?, PgTimestamp(r.i64(time)?)))
}

/// Writes what [`read_span`] reads.
fn put_span(buf: &mut BytesMut, lsn: Lsn, end_lsn: Lsn, time: PgTimestamp) {
    buf.put_u64(lsn.0);
    buf.put_u64(end_lsn.0);
    buf.put_i64(time.0);
}
