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
    /// The server asks for an immediate status update (the last byte is
    /// nonzero; servers send 0 and 1, and any other nonzero value is read as
    /// 1).
    pub reply_requested: bool,
}

/// Last byte of a keepalive: no reply needed.
const NO_REPLY: u8 = 0;
/// Last byte: reply now.
const REPLY_REQUESTED: u8 = 1;

impl PrimaryKeepalive {
    pub(crate) fn decode_body(body: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let wal_end = r.lsn("keepalive.wal_end")?;
        let server_time = PgTimestamp(r.i64("keepalive.server_time")?);
        // Unknown nonzero values still ask for a reply, as the protocol says.
        let request = r.u8("keepalive.reply_requested")?;
        let k = PrimaryKeepalive {
            wal_end,
            server_time,
            reply_requested: request != NO_REPLY,
        };
        r.finish("keepalive")?;
        Ok(k)
    }

    pub(crate) fn encode_body(&self, buf: &mut BytesMut) {
        buf.put_u64(self.wal_end.0);
        buf.put_i64(self.server_time.0);
        buf.put_u8(if self.reply_requested {
            REPLY_REQUESTED
        } else {
            NO_REPLY
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(last: u8) -> PrimaryKeepalive {
        let mut b = BytesMut::new();
        b.put_u64(7);
        b.put_i64(8);
        b.put_u8(last);
        PrimaryKeepalive::decode_body(b.freeze()).unwrap()
    }

    #[test]
    fn last_byte_values() {
        assert!(!decode(0).reply_requested);
        assert!(decode(1).reply_requested);
        // Values the protocol does not define still ask for a reply.
        assert!(decode(2).reply_requested);
        assert!(decode(255).reply_requested);
        for v in 0..=1 {
            let k = decode(v);
            let mut b = BytesMut::new();
            k.encode_body(&mut b);
            assert_eq!(b[b.len() - 1], v, "round trip of {v}");
        }
    }
}
