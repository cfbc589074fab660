//! Type: the name of a non-builtin data type.

use bytes::{BufMut, BytesMut};

use super::{put_stream_xid, read_stream_xid};
use crate::codec::{put_cstr, Reader};
use crate::DecodeError;

/// `Y`: describes a user-defined type used by a published column.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TypeMessage {
    /// Xid of the streamed transaction (only inside a streaming block).
    pub xid: Option<u32>,
    /// Type OID.
    pub oid: u32,
    /// Schema name.
    pub namespace: String,
    /// Type name.
    pub name: String,
}

impl TypeMessage {
    pub(crate) fn decode(r: &mut Reader, streamed: bool) -> Result<Self, DecodeError> {
        Ok(TypeMessage {
            xid: read_stream_xid(r, streamed)?,
            oid: r.u32("type.oid")?,
            namespace: r.cstr("type.namespace")?,
            name: r.cstr("type.name")?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        put_stream_xid(buf, self.xid);
        buf.put_u32(self.oid);
        put_cstr(buf, &self.namespace);
        put_cstr(buf, &self.name);
    }
}
