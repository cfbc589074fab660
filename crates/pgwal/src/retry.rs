//! Reconnect policy.

use std::time::Duration;

/// How the stream reconnects after a transient failure.
///
/// The delay before attempt `n` (from 1) is `initial_backoff * multiplier^(n-1)`,
/// capped at `max_backoff`. The attempt counter restarts after every session
/// that reached streaming.
///
/// ```
/// use std::time::Duration;
/// let r = pgwal::RetryConfig::default().max_attempts(Some(3)).initial_backoff(Duration::from_millis(10));
/// assert_eq!(r.backoff(1), Duration::from_millis(10));
/// assert_eq!(r.backoff(3), Duration::from_millis(40));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Give up after this many consecutive failed attempts (`None`: never).
    pub max_attempts: Option<u32>,
    /// First delay.
    pub initial_backoff: Duration,
    /// Largest delay.
    pub max_backoff: Duration,
    /// Growth factor.
    pub multiplier: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: Some(10),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            multiplier: 2.0,
        }
    }
}

impl RetryConfig {
    /// No reconnects: the first failure ends the stream.
    pub fn never() -> Self {
        RetryConfig {
            max_attempts: Some(0),
            ..Self::default()
        }
    }
    /// Sets `max_attempts`.
    pub fn max_attempts(mut self, v: Option<u32>) -> Self {
        self.max_attempts = v;
        self
    }
    /// Sets `initial_backoff`.
    pub fn initial_backoff(mut self, v: Duration) -> Self {
        self.initial_backoff = v;
        self
    }
    /// Sets `max_backoff`.
    pub fn max_backoff(mut self, v: Duration) -> Self {
        self.max_backoff = v;
        self
    }
    /// Sets `multiplier`.
    pub fn multiplier(mut self, v: f64) -> Self {
        self.multiplier = v;
        self
    }

    /// The delay before attempt `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let f = self
            .multiplier
            .max(1.0)
            .powi(attempt.saturating_sub(1).min(64) as i32);
        let d = self.initial_backoff.as_secs_f64() * f;
        Duration::from_secs_f64(d.min(self.max_backoff.as_secs_f64()))
    }

    /// The attempt limit for a log line: a number, or "unlimited".
    pub(crate) fn attempts_text(&self) -> String {
        self.max_attempts
            .map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
    }

    /// Whether another attempt is allowed after `failed` consecutive failures.
    pub fn allows(&self, failed: u32) -> bool {
        self.max_attempts.map_or(true, |m| failed <= m)
    }
}
