//! The transactional producer against a real broker (tools/kafka-broker).

mod broker;

use broker::Broker;
use pgwal_kafka::format::Record;
use pgwal_kafka::producer::{KafkaProducer, ProducerConfig};

fn read_committed(addr: &str, topic: &str) -> Vec<String> {
    broker::read_all(addr, &[topic], "read_committed")
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r.value.unwrap_or_default()).into_owned())
        .collect()
}

fn rec(topic: &str, v: &str) -> Record {
    Record {
        topic: topic.into(),
        key: Some(b"k".to_vec()),
        value: Some(v.as_bytes().to_vec()),
    }
}

/// A Kafka transaction holds its records and the progress record; a
/// restarted producer reads the progress back and fences the old one,
/// whose open transaction never becomes visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_progress_with_records_and_fences_a_zombie() {
    if !broker::have_java() {
        eprintln!("NOTICE: no java; the Kafka broker test is skipped");
        return;
    }
    let b = Broker::start("producer");
    let cfg = ProducerConfig::new(b.addr.clone(), "pgwal-test", "pgwal_progress", "sys/slot");
    let mut p = KafkaProducer::connect(cfg.clone()).await.unwrap();
    assert_eq!(p.committed().await.unwrap(), None);
    for v in ["a", "b", "c"] {
        p.send(&rec("data", v)).await.unwrap();
    }
    p.commit("0/100".parse().unwrap()).await.unwrap();
    assert_eq!(p.committed().await.unwrap(), Some("0/100".parse().unwrap()));
    // an open transaction of a producer that then "crashes"
    p.send(&rec("data", "zombie")).await.unwrap();
    let p2 = KafkaProducer::connect(cfg.clone()).await.unwrap();
    assert_eq!(
        p2.committed().await.unwrap(),
        Some("0/100".parse().unwrap())
    );
    assert!(
        p.commit("0/200".parse().unwrap()).await.is_err(),
        "the zombie committed"
    );
    assert_eq!(read_committed(&b.addr, "data"), ["a", "b", "c"]);
}
