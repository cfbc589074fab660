//! The transactional producer: Kafka transactions that each hold whole
//! PostgreSQL transactions and a progress record, committed before the slot
//! is acknowledged. [`crate::sink`] drives it.
//!
//! Ordering rules:
//! 1. A Kafka transaction is committed only at a PostgreSQL commit
//!    boundary, with the progress record of that commit inside it.
//! 2. The slot is acknowledged with a position only after the Kafka
//!    transaction holding it committed; so the slot is never ahead of Kafka.
//! 3. On start, the last committed progress (read_committed) says where
//!    Kafka is; PostgreSQL transactions whose commit record starts before
//!    it were written already and are skipped, however far behind the slot
//!    is.
//! 4. The transactional id is fixed per stream: a new producer fences a
//!    zombie one, whose transaction the broker aborts.

use std::sync::Arc;
use std::time::Duration;

use pgwal_protocol::Lsn;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::client::Context;
use crate::format::Record;
use crate::progress::{self, Progress};

/// Errors of the producer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// From the Kafka client.
    #[error("Kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A broker refused the connection: TLS (a certificate that does not
    /// verify, a client certificate missing) or SASL authentication
    /// failed. Retrying does not help until the configuration changes.
    #[error("Kafka refused the connection: {reason}")]
    Refused {
        /// librdkafka's account, which names the cause.
        reason: String,
    },
    /// A call failed while no broker could be reached; what the last
    /// connection attempt said (e.g. a plaintext client at a TLS port).
    #[error("Kafka: {source}; the brokers' last connection error: {cause}")]
    Unreachable {
        /// The call's error.
        source: KafkaError,
        /// The last connection error librdkafka reported.
        cause: String,
    },
    /// A blocking call's thread panicked or was cancelled.
    #[error("a Kafka client call did not complete")]
    Join,
    /// The progress topic could not be read to its end in time; a
    /// position read short of it could be stale, so none is guessed.
    #[error("progress topic {topic}: {} within the timeout", read_so_far(*.offset, *.end))]
    ProgressTimeout {
        /// The topic.
        topic: String,
        /// How far the read came.
        offset: i64,
        /// Its end when the read began.
        end: i64,
    },
    /// The end of the progress topic could not be learnt within the
    /// timeout (its leader moving, a broker down). Never read as an empty
    /// topic: that would write again what Kafka holds.
    #[error("progress topic {topic}: its end could not be read: {source}")]
    ProgressEnd {
        /// The topic.
        topic: String,
        /// The last answer.
        source: KafkaError,
    },
    /// Records could not be delivered to a topic that the cluster does
    /// not have (and does not create: `auto.create.topics.enable=false`)
    /// or does not let pgwal write (an ACL). Checked against the cluster's
    /// metadata after the commit failed: every retry would fail the same
    /// way until the topic is created or the ACL granted.
    #[error("Kafka topic {topic} cannot be written: {reason}; create it (the broker does not create topics on first use) or grant pgwal's principal WRITE on it")]
    TopicUnusable {
        /// The topic.
        topic: String,
        /// The delivery error, and what the metadata said.
        reason: String,
    },
    /// The broker is still completing a transaction of an earlier producer
    /// with this transactional id (one killed, or cut off, while it
    /// committed or aborted): `init_transactions` waits for it, and pgwal
    /// tries again. It lasts at most until that transaction times out.
    #[error("Kafka: the broker is still completing a transaction of an earlier producer with transactional id {transactional_id} (one killed or cut off while it committed); trying again: {source}")]
    EarlierTransactionOpen {
        /// The transactional id.
        transactional_id: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// A progress record that is not one.
    #[error("progress topic {topic}: record for {key} at offset {offset} is not a position")]
    BadProgress {
        /// The topic.
        topic: String,
        /// The stream's key.
        key: String,
        /// Where.
        offset: i64,
    },
}

/// How far a progress read came, for [`ProducerError::ProgressTimeout`]:
/// a read that never got a position says so, not an invalid offset.
fn read_so_far(offset: i64, end: i64) -> String {
    if offset < 0 {
        format!("nothing read up to its end at offset {end}")
    } else {
        format!("read to offset {offset} of {end}")
    }
}

