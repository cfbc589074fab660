//! A directory of WAL segment files written like `pg_receivewal` does.
//!
//! * A segment being written is `NAME.partial`, created at its full size
//!   (zero-filled, then the file and the directory are fsynced), so later
//!   writes change no file metadata and a crash leaves a valid partial file.
//! * When its last byte is written it is fsynced, renamed to `NAME` and the
//!   directory is fsynced: a file without suffix is always complete.
//! * Streaming resumes at the start of the highest `.partial` segment (its
//!   valid length is unknown after a crash), or after the highest complete one.
//!
//! Everything here is blocking `std::fs`; the async receiver calls it through
//! `spawn_blocking`.

use std::fs::{File, OpenOptions};
use std::io::Write;
#[cfg(unix)]
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use pgwal_protocol::walfile::{history_file_name, WalSegments, PARTIAL_SUFFIX};
use pgwal_protocol::Lsn;

use crate::error::{Error, Result};

/// Where streaming resumes: the timeline and the position (a segment start).
/// `pwrite` of all of `buf` at `offset` where the platform has one.
#[cfg(not(unix))]
trait WriteAllAt {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
}

#[cfg(windows)]
impl WriteAllAt for File {
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> std::io::Result<()> {
        use std::os::windows::fs::FileExt;
        while !buf.is_empty() {
            let n = self.seek_write(buf, offset)?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            buf = &buf[n..];
            offset += n as u64;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResumePoint {
    pub(crate) timeline: u32,
    pub(crate) start: Lsn,
}

struct OpenSegment {
    file: File,
    path: PathBuf,
    timeline: u32,
    segno: u64,
    /// Whether bytes were written since the last fsync.
    dirty: bool,
}

/// The WAL directory and the segment currently open in it.
pub(crate) struct WalDir {
    path: PathBuf,
    segs: WalSegments,
    open: Option<OpenSegment>,
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::WalDir {
        path: path.to_owned(),
        op,
        source,
    }
}

/// Checks that `path` is a directory this process can create files in
/// (creates and removes a probe file). Nothing else is touched.
pub(crate) fn check_writable(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(io_err(path, "open the WAL directory"))?;
    if !meta.is_dir() {
        return Err(Error::WalFile {
            path: path.to_owned(),
            reason: "not a directory",
        });
    }
    let probe = path.join(".pgwal-write-probe");
    File::create(&probe).map_err(io_err(path, "create a file in"))?;
    std::fs::remove_file(&probe).map_err(io_err(&probe, "remove"))?;
    Ok(())
}

fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_err(path, "fsync the directory"))
}

impl WalDir {
    pub(crate) fn new(path: PathBuf, segs: WalSegments) -> WalDir {
        WalDir {
            path,
            segs,
            open: None,
        }
    }

    /// Scans the directory: the resume point after the highest segment
    /// (complete or partial), `None` when there is none. A complete segment
    /// of the wrong size or a partial one that is neither empty nor full is
    /// an error; nothing is changed.
    pub(crate) fn resume_point(&self) -> Result<Option<ResumePoint>> {
        let entries =
            std::fs::read_dir(&self.path).map_err(io_err(&self.path, "read the directory"))?;
        // (segno, complete, timeline): a complete segment beats a partial one.
        let mut best: Option<(u64, bool, u32)> = None;
        for entry in entries {
            let entry = entry.map_err(io_err(&self.path, "read the directory"))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let (base, complete) = match name.strip_suffix(PARTIAL_SUFFIX) {
                Some(base) => (base, false),
                None => (name, true),
            };
            let Some((tli, segno)) = self.segs.parse_file_name(base) else {
                continue;
            };
            let len = entry
                .metadata()
                .map_err(io_err(&entry.path(), "stat"))?
                .len();
            if len != self.segs.size() && (complete || len != 0) {
                return Err(Error::WalFile {
                    path: entry.path(),
                    reason: if complete {
                        "complete segment file does not have the server's segment size"
                    } else {
                        "partial segment file is neither empty nor of the segment size"
                    },
                });
            }
            let key = (segno, complete, tli);
            best = best.max(Some(key));
        }
        Ok(best.map(|(segno, complete, timeline)| ResumePoint {
            timeline,
            start: self
                .segs
                .segment_start(if complete { segno + 1 } else { segno }),
        }))
    }

    /// Whether the history file of `timeline` exists.
    pub(crate) fn has_history(&self, timeline: u32) -> bool {
        self.path.join(history_file_name(timeline)).exists()
    }

    /// Writes a timeline history file durably (temporary file, fsync,
    /// rename, directory fsync).
    pub(crate) fn write_history(&self, timeline: u32, content: &[u8]) -> Result<()> {
        let path = self.path.join(history_file_name(timeline));
        let tmp = self
            .path
            .join(format!("{}.tmp", history_file_name(timeline)));
        let mut f = File::create(&tmp).map_err(io_err(&tmp, "create"))?;
        f.write_all(content)
            .and_then(|_| f.sync_all())
            .map_err(io_err(&tmp, "write"))?;
        std::fs::rename(&tmp, &path).map_err(io_err(&path, "rename into"))?;
        sync_dir(&self.path)
    }

