//! The body of the fuzz target, shared with the corpus replay test.

use bytes::{Bytes, BytesMut};

use crate::pgoutput::Decoder;
use crate::replication::{BackendReplicationMessage, HotStandbyFeedback, StandbyStatusUpdate};

/// Feeds `data` to every decoder. The first byte selects whether the pgoutput
/// decoder is inside a streaming block. Decoding must never panic, and a
/// decoded message must survive encode → decode unchanged.
#[doc(hidden)]
pub fn decode_everything(data: &[u8]) {
    let Some((&flag, body)) = data.split_first() else {
        return;
    };
    let body = Bytes::copy_from_slice(body);
    let mut d = Decoder::new();
    if flag & 1 == 1 {
        d.decode(Bytes::from_static(&[b'S', 0, 0, 0, 1, 1]))
            .expect("stream start");
    }
    let mut again = d.clone();
    if let Ok(m) = d.decode(body.clone()) {
        let re = again
            .decode(m.to_bytes().freeze())
            .expect("re-encoded message must decode");
        assert_eq!(re, m, "encode/decode is not idempotent");
    }
    if let Ok(m) = BackendReplicationMessage::decode(body.clone()) {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        assert_eq!(
            BackendReplicationMessage::decode(b.freeze()).expect("re-decode"),
            m
        );
    }
    let _ = StandbyStatusUpdate::decode(body.clone());
    let _ = HotStandbyFeedback::decode(body);
}