/// Where the producer writes and how long it may wait.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// `transactional.id`: one per stream, stable across restarts.
    pub transactional_id: String,
    /// The compacted progress topic.
    pub progress_topic: String,
    /// This stream's key in it ([`progress::key`]).
    pub progress_key: String,
    /// Limit of each blocking transaction call.
    pub timeout: Duration,
    /// Further librdkafka settings (security, compression, ...), applied
    /// last, except `transactional.id` and `enable.idempotence`, which
    /// exactly-once needs as set here.
    pub client_options: Vec<(String, String)>,
}

impl ProducerConfig {
    /// A configuration (30 s timeout).
    pub fn new(
        brokers: impl Into<String>,
        transactional_id: impl Into<String>,
        progress_topic: impl Into<String>,
        progress_key: impl Into<String>,
    ) -> ProducerConfig {
        ProducerConfig {
            brokers: brokers.into(),
            transactional_id: transactional_id.into(),
            progress_topic: progress_topic.into(),
            progress_key: progress_key.into(),
            timeout: Duration::from_secs(30),
            client_options: Vec::new(),
        }
    }
}

/// A transactional producer.
pub struct KafkaProducer {
    producer: Arc<ThreadedProducer<Context>>,
    context: Context,
    config: ProducerConfig,
    /// The progress topic's partition this stream's records go to.
    progress_partition: i32,
    open: bool,
    /// When the open Kafka transaction began.
    opened_at: Option<std::time::Instant>,
    /// `transaction.timeout.ms`: the broker aborts a transaction open longer.
    transaction_timeout: Duration,
    queue_full_waits: u64,
    /// The topics the open transaction wrote: after a failed commit, each
    /// is looked up in the cluster's metadata.
    topics: Vec<String>,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, ProducerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ProducerError::Join)?
        .map_err(ProducerError::Kafka)
}

