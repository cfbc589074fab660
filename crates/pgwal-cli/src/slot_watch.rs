//! `pgwal stream`'s watch on its slot: how much WAL may still be written
//! before `max_slot_wal_keep_size` invalidates it, checked on a connection
//! of its own (the stream's is busy streaming), with a warning on stderr
//! when that runs low.

use std::time::Duration;

use pgwal::{Config, ReplicationClient, Result};

/// What the watch last saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotRoom {
    /// `safe_wal_size`: bytes of WAL that may be written before the slot is
    /// invalidated; `None` without a `max_slot_wal_keep_size`.
    pub(crate) safe_wal_bytes: Option<i64>,
    /// `max_slot_wal_keep_size` in bytes (`None`: unlimited).
    pub(crate) limit_bytes: Option<i64>,
}

impl SlotRoom {
    /// Whether to warn: less than a quarter of the limit left.
    pub(crate) fn low(&self) -> bool {
        matches!((self.safe_wal_bytes, self.limit_bytes), (Some(s), Some(l)) if s < l / 4)
    }
}

/// Reads the slot's room once (13+; `None` on older servers or no such slot).
pub(crate) async fn room(config: &Config, slot: &str) -> Result<Option<SlotRoom>> {
    let mut c = ReplicationClient::connect(config).await?;
    if c.server_major_version().unwrap_or(0) < 13 {
        return Ok(None);
    }
    let limit = c.show("max_slot_wal_keep_size").await?;
    let rows = c
        .simple_query(&format!(
            "SELECT safe_wal_size, pg_catalog.pg_size_bytes(pg_catalog.current_setting('max_slot_wal_keep_size')) \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = '{}'",
            slot.replace('\'', "''")
        ))
        .await?;
    Ok(rows.first().map(|r| SlotRoom {
        safe_wal_bytes: r.get_index(0).and_then(|v| v.parse().ok()),
        limit_bytes: (limit != "-1")
            .then(|| r.get_index(1).and_then(|v| v.parse().ok()))
            .flatten(),
    }))
}

/// Checks every `every` until the process ends; warns on stderr (at most
/// once per check) while the slot's room is low, and hands each reading to
/// `seen` (the metrics).
pub(crate) fn spawn(
    config: Config,
    slot: String,
    every: Duration,
    seen: impl Fn(SlotRoom) + Send + 'static,
) {
    tokio::spawn(async move {
        loop {
            match room(&config, &slot).await {
                Ok(Some(r)) => {
                    if r.low() {
                        eprintln!(
                            "pgwal: WARNING: slot {slot:?} will be invalidated by max_slot_wal_keep_size \
                             after {} more bytes of WAL ({} MB kept at most)",
                            r.safe_wal_bytes.unwrap_or_default(),
                            r.limit_bytes.unwrap_or_default() / (1024 * 1024)
                        );
                    }
                    seen(r);
                }
                Ok(None) => {}
                // the stream reports connection trouble itself
                Err(_) => {}
            }
            tokio::time::sleep(every).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_below_a_quarter_of_the_limit() {
        let r = |s, l| SlotRoom {
            safe_wal_bytes: s,
            limit_bytes: l,
        };
        assert!(r(Some(10), Some(100)).low());
        assert!(!r(Some(30), Some(100)).low());
        assert!(!r(None, None).low());
        assert!(!r(Some(-5), None).low());
    }
}
