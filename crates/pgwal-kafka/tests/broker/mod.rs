//! A real Kafka broker for tests (tools/kafka-broker), and a read_committed
//! reader of whole topics.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

/// A single-node broker in a directory of its own, killed when dropped.
pub struct Broker {
    pub dir: PathBuf,
    /// The plaintext listener (the tests' readers use it).
    pub addr: String,
    /// The secure listeners, when started with [`Broker::start_secure`].
    pub secure: Option<Secure>,
}

/// What `tools/kafka-broker start --secure` made (its DIR/secure.env).
#[derive(Debug, Clone)]
pub struct Secure {
    /// TLS, client certificate required.
    pub ssl: String,
    /// SASL over TLS.
    pub sasl_ssl: String,
    pub ca: String,
    /// A CA that signed neither the broker's nor the client's certificate.
    pub other_ca: String,
    pub client_cert: String,
    pub client_key: String,
    pub user: String,
    pub password: String,
}

impl Secure {
    fn read(dir: &std::path::Path) -> Secure {
        let env = std::fs::read_to_string(dir.join("secure.env")).unwrap();
        let get = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("secure.env lacks {k}"))
                .to_owned()
        };
        Secure {
            ssl: get("ssl"),
            sasl_ssl: get("sasl_ssl"),
            ca: get("ca"),
            other_ca: get("other_ca"),
            client_cert: get("client_cert"),
            client_key: get("client_key"),
            user: get("user"),
            password: get("password"),
        }
    }

    /// librdkafka settings for SASL_SSL with `mechanism` and the user's
    /// password (OAUTHBEARER: librdkafka's unsecured JWT for the user).
    pub fn sasl_options(&self, mechanism: &str) -> Vec<(String, String)> {
        let mut o = vec![
            ("security.protocol", "SASL_SSL".to_owned()),
            ("ssl.ca.location", self.ca.clone()),
            ("sasl.mechanism", mechanism.to_owned()),
        ];
        if mechanism == "OAUTHBEARER" {
            o.push(("enable.sasl.oauthbearer.unsecure.jwt", "true".to_owned()));
            o.push((
                "sasl.oauthbearer.config",
                format!("principal={}", self.user),
            ));
        } else {
            o.push(("sasl.username", self.user.clone()));
            o.push(("sasl.password", self.password.clone()));
        }
        o.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    /// librdkafka settings for SSL with the client certificate.
    pub fn ssl_options(&self) -> Vec<(String, String)> {
        [
            ("security.protocol", "SSL".to_owned()),
            ("ssl.ca.location", self.ca.clone()),
            ("ssl.certificate.location", self.client_cert.clone()),
            ("ssl.key.location", self.client_key.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// `pgwal stream` arguments for the brokers `addr` with librdkafka
/// `options`.
pub fn sink_args(addr: &str, options: &[(String, String)]) -> Vec<String> {
    let mut a = vec!["--kafka-brokers".to_owned(), addr.to_owned()];
    for (k, v) in options {
        a.push("--kafka-option".to_owned());
        a.push(format!("{k}={v}"));
    }
    a
}

fn tool() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/kafka-broker")
}

/// Whether a JDK is there to run the broker.
pub fn have_java() -> bool {
    Command::new("java").arg("-version").output().is_ok()
}

/// The struct schema of the rows (`before`, `after`) in an envelope
/// written with its Kafka Connect schema (`{"schema", "payload"}`).
pub fn row_schema(value: &serde_json::Value) -> &serde_json::Value {
    field_schema(&value["schema"], "after").expect("an envelope schema has an after field")
}

/// The schema of field `name` of a struct schema.
pub fn field_schema<'a>(
    schema: &'a serde_json::Value,
    name: &str,
) -> Option<&'a serde_json::Value> {
    schema["fields"]
        .as_array()
        .expect("a struct schema has fields")
        .iter()
        .find(|f| f["field"] == name)
}

/// The field names of a struct schema.
pub fn field_names(schema: &serde_json::Value) -> std::collections::BTreeSet<&str> {
    schema["fields"]
        .as_array()
        .expect("a struct schema has fields")
        .iter()
        .map(|f| f["field"].as_str().expect("a field has a name"))
        .collect()
}

/// Reads each document (a key or value written with its Kafka Connect
/// schema) with Kafka Connect's own JsonConverter and writes it back
/// (tools/kafka/ConnectJsonCheck.java): `Ok` with the count checked, or the
/// checker's account of the first document that failed.
pub fn connect_json_check<'a>(docs: impl IntoIterator<Item = &'a [u8]>) -> Result<u64, String> {
    use std::io::Write;
    let checker =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/kafka/ConnectJsonCheck.java");
    let mut child = Command::new(tool())
        .arg("tool")
        .arg(&checker)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = Vec::new();
    for d in docs {
        assert!(!d.contains(&b'\n'), "a record spans lines");
        input.extend_from_slice(d);
        input.push(b'\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    }
    stdout
        .trim()
        .strip_prefix("checked ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected output: {stdout}"))
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
    /// A broker with a plaintext listener.
    pub fn start(label: &str) -> Broker {
        Broker::start_with(label, false, None, &[])
    }

    /// A broker with a plaintext listener and these `key=value` lines in
    /// its server.properties.
    pub fn start_set(label: &str, settings: &[&str]) -> Broker {
        Broker::start_with(label, false, None, settings)
    }

    /// A broker with plaintext, SSL and SASL_SSL listeners.
    pub fn start_secure(label: &str) -> Broker {
        Broker::start_with(label, true, None, &[])
    }

    /// A broker whose plaintext listener is on `host`, a local address
    /// (the controller stays on 127.0.0.1).
    pub fn start_on(label: &str, host: &str) -> Broker {
        Broker::start_with(label, false, Some(host), &[])
    }

    fn start_with(label: &str, secure: bool, host: Option<&str>, settings: &[&str]) -> Broker {
        let dir = std::env::temp_dir().join(format!("pgwal-kafka-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // four free ports below the ephemeral range (the controller takes
        // port + 1, the secure listeners port + 2 and + 3)
        let port = (15_000..30_000)
            .step_by(4)
            .map(|p| p + (std::process::id() % 1000) as u16 * 4 % 15_000)
            .find(|p| (0..4).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()))
            .unwrap();
        let mut args = vec!["start", dir.to_str().unwrap()];
        let port = port.to_string();
        args.push(&port);
        if secure {
            args.push("--secure");
        }
        if let Some(h) = host {
            args.extend(["--host", h]);
        }
        for s in settings {
            args.extend(["--set", s]);
        }
        let addr = run(&args);
        let secure = secure.then(|| Secure::read(&dir));
        Broker { dir, addr, secure }
    }

    /// Creates `topic` with Kafka's topic tool.
    pub fn create_topic(&self, topic: &str) {
        run(&[
            "tool",
            "org.apache.kafka.tools.TopicCommand",
            "--bootstrap-server",
            &self.addr,
            "--create",
            "--topic",
            topic,
        ]);
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

/// A cluster of three brokers, each also a KRaft controller
/// (`tools/kafka-broker cluster`): topics with three replicas and
/// `min.insync.replicas=2`. Every node is killed when dropped.
pub struct KafkaCluster {
    pub dir: PathBuf,
    /// The bootstrap list of the three plaintext listeners.
    pub addr: String,
}

impl KafkaCluster {
    /// Three nodes on six free ports below the ephemeral range.
    pub fn start(label: &str) -> KafkaCluster {
        // on tmpfs where there is one: the controllers fsync their metadata
        // log at every write, and with the data on disk beside the lab's
        // tests one controller event took 12 s. The faults here are of
        // processes, which lose nothing in the page cache either way.
        let shm = std::path::Path::new("/dev/shm");
        let base =
            if shm.is_dir() && std::fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly()) {
                shm.to_path_buf()
            } else {
                std::env::temp_dir()
            };
        let dir = base.join(format!("pgwal-kafka-three-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let port = run(&["free-ports", "6"]);
        let addr = run(&["cluster", dir.to_str().unwrap(), &port]);
        KafkaCluster { dir, addr }
    }

    /// The directory of node `n` (1, 2 or 3; its node id).
    pub fn node(&self, n: i32) -> PathBuf {
        self.dir.join(n.to_string())
    }

    /// The plaintext listener of node `n`.
    pub fn node_addr(&self, n: i32) -> String {
        let port = std::fs::read_to_string(self.node(n).join("port")).unwrap();
        format!("127.0.0.1:{}", port.trim())
    }

    /// Whether node `n`'s process runs (it may be paused).
    pub fn is_up(&self, n: i32) -> bool {
        self.node(n).join("broker.pid").exists()
    }

    /// SIGKILL of node `n`.
    pub fn kill(&self, n: i32) {
        run(&["kill", self.node(n).to_str().unwrap()]);
    }

    /// SIGTERM of node `n` (a controlled shutdown: its leaderships move first).
    pub fn stop(&self, n: i32) {
        run(&["stop", self.node(n).to_str().unwrap()]);
    }

    /// Starts node `n` again on its data; returns once it accepts clients.
    pub fn restart(&self, n: i32) {
        run(&["restart", self.node(n).to_str().unwrap()]);
    }

    /// SIGSTOP of node `n`: silent, its connections open.
    pub fn pause(&self, n: i32) {
        run(&["pause", self.node(n).to_str().unwrap()]);
    }

    /// SIGCONT of node `n`.
    pub fn resume(&self, n: i32) {
        run(&["resume", self.node(n).to_str().unwrap()]);
    }

    /// The node leading `topic`'s partition 0 and its in-sync replicas, as
    /// the cluster's metadata says (asked of the running nodes); `None`
    /// while it has no leader.
    pub fn leader(&self, topic: &str) -> Option<(i32, Vec<i32>)> {
        self.partition_leader(topic, 0)
    }

    /// [`KafkaCluster::leader`] of `topic`'s `partition`.
    pub fn partition_leader(&self, topic: &str, partition: i32) -> Option<(i32, Vec<i32>)> {
        let up: Vec<String> = (1..=3)
            .filter(|n| self.is_up(*n))
            .map(|n| self.node_addr(n))
            .collect();
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", up.join(","))
            .create()
            .unwrap();
        let md = c
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .ok()?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        let p = t.partitions().iter().find(|p| p.id() == partition)?;
        (p.leader() > 0).then(|| (p.leader(), p.isr().to_vec()))
    }

    /// How many partitions `topic` has (0 while the metadata does not
    /// show it).
    pub fn partitions(&self, topic: &str) -> i32 {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.addr)
            .create()
            .unwrap();
        c.fetch_metadata(Some(topic), Duration::from_secs(10))
            .ok()
            .and_then(|md| {
                md.topics()
                    .iter()
                    .find(|t| t.name() == topic && t.error().is_none())
                    .map(|t| t.partitions().len() as i32)
            })
            .unwrap_or(0)
    }

    /// What Kafka's tool `class` prints (stdout) when run with `args`
    /// against a running node; `None` when no node runs.
    pub fn ask(&self, class: &str, args: &[&str]) -> Option<String> {
        let n = (1..=3).find(|n| self.is_up(*n))?;
        let addr = self.node_addr(n);
        let out = Command::new(tool())
            .args(["tool", class, "--bootstrap-server", &addr])
            .args(args)
            .output()
            .unwrap();
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node leading the controller quorum.
    pub fn active_controller(&self) -> Option<i32> {
        self.ask(
            "org.apache.kafka.tools.MetadataQuorumCommand",
            &["describe", "--status"],
        )?
        .lines()
        .find_map(|l| l.strip_prefix("LeaderId:"))
        .and_then(|v| v.trim().parse().ok())
    }

    /// The node coordinating the transactions of `transactional_id`, if
    /// the cluster knows it yet.
    pub fn transaction_coordinator(&self, transactional_id: &str) -> Option<i32> {
        let text = self.ask(
            "org.apache.kafka.tools.TransactionsCommand",
            &["describe", "--transactional-id", transactional_id],
        )?;
        // a header line, then the values: CoordinatorId first
        let mut lines = text.lines().skip_while(|l| !l.starts_with("CoordinatorId"));
        lines.next()?;
        lines.next()?.split_whitespace().next()?.parse().ok()
    }

    /// Creates `topic` with Kafka's topic tool and `extra` arguments (a
    /// replica assignment, configs).
    pub fn create_topic(&self, topic: &str, extra: &[&str]) {
        let mut a = vec![
            "tool",
            "org.apache.kafka.tools.TopicCommand",
            "--bootstrap-server",
            &self.addr,
            "--create",
            "--topic",
            topic,
        ];
        a.extend(extra);
        run(&a);
    }

    /// Whether all three controllers follow the quorum's leader closely
    /// (each voter's lag at most 50 records).
    pub fn quorum_caught_up(&self) -> bool {
        let Some(text) = self.ask(
            "org.apache.kafka.tools.MetadataQuorumCommand",
            &["describe", "--replication"],
        ) else {
            return false;
        };
        // NodeId DirectoryId LogEndOffset Lag LastFetchTimestamp ... Status
        let voters: Vec<u64> = text
            .lines()
            .filter(|l| l.contains("Leader") || l.contains("Follower"))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse().ok())
            .collect();
        voters.len() == 3 && voters.iter().all(|lag| *lag <= 50)
    }

    /// Makes node `to` the leader of `topic`'s partition 0 without a
    /// failure: its replica list is reordered to put `to` first, then the
    /// preferred leader is elected (Kafka's reassignment and election tools).
    pub fn move_leader(&self, topic: &str, to: i32) {
        self.move_partition_leader(topic, 0, to)
    }

    /// [`KafkaCluster::move_leader`] of `topic`'s `partition`.
    pub fn move_partition_leader(&self, topic: &str, partition: i32, to: i32) {
        let n = (1..=3).find(|n| self.is_up(*n)).unwrap();
        let bootstrap = self.node_addr(n);
        let mut replicas = vec![to];
        replicas.extend((1..=3).filter(|r| *r != to));
        let plan = self.dir.join("move.json");
        std::fs::write(
            &plan,
            format!(
                r#"{{"version":1,"partitions":[{{"topic":"{topic}","partition":{partition},"replicas":{replicas:?}}}]}}"#
            ),
        )
        .unwrap();
        let partition = partition.to_string();
        for args in [
            vec![
                "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                "--bootstrap-server",
                &bootstrap,
                "--reassignment-json-file",
                plan.to_str().unwrap(),
                "--execute",
            ],
            vec![
                "org.apache.kafka.tools.LeaderElectionCommand",
                "--bootstrap-server",
                &bootstrap,
                "--election-type",
                "PREFERRED",
                "--topic",
                topic,
                "--partition",
                &partition,
            ],
        ] {
            let mut a = vec!["tool"];
            a.extend(args);
            let out = Command::new(tool()).args(&a).output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success()
                    // the reordered list is the preferred one already
                    || said.contains("preferred replica")
                    || String::from_utf8_lossy(&out.stderr).contains("ElectionNotNeeded"),
                "kafka tool {a:?}: {said}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        let _ = Command::new(tool()).arg("kill").arg(&self.dir).status();
        if std::thread::panicking() {
            // the logs stay for a look
            eprintln!("the brokers' logs: {}/N/broker.log", self.dir.display());
            for n in 1..=3 {
                if let Ok(log) = std::fs::read_to_string(self.node(n).join("broker.log")) {
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    eprintln!("--- broker {n} log (tail) ---");
                    for l in tail.iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
            for n in 1..=3 {
                let _ = std::fs::remove_dir_all(self.node(n).join("data"));
            }
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until no transaction is open on `topic`'s partition 0: its last
/// stable offset (the end a read_committed consumer is given) reaches its
/// high watermark, so the markers of every committed transaction are
/// written.
pub fn wait_stable(addr: &str, topic: &str) {
    let end = |isolation: &str| {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", addr)
            .set("isolation.level", isolation)
            .create()
            .unwrap();
        c.fetch_watermarks(topic, 0, Duration::from_secs(10))
            .map(|(_, h)| h)
    };
    let t0 = Instant::now();
    loop {
        match (end("read_committed"), end("read_uncommitted")) {
            (Ok(stable), Ok(high)) if stable == high => return,
            r => assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{topic}: a transaction stayed open for 60 s (last stable offset and high watermark: {r:?})"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
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

/// Every record of `topics` (all their partitions; records of one
/// partition in order) that a consumer with `isolation` (read_committed,
/// read_uncommitted) sees, up to the end; a topic that does not exist is
/// empty.
pub fn read_all(addr: &str, topics: &[&str], isolation: &str) -> Vec<Consumed> {
    try_read_all(addr, topics, isolation, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`read_all`], or what stopped it within `limit` (an end that stayed
/// unknown, a read that did not get there).
pub fn try_read_all(
    addr: &str,
    topics: &[&str],
    isolation: &str,
    limit: Duration,
) -> Result<Vec<Consumed>, String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr)
        .create()
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut parts = Vec::new();
    for t in topics {
        // every partition (a progress topic pgwal makes has several); a
        // topic that does not exist is empty, and any other error (a broker
        // of a cluster down, a leader moving) is asked again
        let partitions = loop {
            match c.fetch_metadata(Some(t), Duration::from_secs(10)) {
                Ok(md) => match md.topics().iter().find(|m| m.name() == *t) {
                    Some(m) if m.error().is_none() => break m.partitions().len() as i32,
                    _ => break 0,
                },
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "the partitions of {t} stayed unknown for {limit:?}: {e}"
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        };
        parts.extend((0..partitions).map(|p| (*t, p)));
    }
    read_partitions(
        addr,
        &parts,
        isolation,
        deadline.saturating_duration_since(Instant::now()),
    )
}

/// Every record of these partitions (`(topic, partition)`) that a consumer
/// with `isolation` sees, up to the end, or what stopped it within `limit`.
/// A partition that does not exist is empty.
pub fn read_partitions(
    addr: &str,
    parts: &[(&str, i32)],
    isolation: &str,
    limit: Duration,
) -> Result<Vec<Consumed>, String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr)
        .set("group.id", format!("reader-{}", std::process::id()))
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for (t, partition) in parts {
        let (t, partition) = (*t, *partition);
        let high = loop {
            match c.fetch_watermarks(t, partition, Duration::from_secs(10)) {
                Ok((_, high)) => break high,
                Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::UnknownTopicOrPartition
                    | RDKafkaErrorCode::UnknownTopic
                    | RDKafkaErrorCode::UnknownPartition,
                )) => break 0,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "the end of {t} [{partition}] stayed unknown for {limit:?}: {e}"
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        };
        if high > 0 {
            tpl.add_partition_offset(t, partition, Offset::Beginning)
                .unwrap();
            ends.push((t.to_string(), partition, high));
        }
    }
    if ends.is_empty() {
        return Ok(Vec::new());
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut last_error = None;
    loop {
        let pos = c.position().unwrap();
        // read_committed stops at the last stable offset; transaction
        // markers take offsets that no record shows
        let done = ends.iter().all(|(t, partition, high)| {
            pos.find_partition(t, *partition)
                .and_then(|p| p.offset().to_raw())
                .is_some_and(|o| o >= *high)
        });
        if done {
            return Ok(out);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "reading {parts:?} took over {limit:?} (the last error: {last_error:?})"
            ));
        }
        match c.poll(Duration::from_millis(200)) {
            None => {}
            // a broker of a cluster down: the client goes on with the others
            Some(Err(e)) => last_error = Some(e),
            Some(Ok(m)) => {
                out.push(Consumed {
                    topic: m.topic().to_owned(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                });
            }
        }
    }
}

fn registry_tool() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/schema-registry-server")
}

/// Whether a schema registry can be started: a JDK, and the registry
/// built already (.build/schema-registry/VERSION/app) or Maven to build it.
pub fn have_registry() -> bool {
    let built = std::fs::read_dir(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.build/schema-registry"),
    )
    .map(|d| {
        d.flatten()
            .any(|e| e.path().join("app/.complete").is_file())
    })
    .unwrap_or(false);
    have_java() && (built || Command::new("mvn").arg("-v").output().is_ok())
}

/// A schema registry with Confluent's REST API (tools/schema-registry-server:
/// Apicurio Registry, in-memory storage) in a directory of its own,
/// stopped and the directory removed when dropped.
pub struct Registry {
    /// The Confluent API's base URL, e.g.
    /// `http://127.0.0.1:30000/apis/ccompat/v7`.
    pub url: String,
    dir: PathBuf,
}

impl Registry {
    /// A registry on a free port of 127.0.0.1 (built first if it is not).
    pub fn start(label: &str) -> Registry {
        use std::sync::atomic::{AtomicU16, Ordering};
        // tests of one process share its pid: each start takes the next
        // candidate port, so that two at once do not pick the same one
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let dir =
            std::env::temp_dir().join(format!("pgwal-registry-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut last = String::new();
        for _ in 0..5 {
            // above the brokers' ports (15000..30000), below the ephemeral range
            let first =
                (std::process::id() % 1000) as u16 * 2 + NEXT.fetch_add(1, Ordering::Relaxed);
            let port = (0..2700)
                .map(|i| 30_000 + (first + i) % 2700)
                .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
                .expect("a free port in 30000..32700");
            NEXT.fetch_add(1, Ordering::Relaxed);
            let out = Command::new(registry_tool())
                .arg("start")
                .arg(&dir)
                .arg(port.to_string())
                .output()
                .unwrap();
            if out.status.success() {
                let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
                return Registry { url, dir };
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            // another process took the port meanwhile: the next one
            if !last.contains("is in use") {
                break;
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        let log = std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        panic!("schema-registry-server start: {last}\n--- registry log ---\n{log}");
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new(registry_tool())
            .arg("stop")
            .arg(&self.dir)
            .status();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.join("registry.log")) {
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- registry log (tail) ---");
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every record of `topics` on the brokers `addr`, read_committed, up to
/// the ends as known at the start, with keys and values deserialised by
/// Confluent's Python client (its AvroDeserializer, with the registry whose
/// Confluent API is at `registry`): tools/schema-registry/avro_consume.py,
/// one JSON object per record, in topic (as given), partition and offset
/// order, with `topic`, `partition`, `offset`, `key`, `value`,
/// `key_schema_id` and `value_schema_id` (null for a null key or value).
/// Panics with the consumer's account when a record is not in Confluent's
/// framing or does not deserialise.
pub fn avro_read_all(addr: &str, registry: &str, topics: &[&str]) -> Vec<serde_json::Value> {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if topics.is_empty() {
        return Vec::new();
    }
    // the consumer's venv (made once, with Confluent's client)
    let python = PYTHON.get_or_init(|| {
        let out = Command::new(registry_tool())
            .arg("consumer-env")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "schema-registry-server consumer-env: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    });
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/schema-registry/avro_consume.py");
    let out = Command::new(python)
        .arg(&script)
        .args([
            "--brokers",
            addr,
            "--registry",
            registry,
            "--timeout",
            "120",
        ])
        .args(topics)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "avro_consume.py {topics:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("avro_consume.py printed {l:?}: {e}"))
        })
        .collect()
}
