//! The `w` (XLogData) message.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::Reader;
use crate::{DecodeError, Lsn, PgTimestamp};

/// A chunk of WAL data; for logical replication, one output plugin message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    /// WAL position of the start of `data`.
    pub wal_start: Lsn,
    /// The current end of WAL on the server.
    pub wal_end: Lsn,
    /// The server's clock when sending.
    pub server_time: PgTimestamp,
    /// The payload (a pgoutput message for logical replication).
    pub data: Bytes,
}

impl XLogData {
    pub(crate) fn decode_body(body: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        Ok(XLogData {
            wal_start: r.lsn("XLogData.wal_start")?,
            wal_end: r.lsn("XLogData.wal_end")?,
            server_time: PgTimestamp(r.i64("XLogData.server_time")?),
            data: r.rest(),
        })
    }

    pub(crate) fn encode_body(&self, buf: &mut BytesMut) {
        buf.put_u64(self.wal_start.0);
        buf.put_u64(self.wal_end.0);
        buf.put_i64(self.server_time.0);
        buf.put_slice(&self.data);
    }
}
