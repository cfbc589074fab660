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
}
