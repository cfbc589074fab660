//! Acknowledgement bookkeeping shared by the consumer and the connection task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pgwal_protocol::Lsn;

/// State shared between a [`LogicalStream`](crate::LogicalStream), its
/// [`AckHandle`]s and the connection task.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Highest position the consumer acknowledged.
    pub(crate) acked: AtomicU64,
    /// Position last confirmed to the server (flush).
    pub(crate) confirmed: AtomicU64,
    /// Session generation; events of older sessions are dropped.
    pub(crate) generation: AtomicU64,
    /// The server's WAL end, from the latest XLogData or keepalive.
    pub(crate) server_end: AtomicU64,
}

/// Acknowledges processed positions of a stream; cheap to clone and `Send`,
/// so a sink task can ack while another task reads the stream.
///
/// Acknowledging `lsn` declares that every event whose
/// [`ack_lsn`](crate::Event::ack_lsn) is at or before `lsn` is durably
/// processed. Acks only move forward; smaller values are ignored.
#[derive(Debug, Clone)]
pub struct AckHandle {
    pub(crate) shared: Arc<Shared>,
}

impl AckHandle {
    /// Acknowledges everything up to `lsn`.
    pub fn ack(&self, lsn: Lsn) {
        self.shared.acked.fetch_max(lsn.0, Ordering::SeqCst);
    }

    /// The highest acknowledged position.
    pub fn acked(&self) -> Lsn {
        Lsn(self.shared.acked.load(Ordering::SeqCst))
    }

    /// The position last reported to the server as flushed (what the slot's
    /// `confirmed_flush_lsn` becomes).
    pub fn confirmed(&self) -> Lsn {
        Lsn(self.shared.confirmed.load(Ordering::SeqCst))
    }
}

/// What the connection task knows about delivery, to decide what it may confirm.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    /// Inside Begin..Commit or Begin Prepare..Prepare.
    pub(crate) in_txn: bool,
    /// Streamed transactions begun but not committed/aborted/prepared.
    pub(crate) open_streams: Vec<u32>,
    /// Highest ack point among events received this session.
    pub(crate) last_ack_point: Lsn,
    /// Highest WAL end seen in a keepalive.
    pub(crate) keepalive_end: Lsn,
}

impl Delivery {
    /// The flush position to report: the acked position, or — when every
    /// received event is acked and no transaction is open — the server's
    /// keepalive WAL end, so an idle slot keeps advancing.
    pub(crate) fn flush_position(&self, acked: Lsn) -> Lsn {
        if !self.in_txn && self.open_streams.is_empty() && acked >= self.last_ack_point {
            acked.max(self.keepalive_end)
        } else {
            acked
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_advance_only_when_everything_is_acked() {
        let mut d = Delivery {
            keepalive_end: Lsn(100),
            last_ack_point: Lsn(50),
            ..Default::default()
        };
        assert_eq!(d.flush_position(Lsn(40)), Lsn(40));
        assert_eq!(d.flush_position(Lsn(50)), Lsn(100));
        d.in_txn = true;
        assert_eq!(d.flush_position(Lsn(50)), Lsn(50));
        d.in_txn = false;
        d.open_streams.push(7);
        assert_eq!(d.flush_position(Lsn(50)), Lsn(50));
    }
}
