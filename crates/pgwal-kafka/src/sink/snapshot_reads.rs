//! The session's side of a snapshot (see [`crate::snapshot`]): planning
//! it, reading chunks between transactions, writing them at their
//! window's end, and the rows the stream changed meanwhile.

use super::*;

impl Session<'_> {
    /// Every published table, for `--snapshot` on a stream Kafka holds
    /// nothing of.
    pub(super) async fn plan_initial_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotCursor>, Failure> {
        let pubs = self.publications.clone();
        let pubs: Vec<&str> = pubs.iter().map(String::as_str).collect();
        let client = self.catalog().await?;
        let tables = pgwal::snapshot::published_tables(client, &pubs).await?;
        tracing::info!(
            tables = tables.len(),
            "Kafka holds nothing of this stream: snapshot of the published tables first"
        );
        Ok((!tables.is_empty()).then(|| {
            let mut c = SnapshotCursor::new(Vec::new());
            c.add(tables.into_iter().map(|t| (t.schema, t.table)));
            c
        }))
    }

    /// Reads the next chunk of the snapshot, unless it must wait (see
    /// [`crate::snapshot`]).
    pub(super) async fn read_chunk(&mut self) -> Result<(), Failure> {
        let Some(cursor) = &self.snapshot else {
            return Ok(());
        };
        let Some((schema, table)) = cursor.tables.first().cloned() else {
            self.snapshot = None;
            return Ok(());
        };
        let position = cursor.position.clone();
        if !self.stats_role_checked {
            self.stats_role_checked = true;
            self.check_stats_role().await;
        }
        let pubs = self.publications.clone();
        let keys = self.keys.clone();
        let limits = snapshot::ChunkLimits {
            rows: self
                .chunk_rows
                .clamp(1, self.sink.snapshot_chunk_rows.max(1)),
            bytes: self.sink.snapshot_chunk_bytes,
            statement_timeout: self.lookup_timeout,
            read_only: self.sink.snapshot_read_only,
        };
        let timeout = self.lookup_timeout;
        let read = async {
            let client = self.catalog().await?;
            snapshot::read_chunk(client, &pubs, (&schema, &table), &position, limits, &keys).await
        };
        // the server cancels the chunk's query at the same timeout; this
        // one also covers a server that does not answer at all
        let r = match timeout {
            Some(t) => tokio::time::timeout(t + Duration::from_secs(5), read)
                .await
                .unwrap_or(Err(SnapshotError::Postgres(pgwal::Error::ReceiveTimeout {
                    after: t,
                    waiting_for: "a snapshot chunk",
                }))),
            None => read.await,
        };
        let name = format!("{schema}.{table}");
        let chunk = match r {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                tracing::warn!(table = %name, "not a published table (any more); left out of the snapshot");
                self.table_done();
                return Ok(());
            }
            Err(SnapshotError::Postgres(e))
                if e.code() == Some("57014")
                    || matches!(e, pgwal::Error::ReceiveTimeout { .. }) =>
            {
                // too slow for the timeout: smaller chunks
                self.catalog = None;
                self.chunk_rows = (limits.rows / 2).max(1);
                tracing::warn!(table = %name, error = %e, rows_next = self.chunk_rows, "snapshot chunk took too long; trying again in a second with fewer rows");
                self.next_chunk_at = Instant::now() + Duration::from_secs(1);
                return Ok(());
            }
            Err(SnapshotError::Postgres(e)) if e.is_transient() => {
                self.catalog = None;
                tracing::warn!(table = %name, error = %e, "snapshot chunk failed; trying again in a second");
                self.next_chunk_at = Instant::now() + Duration::from_secs(1);
                return Ok(());
            }
            Err(e @ (SnapshotError::NoKey { .. } | SnapshotError::KeyNotUnique { .. })) => {
                // it would stop every restart too: the cursor names it
                self.stats.snapshot_tables_left_out += 1;
                tracing::error!(error = %e, "left out of the snapshot; signal it again once it has a key");
                self.table_done();
                return Ok(());
            }
            Err(e) => {
                self.catalog = None;
                if matches!(self.sink.bad_records, BadRecordPolicy::Fail) {
                    return Err(Failure::Other(e.into()));
                }
                // the cursor names the table: failing would fail every
                // restart until the cause is gone
                self.stats.snapshot_tables_left_out += 1;
                tracing::error!(table = %name, error = %e, "left out of the snapshot under --kafka-bad-records; signal it again once the cause is gone");
                self.table_done();
                return Ok(());
            }
        };
        // a chunk cut at the byte limit sizes the next; full chunks grow
        // it back
        self.chunk_rows = if chunk.cut_by_bytes {
            chunk.rows.len().max(1)
        } else {
            limits.rows.saturating_mul(2)
        };
        self.stats.snapshot_chunks += 1;
        self.stats.snapshot_read_only_chunks += u64::from(chunk.high.is_some());
        let mut chunk = chunk;
        if let Some(pk) = chunk.primary_key.take() {
            self.keys.set_primary_key(&chunk.relation, pk);
        }
        // rows the stream already carried from transactions the read did
        // not see: their newer state is in Kafka, the chunk's is older
        let oid = chunk.relation.oid;
        let mut unsure = false;
        for (xid, w) in &self.written_rows {
            if chunk.invisible(*xid) {
                unsure |= w.unkeyed.contains(&oid);
                for (_, k) in w.keys.iter().filter(|(o, _)| *o == oid) {
                    chunk.changed(k);
                }
            }
        }
        if self.unverified {
            // a transaction written before is hidden only while it waits
            // for a standby, and it has waited since before the first read.
            // A commit whose wait ended takes a moment more to become
            // visible (its backend leaves SyncRep before the proc array),
            // so it is waited for until a read sees it; a PREPARE that
            // waited stays in progress until its COMMIT PREPARED, and is not
            let mut w = self
                .waiting_for
                .take()
                .unwrap_or_else(|| chunk.held.clone());
            w.retain(|x| {
                chunk.held.contains(x) || (chunk.invisible(*x) && !chunk.prepared.contains(x))
            });
            if w.is_empty() {
                self.unverified = false;
            } else {
                unsure = true;
                self.waiting_for = Some(w);
            }
        }
        // what the read saw committed, every later read sees
        self.written_rows.retain(|x, _| chunk.invisible(*x));
        if unsure {
            self.stats.snapshot_rereads += 1;
            tracing::debug!(table = %format!("{schema}.{table}"), "a transaction written before the chunk may not be visible to it yet; reading the chunk again");
            self.next_chunk_at = Instant::now() + Duration::from_millis(200);
            return Ok(());
        }
        if chunk.high.is_some() {
            self.ask_position_at = Some(Instant::now());
        }
        self.chunk = Some(chunk);
        Ok(())
    }

    /// A read-only chunk's window ends before the first transaction that
    /// commits at or after `high` (every commit its snapshot saw is
    /// before), or at an answer to the position request that passed it
    /// (answers come between transactions). An answer short of it asks
    /// again shortly: the server has not sent that far yet.
    pub(super) async fn read_only_window(
        &mut self,
        high: Lsn,
        event: &Event,
        producer: &mut KafkaProducer,
    ) -> Result<(), Failure> {
        let passed = match event {
            Event::Begin(b) => b.final_lsn >= high,
            Event::StreamCommit(c) => c.commit_lsn >= high,
            Event::Heartbeat { wal_end } => {
                if *wal_end < high {
                    self.ask_position_at = Some(Instant::now() + Duration::from_millis(20));
                }
                *wal_end >= high
            }
            _ => false,
        };
        if !passed {
            return Ok(());
        }
        self.ask_position_at = None;
        // no transaction wrote these rows: xid 0 (PostgreSQL's invalid
        // xid), at the window's end, read now
        let tx = TxInfo::new(0, high, PgTimestamp::now());
        self.chunk_done(high, tx, producer).await?;
        // the rows and the cursor commit with the next Kafka transaction,
        // at a position Kafka already holds or is committing
        let at = self.written.max(self.pending_end.unwrap_or_default());
        self.transaction_done(at, producer).await
    }

    /// The chunk's window ended (at its watermark, inside transaction
    /// `tx` at `lsn`; or, read-only, where the stream passed its position
    /// `lsn`): its rows not changed meanwhile go to Kafka, and the cursor
    /// past it.
    pub(super) async fn chunk_done(
        &mut self,
        lsn: Lsn,
        tx: TxInfo,
        producer: &mut KafkaProducer,
    ) -> Result<(), Failure> {
        let chunk = self.chunk.take().expect("checked");
        if chunk.abandoned {
            self.stats.snapshot_rereads += 1;
            return Ok(());
        }
        let now = PgTimestamp::now();
        let mut n = 0;
        for row in chunk.rows.into_iter().flatten() {
            let encoded = encode_read(
                &self.sink.format,
                &self.sink.routing,
                &self.keys,
                &tx,
                lsn,
                &row,
                now,
            );
            let event = Event::Insert(pgwal::Change::insert(lsn, row));
            if let Some(records) = self.admit(&event, &tx, encoded).await? {
                for r in records {
                    self.send_ready(&r, producer).await?;
                }
                n += 1;
            }
        }
        self.stats.snapshot_rows += n;
        self.table_chunks += 1;
        self.table_rows += n;
        let cursor = self
            .snapshot
            .as_mut()
            .expect("chunks are read while a snapshot runs");
        cursor.rows += n;
        if chunk.table_done {
            self.table_done();
        } else {
            cursor.position = chunk.position;
        }
        Ok(())
    }

    /// Warns when the sink's role cannot see other roles' transactions in
    /// `pg_stat_activity`: their `backend_xid` is what tells a chunk that
    /// a commit it cannot see yet waits for a synchronous standby (see
    /// [`crate::snapshot`]). A failed check says nothing.
    async fn check_stats_role(&mut self) {
        let Ok(client) = self.catalog().await else {
            return;
        };
        let r = client
            .simple_query(
                "SELECT (pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') OR r.rolsuper)::text, \
                        r.rolname::text \
                 FROM pg_catalog.pg_roles r WHERE r.rolname = CURRENT_USER",
            )
            .await;
        if let Ok(rows) = r {
            if let Some(row) = rows.first() {
                if row.get_index(0) == Some("false") {
                    tracing::warn!(
                        role = row.get_index(1).unwrap_or_default(),
                        "the sink's role is neither a superuser nor a member of pg_read_all_stats: \
                         a snapshot cannot see other roles' commits that wait for a synchronous \
                         standby, and a chunk read while one waits may write a row's older state \
                         after its newer change; GRANT pg_read_all_stats to the role"
                    );
                }
            }
        }
    }

    /// The snapshot's first table is done.
    pub(super) fn table_done(&mut self) {
        let Some(cursor) = self.snapshot.as_mut() else {
            return;
        };
        if !cursor.tables.is_empty() {
            let (schema, table) = cursor.tables.remove(0);
            tracing::info!(
                table = %format!("{schema}.{table}"),
                rows = self.table_rows,
                chunks = self.table_chunks,
                rows_so_far = cursor.rows,
                "snapshot of a table done (rows and chunks: written by this session)"
            );
        }
        cursor.position = snapshot::TablePosition::default();
        self.table_chunks = 0;
        self.table_rows = 0;
        if cursor.tables.is_empty() {
            tracing::info!(rows = cursor.rows, "snapshot finished");
            self.snapshot = None;
            // what is written from here on is not kept
            self.written_rows.clear();
            self.unverified = true;
            self.waiting_for = None;
        }
    }

    /// A snapshot signal: its tables join the snapshot (a malformed one is
    /// logged and ignored: the stream must go on).
    pub(super) fn signal(&mut self, content: &[u8], lsn: Lsn) {
        match snapshot::parse_signal(content) {
            Err(e) => {
                tracing::warn!(%lsn, error = %e, "snapshot signal ignored: not {{\"tables\": [\"schema.table\", ...]}}")
            }
            Ok(snapshot::Signal {
                slot: Some(slot), ..
            }) if slot != self.slot => {
                tracing::info!(%lsn, %slot, "snapshot signal for another slot's sink; ignored");
            }
            Ok(signal) => {
                let tables = signal.tables;
                tracing::info!(%lsn, ?tables, "snapshot signal");
                let add = SnapshotCursor::new(tables).tables;
                self.snapshot
                    .get_or_insert_with(|| SnapshotCursor::new(Vec::new()))
                    .add(add);
            }
        }
    }
}

