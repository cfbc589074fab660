//! `pgwal snapshot`: the signal that starts a Kafka sink's snapshot of tables
//! while it streams (see `pgwal_kafka::snapshot`).

use pgwal::{Config, ReplicationClient, Result};

/// Sends the signal for `tables` (to the sink on `slot` only, if given)
/// and prints its position.
pub(crate) async fn run(config: Config, tables: &[String], slot: Option<&str>) -> Result<()> {
    let mut c = ReplicationClient::connect_sql(&config).await?;
    let rows = c
        .simple_query(&pgwal_kafka::snapshot::signal_sql(tables, slot))
        .await?;
    let lsn = rows
        .first()
        .and_then(|r| r.get_index(0))
        .unwrap_or_default()
        .to_owned();
    println!(
        "{}",
        serde_json::json!({"type": "snapshot_signal", "lsn": lsn, "tables": tables, "slot": slot})
    );
    Ok(())
}
