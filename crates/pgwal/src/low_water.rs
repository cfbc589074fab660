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
//! queue and signals at once if data is waiting (Linux 4.18 and later),
//! which is how a bounded wait ends.
//!
//! Used only where that re-check exists: Linux ≥ 4.18. Elsewhere (non-Unix
//! targets included), and for Unix-domain sockets,
//! [`LowWater::for_socket`] returns `None` and the reader reads eagerly.
#![allow(unsafe_code)]

#[cfg(unix)]
use std::os::fd::{AsFd, OwnedFd};

/// A socket's receive low-water mark, remembered to skip redundant calls.
#[derive(Debug)]
pub(crate) struct LowWater {
    /// A duplicate of the socket's descriptor: socket options are shared
    /// between duplicates, and owning it keeps the descriptor valid for
    /// as long as this value lives, whoever closes the original.
    #[cfg(unix)]
    #[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]
    fd: OwnedFd,
    current: i32,
}

impl LowWater {
    /// The mark of a TCP socket, or `None` where lowering the mark would not
    /// wake a reader that has data queued (so a batched wait could stall).
    #[cfg(unix)]
    pub(crate) fn for_socket(socket: &impl AsFd) -> Option<LowWater> {
        if !supported() {
            return None;
        }
        let fd = socket.as_fd().try_clone_to_owned().ok()?;
        Some(LowWater { fd, current: 1 })
    }

    /// Never on a non-Unix target.
    #[cfg(not(unix))]
    pub(crate) fn for_socket<S>(_socket: &S) -> Option<LowWater> {
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
        use std::os::fd::AsRawFd;
        let value: libc::c_int = bytes;
        // SAFETY: `self.fd` is an open descriptor we own, `value` is a live
        // c_int and the length passed is its size; SO_RCVLOWAT only reads it.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
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

/// Linux 4.18 or later (`tcp_set_rcvlowat` re-checks the queue there).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|r| kernel_at_least(&r, (4, 18)))
            .unwrap_or(false)
    })
}

#[cfg(all(unix, not(any(target_os = "linux", target_os = "android"))))]
fn supported() -> bool {
    false
}

/// Whether a kernel release string ("6.1.0-13-amd64") is at least `min`.
#[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]
fn kernel_at_least(release: &str, min: (u32, u32)) -> Option<bool> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor) >= min)
}

#[cfg(test)]
mod tests {
    use super::kernel_at_least;

    #[test]
    fn kernel_release_parsing() {
        assert_eq!(kernel_at_least("6.18.44-fc-v782", (4, 18)), Some(true));
        assert_eq!(
            kernel_at_least("4.18.0-553.el8_10.x86_64", (4, 18)),
            Some(true)
        );
        assert_eq!(kernel_at_least("4.9.337", (4, 18)), Some(false));
        assert_eq!(kernel_at_least("3.10.0", (4, 18)), Some(false));
        assert_eq!(kernel_at_least("garbage", (4, 18)), None);
    }
}
