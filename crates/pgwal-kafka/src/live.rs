//! What a running sink is doing, readable from any thread: for metrics and
//! health checks while [`run`](crate::run) works ([`SinkConfig::live`]).
//!
//! [`SinkConfig::live`]: crate::SinkConfig::live

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pgwal_protocol::Lsn;

/// Counters and positions of a running sink. All counts are since the
/// process started, across the sink's restarts.
#[derive(Debug, Default)]
pub struct SinkLive {
    streaming: AtomicBool,
    transactions: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    kafka_commits: AtomicU64,
    commit_micros: AtomicU64,
    last_commit_micros: AtomicU64,
    kafka_restarts: AtomicU64,
    reconnects: AtomicU64,
    bad_skipped: AtomicU64,
    dead_lettered: AtomicU64,
    kafka_position: AtomicU64,
    confirmed: AtomicU64,
    server_end: AtomicU64,
    lag_micros: AtomicU64,
    by_topic: Mutex<HashMap<String, u64>>,
}

impl SinkLive {
    /// A sink that has not started.
    pub fn new() -> SinkLive {
        SinkLive::default()
    }

    /// Whether the sink streams now: its producer is connected, Kafka's
    /// position read and the replication stream started (false while it
    /// connects, and between a failure and the next start).
    pub fn streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }
    /// PostgreSQL transactions written.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }
    /// Records written (progress records not counted).
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }
    /// Their key and value bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    /// Kafka transactions committed.
    pub fn kafka_commits(&self) -> u64 {
        self.kafka_commits.load(Ordering::Relaxed)
    }
    /// Time spent committing them, from the commit's start to Kafka's
    /// answer (they overlap the reading of what comes next).
    pub fn commit_time(&self) -> Duration {
        Duration::from_micros(self.commit_micros.load(Ordering::Relaxed))
    }
    /// The latest commit's time.
    pub fn last_commit_time(&self) -> Duration {
        Duration::from_micros(self.last_commit_micros.load(Ordering::Relaxed))
    }
    /// Restarts after a Kafka error.
    pub fn kafka_restarts(&self) -> u64 {
        self.kafka_restarts.load(Ordering::Relaxed)
    }
    /// Replication sessions started again after a lost connection.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }
    /// Changes left out (`--kafka-bad-records skip`).
    pub fn bad_skipped(&self) -> u64 {
        self.bad_skipped.load(Ordering::Relaxed)
    }
    /// Changes written to the dead-letter topic.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }
    /// Where Kafka's committed progress stands.
    pub fn kafka_position(&self) -> Lsn {
        Lsn(self.kafka_position.load(Ordering::Relaxed))
    }
    /// What the slot was last confirmed up to.
    pub fn confirmed(&self) -> Lsn {
        Lsn(self.confirmed.load(Ordering::Relaxed))
    }
    /// The server's WAL end from its latest message.
    pub fn server_wal_end(&self) -> Lsn {
        Lsn(self.server_end.load(Ordering::Relaxed))
    }
    /// WAL the server has beyond Kafka's progress.
    pub fn lag_bytes(&self) -> u64 {
        self.server_wal_end()
            .0
            .saturating_sub(self.kafka_position().0.max(self.confirmed().0))
    }
    /// At the latest Kafka commit: how long after its last PostgreSQL
    /// transaction's commit on the server.
    pub fn lag(&self) -> Duration {
        Duration::from_micros(self.lag_micros.load(Ordering::Relaxed))
    }
    /// Records written, by topic.
    pub fn records_by_topic(&self) -> Vec<(String, u64)> {
        let m = self.by_topic.lock().expect("not poisoned");
        let mut v: Vec<_> = m.iter().map(|(k, n)| (k.clone(), *n)).collect();
        v.sort();
        v
    }

    pub(crate) fn set_streaming(&self, v: bool) {
        self.streaming.store(v, Ordering::Relaxed);
    }
    pub(crate) fn transaction(&self) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn record(&self, topic: &str, bytes: usize) {
        self.records.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let mut m = self.by_topic.lock().expect("not poisoned");
        match m.get_mut(topic) {
            Some(n) => *n += 1,
            None => {
                m.insert(topic.to_owned(), 1);
            }
        }
    }
    pub(crate) fn kafka_commit(&self, took: Duration, position: Lsn, lag: Option<Duration>) {
        self.kafka_commits.fetch_add(1, Ordering::Relaxed);
        let us = took.as_micros() as u64;
        self.commit_micros.fetch_add(us, Ordering::Relaxed);
        self.last_commit_micros.store(us, Ordering::Relaxed);
        self.kafka_position.fetch_max(position.0, Ordering::Relaxed);
        if let Some(l) = lag {
            self.lag_micros
                .store(l.as_micros() as u64, Ordering::Relaxed);
        }
    }
    pub(crate) fn kafka_restart(&self) {
        self.kafka_restarts.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn reconnect(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn bad_record(&self, dead_lettered: bool) {
        if dead_lettered {
            self.dead_lettered.fetch_add(1, Ordering::Relaxed);
        } else {
            self.bad_skipped.fetch_add(1, Ordering::Relaxed);
        }
    }
    pub(crate) fn positions(&self, kafka: Option<Lsn>, confirmed: Lsn, server_end: Lsn) {
        if let Some(k) = kafka {
            self.kafka_position.fetch_max(k.0, Ordering::Relaxed);
        }
        self.confirmed.store(confirmed.0, Ordering::Relaxed);
        self.server_end.store(server_end.0, Ordering::Relaxed);
    }
}
