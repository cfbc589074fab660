//! Message: output of `pg_logical_emit_message`.

use bytes::{BufMut, Bytes, BytesMut};

use super::{put_stream_xid, read_stream_xid};
use crate::codec::{put_cstr, Reader};
use crate::{DecodeError, Lsn};

/// `M`: a generic logical decoding message (`messages 'true'`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogicalDecodingMessage {
    /// Xid of the streamed transaction (only inside a streaming block).
    pub xid: Option<u32>,
    /// Flags: bit 1 means transactional.
    pub flags: u8,
    /// LSN of the message.
    pub lsn: Lsn,
    /// The message prefix.
    pub prefix: String,
    /// The message content.
    pub content: Bytes,
}

impl LogicalDecodingMessage {
    /// Whether the message was emitted transactionally.
    pub fn is_transactional(&self) -> bool {
        self.flags & 1 != 0
    }

    pub(crate) fn decode(r: &mut Reader, streamed: bool) -> Result<Self, DecodeError> {
        let xid = read_stream_xid(r, streamed)?;
        let flags = r.u8("message.flags")?;
        let lsn = r.lsn("message.lsn")?;
        let prefix = r.cstr("message.prefix")?;
        let len = r.i32("message.length")?;
        if len < 0 {
            return Err(DecodeError::InvalidLength {
                field: "message.length",
                value: len.into(),
            });
        }
        let content = r.bytes(len as usize, "message.content")?;
        Ok(LogicalDecodingMessage {
            xid,
            flags,
            lsn,
            prefix,
            content,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_stream_xid(buf, self.xid);
        buf.put_u8(self.flags);
        buf.put_u64(self.lsn.0);
        put_cstr(buf, &self.prefix);
        buf.put_i32(self.content.len() as i32);
        buf.put_slice(&self.content);
    }
}
