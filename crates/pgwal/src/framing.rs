//! Backend message framing over a byte stream (cancel-safe reads).

use bytes::{Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::Message;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{DbError, Error, Result};

/// A backend message, with the replication hot path (CopyData) unparsed.
pub(crate) enum Backend {
    /// `d`: the body of a CopyData message.
    CopyData(Bytes),
    /// `W`: CopyBothResponse (not known to `postgres-protocol`).
    CopyBothResponse,
    /// Any other message, parsed by `postgres-protocol`.
    Other(Message),
}

/// Reads whole backend messages. Only `read_buf` is awaited and the buffer
/// lives in the struct, so a cancelled [`read`](Self::read) loses nothing.
pub(crate) struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    last_read_len: usize,
    last_read_at: Option<std::time::Instant>,
    /// A read error met by [`more_ready`](Self::more_ready), reported by the
    /// next [`read`](Self::read).
    deferred: Option<std::io::Error>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(io: R) -> Self {
        FrameReader {
            io,
            buf: BytesMut::with_capacity(64 * 1024),
            last_read_len: 0,
            last_read_at: None,
            deferred: None,
        }
    }

    /// Whether a whole message is buffered.
    fn has_frame(&self) -> bool {
        self.buf.len() >= 5 && {
            let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
            len < 4 || self.buf.len() > len as usize
        }
    }

    /// The next message if it is already buffered (no I/O).
    pub(crate) fn try_next(&mut self) -> Result<Option<Backend>> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let tag = self.buf[0];
        let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if len < 4 {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("invalid message length {len}"),
            )));
        }
        let total = 1 + len as usize;
        if self.buf.len() < total {
            self.buf.reserve(total - self.buf.len());
            return Ok(None);
        }
        let frame = self.buf.split_to(total);
        Ok(Some(match tag {
            b'd' => Backend::CopyData(frame.freeze().slice(5..)),
            b'W' => Backend::CopyBothResponse,
            _ => {
                let mut frame = frame;
                match Message::parse(&mut frame)? {
                    Some(m) => Backend::Other(m),
                    None => unreachable_frame()?,
                }
            }
        }))
    }

    /// Whether the reader is in a stream of small reads (the last one was
    /// under 32 KiB and less than 10 ms ago) with no whole message buffered: waiting a
    /// moment lets data accumulate, saving wake-ups on both ends.
    pub(crate) fn should_coalesce(&self) -> bool {
        !self.has_frame()
            && self.last_read_len < 32 * 1024
            && self
                .last_read_at
                .is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(10))
    }

    /// Whether a whole message is buffered after taking in whatever the
    /// socket has now, without waiting (one poll with a no-op waker; the
    /// next [`read`](Self::read) registers its own). End of stream or an
    /// error is left for that `read` to report.
    pub(crate) fn more_ready(&mut self) -> bool {
        if self.has_frame() {
            return true;
        }
        if self.deferred.is_some() {
            return false;
        }
        if self.buf.capacity() - self.buf.len() < 8192 {
            self.buf.reserve(64 * 1024);
        }
        match futures_util::FutureExt::now_or_never(self.io.read_buf(&mut self.buf)) {
            None => {}
            Some(Ok(0)) => {
                self.deferred = Some(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ))
            }
            Some(Ok(n)) => {
                self.last_read_len = n;
                self.last_read_at = Some(std::time::Instant::now());
            }
            Some(Err(e)) => self.deferred = Some(e),
        }
        self.has_frame()
    }

    /// The next message. Cancel-safe.
    pub(crate) async fn read(&mut self) -> Result<Backend> {
        loop {
            if let Some(m) = self.try_next()? {
                return Ok(m);
            }
            if let Some(e) = self.deferred.take() {
                return Err(Error::Io(e));
            }
            if self.buf.capacity() - self.buf.len() < 8192 {
                self.buf.reserve(64 * 1024);
            }
            let n = self.io.read_buf(&mut self.buf).await?;
            self.last_read_len = n;
            self.last_read_at = Some(std::time::Instant::now());
            if n == 0 {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                )));
            }
        }
    }

    /// Like [`read`](Self::read), but turns an ErrorResponse into an error
    /// and skips notices and parameter status messages.
    pub(crate) async fn read_ok(&mut self) -> Result<Backend> {
        loop {
            match self.read().await? {
                Backend::Other(Message::ErrorResponse(body)) => {
                    return Err(Error::Db(db_error(body.fields())?))
                }
                Backend::Other(Message::NoticeResponse(_))
                | Backend::Other(Message::ParameterStatus(_)) => {}
                m => return Ok(m),
            }
        }
    }
}

fn unreachable_frame() -> Result<Backend> {
    Err(Error::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "incomplete frame",
    )))
}

/// Builds a [`DbError`] from ErrorResponse fields.
pub(crate) fn db_error(
    mut fields: postgres_protocol::message::backend::ErrorFields<'_>,
) -> Result<DbError> {
    let mut v: Vec<(u8, String)> = Vec::new();
    while let Some(f) = fields.next()? {
        v.push((
            f.type_(),
            String::from_utf8_lossy(f.value_bytes()).into_owned(),
        ));
    }
    Ok(DbError::from_fields(
        v.iter().map(|(t, s)| (*t, s.as_str())),
    ))
}
