//! Every pgoutput message built by hand: encode → decode → encode, plus
//! truncation and mutation of each encoding (errors, never panics).

use bytes::{Bytes, BytesMut};
use pgwal_protocol::pgoutput::*;
use pgwal_protocol::replication::*;
use pgwal_protocol::{Lsn, PgTimestamp};

fn tuple() -> TupleData {
    TupleData(vec![
        ColumnValue::Null,
        ColumnValue::UnchangedToast,
        ColumnValue::Text(Bytes::from_static(b"42")),
        ColumnValue::Binary(Bytes::from_static(&[0, 0, 0, 42])),
        ColumnValue::Text(Bytes::new()),
    ])
}

/// (message, whether it is decoded inside a streaming block)
fn samples() -> Vec<(LogicalMessage, bool)> {
    let t = PgTimestamp(123_456_789);
    let mut v = vec![
        (
            LogicalMessage::Begin(Begin {
                final_lsn: Lsn(0x1_0000_0010),
                commit_time: t,
                xid: 7,
            }),
            false,
        ),
        (
            LogicalMessage::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time: t,
            }),
            false,
        ),
        (
            LogicalMessage::Origin(Origin {
                commit_lsn: Lsn(3),
                name: "node_a".into(),
            }),
            false,
        ),
        (
            LogicalMessage::BeginPrepare(BeginPrepare {
                prepare_lsn: Lsn(4),
                end_lsn: Lsn(5),
                prepare_time: t,
                xid: 9,
                gid: "g1".into(),
            }),
            false,
        ),
        (
            LogicalMessage::Prepare(Prepare {
                flags: 0,
                prepare_lsn: Lsn(4),
                end_lsn: Lsn(5),
                prepare_time: t,
                xid: 9,
                gid: "g1".into(),
            }),
            false,
        ),
        (
            LogicalMessage::StreamPrepare(Prepare {
                flags: 0,
                prepare_lsn: Lsn(4),
                end_lsn: Lsn(5),
                prepare_time: t,
                xid: 9,
                gid: "g2".into(),
            }),
            false,
        ),
        (
            LogicalMessage::CommitPrepared(CommitPrepared {
                flags: 0,
                commit_lsn: Lsn(6),
                end_lsn: Lsn(7),
                commit_time: t,
                xid: 9,
                gid: "g1".into(),
            }),
            false,
        ),
        (
            LogicalMessage::RollbackPrepared(RollbackPrepared {
                flags: 0,
                prepare_end_lsn: Lsn(8),
                rollback_end_lsn: Lsn(9),
                prepare_time: t,
                rollback_time: PgTimestamp(t.0 + 1),
                xid: 9,
                gid: "g1".into(),
            }),
            false,
        ),
        (
            LogicalMessage::StreamStart(StreamStart {
                xid: 11,
                first_segment: true,
            }),
            false,
        ),
        (LogicalMessage::StreamStop, true),
        (
            LogicalMessage::StreamCommit(StreamCommit {
                xid: 11,
                flags: 0,
                commit_lsn: Lsn(10),
                end_lsn: Lsn(11),
                commit_time: t,
            }),
            false,
        ),
        (
            LogicalMessage::StreamAbort(StreamAbort {
                xid: 11,
                subxid: 12,
                abort: None,
            }),
            false,
        ),
        (
            LogicalMessage::StreamAbort(StreamAbort {
                xid: 11,
                subxid: 11,
                abort: Some((Lsn(12), t)),
            }),
            false,
        ),
    ];
    for xid in [None, Some(12u32)] {
        let s = xid.is_some();
        v.push((
            LogicalMessage::Relation(Relation {
                xid,
                oid: 16384,
                namespace: "public".into(),
                name: "t".into(),
                replica_identity: ReplicaIdentity::Full,
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
                        type_oid: 1043,
                        type_modifier: 14,
                    },
                ],
            }),
            s,
        ));
        v.push((
            LogicalMessage::Type(TypeMessage {
                xid,
                oid: 90000,
                namespace: "public".into(),
                name: "mood".into(),
            }),
            s,
        ));
        v.push((
            LogicalMessage::Insert(Insert {
                xid,
                relation_oid: 16384,
                new: tuple(),
            }),
            s,
        ));
        v.push((
            LogicalMessage::Update(Update {
                xid,
                relation_oid: 16384,
                old: None,
                new: tuple(),
            }),
            s,
        ));
        v.push((
            LogicalMessage::Update(Update {
                xid,
                relation_oid: 16384,
                old: Some(OldTuple::Key(tuple())),
                new: tuple(),
            }),
            s,
        ));
        v.push((
            LogicalMessage::Update(Update {
                xid,
                relation_oid: 16384,
                old: Some(OldTuple::Full(tuple())),
                new: tuple(),
            }),
            s,
        ));
        v.push((
            LogicalMessage::Delete(Delete {
                xid,
                relation_oid: 16384,
                old: OldTuple::Key(tuple()),
            }),
            s,
        ));
        v.push((
            LogicalMessage::Delete(Delete {
                xid,
                relation_oid: 16384,
                old: OldTuple::Full(tuple()),
            }),
            s,
        ));
        v.push((
            LogicalMessage::Truncate(Truncate {
                xid,
                options: 3,
                relation_oids: vec![1, 2, 3],
            }),
            s,
        ));
        v.push((
            LogicalMessage::Message(LogicalDecodingMessage {
                xid,
                flags: 1,
                lsn: Lsn(77),
                prefix: "pfx".into(),
                content: Bytes::from_static(b"hello\0world"),
            }),
            s,
        ));
    }
    v
}

