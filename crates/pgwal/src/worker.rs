//! The connection task behind a [`LogicalStream`](crate::LogicalStream).
//!
//! It owns the socket. It reads replication messages only while it has room
//! to hand an event on (bounded channel: backpressure reaches the server
//! through TCP), but its status timer and shutdown signal are polled in the
//! same `select!`, so feedback is never starved by a slow consumer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::backend::Message;
use tokio::io::WriteHalf;
use tokio::sync::{mpsc, watch};

use pgwal_protocol::pgoutput::Decoder;
use pgwal_protocol::replication::{BackendReplicationMessage, StandbyStatusUpdate};
use pgwal_protocol::{Lsn, PgTimestamp};

use crate::client::{send_copy_data, ReplicationClient};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::framing::{db_error, Backend};
use crate::progress::{Delivery, Shared};
use crate::relations::RelationCache;
use crate::silence::{bounded, Silence, SilenceWatch};
use crate::slot_state;
use crate::socket::Socket;
use crate::stream_config::StreamConfig;

/// What the connection task hands to the consumer.
pub(crate) enum Payload {
    /// A batch of events, in order.
    Events(Vec<Event>),
    /// A permanent error; the stream ends after it.
    Error(Error),
    /// `stop_lsn` reached.
    End,
}

/// A payload tagged with the session that produced it.
pub(crate) struct Item {
    pub(crate) generation: u64,
    pub(crate) payload: Payload,
}

/// Most events handed over in one channel message.
const MAX_BATCH: usize = 256;

enum End {
    /// Shutdown requested or consumer gone.
    Shutdown,
    /// `stop_lsn` reached.
    Stopped,
}

pub(crate) struct Worker {
    pub(crate) config: Config,
    pub(crate) stream: StreamConfig,
    pub(crate) shared: Arc<Shared>,
    pub(crate) tx: mpsc::Sender<Item>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) relations: RelationCache,
}

/// Connects and starts streaming from the acknowledged position (never from
/// the last received one), or the slot's confirmed position if later.
///
/// Bounded by the receive timeout: a server that accepts the connection and
/// then falls silent (or a network that stops carrying packets) must not
/// hold a reconnect for ever.
pub(crate) async fn open_session(
    config: &Config,
    stream: &StreamConfig,
    shared: &Shared,
) -> Result<(ReplicationClient, Lsn)> {
    bounded(
        stream.receive_timeout,
        open_session_unbounded(config, stream, shared),
    )
    .await
}

