//! Big-endian reading and writing helpers shared by all messages.

use bytes::{BufMut, Bytes, BytesMut};

use crate::{DecodeError, Lsn};

/// A cursor over a message body that yields typed errors instead of panicking.
///
/// It keeps one `Bytes` and an offset: fixed-width reads touch no reference
/// count; only values handed out as `Bytes` (column data) are sliced.
#[derive(Debug)]
pub(crate) struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    fn take(&mut self, n: usize, field: &'static str) -> Result<&[u8], DecodeError> {
        let remaining = self.remaining();
        if remaining < n {
            return Err(DecodeError::UnexpectedEof {
                field,
                needed: n,
                remaining,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    pub(crate) fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn lsn(&mut self, field: &'static str) -> Result<Lsn, DecodeError> {
        Ok(Lsn(u64::from_be_bytes(self.array(field)?)))
    }

    pub(crate) fn bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(n, field)?;
        Ok(self.buf.slice(start..start + n))
    }

    pub(crate) fn rest(&mut self) -> Bytes {
        let start = self.pos;
        self.pos = self.buf.len();
        self.buf.slice(start..)
    }

    pub(crate) fn cstr(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let rest = &self.buf[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul { field })?;
        let s = std::str::from_utf8(&rest[..end])
            .map_err(|_| DecodeError::InvalidUtf8 { field })?
            .to_owned();
        self.pos += end + 1;
        Ok(s)
    }

    pub(crate) fn finish(&self, message: &'static str) -> Result<(), DecodeError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                message,
                count: self.remaining(),
            })
        }
    }
}

pub(crate) fn put_cstr(buf: &mut BytesMut, s: &str) {
    buf.put_slice(s.as_bytes());
    buf.put_u8(0);
}
