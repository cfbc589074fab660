//! One sink per slot: the lock a sink holds before it may fence.
//!
//! A sink's session starts its Kafka producer with `init_transactions`,
//! which fences every earlier producer of the same transactional id. Were
//! that the first step, a second sink started on a slot another one streams
//! from would fence the first before it could own the slot (PostgreSQL
//! lets one walsender at a time use it: the second waits on SQLSTATE
//! 55006). The first then fails its next commit, starts over and fences the
//! second in turn, and the two take turns aborting each other's
//! transactions. With different transactional ids there would be no
//! fencing at all, and a commit of the old holder still in flight could
//! land after the new one read Kafka's position: a duplicate.
//!
//! So a session first takes a session-level advisory lock named after the
//! slot, on a connection of its own that it keeps to its end, and only then
//! touches Kafka. A second sink waits for the lock and fences nobody: it is
//! a standby that takes over when the first stops (its connection closes,
//! and PostgreSQL releases the lock with it). Advisory locks are per
//! database, as logical slots are, and work on a hot standby.
//!
//! A sink cut off from the server without closing its connection (a
//! network partition, a host that lost power) leaves a backend holding the
//! lock; the session sets the server's TCP keepalives so that the backend
//! notices within about 16 s and releases it.
//!
//! What it cannot cover: a sink whose lock connection alone is cut while
//! its replication connection lives on loses the lock without knowing. A
//! second sink may then take it and fence the first, which fails its next
//! Kafka commit, finds the lock taken and waits: the two change roles once
//! and do not flap. Kafka stays exactly once throughout, since every
//! session reads Kafka's position after it fenced the one before.

use std::time::{Duration, Instant};

use pgwal::{Config, ReplicationClient, RetryConfig};

/// The lock's first key: "pgwl", so that pgwal's locks are told from an
/// application's own in `pg_locks`.
const LOCK_CLASS: i32 = 0x7067_776c;

/// Probes after 10 s of silence, 3 of them 2 s apart: a backend whose
/// sink vanished without closing its connection ends, and releases the
/// lock, about 16 s later (ignored on a Unix socket, which cannot be cut).
const SERVER_KEEPALIVES: &str =
    "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3";

/// How long the lock's connection may take to answer a query.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// A query on the lock's connection, bounded by [`ANSWER_WITHIN`].
async fn query(
    c: &mut ReplicationClient,
    sql: &str,
) -> Result<Vec<pgwal::SimpleRow>, pgwal::Error> {
    tokio::time::timeout(ANSWER_WITHIN, c.simple_query(sql))
        .await
        .map_err(|_| pgwal::Error::ReceiveTimeout {
            after: ANSWER_WITHIN,
            waiting_for: "the slot's lock",
        })?
}

/// How often a waiting sink asks for the lock again.
const ASK_EVERY: Duration = Duration::from_secs(2);
/// How often a waiting sink says again that it waits.
const SAY_EVERY: Duration = Duration::from_secs(60);

/// The lock's second key for `slot`: FNV-1a, stable across releases and
/// machines, kept positive so that `pg_locks.objid` shows the same number.
pub(crate) fn lock_key(slot: &str) -> i32 {
    (crate::progress::fnv1a(slot) & 0x7fff_ffff) as i32
}

/// The slot's lock, held while this value lives (its connection closes
/// when it is dropped, and the server releases the lock).
#[derive(Debug)]
pub(crate) struct SlotLock {
    connection: ReplicationClient,
}

impl SlotLock {
    /// Whether the lock's connection still answers (if it does, the lock
    /// is still held: it is released only when the session ends).
    pub(crate) async fn held(&mut self) -> bool {
        // a connection cut off without a reset would hold the call for the
        // system's TCP retransmission time
        matches!(
            tokio::time::timeout(ANSWER_WITHIN, self.connection.simple_query("SELECT 1")).await,
            Ok(Ok(_))
        )
    }

    /// Takes the slot's lock, waiting while another session holds it.
    /// Transient connection errors are retried per `retry`; a permanent
    /// one (authentication, a setting refused) is returned.
    pub(crate) async fn acquire(
        pg: &Config,
        slot: &str,
        retry: &RetryConfig,
    ) -> Result<SlotLock, pgwal::Error> {
        let key = lock_key(slot);
        let try_lock = format!("SELECT pg_try_advisory_lock({LOCK_CLASS}, {key})");
        let mut failures = 0u32;
        let mut said: Option<Instant> = None;
        loop {
            let attempt = async {
                let mut c = ReplicationClient::connect_sql(pg).await?;
                // the server's own keepalives on this session: were this
                // sink's host cut off, its backend would otherwise hold the
                // lock for the system's default two hours
                query(&mut c, SERVER_KEEPALIVES).await?;
                loop {
                    let rows = query(&mut c, &try_lock).await?;
                    if rows.first().and_then(|r| r.get_index(0)) == Some("t") {
                        return Ok::<_, pgwal::Error>(c);
                    }
                    if said.is_none_or(|t| t.elapsed() >= SAY_EVERY) {
                        said = Some(Instant::now());
                        let holder = holder(&mut c, key).await?;
                        tracing::warn!(
                            %slot,
                            holder = %holder,
                            "another sink holds this slot; waiting for it to stop, without fencing its Kafka producer"
                        );
                    }
                    tokio::time::sleep(ASK_EVERY).await;
                }
            };
            match attempt.await {
                Ok(c) => {
                    if said.is_some() {
                        tracing::info!(%slot, "the slot's lock is ours: this sink takes over");
                    }
                    return Ok(SlotLock { connection: c });
                }
                Err(e) => {
                    failures += 1;
                    if !(e.is_transient() && retry.allows(failures)) {
                        return Err(e);
                    }
                    let retry_in = retry.backoff(failures);
                    tracing::warn!(error = %e, attempt = failures, ?retry_in, "cannot take the slot's lock; trying again");
                    tokio::time::sleep(retry_in).await;
                }
            }
        }
    }
}

/// Who holds the slot's lock, as `pg_stat_activity` tells it.
async fn holder(c: &mut ReplicationClient, key: i32) -> Result<String, pgwal::Error> {
    let rows = query(
        c,
        &format!(
            "SELECT a.pid::text, coalesce(host(a.client_addr), 'local'), a.application_name \
             FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND l.granted AND l.database = \
             (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid = {LOCK_CLASS} AND l.objid = {key} AND l.objsubid = 2"
        ),
    )
    .await?;
    Ok(match rows.first() {
        Some(r) => format!(
            "pid {} from {} ({})",
            r.get_index(0).unwrap_or("?"),
            r.get_index(1).unwrap_or("?"),
            r.get_index(2).unwrap_or("")
        ),
        None => "a session that just ended".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_stable_and_positive() {
        // pinned: a sink of the next release must wait for one of this one
        assert_eq!(lock_key("kslot"), lock_key("kslot"));
        assert_ne!(lock_key("kslot"), lock_key("kslot2"));
        for s in [
            "",
            "a",
            "kslot",
            "a_very_long_slot_name_of_sixty_three_characters_at_most_xxxxxxx",
        ] {
            assert!(lock_key(s) >= 0, "{s}");
        }
        assert_eq!(lock_key("a"), 0x640c_292c);
    }
}