async fn open_session_unbounded(
    config: &Config,
    stream: &StreamConfig,
    shared: &Shared,
) -> Result<(ReplicationClient, Lsn)> {
    let mut client = ReplicationClient::connect(config).await?;
    let major = client.server_major_version().unwrap_or(10);
    let health = client.slot_health(&stream.slot).await?;
    if let Some(reason) = health.as_ref().and_then(|h| h.invalidated()) {
        return Err(Error::SlotInvalidated {
            slot: stream.slot.clone(),
            reason,
        });
    }
    let floor = health
        .as_ref()
        .and_then(|h| h.confirmed_flush)
        .unwrap_or_default();
    // What this consumer let the slot reach: what it confirmed (or accepted
    // as the slot's start) in earlier sessions, and the state file's record.
    let claimed = Lsn(shared.claimed.load(Ordering::SeqCst));
    let mut allowed = (claimed != Lsn(0)).then_some(claimed);
    if let Some(p) = stream.consumer_position {
        allowed = Some(allowed.map_or(p, |a| a.max(p)));
    }
    if let Some(path) = &stream.state_file {
        let system_id = client.identify_system().await?.system_id;
        let p = path.clone();
        let state = tokio::task::spawn_blocking(move || slot_state::load(&p))
            .await
            .map_err(|_| Error::Closed)??;
        match &state {
            Some(st) => {
                let file = slot_state::check(path, st, &system_id, &stream.slot)?;
                allowed = Some(allowed.map_or(file, |a| a.max(file)));
            }
            None => {
                // a new file: the slot's position now is where this consumer begins
                let begin = allowed.map_or(floor, |a| a.max(floor));
                allowed = Some(begin);
                let st = slot_state::SlotState {
                    system_identifier: system_id.clone(),
                    slot: stream.slot.clone(),
                    confirmed: begin,
                };
                let p = path.clone();
                tokio::task::spawn_blocking(move || slot_state::store(&p, &st))
                    .await
                    .map_err(|_| Error::Closed)??;
            }
        }
        shared.system_id.get_or_init(|| system_id);
    }
    // Without a file, the first session accepts the slot where it is.
    let allowed = allowed.unwrap_or(floor);
    if floor > allowed {
        return Err(Error::SlotAhead {
            slot: stream.slot.clone(),
            confirmed: floor,
            acknowledged: allowed,
        });
    }
    shared.claimed.fetch_max(floor.0, Ordering::SeqCst);
    let start = Lsn(shared.acked.load(Ordering::SeqCst))
        .max(floor)
        .max(stream.start_lsn.unwrap_or_default())
        .max(stream.consumer_position.unwrap_or_default());
    shared.acked.fetch_max(start.0, Ordering::SeqCst);
    shared.delivered.fetch_max(start.0, Ordering::SeqCst);
    shared.confirmed.fetch_max(floor.0, Ordering::SeqCst);
    let opts = stream.plugin_options(major);
    let opts: Vec<(&str, String)> = opts.iter().map(|(k, v)| (*k, v.clone())).collect();
    client
        .start_logical_replication(&stream.slot, start, &opts)
        .await?;
    tracing::debug!(slot = %stream.slot, %start, "replication started");
    Ok((client, start))
}

struct Session {
    writer: WriteHalf<Box<dyn Socket>>,
    buf: BytesMut,
    shared: Arc<Shared>,
    delivery: Delivery,
    /// `StreamConfig::state_file` and the slot it is for.
    state_file: Option<std::path::PathBuf>,
    /// `StreamConfig::idle_advance`.
    idle_advance: bool,
    slot: String,
    /// When this session last delivered an `Event::Heartbeat`.
    last_heartbeat: Option<tokio::time::Instant>,
    /// The consumer asked for the server's position: the next keepalive
    /// that comes between transactions is delivered as a heartbeat.
    position_wanted: bool,
}

impl Session {
    async fn send_status(&mut self, reply: bool) -> Result<()> {
        let acked = Lsn(self.shared.acked.load(Ordering::SeqCst));
        let confirmed = Lsn(self.shared.confirmed.load(Ordering::SeqCst));
        let flush = self.flush_position(acked).max(confirmed);
        // before the send: a send that fails half way may still reach the server
        self.shared.claimed.fetch_max(flush.0, Ordering::SeqCst);
        if flush > confirmed {
            if let Some(path) = &self.state_file {
                // write-ahead: the file is never behind what the slot is told
                let st = slot_state::SlotState {
                    system_identifier: self.shared.system_id.get().cloned().unwrap_or_default(),
                    slot: self.slot.clone(),
                    confirmed: flush,
                };
                let p = path.clone();
                tokio::task::spawn_blocking(move || slot_state::store(&p, &st))
                    .await
                    .map_err(|_| Error::Closed)??;
            }
        }
        let msg = StandbyStatusUpdate {
            write: flush,
            flush,
            apply: flush,
            client_time: PgTimestamp::now(),
            reply_requested: reply,
            receive: None,
        };
        let mut body = BytesMut::with_capacity(StandbyStatusUpdate::STOCK_LEN);
        msg.encode(&mut body);
        send_copy_data(&mut self.writer, &mut self.buf, &body).await?;
        self.shared.confirmed.fetch_max(flush.0, Ordering::SeqCst);
        tracing::trace!(%flush, "status update sent");
        Ok(())
    }

