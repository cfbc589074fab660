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
    /// Highest position this stream told (or began telling) any server it
    /// confirmed, or accepted as a slot's start; 0 before the first
    /// session. A slot found beyond it on a reconnect was moved by someone
    /// else, or is a promoted standby's synced slot that ran ahead.
    pub(crate) claimed: AtomicU64,
    /// Session generation; events of older sessions are dropped.
    pub(crate) generation: AtomicU64,
    /// The server's WAL end, from the latest XLogData or keepalive.
    pub(crate) server_end: AtomicU64,
    /// Highest ack point of the events handed to the consumer (initially
    /// where streaming began): what [`AckHandle::try_ack`] accepts.
    pub(crate) delivered: AtomicU64,
    /// The server's system identifier, once a state file needed it.
    pub(crate) system_id: std::sync::OnceLock<String>,
    /// [`LogicalStream::request_position`](crate::LogicalStream::request_position)
    /// asked for the server's position (a stored permit until the
    /// connection task takes it).
    pub(crate) position_request: tokio::sync::Notify,
}

impl Shared {
    /// Acknowledges `lsn` if the consumer was given everything up to it.
    pub(crate) fn try_ack(&self, lsn: Lsn) -> crate::Result<()> {
        let delivered = Lsn(self.delivered.load(Ordering::SeqCst));
        if lsn > delivered {
            return Err(crate::Error::AckBeyondDelivery {
                acked: lsn,
                delivered,
            });
        }
        self.acked.fetch_max(lsn.0, Ordering::SeqCst);
        Ok(())
    }
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

    /// Acknowledges everything up to `lsn`, unless `lsn` lies beyond the
    /// ack point of the last event the stream handed out: then nothing is
    /// acknowledged and [`Error::AckBeyondDelivery`](crate::Error::AckBeyondDelivery)
    /// says so. Use it where the position comes from outside the program (a
    /// consumer process, a file): acknowledging past what was delivered
    /// would let the slot skip changes nobody processed.
    ///
    /// ```no_run
    /// # async fn f(stream: pgwal::LogicalStream) -> pgwal::Result<()> {
    /// let acks = stream.ack_handle();
    /// let from_consumer: pgwal::Lsn = "0/16B3748".parse().unwrap();
    /// acks.try_ack(from_consumer)?; // an error if the stream never got there
    /// # Ok(()) }
    /// ```
    pub fn try_ack(&self, lsn: Lsn) -> crate::Result<()> {
        self.shared.try_ack(lsn)
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
    fn try_ack_refuses_what_was_not_delivered() {
        let s = Shared::default();
        s.delivered.store(100, Ordering::SeqCst);
        assert!(s.try_ack(Lsn(100)).is_ok());
        match s.try_ack(Lsn(101)) {
            Err(crate::Error::AckBeyondDelivery { acked, delivered }) => {
                assert_eq!((acked, delivered), (Lsn(101), Lsn(100)));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.acked.load(Ordering::SeqCst), 100);
    }

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
