//! `pgwal slot create|drop|list`.

use pgwal::{Config, CreateSlotOptions, ReplicationClient, Result};
use serde_json::json;

pub(crate) async fn create(
    config: Config,
    name: &str,
    two_phase: bool,
    failover: bool,
) -> Result<()> {
    let mut c = ReplicationClient::connect(&config).await?;
    let info = c
        .create_logical_slot(
            name,
            &CreateSlotOptions::new()
                .two_phase(two_phase)
                .failover(failover),
        )
        .await?;
    println!(
        "{}",
        json!({"slot_name": info.slot_name, "consistent_point": info.consistent_point.to_string(), "output_plugin": info.output_plugin})
    );
    Ok(())
}

pub(crate) async fn drop(config: Config, name: &str, wait: bool) -> Result<()> {
    ReplicationClient::connect(&config)
        .await?
        .drop_slot(name, wait)
        .await
}

pub(crate) async fn list(config: Config) -> Result<()> {
    let mut c = ReplicationClient::connect(&config).await?;
    let rows = c
        .simple_query(
            "SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid, \
             restart_lsn, confirmed_flush_lsn, wal_status, two_phase \
             FROM pg_catalog.pg_replication_slots ORDER BY slot_name",
        )
        .await?;
    for r in rows {
        let mut o = serde_json::Map::new();
        for (i, col) in r.columns().iter().enumerate() {
            let v = match (col.as_str(), r.get_index(i)) {
                (_, None) => serde_json::Value::Null,
                ("temporary" | "active" | "two_phase", Some(b)) => json!(b == "t"),
                ("active_pid", Some(p)) => p.parse::<i64>().map(|p| json!(p)).unwrap_or(json!(p)),
                (_, Some(s)) => json!(s),
            };
            o.insert(col.clone(), v);
        }
        println!("{}", serde_json::Value::Object(o));
    }
    Ok(())
}
