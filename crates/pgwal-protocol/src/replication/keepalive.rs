//! The `k` (primary keepalive) message.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::Reader;
use crate::{DecodeError, Lsn, PgTimestamp};

/// The server's periodic heartbeat.
///
/// `wal_end` is the server's current WAL end. When the client has acknowledged
/// everything it was sent, that position is safe to confirm: it lets an idle
/// slot advance past WAL that contains nothing for the publication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrimaryKeepalive {
    /// The current end of WAL on the server.
    pub wal_end: Lsn,
    /// The server's clock when sending.
    pub server_time: PgTimestamp,
    /// The server asks for an immediate status update.
    pub reply_requested: bool,
}

impl PrimaryKeepalive {
    pub(crate) fn decode_body(body: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let k = PrimaryKeepalive {
            wal_end: r.lsn("keepalive.wal_end")?,
            server_time: PgTimestamp(r.i64("keepalive.server_time")?),
            reply_requested: r.u8("keepalive.reply_requested")? != 0,
        };
        r.finish("keepalive")?;
        Ok(k)
    }

    pub(crate) fn encode_body(&self, buf: &mut BytesMut) {
        buf.put_u64(self.wal_end.0);
        buf.put_i64(self.server_time.0);
        buf.put_u8(self.reply_requested as u8);
    }
}
