//! The error type.

use std::fmt;
use std::io;

use pgwal_protocol::{DecodeError, Lsn};

/// An error reported by the server (an ErrorResponse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbError {
    /// Severity (`ERROR`, `FATAL`, `PANIC`), not localized.
    pub severity: String,
    /// The five-character SQLSTATE code, e.g. `55006`.
    pub code: String,
    /// The primary message.
    pub message: String,
    /// Optional detail.
    pub detail: Option<String>,
    /// Optional hint.
    pub hint: Option<String>,
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(d) = &self.detail {
            write!(f, "; DETAIL: {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DbError {}

impl DbError {
    pub(crate) fn from_fields<'a>(fields: impl Iterator<Item = (u8, &'a str)>) -> DbError {
        let mut e = DbError {
            severity: String::new(),
            code: String::new(),
            message: String::new(),
            detail: None,
            hint: None,
        };
        let mut localized_severity = String::new();
        for (t, v) in fields {
            match t {
                b'V' => e.severity = v.to_owned(),
                b'S' => localized_severity = v.to_owned(),
                b'C' => e.code = v.to_owned(),
                b'M' => e.message = v.to_owned(),
                b'D' => e.detail = Some(v.to_owned()),
                b'H' => e.hint = Some(v.to_owned()),
                _ => {}
            }
        }
        if e.severity.is_empty() {
            e.severity = localized_severity;
        }
        e
    }

    /// Whether retrying later may succeed: the slot is still held by a
    /// previous walsender (`55006` "replication slot ... is active for PID"),
    /// the server is starting or shutting down, too many connections,
    /// admin shutdown, serialization or deadlock failures.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.code.as_str(),
            "55006"
                | "57P01"
                | "57P02"
                | "57P03"
                | "53300"
                | "40001"
                | "40P01"
                | "08006"
                | "08001"
                | "08004"
        ) || self.code.starts_with("08")
    }
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A socket error, including the connection being closed.
    Io(io::Error),
    /// The server reported an error.
    Db(DbError),
    /// TLS setup or handshake failed.
    Tls(rustls::Error),
    /// The server required TLS-less operation but `sslmode` demands TLS,
    /// or it refused TLS.
    TlsRefused,
    /// A replication message could not be decoded.
    Decode(DecodeError),
    /// The server sent a message that is not valid at this point.
    UnexpectedMessage {
        /// Where it happened.
        context: &'static str,
        /// The message tag.
        tag: u8,
    },
    /// The server asked for an authentication method this client lacks.
    UnsupportedAuthentication(&'static str),
    /// A table to copy that the publications do not publish.
    NotPublished {
        /// The table as given.
        table: String,
    },
    /// A feature the server's major version lacks; nothing was sent.
    ServerTooOld {
        /// The feature.
        feature: &'static str,
        /// The first major version that has it.
        needs: u32,
        /// The server's major version.
        server: u32,
    },
    /// A password is needed and none is configured.
    PasswordMissing,
    /// The SCRAM exchange failed (bad server proof, malformed message).
    Sasl(io::Error),
    /// The connection string is invalid.
    Config {
        /// The offending key or fragment.
        key: String,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// A change referenced a relation OID never described by a Relation message.
    UnknownRelation(u32),
    /// A command's result had an unexpected shape.
    BadResult(&'static str),
    /// A row could not be turned into the requested type.
    Column {
        /// The column.
        column: String,
        /// Why.
        reason: String,
    },
    /// Retrying gave up after the configured number of attempts.
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: Box<Error>,
    },
    /// The stream was closed.
    Closed,
    /// The server sent nothing, not even a keepalive it was asked for, for
    /// the configured receive timeout (or the connection's setup took
    /// longer): the server, its host or the network is gone without a
    /// reset. Transient: a retrying stream reconnects.
    ReceiveTimeout {
        /// The timeout.
        after: std::time::Duration,
        /// What was awaited, e.g. "the replication stream".
        waiting_for: &'static str,
    },
    /// A file operation in the WAL directory failed (missing directory, no
    /// write permission, disk full...). What is already in the directory
    /// stays valid: complete segments are never modified and a `.partial`
    /// segment only holds data that was received.
    WalDir {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What was being done, e.g. "create a file in".
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// A file in the WAL directory is not what its name says (e.g. a
    /// complete segment of the wrong size); nothing was changed.
    WalFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The server sent WAL that does not continue where the previous
    /// message ended.
    WalGap {
        /// The position the next WAL should start at.
        expected: Lsn,
        /// Where the server's message starts.
        got: Lsn,
    },
    /// Streaming was asked to start on a timeline the server does not have
    /// (later than its current one).
    TimelineNotOnServer {
        /// The requested timeline.
        requested: u32,
        /// The server's current timeline.
        server: u32,
    },
    /// The state file ([`StreamConfig::state_file`](crate::StreamConfig::state_file))
    /// could not be read or written.
    StateFile {
        /// The file (or its directory).
        path: std::path::PathBuf,
        /// What was being done.
        op: &'static str,
        /// The operating system's error (or the parse error).
        source: io::Error,
    },
    /// The state file belongs to another server or slot; nothing was streamed.
    StateMismatch {
        /// The file.
        path: std::path::PathBuf,
        /// What differs.
        what: &'static str,
        /// What the file says.
        file: String,
        /// What the stream uses.
        server: String,
    },
    /// The slot was invalidated (its WAL removed, or a conflict on a
    /// standby): the changes the consumer has not seen are gone.
    SlotInvalidated {
        /// The slot.
        slot: String,
        /// The server's reason (`invalidation_reason`, or `wal_status`).
        reason: String,
    },
    /// The slot has confirmed a position beyond the one this consumer ever
    /// confirmed (its state file, or earlier sessions of this stream): it
    /// was dropped and created again, another consumer moved it, or a
    /// promoted standby's synced slot is ahead. Streaming from there would skip changes
    /// this consumer never received; nothing was streamed.
    SlotAhead {
        /// The slot.
        slot: String,
        /// Its confirmed position.
        confirmed: Lsn,
        /// The highest position this consumer confirmed.
        acknowledged: Lsn,
    },
    /// No host of the connection string accepted a connection and matched
    /// `target_session_attrs` (during a failover: none promoted yet).
    NoSuitableServer {
        /// The `target_session_attrs` asked for.
        wanted: &'static str,
        /// Each host and why it was passed over.
        tried: Vec<String>,
    },
    /// A consumer acknowledged a position beyond the last event it was
    /// given ([`AckHandle::try_ack`](crate::AckHandle::try_ack)); nothing
    /// was acknowledged.
    AckBeyondDelivery {
        /// The position acknowledged.
        acked: Lsn,
        /// The ack point of the last event delivered.
        delivered: Lsn,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Db(e) => write!(f, "server error: {e}"),
            Error::Tls(e) => write!(f, "TLS error: {e}"),
            Error::TlsRefused => write!(f, "server does not support TLS but sslmode requires it"),
            Error::Decode(e) => write!(f, "malformed replication message: {e}"),
            Error::UnexpectedMessage { context, tag } => {
                write!(f, "unexpected message '{}' during {context}", *tag as char)
            }
            Error::UnsupportedAuthentication(m) => {
                write!(f, "unsupported authentication method {m}")
            }
            Error::NotPublished { table } => write!(
                f,
                "table {table:?} is not in the publications (ALTER PUBLICATION ... ADD TABLE first); nothing was copied"
            ),
            Error::ServerTooOld {
                feature,
                needs,
                server,
            } => write!(
                f,
                "{feature} needs PostgreSQL {needs} or later; the server is {server}"
            ),
            Error::PasswordMissing => {
                write!(f, "the server requested a password and none was supplied")
            }
            Error::Sasl(e) => write!(f, "SCRAM authentication failed: {e}"),
            Error::Config { key, reason } => {
                write!(f, "invalid connection option {key:?}: {reason}")
            }
            Error::UnknownRelation(oid) => {
                write!(f, "change for relation {oid} before its Relation message")
            }
            Error::BadResult(what) => write!(f, "unexpected result shape for {what}"),
            Error::Column { column, reason } => write!(f, "column {column:?}: {reason}"),
            Error::RetriesExhausted { attempts, last } => {
                write!(f, "gave up after {attempts} attempts: {last}")
            }
            Error::Closed => write!(f, "stream closed"),
            Error::ReceiveTimeout { after, waiting_for } => write!(
                f,
                "nothing received from the server for {after:?} while waiting for {waiting_for} \
                 (receive timeout): the server, its host or the network is unreachable"
            ),
            Error::WalDir { path, op, source } => {
                write!(f, "cannot {op} {}: {source}", path.display())
            }
            Error::WalFile { path, reason } => write!(f, "{}: {reason}", path.display()),
            Error::WalGap { expected, got } => {
                write!(f, "WAL gap: expected data at {expected}, server sent {got}")
            }
            Error::TimelineNotOnServer { requested, server } => {
                write!(
                    f,
                    "timeline {requested} is not on the server (its current timeline is {server})"
                )
            }
            Error::StateFile { path, op, source } => {
                write!(f, "state file: cannot {op} {}: {source}", path.display())
            }
            Error::StateMismatch {
                path,
                what,
                file,
                server,
            } => write!(
                f,
                "state file {} is for {what} {file:?}, not {server:?}; nothing was streamed",
                path.display()
            ),
            Error::SlotInvalidated { slot, reason } => write!(
                f,
                "replication slot {slot:?} was invalidated ({reason}): the changes not yet \
                 received are gone; recreate the slot and copy the tables anew"
            ),
            Error::SlotAhead {
                slot,
                confirmed,
                acknowledged,
            } => write!(
                f,
                "replication slot {slot:?} has confirmed {confirmed}, {} bytes beyond the {acknowledged} \
                 this consumer confirmed: it was dropped and created again, another consumer \
                 moved it, or (after a failover) the promoted server's synced slot is ahead; \
                 streaming would skip changes never received here; nothing was streamed",
                confirmed.0.saturating_sub(acknowledged.0)
            ),
            Error::NoSuitableServer { wanted, tried } => write!(
                f,
                "no server is {wanted} ({})",
                tried.join("; ")
            ),
            Error::AckBeyondDelivery { acked, delivered } => write!(
                f,
                "acknowledged {acked}, beyond the last position delivered ({delivered}); nothing was \
                 acknowledged, as the slot would otherwise skip changes nobody processed"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e)
            | Error::Sasl(e)
            | Error::WalDir { source: e, .. }
            | Error::StateFile { source: e, .. } => Some(e),
            Error::Db(e) => Some(e),
            Error::Tls(e) => Some(e),
            Error::Decode(e) => Some(e),
            Error::RetriesExhausted { last, .. } => Some(&**last),
            _ => None,
        }
    }
}

impl Error {
    /// The SQLSTATE code, when the server reported the error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Db(e) => Some(&e.code),
            _ => None,
        }
    }

    /// The server's error, if any.
    pub fn as_db_error(&self) -> Option<&DbError> {
        match self {
            Error::Db(e) => Some(e),
            _ => None,
        }
    }

    /// Whether reconnecting and retrying may succeed: connection loss, or a
    /// transient server error such as "replication slot is active for PID".
    pub fn is_transient(&self) -> bool {
        match self {
            // a failover in progress: a standby is about to be promoted
            Error::Io(_)
            | Error::Closed
            | Error::ReceiveTimeout { .. }
            | Error::NoSuitableServer { .. } => true,
            Error::Db(e) => e.is_transient(),
            _ => false,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Error::Decode(e)
    }
}

impl From<DbError> for Error {
    fn from(e: DbError) -> Self {
        Error::Db(e)
    }
}

/// `Result<T, pgwal::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
