//! The records of a streamed (in-progress) transaction, held until its
//! commit: in memory up to a limit, then in an unlinked file.
//!
//! A streamed transaction's changes arrive before anyone knows whether it
//! commits, so they cannot go into Kafka yet; and it may be far larger than
//! memory. Its records are encoded as they arrive (without the commit's
//! fields, which [`crate::format::stamp`] adds at the commit) and appended
//! here. A subtransaction that aborts takes its records, and those of every
//! later subtransaction of the same transaction, with it: until it aborted,
//! every change of the transaction was its own or a child's (the server
//! decodes in WAL order, and a subtransaction's abort comes before anything
//! its siblings do afterwards), which is the rule PostgreSQL's own apply
//! worker relies on for its spool files.

use std::io::SeekFrom;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader, BufWriter};

use crate::format::Record;

/// A transaction's records, in order.
pub(crate) struct Spill {
    /// The records in memory (after those in the file).
    memory: Vec<Record>,
    memory_bytes: usize,
    /// The file, once the transaction outgrew memory, and its length.
    file: Option<(BufWriter<tokio::fs::File>, u64)>,
    /// Records in the file.
    in_file: usize,
    /// Subtransactions in order of their first change: (xid, records
    /// before it, and once that record is in the file, its offset).
    subxacts: Vec<(u32, usize, Option<u64>)>,
}

fn size(r: &Record) -> usize {
    r.topic.len() + r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len) + 48
}

impl Spill {
    pub(crate) fn new() -> Spill {
        Spill {
            memory: Vec::new(),
            memory_bytes: 0,
            file: None,
            in_file: 0,
            subxacts: Vec::new(),
        }
    }

    /// Whether records went to the file.
    pub(crate) fn on_disk(&self) -> bool {
        self.file.is_some()
    }

    /// Bytes held in memory.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }

    /// Appends a record of subtransaction `subxid` (the top-level xid for
    /// its own changes).
    pub(crate) fn push(&mut self, top: u32, subxid: u32, r: Record) {
        if subxid != top && !self.subxacts.iter().any(|(x, _, _)| *x == subxid) {
            self.subxacts
                .push((subxid, self.in_file + self.memory.len(), None));
        }
        self.memory_bytes += size(&r);
        self.memory.push(r);
    }

    /// Drops the records of `subxid` and of all subtransactions after it.
    pub(crate) async fn abort_subxact(&mut self, subxid: u32) -> std::io::Result<()> {
        let Some(i) = self.subxacts.iter().position(|(x, _, _)| *x == subxid) else {
            // it wrote nothing
            return Ok(());
        };
        let (_, count, offset) = self.subxacts[i];
        self.subxacts.truncate(i);
        if count >= self.in_file {
            self.memory.truncate(count - self.in_file);
        } else {
            self.memory.clear();
            let offset = offset.expect("set when its first record was spilled");
            let (w, len) = self.file.as_mut().expect("records in the file");
            w.flush().await?;
            w.get_mut().set_len(offset).await?;
            w.get_mut().seek(SeekFrom::Start(offset)).await?;
            *len = offset;
            self.in_file = count;
        }
        self.memory_bytes = self.memory.iter().map(size).sum();
        Ok(())
    }

    /// Moves the records in memory to the file (created in `dir`, unlinked).
    pub(crate) async fn spill(&mut self, dir: &Path) -> std::io::Result<()> {
        if self.file.is_none() {
            let dir = dir.to_owned();
            let f = tokio::task::spawn_blocking(move || tempfile::tempfile_in(dir))
                .await
                .map_err(std::io::Error::other)??;
            self.file = Some((BufWriter::new(tokio::fs::File::from_std(f)), 0));
        }
        let (w, len) = self.file.as_mut().expect("just made");
        for r in self.memory.drain(..) {
            for (_, count, offset) in self.subxacts.iter_mut().rev() {
                if *count < self.in_file {
                    break;
                }
                if *count == self.in_file {
                    *offset = Some(*len);
                }
            }
            let mut frame = Vec::with_capacity(size(&r));
            frame.extend_from_slice(&(r.topic.len() as u32).to_le_bytes());
            frame.extend_from_slice(r.topic.as_bytes());
            for part in [&r.key, &r.value] {
                match part {
                    None => frame.extend_from_slice(&u32::MAX.to_le_bytes()),
                    Some(b) => {
                        frame.extend_from_slice(&(b.len() as u32).to_le_bytes());
                        frame.extend_from_slice(b);
                    }
                }
            }
            w.write_all(&frame).await?;
            *len += frame.len() as u64;
            self.in_file += 1;
        }
        self.memory_bytes = 0;
        Ok(())
    }