impl KafkaProducer {
    /// Creates the producer and registers its transactional id, fencing any
    /// earlier producer with the same id.
    pub async fn connect(config: ProducerConfig) -> Result<KafkaProducer, ProducerError> {
        let mut cc = ClientConfig::new();
        liveness(&mut cc, config.timeout);
        cc.set("bootstrap.servers", &config.brokers)
            .set("transaction.timeout.ms", "300000")
            .set("linger.ms", "5")
            // records wait here until delivered: bound the client's memory
            .set("queue.buffering.max.kbytes", "65536");
        for (k, v) in &config.client_options {
            cc.set(k, v);
        }
        let transaction_timeout = Duration::from_millis(
            cc.get("transaction.timeout.ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(300_000),
        );
        cc.set("transactional.id", &config.transactional_id)
            .set("enable.idempotence", "true");
        let context = Context::default();
        let producer: ThreadedProducer<Context> = cc.create_with_context(context.clone())?;
        let producer = Arc::new(producer);
        let setup = async {
            let t0 = std::time::Instant::now();
            let partitions = ensure_progress_topic(&config, &context).await?;
            tracing::debug!(took = ?t0.elapsed(), topic = %config.progress_topic, partitions, "progress topic there");
            let p = producer.clone();
            let t = config.timeout;
            let t0 = std::time::Instant::now();
            let id = config.transactional_id.clone();
            blocking(move || p.init_transactions(t))
                .await
                .map_err(|e| match e {
                    ProducerError::Kafka(source)
                        if source.rdkafka_error_code()
                            == Some(rdkafka::types::RDKafkaErrorCode::ConcurrentTransactions) =>
                    {
                        ProducerError::EarlierTransactionOpen {
                            transactional_id: id,
                            source,
                        }
                    }
                    e => e,
                })?;
            tracing::debug!(took = ?t0.elapsed(), id = %config.transactional_id, "transactions initialised");
            Ok::<i32, ProducerError>(partitions)
        };
        // a refusal ends the wait at once; any other failure says what the
        // last connection attempt met
        let partitions = tokio::select! {
            r = setup => r.map_err(|e| explain(e, &context))?,
            reason = context.refusal() => return Err(ProducerError::Refused { reason }),
        };
        Ok(KafkaProducer {
            producer,
            context,
            progress_partition: progress::partition(&config.progress_key, partitions),
            config,
            open: false,
            opened_at: None,
            transaction_timeout,
            queue_full_waits: 0,
            topics: Vec::new(),
        })
    }

    /// The last committed position of this stream in the progress topic.
    pub async fn committed(&self) -> Result<Option<Lsn>, ProducerError> {
        Ok(self.committed_progress().await?.map(|p| p.end_lsn))
    }

    /// The last committed progress record of this stream, whole (with the
    /// cursor of a snapshot in progress).
    pub async fn committed_progress(&self) -> Result<Option<Progress>, ProducerError> {
        let cfg = self.config.clone();
        let context = self.context.clone();
        let t0 = std::time::Instant::now();
        let partition = self.progress_partition;
        let r = tokio::task::spawn_blocking(move || read_progress(&cfg, &context, partition))
            .await
            .map_err(|_| ProducerError::Join)?
            .map_err(|e| explain(e, &self.context));
        tracing::debug!(took = ?t0.elapsed(), position = ?r.as_ref().ok(), "progress read");
        r
    }

    /// Adds a record to the open Kafka transaction (opening one if needed).
    pub async fn send(&mut self, r: &Record) -> Result<(), ProducerError> {
        self.send_to(r, None).await
    }

    /// [`KafkaProducer::send`] to `partition`, if given, instead of the
    /// partitioner's choice.
    async fn send_to(&mut self, r: &Record, partition: Option<i32>) -> Result<(), ProducerError> {
        if !self.open {
            let p = self.producer.clone();
            blocking(move || p.begin_transaction()).await?;
            self.open = true;
            self.opened_at = Some(std::time::Instant::now());
            self.topics.clear();
        }
        // records come in runs of one topic: a scan only when it changes
        if self.topics.last() != Some(&r.topic) && !self.topics.contains(&r.topic) {
            self.topics.push(r.topic.clone());
        }
        let mut rec = BaseRecord::<Vec<u8>, Vec<u8>>::to(&r.topic);
        if let Some(k) = &r.key {
            rec = rec.key(k);
        }
        if let Some(v) = &r.value {
            rec = rec.payload(v);
        }
        if let Some(p) = partition {
            rec = rec.partition(p);
        }
        let mut rec = rec;
        loop {
            match self.producer.send(rec) {
                Ok(()) => return Ok(()),
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    rec = back;
                    self.queue_full_waits += 1;
                    // the background thread delivers meanwhile
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }

    /// How long the open Kafka transaction has been open (`None`: none is).
    pub fn open_for(&self) -> Option<Duration> {
        self.opened_at.filter(|_| self.open).map(|t| t.elapsed())
    }

    /// `transaction.timeout.ms`: a Kafka transaction open longer is aborted
    /// by the broker's transaction coordinator and can never commit.
    pub fn transaction_timeout(&self) -> Duration {
        self.transaction_timeout
    }

    /// Aborts the open Kafka transaction, if any: none of its records
    /// reach a read_committed consumer.
    pub async fn abort(&mut self) -> Result<(), ProducerError> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let p = self.producer.clone();
        let t = self.config.timeout;
        blocking(move || p.abort_transaction(t)).await
    }

    /// Writes the progress record for `end_lsn` and commits the open Kafka
    /// transaction; after this returns, the slot may be acknowledged up to
    /// `end_lsn`.
    pub async fn commit(&mut self, end_lsn: Lsn) -> Result<(), ProducerError> {
        self.start_commit(end_lsn).await?.await
    }

    /// Writes the progress record and starts the commit, which runs on
    /// tokio's blocking pool; the returned future completes with it (and
    /// after a failed commit, an abort). Until it completes nothing may be
    /// sent: the caller holds what comes meanwhile. This lets a caller read
    /// on while Kafka commits.
    pub async fn start_commit(
        &mut self,
        end_lsn: Lsn,
    ) -> Result<
        impl std::future::Future<Output = Result<(), ProducerError>> + Send + 'static,
        ProducerError,
    > {
        self.start_commit_with(&Progress::at(end_lsn)).await
    }

    /// [`KafkaProducer::start_commit`] with a whole progress record (a
    /// snapshot's cursor in it).
    pub async fn start_commit_with(
        &mut self,
        p: &Progress,
    ) -> Result<
        impl std::future::Future<Output = Result<(), ProducerError>> + Send + 'static,
        ProducerError,
    > {
        let end_lsn = p.end_lsn;
        let progress = Record {
            topic: self.config.progress_topic.clone(),
            key: Some(self.config.progress_key.clone().into_bytes()),
            value: Some(progress::value_of(p)),
        };
        self.send_to(&progress, Some(self.progress_partition))
            .await?;
        self.open = false;
        let p = self.producer.clone();
        let t = self.config.timeout;
        let waits = self.queue_full_waits;
        let t0 = std::time::Instant::now();
        let context = self.context.clone();
        let topics = std::mem::take(&mut self.topics);
        let handle = tokio::task::spawn_blocking(move || {
            let r = p.commit_transaction(t);
            if let Err(e) = r {
                let _ = p.abort_transaction(t);
                if let Some(u) = unusable_topic(&p, &context, &topics, t) {
                    return Err(u);
                }
                return Err(ProducerError::Kafka(e));
            }
            Ok(())
        });
        Ok(async move {
            let r = handle.await.map_err(|_| ProducerError::Join)?;
            tracing::debug!(%end_lsn, took = ?t0.elapsed(), queue_full_waits = waits, "Kafka commit");
            r
        })
    }
}

/// After a failed commit: a topic of the transaction that the cluster's
/// metadata says it does not have, or does not let pgwal write, twice a
/// second apart (a broker that has just started may not know a topic for
/// a moment). With a delivery that failed for that reason, if there was
/// one (librdkafka fails records for an unknown topic only after
/// `topic.metadata.propagation.max.ms`, so a commit can time out first).
fn unusable_topic(
    p: &ThreadedProducer<Context>,
    context: &Context,
    topics: &[String],
    t: Duration,
) -> Option<ProducerError> {
    let delivery = context.take_undeliverable();
    // a cluster in trouble is not kept waiting for on top of the commit
    let t = t.min(Duration::from_secs(5));
    let refused = |topic: &str| -> Option<rdkafka::types::RDKafkaErrorCode> {
        let md = p.client().fetch_metadata(Some(topic), t).ok()?;
        let code = rdkafka::types::RDKafkaErrorCode::from(md.topics().first()?.error()?);
        crate::client::topic_refused(Some(code)).then_some(code)
    };
    let topic = topics.iter().find(|topic| refused(topic).is_some())?;
    std::thread::sleep(Duration::from_secs(1));
    let code = refused(topic)?;
    let reason = match delivery {
        Some((d, why)) if d == *topic => format!("{why}; the cluster's metadata: {code}"),
        _ => format!("the cluster's metadata: {code}"),
    };
    Some(ProducerError::TopicUnusable {
        topic: topic.clone(),
        reason,
    })
}

/// A Kafka error with the brokers' last connection error, when there was
/// one: a timeout alone does not say that the client never got through.
fn explain(e: ProducerError, context: &Context) -> ProducerError {
    match (e, context.last_connection_error()) {
        (ProducerError::Kafka(source), Some(cause)) => ProducerError::Unreachable { source, cause },
        (e, _) => e,
    }
}

/// Creates the progress topic, compacted and with [`progress::PARTITIONS`]
/// partitions, unless it exists; returns its partition count. Auto-creation
/// would make it uncompacted. A stream's records all go to one partition
/// ([`progress::partition`]), read back in order.
///
/// It holds the stream's exactly-once state, so it is made to outlive a
/// broker: three replicas where the cluster has three brokers or more
/// (fewer only where it has fewer), and `min.insync.replicas=2`, so that a
/// committed position is on two brokers before the slot is acknowledged.
/// Small segments bound what a start reads of the uncompacted tail.
async fn ensure_progress_topic(
    cfg: &ProducerConfig,
    context: &Context,
) -> Result<i32, ProducerError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::types::RDKafkaErrorCode;
    let admin: Arc<AdminClient<Context>> =
        Arc::new(client_config(cfg).create_with_context(context.clone())?);
    let brokers = {
        let admin = admin.clone();
        let t = cfg.timeout;
        blocking(move || Ok(admin.inner().fetch_metadata(None, t)?.brokers().len())).await?
    };
    let replicas = brokers.clamp(1, 3);
    let mut topic = NewTopic::new(
        &cfg.progress_topic,
        progress::PARTITIONS,
        TopicReplication::Fixed(replicas as i32),
    )
    .set("cleanup.policy", "compact")
    .set("segment.bytes", "16777216");
    if replicas >= 3 {
        topic = topic.set("min.insync.replicas", "2");
    }
    let results = admin
        .create_topics(
            [&topic],
            // request_timeout: an unreachable broker must not hold the
            // call for librdkafka's default minute
            &AdminOptions::new()
                .operation_timeout(Some(cfg.timeout))
                .request_timeout(Some(cfg.timeout)),
        )
        .await?;
    for r in results {
        match r {
            Ok(_) => {
                if replicas < 3 {
                    tracing::warn!(topic = %cfg.progress_topic, replicas, "progress topic created with fewer than 3 replicas: the cluster has {brokers} broker(s), and losing one may lose the stream's exactly-once position");
                } else {
                    tracing::info!(topic = %cfg.progress_topic, replicas, "progress topic created (min.insync.replicas=2)");
                }
            }
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code).into()),
        }
    }
    // its partition count, as the brokers know it (a topic just created
    // may not be in every broker's metadata yet)
    let deadline = std::time::Instant::now() + cfg.timeout;
    loop {
        let admin = admin.clone();
        let (topic, t) = (cfg.progress_topic.clone(), cfg.timeout);
        let partitions = blocking(move || {
            let md = admin.inner().fetch_metadata(Some(&topic), t)?;
            Ok(md
                .topics()
                .iter()
                .find(|m| m.name() == topic && m.error().is_none())
                .map_or(0, |m| m.partitions().len() as i32))
        })
        .await?;
        if partitions > 0 {
            return Ok(partitions);
        }
        if std::time::Instant::now() > deadline {
            return Err(ProducerError::ProgressEnd {
                topic: cfg.progress_topic.clone(),
                source: KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The brokers and the user's client options, for the helper clients.
fn client_config(cfg: &ProducerConfig) -> ClientConfig {
    let mut cc = ClientConfig::new();
    liveness(&mut cc, cfg.timeout);
    cc.set("bootstrap.servers", &cfg.brokers);
    for (k, v) in &cfg.client_options {
        cc.set(k, v);
    }
    cc
}

/// Reads the stream's partition of the progress topic from the start with
/// read_committed and returns this stream's last position.
///
/// The read must reach the high watermark that a read_uncommitted reader
/// sees at the start, not just the last stable offset: a transaction of
/// another stream still open there would hold the read_committed end below
/// records this stream committed after it began, and the position read
/// would be stale. Such a transaction ends within its batch time (this
/// stream's own earlier one was fenced by `init_transactions`), so the
/// read waits for it, up to the timeout, and never guesses.
fn read_progress(
    cfg: &ProducerConfig,
    context: &Context,
    partition: i32,
) -> Result<Option<Progress>, ProducerError> {
    let group = format!("{}-progress-reader", cfg.transactional_id);
    let watermarks: BaseConsumer<Context> = client_config(cfg)
        .set("isolation.level", "read_uncommitted")
        .set("group.id", &group)
        .create_with_context(context.clone())?;
    let end = high_watermark(
        |t| watermarks.fetch_watermarks(&cfg.progress_topic, partition, t),
        &cfg.progress_topic,
        cfg.timeout,
    )?;
    if end <= 0 {
        return Ok(None);
    }
    let consumer: BaseConsumer<Context> = client_config(cfg)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("group.id", &group)
        .create_with_context(context.clone())?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&cfg.progress_topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut last = None;
    let deadline = std::time::Instant::now() + cfg.timeout;
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            // the end of what read_committed may see now
            Some(Err(KafkaError::PartitionEOF(_))) => {
                let at = consumer
                    .position()?
                    .find_partition(&cfg.progress_topic, partition)
                    .and_then(|p| p.offset().to_raw())
                    .unwrap_or(0);
                if at >= end {
                    return Ok(last);
                }
            }
            // a broker of a cluster down or a leader moving: the client
            // goes on with the others, within the deadline
            Some(Err(e)) if transient(&e) => {
                tracing::info!(topic = %cfg.progress_topic, error = %e, "reading the progress topic; going on");
            }
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) if m.key() == Some(cfg.progress_key.as_bytes()) => {
                let v = m.payload().unwrap_or_default();
                last = Some(progress::parse_progress(v).ok_or_else(|| {
                    ProducerError::BadProgress {
                        topic: cfg.progress_topic.clone(),
                        key: cfg.progress_key.clone(),
                        offset: m.offset(),
                    }
                })?);
            }
            // other streams' positions
            Some(Ok(_)) => {}
        }
        if std::time::Instant::now() > deadline {
            let at = consumer
                .position()?
                .find_partition(&cfg.progress_topic, partition)
                .and_then(|p| p.offset().to_raw())
                .unwrap_or(0);
            return Err(ProducerError::ProgressTimeout {
                topic: cfg.progress_topic.clone(),
                offset: at,
                end,
            });
        }
    }
}

/// Whether a consumer's error is one the client recovers from by itself
/// (a connection lost, a leader moving).
fn transient(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e,
        KafkaError::MessageConsumption(
            C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::NotLeaderForPartition
                | C::LeaderNotAvailable
                | C::RequestTimedOut
                | C::OperationTimedOut
                | C::NetworkException
                | C::FencedLeaderEpoch
                | C::UnknownLeaderEpoch
        )
    )
}

