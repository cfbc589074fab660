//! Row changes: Insert, Update, Delete and Truncate.

use bytes::{BufMut, BytesMut};

use super::{put_stream_xid, read_stream_xid, TupleData};
use crate::codec::Reader;
use crate::DecodeError;

/// The old row image of an Update or Delete.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OldTuple {
    /// `K`: only the replica identity key columns (others are NULL).
    Key(TupleData),
    /// `O`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(TupleData),
}

impl OldTuple {
    /// The tuple, whichever kind it is.
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }

    fn encode(&self, buf: &mut BytesMut) {
        match self {
            OldTuple::Key(t) => {
                buf.put_u8(b'K');
                t.encode(buf);
            }
            OldTuple::Full(t) => {
                buf.put_u8(b'O');
                t.encode(buf);
            }
        }
    }
}

fn expect(r: &mut Reader, want: u8, context: &'static str) -> Result<(), DecodeError> {
    match r.u8(context)? {
        b if b == want => Ok(()),
        tag => Err(DecodeError::UnknownTag { context, tag }),
    }
}

/// `I`: a row was inserted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Insert {
    /// Xid of the (sub)transaction (only inside a streaming block).
    pub xid: Option<u32>,
    /// Relation OID.
    pub relation_oid: u32,
    /// The new row.
    pub new: TupleData,
}

impl Insert {
    pub(crate) fn decode(r: &mut Reader, streamed: bool) -> Result<Self, DecodeError> {
        let xid = read_stream_xid(r, streamed)?;
        let relation_oid = r.u32("insert.relation")?;
        expect(r, b'N', "insert new tuple marker")?;
        Ok(Insert {
            xid,
            relation_oid,
            new: TupleData::decode(r)?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_stream_xid(buf, self.xid);
        buf.put_u32(self.relation_oid);
        buf.put_u8(b'N');
        self.new.encode(buf);
    }
}

/// `U`: a row was updated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Update {
    /// Xid of the (sub)transaction (only inside a streaming block).
    pub xid: Option<u32>,
    /// Relation OID.
    pub relation_oid: u32,
    /// The old key or row, when the key changed or identity is FULL.
    pub old: Option<OldTuple>,
    /// The new row; unchanged TOASTed columns are
    /// [`ColumnValue::UnchangedToast`](super::ColumnValue::UnchangedToast).
    pub new: TupleData,
}

impl Update {
    pub(crate) fn decode(r: &mut Reader, streamed: bool) -> Result<Self, DecodeError> {
        let xid = read_stream_xid(r, streamed)?;
        let relation_oid = r.u32("update.relation")?;
        let mut old = None;
        let mut marker = r.u8("update tuple marker")?;
        if marker == b'K' || marker == b'O' {
            let t = TupleData::decode(r)?;
            old = Some(if marker == b'K' {
                OldTuple::Key(t)
            } else {
                OldTuple::Full(t)
            });
            marker = r.u8("update new tuple marker")?;
        }
        if marker != b'N' {
            return Err(DecodeError::UnknownTag {
                context: "update tuple marker",
                tag: marker,
            });
        }
        Ok(Update {
            xid,
            relation_oid,
            old,
            new: TupleData::decode(r)?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_stream_xid(buf, self.xid);
        buf.put_u32(self.relation_oid);
        if let Some(o) = &self.old {
            o.encode(buf);
        }
        buf.put_u8(b'N');
        self.new.encode(buf);
    }
}

/// `D`: a row was deleted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delete {
    /// Xid of the (sub)transaction (only inside a streaming block).
    pub xid: Option<u32>,
    /// Relation OID.
    pub relation_oid: u32,
    /// The old key or row.
    pub old: OldTuple,
}

impl Delete {
    pub(crate) fn decode(r: &mut Reader, streamed: bool) -> Result<Self, DecodeError> {
        let xid = read_stream_xid(r, streamed)?;
        let relation_oid = r.u32("delete.relation")?;
        let old = match r.u8("delete tuple marker")? {
            b'K' => OldTuple::Key(TupleData::decode(r)?),
            b'O' => OldTuple::Full(TupleData::decode(r)?),
            tag => {
                return Err(DecodeError::UnknownTag {
                    context: "delete tuple marker",
                    tag,
                })
            }
        };
        Ok(Delete {
            xid,
            relation_oid,
            old,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_stream_xid(buf, self.xid);
        buf.put_u32(self.relation_oid);
        self.old.encode(buf);
    }
}

/// `T`: tables were truncated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Truncate {
    /// Xid of the (sub)transaction (only inside a streaming block).
    pub xid: Option<u32>,
    /// Option bits: 1 = `CASCADE`, 2 = `RESTART IDENTITY`.
    pub options: u8,
    /// OIDs of the truncated relations.
    pub relation_oids: Vec<u32>,
}

impl Truncate {
    pub(crate) fn decode(r: &mut Reader, streamed: bool) -> Result<Self, DecodeError> {
        let xid = read_stream_xid(r, streamed)?;
        let n = r.i32("truncate.nrelations")?;
        if n < 0 {
            return Err(DecodeError::InvalidLength {
                field: "truncate.nrelations",
                value: n.into(),
            });
        }
        let options = r.u8("truncate.options")?;
        let mut relation_oids = Vec::with_capacity((n as usize).min(r.remaining() / 4));
        for _ in 0..n {
            relation_oids.push(r.u32("truncate.relation")?);
        }
        Ok(Truncate {
            xid,
            options,
            relation_oids,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_stream_xid(buf, self.xid);
        buf.put_i32(self.relation_oids.len() as i32);
        buf.put_u8(self.options);
        for o in &self.relation_oids {
            buf.put_u32(*o);
        }
    }
}
