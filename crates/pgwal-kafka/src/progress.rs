//! The progress topic: after each Kafka transaction, the end position of the
//! last PostgreSQL transaction it holds, written in that same transaction.
//!
//! One compacted topic serves many streams; the record key names the
//! stream (`<system identifier>/<slot>`), so compaction keeps the last
//! position of each, and picks the partition ([`partition`]): a topic pgwal
//! creates has [`PARTITIONS`], so that streams rarely share one; an existing
//! topic keeps its count (one, for a topic made by pgwal before). Read with `isolation.level=read_committed`,
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

/// The partitions of a progress topic pgwal creates.
pub const PARTITIONS: i32 = 32;

/// The key of a stream's progress records.
pub fn key(system_identifier: &str, slot: &str) -> String {
    format!("{system_identifier}/{slot}")
}

/// The partition of the progress topic a stream's records go to, of
/// `partitions`: FNV-1a of the key, so that it is the same for every
/// release and machine. Streams on different partitions never wait for
/// each other: a read_committed read of a partition stops at the first
/// transaction still open in it, and a stream that died with one open
/// would hold every other stream's start on that partition until the
/// broker aborts it (`transaction.timeout.ms`).
///
/// ```
/// let k = pgwal_kafka::progress::key("7433316424432381437", "app");
/// let p = pgwal_kafka::progress::partition(&k, 32);
/// assert!((0..32).contains(&p));
/// assert_eq!(pgwal_kafka::progress::partition(&k, 1), 0);
/// ```
pub fn partition(key: &str, partitions: i32) -> i32 {
    (fnv1a(key) % partitions.max(1) as u32) as i32
}

/// FNV-1a (32 bits) of `s`: a hash that is the same for every release and
/// machine, for what one sink writes and another must find (the progress
/// partition, the slot's lock).
pub(crate) fn fnv1a(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
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

    #[test]
    fn partitions_are_pinned_and_spread() {
        // pinned: a sink of the next release must read where this one wrote
        assert_eq!(partition("a", 1 << 30), 0x640c_292c % (1 << 30));
        assert_eq!(partition("x", 1), 0);
        let used: std::collections::HashSet<i32> = (0..200)
            .map(|n| {
                partition(
                    &key("7433316424432381437", &format!("slot_{n}")),
                    PARTITIONS,
                )
            })
            .collect();
        assert_eq!(used.len(), PARTITIONS as usize);
    }
}
