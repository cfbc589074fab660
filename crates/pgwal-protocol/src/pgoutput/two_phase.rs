//! Two-phase commit messages (protocol 3+).

use bytes::{BufMut, BytesMut};

use super::{put_span, read_span};
use crate::codec::{put_cstr, Reader};
use crate::{DecodeError, Lsn, PgTimestamp};

/// Reads the body that Begin Prepare, Prepare (after its flags) and Commit
/// Prepared (after its flags) share: `lsn, end_lsn, timestamp, xid, gid`.
/// `fields` names the five in errors.
fn read_prepared(
    r: &mut Reader,
    fields: [&'static str; 5],
) -> Result<(Lsn, Lsn, PgTimestamp, u32, String), DecodeError> {
    let [lsn, end_lsn, time, xid, gid] = fields;
    let (lsn, end_lsn, time) = read_span(r, [lsn, end_lsn, time])?;
    Ok((lsn, end_lsn, time, r.u32(xid)?, r.cstr(gid)?))
}

/// Writes what [`read_prepared`] reads.
fn put_prepared(
    buf: &mut BytesMut,
    lsn: Lsn,
    end_lsn: Lsn,
    time: PgTimestamp,
    xid: u32,
    gid: &str,
) {
    put_span(buf, lsn, end_lsn, time);
    buf.put_u32(xid);
    put_cstr(buf, gid);
}

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
        let (prepare_lsn, end_lsn, prepare_time, xid, gid) = read_prepared(
            r,
            [
                "begin_prepare.prepare_lsn",
                "begin_prepare.end_lsn",
                "begin_prepare.time",
                "begin_prepare.xid",
                "begin_prepare.gid",
            ],
        )?;
        Ok(BeginPrepare {
            prepare_lsn,
            end_lsn,
            prepare_time,
            xid,
            gid,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_prepared(
            buf,
            self.prepare_lsn,
            self.end_lsn,
            self.prepare_time,
            self.xid,
            &self.gid,
        );
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
        let flags = r.u8("prepare.flags")?;
        let (prepare_lsn, end_lsn, prepare_time, xid, gid) = read_prepared(
            r,
            [
                "prepare.prepare_lsn",
                "prepare.end_lsn",
                "prepare.time",
                "prepare.xid",
                "prepare.gid",
            ],
        )?;
        Ok(Prepare {
            flags,
            prepare_lsn,
            end_lsn,
            prepare_time,
            xid,
            gid,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.flags);
        put_prepared(
            buf,
            self.prepare_lsn,
            self.end_lsn,
            self.prepare_time,
            self.xid,
            &self.gid,
        );
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
        let flags = r.u8("commit_prepared.flags")?;
        let (commit_lsn, end_lsn, commit_time, xid, gid) = read_prepared(
            r,
            [
                "commit_prepared.commit_lsn",
                "commit_prepared.end_lsn",
                "commit_prepared.time",
                "commit_prepared.xid",
                "commit_prepared.gid",
            ],
        )?;
        Ok(CommitPrepared {
            flags,
            commit_lsn,
            end_lsn,
            commit_time,
            xid,
            gid,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.flags);
        put_prepared(
            buf,
            self.commit_lsn,
            self.end_lsn,
            self.commit_time,
            self.xid,
            &self.gid,
        );
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
