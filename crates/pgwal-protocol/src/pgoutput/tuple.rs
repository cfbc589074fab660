//! Tuple data: the column values of a row image.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::Reader;
use crate::DecodeError;

/// One column of a row image, in wire form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ColumnValue {
    /// `n`: SQL NULL.
    Null,
    /// `u`: a TOASTed value that did not change; the server did not send it.
    UnchangedToast,
    /// `t`: the value in the type's text output format.
    Text(Bytes),
    /// `b`: the value in the type's binary send format (`binary 'true'`).
    Binary(Bytes),
}

impl ColumnValue {
    /// The raw bytes of a text or binary value.
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            ColumnValue::Text(b) | ColumnValue::Binary(b) => Some(b),
            _ => None,
        }
    }

    /// The value as UTF-8 text, when it is a text value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            ColumnValue::Text(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
}

/// The column values of one row image, in relation column order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TupleData(pub Vec<ColumnValue>);

impl TupleData {
    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        let n = r.i16("tuple column count")?;
        if n < 0 {
            return Err(DecodeError::InvalidLength {
                field: "tuple column count",
                value: n.into(),
            });
        }
        let n = n as usize;
        // Each column takes at least one byte; cap the allocation by input size.
        let mut cols = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            let v = match r.u8("column kind")? {
                b'n' => ColumnValue::Null,
                b'u' => ColumnValue::UnchangedToast,
                kind @ (b't' | b'b') => {
                    let len = r.i32("column length")?;
                    if len < 0 {
                        return Err(DecodeError::InvalidLength {
                            field: "column length",
                            value: len.into(),
                        });
                    }
                    let data = r.bytes(len as usize, "column value")?;
                    if kind == b't' {
                        ColumnValue::Text(data)
                    } else {
                        ColumnValue::Binary(data)
                    }
                }
                tag => {
                    return Err(DecodeError::UnknownTag {
                        context: "tuple column",
                        tag,
                    })
                }
            };
            cols.push(v);
        }
        Ok(TupleData(cols))
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_i16(self.0.len() as i16);
        for c in &self.0 {
            match c {
                ColumnValue::Null => buf.put_u8(b'n'),
                ColumnValue::UnchangedToast => buf.put_u8(b'u'),
                ColumnValue::Text(b) | ColumnValue::Binary(b) => {
                    buf.put_u8(if matches!(c, ColumnValue::Text(_)) {
                        b't'
                    } else {
                        b'b'
                    });
                    buf.put_i32(b.len() as i32);
                    buf.put_slice(b);
                }
            }
        }
    }
}
