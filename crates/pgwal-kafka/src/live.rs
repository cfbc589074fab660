//! What a running sink is doing, readable from any thread: for metrics and
//! health checks while [`run`](crate::run) works ([`SinkConfig::live`]).
//!
//! [`SinkConfig::live`]: crate::SinkConfig::live

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgwal_protocol::{Lsn, PgTimestamp};

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
    snapshot_rows: AtomicU64,
    snapshot_chunks: AtomicU64,
    snapshot_rereads: AtomicU64,
    snapshot_tables_left_out: AtomicU64,
    snapshot_tables_queued: AtomicU64,
    kafka_position: AtomicU64,
    confirmed: AtomicU64,
    server_end: AtomicU64,
    lag_micros: AtomicU64,
    /// The server's commit time of the oldest transaction read but not yet
    /// in Kafka (0: none).
    unwritten_since: AtomicI64,
    /// Since when the sink has not been streaming (None: it streams).
    stalled_since: Mutex<Option<Instant>>,
    by_topic: Mutex<HashMap<String, u64>>,
}

impl SinkLive {
    /// A sink that has not started.
    pub fn new() -> SinkLive {
        let live = SinkLive::default();
        *live.stalled_since.lock().expect("not poisoned") = Some(Instant::now());
        live
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
    /// Rows snapshots wrote (read records).
    pub fn snapshot_rows(&self) -> u64 {
        self.snapshot_rows.load(Ordering::Relaxed)
    }
    /// Snapshot chunks read.
    pub fn snapshot_chunks(&self) -> u64 {
        self.snapshot_chunks.load(Ordering::Relaxed)
    }
    /// Snapshot chunks thrown away and read again.
    pub fn snapshot_rereads(&self) -> u64 {
        self.snapshot_rereads.load(Ordering::Relaxed)
    }
    /// Tables snapshots left out (no usable key, or a permanent error
    /// under a bad-record policy other than `Fail`).
    pub fn snapshot_tables_left_out(&self) -> u64 {
        self.snapshot_tables_left_out.load(Ordering::Relaxed)
    }
    /// Tables the running snapshot still has to read, the one being read
    /// included (0: no snapshot runs).
    pub fn snapshot_tables_queued(&self) -> u64 {
        self.snapshot_tables_queued.load(Ordering::Relaxed)
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
    /// How far Kafka is behind the server, in time, computed when asked:
    /// so it grows while the sink is stuck, and an alert on it fires.
    ///
    /// It is the largest of: at the latest Kafka commit, how long after its
    /// last PostgreSQL transaction's commit on the server; the age of the
    /// oldest transaction read but not yet in Kafka; and, while the sink is
    /// not streaming (connecting, or between a failure and the next start),
    /// that latest lag plus the time since it stopped, because it cannot
    /// see what the server commits meanwhile. Ages use the server's commit
    /// timestamps against this machine's clock.
    pub fn lag(&self) -> Duration {
        let at_commit = Duration::from_micros(self.lag_micros.load(Ordering::Relaxed));
        let oldest = match self.unwritten_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            t => Duration::from_micros(PgTimestamp::now().0.saturating_sub(t).max(0) as u64),
        };
        let stalled = self
            .stalled_since
            .lock()
            .expect("not poisoned")
            .map_or(Duration::ZERO, |s| at_commit + s.elapsed());
        at_commit.max(oldest).max(stalled)
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
        let mut since = self.stalled_since.lock().expect("not poisoned");
        match (v, *since) {
            (true, _) => *since = None,
            (false, None) => *since = Some(Instant::now()),
            (false, Some(_)) => {}
        }
    }
    /// A transaction was read: its commit time, unless an older one is
    /// still not in Kafka.
    pub(crate) fn read_transaction(&self, commit_time: PgTimestamp) {
        let t = commit_time.0.max(1);
        let _ = self
            .unwritten_since
            .compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed);
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
    /// A Kafka commit completed; `next_unwritten` is the commit time of the
    /// first transaction read after it, if any.
    pub(crate) fn kafka_commit(
        &self,
        took: Duration,
        position: Lsn,
        lag: Option<Duration>,
        next_unwritten: Option<PgTimestamp>,
    ) {
        self.unwritten_since
            .store(next_unwritten.map_or(0, |t| t.0.max(1)), Ordering::Relaxed);
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
    pub(crate) fn snapshot(&self, stats: &crate::SinkStats, tables_queued: usize) {
        self.snapshot_rows
            .store(stats.snapshot_rows, Ordering::Relaxed);
        self.snapshot_chunks
            .store(stats.snapshot_chunks, Ordering::Relaxed);
        self.snapshot_rereads
            .store(stats.snapshot_rereads, Ordering::Relaxed);
        self.snapshot_tables_left_out
            .store(stats.snapshot_tables_left_out, Ordering::Relaxed);
        self.snapshot_tables_queued
            .store(tables_queued as u64, Ordering::Relaxed);
    }
    pub(crate) fn positions(&self, kafka: Option<Lsn>, confirmed: Lsn, server_end: Lsn) {
        if let Some(k) = kafka {
            self.kafka_position.fetch_max(k.0, Ordering::Relaxed);
        }
        self.confirmed.store(confirmed.0, Ordering::Relaxed);
        self.server_end.store(server_end.0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_grows_while_a_transaction_waits_and_while_the_sink_is_stalled() {
        let live = SinkLive::new();
        live.set_streaming(true);
        assert_eq!(live.lag(), Duration::ZERO);
        // a commit 5 s ago on the server, read but not yet in Kafka
        let five_ago = PgTimestamp(PgTimestamp::now().0 - 5_000_000);
        live.read_transaction(five_ago);
        // a later one does not make the oldest younger
        live.read_transaction(PgTimestamp::now());
        assert!(live.lag() >= Duration::from_secs(5), "{:?}", live.lag());
        // in Kafka now, 40 ms after its commit; nothing read after it
        live.kafka_commit(
            Duration::from_millis(3),
            Lsn(100),
            Some(Duration::from_millis(40)),
            None,
        );
        assert_eq!(live.lag(), Duration::from_millis(40));
        // the sink stops streaming (Kafka failed): it can no longer see
        // what commits, so the lag grows with the time since
        live.set_streaming(false);
        std::thread::sleep(Duration::from_millis(30));
        let stalled = live.lag();
        assert!(stalled >= Duration::from_millis(70), "{stalled:?}");
        std::thread::sleep(Duration::from_millis(30));
        assert!(live.lag() > stalled);
        live.set_streaming(true);
        assert_eq!(live.lag(), Duration::from_millis(40));
    }

    #[test]
    fn a_sink_that_never_streamed_is_behind_since_it_started() {
        let live = SinkLive::new();
        std::thread::sleep(Duration::from_millis(20));
        assert!(live.lag() >= Duration::from_millis(20));
    }
}