    fn open_segment(&mut self, timeline: u32, segno: u64) -> Result<&mut OpenSegment> {
        if self
            .open
            .as_ref()
            .is_some_and(|o| o.timeline != timeline || o.segno != segno)
        {
            self.close()?;
        }
        if self.open.is_none() {
            let name = format!("{}{PARTIAL_SUFFIX}", self.segs.file_name(timeline, segno));
            let path = self.path.join(name);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io_err(&path, "create"))?;
            let len = file.metadata().map_err(io_err(&path, "stat"))?.len();
            if len != self.segs.size() {
                if len != 0 {
                    return Err(Error::WalFile {
                        path,
                        reason: "partial segment file is neither empty nor of the segment size",
                    });
                }
                // Allocate the whole segment now so later fdatasyncs do not
                // have to write metadata, and a crash leaves a full-size file.
                let zeros = vec![0u8; 1 << 20];
                let mut off = 0;
                while off < self.segs.size() {
                    let n = zeros.len().min((self.segs.size() - off) as usize);
                    file.write_all_at(&zeros[..n], off)
                        .map_err(io_err(&path, "write"))?;
                    off += n as u64;
                }
                file.sync_all().map_err(io_err(&path, "fsync"))?;
                sync_dir(&self.path)?;
            }
            self.open = Some(OpenSegment {
                file,
                path,
                timeline,
                segno,
                dirty: false,
            });
        }
        Ok(self.open.as_mut().expect("opened above"))
    }

    /// Writes `data` at `at` on `timeline` (`pwrite`, no fsync), across
    /// segment boundaries. A segment whose last byte is written is fsynced,
    /// renamed to its final name and the directory fsynced; returns the end
    /// of the last segment completed this way (everything before it is
    /// durable), if any.
    pub(crate) fn write(&mut self, timeline: u32, at: Lsn, mut data: &[u8]) -> Result<Option<Lsn>> {
        let mut pos = at;
        let mut completed = None;
        while !data.is_empty() {
            let segno = self.segs.segment_of(pos);
            let off = self.segs.offset_of(pos);
            let n = data.len().min((self.segs.size() - off) as usize);
            let seg = self.open_segment(timeline, segno)?;
            seg.file
                .write_all_at(&data[..n], off)
                .map_err(io_err(&seg.path, "write"))?;
            seg.dirty = true;
            pos = pos + n as u64;
            data = &data[n..];
            if off + n as u64 == self.segs.size() {
                self.complete()?;
                completed = Some(pos);
            }
        }
        Ok(completed)
    }

    /// `fdatasync`s the open segment if it was written to.
    pub(crate) fn sync(&mut self) -> Result<()> {
        if let Some(seg) = self.open.as_mut().filter(|s| s.dirty) {
            seg.file.sync_data().map_err(io_err(&seg.path, "fsync"))?;
            seg.dirty = false;
        }
        Ok(())
    }

    /// Syncs and closes the open segment, leaving it `.partial`.
    pub(crate) fn close(&mut self) -> Result<()> {
        self.sync()?;
        self.open = None;
        Ok(())
    }

    /// The open segment is full: fsync, rename to the final name, fsync the
    /// directory.
    fn complete(&mut self) -> Result<()> {
        self.sync()?;
        let Some(seg) = self.open.take() else {
            return Ok(());
        };
        let done = self.path.join(self.segs.file_name(seg.timeline, seg.segno));
        drop(seg.file);
        std::fs::rename(&seg.path, &done).map_err(io_err(&done, "rename a segment to"))?;
        sync_dir(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("pgwal-waldir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn write_complete_resume() {
        let dir = tmpdir("wcr");
        let segs = WalSegments::new(1 << 20).unwrap();
        let mut w = WalDir::new(dir.clone(), segs);
        assert_eq!(w.resume_point().unwrap(), None);
        let start = segs.segment_start(5);
        let data: Vec<u8> = (0..(1 << 20) + 1000).map(|i| (i % 251) as u8).collect();
        assert_eq!(w.write(1, start, &data[..1000]).unwrap(), None);
        assert!(dir.join("000000010000000000000005.partial").exists());
        assert_eq!(
            w.resume_point().unwrap(),
            Some(ResumePoint { timeline: 1, start })
        );
        assert_eq!(
            w.write(1, start + 1000, &data[1000..]).unwrap(),
            Some(segs.segment_start(6))
        );
        let done = std::fs::read(dir.join("000000010000000000000005")).unwrap();
        assert_eq!(done, &data[..1 << 20]);
        let partial = std::fs::read(dir.join("000000010000000000000006.partial")).unwrap();
        assert_eq!(partial.len(), 1 << 20);
        assert_eq!(&partial[..1000], &data[1 << 20..]);
        assert!(partial[1000..].iter().all(|b| *b == 0));
        w.close().unwrap();
        assert_eq!(
            w.resume_point().unwrap(),
            Some(ResumePoint {
                timeline: 1,
                start: segs.segment_start(6)
            })
        );
        // A later timeline's history and a foreign file are ignored by the scan.
        w.write_history(2, b"1\t0/6000010\tno reason\n").unwrap();
        std::fs::write(dir.join("README"), b"x").unwrap();
        assert!(w.has_history(2));
        assert_eq!(
            w.resume_point().unwrap().unwrap().start,
            segs.segment_start(6)
        );
        // A truncated complete segment is refused.
        std::fs::write(dir.join("000000010000000000000009"), b"short").unwrap();
        assert!(matches!(w.resume_point(), Err(Error::WalFile { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
