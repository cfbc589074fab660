//! The `h` (hot standby feedback) message.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::Reader;
use crate::{DecodeError, PgTimestamp};

/// Hot standby feedback: the oldest xmin a standby still needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotStandbyFeedback {
    /// The client's clock.
    pub client_time: PgTimestamp,
    /// The standby's global xmin (0 for none).
    pub xmin: u32,
    /// The epoch of `xmin`.
    pub xmin_epoch: u32,
    /// The lowest catalog xmin of the standby's slots (0 for none).
    pub catalog_xmin: u32,
    /// The epoch of `catalog_xmin`.
    pub catalog_xmin_epoch: u32,
}

impl HotStandbyFeedback {
    /// Encodes the message (tag included) as a CopyData body.
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(b'h');
        buf.put_i64(self.client_time.0);
        buf.put_u32(self.xmin);
        buf.put_u32(self.xmin_epoch);
        buf.put_u32(self.catalog_xmin);
        buf.put_u32(self.catalog_xmin_epoch);
    }

    /// Decodes a CopyData body (tag included).
    pub fn decode(body: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        match r.u8("hot standby feedback tag")? {
            b'h' => {}
            tag => {
                return Err(DecodeError::UnknownTag {
                    context: "hot standby feedback",
                    tag,
                })
            }
        }
        let h = HotStandbyFeedback {
            client_time: PgTimestamp(r.i64("feedback.time")?),
            xmin: r.u32("feedback.xmin")?,
            xmin_epoch: r.u32("feedback.xmin_epoch")?,
            catalog_xmin: r.u32("feedback.catalog_xmin")?,
            catalog_xmin_epoch: r.u32("feedback.catalog_xmin_epoch")?,
        };
        r.finish("hot standby feedback")?;
        Ok(h)
    }
}
