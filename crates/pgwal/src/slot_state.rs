//! The consumer's own record of how far it let a slot go
//! ([`StreamConfig::state_file`](crate::StreamConfig::state_file)).
//!
//! A slot's `confirmed_flush_lsn` is the only thing that says where a
//! stream resumes, and the server lets anybody move it: a slot dropped and
//! created again starts at the current WAL, another consumer on the same
//! slot confirms what it processed. Either way, resuming there silently
//! skips changes this consumer never saw. So the stream writes the position
//! it is about to confirm to a file *before* it sends it; the slot can then
//! never be legitimately ahead of the file, and a slot that is ahead was
//! moved by someone else: the stream refuses to start (nothing acknowledged)
//! and says by how much.

use std::io::Write;
use std::path::{Path, PathBuf};

use pgwal_protocol::Lsn;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What the state file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlotState {
    /// The server's system identifier (a promoted standby keeps it).
    pub(crate) system_identifier: String,
    /// The slot.
    pub(crate) slot: String,
    /// The highest position this consumer confirmed (or was about to).
    #[serde(with = "lsn_text")]
    pub(crate) confirmed: Lsn,
}

/// Positions in the file as PostgreSQL writes them (`0/16B3748`).
mod lsn_text {
    use pgwal_protocol::Lsn;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(l: &Lsn, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&l.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let t = String::deserialize(d)?;
        t.parse().map_err(serde::de::Error::custom)
    }
}

fn io_error(path: &Path, op: &'static str, source: std::io::Error) -> Error {
    Error::StateFile {
        path: path.to_owned(),
        op,
        source,
    }
}

/// Reads the state file; `None` if it does not exist yet.
pub(crate) fn load(path: &Path) -> Result<Option<SlotState>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io_error(
                path,
                "parse",
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(path, "read", e)),
    }
}

/// Replaces the state file durably: a temporary file, fsynced, renamed over
/// it, and the directory fsynced, so a crash leaves the old or the new one.
pub(crate) fn store(path: &Path, state: &SlotState) -> Result<()> {
    let tmp: PathBuf = {
        let mut name = path.file_name().unwrap_or_default().to_owned();
        name.push(".tmp");
        path.with_file_name(name)
    };
    let body = serde_json::to_vec(state).expect("serializable");
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_error(&tmp, "create", e))?;
    f.write_all(&body)
        .and_then(|_| f.sync_all())
        .map_err(|e| io_error(&tmp, "write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error(path, "rename into", e))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, "fsync", e))
}

/// Checks the file against the server and slot the stream is about to use;
/// returns the position the slot may at most be at.
pub(crate) fn check(
    path: &Path,
    state: &SlotState,
    system_identifier: &str,
    slot: &str,
) -> Result<Lsn> {
    if state.system_identifier != system_identifier {
        return Err(Error::StateMismatch {
            path: path.to_owned(),
            what: "server (system identifier)",
            file: state.system_identifier.clone(),
            server: system_identifier.to_owned(),
        });
    }
    if state.slot != slot {
        return Err(Error::StateMismatch {
            path: path.to_owned(),
            what: "slot",
            file: state.slot.clone(),
            server: slot.to_owned(),
        });
    }
    Ok(state.confirmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(confirmed: u64) -> SlotState {
        SlotState {
            system_identifier: "7312".into(),
            slot: "app".into(),
            confirmed: Lsn(confirmed),
        }
    }

    #[test]
    fn store_load_and_check() {
        let dir = std::env::temp_dir().join(format!("pgwal-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("app.state");
        assert_eq!(load(&path).unwrap(), None);
        store(&path, &state(100)).unwrap();
        store(&path, &state(200)).unwrap();
        let s = load(&path).unwrap().unwrap();
        assert_eq!(s, state(200));
        assert_eq!(check(&path, &s, "7312", "app").unwrap(), Lsn(200));
        assert!(matches!(
            check(&path, &s, "9999", "app"),
            Err(Error::StateMismatch { what, .. }) if what.starts_with("server")
        ));
        assert!(matches!(
            check(&path, &s, "7312", "other"),
            Err(Error::StateMismatch { what: "slot", .. })
        ));
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(
            load(&path),
            Err(Error::StateFile { op: "parse", .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
