//! Streaming of in-progress transactions (protocol 2+).

use bytes::{BufMut, BytesMut};

use super::{put_span, read_span};
use crate::codec::Reader;
use crate::{DecodeError, Lsn, PgTimestamp};

/// `S`: a block of a streamed transaction starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    /// Top-level transaction id.
    pub xid: u32,
    /// Whether this is the transaction's first block.
    pub first_segment: bool,
}

impl StreamStart {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(StreamStart {
            xid: r.u32("stream_start.xid")?,
            first_segment: r.u8("stream_start.first")? == 1,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u32(self.xid);
        buf.put_u8(self.first_segment as u8);
    }
}

/// `c`: a streamed transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCommit {
    /// Top-level transaction id.
    pub xid: u32,
    /// Flags (currently 0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End of the commit record.
    pub end_lsn: Lsn,
    /// Commit time.
    pub commit_time: PgTimestamp,
}

impl StreamCommit {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        let xid = r.u32("stream_commit.xid")?;
        let flags = r.u8("stream_commit.flags")?;
        let (commit_lsn, end_lsn, commit_time) = read_span(
            r,
            [
                "stream_commit.commit_lsn",
                "stream_commit.end_lsn",
                "stream_commit.commit_time",
            ],
        )?;
        Ok(StreamCommit {
            xid,
            flags,
            commit_lsn,
            end_lsn,
            commit_time,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u32(self.xid);
        buf.put_u8(self.flags);
        put_span(buf, self.commit_lsn, self.end_lsn, self.commit_time);
    }
}

/// `A`: a streamed (sub)transaction aborts.
///
/// When `subxid == xid` the whole transaction aborted; otherwise only the
/// changes of subtransaction `subxid` (a rolled-back savepoint) are discarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    /// Top-level transaction id.
    pub xid: u32,
    /// Aborted (sub)transaction id.
    pub subxid: u32,
    /// Abort LSN and time: present with `streaming 'parallel'` (protocol 4).
    pub abort: Option<(Lsn, PgTimestamp)>,
}

impl StreamAbort {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        let xid = r.u32("stream_abort.xid")?;
        let subxid = r.u32("stream_abort.subxid")?;
        let abort = if r.remaining() > 0 {
            Some((
                r.lsn("stream_abort.abort_lsn")?,
                PgTimestamp(r.i64("stream_abort.abort_time")?),
            ))
        } else {
            None
        };
        Ok(StreamAbort { xid, subxid, abort })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u32(self.xid);
        buf.put_u32(self.subxid);
        if let Some((lsn, t)) = self.abort {
            buf.put_u64(lsn.0);
            buf.put_i64(t.0);
        }
    }
}
