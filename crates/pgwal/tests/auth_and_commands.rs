//! Authentication methods and replication commands against real servers.

mod support;

use pgwal::{CreateSlotOptions, Error, ReplicationClient, SlotSnapshot};
use support::{block_on, config, Cluster, Options};

fn auth_cluster(label: &'static str, bin: &std::path::Path) -> Cluster {
    let mut hba = Vec::new();
    for (user, method) in [
        ("u_password", "password"),
        ("u_md5", "md5"),
        ("u_scram", "scram-sha-256"),
    ] {
        hba.push(format!("host all {user} 127.0.0.1/32 {method}"));
        hba.push(format!("host replication {user} 127.0.0.1/32 {method}"));
    }
    let c = Cluster::start(
        label,
        bin,
        Options {
            hba,
            ..Options::default()
        },
    );
    c.psql(
        "SET password_encryption = 'md5';
         CREATE ROLE u_md5 LOGIN REPLICATION PASSWORD 'md5 pw';
         SET password_encryption = 'scram-sha-256';
         CREATE ROLE u_scram LOGIN REPLICATION PASSWORD 'scram pw';
         CREATE ROLE u_password LOGIN REPLICATION PASSWORD 'clear pw';
         CREATE ROLE u_trust LOGIN REPLICATION;",
    );
    c
}

#[test]
fn auth_methods() {
    for (label, bin) in support::servers() {
        let c = auth_cluster(label, &bin);
        block_on(async {
            for (user, pw) in [
                ("u_trust", None),
                ("u_password", Some("clear pw")),
                ("u_md5", Some("md5 pw")),
                ("u_scram", Some("scram pw")),
            ] {
                let mut cfg = config(&c, user);
                cfg.password = pw.map(str::to_owned);
                let mut client = ReplicationClient::connect(&cfg)
                    .await
                    .unwrap_or_else(|e| panic!("{label} {user}: {e}"));
                let sys = client.identify_system().await.unwrap();
                assert_eq!(sys.timeline, 1);
                assert_eq!(sys.dbname.as_deref(), Some("postgres"));
                assert!(client.server_major_version().unwrap() >= 15);
                if let Some(pw) = pw {
                    // Wrong password: SQLSTATE 28P01, not transient.
                    let mut bad = cfg.clone();
                    bad.password = Some(format!("{pw}x"));
                    let e = ReplicationClient::connect(&bad).await.unwrap_err();
                    assert_eq!(e.code(), Some("28P01"), "{label} {user}: {e}");
                    assert!(!e.is_transient());
                    // No password at all.
                    let mut none = cfg.clone();
                    none.password = None;
                    none.passfile = Some(c.dir.join("no-such-pgpass"));
                    assert!(matches!(
                        ReplicationClient::connect(&none).await.unwrap_err(),
                        Error::PasswordMissing
                    ));
                }
            }
            // The password file supplies a missing password.
            let pgpass = c.dir.join("pgpass");
            std::fs::write(
                &pgpass,
                format!("127.0.0.1:{}:*:u_scram:scram pw\n", c.port),
            )
            .unwrap();
            let mut cfg = config(&c, "u_scram");
            cfg.passfile = Some(pgpass);
            ReplicationClient::connect(&cfg)
                .await
                .unwrap()
                .identify_system()
                .await
                .unwrap();
        });
    }
}

/// The test clusters' own start-up: a port taken between choosing it and
/// the server's bind() (CI once lost a run to that) costs a retry, not a
/// failed test. Also checks that chosen ports stay below the range the
/// kernel gives client sockets.
#[test]
fn test_server_moves_to_another_port_when_its_port_is_taken() {
    let (label, bin) = support::servers().remove(0);
    let taken = std::net::TcpListener::bind(("127.0.0.1", support::free_port())).unwrap();
    let port = taken.local_addr().unwrap().port();
    let floor = support::ephemeral_port_floor();
    assert!(
        !support::room_below_ephemeral_range() || port < floor,
        "{port} is in the ephemeral range from {floor}"
    );
    let c = Cluster::start(
        label,
        &bin,
        Options {
            port: Some(port),
            ..Options::default()
        },
    );
    assert_ne!(c.port, port);
    assert_eq!(c.query("SHOW port"), c.port.to_string());
    assert!(c
        .server_log()
        .contains("could not create any TCP/IP sockets"));
}