fn decoder(streamed: bool) -> Decoder {
    let mut d = Decoder::new();
    if streamed {
        d.decode(Bytes::from_static(&[b'S', 0, 0, 0, 1, 1]))
            .unwrap();
    }
    d
}

#[test]
fn every_message_roundtrips() {
    let mut tags = std::collections::BTreeSet::new();
    for (msg, streamed) in samples() {
        let bytes = msg.to_bytes().freeze();
        let back = decoder(streamed).decode(bytes.clone()).unwrap();
        assert_eq!(back, msg);
        assert_eq!(back.to_bytes().freeze(), bytes);
        tags.insert(msg.tag());
    }
    assert_eq!(tags.len(), 19, "all 19 pgoutput message kinds covered");
}

#[test]
fn truncations_are_errors() {
    for (msg, streamed) in samples() {
        let bytes = msg.to_bytes().freeze();
        for n in 0..bytes.len() {
            let cut = bytes.slice(..n);
            let r = decoder(streamed).decode(cut);
            // StreamAbort's optional tail makes exactly one shorter length valid.
            if let Ok(m) = &r {
                assert!(
                    matches!(m, LogicalMessage::StreamAbort(_)) && n == 9,
                    "{msg:?} cut at {n} decoded"
                );
            }
        }
        let mut longer = BytesMut::from(&bytes[..]);
        longer.extend_from_slice(b"\x01");
        assert!(
            decoder(streamed).decode(longer.freeze()).is_err(),
            "trailing byte accepted: {msg:?}"
        );
    }
}

#[test]
fn random_mutations_never_panic() {
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let samples = samples();
    for _ in 0..20_000 {
        let (msg, streamed) = &samples[(next() % samples.len() as u64) as usize];
        let mut b = msg.to_bytes().to_vec();
        for _ in 0..=(next() % 4) {
            let i = (next() % b.len() as u64) as usize;
            b[i] = next() as u8;
        }
        let _ = decoder(*streamed).decode(Bytes::from(b.clone()));
        let _ = BackendReplicationMessage::decode(Bytes::from(b.clone()));
        let _ = StandbyStatusUpdate::decode(Bytes::from(b.clone()));
        let _ = HotStandbyFeedback::decode(Bytes::from(b));
    }
}

