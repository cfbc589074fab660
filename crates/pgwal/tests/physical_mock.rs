//! `PhysicalReceiver` against a scripted walsender: malformed input ends in
//! a typed error and leaves the directory valid.

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;

use bytes::BytesMut;
use pgwal::protocol::replication::{BackendReplicationMessage, XLogData};
use pgwal::protocol::PgTimestamp;
use pgwal::{Error, Lsn, PhysicalConfig, PhysicalReceiver};

mod fake_walsender;
use fake_walsender::{msg, read_msg, rows};

/// Serves one connection: 1 MB segments, timeline 1 at 0/100000, then the
/// CopyData `bodies` after START_REPLICATION.
fn serve(listener: TcpListener, segment_size: &'static str, bodies: Vec<Vec<u8>>) {
    let (mut s, _) = listener.accept().unwrap();
    read_msg(&mut s, true).unwrap();
    let mut out = BytesMut::new();
    msg(&mut out, b'R', &0i32.to_be_bytes());
    msg(&mut out, b'S', b"server_version\x0015.0\x00");
    msg(&mut out, b'K', &[0, 0, 0, 1, 0, 0, 0, 2]);
    msg(&mut out, b'Z', b"I");
    s.write_all(&out).unwrap();
    while let Some((tag, body)) = read_msg(&mut s, false) {
        if tag != b'Q' {
            continue;
        }
        let q = String::from_utf8_lossy(&body).into_owned();
        out.clear();
        if q.starts_with("SHOW") {
            rows(&mut out, &["wal_segment_size"], &[Some(segment_size)]);
        } else if q.starts_with("IDENTIFY_SYSTEM") {
            rows(
                &mut out,
                &["systemid", "timeline", "xlogpos", "dbname"],
                &[
                    Some("7000000000000000001"),
                    Some("1"),
                    Some("0/100000"),
                    None,
                ],
            );
        } else if q.starts_with("START_REPLICATION") {
            msg(&mut out, b'W', &[0, 0, 0]);
            for b in &bodies {
                msg(&mut out, b'd', b);
            }
            s.write_all(&out).unwrap();
            // Wait for the client to go away.
            while read_msg(&mut s, false).is_some() {}
            return;
        }
        s.write_all(&out).unwrap();
    }
}

fn xlog(at: u64, data: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    BackendReplicationMessage::XLogData(XLogData {
        wal_start: Lsn(at),
        wal_end: Lsn(at + data.len() as u64),
        server_time: PgTimestamp(0),
        data: bytes::Bytes::copy_from_slice(data),
    })
    .encode(&mut b);
    b.to_vec()
}

fn run(
    name: &str,
    segment_size: &'static str,
    bodies: Vec<Vec<u8>>,
) -> (pgwal::Result<pgwal::StopReason>, PathBuf) {
    let dir = std::env::temp_dir().join(format!("pgwal-mock-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || serve(listener, segment_size, bodies));
    let config: pgwal::Config = format!("host=127.0.0.1 port={port} user=u sslmode=disable")
        .parse()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(
        PhysicalReceiver::new(config, PhysicalConfig::new(&dir)).run(std::future::pending()),
    );
    drop(rt);
    server.join().unwrap();
    (r, dir)
}

#[test]
fn truncated_message_is_a_decode_error_and_the_partial_stays_valid() {
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let (r, dir) = run(
        "trunc",
        "1MB",
        vec![xlog(0x100000, &data), b"w\x00\x00\x00".to_vec()],
    );
    let e = r.unwrap_err();
    assert!(matches!(e, Error::Decode(_)), "{e:?}");
    // What was received before is on disk, in a full-size partial segment.
    let partial = std::fs::read(dir.join("000000010000000000000001.partial")).unwrap();
    assert_eq!(partial.len(), 1 << 20);
    assert_eq!(&partial[..1000], &data[..]);
    assert!(partial[1000..].iter().all(|b| *b == 0));
    // Running again resumes from that partial segment (the scan accepts it):
    // the same script fails the same way and leaves the same file.
    let (r, dir2) = run("trunc", "1MB", vec![xlog(0x100000, &data), b"w".to_vec()]);
    assert!(matches!(r, Err(Error::Decode(_))));
    assert_eq!(
        std::fs::read(dir2.join("000000010000000000000001.partial")).unwrap(),
        partial
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gap_and_bad_segment_size_are_typed_errors() {
    let (r, dir) = run(
        "gap",
        "1MB",
        vec![xlog(0x100000, &[1; 100]), xlog(0x100200, &[2; 100])],
    );
    match r {
        Err(Error::WalGap { expected, got }) => {
            assert_eq!((expected, got), (Lsn(0x100064), Lsn(0x100200)));
        }
        other => panic!("{other:?}"),
    }
    let partial = std::fs::read(dir.join("000000010000000000000001.partial")).unwrap();
    assert!(partial[..100].iter().all(|b| *b == 1) && partial[100..].iter().all(|b| *b == 0));
    std::fs::remove_dir_all(&dir).unwrap();

    let (r, dir) = run("segsize", "3MB", vec![]);
    assert!(matches!(r, Err(Error::BadResult(_))), "{r:?}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
