//! A replication connection: simple queries and replication commands.

use std::sync::Arc;

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{split, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::commands::{
    quote_literal, validate_slot_name, CreateSlotOptions, IdentifySystem, NextTimeline, SlotHealth,
    SlotInfo, SlotSnapshot, TimelineHistory,
};
use crate::config::{Config, TargetSessionAttrs};
use crate::error::{Error, Result};
use crate::framing::{Backend, FrameReader};
use crate::socket::{self, Socket};
use crate::startup;
use pgwal_protocol::Lsn;

/// One row of a simple query result, in text format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleRow {
    columns: Arc<[String]>,
    values: Vec<Option<String>>,
}

impl SimpleRow {
    /// The value of column `name` (`None` for NULL or no such column).
    pub fn get(&self, name: &str) -> Option<&str> {
        let i = self.columns.iter().position(|c| c == name)?;
        self.values[i].as_deref()
    }

    /// The value at `index`.
    pub fn get_index(&self, index: usize) -> Option<&str> {
        self.values.get(index)?.as_deref()
    }

    /// Column names.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }
}

/// A connection in logical replication mode (`replication=database`).
///
/// It accepts replication commands and plain SQL. [`start_logical_replication`]
/// consumes it and hands back the raw CopyBoth halves; most users want
/// [`LogicalStream`](crate::LogicalStream) instead.
///
/// [`start_logical_replication`]: Self::start_logical_replication
///
/// ```no_run
/// # async fn f() -> Result<(), pgwal::Error> {
/// let config = "host=127.0.0.1 user=postgres dbname=app".parse()?;
/// let mut client = pgwal::ReplicationClient::connect(&config).await?;
/// let sys = client.identify_system().await?;
/// println!("system {} at {}", sys.system_id, sys.xlog_pos);
/// # Ok(()) }
/// ```
pub struct ReplicationClient {
    pub(crate) reader: FrameReader<ReadHalf<Box<dyn Socket>>>,
    pub(crate) writer: WriteHalf<Box<dyn Socket>>,
    parameters: Vec<(String, String)>,
    backend_pid: i32,
    buf: BytesMut,
    /// Rows the last `COPY ... TO STDOUT` reported.
    copy_rows: u64,
}

impl std::fmt::Debug for ReplicationClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationClient")
            .field("backend_pid", &self.backend_pid)
            .finish_non_exhaustive()
    }
}

impl ReplicationClient {
    /// Connects, negotiates TLS, authenticates.
    pub async fn connect(config: &Config) -> Result<ReplicationClient> {
        Self::connect_mode(config, Some("database")).await
    }

    /// Connects in physical replication mode (`replication=true`): no
    /// database, matched by `replication` lines of `pg_hba.conf`; accepts
    /// replication commands and `SHOW`, not SQL.
    pub async fn connect_physical(config: &Config) -> Result<ReplicationClient> {
        Self::connect_mode(config, Some("true")).await
    }

    /// Connects without replication mode (a normal SQL session), e.g. for
    /// reading a snapshot.
    pub async fn connect_sql(config: &Config) -> Result<ReplicationClient> {
        Self::connect_mode(config, None).await
    }

    /// Tries the configuration's hosts in order until one accepts the
    /// connection and matches `target_session_attrs` (with
    /// `prefer-standby`: a standby in a first round, anything in a second).
    async fn connect_mode(config: &Config, replication: Option<&str>) -> Result<ReplicationClient> {
        let hosts = config.hosts();
        if hosts.len() == 1 && config.target_session_attrs == TargetSessionAttrs::Any {
            return Self::connect_one(config, replication).await;
        }
        let rounds: &[TargetSessionAttrs] = match config.target_session_attrs {
            TargetSessionAttrs::PreferStandby => {
                &[TargetSessionAttrs::Standby, TargetSessionAttrs::Any]
            }
            t => &[t],
        };
        let mut tried = Vec::new();
        let mut last = None;
        for &want in rounds {
            for (host, port) in &hosts {
                let one = config.with_host(host, *port);
                match Self::connect_one(&one, replication).await {
                    Ok(mut c) => match c.session_matches(want).await {
                        Ok(true) => return Ok(c),
                        Ok(false) => tried.push(format!("{host}:{port} is not {}", want.as_str())),
                        Err(e) => {
                            tried.push(format!("{host}:{port}: {e}"));
                            last = Some(e);
                        }
                    },
                    Err(e) => {
                        tried.push(format!("{host}:{port}: {e}"));
                        last = Some(e);
                    }
                }
            }
        }
        if hosts.len() == 1 {
            if let Some(e) = last {
                return Err(e);
            }
        }
        Err(Error::NoSuitableServer {
            wanted: config.target_session_attrs.as_str(),
            tried,
        })
    }

