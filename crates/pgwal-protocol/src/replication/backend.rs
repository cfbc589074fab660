//! Dispatch of server-to-client CopyData payloads.

use bytes::{BufMut, Bytes, BytesMut};

use super::{PrimaryKeepalive, SenderFlush, XLogData};
use crate::DecodeError;

/// A CopyData payload sent by the server during replication.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendReplicationMessage {
    /// `w`: a chunk of WAL or of logical decoding output.
    XLogData(XLogData),
    /// `k`: the server's WAL end and whether it wants a reply.
    PrimaryKeepalive(PrimaryKeepalive),
    /// `f`: how far the streamed WAL is durable on the server (only to
    /// clients that asked with `UNFLUSHED_WAL`).
    SenderFlush(SenderFlush),
    /// `e`: from now on, report WAL as received as soon as it has arrived,
    /// before writing it (only to clients that offered `EARLY_RECEIPT`, once
    /// a transaction has waited for `synchronous_commit = remote_receive`).
    /// A keepalive asking for a reply follows it.
    EarlyReceiptRequest,
}

impl BackendReplicationMessage {
    /// Decodes one CopyData body. `XLogData` payloads are sliced, not copied.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use pgwal_protocol::replication::BackendReplicationMessage;
    ///
    /// let mut raw = vec![b'k'];
    /// raw.extend_from_slice(&0x100u64.to_be_bytes());
    /// raw.extend_from_slice(&0i64.to_be_bytes());
    /// raw.push(1);
    /// match BackendReplicationMessage::decode(Bytes::from(raw)).unwrap() {
    ///     BackendReplicationMessage::PrimaryKeepalive(k) => assert!(k.reply_requested),
    ///     _ => unreachable!(),
    /// }
    /// ```
    pub fn decode(body: Bytes) -> Result<Self, DecodeError> {
        let tag = *body.first().ok_or(DecodeError::Empty)?;
        let rest = body.slice(1..);
        match tag {
            b'w' => Ok(Self::XLogData(XLogData::decode_body(rest)?)),
            b'k' => Ok(Self::PrimaryKeepalive(PrimaryKeepalive::decode_body(rest)?)),
            b'f' => Ok(Self::SenderFlush(SenderFlush::decode_body(rest)?)),
            b'e' if rest.is_empty() => Ok(Self::EarlyReceiptRequest),
            b'e' => Err(DecodeError::TrailingBytes {
                message: "early receipt request",
                count: rest.len(),
            }),
            tag => Err(DecodeError::UnknownTag {
                context: "replication message",
                tag,
            }),
        }
    }

    /// Encodes this message as a CopyData body (tag included).
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            Self::XLogData(x) => {
                buf.put_u8(b'w');
                x.encode_body(buf);
            }
            Self::PrimaryKeepalive(k) => {
                buf.put_u8(b'k');
                k.encode_body(buf);
            }
            Self::SenderFlush(f) => {
                buf.put_u8(b'f');
                f.encode_body(buf);
            }
            Self::EarlyReceiptRequest => buf.put_u8(b'e'),
        }
    }
}
