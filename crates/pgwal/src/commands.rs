//! Replication command results and options.

use pgwal_protocol::Lsn;

use crate::error::{Error, Result};

/// Result of `IDENTIFY_SYSTEM`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdentifySystem {
    /// The cluster's system identifier.
    pub system_id: String,
    /// Current timeline.
    pub timeline: u32,
    /// Current WAL flush position.
    pub xlog_pos: Lsn,
    /// Connected database.
    pub dbname: Option<String>,
}

/// What `CREATE_REPLICATION_SLOT` does with a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SlotSnapshot {
    /// Export a snapshot usable by `SET TRANSACTION SNAPSHOT` until the
    /// next command on this connection.
    Export,
    /// Use the snapshot in the current transaction.
    Use,
    /// No snapshot.
    #[default]
    Nothing,
}

/// Options of `CREATE_REPLICATION_SLOT`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CreateSlotOptions {
    /// Drop the slot when the session ends.
    pub temporary: bool,
    /// Decode prepared transactions at PREPARE.
    pub two_phase: bool,
    /// Sync the slot to standbys (PostgreSQL 17+).
    pub failover: bool,
    /// Snapshot handling.
    pub snapshot: SlotSnapshot,
}

impl CreateSlotOptions {
    /// Defaults: permanent, no two-phase, no failover, no snapshot.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets `temporary`.
    pub fn temporary(mut self, v: bool) -> Self {
        self.temporary = v;
        self
    }
    /// Sets `two_phase`.
    pub fn two_phase(mut self, v: bool) -> Self {
        self.two_phase = v;
        self
    }
    /// Sets `failover`.
    pub fn failover(mut self, v: bool) -> Self {
        self.failover = v;
        self
    }
    /// Sets `snapshot`.
    pub fn snapshot(mut self, v: SlotSnapshot) -> Self {
        self.snapshot = v;
        self
    }
}

/// Result of `CREATE_REPLICATION_SLOT`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlotInfo {
    /// Slot name.
    pub slot_name: String,
    /// The first LSN the slot can stream from.
    pub consistent_point: Lsn,
    /// The exported snapshot, with `SlotSnapshot::Export`.
    pub snapshot_name: Option<String>,
    /// Output plugin.
    pub output_plugin: Option<String>,
}

/// A slot's position and usability ([`ReplicationClient::slot_health`](crate::ReplicationClient::slot_health)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlotHealth {
    /// `confirmed_flush_lsn` (`None` for a physical slot or before the first confirmation).
    pub confirmed_flush: Option<Lsn>,
    /// `wal_status` (13+): `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// Why the slot was invalidated (17+: `invalidation_reason`; 16: a
    /// conflict with recovery), `None` while it is usable.
    pub invalidation_reason: Option<String>,
}

impl SlotHealth {
    /// Why the slot can no longer stream, if it cannot.
    pub fn invalidated(&self) -> Option<String> {
        self.invalidation_reason.clone().or_else(|| {
            (self.wal_status.as_deref() == Some("lost")).then(|| "wal_status lost".into())
        })
    }
}

/// Result of `TIMELINE_HISTORY`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimelineHistory {
    /// History file name.
    pub filename: String,
    /// File content.
    pub content: String,
}

impl TimelineHistory {
    /// A history with this file content (`filename` left empty).
    pub fn from_content(content: impl Into<String>) -> TimelineHistory {
        TimelineHistory {
            filename: String::new(),
            content: content.into(),
        }
    }

    /// Where `timeline` ended, as this history says (the first position
    /// of the timeline that followed it); `None` when the history does not
    /// name it: the history's own timeline, which has not ended, or one it
    /// never passed through. Lines that are not `timeline<TAB>X/Y<TAB>reason`
    /// (comments, blank lines) are skipped, as the server skips them.
    ///
    /// ```
    /// let h = pgwal::TimelineHistory::from_content(
    ///     "1\t0/3000160\tno recovery target specified\n\n2\t0/5000028\tafter a crash\n",
    /// );
    /// assert_eq!(h.switchpoint(1), Some("0/3000160".parse().unwrap()));
    /// assert_eq!(h.switchpoint(2), Some("0/5000028".parse().unwrap()));
    /// assert_eq!(h.switchpoint(3), None);
    /// ```
    pub fn switchpoint(&self, timeline: u32) -> Option<Lsn> {
        self.content.lines().find_map(|line| {
            let mut f = line.split_whitespace();
            let tli: u32 = f.next()?.parse().ok()?;
            let lsn: Lsn = f.next()?.parse().ok()?;
            (tli == timeline).then_some(lsn)
        })
    }
}

/// Where the server continues after a timeline ended (the result set that
/// follows the end of `START_REPLICATION PHYSICAL` on a historic timeline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NextTimeline {
    /// The next timeline.
    pub timeline: u32,
    /// Where it forked off the ended one (the ended timeline's last position).
    pub start: Lsn,
}

/// Slot names are restricted by the server to lower-case letters, digits and
/// underscores; checking here also keeps commands injection-free.
pub(crate) fn validate_slot_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 63
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(Error::Config {
            key: name.to_owned(),
            reason:
                "slot names may contain only lower-case letters, digits and underscores (max 63)",
        });
    }
    Ok(())
}

/// Quotes a string literal for SQL and replication commands
/// (`standard_conforming_strings` on, as every supported server has it).
///
/// ```
/// assert_eq!(pgwal::quote_literal("it's"), "'it''s'");
/// ```
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Quotes an identifier.
///
/// ```
/// assert_eq!(pgwal::quote_ident("My \"t\""), "\"My \"\"t\"\"\"");
/// ```
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}
