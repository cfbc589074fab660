//! Whether the server a sink starts against has everything Kafka holds.
//!
//! Kafka's progress record says the stream is written up to a position, and
//! the sink starts the stream there. On the server that position came from
//! that is right. On another server with the same system identifier it can
//! be wrong in two ways, and PostgreSQL cannot tell: it starts decoding at
//! the position asked for, and skips this server's transactions below it.
//! - A standby promoted before it received everything the sink wrote (a
//!   failover without `synchronized_standby_slots`): its new timeline
//!   forked below Kafka's position. Kafka holds transactions that no longer
//!   exist, and this server's first transactions after the fork lie below
//!   Kafka's position.
//! - A server restored from a backup (point-in-time recovery, or a copy
//!   started as a primary) whose WAL ends below Kafka's position.
//!
//! So the progress record carries the timeline its position is on, and at
//! every start the sink compares it with the server: the position must lie
//! on the server's history (on its timeline, or on an earlier one at or
//! before the point where the server left it), and not beyond the WAL the
//! server has. A hot standby still behind Kafka's position is waited for;
//! any other mismatch is refused. A restore that keeps the timeline and has
//! since written past Kafka's position is not detected: nothing in the WAL
//! positions tells it apart.

use pgwal::TimelineHistory;
use pgwal_protocol::Lsn;

/// Where the server stands (`IDENTIFY_SYSTEM`, `pg_is_in_recovery()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerPosition {
    /// Its timeline.
    pub(crate) timeline: u32,
    /// The WAL it has: flushed on a primary, received on a standby.
    pub(crate) wal: Lsn,
    /// A standby (its WAL still grows towards its primary's).
    pub(crate) in_recovery: bool,
}

/// What the comparison found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The server has Kafka's position on its history.
    Holds,
    /// A standby that has not yet received Kafka's position: wait.
    StandbyBehind,
    /// Kafka's position is beyond the WAL this primary has.
    BeyondServer,
    /// Kafka's position is on a timeline this server left before it
    /// (`fork`: where it left it), or never had (`None`).
    OffHistory {
        /// Where the server left Kafka's timeline, if it was on it.
        fork: Option<Lsn>,
    },
}

/// Compares Kafka's position (`kafka` on `kafka_timeline`, unknown in
/// records written before timelines were recorded) with the server.
/// `history` is the server's timeline history, needed only when the
/// timelines differ.
pub(crate) fn check(
    kafka: Lsn,
    kafka_timeline: Option<u32>,
    server: &ServerPosition,
    history: Option<&TimelineHistory>,
) -> Verdict {
    if let Some(t) = kafka_timeline.filter(|t| *t != server.timeline) {
        if t > server.timeline {
            return Verdict::OffHistory { fork: None };
        }
        match history.and_then(|h| h.switchpoint(t)) {
            Some(fork) if kafka <= fork => {}
            fork => return Verdict::OffHistory { fork },
        }
    }
    if kafka > server.wal {
        return if server.in_recovery {
            Verdict::StandbyBehind
        } else {
            Verdict::BeyondServer
        };
    }
    Verdict::Holds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(s: &str) -> Lsn {
        s.parse().unwrap()
    }

    fn server(timeline: u32, wal: &str, in_recovery: bool) -> ServerPosition {
        ServerPosition {
            timeline,
            wal: lsn(wal),
            in_recovery,
        }
    }

    #[test]
    fn the_same_timeline_holds_up_to_the_servers_wal() {
        let s = server(1, "0/5000000", false);
        assert_eq!(check(lsn("0/4000000"), Some(1), &s, None), Verdict::Holds);
        assert_eq!(check(lsn("0/5000000"), Some(1), &s, None), Verdict::Holds);
        // a record written before timelines were recorded
        assert_eq!(check(lsn("0/4000000"), None, &s, None), Verdict::Holds);
        // a restored copy whose WAL ends below Kafka's position
        assert_eq!(
            check(lsn("0/6000000"), Some(1), &s, None),
            Verdict::BeyondServer
        );
        assert_eq!(
            check(lsn("0/6000000"), None, &s, None),
            Verdict::BeyondServer
        );
        // a hot standby that has not received it yet
        let standby = server(1, "0/5000000", true);
        assert_eq!(
            check(lsn("0/6000000"), Some(1), &standby, None),
            Verdict::StandbyBehind
        );
    }

    #[test]
    fn an_earlier_timeline_holds_only_up_to_where_the_server_left_it() {
        let h = TimelineHistory::from_content(
            "1\t0/3000000\tno recovery target specified\n2\t0/5000000\tafter a failover\n",
        );
        let s = server(3, "0/9000000", false);
        assert_eq!(
            check(lsn("0/2FFFFFF"), Some(1), &s, Some(&h)),
            Verdict::Holds
        );
        assert_eq!(
            check(lsn("0/3000000"), Some(1), &s, Some(&h)),
            Verdict::Holds
        );
        // written on timeline 1 after the server's fork: lost at the failover
        assert_eq!(
            check(lsn("0/3000100"), Some(1), &s, Some(&h)),
            Verdict::OffHistory {
                fork: Some(lsn("0/3000000"))
            }
        );
        assert_eq!(
            check(lsn("0/4000000"), Some(2), &s, Some(&h)),
            Verdict::Holds
        );
        assert_eq!(
            check(lsn("0/6000000"), Some(2), &s, Some(&h)),
            Verdict::OffHistory {
                fork: Some(lsn("0/5000000"))
            }
        );
        // a timeline the server never was on, or a later one
        let other = TimelineHistory::from_content("1\t0/3000000\tx\n");
        let s2 = server(3, "0/9000000", false);
        assert_eq!(
            check(lsn("0/4000000"), Some(2), &s2, Some(&other)),
            Verdict::OffHistory { fork: None }
        );
        assert_eq!(
            check(lsn("0/1000000"), Some(4), &s, Some(&h)),
            Verdict::OffHistory { fork: None }
        );
    }
}
