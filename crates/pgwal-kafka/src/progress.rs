//! The progress topic: after each Kafka transaction, the end position of the
//! last PostgreSQL transaction it holds, written in that same transaction.
//!
//! One compacted topic with one partition serves many streams; the record
//! key names the stream (`<system identifier>/<slot>`), so compaction keeps
//! the last position of each. Read with `isolation.level=read_committed`,
//! the last record of a key is the last committed Kafka transaction of that
//! stream: everything at or before its position is in Kafka exactly once.
//!
//! While a snapshot runs (see [`crate::snapshot`]) the record also carries
//! its cursor: the tables still to read and the last key read of the
//! first, so that a restart goes on after the last chunk Kafka holds.

use pgwal_protocol::Lsn;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::snapshot::SnapshotCursor;

/// The key of a stream's progress records.
pub fn key(system_identifier: &str, slot: &str) -> String {
    format!("{system_identifier}/{slot}")
}

/// What one progress record says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Progress {
    /// Kafka holds every PostgreSQL transaction that ends at or before it.
    #[serde(with = "lsn_text")]
    pub end_lsn: Lsn,
    /// The server's timeline `end_lsn` is on (absent in records written
    /// before it was recorded): a later start refuses a server whose
    /// history does not contain the position (see `server_history`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// The snapshot in progress, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotCursor>,
}

impl Progress {
    /// A position without a snapshot.
    pub fn at(end_lsn: Lsn) -> Progress {
        Progress {
            end_lsn,
            timeline: None,
            snapshot: None,
        }
    }
}

mod lsn_text {
    use pgwal_protocol::Lsn;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(l: &Lsn, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&l.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A progress record's value for `end_lsn` alone.
pub fn value(end_lsn: Lsn) -> Vec<u8> {
    serde_json::to_vec(&json!({"end_lsn": end_lsn.to_string()})).expect("JSON serializes")
}

/// A progress record's value.
pub fn value_of(p: &Progress) -> Vec<u8> {
    serde_json::to_vec(p).expect("JSON serializes")
}

/// The position in a progress record's value.
pub fn parse(value: &[u8]) -> Option<Lsn> {
    parse_progress(value).map(|p| p.end_lsn)
}

/// A progress record's value, whole.
pub fn parse_progress(value: &[u8]) -> Option<Progress> {
    serde_json::from_slice(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let l: Lsn = "1/2A".parse().unwrap();
        assert_eq!(parse(&value(l)), Some(l));
        assert_eq!(parse(b"{}"), None);
        let p = Progress {
            end_lsn: l,
            timeline: Some(2),
            snapshot: Some(SnapshotCursor::new(vec!["public.t".into(), "s.u".into()])),
        };
        assert_eq!(parse_progress(&value_of(&p)), Some(p.clone()));
        // written before snapshots existed: no cursor
        assert_eq!(parse_progress(&value(l)), Some(Progress::at(l)));
    }
}
