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
    /// nonzero).
    pub reply_requested: bool,
    /// The server understands the receive position at the end of a standby
    /// status update and asks for it from now on (last byte 2 or 3; sent by
    /// pgwal's patched servers when physical streaming starts). Clients
    /// append [`StandbyStatusUpdate::receive`](crate::replication::StandbyStatusUpdate::receive)
    /// only after this, so stock servers never see it.
    pub receive_position_wanted: bool,
    /// The server also asks for WAL to be reported as received as soon as
    /// it has arrived, before it is written (last byte 3; sent once somebody
    /// waits for `synchronous_commit = remote_receive`).
    pub early_receipt_wanted: bool,
}

/// Last byte of a keepalive: no reply needed.
const NO_REPLY: u8 = 0;
/// Last byte: reply now.
const REPLY_REQUESTED: u8 = 1;
/// Last byte: reply now, and send the receive position from now on.
const REPORT_RECEIVE: u8 = 2;
/// Last byte: as [`REPORT_RECEIVE`], and report receipt before writing.
const REPORT_RECEIPT_EARLY: u8 = 3;

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
            receive_position_wanted: request == REPORT_RECEIVE || request == REPORT_RECEIPT_EARLY,
            early_receipt_wanted: request == REPORT_RECEIPT_EARLY,
        };
        r.finish("keepalive")?;
        Ok(k)
    }

    pub(crate) fn encode_body(&self, buf: &mut BytesMut) {
        buf.put_u64(self.wal_end.0);
        buf.put_i64(self.server_time.0);
        buf.put_u8(if self.early_receipt_wanted {
            REPORT_RECEIPT_EARLY
        } else if self.receive_position_wanted {
            REPORT_RECEIVE
        } else if self.reply_requested {
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
        let flags = |k: PrimaryKeepalive| {
            (
                k.reply_requested,
                k.receive_position_wanted,
                k.early_receipt_wanted,
            )
        };
        assert_eq!(flags(decode(0)), (false, false, false));
        assert_eq!(flags(decode(1)), (true, false, false));
        assert_eq!(flags(decode(2)), (true, true, false));
        assert_eq!(flags(decode(3)), (true, true, true));
        // A value a later server may define still asks for a reply.
        assert_eq!(flags(decode(9)), (true, false, false));
        for v in 0..=3 {
            let k = decode(v);
            let mut b = BytesMut::new();
            k.encode_body(&mut b);
            assert_eq!(b[b.len() - 1], v, "round trip of {v}");
        }
    }
}
