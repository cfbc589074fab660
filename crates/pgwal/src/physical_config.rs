//! Settings of a [`PhysicalReceiver`](crate::PhysicalReceiver).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pgwal_protocol::Lsn;

use crate::retry::RetryConfig;
use crate::stage_hook::StageHook;

/// Which positions the standby status update reports, and when.
///
/// Every update carries `flush` = the end of WAL that is fsynced (file, and
/// the directory for new and completed segments), in every mode; `apply` is
/// always `0/0` (nothing is applied, so `synchronous_commit = remote_apply`
/// never returns); the trailing receive pointer of the 42-byte form is the
/// end of WAL received into memory (stock servers ignore it, the patched
/// server uses it for `remote_receive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AckMode {
    /// `write` = the **received** position, reported as soon as a batch has
    /// been read from the socket, before it is written. This is a
    /// deliberate lie: a stock primary with `synchronous_commit =
    /// remote_write` then releases commits on receipt, i.e. it behaves like
    /// `remote_receive`. `flush` stays honest.
    Receive,
    /// `write` = the position written to the segment files (`pwrite` done,
    /// not fsynced), reported after each write; like `pg_receivewal`
    /// without `--synchronous`.
    Write,
    /// `write` = `flush` = the fsynced position: each batch is written and
    /// fsynced before it is acknowledged; like `pg_receivewal --synchronous`.
    #[default]
    Flush,
}

impl AckMode {
    /// `receive`, `write` or `flush`.
    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::Receive => "receive",
            AckMode::Write => "write",
            AckMode::Flush => "flush",
        }
    }
}

/// Settings of a [`PhysicalReceiver`](crate::PhysicalReceiver).
#[derive(Clone)]
#[non_exhaustive]
pub struct PhysicalConfig {
    pub(crate) dir: PathBuf,
    pub(crate) slot: Option<String>,
    pub(crate) create_slot: bool,
    pub(crate) ack: AckMode,
    pub(crate) status_interval: Duration,
    pub(crate) receive_timeout: Option<Duration>,
    pub(crate) end_lsn: Option<Lsn>,
    pub(crate) start: Option<(Lsn, u32)>,
    pub(crate) receive_pointer: bool,
    pub(crate) max_batch_bytes: usize,
    pub(crate) hook: Option<Arc<dyn StageHook>>,
    pub(crate) retry: RetryConfig,
    pub(crate) inline_io: bool,
}

impl std::fmt::Debug for PhysicalConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhysicalConfig")
            .field("dir", &self.dir)
            .field("slot", &self.slot)
            .field("ack", &self.ack)
            .field("status_interval", &self.status_interval)
            .field("receive_timeout", &self.receive_timeout)
            .field("end_lsn", &self.end_lsn)
            .field("retry", &self.retry)
            .field("inline_io", &self.inline_io)
            .finish_non_exhaustive()
    }
}

impl PhysicalConfig {
    /// Streams into `dir` (which must exist), acknowledging with
    /// [`AckMode::Flush`], a status update at least every 10 s, no slot.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PhysicalConfig {
            dir: dir.into(),
            slot: None,
            create_slot: false,
            ack: AckMode::default(),
            status_interval: Duration::from_secs(10),
            receive_timeout: Some(Duration::from_secs(60)),
            end_lsn: None,
            start: None,
            receive_pointer: true,
            max_batch_bytes: 4 << 20,
            hook: None,
            retry: RetryConfig::never(),
            inline_io: false,
        }
    }

    /// Reconnects after transient failures as `retry` says (default:
    /// [`RetryConfig::never`], the first failure ends
    /// [`run`](crate::PhysicalReceiver::run)); `pg_receivewal` retries
    /// forever unless `--no-loop`.
    pub fn retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// Streams through this physical slot (its `restart_lsn` follows the
    /// reported flush position).
    pub fn slot(mut self, name: impl Into<String>) -> Self {
        self.slot = Some(name.into());
        self
    }

    /// Creates the slot first if it does not exist.
    pub fn create_slot(mut self, v: bool) -> Self {
        self.create_slot = v;
        self
    }

    /// The acknowledgement mode.
    pub fn ack(mut self, mode: AckMode) -> Self {
        self.ack = mode;
        self
    }

    /// Longest time between status updates (also the period of the fsync
    /// of written data in the `Receive` and `Write` modes).
    pub fn status_interval(mut self, d: Duration) -> Self {
        self.status_interval = d.max(Duration::from_millis(1));
        self
    }

    /// Ends the connection when the server sent nothing, not even a
    /// keepalive, for this long (default 60 s, as `wal_receiver_timeout`;
    /// `None` or zero: never), asking for a keepalive after half of it.
    /// The connection's setup is bounded by it too. The error is
    /// [`Error::ReceiveTimeout`](crate::Error::ReceiveTimeout), transient:
    /// with [`retry`](Self::retry) the receiver reconnects.
    pub fn receive_timeout(mut self, d: Option<Duration>) -> Self {
        self.receive_timeout = d.filter(|d| !d.is_zero());
        self
    }

    /// Stops once WAL up to `lsn` is written and fsynced.
    pub fn end_lsn(mut self, lsn: Lsn) -> Self {
        self.end_lsn = Some(lsn);
        self
    }

    /// Starts at `lsn` on `timeline` instead of resuming from the directory,
    /// the slot or the server's position (rounded down to a segment start).
    pub fn start(mut self, lsn: Lsn, timeline: u32) -> Self {
        self.start = Some((lsn, timeline));
        self
    }

    /// Whether status updates carry the trailing receive pointer (42-byte
    /// form, default) or are the stock 34-byte message. The pointer is only
    /// sent to a server that lists `receive_position` in its
    /// `replication_features` parameter (pgwal's patched servers do); stock
    /// servers always get the 34-byte form.
    pub fn receive_pointer(mut self, v: bool) -> Self {
        self.receive_pointer = v;
        self
    }

    /// Most WAL bytes read from the socket before they are written (one
    /// batch; default 4 MB).
    pub fn max_batch_bytes(mut self, n: usize) -> Self {
        self.max_batch_bytes = n.max(1);
        self
    }

    /// Writes and fsyncs on the receiver's own task instead of tokio's
    /// blocking pool (default `false`).
    ///
    /// The pool costs two thread hand-offs per batch, and on a busy machine
    /// each may wait for a CPU; a synchronous standby's commits wait for
    /// them. Inline, a batch's `pwrite` and `fdatasync` block the runtime
    /// thread instead, so use it only when the receiver has its runtime (or
    /// its worker thread) to itself — the `pgwal receive` CLI does. With a
    /// stage hook set the I/O still goes through the pool.
    pub fn inline_io(mut self, inline: bool) -> Self {
        self.inline_io = inline;
        self
    }

    /// A hook called between receiving and writing, and between writing and
    /// fsyncing (tests park the receiver there; see [`Gate`](crate::Gate)).
    pub fn hook(mut self, hook: Arc<dyn StageHook>) -> Self {
        self.hook = Some(hook);
        self
    }
}
