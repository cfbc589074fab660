//! The `f` (sender flush position) message.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::Reader;
use crate::{DecodeError, Lsn};

/// How far the WAL of the streamed timeline is durable on the server.
///
/// Sent by pgwal's patched servers (0006 and later), only to clients that
/// asked with `START_REPLICATION … (UNFLUSHED_WAL)`, which they may only send
/// to a server whose `replication_features` parameter lists `unflushed_wal`.
/// Such a client promises not to treat WAL beyond `flush` as safe: the server
/// may send WAL before it has flushed it, and could lose it in a crash.
/// The `pgwal` physical stream never asks, so it is never sent WAL the server
/// has not flushed; this type exists so that the protocol crate can read
/// every message the server may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderFlush {
    /// All WAL of the timeline up to here is durable on the server. May be
    /// ahead of the WAL sent so far; never goes backwards within a stream.
    pub flush: Lsn,
}

impl SenderFlush {
    pub(crate) fn decode_body(body: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let flush = r.lsn("sender_flush.flush")?;
        // Fields appended by later releases are ignored, as the protocol says.
        Ok(SenderFlush { flush })
    }

    pub(crate) fn encode_body(&self, buf: &mut BytesMut) {
        buf.put_u64(self.flush.0);
    }
}