    /// Reads the records back, in order.
    pub(crate) async fn into_reader(mut self) -> std::io::Result<SpillReader> {
        let file = match self.file.take() {
            Some((mut w, _)) => {
                w.flush().await?;
                let mut file = w.into_inner();
                file.seek(SeekFrom::Start(0)).await?;
                Some(BufReader::with_capacity(1 << 20, file))
            }
            None => None,
        };
        Ok(SpillReader {
            file,
            in_file: self.in_file,
            memory: std::mem::take(&mut self.memory).into_iter(),
        })
    }
}

/// A transaction's records, read back.
pub(crate) struct SpillReader {
    file: Option<BufReader<tokio::fs::File>>,
    in_file: usize,
    memory: std::vec::IntoIter<Record>,
}

impl SpillReader {
    /// The next record.
    pub(crate) async fn next(&mut self) -> std::io::Result<Option<Record>> {
        if self.in_file > 0 {
            let r = self.file.as_mut().expect("records in the file");
            self.in_file -= 1;
            let topic = String::from_utf8(read_part(r).await?.unwrap_or_default())
                .map_err(std::io::Error::other)?;
            let key = read_part(r).await?;
            let value = read_part(r).await?;
            return Ok(Some(Record { topic, key, value }));
        }
        Ok(self.memory.next())
    }
}

async fn read_part(r: &mut BufReader<tokio::fs::File>) -> std::io::Result<Option<Vec<u8>>> {
    let n = r.read_u32_le().await?;
    if n == u32::MAX {
        return Ok(None);
    }
    let mut b = vec![0; n as usize];
    r.read_exact(&mut b).await?;
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u32) -> Record {
        Record {
            topic: format!("t{i}"),
            key: (!i.is_multiple_of(3)).then(|| i.to_le_bytes().to_vec()),
            value: (!i.is_multiple_of(5)).then(|| vec![i as u8; i as usize]),
        }
    }

    async fn contents(s: Spill) -> Vec<Record> {
        let mut out = Vec::new();
        let mut r = s.into_reader().await.unwrap();
        while let Some(x) = r.next().await.unwrap() {
            out.push(x);
        }
        out
    }

    #[tokio::test]
    async fn keeps_order_across_memory_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spill::new();
        for i in 0..10 {
            s.push(1, 1, rec(i));
        }
        s.spill(dir.path()).await.unwrap();
        assert_eq!(s.memory_bytes(), 0);
        for i in 10..15 {
            s.push(1, 1, rec(i));
        }
        s.spill(dir.path()).await.unwrap();
        for i in 15..20 {
            s.push(1, 1, rec(i));
        }
        assert_eq!(contents(s).await, (0..20).map(rec).collect::<Vec<_>>());
        // the file is unlinked: nothing is left in the directory
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn subtransaction_abort_truncates_memory_and_file() {
        let dir = tempfile::tempdir().unwrap();
        // in memory only
        let mut s = Spill::new();
        s.push(1, 1, rec(0));
        s.push(1, 7, rec(1));
        s.push(1, 8, rec(2));
        s.abort_subxact(8).await.unwrap();
        s.push(1, 9, rec(3));
        assert_eq!(contents(s).await, vec![rec(0), rec(1), rec(3)]);
        // the aborted subtransaction starts in the file
        let mut s = Spill::new();
        s.push(1, 1, rec(0));
        s.push(1, 7, rec(1));
        s.push(1, 7, rec(2));
        s.spill(dir.path()).await.unwrap();
        s.push(1, 8, rec(3));
        s.abort_subxact(7).await.unwrap();
        s.push(1, 1, rec(4));
        s.spill(dir.path()).await.unwrap();
        s.push(1, 1, rec(5));
        assert_eq!(contents(s).await, vec![rec(0), rec(4), rec(5)]);
        // a subtransaction that wrote nothing
        let mut s = Spill::new();
        s.push(1, 1, rec(0));
        s.abort_subxact(42).await.unwrap();
        assert_eq!(contents(s).await, vec![rec(0)]);
    }
}
