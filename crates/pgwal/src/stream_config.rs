//! Options of a logical change stream.

use std::time::Duration;

use pgwal_protocol::Lsn;

use crate::retry::RetryConfig;

/// pgoutput's `streaming` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Streaming {
    /// Transactions are sent at commit.
    #[default]
    Off,
    /// Large in-progress transactions are streamed (protocol 2+).
    On,
    /// Streamed, with abort LSN and time (protocol 4, PostgreSQL 16+).
    Parallel,
}

/// What to stream and how.
///
/// ```
/// use std::time::Duration;
/// use pgwal::{StreamConfig, Streaming};
///
/// let cfg = StreamConfig::new("my_slot", ["my_pub"])
///     .proto_version(4)
///     .streaming(Streaming::Parallel)
///     .messages(true)
///     .status_interval(Duration::from_secs(1));
/// assert_eq!(cfg.publications, vec!["my_pub".to_string()]);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StreamConfig {
    /// The logical slot (must exist; see [`ReplicationClient::create_logical_slot`](crate::ReplicationClient::create_logical_slot)).
    pub slot: String,
    /// Publications to stream.
    pub publications: Vec<String>,
    /// pgoutput protocol version; `None` picks the highest the server supports.
    pub proto_version: Option<u32>,
    /// Streaming of in-progress transactions.
    pub streaming: Streaming,
    /// Binary column values.
    pub binary: bool,
    /// Include `pg_logical_emit_message` messages.
    pub messages: bool,
    /// Decode prepared transactions at PREPARE (slot must be two-phase).
    pub two_phase: bool,
    /// pgoutput `origin` filter (`any` or `none`).
    pub origin: Option<String>,
    /// Start here if the slot has not confirmed a later position.
    pub start_lsn: Option<Lsn>,
    /// End the stream once a transaction ending at or after this position was
    /// delivered, or the server's WAL passed it while nothing is pending.
    pub stop_lsn: Option<Lsn>,
    /// How often feedback is sent (also sent whenever the server asks).
    pub status_interval: Duration,
    /// Reconnect when the server sent nothing, not even a keepalive, for
    /// this long while the stream was waiting for it (default 60 s, as
    /// the server's `wal_receiver_timeout`; `None`: never). After half of
    /// it in silence the stream asks the server for a keepalive, so an
    /// idle but live server always answers in time; a server, host or
    /// network that vanished without a reset is noticed within it and
    /// the stream reconnects like after any connection loss (the
    /// connection's setup is bounded by it too). Time spent waiting for
    /// the consumer does not count. Keep it above half the server's
    /// `wal_sender_timeout`: a walsender busy decoding a large transaction
    /// answers only that often.
    pub receive_timeout: Option<Duration>,
    /// Events buffered between the connection task and the consumer.
    pub buffer: usize,
    /// Reconnect policy.
    pub retry: RetryConfig,
    /// Batch wake-ups during bursts (default 1 ms). After 16 reads in a
    /// row that each returned data less than a quarter of this duration
    /// after the previous one, the TCP socket's receive low-water mark
    /// (`SO_RCVLOWAT`) is raised to 16 KiB, so the kernel wakes the reader
    /// once per ~100 change messages instead of once per message, and the
    /// walsender's `send()` no longer has to wake it each time (measured in
    /// `crates/README.md`: a quarter of the client CPU per change and half
    /// the walsender CPU). When this long passes without reaching the mark,
    /// the mark drops back and the next 64 reads are eager. A change waits
    /// at most about this long (plus the timer's millisecond rounding)
    /// beyond its arrival, and only during a burst; one transaction's few
    /// messages are not a burst. `None` reads as soon as data arrives; so
    /// do Unix-domain sockets and systems other than Linux 4.18+.
    pub read_coalesce: Option<Duration>,
    /// Remember the last row image of up to this many rows (by replica
    /// identity key) to fill in unchanged TOAST columns of later updates
    /// that carry no full old image. 0 (default) disables it; rows not seen
    /// since the stream started stay `UnchangedToast`.
    pub toast_cache_rows: usize,
    /// A file where the stream records the position it confirms to the
    /// slot, before it sends it (fsynced; `None`: no file). On start, and
    /// on every reconnect, a slot whose confirmed position is beyond the
    /// file's was moved by someone else (dropped and created again, or
    /// another consumer): the stream ends with
    /// [`Error::SlotAhead`](crate::Error::SlotAhead) before it streams
    /// anything. The file also names the server (system identifier) and
    /// slot, and is refused for others. Without a file the same check
    /// runs on reconnects only, against what this stream confirmed since
    /// it started (after a failover: the promoted server's synced slot);
    /// an invalidated slot is always refused
    /// ([`Error::SlotInvalidated`](crate::Error::SlotInvalidated)).
    pub state_file: Option<std::path::PathBuf>,
    /// Where the consumer's own durable record says it is, when it keeps
    /// one elsewhere (a Kafka sink's progress record, a destination
    /// table): everything up to this position was processed. The stream
    /// starts here when the slot is behind (the consumer stored more than
    /// it had confirmed before it stopped), and a slot beyond it is refused
    /// with [`Error::SlotAhead`](crate::Error::SlotAhead), as with a state
    /// file. `None`: no such record.
    pub consumer_position: Option<Lsn>,
    /// Whether the slot is confirmed beyond the acknowledged position when
    /// every delivered event is acknowledged and no transaction is open
    /// (the server's WAL end from its keepalives), so that a slot whose
    /// publications see no changes still lets WAL go (default on). Turn it
    /// off when the consumer's own record is the reference
    /// (`consumer_position`): that record cannot follow such advances, and
    /// on the next start the slot would look moved by someone else. The
    /// slot then moves only at acknowledged transactions.
    pub idle_advance: bool,
    /// Deliver an [`Event::Heartbeat`](crate::Event::Heartbeat) at most this
    /// often when the server's WAL moved past everything delivered while no
    /// transaction is open (default `None`: never). For consumers with
    /// `idle_advance` off that keep their own record: a slot whose
    /// publications see no changes otherwise holds WAL back for ever.
    /// Acknowledging the heartbeat's `wal_end` once the consumer recorded it
    /// lets the slot move on.
    pub heartbeat: Option<Duration>,
}

