//! Physical WAL streaming into segment files, with a chosen acknowledgement
//! point (see [`AckMode`]).

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::AsyncWriteExt;

use pgwal_protocol::replication::{BackendReplicationMessage, StandbyStatusUpdate};
use pgwal_protocol::walfile::{parse_size, WalSegments};
use pgwal_protocol::{Lsn, PgTimestamp};

use crate::client::{close_copy_both, send_copy_data, ReplicationClient};
use crate::commands::NextTimeline;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::framing::{db_error, Backend};
use crate::physical_config::{AckMode, PhysicalConfig};
use crate::silence::{bounded, Silence, SilenceWatch};
use crate::stage_hook::Stage;
use crate::wal_dir::{self, WalDir};

/// Positions of a running [`PhysicalReceiver`], readable from any thread.
#[derive(Debug, Default)]
pub struct PhysicalProgress {
    received: AtomicU64,
    written: AtomicU64,
    flushed: AtomicU64,
    reported_write: AtomicU64,
    reported_flush: AtomicU64,
    timeline: AtomicU32,
    status_updates: AtomicU64,
}

impl PhysicalProgress {
    /// End of the WAL received into memory.
    pub fn received(&self) -> Lsn {
        Lsn(self.received.load(Ordering::SeqCst))
    }
    /// End of the WAL written to segment files (`pwrite` done).
    pub fn written(&self) -> Lsn {
        Lsn(self.written.load(Ordering::SeqCst))
    }
    /// End of the WAL fsynced.
    pub fn flushed(&self) -> Lsn {
        Lsn(self.flushed.load(Ordering::SeqCst))
    }
    /// The `write` position of the last status update sent.
    pub fn reported_write(&self) -> Lsn {
        Lsn(self.reported_write.load(Ordering::SeqCst))
    }
    /// The `flush` position of the last status update sent.
    pub fn reported_flush(&self) -> Lsn {
        Lsn(self.reported_flush.load(Ordering::SeqCst))
    }
    /// The timeline being streamed (0 before streaming starts).
    pub fn timeline(&self) -> u32 {
        self.timeline.load(Ordering::SeqCst)
    }
    /// Status updates sent so far.
    pub fn status_updates(&self) -> u64 {
        self.status_updates.load(Ordering::SeqCst)
    }
}

/// Why [`PhysicalReceiver::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// The shutdown future completed.
    Shutdown,
    /// WAL up to `PhysicalConfig::end_lsn` was written and fsynced.
    EndReached,
}

/// Streams physical WAL into a directory of segment files, like
/// `pg_receivewal`, acknowledging at the point chosen by [`AckMode`].
///
/// ```no_run
/// use pgwal::{AckMode, PhysicalConfig, PhysicalReceiver};
///
/// # async fn f() -> Result<(), pgwal::Error> {
/// // application_name lets synchronous_standby_names pick this receiver.
/// let config = "host=db.internal user=repl application_name=archiver".parse()?;
/// let receiver = PhysicalReceiver::new(
///     config,
///     PhysicalConfig::new("/srv/wal").slot("archiver").create_slot(true).ack(AckMode::Flush),
/// );
/// let progress = receiver.progress();
/// receiver.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// println!("stopped with WAL fsynced up to {}", progress.flushed());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PhysicalReceiver {
    config: Config,
    pc: PhysicalConfig,
    progress: Arc<PhysicalProgress>,
}

/// How a streaming session on one timeline ended.
enum SessionEnd {
    Stopped(StopReason),
    TimelineEnded(NextTimeline),
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
}

impl PhysicalReceiver {
    /// A receiver for the server of `config` (its `application_name` is what
    /// `synchronous_standby_names` matches).
    pub fn new(config: Config, pc: PhysicalConfig) -> Self {
        PhysicalReceiver {
            config,
            pc,
            progress: Arc::default(),
        }
    }

    /// A handle on the receiver's positions.
    pub fn progress(&self) -> Arc<PhysicalProgress> {
        self.progress.clone()
    }

