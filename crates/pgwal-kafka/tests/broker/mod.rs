//! A real Kafka broker for tests (tools/kafka-broker), and a read_committed
//! reader of whole topics.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

/// A single-node broker in a directory of its own, killed when dropped.
pub struct Broker {
    pub dir: PathBuf,
    pub addr: String,
}

fn tool() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/kafka-broker")
}

/// Whether a JDK is there to run the broker.
pub fn have_java() -> bool {
    Command::new("java").arg("-version").output().is_ok()
}

fn run(args: &[&str]) -> String {
    let out = Command::new(tool()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "kafka-broker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

impl Broker {
    pub fn start(label: &str) -> Broker {
        let dir = std::env::temp_dir().join(format!("pgwal-kafka-{label}-{}", std::process::id()));
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
        let addr = run(&["start", dir.to_str().unwrap(), &port.to_string()]);
        Broker { dir, addr }
    }

    /// SIGKILL, then start again on the same data and port.
    pub fn crash_and_restart(&self) {
        run(&["kill", self.dir.to_str().unwrap()]);
        run(&["restart", self.dir.to_str().unwrap()]);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = Command::new(tool()).arg("kill").arg(&self.dir).status();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.join("broker.log")) {
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- broker log (tail) ---");
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One record as a consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub topic: String,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
}

/// Every record of `topics` (partition 0; the broker makes one per topic)
/// that a consumer with `isolation` (read_committed, read_uncommitted)
/// sees, up to the end; a topic that does not exist is empty.
pub fn read_all(addr: &str, topics: &[&str], isolation: &str) -> Vec<Consumed> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr)
        .set("group.id", format!("reader-{}", std::process::id()))
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for t in topics {
        match c.fetch_watermarks(t, 0, Duration::from_secs(10)) {
            Ok((_, high)) if high > 0 => {
                tpl.add_partition_offset(t, 0, Offset::Beginning).unwrap();
                ends.push((t.to_string(), high));
            }
            _ => {}
        }
    }
    if ends.is_empty() {
        return Vec::new();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pos = c.position().unwrap();
        // read_committed stops at the last stable offset; transaction
        // markers take offsets that no record shows
        let done = ends.iter().all(|(t, high)| {
            pos.find_partition(t, 0)
                .and_then(|p| p.offset().to_raw())
                .is_some_and(|o| o >= *high)
        });
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reading {topics:?} took over 120 s"
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(m) => {
                let m = m.unwrap();
                out.push(Consumed {
                    topic: m.topic().to_owned(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                });
            }
        }
    }
    out
}