impl StreamConfig {
    /// A stream of `publications` through `slot`, with defaults.
    pub fn new<I, S>(slot: impl Into<String>, publications: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        StreamConfig {
            slot: slot.into(),
            publications: publications.into_iter().map(Into::into).collect(),
            proto_version: None,
            streaming: Streaming::Off,
            binary: false,
            messages: false,
            two_phase: false,
            origin: None,
            start_lsn: None,
            stop_lsn: None,
            status_interval: Duration::from_secs(10),
            receive_timeout: Some(Duration::from_secs(60)),
            buffer: 1024,
            retry: RetryConfig::default(),
            read_coalesce: Some(Duration::from_millis(1)),
            toast_cache_rows: 0,
            state_file: None,
            consumer_position: None,
            idle_advance: true,
            heartbeat: None,
        }
    }
    /// Sets `heartbeat`.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }
    /// Sets `idle_advance`.
    pub fn idle_advance(mut self, v: bool) -> Self {
        self.idle_advance = v;
        self
    }
    /// Sets `consumer_position`.
    pub fn consumer_position(mut self, v: Lsn) -> Self {
        self.consumer_position = Some(v);
        self
    }
    /// Sets `state_file`.
    pub fn state_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.state_file = Some(path.into());
        self
    }
    /// Sets `proto_version`.
    pub fn proto_version(mut self, v: u32) -> Self {
        self.proto_version = Some(v);
        self
    }
    /// Sets `streaming`.
    pub fn streaming(mut self, v: Streaming) -> Self {
        self.streaming = v;
        self
    }
    /// Sets `binary`.
    pub fn binary(mut self, v: bool) -> Self {
        self.binary = v;
        self
    }
    /// Sets `messages`.
    pub fn messages(mut self, v: bool) -> Self {
        self.messages = v;
        self
    }
    /// Sets `two_phase`.
    pub fn two_phase(mut self, v: bool) -> Self {
        self.two_phase = v;
        self
    }
    /// Sets `origin`.
    pub fn origin(mut self, v: impl Into<String>) -> Self {
        self.origin = Some(v.into());
        self
    }
    /// Sets `start_lsn`.
    pub fn start_lsn(mut self, v: Lsn) -> Self {
        self.start_lsn = Some(v);
        self
    }
    /// Sets `stop_lsn`.
    pub fn stop_lsn(mut self, v: Lsn) -> Self {
        self.stop_lsn = Some(v);
        self
    }
    /// Sets `status_interval`.
    pub fn status_interval(mut self, v: Duration) -> Self {
        self.status_interval = v;
        self
    }
    /// Sets `receive_timeout` (a zero duration is taken as `None`).
    pub fn receive_timeout(mut self, v: Option<Duration>) -> Self {
        self.receive_timeout = v.filter(|d| !d.is_zero());
        self
    }
    /// Sets `buffer` (at least 1).
    pub fn buffer(mut self, v: usize) -> Self {
        self.buffer = v.max(1);
        self
    }
    /// Sets `read_coalesce`.
    pub fn read_coalesce(mut self, v: Option<Duration>) -> Self {
        self.read_coalesce = v;
        self
    }
    /// Sets `toast_cache_rows`.
    pub fn toast_cache_rows(mut self, v: usize) -> Self {
        self.toast_cache_rows = v;
        self
    }
    /// Sets `retry`.
    pub fn retry(mut self, v: RetryConfig) -> Self {
        self.retry = v;
        self
    }

    pub(crate) fn plugin_options(&self, server_major: u32) -> Vec<(&'static str, String)> {
        let proto = self.proto_version.unwrap_or(match server_major {
            16.. => 4,
            15 => 3,
            14 => 2,
            _ => 1,
        });
        let pubs: Vec<String> = self
            .publications
            .iter()
            .map(|p| crate::commands::quote_ident(p))
            .collect();
        let mut o = vec![
            ("proto_version", proto.to_string()),
            ("publication_names", pubs.join(",")),
        ];
        match self.streaming {
            Streaming::Off => {}
            Streaming::On => o.push(("streaming", "on".into())),
            Streaming::Parallel => o.push(("streaming", "parallel".into())),
        }
        if self.binary {
            o.push(("binary", "true".into()));
        }
        if self.messages {
            o.push(("messages", "true".into()));
        }
        if self.two_phase {
            o.push(("two_phase", "true".into()));
        }
        if let Some(origin) = &self.origin {
            o.push(("origin", origin.clone()));
        }
        o
    }
}