#[test]
fn replication_messages_roundtrip() {
    let x = BackendReplicationMessage::XLogData(XLogData {
        wal_start: Lsn(1),
        wal_end: Lsn(2),
        server_time: PgTimestamp(3),
        data: Bytes::from_static(b"B..."),
    });
    let k = BackendReplicationMessage::PrimaryKeepalive(PrimaryKeepalive {
        wal_end: Lsn(5),
        server_time: PgTimestamp(6),
        reply_requested: false,
    });
    let f = BackendReplicationMessage::SenderFlush(SenderFlush { flush: Lsn(7) });
    let e = BackendReplicationMessage::EarlyReceiptRequest;
    for m in [x, k, f, e] {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        assert_eq!(BackendReplicationMessage::decode(b.freeze()).unwrap(), m);
    }
    let h = HotStandbyFeedback {
        client_time: PgTimestamp(1),
        xmin: 2,
        xmin_epoch: 3,
        catalog_xmin: 4,
        catalog_xmin_epoch: 5,
    };
    let mut b = BytesMut::new();
    h.encode(&mut b);
    assert_eq!(b.len(), 25);
    assert_eq!(HotStandbyFeedback::decode(b.freeze()).unwrap(), h);
}

/// The commit and two-phase messages share their field codecs; a cut inside
/// each field still names that field of that message.
#[test]
fn truncation_errors_name_the_field() {
    fn fields(msg: &LogicalMessage) -> Vec<&'static str> {
        let bytes = msg.to_bytes().freeze();
        let mut seen: Vec<&'static str> = Vec::new();
        for n in 1..bytes.len() {
            let field = match decoder(false).decode(bytes.slice(..n)) {
                Err(pgwal_protocol::DecodeError::UnexpectedEof { field, .. })
                | Err(pgwal_protocol::DecodeError::MissingNul { field }) => field,
                other => panic!("{msg:?} cut at {n}: {other:?}"),
            };
            if seen.last() != Some(&field) {
                seen.push(field);
            }
        }
        seen
    }
    let t = PgTimestamp(1);
    let cases: Vec<(LogicalMessage, &[&str])> = vec![
        (
            LogicalMessage::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time: t,
            }),
            &[
                "commit.flags",
                "commit.commit_lsn",
                "commit.end_lsn",
                "commit.commit_time",
            ],
        ),
        (
            LogicalMessage::StreamCommit(StreamCommit {
                xid: 3,
                flags: 0,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time: t,
            }),
            &[
                "stream_commit.xid",
                "stream_commit.flags",
                "stream_commit.commit_lsn",
                "stream_commit.end_lsn",
                "stream_commit.commit_time",
            ],
        ),
        (
            LogicalMessage::BeginPrepare(BeginPrepare {
                prepare_lsn: Lsn(4),
                end_lsn: Lsn(5),
                prepare_time: t,
                xid: 9,
                gid: "g".into(),
            }),
            &[
                "begin_prepare.prepare_lsn",
                "begin_prepare.end_lsn",
                "begin_prepare.time",
                "begin_prepare.xid",
                "begin_prepare.gid",
            ],
        ),
        (
            LogicalMessage::Prepare(Prepare {
                flags: 0,
                prepare_lsn: Lsn(4),
                end_lsn: Lsn(5),
                prepare_time: t,
                xid: 9,
                gid: "g".into(),
            }),
            &[
                "prepare.flags",
                "prepare.prepare_lsn",
                "prepare.end_lsn",
                "prepare.time",
                "prepare.xid",
                "prepare.gid",
            ],
        ),
        (
            LogicalMessage::CommitPrepared(CommitPrepared {
                flags: 0,
                commit_lsn: Lsn(6),
                end_lsn: Lsn(7),
                commit_time: t,
                xid: 9,
                gid: "g".into(),
            }),
            &[
                "commit_prepared.flags",
                "commit_prepared.commit_lsn",
                "commit_prepared.end_lsn",
                "commit_prepared.time",
                "commit_prepared.xid",
                "commit_prepared.gid",
            ],
        ),
    ];
    for (msg, want) in cases {
        assert_eq!(fields(&msg), want, "{msg:?}");
    }
}

#[test]
fn sender_flush_ignores_appended_fields_and_rejects_short_bodies() {
    let mut raw = vec![b'f'];
    raw.extend_from_slice(&0x0300_0028u64.to_be_bytes());
    raw.extend_from_slice(b"later");
    assert_eq!(
        BackendReplicationMessage::decode(Bytes::from(raw)).unwrap(),
        BackendReplicationMessage::SenderFlush(SenderFlush {
            flush: Lsn(0x0300_0028)
        })
    );
    assert!(BackendReplicationMessage::decode(Bytes::from_static(b"f\0\0\0")).is_err());
}
