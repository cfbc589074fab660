//! Test support: throwaway PostgreSQL clusters.
//!
//! Each [`Cluster`] runs `initdb` into its own directory under `/tmp`, starts
//! `postgres` on a free TCP port of 127.0.0.1 (its unix socket stays in the
//! cluster directory), and is stopped and removed on drop, also when a test
//! panics. As root, server programs run through `tools/as-user`.
#![allow(dead_code)]

pub mod netns;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The server builds to test against: `(label, bin dir)`: stock 15 (Debian),
/// stock 17 (`tools/postgres-major`), the series' 18. Missing ones are
/// skipped with a notice on stderr.
pub fn servers() -> Vec<(&'static str, PathBuf)> {
    let mut v = Vec::new();
    let pg15 = std::env::var_os("PGWAL_PG15_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"));
    let pg17 = std::env::var_os("PGWAL_PG17_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".build/install/pg17/bin"));
    let pg18 = std::env::var_os("PGWAL_PG18_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".build/install/check/bin"));
    for (label, dir) in [("pg15", pg15), ("pg17", pg17), ("pg18", pg18)] {
        if dir.join("postgres").exists() {
            v.push((label, dir));
        } else {
            eprintln!("NOTICE: skipping {label}: no server in {}", dir.display());
        }
    }
    assert!(!v.is_empty(), "no PostgreSQL server found to test against");
    v
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn server_cmd(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new(repo_root().join("tools/as-user"));
        c.arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Where test servers' ports start.
const FIRST_PORT: u16 = 10_000;

/// A port for a test server. Ports in the kernel's ephemeral range are
/// avoided: any client socket (psql, a replication connection) may take one
/// as its source port between our check and the server's bind(), which is
/// how "could not bind ... Address already in use" once failed CI. Below the
/// range only listeners compete, and [`start_server`] retries if one does.
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let low = ephemeral_port_floor();
    if room_below_ephemeral_range() {
        let span = usize::from(low - FIRST_PORT);
        // Start where this process's pid points, so that test binaries
        // running at the same time walk different stretches.
        let seed = (std::process::id() as usize).wrapping_mul(7919);
        for _ in 0..span {
            let i = NEXT.fetch_add(1, Ordering::SeqCst);
            let port = FIRST_PORT + (seed.wrapping_add(i) % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The lowest port the kernel gives client sockets.
pub fn ephemeral_port_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
}

/// Whether [`free_port`] can stay below the ephemeral range; where the
/// range starts near 1024 it falls back to the kernel's choice.
pub fn room_below_ephemeral_range() -> bool {
    ephemeral_port_floor() > FIRST_PORT + 1_000
}

/// `pg_ctl start` for the cluster in `data`, logging to `log`. If the port
/// was taken meanwhile, appends a fresh `port` to postgresql.conf (the last
/// setting wins) and tries again; returns the port the server listens on.
pub fn start_server(bin: &Path, data: &Path, log: &Path, mut port: u16) -> u16 {
    for attempt in 1.. {
        let seen = std::fs::metadata(log).map_or(0, |m| m.len() as usize);
        let mut c = server_cmd(&bin.join("pg_ctl"));
        c.args(["-w", "-t", "60", "-D"])
            .arg(data)
            .arg("-l")
            .arg(log)
            .arg("start");
        c.stdout(Stdio::null());
        let out = c.output().unwrap_or_else(|e| panic!("pg_ctl start: {e}"));
        if out.status.success() {
            return port;
        }
        let text = std::fs::read(log).unwrap_or_default();
        let this_attempt = String::from_utf8_lossy(text.get(seen..).unwrap_or_default());
        // lc_messages = 'C' (set above; standbys copy it) keeps this English
        let port_taken = this_attempt.contains("could not create any TCP/IP sockets");
        assert!(
            port_taken && attempt < 5,
            "pg_ctl start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("NOTICE: port {port} was taken; starting on another one");
        port = free_port();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        writeln!(f, "port = {port}").unwrap();
    }
    unreachable!()
}

fn run(mut c: Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running throwaway cluster.
pub struct Cluster {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub port: u16,
    pub label: &'static str,
    /// Server major version, e.g. 15.
    pub major: u32,
}

/// Extra `pg_hba.conf` lines go before the catch-all `trust` lines.
#[derive(Default)]
pub struct Options {
    pub hba: Vec<String>,
    pub conf: Vec<String>,
    /// Port to try first instead of a free one (to test the retry).
    pub port: Option<u16>,
}

impl Cluster {
    /// A fresh directory under /tmp that the server's user owns.
    fn new_dir() -> PathBuf {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = PathBuf::from(format!("/tmp/pgwal-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        give_to_server_user(&dir);
        dir
    }

    fn read_major(&mut self) {
        self.major = self
            .query("SHOW server_version_num")
            .trim()
            .parse::<u32>()
            .unwrap()
            / 10000;
    }

    pub fn start(label: &'static str, bin: &Path, opts: Options) -> Cluster {
        let dir = Self::new_dir();
        let data = dir.join("data");
        let mut cluster = Cluster {
            dir: dir.clone(),
            bin: bin.to_owned(),
            port: 0,
            label,
            major: 0,
        };
        let mut c = server_cmd(&bin.join("initdb"));
        c.args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "-D",
        ])
        .arg(&data);
        run(c, "initdb");
        let port = opts.port.unwrap_or_else(free_port);
        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n\
             max_prepared_transactions = 10\nfsync = off\nsynchronous_commit = off\n\
             shared_buffers = 32MB\nlog_min_messages = warning\nlc_messages = 'C'\n",
            dir.display()
        );
        for l in &opts.conf {
            conf.push_str(l);
            conf.push('\n');
        }
        let append = |file: &str, text: &str| {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join(file))
                .unwrap();
            f.write_all(text.as_bytes()).unwrap();
        };
        append("postgresql.conf", &conf);
        let mut hba = String::new();
        for l in &opts.hba {
            hba.push_str(l);
            hba.push('\n');
        }
        hba.push_str("host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n");
        // Our lines must come first: rewrite the file.
        std::fs::write(
            data.join("pg_hba.conf"),
            format!("local all all trust\nlocal replication all trust\n{hba}"),
        )
        .unwrap();
        cluster.port = start_server(bin, &data, &dir.join("server.log"), port);
        cluster.read_major();
        cluster
    }

    /// A hot standby of this cluster, streaming through the physical slot
    /// `slot` (created here), from a `pg_basebackup`; `conf` lines are
    /// appended to its postgresql.conf.
    pub fn standby(&self, slot: &str, conf: &[&str]) -> Cluster {
        self.query(&format!(
            "SELECT pg_create_physical_replication_slot('{slot}', true)"
        ));
        let dir = Self::new_dir();
        let data = dir.join("data");
        let mut c = server_cmd(&self.bin.join("pg_basebackup"));
        c.args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-X",
            "stream",
            "-c",
            "fast",
            "-p",
        ])
        .arg(self.port.to_string())
        .arg("-D")
        .arg(&data);
        run(c, "pg_basebackup");
        let port = free_port();
        let mut text = format!(
            "port = {port}\nunix_socket_directories = '{}'\nhot_standby = on\n\
             primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres \
             application_name=standby'\nprimary_slot_name = '{slot}'\n",
            dir.display(),
            self.port
        );
        for l in conf {
            text.push_str(l);
            text.push('\n');
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
        std::fs::write(data.join("standby.signal"), "").unwrap();
        let mut standby = Cluster {
            dir: dir.clone(),
            bin: self.bin.clone(),
            port: 0,
            label: self.label,
            major: 0,
        };
        standby.port = start_server(&self.bin, &data, &dir.join("server.log"), port);
        standby.read_major();
        standby
    }

    /// `pg_ctl stop -m immediate`: a crash, as far as the WAL is concerned.
    pub fn crash(&self) {
        let mut c = server_cmd(&self.bin.join("pg_ctl"));
        c.args(["-m", "immediate", "-w", "-D"])
            .arg(self.dir.join("data"))
            .arg("stop");
        c.stdout(Stdio::null());
        run(c, "pg_ctl stop");
    }

    /// Promotes this standby and waits until it accepts writes.
    pub fn promote(&self) {
        let mut c = server_cmd(&self.bin.join("pg_ctl"));
        c.args(["-w", "-t", "60", "-D"])
            .arg(self.dir.join("data"))
            .arg("promote");
        c.stdout(Stdio::null());
        run(c, "pg_ctl promote");
    }

    /// `psql` connected to this cluster as `postgres`, stopping on the
    /// first error; callers add what to run.
    pub fn psql_command(&self) -> Command {
        let mut c = Command::new(self.bin.join("psql"));
        c.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args(["-U", "postgres", "-d", "postgres", "-p"])
            .arg(self.port.to_string());
        c
    }

    /// Runs SQL through psql (statement by statement, stop on error) and
    /// returns unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> String {
        let mut c = self.psql_command();
        c.args(["-At", "-f", "-"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = feed(&mut c, sql);
        assert!(
            out.status.success(),
            "psql failed on\n{sql}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs `sql` through psql on a thread of its own (a writer alongside
    /// the code under test); join the handle to learn that it succeeded.
    pub fn psql_in_background(&self, sql: String) -> std::thread::JoinHandle<()> {
        let mut psql = self.psql_command();
        psql.args(["-f", "-"]).stdout(Stdio::null());
        std::thread::spawn(move || {
            assert!(
                feed(&mut psql, &sql).status.success(),
                "background psql failed"
            );
        })
    }

    /// One query, trimmed output.
    pub fn query(&self, sql: &str) -> String {
        self.psql(sql).trim().to_owned()
    }

    /// `host=127.0.0.1 port=... user=postgres dbname=postgres`
    pub fn conninfo(&self, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname=postgres",
            self.port
        )
    }

    /// The server's WAL insert position now (`pg_current_wal_insert_lsn()`):
    /// the end of everything written so far.
    pub fn insert_lsn(&self) -> pgwal::Lsn {
        self.query("SELECT pg_current_wal_insert_lsn()")
            .parse()
            .unwrap()
    }

    /// The `confirmed_flush_lsn` of logical slot `slot`.
    pub fn confirmed_flush(&self, slot: &str) -> pgwal::Lsn {
        self.query(&format!(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .parse()
        .unwrap()
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut c = server_cmd(&self.bin.join("pg_ctl"));
        c.args(["-m", "immediate", "-w", "-D"])
            .arg(self.dir.join("data"))
            .arg("stop");
        c.stdout(Stdio::null()).stderr(Stdio::null());
        let _ = c.status();
        if std::thread::panicking() {
            eprintln!(
                "--- server log of {} ---\n{}",
                self.label,
                self.server_log()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cmd` (psql, say) with `sql` on its stdin and waits for it; what
/// it writes goes where `cmd` says.
pub fn feed(cmd: &mut Command, sql: &str) -> std::process::Output {
    let mut child = cmd.stdin(Stdio::piped()).spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `f` on a multi-threaded Tokio runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A connection config for `user` on `c` (TLS off).
pub fn config(c: &Cluster, user: &str) -> pgwal::Config {
    format!(
        "{} sslmode=disable application_name=pgwal_test",
        c.conninfo(user)
    )
    .parse()
    .unwrap()
}

/// Makes `path` (recursively) owned by the server's user when running as root.
pub fn give_to_server_user(path: &Path) {
    if is_root() {
        let user = Command::new(repo_root().join("tools/as-user"))
            .arg("--ensure")
            .output()
            .unwrap();
        let user = String::from_utf8_lossy(&user.stdout).trim().to_owned();
        let mut c = Command::new("chown");
        c.arg("-R").arg(&user).arg(path);
        run(c, "chown");
    }
}
