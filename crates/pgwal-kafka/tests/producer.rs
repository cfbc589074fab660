//! The transactional producer against a real broker (tools/kafka-broker).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use pgwal_kafka::format::Record;
use pgwal_kafka::producer::{KafkaProducer, ProducerConfig};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;

struct Broker {
    dir: PathBuf,
    addr: String,
}

fn tool() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/kafka-broker")
}

impl Broker {
    fn start() -> Broker {
        let dir = std::env::temp_dir().join(format!("pgwal-kafka-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // a free pair below the ephemeral range (the controller takes port + 1)
        let port = (15_000..30_000)
            .step_by(2)
            .map(|p| p + (std::process::id() % 1000) as u16 * 2 % 15_000)
            .find(|p| {
                std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()
                    && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok()
            })
            .unwrap();
        let out = Command::new(tool())
            .arg("start")
            .arg(&dir)
            .arg(port.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let addr = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        Broker { dir, addr }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = Command::new(tool()).arg("kill").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_committed(addr: &str, topic: &str) -> Vec<String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr)
        .set("group.id", format!("t-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    out
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
    if Command::new("java").arg("-version").output().is_err() {
        eprintln!("NOTICE: no java; the Kafka broker test is skipped");
        return;
    }
    let b = Broker::start();
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
