//! Begin, Commit and Origin.

use bytes::{BufMut, BytesMut};

use super::{put_span, read_span};
use crate::codec::{put_cstr, Reader};
use crate::{DecodeError, Lsn, PgTimestamp};

/// `B`: a transaction begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit time.
    pub commit_time: PgTimestamp,
    /// Transaction id.
    pub xid: u32,
}

impl Begin {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Begin {
            final_lsn: r.lsn("begin.final_lsn")?,
            commit_time: PgTimestamp(r.i64("begin.commit_time")?),
            xid: r.u32("begin.xid")?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u64(self.final_lsn.0);
        buf.put_i64(self.commit_time.0);
        buf.put_u32(self.xid);
    }
}

/// `C`: a transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Flags (currently always 0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End of the commit record: the position to confirm once the
    /// transaction is processed.
    pub end_lsn: Lsn,
    /// Commit time.
    pub commit_time: PgTimestamp,
}

impl Commit {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        let flags = r.u8("commit.flags")?;
        let (commit_lsn, end_lsn, commit_time) = read_span(
            r,
            ["commit.commit_lsn", "commit.end_lsn", "commit.commit_time"],
        )?;
        Ok(Commit {
            flags,
            commit_lsn,
            end_lsn,
            commit_time,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.flags);
        put_span(buf, self.commit_lsn, self.end_lsn, self.commit_time);
    }
}

/// `O`: the transaction came from a replication origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Commit LSN on the origin server.
    pub commit_lsn: Lsn,
    /// Origin name.
    pub name: String,
}

impl Origin {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Origin {
            commit_lsn: r.lsn("origin.commit_lsn")?,
            name: r.cstr("origin.name")?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u64(self.commit_lsn.0);
        put_cstr(buf, &self.name);
    }
}