#[test]
fn unix_domain_socket() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        block_on(async {
            // Key/value with sslmode=require (ignored over a socket, as in
            // libpq) and a URI with the directory percent-encoded.
            let dir = c.dir.display().to_string();
            let kv = format!("host={dir} port={} user=postgres dbname=postgres sslmode=require application_name=via_socket", c.port);
            let uri = format!(
                "postgresql://{}:{}/postgres?user=postgres",
                dir.replace('/', "%2F"),
                c.port
            );
            for conninfo in [kv, uri] {
                let cfg: pgwal::Config = conninfo.parse().unwrap();
                assert!(cfg.unix_socket().is_some(), "{conninfo}");
                let mut client = ReplicationClient::connect(&cfg)
                    .await
                    .unwrap_or_else(|e| panic!("{label} {conninfo}: {e}"));
                assert_eq!(client.identify_system().await.unwrap().timeline, 1);
                let rows = client
                    .simple_query("SELECT coalesce(client_addr::text, 'local'), ssl FROM pg_stat_activity JOIN pg_stat_ssl USING (pid) WHERE pid = pg_backend_pid()")
                    .await
                    .unwrap();
                assert_eq!(
                    rows[0].get_index(0),
                    Some("local"),
                    "{label}: not over the socket"
                );
                assert_eq!(rows[0].get_index(1), Some("f"));
            }
            // A directory without the socket: a clear I/O error naming the path.
            let cfg: pgwal::Config = format!("host={dir}/nowhere port={} user=postgres", c.port)
                .parse()
                .unwrap();
            let e = ReplicationClient::connect(&cfg).await.unwrap_err();
            assert!(e.to_string().contains("nowhere/.s.PGSQL."), "{e}");
        });
    }
}

#[test]
fn replication_commands() {
    for (label, bin) in support::servers() {
        let c = Cluster::start(label, &bin, Options::default());
        block_on(async {
            let cfg = config(&c, "postgres");
            let mut client = ReplicationClient::connect(&cfg).await.unwrap();
            let slot = client
                .create_logical_slot(
                    "cmd_slot",
                    &CreateSlotOptions::new()
                        .two_phase(true)
                        .snapshot(SlotSnapshot::Export),
                )
                .await
                .unwrap();
            assert_eq!(slot.slot_name, "cmd_slot");
            assert!(slot.snapshot_name.is_some());
            assert_eq!(slot.output_plugin.as_deref(), Some("pgoutput"));
            assert!(slot.consistent_point > pgwal::Lsn::INVALID);
            let tmp = client
                .create_logical_slot("tmp_slot", &CreateSlotOptions::new().temporary(true))
                .await
                .unwrap();
            assert_eq!(tmp.snapshot_name, None);
            assert_eq!(
                client.slot_confirmed_flush("cmd_slot").await.unwrap(),
                Some(slot.consistent_point)
            );
            // SQL works on a logical replication connection too.
            let rows = client
                .simple_query("SELECT slot_name, two_phase FROM pg_replication_slots ORDER BY 1")
                .await
                .unwrap();
            assert_eq!(rows.len(), 2);
            assert_eq!(rows[0].get("slot_name"), Some("cmd_slot"));
            assert_eq!(rows[0].get("two_phase"), Some("t"));
            // Errors carry SQLSTATE.
            let e = client.drop_slot("no_such_slot", false).await.unwrap_err();
            assert_eq!(e.code(), Some("42704"), "{e}");
            let e = client
                .create_logical_slot("cmd_slot", &CreateSlotOptions::new())
                .await
                .unwrap_err();
            assert_eq!(e.code(), Some("42710"), "{e}");
            assert!(client.timeline_history(1).await.is_err());
            assert!(matches!(
                client.drop_slot("Bad-Name", false).await,
                Err(Error::Config { .. })
            ));
            if c.major >= 17 {
                client
                    .alter_slot("cmd_slot", Some(true), None)
                    .await
                    .unwrap();
                let rows = client
                    .simple_query(
                        "SELECT failover FROM pg_replication_slots WHERE slot_name = 'cmd_slot'",
                    )
                    .await
                    .unwrap();
                assert_eq!(rows[0].get_index(0), Some("t"));
            }
            client.drop_slot("cmd_slot", true).await.unwrap();
            // A physical slot for READ_REPLICATION_SLOT.
            client
                .simple_query("SELECT pg_create_physical_replication_slot('phys', true)")
                .await
                .unwrap();
            let (kind, restart, _tli) = client.read_slot("phys").await.unwrap().unwrap();
            assert_eq!(kind, "physical");
            assert!(restart > pgwal::Lsn::INVALID);
            assert_eq!(client.read_slot("absent").await.unwrap(), None);
        });
    }
}