    /// Checks the directory, connects, finds where to start (`PhysicalConfig::start`,
    /// else the directory's highest segment, else the slot's `restart_lsn`,
    /// else the server's current position; always a segment start), and
    /// streams, following timeline switches, until `shutdown` completes,
    /// the end position is reached or an error occurs. On every return the
    /// open segment is fsynced and stays `.partial`; on a clean stop a final
    /// status update is sent.
    ///
    /// A transient failure (lost connection, server shutting down or not
    /// yet accepting connections) is retried as `PhysicalConfig::retry`
    /// allows (by default it is not): after the backoff the receiver
    /// reconnects and resumes at the start of the segment it was writing,
    /// on the same timeline (that segment's `.partial` file was fsynced when
    /// the session failed). The attempt counter restarts after every
    /// session that reached streaming.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<StopReason> {
        tokio::pin!(shutdown);
        let dir = self.pc.dir.clone();
        blocking(move || wal_dir::check_writable(&dir)).await?;
        let mut pc = self.pc.clone();
        let mut failures = 0u32;
        loop {
            let updates = self.progress.status_updates();
            let e = match self.session(pc.clone(), &mut shutdown).await {
                Ok(why) => return Ok(why),
                Err(e) => e,
            };
            if self.progress.status_updates() != updates {
                failures = 0;
            }
            failures += 1;
            if !(e.is_transient() && pc.retry.allows(failures)) {
                return Err(e);
            }
            let retry_in = pc.retry.backoff(failures);
            tracing::warn!(
                error = %e,
                attempt = failures,
                of = %pc.retry.attempts_text(),
                ?retry_in,
                "replication connection failed; reconnecting"
            );
            // Resume where this run got to, not from the directory's
            // highest segment (it may hold unrelated later segments).
            let written = self.progress.written();
            if !written.is_invalid() {
                pc.start = Some((written, self.progress.timeline()));
            }
            tokio::select! {
                _ = shutdown.as_mut() => return Ok(StopReason::Shutdown),
                _ = tokio::time::sleep(retry_in) => {}
            }
        }
    }

    /// One connection: connect, find the start, stream until a stop or an error.
    async fn session(
        &self,
        pc: PhysicalConfig,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<StopReason> {
        let limit = pc.receive_timeout;
        let mut client = bounded(limit, ReplicationClient::connect_physical(&self.config)).await?;
        let size = bounded(limit, client.show("wal_segment_size")).await?;
        let segs = parse_size(&size)
            .and_then(WalSegments::new)
            .ok_or(Error::BadResult("SHOW wal_segment_size"))?;
        let sys = bounded(limit, client.identify_system()).await?;
        if let (Some(slot), true) = (&pc.slot, pc.create_slot) {
            match client.create_physical_slot(slot, false).await {
                Err(e) if e.code() != Some("42710") => return Err(e),
                _ => {}
            }
        }
        let mut r = Receiver {
            wal: Arc::new(Mutex::new(WalDir::new(pc.dir.clone(), segs))),
            pc,
            progress: self.progress.clone(),
            buf: BytesMut::new(),
            timeline: 0,
            expected: Lsn::INVALID,
            received: Lsn::INVALID,
            written: Lsn::INVALID,
            flushed: Lsn::INVALID,
            reported: (Lsn::INVALID, Lsn::INVALID),
            server_knows_receive: client.has_replication_feature("receive_position"),
        };
        let resume = r.with_dir(|w| w.resume_point()).await?;
        let (start, mut timeline) = match (r.pc.start, resume) {
            (Some(s), _) => s,
            (None, Some(p)) => (p.start, p.timeline),
            (None, None) => {
                let mut from_slot = None;
                if let (Some(slot), true) =
                    (&r.pc.slot, client.server_major_version().unwrap_or(0) >= 15)
                {
                    if let Some((kind, lsn, tli)) = bounded(limit, client.read_slot(slot)).await? {
                        if kind == "physical" && !lsn.is_invalid() && tli != 0 {
                            from_slot = Some((lsn, tli));
                        }
                    }
                }
                from_slot.unwrap_or((sys.xlog_pos, sys.timeline))
            }
        };
        if timeline > sys.timeline {
            return Err(Error::TimelineNotOnServer {
                requested: timeline,
                server: sys.timeline,
            });
        }
        let mut start = segs.segment_start(segs.segment_of(start));
        loop {
            if timeline > 1 && !r.with_dir(move |w| Ok(w.has_history(timeline))).await? {
                let h = bounded(limit, client.timeline_history(timeline)).await?;
                r.with_dir(move |w| w.write_history(timeline, h.content.as_bytes()))
                    .await?;
            }
            r.timeline = timeline;
            r.progress.timeline.store(timeline, Ordering::SeqCst);
            let slot = r.pc.slot.clone();
            let next = match bounded(
                limit,
                client.start_physical_replication(slot.as_deref(), start, Some(timeline)),
            )
            .await?
            {
                Some(next) => next,
                None => match r.stream(&mut client, start, shutdown).await {
                    Ok(SessionEnd::Stopped(why)) => return Ok(why),
                    Ok(SessionEnd::TimelineEnded(next)) => next,
                    Err(e) => {
                        // Keep what was written: fsync it, leave it partial.
                        let _ = r.with_dir(|w| w.close()).await;
                        return Err(e);
                    }
                },
            };
            r.with_dir(|w| w.close()).await?;
            tracing::info!(from = timeline, to = next.timeline, at = %next.start, "timeline switch");
            timeline = next.timeline;
            // Like pg_receivewal: the new timeline's segment file is written
            // whole, from its start (the server copies the old timeline's
            // part of it).
            start = segs.segment_start(segs.segment_of(next.start));
        }
    }
}

