//! The pgoutput message enum and its encoder.

use bytes::{BufMut, BytesMut};

use super::*;

/// One pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogicalMessage {
    /// `B`
    Begin(Begin),
    /// `C`
    Commit(Commit),
    /// `O`
    Origin(Origin),
    /// `R`
    Relation(Relation),
    /// `Y`
    Type(TypeMessage),
    /// `I`
    Insert(Insert),
    /// `U`
    Update(Update),
    /// `D`
    Delete(Delete),
    /// `T`
    Truncate(Truncate),
    /// `M`
    Message(LogicalDecodingMessage),
    /// `S`
    StreamStart(StreamStart),
    /// `E`
    StreamStop,
    /// `c`
    StreamCommit(StreamCommit),
    /// `A`
    StreamAbort(StreamAbort),
    /// `b`
    BeginPrepare(BeginPrepare),
    /// `P`
    Prepare(Prepare),
    /// `K`
    CommitPrepared(CommitPrepared),
    /// `r`
    RollbackPrepared(RollbackPrepared),
    /// `p`
    StreamPrepare(Prepare),
}

impl LogicalMessage {
    /// The message's tag byte.
    pub fn tag(&self) -> u8 {
        match self {
            Self::Begin(_) => b'B',
            Self::Commit(_) => b'C',
            Self::Origin(_) => b'O',
            Self::Relation(_) => b'R',
            Self::Type(_) => b'Y',
            Self::Insert(_) => b'I',
            Self::Update(_) => b'U',
            Self::Delete(_) => b'D',
            Self::Truncate(_) => b'T',
            Self::Message(_) => b'M',
            Self::StreamStart(_) => b'S',
            Self::StreamStop => b'E',
            Self::StreamCommit(_) => b'c',
            Self::StreamAbort(_) => b'A',
            Self::BeginPrepare(_) => b'b',
            Self::Prepare(_) => b'P',
            Self::CommitPrepared(_) => b'K',
            Self::RollbackPrepared(_) => b'r',
            Self::StreamPrepare(_) => b'p',
        }
    }

    /// Appends the message exactly as pgoutput sends it.
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.tag());
        match self {
            Self::Begin(m) => m.encode(buf),
            Self::Commit(m) => m.encode(buf),
            Self::Origin(m) => m.encode(buf),
            Self::Relation(m) => m.encode(buf),
            Self::Type(m) => m.encode(buf),
            Self::Insert(m) => m.encode(buf),
            Self::Update(m) => m.encode(buf),
            Self::Delete(m) => m.encode(buf),
            Self::Truncate(m) => m.encode(buf),
            Self::Message(m) => m.encode(buf),
            Self::StreamStart(m) => m.encode(buf),
            Self::StreamStop => {}
            Self::StreamCommit(m) => m.encode(buf),
            Self::StreamAbort(m) => m.encode(buf),
            Self::BeginPrepare(m) => m.encode(buf),
            Self::Prepare(m) | Self::StreamPrepare(m) => m.encode(buf),
            Self::CommitPrepared(m) => m.encode(buf),
            Self::RollbackPrepared(m) => m.encode(buf),
        }
    }

    /// Encodes into a fresh buffer.
    pub fn to_bytes(&self) -> BytesMut {
        let mut b = BytesMut::new();
        self.encode(&mut b);
        b
    }
}