    /// Whether the server this client is connected to is what `want` asks
    /// for: from the `in_hot_standby` and `default_transaction_read_only`
    /// parameters the server reports (14+), else by asking.
    async fn session_matches(&mut self, want: TargetSessionAttrs) -> Result<bool> {
        if want == TargetSessionAttrs::Any {
            return Ok(true);
        }
        let in_recovery = match self.parameter("in_hot_standby") {
            Some(v) => v == "on",
            // before 14: a replication connection cannot run SQL functions in
            // physical mode, but SHOW works in every mode
            None => self.show("transaction_read_only").await? == "on",
        };
        let read_only = in_recovery
            || match self.parameter("default_transaction_read_only") {
                Some(v) => v == "on",
                None => self.show("transaction_read_only").await? == "on",
            };
        Ok(match want {
            TargetSessionAttrs::ReadWrite => !read_only,
            TargetSessionAttrs::ReadOnly => read_only,
            TargetSessionAttrs::Primary => !in_recovery,
            TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => in_recovery,
            _ => true,
        })
    }

    async fn connect_one(config: &Config, replication: Option<&str>) -> Result<ReplicationClient> {
        let t = socket::connect(config).await?;
        let (r, mut w) = split(t.io);
        let mut reader = FrameReader::new(r).with_low_water(t.low_water);
        let info =
            startup::startup(config, t.tls_end_point, &mut reader, &mut w, replication).await?;
        Ok(ReplicationClient {
            reader,
            writer: w,
            parameters: info.parameters,
            backend_pid: info.backend_pid,
            copy_rows: 0,
            buf: BytesMut::new(),
        })
    }

    /// The server process id serving this connection (the walsender).
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// A server parameter reported at startup, e.g. `server_version`.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the server lists `feature` in its `replication_features`
    /// parameter (a comma-separated list reported at startup by servers with
    /// the optional replication protocol features: `unflushed_wal`,
    /// `receive_position`). Servers without the parameter have none.
    pub fn has_replication_feature(&self, feature: &str) -> bool {
        self.parameter("replication_features")
            .is_some_and(|list| list.split(',').any(|f| f.trim() == feature))
    }

    /// The server's major version (e.g. 15), from `server_version`.
    pub fn server_major_version(&self) -> Option<u32> {
        let v = self.parameter("server_version")?;
        v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    }

    pub(crate) async fn send_query(&mut self, sql: &str) -> Result<()> {
        frontend::query(sql, &mut self.buf)?;
        self.writer.write_all(&self.buf).await?;
        self.writer.flush().await?;
        self.buf.clear();
        Ok(())
    }

