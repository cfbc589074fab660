//! Two-phase commit messages (protocol 3+).

use bytes::{BufMut, BytesMut};

use crate::codec::{put_cstr, Reader};
use crate::{DecodeError, Lsn, PgTimestamp};

/// `b`: a prepared transaction begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    /// LSN of the prepare record.
    pub prepare_lsn: Lsn,
    /// End of the prepare record.
    pub end_lsn: Lsn,
    /// Prepare time.
    pub prepare_time: PgTimestamp,
    /// Transaction id.
    pub xid: u32,
    /// Global transaction identifier.
    pub gid: String,
}

impl BeginPrepare {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(BeginPrepare {
            prepare_lsn: r.lsn("begin_prepare.prepare_lsn")?,
            end_lsn: r.lsn("begin_prepare.end_lsn")?,
            prepare_time: PgTimestamp(r.i64("begin_prepare.time")?),
            xid: r.u32("begin_prepare.xid")?,
            gid: r.cstr("begin_prepare.gid")?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u64(self.prepare_lsn.0);
        buf.put_u64(self.end_lsn.0);
        buf.put_i64(self.prepare_time.0);
        buf.put_u32(self.xid);
        put_cstr(buf, &self.gid);
    }
}

/// `P` (Prepare) or `p` (Stream Prepare): a transaction was prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    /// Flags (currently 0).
    pub flags: u8,
    /// LSN of the prepare record.
    pub prepare_lsn: Lsn,
    /// End of the prepare record.
    pub end_lsn: Lsn,
    /// Prepare time.
    pub prepare_time: PgTimestamp,
    /// Transaction id.
    pub xid: u32,
    /// Global transaction identifier.
    pub gid: String,
}

impl Prepare {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Prepare {
            flags: r.u8("prepare.flags")?,
            prepare_lsn: r.lsn("prepare.prepare_lsn")?,
            end_lsn: r.lsn("prepare.end_lsn")?,
            prepare_time: PgTimestamp(r.i64("prepare.time")?),
            xid: r.u32("prepare.xid")?,
            gid: r.cstr("prepare.gid")?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.flags);
        buf.put_u64(self.prepare_lsn.0);
        buf.put_u64(self.end_lsn.0);
        buf.put_i64(self.prepare_time.0);
        buf.put_u32(self.xid);
        put_cstr(buf, &self.gid);
    }
}

/// `K`: a prepared transaction was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    /// Flags (currently 0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End of the commit record.
    pub end_lsn: Lsn,
    /// Commit time.
    pub commit_time: PgTimestamp,
    /// Transaction id.
    pub xid: u32,
    /// Global transaction identifier.
    pub gid: String,
}

impl CommitPrepared {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CommitPrepared {
            flags: r.u8("commit_prepared.flags")?,
            commit_lsn: r.lsn("commit_prepared.commit_lsn")?,
            end_lsn: r.lsn("commit_prepared.end_lsn")?,
            commit_time: PgTimestamp(r.i64("commit_prepared.time")?),
            xid: r.u32("commit_prepared.xid")?,
            gid: r.cstr("commit_prepared.gid")?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.flags);
        buf.put_u64(self.commit_lsn.0);
        buf.put_u64(self.end_lsn.0);
        buf.put_i64(self.commit_time.0);
        buf.put_u32(self.xid);
        put_cstr(buf, &self.gid);
    }
}

/// `r`: a prepared transaction was rolled back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    /// Flags (currently 0).
    pub flags: u8,
    /// End of the prepare record.
    pub prepare_end_lsn: Lsn,
    /// End of the rollback record.
    pub rollback_end_lsn: Lsn,
    /// Prepare time.
    pub prepare_time: PgTimestamp,
    /// Rollback time.
    pub rollback_time: PgTimestamp,
    /// Transaction id.
    pub xid: u32,
    /// Global transaction identifier.
    pub gid: String,
}

impl RollbackPrepared {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(RollbackPrepared {
            flags: r.u8("rollback_prepared.flags")?,
            prepare_end_lsn: r.lsn("rollback_prepared.prepare_end_lsn")?,
            rollback_end_lsn: r.lsn("rollback_prepared.rollback_end_lsn")?,
            prepare_time: PgTimestamp(r.i64("rollback_prepared.prepare_time")?),
            rollback_time: PgTimestamp(r.i64("rollback_prepared.rollback_time")?),
            xid: r.u32("rollback_prepared.xid")?,
            gid: r.cstr("rollback_prepared.gid")?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.flags);
        buf.put_u64(self.prepare_end_lsn.0);
        buf.put_u64(self.rollback_end_lsn.0);
        buf.put_i64(self.prepare_time.0);
        buf.put_i64(self.rollback_time.0);
        buf.put_u32(self.xid);
        put_cstr(buf, &self.gid);
    }
}