/// A change written while `chunk` waits for its watermark: the rows it
/// touches leave the chunk (the stream carries their newer state).
pub(super) fn in_window(chunk: &mut Chunk, event: &Event, keys: &KeyColumns) {
    match event {
        Event::Insert(c) | Event::Update(c) | Event::Delete(c)
            if c.relation.oid == chunk.relation.oid =>
        {
            for row in [&c.old, &c.new].into_iter().flatten() {
                if let Some(k) = snapshot::row_key(row, keys) {
                    chunk.changed(&k);
                }
            }
        }
        Event::Truncate(t) if t.relations.iter().any(|r| r.oid == chunk.relation.oid) => {
            chunk.truncated()
        }
        _ => {}
    }
}

/// The rows one transaction changed, by table oid and key (pgwal's key
/// JSON), and the tables it changed without keys kept (truncates, streamed
/// transactions).
#[derive(Debug, Default)]
pub(super) struct WrittenRows {
    pub(super) keys: Vec<(u32, Vec<u8>)>,
    pub(super) unkeyed: HashSet<u32>,
}

impl WrittenRows {
    pub(super) fn add(&mut self, event: &Event, keys: &KeyColumns) {
        match event {
            Event::Insert(c) | Event::Update(c) | Event::Delete(c) => {
                for row in [&c.old, &c.new].into_iter().flatten() {
                    match snapshot::row_key(row, keys) {
                        Some(k) => self.keys.push((c.relation.oid, k)),
                        None => {
                            self.unkeyed.insert(c.relation.oid);
                        }
                    }
                }
            }
            Event::Truncate(t) => self.unkeyed.extend(t.relations.iter().map(|r| r.oid)),
            _ => {}
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.unkeyed.is_empty()
    }
}
