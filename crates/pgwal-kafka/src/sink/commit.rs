//! Writing into the open Kafka transaction and committing it: a record
//! sent (held while a commit is in flight), the commit started with its
//! progress record, and the slot acknowledged once it completed.

use super::*;

impl Session<'_> {
    /// Sends a record as the stream encoded it: in Avro, converted first
    /// (a streamed transaction's records, stamped at its commit).
    pub(super) async fn send(
        &mut self,
        r: &Record,
        producer: &mut KafkaProducer,
    ) -> Result<(), Failure> {
        let converted;
        let r = match self.avro.as_deref_mut() {
            // dead-letter records stay pgwal's JSON, for people and tools
            Some(_)
                if matches!(&self.sink.bad_records,
                    BadRecordPolicy::DeadLetter { topic } if *topic == r.topic) =>
            {
                r
            }
            Some(c) => {
                converted = c
                    .convert(r)
                    .await
                    .map_err(|e| Failure::Other(SinkError::Avro(e)))?;
                &converted
            }
            None => r,
        };
        self.send_ready(r, producer).await
    }

    /// Sends a record in its final form (Avro already, or JSON).
    pub(super) async fn send_ready(
        &mut self,
        r: &Record,
        producer: &mut KafkaProducer,
    ) -> Result<(), Failure> {
        let n = r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len);
        self.stats.records += 1;
        self.stats.bytes += n as u64;
        self.sink.live.record(&r.topic, n);
        if self.committing.is_some() {
            self.held.push(r.clone());
            self.held_bytes += n;
            if self.held_bytes >= self.sink.batch_bytes {
                self.await_commit(producer, true).await?;
            }
            return Ok(());
        }
        if let Some(open) = producer.open_for() {
            let timeout = producer.transaction_timeout();
            if open > timeout * 4 / 5 {
                return Err(Failure::Other(SinkError::TransactionTooLong {
                    xid: self.writing_xid,
                    open,
                    timeout,
                    records: self.batch_records,
                    bytes: self.batch_bytes,
                }));
            }
        }
        producer.send(r).await.map_err(|e| self.kafka(e))?;
        self.batch_bytes += n;
        self.batch_records += 1;
        Ok(())
    }

    /// Waits for the commit in flight, if any (see [`Session::committed`]).
    pub(super) async fn await_commit(
        &mut self,
        producer: &mut KafkaProducer,
        send_held: bool,
    ) -> Result<(), Failure> {
        if let Some((c, _)) = self.committing.as_mut() {
            let r = c.as_mut().await;
            self.committed(r, producer, send_held).await?;
        }
        Ok(())
    }

    /// A Kafka commit completed: Kafka holds its position, which the slot
    /// may now be acknowledged with; the held records open the next Kafka
    /// transaction.
    pub(super) async fn committed(
        &mut self,
        r: Result<(), ProducerError>,
        producer: &mut KafkaProducer,
        send_held: bool,
    ) -> Result<(), Failure> {
        let (_, end) = self.committing.take().expect("a commit was in flight");
        r.map_err(|e| self.kafka(e))?;
        self.committed_any = true;
        self.stats.kafka_commits += 1;
        let (took, commit_time) = match self.commit_started.take() {
            Some((started, t)) => (started.elapsed(), t),
            None => (Duration::ZERO, None),
        };
        let lag = commit_time
            .map(|t| Duration::from_micros(PgTimestamp::now().0.saturating_sub(t.0).max(0) as u64));
        self.sink
            .live
            .kafka_commit(took, end, lag, self.batch_first_commit_time);
        self.stats.position = Some(end);
        self.snapshot_committed = self.snapshot_in_flight.take();
        self.written = end;
        self.to_ack = Some(end);
        if send_held {
            for r in std::mem::take(&mut self.held) {
                producer.send(&r).await.map_err(|e| self.kafka(e))?;
                self.batch_bytes +=
                    r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len);
            }
        }
        self.held.clear();
        self.held_bytes = 0;
        Ok(())
    }

    /// At a stop: complete transactions into Kafka, a partial one aborted
    /// (it comes again).
    pub(super) async fn finish(&mut self, producer: &mut KafkaProducer) -> Result<(), Failure> {
        if self.current.is_none() {
            self.commit(producer).await?;
        }
        self.await_commit(producer, false).await?;
        producer.abort().await.map_err(|e| self.kafka(e))
    }

    /// A transaction was read whole and goes into the open Kafka
    /// transaction: the lag counts from its commit until Kafka holds it.
    pub(super) fn read_transaction(&mut self, commit_time: PgTimestamp) {
        self.batch_first_commit_time.get_or_insert(commit_time);
        self.sink.live.read_transaction(commit_time);
    }

    pub(super) async fn transaction_done(
        &mut self,
        end_lsn: Lsn,
        producer: &mut KafkaProducer,
    ) -> Result<(), Failure> {
        self.pending_end = Some(end_lsn);
        let since = *self
            .batch_since
            .get_or_insert_with(tokio::time::Instant::now);
        if self.batch_bytes + self.held_bytes >= self.sink.batch_bytes
            || since.elapsed() >= self.sink.batch_time
        {
            self.commit(producer).await?;
        }
        Ok(())
    }

    /// Starts committing the open Kafka transaction with its progress
    /// record, after the commit before it completed; the slot is
    /// acknowledged when this one completes.
    pub(super) async fn commit(&mut self, producer: &mut KafkaProducer) -> Result<(), Failure> {
        if self.pending_end.is_none() {
            return Ok(());
        }
        self.await_commit(producer, true).await?;
        // the held records joined the open transaction; it ends here
        let end = self.pending_end.take().expect("checked");
        let p = Progress {
            end_lsn: end,
            timeline: self.timeline,
            snapshot: self.snapshot.clone(),
        };
        let c = producer
            .start_commit_with(&p)
            .await
            .map_err(|e| self.kafka(e))?;
        self.snapshot_in_flight = p.snapshot;
        self.committing = Some((Box::pin(c), end));
        self.commit_started = Some((Instant::now(), self.tx_commit_time));
        self.batch_first_commit_time = None;
        self.batch_bytes = 0;
        self.batch_records = 0;
        self.batch_since = None;
        Ok(())
    }
}