/// The receiver's state while streaming.
struct Receiver {
    pc: PhysicalConfig,
    progress: Arc<PhysicalProgress>,
    wal: Arc<Mutex<WalDir>>,
    buf: BytesMut,
    timeline: u32,
    /// Where the next XLogData must start (this session).
    expected: Lsn,
    received: Lsn,
    written: Lsn,
    flushed: Lsn,
    /// `(write, flush)` of the last status update.
    reported: (Lsn, Lsn),
    /// The server lists `receive_position` in `replication_features`, so it
    /// reads the receive pointer; only then do status updates carry it.
    server_knows_receive: bool,
}

/// A batch of messages read from the socket without waiting.
#[derive(Default)]
struct Batch {
    chunks: Vec<(Lsn, Bytes)>,
    bytes: usize,
    reply_requested: bool,
    /// No more data was ready on the socket when the batch ended.
    caught_up: bool,
    /// The server ended the timeline (CopyDone).
    ended: bool,
    /// What ended the batch early: the WAL before it is still written.
    error: Option<Error>,
}

impl Receiver {
    async fn with_dir<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WalDir) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let wal = self.wal.clone();
        if self.pc.inline_io && self.pc.hook.is_none() {
            // Documented on PhysicalConfig::inline_io: blocks this thread.
            return f(&mut wal.lock().unwrap_or_else(|e| e.into_inner()));
        }
        blocking(move || f(&mut wal.lock().unwrap_or_else(|e| e.into_inner()))).await
    }

    fn publish(&self) {
        let p = &self.progress;
        p.received.fetch_max(self.received.0, Ordering::SeqCst);
        p.written.fetch_max(self.written.0, Ordering::SeqCst);
        p.flushed.fetch_max(self.flushed.0, Ordering::SeqCst);
    }

    /// The `write` position this mode reports.
    fn write_position(&self) -> Lsn {
        match self.pc.ack {
            AckMode::Receive => self.received,
            AckMode::Write => self.written,
            AckMode::Flush => self.flushed,
        }
    }

    async fn send_status(&mut self, client: &mut ReplicationClient) -> Result<()> {
        self.send_status_asking(client, false).await
    }

    /// A status update; `reply`: the server is asked for a keepalive.
    async fn send_status_asking(
        &mut self,
        client: &mut ReplicationClient,
        reply: bool,
    ) -> Result<()> {
        let write = self.write_position();
        let msg = StandbyStatusUpdate {
            write,
            flush: self.flushed,
            apply: Lsn::INVALID,
            client_time: PgTimestamp::now(),
            reply_requested: reply,
            receive: (self.pc.receive_pointer && self.server_knows_receive)
                .then_some(self.received),
        };
        let mut body = BytesMut::with_capacity(StandbyStatusUpdate::EXTENDED_LEN);
        msg.encode(&mut body);
        send_copy_data(&mut client.writer, &mut self.buf, &body).await?;
        self.reported = (write, self.flushed);
        let p = &self.progress;
        p.reported_write.store(write.0, Ordering::SeqCst);
        p.reported_flush.store(self.flushed.0, Ordering::SeqCst);
        p.status_updates.fetch_add(1, Ordering::SeqCst);
        tracing::trace!(%write, flush = %self.flushed, receive = %self.received, "status update sent");
        Ok(())
    }

    /// Whether this mode's reported position advanced since the last update.
    fn advanced(&self) -> bool {
        self.write_position() > self.reported.0 || self.flushed > self.reported.1
    }

    async fn hook(&self, stage: Stage, lsn: Lsn) {
        if let Some(h) = &self.pc.hook {
            h.reached(stage, lsn).await;
        }
    }

    /// fsyncs written data (after the `BeforeFlush` hook when `hooked`).
    async fn sync(&mut self, hooked: bool) -> Result<()> {
        if self.written <= self.flushed {
            return Ok(());
        }
        if hooked {
            self.hook(Stage::BeforeFlush, self.written).await;
        }
        self.with_dir(|w| w.sync()).await?;
        self.flushed = self.written;
        self.publish();
        Ok(())
    }

    /// Reads one batch: the message `first` and then whatever is ready on the
    /// socket, up to `max_batch_bytes` of WAL. An error (malformed message,
    /// gap, server error) ends the batch and is kept in it, so that the WAL
    /// received before it is still written.
    fn read_batch(&mut self, client: &mut ReplicationClient, first: Backend) -> Batch {
        let mut b = Batch::default();
        if let Err(e) = self.fill_batch(client, first, &mut b) {
            b.error = Some(e);
            b.caught_up = false;
        }
        b
    }

    fn fill_batch(
        &mut self,
        client: &mut ReplicationClient,
        first: Backend,
        b: &mut Batch,
    ) -> Result<()> {
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                Backend::CopyData(body) => match BackendReplicationMessage::decode(body)? {
                    BackendReplicationMessage::XLogData(x) => {
                        if x.wal_start != self.expected {
                            return Err(Error::WalGap {
                                expected: self.expected,
                                got: x.wal_start,
                            });
                        }
                        self.expected = x.wal_start + x.data.len() as u64;
                        b.bytes += x.data.len();
                        b.chunks.push((x.wal_start, x.data));
                    }
                    BackendReplicationMessage::PrimaryKeepalive(k) => {
                        b.reply_requested |= k.reply_requested;
                    }
                    _ => {}
                },
                Backend::Other(Message::CopyDone) => {
                    b.ended = true;
                    b.caught_up = true;
                    return Ok(());
                }
                Backend::Other(Message::ErrorResponse(e)) => {
                    return Err(Error::Db(db_error(e.fields())?))
                }
                Backend::Other(Message::NoticeResponse(_))
                | Backend::Other(Message::ParameterStatus(_)) => {}
                Backend::Other(_) | Backend::CopyBothResponse => {
                    return Err(Error::UnexpectedMessage {
                        context: "physical replication stream",
                        tag: b'?',
                    })
                }
            }
            if b.bytes >= self.pc.max_batch_bytes {
                return Ok(());
            }
            next = client.reader.try_next()?;
        }
        b.caught_up = true;
        Ok(())
    }

    /// Receive → (ack receive) → write → (ack write) → fsync → (ack flush),
    /// with at most one status update per batch.
    async fn process(&mut self, client: &mut ReplicationClient, mut b: Batch) -> Result<bool> {
        let mut reached_end = false;
        if let Some(end) = self.pc.end_lsn {
            b.chunks.retain(|(at, _)| *at < end);
            if let Some((at, data)) = b.chunks.last_mut() {
                if *at + data.len() as u64 >= end {
                    data.truncate((end - *at) as usize);
                    reached_end = true;
                }
            }
        }
        let end_of_batch = b.chunks.last().map(|(at, d)| *at + d.len() as u64);
        self.received = self.received.max(end_of_batch.unwrap_or_default());
        self.publish();
        let (reply_requested, caught_up) = (b.reply_requested, b.caught_up);
        let wants = |r: &Receiver| reply_requested || (caught_up && r.advanced());
        let mut replied = false;
        if self.pc.ack == AckMode::Receive && wants(self) {
            self.send_status(client).await?;
            replied = true;
        }
        if let Some(end) = end_of_batch {
            self.hook(Stage::BeforeWrite, end).await;
            let (timeline, chunks) = (self.timeline, std::mem::take(&mut b.chunks));
            let completed = self
                .with_dir(move |w| {
                    let mut completed = None;
                    for (at, data) in &chunks {
                        completed = w.write(timeline, *at, data)?.or(completed);
                    }
                    Ok(completed)
                })
                .await?;
            self.written = self.written.max(end);
            if let Some(c) = completed {
                self.flushed = self.flushed.max(c);
            }
            self.publish();
        }
        if self.pc.ack == AckMode::Write && !replied && wants(self) {
            self.send_status(client).await?;
            replied = true;
        }
        // Flush mode fsyncs when caught up, but WAL that arrived while this
        // batch was being written is written first and shares the fsync
        // (as pg_receivewal --synchronous does): on a disk with slow writes
        // an fsync per read would cap throughput at one read per fsync.
        let flush_mode = self.pc.ack == AckMode::Flush;
        let more = flush_mode && caught_up && !reached_end && client.reader.more_ready();
        if flush_mode && (reached_end || (caught_up && !more)) {
            self.sync(true).await?;
        }
        if !replied && (reply_requested || (!more && wants(self))) {
            self.send_status(client).await?;
        }
        Ok(reached_end)
    }

    /// Ends streaming from our side: fsync, final status update, CopyDone,
    /// Terminate.
    async fn stop(&mut self, client: &mut ReplicationClient) -> Result<()> {
        self.sync(false).await?;
        self.with_dir(|w| w.close()).await?;
        self.send_status(client).await?;
        close_copy_both(&mut client.writer, &mut client.reader).await;
        Ok(())
    }

    async fn stream(
        &mut self,
        client: &mut ReplicationClient,
        start: Lsn,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<SessionEnd> {
        self.expected = start;
        // Like pg_receivewal: everything before the start point counts as
        // received, written and flushed (it is in complete segments, or the
        // receiver never had it), and the server hears so at once. Without a
        // valid flush position a walsender is no synchronous standby
        // candidate, and commits would wait for the first fsync.
        self.received = self.received.max(start);
        self.written = self.written.max(start);
        self.flushed = self.flushed.max(start);
        self.publish();
        self.send_status(client).await?;
        if self.pc.end_lsn.is_some_and(|end| end <= start) {
            self.stop(client).await?;
            return Ok(SessionEnd::Stopped(StopReason::EndReached));
        }
        let period = self.pc.status_interval;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The tick is reset by every status update a batch sends, so under
        // steady load it never fires; the fsync it promises for the receive
        // and write modes is kept by its own clock (found by the lab's
        // audit-receiver: before, WAL acknowledged as written stayed
        // unsynced until its segment was complete).
        let mut synced_at = tokio::time::Instant::now();
        let mut silence = SilenceWatch::new(self.pc.receive_timeout);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => {
                    self.stop(client).await?;
                    return Ok(SessionEnd::Stopped(StopReason::Shutdown));
                }
                ping = silence.expired() => match ping {
                    Silence::AskForKeepalive => self.send_status_asking(client, true).await?,
                    Silence::TimedOut(after) => {
                        self.sync(false).await?;
                        return Err(Error::ReceiveTimeout { after, waiting_for: "the WAL stream" });
                    }
                },
                _ = tick.tick() => {
                    self.sync(true).await?;
                    synced_at = tokio::time::Instant::now();
                    self.send_status(client).await?;
                }
                m = client.reader.read() => {
                    silence.heard();
                    let mut batch = self.read_batch(client, m?);
                    let (ended, error) = (batch.ended, batch.error.take());
                    let before = self.progress.status_updates();
                    let reached_end = self.process(client, batch).await?;
                    if let Some(e) = error {
                        return Err(e);
                    }
                    if reached_end {
                        self.stop(client).await?;
                        return Ok(SessionEnd::Stopped(StopReason::EndReached));
                    }
                    if ended {
                        self.sync(false).await?;
                        self.send_status(client).await?;
                        let mut buf = BytesMut::new();
                        frontend::copy_done(&mut buf);
                        client.writer.write_all(&buf).await?;
                        client.writer.flush().await?;
                        return Ok(SessionEnd::TimelineEnded(client.end_of_timeline(None).await?));
                    }
                    if synced_at.elapsed() >= period {
                        self.sync(true).await?;
                        synced_at = tokio::time::Instant::now();
                        self.send_status(client).await?;
                    }
                    if self.progress.status_updates() != before {
                        tick.reset();
                    }
                }
            }
        }
    }
}