    /// Runs one or more SQL statements or a replication command with the
    /// simple query protocol; returns the rows of the last result set.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<SimpleRow>> {
        self.send_query(sql).await?;
        let mut rows = Vec::new();
        let mut columns: Arc<[String]> = Arc::from(Vec::new());
        let mut error = None;
        loop {
            match self.reader.read().await? {
                Backend::Other(Message::RowDescription(d)) => {
                    let names: Vec<String> =
                        d.fields().map(|f| Ok(f.name().to_owned())).collect()?;
                    columns = names.into();
                    rows.clear();
                }
                Backend::Other(Message::DataRow(d)) => {
                    let values = text_values(&d)?;
                    rows.push(SimpleRow {
                        columns: columns.clone(),
                        values,
                    });
                }
                Backend::Other(Message::ErrorResponse(b)) => {
                    error = Some(crate::framing::db_error(b.fields())?);
                }
                Backend::Other(Message::ReadyForQuery(_)) => break,
                Backend::Other(_) => {}
                Backend::CopyData(_) | Backend::CopyBothResponse => {
                    return Err(Error::UnexpectedMessage {
                        context: "simple query",
                        tag: b'W',
                    })
                }
            }
        }
        match error {
            Some(e) => Err(Error::Db(e)),
            None => Ok(rows),
        }
    }

    /// Runs a `COPY ... TO STDOUT` statement, handing each CopyData chunk to `f`.
    pub async fn copy_out(
        &mut self,
        sql: &str,
        mut f: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<u64> {
        self.copy_out_start(sql).await?;
        let mut error = None;
        while let Some(chunk) = self.copy_out_next().await? {
            if error.is_none() {
                if let Err(e) = f(&chunk) {
                    error = Some(e);
                }
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(self.copy_rows),
        }
    }

    /// Sends a `COPY ... TO STDOUT` statement; read its data with
    /// [`copy_out_next`](Self::copy_out_next) until it returns `None`.
    pub(crate) async fn copy_out_start(&mut self, sql: &str) -> Result<()> {
        self.copy_rows = 0;
        self.send_query(sql).await
    }

    /// The next CopyData chunk of the running COPY, or `None` once the
    /// server is ready for the next command (the rows it reported are in
    /// `copy_rows`). A server error is returned after the end is read, so
    /// the connection stays usable.
    pub(crate) async fn copy_out_next(&mut self) -> Result<Option<bytes::Bytes>> {
        loop {
            match self.reader.read().await? {
                Backend::CopyData(d) => return Ok(Some(d)),
                Backend::Other(Message::CommandComplete(c)) => {
                    self.copy_rows = c
                        .tag()?
                        .rsplit(' ')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                }
                Backend::Other(Message::ErrorResponse(b)) => {
                    let e = Error::Db(crate::framing::db_error(b.fields())?);
                    // read on to ReadyForQuery: the connection stays usable
                    while !matches!(
                        self.reader.read().await?,
                        Backend::Other(Message::ReadyForQuery(_))
                    ) {}
                    return Err(e);
                }
                Backend::Other(Message::ReadyForQuery(_)) => return Ok(None),
                Backend::Other(_) => {}
                Backend::CopyBothResponse => {
                    return Err(Error::UnexpectedMessage {
                        context: "COPY",
                        tag: b'W',
                    })
                }
            }
        }
    }

    /// `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<IdentifySystem> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let r = rows.first().ok_or(Error::BadResult("IDENTIFY_SYSTEM"))?;
        Ok(IdentifySystem {
            system_id: r
                .get("systemid")
                .ok_or(Error::BadResult("IDENTIFY_SYSTEM"))?
                .to_owned(),
            timeline: r
                .get("timeline")
                .and_then(|t| t.parse().ok())
                .ok_or(Error::BadResult("IDENTIFY_SYSTEM"))?,
            xlog_pos: r
                .get("xlogpos")
                .and_then(|t| t.parse().ok())
                .ok_or(Error::BadResult("IDENTIFY_SYSTEM"))?,
            dbname: r.get("dbname").map(str::to_owned),
        })
    }

    /// `CREATE_REPLICATION_SLOT ... LOGICAL pgoutput`: options in
    /// parentheses on 15+, as bare keywords before (the 10–14 grammar).
    /// Two-phase needs 15 (as does pgoutput's two-phase decoding), failover
    /// 17 ([`Error::ServerTooOld`] otherwise).
    pub async fn create_logical_slot(
        &mut self,
        name: &str,
        opts: &CreateSlotOptions,
    ) -> Result<SlotInfo> {
        validate_slot_name(name)?;
        let major = self.server_major_version().unwrap_or(15);
        let too_old = |feature, needs| Error::ServerTooOld {
            feature,
            needs,
            server: major,
        };
        if opts.failover && major < 17 {
            return Err(too_old("a failover slot", 17));
        }
        if opts.two_phase && major < 15 {
            return Err(too_old("a two-phase slot", 15));
        }
        let mut sql = format!("CREATE_REPLICATION_SLOT {name}");
        if opts.temporary {
            sql.push_str(" TEMPORARY");
        }
        sql.push_str(" LOGICAL pgoutput");
        if major < 15 {
            sql.push_str(match opts.snapshot {
                SlotSnapshot::Export => " EXPORT_SNAPSHOT",
                SlotSnapshot::Use => " USE_SNAPSHOT",
                SlotSnapshot::Nothing => " NOEXPORT_SNAPSHOT",
            });
        } else {
            let mut o = Vec::new();
            if opts.two_phase {
                o.push("TWO_PHASE true".to_owned());
            }
            if opts.failover {
                o.push("FAILOVER true".to_owned());
            }
            match opts.snapshot {
                SlotSnapshot::Export => o.push("SNAPSHOT 'export'".to_owned()),
                SlotSnapshot::Use => o.push("SNAPSHOT 'use'".to_owned()),
                SlotSnapshot::Nothing => o.push("SNAPSHOT 'nothing'".to_owned()),
            }
            sql.push_str(&format!(" ({})", o.join(", ")));
        }
        let rows = self.simple_query(&sql).await?;
        let r = rows
            .first()
            .ok_or(Error::BadResult("CREATE_REPLICATION_SLOT"))?;
        Ok(SlotInfo {
            slot_name: r.get("slot_name").unwrap_or(name).to_owned(),
            consistent_point: r
                .get("consistent_point")
                .and_then(|l| l.parse().ok())
                .ok_or(Error::BadResult("CREATE_REPLICATION_SLOT"))?,
            snapshot_name: r.get("snapshot_name").map(str::to_owned),
            output_plugin: r.get("output_plugin").map(str::to_owned),
        })
    }

    /// `DROP_REPLICATION_SLOT name [WAIT]`.
    pub async fn drop_slot(&mut self, name: &str, wait: bool) -> Result<()> {
        validate_slot_name(name)?;
        let sql = format!(
            "DROP_REPLICATION_SLOT {name}{}",
            if wait { " WAIT" } else { "" }
        );
        self.simple_query(&sql).await.map(drop)
    }

    /// `ALTER_REPLICATION_SLOT name (FAILOVER x, TWO_PHASE y)` (PostgreSQL 17+;
    /// `TWO_PHASE` 18+). `None` leaves an option unchanged.
    pub async fn alter_slot(
        &mut self,
        name: &str,
        failover: Option<bool>,
        two_phase: Option<bool>,
    ) -> Result<()> {
        validate_slot_name(name)?;
        let mut o = Vec::new();
        if let Some(f) = failover {
            o.push(format!("FAILOVER {f}"));
        }
        if let Some(t) = two_phase {
            o.push(format!("TWO_PHASE {t}"));
        }
        if o.is_empty() {
            return Ok(());
        }
        self.simple_query(&format!("ALTER_REPLICATION_SLOT {name} ({})", o.join(", ")))
            .await
            .map(drop)
    }

    /// `READ_REPLICATION_SLOT name` (PostgreSQL 15+, physical slots): the
    /// slot type, restart LSN and its timeline; `None` if the slot is missing.
    pub async fn read_slot(&mut self, name: &str) -> Result<Option<(String, Lsn, u32)>> {
        validate_slot_name(name)?;
        let rows = self
            .simple_query(&format!("READ_REPLICATION_SLOT {name}"))
            .await?;
        let r = rows
            .first()
            .ok_or(Error::BadResult("READ_REPLICATION_SLOT"))?;
        match r.get("slot_type") {
            None => Ok(None),
            Some(t) => Ok(Some((
                t.to_owned(),
                r.get("restart_lsn")
                    .and_then(|l| l.parse().ok())
                    .unwrap_or_default(),
                r.get("restart_tli")
                    .and_then(|l| l.parse().ok())
                    .unwrap_or_default(),
            ))),
        }
    }

    /// `TIMELINE_HISTORY tli`.
    pub async fn timeline_history(&mut self, timeline: u32) -> Result<TimelineHistory> {
        let rows = self
            .simple_query(&format!("TIMELINE_HISTORY {timeline}"))
            .await?;
        let r = rows.first().ok_or(Error::BadResult("TIMELINE_HISTORY"))?;
        Ok(TimelineHistory {
            filename: r.get("filename").unwrap_or_default().to_owned(),
            content: r.get("content").unwrap_or_default().to_owned(),
        })
    }

    /// The slot's confirmed position and whether it is still usable, via
    /// SQL (`None` if no such slot).
    pub async fn slot_health(&mut self, name: &str) -> Result<Option<SlotHealth>> {
        let major = self.server_major_version().unwrap_or(10);
        // invalidation_reason from 17, conflicting from 16, wal_status from 13
        let reason = match major {
            17.. => "invalidation_reason",
            16 => "CASE WHEN conflicting THEN 'conflict with recovery' END",
            _ => "NULL::text",
        };
        let wal_status = if major >= 13 {
            "wal_status"
        } else {
            "NULL::text"
        };
        let rows = self
            .simple_query(&format!(
                "SELECT confirmed_flush_lsn, {wal_status}, {reason} \
                 FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
                quote_literal(name)
            ))
            .await?;
        Ok(rows.first().map(|r| SlotHealth {
            confirmed_flush: r.get_index(0).and_then(|l| l.parse().ok()),
            wal_status: r.get_index(1).map(str::to_owned),
            invalidation_reason: r.get_index(2).map(str::to_owned),
        }))
    }

    /// Whether the slot decodes prepared transactions at PREPARE (its
    /// `two_phase`), via SQL: `None` if no such slot, `Some(false)` before
    /// PostgreSQL 14, which has no two-phase slots.
    pub async fn slot_two_phase(&mut self, name: &str) -> Result<Option<bool>> {
        let column = if self.server_major_version().unwrap_or(10) >= 14 {
            "two_phase"
        } else {
            "false"
        };
        let rows = self
            .simple_query(&format!(
                "SELECT {column} FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
                quote_literal(name)
            ))
            .await?;
        Ok(rows.first().map(|r| r.get_index(0) == Some("t")))
    }

    /// The slot's `confirmed_flush_lsn`, via SQL (`None` if no such slot).
    pub async fn slot_confirmed_flush(&mut self, name: &str) -> Result<Option<Lsn>> {
        let rows = self
            .simple_query(&format!(
                "SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
                quote_literal(name)
            ))
            .await?;
        Ok(rows.first().map(|r| {
            r.get_index(0)
                .and_then(|l| l.parse().ok())
                .unwrap_or_default()
        }))
    }

    /// Sends `START_REPLICATION SLOT slot LOGICAL start (options)` and waits
    /// for the server to enter CopyBoth mode.
    pub async fn start_logical_replication(
        &mut self,
        slot: &str,
        start: Lsn,
        options: &[(&str, String)],
    ) -> Result<()> {
        validate_slot_name(slot)?;
        let mut sql = format!("START_REPLICATION SLOT {slot} LOGICAL {start}");
        if !options.is_empty() {
            let o: Vec<String> = options
                .iter()
                .map(|(k, v)| format!("\"{k}\" {}", quote_literal(v)))
                .collect();
            sql.push_str(&format!(" ({})", o.join(", ")));
        }
        self.send_query(&sql).await?;
        match self.reader.read_ok().await? {
            Backend::CopyBothResponse => Ok(()),
            _ => Err(Error::UnexpectedMessage {
                context: "START_REPLICATION",
                tag: b'?',
            }),
        }
    }

    /// `SHOW name` (works on physical replication connections too).
    pub async fn show(&mut self, name: &str) -> Result<String> {
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            return Err(Error::Config {
                key: name.to_owned(),
                reason: "not a setting name",
            });
        }
        let rows = self.simple_query(&format!("SHOW {name}")).await?;
        Ok(rows
            .first()
            .and_then(|r| r.get_index(0))
            .ok_or(Error::BadResult("SHOW"))?
            .to_owned())
    }

    /// `CREATE_REPLICATION_SLOT name [TEMPORARY] PHYSICAL (RESERVE_WAL true)`:
    /// a physical slot whose `restart_lsn` follows the flush position
    /// reported by the receiver streaming through it.
    pub async fn create_physical_slot(&mut self, name: &str, temporary: bool) -> Result<SlotInfo> {
        validate_slot_name(name)?;
        let temp = if temporary { " TEMPORARY" } else { "" };
        let rows = self
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT {name}{temp} PHYSICAL (RESERVE_WAL true)"
            ))
            .await?;
        let r = rows
            .first()
            .ok_or(Error::BadResult("CREATE_REPLICATION_SLOT"))?;
        Ok(SlotInfo {
            slot_name: r.get("slot_name").unwrap_or(name).to_owned(),
            consistent_point: r
                .get("consistent_point")
                .and_then(|l| l.parse().ok())
                .unwrap_or_default(),
            snapshot_name: None,
            output_plugin: None,
        })
    }

    /// Sends `START_REPLICATION [SLOT slot] PHYSICAL start [TIMELINE tli]`.
    ///
    /// `Ok(None)`: the server entered CopyBoth mode and streams WAL.
    /// `Ok(Some(next))`: `timeline` ended exactly at `start`, the server
    /// answered with the next timeline at once (no streaming).
    pub async fn start_physical_replication(
        &mut self,
        slot: Option<&str>,
        start: Lsn,
        timeline: Option<u32>,
    ) -> Result<Option<NextTimeline>> {
        let mut sql = String::from("START_REPLICATION");
        if let Some(slot) = slot {
            validate_slot_name(slot)?;
            sql.push_str(&format!(" SLOT {slot}"));
        }
        sql.push_str(&format!(" PHYSICAL {start}"));
        if let Some(t) = timeline {
            sql.push_str(&format!(" TIMELINE {t}"));
        }
        self.send_query(&sql).await?;
        match self.reader.read_ok().await? {
            Backend::CopyBothResponse => Ok(None),
            Backend::Other(m) => self.end_of_timeline(Some(m)).await.map(Some),
            Backend::CopyData(_) => Err(Error::UnexpectedMessage {
                context: "START_REPLICATION",
                tag: b'd',
            }),
        }
    }

    /// After the server ended CopyBoth mode (its CopyDone) and the client
    /// answered with CopyDone: reads the result set naming the next timeline
    /// and the rest up to ReadyForQuery.
    pub(crate) async fn end_of_timeline(&mut self, first: Option<Message>) -> Result<NextTimeline> {
        let mut next = None;
        let mut error = None;
        let mut pending = first;
        loop {
            let m = match pending.take() {
                Some(m) => m,
                None => match self.reader.read().await? {
                    Backend::Other(m) => m,
                    // WAL still in flight when we sent CopyDone.
                    Backend::CopyData(_) => continue,
                    Backend::CopyBothResponse => {
                        return Err(Error::UnexpectedMessage {
                            context: "end of timeline",
                            tag: b'W',
                        })
                    }
                },
            };
            match m {
                Message::DataRow(d) => {
                    let values = text_values(&d)?;
                    let tli = values
                        .first()
                        .cloned()
                        .flatten()
                        .and_then(|v| v.parse().ok());
                    let pos = values
                        .get(1)
                        .cloned()
                        .flatten()
                        .and_then(|v| v.parse().ok());
                    if let (Some(timeline), Some(start)) = (tli, pos) {
                        next = Some(NextTimeline { timeline, start });
                    }
                }
                Message::ErrorResponse(b) => error = Some(crate::framing::db_error(b.fields())?),
                Message::ReadyForQuery(_) => break,
                _ => {}
            }
        }
        if let Some(e) = error {
            return Err(Error::Db(e));
        }
        next.ok_or(Error::BadResult("end of timeline (next timeline)"))
    }
}

