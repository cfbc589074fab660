//! `--metrics` with `--sink kafka`: the sink's counters and positions
//! ([`SinkLive`]), read at each scrape.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use pgwal_kafka::SinkLive;

/// Reads a [`SinkLive`] at each scrape.
#[derive(Debug)]
struct SinkCollector(Arc<SinkLive>);

/// One metric without labels: a counter or a gauge of any number type.
fn metric(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    m: impl EncodeMetric,
) -> std::fmt::Result {
    m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)
}

fn counter<N>(e: &mut DescriptorEncoder, name: &str, help: &str, v: N) -> std::fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    metric(e, name, help, ConstCounter::new(v))
}

fn gauge<N>(e: &mut DescriptorEncoder, name: &str, help: &str, v: N) -> std::fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    metric(e, name, help, ConstGauge::new(v))
}

impl Collector for SinkCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let l = &self.0;
        gauge(
            &mut e,
            "pgwal_kafka_streaming",
            "1 while the sink streams (producer connected, stream started), else 0",
            l.streaming() as i64,
        )?;
        counter(
            &mut e,
            "pgwal_kafka_transactions",
            "PostgreSQL transactions written to Kafka",
            l.transactions(),
        )?;
        {
            let c = ConstCounter::new(0u64);
            let mut family = e.encode_descriptor(
                "pgwal_kafka_records",
                "Records written, by topic (progress records not counted)",
                None,
                c.metric_type(),
            )?;
            for (topic, n) in l.records_by_topic() {
                let labels = [("topic", topic)];
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        counter(
            &mut e,
            "pgwal_kafka_record_bytes",
            "Key and value bytes of the records written",
            l.bytes(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_commits",
            "Kafka transactions committed",
            l.kafka_commits(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_commit_seconds",
            "Time from each Kafka commit's start to the broker's answer, summed",
            l.commit_time().as_secs_f64(),
        )?;
        gauge(
            &mut e,
            "pgwal_kafka_last_commit_seconds",
            "The latest Kafka commit's time",
            l.last_commit_time().as_secs_f64(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_restarts",
            "Starts over from Kafka's progress after a Kafka error",
            l.kafka_restarts(),
        )?;
        counter(
            &mut e,
            "pgwal_reconnects",
            "Replication sessions started again after a lost connection",
            l.reconnects(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_bad_records_skipped",
            "Changes left out (--kafka-bad-records skip)",
            l.bad_skipped(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_bad_records_dead_lettered",
            "Changes written to the dead-letter topic instead",
            l.dead_lettered(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_snapshot_rows",
            "Rows snapshots wrote to Kafka (read records)",
            l.snapshot_rows(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_snapshot_chunks",
            "Snapshot chunks read",
            l.snapshot_chunks(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_snapshot_chunks_read_again",
            "Snapshot chunks thrown away and read again (a change in their window they could not be reconciled with)",
            l.snapshot_rereads(),
        )?;
        counter(
            &mut e,
            "pgwal_kafka_snapshot_tables_left_out",
            "Tables a snapshot left out: no key usable for paging, or a permanent error under --kafka-bad-records skip or dead-letter",
            l.snapshot_tables_left_out(),
        )?;
        gauge(
            &mut e,
            "pgwal_kafka_snapshot_tables_queued",
            "Tables the running snapshot still has to read, the current one included (0: no snapshot runs)",
            l.snapshot_tables_queued() as i64,
        )?;
        gauge(
            &mut e,
            "pgwal_kafka_position_lsn",
            "Where Kafka's committed progress stands (as an integer)",
            l.kafka_position().0 as i64,
        )?;
        gauge(
            &mut e,
            "pgwal_confirmed_lsn",
            "Position last confirmed to the server's slot (as an integer)",
            l.confirmed().0 as i64,
        )?;
        gauge(
            &mut e,
            "pgwal_server_wal_end_lsn",
            "The server's WAL end from its latest message (as an integer)",
            l.server_wal_end().0 as i64,
        )?;
        gauge(
            &mut e,
            "pgwal_lag_bytes",
            "Bytes of server WAL beyond Kafka's progress",
            l.lag_bytes() as i64,
        )?;
        gauge(
            &mut e,
            "pgwal_lag_seconds",
            "How far Kafka is behind the server in time, when scraped: the latest commit's lag, the age of the oldest transaction read but not in Kafka, and while not streaming the time since it stopped",
            l.lag().as_secs_f64(),
        )?;
        Ok(())
    }
}

/// A registry with the sink's metrics and the slot's room (`slot`).
pub(crate) fn registry(live: Arc<SinkLive>, slot: &crate::metrics::StreamMetrics) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(SinkCollector(live)));
    slot.register_slot_room(&mut r);
    r
}
