//! PostgreSQL timestamps as sent by the replication protocol.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// A timestamp in microseconds since 2000-01-01 00:00:00 UTC, as carried by
/// replication and pgoutput messages.
///
/// ```
/// use pgwal_protocol::PgTimestamp;
/// use std::time::UNIX_EPOCH;
///
/// assert_eq!(PgTimestamp(0).to_system_time().duration_since(UNIX_EPOCH).unwrap().as_secs(), 946_684_800);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    /// The current time.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// Converts from a [`SystemTime`], saturating outside the representable range.
    pub fn from_system_time(t: SystemTime) -> Self {
        let unix_micros = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
        };
        PgTimestamp(unix_micros.saturating_sub(PG_EPOCH_OFFSET_MICROS))
    }

    /// Converts to a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        let unix = self.0.saturating_add(PG_EPOCH_OFFSET_MICROS);
        if unix >= 0 {
            UNIX_EPOCH + Duration::from_micros(unix as u64)
        } else {
            UNIX_EPOCH - Duration::from_micros(unix.unsigned_abs())
        }
    }

    /// ISO 8601 text in UTC with microseconds (`2024-02-29T12:34:56.789000Z`);
    /// PostgreSQL's `infinity` and `-infinity` as those words.
    ///
    /// ```
    /// use pgwal_protocol::PgTimestamp;
    ///
    /// assert_eq!(PgTimestamp(0).to_iso8601(), "2000-01-01T00:00:00.000000Z");
    /// ```
    pub fn to_iso8601(self) -> String {
        match self.0 {
            i64::MAX => "infinity".into(),
            i64::MIN => "-infinity".into(),
            micros => {
                let secs = micros.div_euclid(1_000_000);
                let sod = secs.rem_euclid(86_400);
                format!(
                    "{}T{:02}:{:02}:{:02}.{:06}Z",
                    format_pg_date(secs.div_euclid(86_400)),
                    sod / 3600,
                    sod / 60 % 60,
                    sod % 60,
                    micros.rem_euclid(1_000_000)
                )
            }
        }
    }
}

/// `YYYY-MM-DD` for a day count since 2000-01-01, PostgreSQL's `date` epoch.
///
/// ```
/// assert_eq!(pgwal_protocol::format_pg_date(-1), "1999-12-31");
/// ```
pub fn format_pg_date(days_since_2000: i64) -> String {
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days_since_2000 + 10_957 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601() {
        assert_eq!(PgTimestamp(0).to_iso8601(), "2000-01-01T00:00:00.000000Z");
        assert_eq!(PgTimestamp(-1).to_iso8601(), "1999-12-31T23:59:59.999999Z");
        // 2024-02-29 12:34:56.789 UTC
        assert_eq!(
            PgTimestamp(762_525_296_789_000).to_iso8601(),
            "2024-02-29T12:34:56.789000Z"
        );
        assert_eq!(PgTimestamp(i64::MAX).to_iso8601(), "infinity");
        assert_eq!(PgTimestamp(i64::MIN).to_iso8601(), "-infinity");
    }

    #[test]
    fn dates() {
        assert_eq!(format_pg_date(0), "2000-01-01");
        assert_eq!(format_pg_date(-10_957), "1970-01-01");
        assert_eq!(format_pg_date(8_825), "2024-02-29");
    }
}
