//! The stateful pgoutput decoder.

use bytes::Bytes;

use super::*;
use crate::codec::Reader;
use crate::DecodeError;

/// Decodes pgoutput messages, tracking whether a streaming block is open.
///
/// Feed it every message of a replication stream in order. Between Stream
/// Start and Stream Stop, data messages carry a leading xid; the decoder
/// reads it into their `xid` field.
///
/// ```
/// use bytes::Bytes;
/// use pgwal_protocol::pgoutput::{Decoder, LogicalMessage};
///
/// let mut d = Decoder::new();
/// let start = Bytes::from_static(&[b'S', 0, 0, 2, 0, 1]);
/// assert!(matches!(d.decode(start).unwrap(), LogicalMessage::StreamStart(_)));
/// assert!(d.in_stream());
/// assert!(d.decode(Bytes::from_static(b"\xff")).is_err());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    in_stream: bool,
}

impl Decoder {
    /// A decoder outside any streaming block.
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Whether a Stream Start has been seen without its Stream Stop.
    pub fn in_stream(&self) -> bool {
        self.in_stream
    }

    /// Forgets streaming state, e.g. after a reconnect.
    pub fn reset(&mut self) {
        self.in_stream = false;
    }

    /// Decodes one message (the payload of one XLogData).
    ///
    /// Column values and message contents are slices of `data`, not copies.
    pub fn decode(&mut self, data: Bytes) -> Result<LogicalMessage, DecodeError> {
        let tag = *data.first().ok_or(DecodeError::Empty)?;
        let mut r = Reader::new(data);
        r.u8("tag")?;
        let s = self.in_stream;
        let (msg, name) = match tag {
            b'B' => (LogicalMessage::Begin(Begin::decode(&mut r)?), "Begin"),
            b'C' => (LogicalMessage::Commit(Commit::decode(&mut r)?), "Commit"),
            b'O' => (LogicalMessage::Origin(Origin::decode(&mut r)?), "Origin"),
            b'R' => (
                LogicalMessage::Relation(Relation::decode(&mut r, s)?),
                "Relation",
            ),
            b'Y' => (
                LogicalMessage::Type(TypeMessage::decode(&mut r, s)?),
                "Type",
            ),
            b'I' => (LogicalMessage::Insert(Insert::decode(&mut r, s)?), "Insert"),
            b'U' => (LogicalMessage::Update(Update::decode(&mut r, s)?), "Update"),
            b'D' => (LogicalMessage::Delete(Delete::decode(&mut r, s)?), "Delete"),
            b'T' => (
                LogicalMessage::Truncate(Truncate::decode(&mut r, s)?),
                "Truncate",
            ),
            b'M' => (
                LogicalMessage::Message(LogicalDecodingMessage::decode(&mut r, s)?),
                "Message",
            ),
            b'S' => (
                LogicalMessage::StreamStart(StreamStart::decode(&mut r)?),
                "Stream Start",
            ),
            b'E' => (LogicalMessage::StreamStop, "Stream Stop"),
            b'c' => (
                LogicalMessage::StreamCommit(StreamCommit::decode(&mut r)?),
                "Stream Commit",
            ),
            b'A' => (
                LogicalMessage::StreamAbort(StreamAbort::decode(&mut r)?),
                "Stream Abort",
            ),
            b'b' => (
                LogicalMessage::BeginPrepare(BeginPrepare::decode(&mut r)?),
                "Begin Prepare",
            ),
            b'P' => (LogicalMessage::Prepare(Prepare::decode(&mut r)?), "Prepare"),
            b'K' => (
                LogicalMessage::CommitPrepared(CommitPrepared::decode(&mut r)?),
                "Commit Prepared",
            ),
            b'r' => (
                LogicalMessage::RollbackPrepared(RollbackPrepared::decode(&mut r)?),
                "Rollback Prepared",
            ),
            b'p' => (
                LogicalMessage::StreamPrepare(Prepare::decode(&mut r)?),
                "Stream Prepare",
            ),
            tag => {
                return Err(DecodeError::UnknownTag {
                    context: "pgoutput message",
                    tag,
                })
            }
        };
        r.finish(name)?;
        match msg {
            LogicalMessage::StreamStart(_) => self.in_stream = true,
            LogicalMessage::StreamStop => self.in_stream = false,
            _ => {}
        }
        Ok(msg)
    }
}
