//! The `r` (standby status update) message.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::Reader;
use crate::{DecodeError, Lsn, PgTimestamp};

/// The client's progress report.
///
/// For logical slots the server advances `confirmed_flush_lsn` to `flush`.
/// The stock message is 34 bytes; servers patched to accept it take an
/// optional trailing 8-byte receive pointer (42 bytes), carried in
/// [`receive`](Self::receive).
///
/// ```
/// use bytes::BytesMut;
/// use pgwal_protocol::{Lsn, PgTimestamp};
/// use pgwal_protocol::replication::StandbyStatusUpdate;
///
/// let s = StandbyStatusUpdate {
///     write: Lsn(16), flush: Lsn(16), apply: Lsn(16),
///     client_time: PgTimestamp(0), reply_requested: false, receive: None,
/// };
/// let mut buf = BytesMut::new();
/// s.encode(&mut buf);
/// assert_eq!(buf.len(), 34);
/// assert_eq!(StandbyStatusUpdate::decode(buf.freeze()).unwrap(), s);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyStatusUpdate {
    /// Last WAL position received and written by the client.
    pub write: Lsn,
    /// Last WAL position durably processed by the client (drives the slot).
    pub flush: Lsn,
    /// Last WAL position applied by the client.
    pub apply: Lsn,
    /// The client's clock.
    pub client_time: PgTimestamp,
    /// Ask the server to reply at once (with a keepalive).
    pub reply_requested: bool,
    /// Optional trailing receive pointer (extended 42-byte form).
    pub receive: Option<Lsn>,
}

impl StandbyStatusUpdate {
    /// Size of the stock message, tag included.
    pub const STOCK_LEN: usize = 34;
    /// Size of the extended message with a receive pointer, tag included.
    pub const EXTENDED_LEN: usize = 42;

    /// Encodes the message (tag included) as a CopyData body.
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(b'r');
        buf.put_u64(self.write.0);
        buf.put_u64(self.flush.0);
        buf.put_u64(self.apply.0);
        buf.put_i64(self.client_time.0);
        buf.put_u8(self.reply_requested as u8);
        if let Some(r) = self.receive {
            buf.put_u64(r.0);
        }
    }

    /// Decodes a CopyData body (tag included), in either the 34 or 42 byte form.
    pub fn decode(body: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        match r.u8("standby status tag")? {
            b'r' => {}
            tag => {
                return Err(DecodeError::UnknownTag {
                    context: "standby status update",
                    tag,
                })
            }
        }
        let mut s = StandbyStatusUpdate {
            write: r.lsn("status.write")?,
            flush: r.lsn("status.flush")?,
            apply: r.lsn("status.apply")?,
            client_time: PgTimestamp(r.i64("status.client_time")?),
            reply_requested: r.u8("status.reply")? != 0,
            receive: None,
        };
        if r.remaining() > 0 {
            s.receive = Some(r.lsn("status.receive")?);
        }
        r.finish("standby status update")?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_form() {
        let s = StandbyStatusUpdate {
            write: Lsn(1),
            flush: Lsn(2),
            apply: Lsn(3),
            client_time: PgTimestamp(4),
            reply_requested: true,
            receive: Some(Lsn(5)),
        };
        let mut buf = BytesMut::new();
        s.encode(&mut buf);
        assert_eq!(buf.len(), StandbyStatusUpdate::EXTENDED_LEN);
        assert_eq!(
            StandbyStatusUpdate::decode(buf.clone().freeze()).unwrap(),
            s
        );
        for n in 0..buf.len() {
            if n != StandbyStatusUpdate::STOCK_LEN {
                assert!(StandbyStatusUpdate::decode(buf.clone().freeze().slice(..n)).is_err());
            }
        }
    }
}
