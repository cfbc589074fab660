//! The progress topic: after each Kafka transaction, the end position of the
//! last PostgreSQL transaction it holds, written in that same transaction.
//!
//! One compacted topic with one partition serves many streams; the record
//! key names the stream (`<system identifier>/<slot>`), so compaction keeps
//! the last position of each. Read with `isolation.level=read_committed`,
//! the last record of a key is the last committed Kafka transaction of that
//! stream: everything at or before its position is in Kafka exactly once.

use pgwal_protocol::Lsn;
use serde_json::json;

/// The key of a stream's progress records.
pub fn key(system_identifier: &str, slot: &str) -> String {
    format!("{system_identifier}/{slot}")
}

/// A progress record's value.
pub fn value(end_lsn: Lsn) -> Vec<u8> {
    serde_json::to_vec(&json!({"end_lsn": end_lsn.to_string()})).expect("JSON serializes")
}

/// The position in a progress record's value.
pub fn parse(value: &[u8]) -> Option<Lsn> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    v.get("end_lsn")?.as_str()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let l: pgwal_protocol::Lsn = "1/2A".parse().unwrap();
        assert_eq!(super::parse(&super::value(l)), Some(l));
        assert_eq!(super::parse(b"{}"), None);
    }
}
