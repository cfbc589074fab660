//! Big-endian reading and writing helpers shared by all messages.

use bytes::{BufMut, Bytes, BytesMut};

use crate::{DecodeError, Lsn};

/// A cursor over a message body that yields typed errors instead of panicking.
#[derive(Debug)]
pub(crate) struct Reader {
    buf: Bytes,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn need(&self, n: usize, field: &'static str) -> Result<(), DecodeError> {
        if self.buf.len() < n {
            Err(DecodeError::UnexpectedEof {
                field,
                needed: n,
                remaining: self.buf.len(),
            })
        } else {
            Ok(())
        }
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        self.need(1, field)?;
        let v = self.buf[0];
        self.buf = self.buf.slice(1..);
        Ok(v)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        self.need(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[..N]);
        self.buf = self.buf.slice(N..);
        Ok(a)
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
        self.need(n, field)?;
        Ok(self.buf.split_to(n))
    }

    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn cstr(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let pos = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul { field })?;
        let s = std::str::from_utf8(&self.buf[..pos])
            .map_err(|_| DecodeError::InvalidUtf8 { field })?
            .to_owned();
        self.buf = self.buf.slice(pos + 1..);
        Ok(s)
    }

    pub(crate) fn finish(&self, message: &'static str) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                message,
                count: self.buf.len(),
            })
        }
    }
}

pub(crate) fn put_cstr(buf: &mut BytesMut, s: &str) {
    buf.put_slice(s.as_bytes());
    buf.put_u8(0);
}
