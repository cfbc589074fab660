//! The TCP receive low-water mark (`SO_RCVLOWAT`), used to batch wake-ups.
//!
//! A logical walsender sends every change as its own small CopyData
//! message, and a client that keeps up is woken once per message: the
//! client pays for a wake-up and a read per change, and the walsender pays
//! for waking it inside its `send()`. Sleeping between reads does not help:
//! each arriving segment still wakes the epoll waiter. The low-water mark
//! does: Linux signals readability only once that many bytes are queued (or
//! on end of stream, an error, or memory pressure), so the walsender's
//! sends below the mark wake nobody. Lowering the mark again re-checks the
//! queue and signals at once if data is waiting, which is how a bounded
//! wait ends.
//!
//! Only Linux honours the mark in poll/epoll for TCP; elsewhere (and for
//! Unix-domain sockets) [`LowWater::for_fd`] returns `None` and callers
//! fall back to sleeping.
#![allow(unsafe_code)]

/// A socket's receive low-water mark, remembered to skip redundant calls.
#[derive(Debug)]
pub(crate) struct LowWater {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fd: std::os::fd::RawFd,
    current: i32,
}

impl LowWater {
    /// The mark of the TCP socket `fd`.
    ///
    /// The caller must keep the socket open for as long as the returned
    /// value is used (the frame reader owns the stream it was taken from).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(crate) fn for_fd(fd: std::os::fd::RawFd) -> Option<LowWater> {
        Some(LowWater { fd, current: 1 })
    }

    /// No low-water mark support on this platform.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub(crate) fn for_fd(_fd: i32) -> Option<LowWater> {
        None
    }

    /// Whether the mark is above one byte.
    pub(crate) fn raised(&self) -> bool {
        self.current > 1
    }

    /// Sets the mark to `bytes` (at least 1).
    pub(crate) fn set(&mut self, bytes: i32) -> std::io::Result<()> {
        let bytes = bytes.max(1);
        if bytes == self.current {
            return Ok(());
        }
        self.setsockopt(bytes)?;
        self.current = bytes;
        Ok(())
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn setsockopt(&self, bytes: i32) -> std::io::Result<()> {
        let value: libc::c_int = bytes;
        // SAFETY: `fd` is an open socket (see `for_fd`), `value` is a live
        // c_int and the length passed is its size; SO_RCVLOWAT only reads it.
        let rc = unsafe {
            libc::setsockopt(
                self.fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn setsockopt(&self, _bytes: i32) -> std::io::Result<()> {
        Ok(())
    }
}
