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

/// How `slot list` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ListFormat {
    /// One JSON object per slot and line.
    Json,
    /// An aligned table for people.
    Table,
}

/// The columns `slot list` shows, where the server has them (e.g.
/// `invalidation_reason`, `inactive_since`, `failover` and `synced` from 17
/// on), in this order; `lag_bytes` is computed.
const COLUMNS: &[&str] = &[
    "slot_name",
    "plugin",
    "slot_type",
    "database",
    "temporary",
    "active",
    "active_pid",
    "restart_lsn",
    "confirmed_flush_lsn",
    "wal_status",
    "safe_wal_size",
    "two_phase",
    "failover",
    "synced",
    "conflicting",
    "invalidation_reason",
    "inactive_since",
];

const BOOLEANS: &[&str] = &[
    "temporary",
    "active",
    "two_phase",
    "failover",
    "synced",
    "conflicting",
];
const INTEGERS: &[&str] = &["active_pid", "safe_wal_size", "lag_bytes"];

/// The slots of the server with their health: how far behind the server's
/// WAL each is (`lag_bytes`: from its confirmed position, or its restart
/// position for a physical slot, to the current WAL position, or on a
/// standby the replayed one), whether its WAL is still there (`wal_status`,
/// `safe_wal_size`) and why it was invalidated.
pub(crate) async fn list(config: Config, format: ListFormat) -> Result<()> {
    let mut c = ReplicationClient::connect(&config).await?;
    let present: Vec<String> = c
        .simple_query(
            "SELECT attname FROM pg_catalog.pg_attribute \
             WHERE attrelid = 'pg_catalog.pg_replication_slots'::pg_catalog.regclass AND attnum > 0",
        )
        .await?
        .iter()
        .filter_map(|r| r.get_index(0).map(str::to_owned))
        .collect();
    let select: Vec<String> = COLUMNS
        .iter()
        .filter(|c| present.iter().any(|p| p == *c))
        .map(|c| format!("s.{c}"))
        .collect();
    let rows = c
        .simple_query(&format!(
            "SELECT {}, pg_catalog.pg_wal_lsn_diff(CASE WHEN pg_catalog.pg_is_in_recovery() \
             THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END, \
             COALESCE(s.confirmed_flush_lsn, s.restart_lsn))::bigint AS lag_bytes \
             FROM pg_catalog.pg_replication_slots s ORDER BY s.slot_name",
            select.join(", ")
        ))
        .await?;
    let slots: Vec<serde_json::Map<String, serde_json::Value>> = rows
        .iter()
        .map(|r| {
            r.columns()
                .iter()
                .enumerate()
                .map(|(i, col)| {
                    let v = match r.get_index(i) {
                        None => serde_json::Value::Null,
                        Some(b) if BOOLEANS.contains(&col.as_str()) => json!(b == "t"),
                        Some(n) if INTEGERS.contains(&col.as_str()) => {
                            n.parse::<i64>().map(|n| json!(n)).unwrap_or(json!(n))
                        }
                        Some(s) => json!(s),
                    };
                    (col.clone(), v)
                })
                .collect()
        })
        .collect();
    match format {
        ListFormat::Json => {
            for s in slots {
                println!("{}", serde_json::Value::Object(s));
            }
        }
        ListFormat::Table => print!("{}", table(&slots)),
    }
    Ok(())
}

/// Bytes as people read them (1536 -> "1.5 kB").
fn human_bytes(n: i64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v.abs() >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn table(slots: &[serde_json::Map<String, serde_json::Value>]) -> String {
    const HEAD: &[(&str, &str)] = &[
        ("slot_name", "slot"),
        ("plugin", "plugin"),
        ("active_pid", "active pid"),
        ("restart_lsn", "restart"),
        ("confirmed_flush_lsn", "confirmed"),
        ("lag_bytes", "lag"),
        ("wal_status", "wal status"),
        ("safe_wal_size", "safe wal size"),
        ("invalidation_reason", "invalidated"),
        ("inactive_since", "inactive since"),
        ("failover", "failover"),
        ("synced", "synced"),
    ];
    let cells: Vec<Vec<String>> = slots
        .iter()
        .map(|s| {
            HEAD.iter()
                .map(|(k, _)| match s.get(*k) {
                    None | Some(serde_json::Value::Null) => "-".to_owned(),
                    Some(serde_json::Value::Number(n))
                        if matches!(*k, "lag_bytes" | "safe_wal_size") =>
                    {
                        human_bytes(n.as_i64().unwrap_or_default())
                    }
                    Some(serde_json::Value::String(v)) => v.clone(),
                    Some(v) => v.to_string(),
                })
                .collect()
        })
        .collect();
    let widths: Vec<usize> = HEAD
        .iter()
        .enumerate()
        .map(|(i, (_, h))| cells.iter().map(|r| r[i].len()).fold(h.len(), usize::max))
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, vals: Vec<&str>| {
        let l: Vec<String> = vals
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        out.push_str(l.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut out, HEAD.iter().map(|(_, h)| *h).collect());
    for r in &cells {
        line(&mut out, r.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_for_people() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 kB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.0 GB");
    }

    #[test]
    fn table_aligns_and_marks_missing_values() {
        let s: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"slot_name": "app", "plugin": "pgoutput", "active_pid": null, "lag_bytes": 2048,
                "wal_status": "reserved", "failover": false}"#,
        )
        .unwrap();
        let t = table(&[s]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("slot  plugin    active pid"), "{t}");
        assert!(lines[1].starts_with("app   pgoutput  -"), "{t}");
        assert!(
            lines[1].contains("2.0 kB") && lines[1].contains("reserved"),
            "{t}"
        );
    }
}