/// The values of a DataRow as text (`None` for NULL).
fn text_values(
    d: &postgres_protocol::message::backend::DataRowBody,
) -> Result<Vec<Option<String>>> {
    let buf = d.buffer();
    Ok(d.ranges()
        .map(|r| Ok(r.map(|r| String::from_utf8_lossy(&buf[r]).into_owned())))
        .collect()?)
}

pub(crate) async fn send_copy_data(
    w: &mut WriteHalf<Box<dyn Socket>>,
    buf: &mut BytesMut,
    body: &[u8],
) -> Result<()> {
    frontend::CopyData::new(body)?.write(buf);
    w.write_all(buf).await?;
    w.flush().await?;
    buf.clear();
    Ok(())
}

/// Ends CopyBoth mode from the client side: CopyDone, waits up to 5 s for
/// the server to finish (ReadyForQuery), then Terminate. Errors are ignored:
/// the connection is being given up anyway.
pub(crate) async fn close_copy_both<R: tokio::io::AsyncRead + Unpin>(
    writer: &mut WriteHalf<Box<dyn Socket>>,
    reader: &mut FrameReader<R>,
) {
    let mut buf = BytesMut::new();
    frontend::copy_done(&mut buf);
    if writer.write_all(&buf).await.is_err() {
        return;
    }
    let _ = writer.flush().await;
    let drain = async {
        loop {
            match reader.read().await {
                Ok(Backend::Other(Message::ReadyForQuery(_))) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drain).await;
    buf.clear();
    frontend::terminate(&mut buf);
    let _ = writer.write_all(&buf).await;
    let _ = writer.shutdown().await;
}
