//! The WAL position type.

use std::fmt;
use std::ops::{Add, Sub};
use std::str::FromStr;

/// A position in the write-ahead log (`pg_lsn`), a 64-bit byte offset.
///
/// Displays and parses as PostgreSQL does: two hexadecimal halves separated by
/// a slash, upper half first.
///
/// ```
/// use pgwal_protocol::Lsn;
///
/// let lsn: Lsn = "16/B374D848".parse().unwrap();
/// assert_eq!(u64::from(lsn), 0x16_B374_D848);
/// assert_eq!(lsn.to_string(), "16/B374D848");
/// assert!(lsn > Lsn::INVALID);
/// assert_eq!((lsn + 8) - lsn, 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid position `0/0`.
    pub const INVALID: Lsn = Lsn(0);

    /// Whether this is `0/0`.
    pub fn is_invalid(self) -> bool {
        self.0 == 0
    }

    /// Adds `bytes`, or `None` on overflow.
    pub fn checked_add(self, bytes: u64) -> Option<Lsn> {
        self.0.checked_add(bytes).map(Lsn)
    }

    /// The distance from `earlier` to `self`, or `None` if `earlier` is later.
    pub fn checked_sub(self, earlier: Lsn) -> Option<u64> {
        self.0.checked_sub(earlier.0)
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Self {
        Lsn(v)
    }
}

impl From<Lsn> for u64 {
    fn from(v: Lsn) -> Self {
        v.0
    }
}

impl Add<u64> for Lsn {
    type Output = Lsn;
    /// Saturates at the largest position.
    fn add(self, rhs: u64) -> Lsn {
        Lsn(self.0.saturating_add(rhs))
    }
}

impl Sub for Lsn {
    type Output = u64;
    /// The byte distance, saturating at zero.
    fn sub(self, rhs: Lsn) -> u64 {
        self.0.saturating_sub(rhs.0)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text was not an `X/Y` LSN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hexadecimal numbers separated by '/'")]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;
    fn from_str(s: &str) -> Result<Lsn, ParseLsnError> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let ok =
            |p: &str| !p.is_empty() && p.len() <= 8 && p.bytes().all(|b| b.is_ascii_hexdigit());
        if !ok(hi) || !ok(lo) {
            return Err(err());
        }
        let hi = u64::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u64::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((hi << 32) | lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display_roundtrip() {
        for s in ["0/0", "0/1", "FFFFFFFF/FFFFFFFF", "16/B374D848", "1/0"] {
            assert_eq!(s.parse::<Lsn>().unwrap().to_string(), s);
        }
        assert_eq!("a/b".parse::<Lsn>().unwrap(), Lsn(0xa_0000_000b));
    }

    #[test]
    fn parse_rejects_garbage() {
        for s in [
            "",
            "/",
            "1/",
            "/1",
            "1",
            "g/1",
            "1/1/1",
            "123456789/0",
            "-1/0",
            " 1/0",
        ] {
            assert!(s.parse::<Lsn>().is_err(), "{s}");
        }
    }

    #[test]
    fn ordering_and_arithmetic() {
        assert!(Lsn(1) < Lsn(2));
        assert_eq!(Lsn(10) - Lsn(4), 6);
        assert_eq!(Lsn(4) - Lsn(10), 0);
        assert_eq!(Lsn(u64::MAX) + 1, Lsn(u64::MAX));
        assert_eq!(Lsn(4).checked_sub(Lsn(10)), None);
        assert_eq!(Lsn(u64::MAX).checked_add(1), None);
    }
}
