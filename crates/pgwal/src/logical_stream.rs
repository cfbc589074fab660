//! The consumer side of a logical change stream.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use pgwal_protocol::Lsn;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::progress::{AckHandle, Shared};
use crate::relations::RelationCache;
use crate::stream_config::StreamConfig;
use crate::worker::{open_session, Item, Payload, Worker};

/// A logical replication stream: a [`Stream`] of [`Event`]s with explicit
/// acknowledgements.
///
/// A background task owns the connection, reconnects on transient errors
/// (restarting from the acknowledged position) and sends feedback on its own
/// timer, whatever the consumer is doing. Drop the stream or call
/// [`shutdown`](Self::shutdown) to stop it; either sends a final status
/// update carrying the last acknowledgement. With a `stop_lsn` the stream
/// yields `None` once it is reached, and the connection stays open (sending
/// feedback) until shutdown or drop.
///
/// Any tokio runtime works. During a burst the reader lets changes
/// accumulate in the socket for up to `read_coalesce` (1 ms by default,
/// see [`StreamConfig`](crate::StreamConfig)) before waking, which makes
/// the stream cheap for both ends; with that, a current-thread runtime
/// measured faster than a multi-thread one (`crates/README.md`,
/// "Benchmarks").
///
/// ```no_run
/// use futures_util::StreamExt;
/// use pgwal::{Config, Event, LogicalStream, StreamConfig};
///
/// # async fn f() -> Result<(), pgwal::Error> {
/// let config: Config = "host=127.0.0.1 user=postgres dbname=app".parse()?;
/// let mut stream = LogicalStream::start(config, StreamConfig::new("my_slot", ["my_pub"])).await?;
/// while let Some(event) = stream.next().await {
///     let event = event?;
///     if let Event::Insert(change) = &event {
///         println!("insert into {}: {:?}", change.relation.name, change.new);
///     }
///     // ... write it somewhere durable, then:
///     if let Some(lsn) = event.ack_lsn() {
///         stream.ack(lsn);
///     }
/// }
/// # Ok(()) }
/// ```
pub struct LogicalStream {
    rx: mpsc::Receiver<Item>,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    ended: bool,
    batch: std::vec::IntoIter<Event>,
    batch_generation: u64,
}

impl std::fmt::Debug for LogicalStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogicalStream")
            .field("acked", &self.acked())
            .field("confirmed", &self.confirmed())
            .finish_non_exhaustive()
    }
}

impl LogicalStream {
    /// Connects, starts replication and spawns the connection task (needs a
    /// Tokio runtime). Transient failures of the first connection are
    /// retried per `stream.retry`.
    pub async fn start(config: Config, stream: StreamConfig) -> Result<LogicalStream> {
        let shared = Arc::new(Shared::default());
        let mut failures = 0;
        let client = loop {
            match open_session(&config, &stream, &shared).await {
                Ok((c, _)) => break c,
                Err(e) => {
                    failures += 1;
                    if !(e.is_transient() && stream.retry.allows(failures)) {
                        return Err(e);
                    }
                    let retry_in = stream.retry.backoff(failures);
                    tracing::warn!(
                        error = %e,
                        attempt = failures,
                        of = %stream.retry.attempts_text(),
                        ?retry_in,
                        "cannot start streaming; trying again"
                    );
                    tokio::time::sleep(retry_in).await;
                }
            }
        };
        // Events travel in batches of up to 256; `buffer` bounds the events
        // queued between the task and the consumer.
        let batch = stream.buffer.clamp(1, 256);
        let (tx, rx) = mpsc::channel((stream.buffer / batch).max(1));
        let (stop_tx, stop_rx) = watch::channel(false);
        let relations = RelationCache::with_toast_cache(stream.toast_cache_rows);
        let worker = Worker {
            config,
            stream,
            shared: shared.clone(),
            tx,
            shutdown: stop_rx,
            relations,
        };
        let task = tokio::spawn(worker.run(client));
        Ok(LogicalStream {
            rx,
            shared,
            shutdown: stop_tx,
            task: Some(task),
            ended: false,
            batch: Vec::new().into_iter(),
            batch_generation: 0,
        })
    }