/// The end (high watermark) of the progress partition, asked with `fetch`
/// until it answers or `timeout` passed.
///
/// The topic exists ([`ensure_progress_topic`] ran before), so a failed
/// query never means "Kafka holds nothing of this stream": after a broker
/// failure the partition's leader may be moving, or the broker asked may
/// not know it yet. Taken as an empty topic, such an error would start the
/// stream over from the slot and write again what Kafka holds, and with an
/// initial snapshot, snapshot every table again. So errors are asked again
/// and, at the deadline, returned: the session fails and starts over.
fn high_watermark(
    mut fetch: impl FnMut(Duration) -> Result<(i64, i64), KafkaError>,
    topic: &str,
    timeout: Duration,
) -> Result<i64, ProducerError> {
    let deadline = std::time::Instant::now() + timeout;
    let pause = Duration::from_millis(200);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match fetch(left.max(pause)) {
            Ok((_, end)) => return Ok(end),
            Err(e) if std::time::Instant::now() + pause < deadline => {
                tracing::info!(%topic, error = %e, "the progress topic's end is not known yet; asking again");
                std::thread::sleep(pause);
            }
            Err(source) => {
                return Err(ProducerError::ProgressEnd {
                    topic: topic.to_owned(),
                    source,
                })
            }
        }
    }
}

