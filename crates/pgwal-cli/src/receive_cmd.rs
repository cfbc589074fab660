//! `pgwal receive`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use pgwal::{AckMode, Config, Lsn, PhysicalConfig, PhysicalReceiver, Result, RetryConfig};

/// When the status update acknowledges WAL.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum AckArg {
    /// Report the received position as `write` before writing it (makes a
    /// stock primary's `remote_write` wait only for receipt).
    Receive,
    /// Report `write` after pwrite, `flush` after fsync.
    Write,
    /// Report `write` and `flush` only after fsync (like pg_receivewal --synchronous).
    Flush,
}

/// Which thread writes and fsyncs WAL files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum FileIoArg {
    /// `inline` with --ack receive or write, `pool` with --ack flush: the
    /// faster of the two in each mode on a slow-write disk (crates/README.md).
    Auto,
    /// The receiver's own thread (it has the runtime to itself), like
    /// pg_receivewal: no thread hand-off before an acknowledgement.
    Inline,
    /// tokio's blocking pool: the receiver's thread never blocks on the
    /// disk, at the cost of two thread hand-offs per batch.
    Pool,
}

pub(crate) const ABOUT: &str = "Stream physical WAL into segment files (like pg_receivewal), acknowledging on receipt, write or fsync";

pub(crate) const LONG_ABOUT: &str = "\
Stream physical WAL into DIRECTORY as segment files of the server's wal_segment_size, \
named like pg_wal's. The segment being written is NAME.partial \
(created full-size); a full segment is fsynced, renamed and the directory \
fsynced. A restart resumes at the highest .partial segment or after the \
highest complete one; a timeline switch is followed (NNNNNNNN.history is \
fetched). SIGINT/SIGTERM: fsync, final status update, exit 0. A lost \
connection (or a server that is shutting down or starting) is retried with \
a growing wait (0.2 s doubling up to --max-retry-wait) and streaming resumes \
at the start of the segment being written; --no-loop exits instead.

Status updates (42-byte form: write, flush, apply=0/0, trailing receive):
  receive = end of WAL received into memory (every mode);
  flush   = end of WAL fsynced (every mode: never reported before fsync);
  write   = --ack receive: the RECEIVED position, sent as soon as a batch is \
read, before it is written. Deliberate: a stock primary with \
synchronous_commit = remote_write then releases commits on receipt, i.e. \
behaves like remote_receive;
            --ack write: what is written (pwrite done);
            --ack flush: what is fsynced (each batch is fsynced before the \
update; like pg_receivewal --synchronous).
At most one update per batch read from the socket (sent when no more data is \
ready, or at once when the server asks for a reply), and one at least every \
--status-interval (which also fsyncs written data in the receive and write \
modes). To serve as a synchronous standby, set application_name in the \
connection string and list it in the primary's synchronous_standby_names.";

#[derive(Args, Debug)]
pub(crate) struct ReceiveArgs {
    /// Directory to write segments to (must exist).
    #[arg(short = 'D', long = "directory")]
    dir: PathBuf,
    /// Physical replication slot to stream through.
    #[arg(short = 'S', long)]
    slot: Option<String>,
    /// Create the slot first (no error if it exists).
    #[arg(long, requires = "slot")]
    create_slot: bool,
    /// When WAL is acknowledged (see above).
    #[arg(long, value_enum, default_value = "flush")]
    ack: AckArg,
    /// Seconds between status updates at the latest.
    #[arg(short = 's', long, default_value_t = 10.0)]
    status_interval: f64,
    /// Reconnect when the server sent nothing, not even a keepalive it was
    /// asked for after half this many seconds, for this long (a server,
    /// host or network gone without a reset); 0: never. Like the server's
    /// wal_receiver_timeout; keep it above half its wal_sender_timeout.
    #[arg(long, default_value_t = 60.0, value_parser = crate::stream_cmd::parse_timeout_secs)]
    receive_timeout: f64,
    /// Exit once WAL up to this position is written and fsynced.
    #[arg(short = 'E', long, value_parser = parse_lsn)]
    endpos: Option<Lsn>,
    /// Start at this position instead of resuming (rounded down to a
    /// segment start); needs --timeline.
    #[arg(long, value_parser = parse_lsn, requires = "timeline")]
    startpos: Option<Lsn>,
    /// Timeline of --startpos.
    #[arg(long, requires = "startpos")]
    timeline: Option<u32>,
    /// Send the stock 34-byte status update (no trailing receive position).
    #[arg(long)]
    no_receive_pointer: bool,
    /// Exit on the first connection failure instead of reconnecting.
    #[arg(short = 'n', long)]
    no_loop: bool,
    /// Give up after this many consecutive failed reconnection attempts
    /// (default: never give up, like pg_receivewal).
    #[arg(long, conflicts_with = "no_loop")]
    max_retries: Option<u32>,
    /// Longest wait between reconnection attempts, in seconds (the wait
    /// starts at 0.2 s and doubles).
    #[arg(long, default_value_t = 10.0)]
    max_retry_wait: f64,
    /// Which thread writes and fsyncs WAL files.
    #[arg(long, value_enum, default_value = "auto")]
    file_io: FileIoArg,
}

fn parse_lsn(s: &str) -> std::result::Result<Lsn, String> {
    s.parse::<Lsn>().map_err(|e| e.to_string())
}

pub(crate) async fn run(config: Config, a: ReceiveArgs) -> Result<()> {
    let mut pc = PhysicalConfig::new(a.dir)
        .ack(match a.ack {
            AckArg::Receive => AckMode::Receive,
            AckArg::Write => AckMode::Write,
            AckArg::Flush => AckMode::Flush,
        })
        .status_interval(Duration::from_secs_f64(a.status_interval.max(0.001)))
        .receive_timeout(
            (a.receive_timeout > 0.0).then(|| Duration::from_secs_f64(a.receive_timeout)),
        )
        .receive_pointer(!a.no_receive_pointer)
        .inline_io(match a.file_io {
            FileIoArg::Inline => true,
            FileIoArg::Pool => false,
            FileIoArg::Auto => !matches!(a.ack, AckArg::Flush),
        })
        .retry(if a.no_loop {
            RetryConfig::never()
        } else {
            RetryConfig::default()
                .max_attempts(a.max_retries)
                .max_backoff(Duration::from_secs_f64(a.max_retry_wait.max(0.001)))
        });
    if let Some(slot) = a.slot {
        pc = pc.slot(slot).create_slot(a.create_slot);
    }
    if let Some(end) = a.endpos {
        pc = pc.end_lsn(end);
    }
    if let (Some(start), Some(tli)) = (a.startpos, a.timeline) {
        pc = pc.start(start, tli);
    }
    let receiver = PhysicalReceiver::new(config, pc);
    let progress = receiver.progress();
    let why = receiver.run(crate::signals::stop_signal()).await?;
    eprintln!(
        "pgwal receive: stopped ({why:?}) on timeline {}: received {}, written {}, flushed {}",
        progress.timeline(),
        progress.received(),
        progress.written(),
        progress.flushed()
    );
    Ok(())
}