    /// Acknowledges that everything up to `lsn` is durably processed.
    /// Feedback to the server reports only acknowledged positions.
    pub fn ack(&self, lsn: Lsn) {
        self.shared.acked.fetch_max(lsn.0, Ordering::SeqCst);
    }

    /// Acknowledges `lsn` only if this stream delivered an event with that
    /// ack point or a later one; see [`AckHandle::try_ack`].
    pub fn try_ack(&self, lsn: Lsn) -> Result<()> {
        self.shared.try_ack(lsn)
    }

    /// A cloneable handle for acknowledging from another task.
    pub fn ack_handle(&self) -> AckHandle {
        AckHandle {
            shared: self.shared.clone(),
        }
    }

    /// The highest acknowledged position (initially where streaming began).
    pub fn acked(&self) -> Lsn {
        Lsn(self.shared.acked.load(Ordering::SeqCst))
    }

    /// The position last confirmed to the server.
    pub fn confirmed(&self) -> Lsn {
        Lsn(self.shared.confirmed.load(Ordering::SeqCst))
    }

    /// The server's WAL end as last reported (XLogData or keepalive); with
    /// [`acked`](Self::acked) it gives the consumer's lag in bytes.
    pub fn server_wal_end(&self) -> Lsn {
        Lsn(self.shared.server_end.load(Ordering::Relaxed))
    }

    /// Asks the server where its WAL is now: the stream sends a status
    /// update requesting a reply, and the server's keepalive in answer is
    /// delivered as an [`Event::Heartbeat`](crate::Event::Heartbeat) once
    /// no transaction is open in the stream, whether or not heartbeats are
    /// configured and however recently one was delivered. Its `wal_end`
    /// is how far the server has sent: every transaction that committed
    /// before it has been delivered. Requests made before the answer
    /// arrives are answered together; one made across a reconnect may go
    /// unanswered, so a consumer that waits for an answer asks again on a
    /// timer.
    ///
    /// ```no_run
    /// # async fn f(mut stream: pgwal::LogicalStream, target: pgwal::Lsn) -> pgwal::Result<()> {
    /// use futures_util::StreamExt;
    /// stream.request_position();
    /// while let Some(event) = stream.next().await {
    ///     if let pgwal::Event::Heartbeat { wal_end } = event? {
    ///         if wal_end >= target {
    ///             break; // everything committed before `target` was delivered
    ///         }
    ///         stream.request_position();
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn request_position(&self) {
        self.shared.position_request.notify_one();
    }

    /// Sends final feedback, ends replication cleanly and waits for the
    /// connection task.
    pub async fn shutdown(mut self) -> Result<()> {
        let _ = self.shutdown.send(true);
        self.rx.close();
        if let Some(t) = self.task.take() {
            t.await.map_err(|_| Error::Closed)?;
        }
        Ok(())
    }
}

impl Stream for LogicalStream {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            let current = this.shared.generation.load(Ordering::SeqCst);
            if this.batch_generation >= current {
                if let Some(e) = this.batch.next() {
                    if let Some(lsn) = e.ack_lsn() {
                        this.shared.delivered.fetch_max(lsn.0, Ordering::SeqCst);
                    }
                    return Poll::Ready(Some(Ok(e)));
                }
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(item)) => {
                    // Events of an earlier session are redelivered by the new one.
                    if item.generation < this.shared.generation.load(Ordering::SeqCst) {
                        continue;
                    }
                    match item.payload {
                        Payload::Events(v) => {
                            this.batch = v.into_iter();
                            this.batch_generation = item.generation;
                        }
                        Payload::Error(e) => return Poll::Ready(Some(Err(e))),
                        Payload::End => {
                            this.ended = true;
                            return Poll::Ready(None);
                        }
                    }
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for LogicalStream {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
