//! The receive timeout of a replication connection.
//!
//! A server, host or network that vanishes without a reset leaves a TCP
//! connection open and silent; only a timeout notices. As the walreceiver
//! does with `wal_receiver_timeout`, the stream asks the server for a
//! keepalive after half the timeout in silence (an idle walsender sends
//! nothing on its own while its feedback is fresh), and gives up after all
//! of it.

use std::time::Duration;

use crate::error::{Error, Result};

/// What a [`SilenceWatch`] found when it fired.
pub(crate) enum Silence {
    /// Half the timeout passed in silence: ask the server for a keepalive.
    AskForKeepalive,
    /// The whole timeout passed in silence.
    TimedOut(Duration),
}

/// The receive timeout of a replication connection, as the walreceiver's
/// `wal_receiver_timeout`: after half of it without a message, one request
/// for a keepalive; after all of it, the end. Without a timeout it never
/// fires. The timer is moved lazily: when it fires early it is set again
/// from the last time the server was heard from, so a message costs no
/// timer update.
pub(crate) struct SilenceWatch {
    timeout: Option<Duration>,
    heard: tokio::time::Instant,
    asked: bool,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl SilenceWatch {
    pub(crate) fn new(timeout: Option<Duration>) -> SilenceWatch {
        let now = tokio::time::Instant::now();
        let first = timeout.map_or(now, |t| now + t / 2);
        SilenceWatch {
            timeout,
            heard: now,
            asked: false,
            sleep: Box::pin(tokio::time::sleep_until(first)),
        }
    }

    /// The server was heard from (or reading resumed) now.
    pub(crate) fn heard(&mut self) {
        self.heard = tokio::time::Instant::now();
        self.asked = false;
    }

    fn due(&self, timeout: Duration) -> tokio::time::Instant {
        self.heard + if self.asked { timeout } else { timeout / 2 }
    }

    /// Resolves when half the timeout (first) or all of it (after the
    /// request) passed since the server was last heard from.
    pub(crate) async fn expired(&mut self) -> Silence {
        let Some(timeout) = self.timeout else {
            return std::future::pending().await;
        };
        loop {
            let due = self.due(timeout);
            if self.sleep.deadline() != due {
                self.sleep.as_mut().reset(due);
            }
            self.sleep.as_mut().await;
            // `heard` may have moved while this future was not polled
            if tokio::time::Instant::now() < self.due(timeout) {
                continue;
            }
            if self.asked {
                return Silence::TimedOut(timeout);
            }
            self.asked = true;
            return Silence::AskForKeepalive;
        }
    }
}

/// Awaits a step of a connection's setup (connect, authentication,
/// commands before the stream starts), bounded by the receive timeout.
pub(crate) async fn bounded<T>(
    limit: Option<Duration>,
    step: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match limit {
        Some(t) => tokio::time::timeout(t, step)
            .await
            .map_err(|_| Error::ReceiveTimeout {
                after: t,
                waiting_for: "the replication connection's setup",
            })?,
        None => step.await,
    }
}