/// Defaults that notice a broker gone silent (its host or network vanished
/// without a reset), before the user's options, which may override them:
/// TCP keepalives, and requests that time out (then librdkafka drops the
/// connection and connects again) after the call timeout rather than
/// librdkafka's 60 s.
fn liveness(cc: &mut ClientConfig, timeout: Duration) {
    let ms = timeout.as_millis().clamp(10, 300_000).to_string();
    cc.set("socket.keepalive.enable", "true")
        .set("socket.timeout.ms", &ms)
        .set(
            "socket.connection.setup.timeout.ms",
            timeout.as_millis().clamp(1000, 300_000).to_string(),
        );
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode;

    #[test]
    fn a_progress_read_that_got_nowhere_says_so() {
        let e = ProducerError::ProgressTimeout {
            topic: "pgwal.progress".into(),
            offset: -1001,
            end: 1,
        };
        assert_eq!(
            e.to_string(),
            "progress topic pgwal.progress: nothing read up to its end at offset 1 within the timeout"
        );
        let e = ProducerError::ProgressTimeout {
            topic: "pgwal.progress".into(),
            offset: 5,
            end: 9,
        };
        assert_eq!(
            e.to_string(),
            "progress topic pgwal.progress: read to offset 5 of 9 within the timeout"
        );
    }

    #[test]
    fn a_failed_end_query_is_asked_again_and_never_read_as_empty() {
        // the leader moved: two failures, then the answer
        let mut calls = 0;
        let end = high_watermark(
            |_| {
                calls += 1;
                if calls < 3 {
                    Err(KafkaError::MetadataFetch(
                        RDKafkaErrorCode::NotLeaderForPartition,
                    ))
                } else {
                    Ok((0, 42))
                }
            },
            "p",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!((end, calls), (42, 3));
        assert!(transient(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
        assert!(!transient(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )));
        // it never answers: an error the session retries, not "nothing"
        for code in [
            RDKafkaErrorCode::OperationTimedOut,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::LeaderNotAvailable,
        ] {
            let e = high_watermark(
                |_| Err(KafkaError::MetadataFetch(code)),
                "p",
                Duration::from_millis(500),
            )
            .unwrap_err();
            assert!(
                matches!(&e, ProducerError::ProgressEnd { topic, source: KafkaError::MetadataFetch(c) } if topic == "p" && *c == code),
                "{e:?}"
            );
        }
    }
}