    /// What to confirm: the acked position, or beyond it when idle
    /// (unless `StreamConfig::idle_advance` is off).
    fn flush_position(&self, acked: Lsn) -> Lsn {
        if self.idle_advance {
            self.delivery.flush_position(acked)
        } else {
            acked
        }
    }

    /// A heartbeat for a keepalive at `wal_end`, when one is due: no
    /// transaction open (the keepalive follows everything decoded before
    /// it), the WAL moved past what was delivered and acknowledged, and the
    /// last one is at least `every` old.
    fn heartbeat(&mut self, wal_end: Lsn, every: Option<Duration>) -> Option<Event> {
        let d = &self.delivery;
        if self.position_wanted && !d.in_txn && d.open_streams.is_empty() {
            // an answer, even if it tells nothing new
            self.position_wanted = false;
            self.last_heartbeat = Some(tokio::time::Instant::now());
            return Some(Event::Heartbeat { wal_end });
        }
        let every = every?;
        let done = d
            .last_ack_point
            .max(Lsn(self.shared.acked.load(Ordering::SeqCst)));
        if d.in_txn || !d.open_streams.is_empty() || wal_end <= done {
            return None;
        }
        if self.last_heartbeat.is_some_and(|t| t.elapsed() < every) {
            return None;
        }
        self.last_heartbeat = Some(tokio::time::Instant::now());
        Some(Event::Heartbeat { wal_end })
    }

    fn wants_status(&self) -> bool {
        let acked = Lsn(self.shared.acked.load(Ordering::SeqCst));
        self.flush_position(acked) > Lsn(self.shared.confirmed.load(Ordering::SeqCst))
    }

    fn note(&mut self, e: &Event) {
        let d = &mut self.delivery;
        match e {
            Event::Begin(_) | Event::BeginPrepare(_) => d.in_txn = true,
            Event::Commit(_) | Event::Prepare(_) => d.in_txn = false,
            Event::StreamStart(s) if !d.open_streams.contains(&s.xid) => d.open_streams.push(s.xid),
            Event::StreamCommit(c) => d.open_streams.retain(|x| *x != c.xid),
            Event::StreamPrepare(p) => d.open_streams.retain(|x| *x != p.xid),
            Event::StreamAbort(a) if a.xid == a.subxid => d.open_streams.retain(|x| *x != a.xid),
            _ => {}
        }
        if let Some(l) = e.ack_lsn() {
            d.last_ack_point = d.last_ack_point.max(l);
        }
    }
}

