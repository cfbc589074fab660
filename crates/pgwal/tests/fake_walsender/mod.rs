//! Wire-level helpers for scripted walsenders: used by `physical_mock.rs`
//! and, through `#[path]`, by `benches/mock_walsender.rs`.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpStream;

use bytes::{BufMut, BytesMut};

/// Appends one backend message (`tag`, length, body).
pub fn msg(out: &mut BytesMut, tag: u8, body: &[u8]) {
    out.put_u8(tag);
    out.put_i32(body.len() as i32 + 4);
    out.put_slice(body);
}

/// Appends a whole simple-query answer: RowDescription with text columns
/// `cols`, one DataRow `vals` (NULL as `None`), CommandComplete, ReadyForQuery.
pub fn rows(out: &mut BytesMut, cols: &[&str], vals: &[Option<&str>]) {
    let mut d = BytesMut::new();
    d.put_i16(cols.len() as i16);
    for c in cols {
        d.put_slice(c.as_bytes());
        d.put_u8(0);
        d.put_u32(0);
        d.put_i16(0);
        d.put_u32(25);
        d.put_i16(-1);
        d.put_i32(-1);
        d.put_i16(0);
    }
    msg(out, b'T', &d);
    let mut r = BytesMut::new();
    r.put_i16(vals.len() as i16);
    for v in vals {
        match v {
            Some(v) => {
                r.put_i32(v.len() as i32);
                r.put_slice(v.as_bytes());
            }
            None => r.put_i32(-1),
        }
    }
    msg(out, b'D', &r);
    msg(out, b'C', b"SELECT 1\0");
    msg(out, b'Z', b"I");
}

/// Reads one frontend message (the startup packet has no tag).
pub fn read_msg(s: &mut TcpStream, startup: bool) -> Option<(u8, Vec<u8>)> {
    let mut tag = [0u8; 1];
    if !startup {
        s.read_exact(&mut tag).ok()?;
    }
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0; i32::from_be_bytes(len) as usize - 4];
    s.read_exact(&mut body).ok()?;
    Some((tag[0], body))
}
