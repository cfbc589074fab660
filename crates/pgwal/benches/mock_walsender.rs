//! Library-alone throughput: a mock walsender on 127.0.0.1 replays a
//! recorded-style pgoutput stream (narrow rows: `id int4, v text`) as fast as
//! the socket takes it; the consumer is a `LogicalStream` on a current-thread
//! runtime (one core) that acks every commit.
//!
//! Also measures the sans-IO decoder alone. Reports events/s, ns/event,
//! allocations per event and the consumer thread's CPU time.
//!
//! Run: `cargo bench -p pgwal --bench mock_walsender` (env `EVENTS`, default 2,000,000).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use pgwal::protocol::pgoutput::*;
use pgwal::protocol::replication::{BackendReplicationMessage, XLogData};
use pgwal::protocol::{Lsn, PgTimestamp};

#[path = "../tests/fake_walsender/mod.rs"]
mod fake_walsender;
use fake_walsender::{msg, read_msg, rows};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const ROWS_PER_TXN: usize = 100;

/// pgoutput messages of `events` events: transactions of Begin, 100 inserts, Commit.
fn workload(events: usize) -> Vec<Bytes> {
    let rel = LogicalMessage::Relation(Relation {
        xid: None,
        oid: 16384,
        namespace: "public".into(),
        name: "bench".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            RelationColumn {
                flags: 1,
                name: "id".into(),
                type_oid: 23,
                type_modifier: -1,
            },
            RelationColumn {
                flags: 0,
                name: "v".into(),
                type_oid: 25,
                type_modifier: -1,
            },
        ],
    });
    let mut out = vec![rel.to_bytes().freeze()];
    let mut lsn = 0x1_0000_0000u64;
    let mut id = 0;
    let mut xid = 1000;
    while out.len() < events {
        xid += 1;
        let begin_lsn = lsn;
        lsn += (ROWS_PER_TXN as u64 + 2) * 120;
        out.push(
            LogicalMessage::Begin(Begin {
                final_lsn: Lsn(lsn),
                commit_time: PgTimestamp(1),
                xid,
            })
            .to_bytes()
            .freeze(),
        );
        for _ in 0..ROWS_PER_TXN {
            id += 1;
            let new = TupleData(vec![
                ColumnValue::Text(Bytes::from(id.to_string())),
                ColumnValue::Text(Bytes::from_static(b"narrow row payload 0123456789")),
            ]);
            out.push(
                LogicalMessage::Insert(Insert {
                    xid: None,
                    relation_oid: 16384,
                    new,
                })
                .to_bytes()
                .freeze(),
            );
        }
        let _ = begin_lsn;
        out.push(
            LogicalMessage::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn(lsn),
                end_lsn: Lsn(lsn + 48),
                commit_time: PgTimestamp(1),
            })
            .to_bytes()
            .freeze(),
        );
    }
    out
}

/// Serves one replication connection, then streams `wire` and a final keepalive.
fn serve(listener: TcpListener, wire: Vec<u8>) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_nodelay(true).unwrap();
    read_msg(&mut s, true).unwrap();
    let mut out = BytesMut::new();
    msg(&mut out, b'R', &0i32.to_be_bytes());
    msg(&mut out, b'S', b"server_version\x0018.0\x00");
    let mut k = BytesMut::new();
    k.put_i32(1);
    k.put_i32(2);
    msg(&mut out, b'K', &k);
    msg(&mut out, b'Z', b"I");
    s.write_all(&out).unwrap();
    loop {
        let Some((tag, body)) = read_msg(&mut s, false) else {
            return;
        };
        if tag != b'Q' {
            continue;
        }
        let q = String::from_utf8_lossy(&body).into_owned();
        out.clear();
        if q.starts_with("START_REPLICATION") {
            let mut w = BytesMut::new();
            w.put_i8(0);
            w.put_i16(0);
            msg(&mut out, b'W', &w);
            s.write_all(&out).unwrap();
            // Drain client feedback in the background.
            let mut r = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut sink = [0u8; 65536];
                while matches!(r.read(&mut sink), Ok(n) if n > 0) {}
            });
            for chunk in wire.chunks(1 << 20) {
                if s.write_all(chunk).is_err() {
                    return;
                }
            }
            // Park until the client disconnects.
            std::thread::sleep(std::time::Duration::from_secs(3600));
            return;
        }
        rows(&mut out, &["confirmed_flush_lsn"], &[Some("0/0")]);
        s.write_all(&out).unwrap();
    }
}

fn thread_cpu_secs() -> f64 {
    // utime + stime of the calling thread, in clock ticks (USER_HZ = 100).
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

fn max_rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let events: usize = std::env::var("EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let msgs = workload(events);
    let n = msgs.len();

    // 1. The sans-IO decoder alone.
    let a0 = ALLOCS.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut d = Decoder::new();
    let mut count = 0usize;
    for m in &msgs {
        if d.decode(m.clone()).is_ok() {
            count += 1;
        }
    }
    let dt = t0.elapsed();
    assert_eq!(count, n);
    println!(
        "decoder alone:      {n} messages in {:.3} s = {:.2} M msg/s, {:.0} ns/msg, {:.2} allocs/msg",
        dt.as_secs_f64(),
        n as f64 / dt.as_secs_f64() / 1e6,
        dt.as_nanos() as f64 / n as f64,
        (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / n as f64
    );

    // 2. The whole library over a socket: framing, decode, relation
    // resolution, channel hand-off, acks.
    let mut wire = BytesMut::new();
    let mut body = BytesMut::new();
    for m in &msgs {
        body.clear();
        BackendReplicationMessage::XLogData(XLogData {
            wal_start: Lsn(1),
            wal_end: Lsn(1),
            server_time: PgTimestamp(0),
            data: m.clone(),
        })
        .encode(&mut body);
        msg(&mut wire, b'd', &body);
    }
    let wire_bytes = wire.len();
    drop(msgs);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let wire = wire.to_vec();
    std::thread::spawn(move || serve(listener, wire));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let config: pgwal::Config = format!("host=127.0.0.1 port={port} user=bench dbname=bench sslmode=disable").parse().unwrap();
        let mut s = pgwal::LogicalStream::start(config, pgwal::StreamConfig::new("bench", ["bench"]).proto_version(1)).await.unwrap();
        let cpu0 = thread_cpu_secs();
        let a0 = ALLOCS.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let mut got = 0usize;
        let mut rows = 0usize;
        while got < n {
            let e = s.next().await.unwrap().unwrap();
            got += 1;
            if let pgwal::Event::Insert(c) = &e {
                rows += c.new.as_ref().map_or(0, |r| r.values().len().min(1));
            }
            if let Some(l) = e.ack_lsn() {
                s.ack(l);
            }
        }
        let dt = t0.elapsed();
        let cpu = thread_cpu_secs() - cpu0;
        println!(
            "LogicalStream:      {n} events ({rows} inserts, {:.0} MB on the wire) in {:.3} s = {:.2} M events/s, {:.0} ns/event wall, \
             {:.0} ns/event CPU (1 thread), {:.2} allocs/event, max RSS {} MB (includes the recorded stream)",
            wire_bytes as f64 / 1e6,
            dt.as_secs_f64(),
            n as f64 / dt.as_secs_f64() / 1e6,
            dt.as_nanos() as f64 / n as f64,
            cpu * 1e9 / n as f64,
            (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / n as f64,
            max_rss_kb() / 1024
        );
        drop(s);
    });
}