impl Worker {
    async fn wait_or_shutdown(&mut self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => false,
            _ = self.shutdown.changed() => true,
        }
    }

    async fn emit(&mut self, generation: u64, event: Result<Event>) {
        let payload = match event {
            Ok(e) => Payload::Events(vec![e]),
            Err(e) => Payload::Error(e),
        };
        let _ = self
            .tx
            .send(Item {
                generation,
                payload,
            })
            .await;
    }

    /// Runs sessions until shutdown, `stop_lsn`, or a permanent error.
    pub(crate) async fn run(mut self, first: ReplicationClient) {
        let mut client = Some(first);
        let mut failures = 0u32;
        let mut first_session = true;
        loop {
            let c = match client.take() {
                Some(c) => c,
                None => match open_session(&self.config, &self.stream, &self.shared).await {
                    Ok((c, start)) => {
                        let g = self.shared.generation.load(Ordering::SeqCst);
                        self.emit(g, Ok(Event::Reconnected { restart_lsn: start }))
                            .await;
                        c
                    }
                    Err(e) => {
                        failures += 1;
                        if e.is_transient() && self.stream.retry.allows(failures) {
                            let retry_in = self.stream.retry.backoff(failures);
                            tracing::warn!(
                                error = %e,
                                attempt = failures,
                                of = %self.stream.retry.attempts_text(),
                                ?retry_in,
                                "reconnect failed; trying again"
                            );
                            if self.wait_or_shutdown(retry_in).await {
                                return;
                            }
                            continue;
                        }
                        let g = self.shared.generation.load(Ordering::SeqCst);
                        // a permanent error is itself the answer, however many tries led to it
                        let e = if failures > 1 && e.is_transient() {
                            Error::RetriesExhausted {
                                attempts: failures,
                                last: Box::new(e),
                            }
                        } else {
                            e
                        };
                        self.emit(g, Err(e)).await;
                        return;
                    }
                },
            };
            if !first_session {
                failures = 0;
            }
            first_session = false;
            match self.session(c).await {
                Ok(End::Shutdown) | Ok(End::Stopped) => return,
                Err(e) => {
                    failures += 1;
                    if e.is_transient() && self.stream.retry.allows(failures) {
                        // Events still buffered from this session will be
                        // delivered again by the next one: drop them now.
                        self.shared.generation.fetch_add(1, Ordering::SeqCst);
                        let retry_in = self.stream.retry.backoff(failures);
                        tracing::warn!(error = %e, ?retry_in, "replication session failed; reconnecting");
                        if self.wait_or_shutdown(retry_in).await {
                            return;
                        }
                        continue;
                    }
                    let g = self.shared.generation.load(Ordering::SeqCst);
                    self.emit(g, Err(e)).await;
                    return;
                }
            }
        }
    }

    /// `stop_lsn` reached: tell the consumer the stream ended, then keep
    /// sending feedback (so its last acks reach the server) until it shuts
    /// the stream down or drops it.
    async fn stop(
        &mut self,
        generation: u64,
        s: &mut Session,
        tick: &mut tokio::time::Interval,
    ) -> Result<()> {
        let _ = self
            .tx
            .send(Item {
                generation,
                payload: Payload::End,
            })
            .await;
        loop {
            tokio::select! {
                _ = self.shutdown.changed() => return Ok(()),
                _ = tick.tick() => s.send_status(false).await?,
            }
        }
    }

    async fn session(&mut self, client: ReplicationClient) -> Result<End> {
        let ReplicationClient {
            mut reader, writer, ..
        } = client;
        let generation = self.shared.generation.load(Ordering::SeqCst);
        let mut s = Session {
            writer,
            buf: BytesMut::new(),
            shared: self.shared.clone(),
            delivery: Delivery::default(),
            state_file: self.stream.state_file.clone(),
            slot: self.stream.slot.clone(),
            idle_advance: self.stream.idle_advance,
            last_heartbeat: None,
            position_wanted: false,
        };
        let mut decoder = Decoder::new();
        let batch = self.stream.buffer.clamp(1, MAX_BATCH);
        let mut pending: Vec<Event> = Vec::with_capacity(batch);
        let mut stop_after_pending = false;
        let mut tick = tokio::time::interval(self.stream.status_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stop = self.stream.stop_lsn;
        let coalesce = self.stream.read_coalesce;
        // The receive timeout counts from the server's last message, or
        // from when reading resumed after the consumer made us wait.
        let mut silence = SilenceWatch::new(self.stream.receive_timeout);
        // Streaming starts at the acked position: anything delivered from
        // here ends after it, so a stop position at or before it is reached.
        let mut stop_now =
            stop.is_some_and(|stop| stop <= Lsn(self.shared.acked.load(Ordering::SeqCst)));
        loop {
            if stop_now {
                self.stop(generation, &mut s, &mut tick).await?;
                finish(&mut s, &mut reader).await;
                return Ok(End::Stopped);
            }
            tokio::select! {
                biased;
                _ = self.shutdown.changed() => {
                    finish(&mut s, &mut reader).await;
                    return Ok(End::Shutdown);
                }
                // With a stop position, ask for a keepalive on every tick so
                // an idle server still tells us its WAL passed it.
                _ = tick.tick() => s.send_status(stop.is_some()).await?,
                // the server answers a status update that asks for a reply
                // with a keepalive carrying its position
                _ = self.shared.position_request.notified() => {
                    s.position_wanted = true;
                    s.send_status(true).await?;
                }
                permit = self.tx.reserve(), if !pending.is_empty() => {
                    let Ok(permit) = permit else {
                        finish(&mut s, &mut reader).await;
                        return Ok(End::Shutdown);
                    };
                    let events = std::mem::replace(&mut pending, Vec::with_capacity(batch));
                    permit.send(Item { generation, payload: Payload::Events(events) });
                    stop_now = stop_after_pending;
                    silence.heard();
                }
                ping = silence.expired(), if pending.is_empty() => {
                    match ping {
                        Silence::AskForKeepalive => s.send_status(true).await?,
                        Silence::TimedOut(after) => {
                            return Err(Error::ReceiveTimeout { after, waiting_for: "the replication stream" })
                        }
                    }
                }
                msg = async {
                    match coalesce {
                        Some(max_wait) => reader.read_batched(max_wait).await,
                        None => reader.read().await,
                    }
                }, if pending.is_empty() => {
                    // Handle this message and whatever else is already
                    // buffered, up to one batch, without awaiting the socket.
                    let mut next = Some(msg?);
                    silence.heard();
                    while let Some(m) = next.take() {
                        match m {
                            Backend::CopyData(body) => match BackendReplicationMessage::decode(body)? {
                                BackendReplicationMessage::XLogData(x) => {
                                    s.shared.server_end.fetch_max(x.wal_end.0, Ordering::Relaxed);
                                    let mut ev = self.relations.event_from(decoder.decode(x.data)?)?;
                                    ev.set_wal_position(x.wal_start);
                                    s.note(&ev);
                                    if let (Some(stop), Some(at)) = (stop, ev.ack_lsn()) {
                                        stop_after_pending |= at >= stop;
                                    }
                                    pending.push(ev);
                                }
                                BackendReplicationMessage::PrimaryKeepalive(k) => {
                                    s.delivery.keepalive_end = s.delivery.keepalive_end.max(k.wal_end);
                                    s.shared.server_end.fetch_max(k.wal_end.0, Ordering::Relaxed);
                                    if k.reply_requested || s.wants_status() {
                                        s.send_status(false).await?;
                                    }
                                    if let Some(ev) = s.heartbeat(k.wal_end, self.stream.heartbeat) {
                                        s.note(&ev);
                                        pending.push(ev);
                                    }
                                    let d = &s.delivery;
                                    if stop.is_some_and(|stop| k.wal_end >= stop && !d.in_txn && d.open_streams.is_empty()) {
                                        if pending.is_empty() {
                                            stop_now = true;
                                        } else {
                                            stop_after_pending = true;
                                        }
                                    }
                                }
                                _ => {}
                            },
                            Backend::Other(Message::ErrorResponse(b)) => return Err(Error::Db(db_error(b.fields())?)),
                            Backend::Other(Message::NoticeResponse(_)) | Backend::Other(Message::ParameterStatus(_)) => {}
                            Backend::Other(Message::CopyDone) => return Err(Error::Closed),
                            Backend::Other(_) | Backend::CopyBothResponse => {
                                return Err(Error::UnexpectedMessage { context: "replication stream", tag: b'?' })
                            }
                        }
                        if stop_now || stop_after_pending || pending.len() >= batch {
                            break;
                        }
                        next = reader.try_next()?;
                    }
                }
            }
        }
    }
}

/// Ends the session cleanly: final feedback, then CopyDone and Terminate.
async fn finish<R: tokio::io::AsyncRead + Unpin>(
    s: &mut Session,
    reader: &mut crate::framing::FrameReader<R>,
) {
    let _ = s.send_status(false).await;
    crate::client::close_copy_both(&mut s.writer, reader).await;
}
