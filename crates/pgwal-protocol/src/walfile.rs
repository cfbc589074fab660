//! WAL segment and timeline history file names, as `pg_wal` and
//! `pg_receivewal` spell them (sans-IO: names and arithmetic only).
//!
//! A segment file is named by three 8-digit upper-case hexadecimal numbers:
//! the timeline, then the segment number split into a "log" part and a
//! "segment within log" part (`0x1_0000_0000 / segment size` segments per
//! log). A timeline's history file is `TTTTTTTT.history`.
//!
//! ```
//! use pgwal_protocol::walfile::WalSegments;
//! use pgwal_protocol::Lsn;
//!
//! let segs = WalSegments::new(16 * 1024 * 1024).unwrap();
//! let segno = segs.segment_of(Lsn(0x1_2300_0010));
//! assert_eq!(segs.file_name(1, segno), "000000010000000100000023");
//! assert_eq!(segs.parse_file_name("000000010000000100000023"), Some((1, segno)));
//! assert_eq!(segs.segment_start(segno), Lsn(0x1_2300_0000));
//! assert_eq!(pgwal_protocol::walfile::history_file_name(2), "00000002.history");
//! ```

use crate::Lsn;

/// Suffix of a segment that is still being written.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// Segment arithmetic for one segment size (a power of two from 1 MB to 1 GB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalSegments {
    size: u64,
}

impl WalSegments {
    /// `None` unless `size` is a power of two between 1 MB and 1 GB (what
    /// `initdb --wal-segsize` accepts).
    pub fn new(size: u64) -> Option<WalSegments> {
        (size.is_power_of_two() && (1 << 20..=1 << 30).contains(&size))
            .then_some(WalSegments { size })
    }

    /// The segment size in bytes.
    pub fn size(self) -> u64 {
        self.size
    }

    fn per_log(self) -> u64 {
        0x1_0000_0000 / self.size
    }

    /// The number of the segment holding `lsn`.
    pub fn segment_of(self, lsn: Lsn) -> u64 {
        lsn.0 / self.size
    }

    /// The offset of `lsn` within its segment.
    pub fn offset_of(self, lsn: Lsn) -> u64 {
        lsn.0 % self.size
    }

    /// The first position of segment `segno`.
    pub fn segment_start(self, segno: u64) -> Lsn {
        Lsn(segno.saturating_mul(self.size))
    }

    /// The file name of segment `segno` on `timeline` (no suffix).
    pub fn file_name(self, timeline: u32, segno: u64) -> String {
        format!(
            "{timeline:08X}{:08X}{:08X}",
            segno / self.per_log(),
            segno % self.per_log()
        )
    }

    /// Parses a segment file name (24 hexadecimal digits, no suffix) into
    /// `(timeline, segno)`; `None` for anything else, including a
    /// "segment within log" part too large for this segment size.
    pub fn parse_file_name(self, name: &str) -> Option<(u32, u64)> {
        if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let part = |r: std::ops::Range<usize>| u64::from_str_radix(&name[r], 16).ok();
        let (tli, log, seg) = (part(0..8)?, part(8..16)?, part(16..24)?);
        if tli == 0 || seg >= self.per_log() {
            return None;
        }
        Some((tli as u32, log * self.per_log() + seg))
    }
}

/// The history file name of `timeline`, e.g. `00000002.history`.
pub fn history_file_name(timeline: u32) -> String {
    format!("{timeline:08X}.history")
}

/// Parses `SHOW wal_segment_size` output (`16MB`, `1GB`, `1048576`, `64kB`…)
/// into bytes.
///
/// ```
/// assert_eq!(pgwal_protocol::walfile::parse_size("16MB"), Some(16 << 20));
/// assert_eq!(pgwal_protocol::walfile::parse_size("1GB"), Some(1 << 30));
/// assert_eq!(pgwal_protocol::walfile::parse_size("sixteen"), None);
/// ```
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = s[..digits].parse().ok()?;
    let unit = match s[digits..].trim() {
        "" | "B" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roundtrip_for_every_size() {
        for shift in 20..=30 {
            let s = WalSegments::new(1 << shift).unwrap();
            for segno in [0u64, 1, 255, 256, 4095, 4096, 1 << 20, 123_456] {
                for tli in [1u32, 2, 0xABCD] {
                    let name = s.file_name(tli, segno);
                    assert_eq!(name.len(), 24);
                    assert_eq!(s.parse_file_name(&name), Some((tli, segno)), "{name}");
                }
            }
        }
        let s = WalSegments::new(16 << 20).unwrap();
        assert_eq!(s.file_name(1, 0x100), "000000010000000100000000");
        assert_eq!(
            s.parse_file_name("000000010000000100000100"),
            None,
            "seg part too large for 16MB"
        );
        assert_eq!(
            s.parse_file_name("000000000000000100000000"),
            None,
            "timeline 0"
        );
        assert_eq!(s.parse_file_name("00000001000000010000000G"), None);
        assert_eq!(s.parse_file_name("00000001000000010000000"), None);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(WalSegments::new(0).is_none());
        assert!(WalSegments::new(3 << 20).is_none());
        assert!(WalSegments::new(1 << 19).is_none());
        assert!(WalSegments::new(1 << 31).is_none());
        assert_eq!(parse_size("1 MB"), Some(1 << 20));
        assert_eq!(parse_size("MB"), None);
    }
}
