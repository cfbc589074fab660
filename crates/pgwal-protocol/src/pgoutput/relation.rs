//! Relation: the schema of a table, sent before its first change.

use bytes::{BufMut, BytesMut};

use super::{put_stream_xid, read_stream_xid};
use crate::codec::{put_cstr, Reader};
use crate::DecodeError;

/// A table's `REPLICA IDENTITY` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplicaIdentity {
    /// `d`: the primary key.
    Default,
    /// `n`: nothing.
    Nothing,
    /// `f`: all columns.
    Full,
    /// `i`: a chosen unique index.
    Index,
}

impl ReplicaIdentity {
    fn from_byte(b: u8) -> Result<Self, DecodeError> {
        Ok(match b {
            b'd' => Self::Default,
            b'n' => Self::Nothing,
            b'f' => Self::Full,
            b'i' => Self::Index,
            tag => {
                return Err(DecodeError::UnknownTag {
                    context: "replica identity",
                    tag,
                })
            }
        })
    }

    fn to_byte(self) -> u8 {
        match self {
            Self::Default => b'd',
            Self::Nothing => b'n',
            Self::Full => b'f',
            Self::Index => b'i',
        }
    }
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RelationColumn {
    /// Flags: bit 1 means the column is part of the replica identity key.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier (`atttypmod`).
    pub type_modifier: i32,
}

impl RelationColumn {
    /// Whether the column is part of the key.
    pub fn is_key(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// `R`: a table's description.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Relation {
    /// Xid of the streamed transaction (only inside a streaming block).
    pub xid: Option<u32>,
    /// Relation OID.
    pub oid: u32,
    /// Schema name.
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// Replica identity setting.
    pub replica_identity: ReplicaIdentity,
    /// Published columns.
    pub columns: Vec<RelationColumn>,
}

impl Relation {
    pub(crate) fn decode(r: &mut Reader, streamed: bool) -> Result<Self, DecodeError> {
        let xid = read_stream_xid(r, streamed)?;
        let oid = r.u32("relation.oid")?;
        let namespace = r.cstr("relation.namespace")?;
        let name = r.cstr("relation.name")?;
        let replica_identity = ReplicaIdentity::from_byte(r.u8("relation.replica_identity")?)?;
        let n = r.i16("relation.ncolumns")?;
        if n < 0 {
            return Err(DecodeError::InvalidLength {
                field: "relation.ncolumns",
                value: n.into(),
            });
        }
        let mut columns = Vec::with_capacity((n as usize).min(r.remaining()));
        for _ in 0..n {
            columns.push(RelationColumn {
                flags: r.u8("column.flags")?,
                name: r.cstr("column.name")?,
                type_oid: r.u32("column.type_oid")?,
                type_modifier: r.i32("column.type_modifier")?,
            });
        }
        Ok(Relation {
            xid,
            oid,
            namespace,
            name,
            replica_identity,
            columns,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_stream_xid(buf, self.xid);
        buf.put_u32(self.oid);
        put_cstr(buf, &self.namespace);
        put_cstr(buf, &self.name);
        buf.put_u8(self.replica_identity.to_byte());
        buf.put_i16(self.columns.len() as i16);
        for c in &self.columns {
            buf.put_u8(c.flags);
            put_cstr(buf, &c.name);
            buf.put_u32(c.type_oid);
            buf.put_i32(c.type_modifier);
        }
    }
}
