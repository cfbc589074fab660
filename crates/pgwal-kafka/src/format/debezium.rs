//! Debezium's PostgreSQL envelope and its value types, as its JSON
//! converter writes them with `schemas.enable=false` (default
//! `time.precision.mode=adaptive`, `binary.handling.mode=bytes`).
//!
//! | PostgreSQL | JSON |
//! |---|---|
//! | bool, int2/4/8, oid, float4/8 | boolean, number (NaN and ±Infinity as strings) |
//! | numeric | [`DecimalMode`] |
//! | text, varchar, char, name, json, jsonb, uuid, inet, cidr, macaddr, ranges, money, others | string (the server's text) |
//! | bytea | base64 string |
//! | date | days since 1970-01-01 |
//! | time(p) | p ≤ 3: milliseconds since midnight; else microseconds |
//! | timetz | `HH:MM:SS[.f]Z` in UTC |
//! | timestamp(p) | p ≤ 3: milliseconds since 1970; else microseconds |
//! | timestamptz | `YYYY-MM-DDTHH:MM:SS[.f]Z` |
//! | interval | microseconds, a month as 365.25 / 12 days |
//! | arrays | arrays of the element's form |
//!
//! Infinite dates and timestamps become null. `money` stays its
//! locale-dependent text (Debezium: a decimal of scale 2).

use base64::Engine;
use pgwal::protocol::pgoutput::{ColumnValue, Relation, RelationColumn};
use pgwal::types::{decode, oid, Value as Pg};
use pgwal_protocol::{Lsn, PgTimestamp};
use serde_json::{json, Number, Value};

use super::{temporal, DecimalMode, TxInfo, TxOrder};

/// Days from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
const EPOCH_DAYS: i64 = 10_957;
const EPOCH_MICROS: i64 = EPOCH_DAYS * 86_400_000_000;

fn bad(what: &str, text: &str) -> pgwal::Error {
    pgwal::Error::Column {
        column: what.to_owned(),
        reason: format!("cannot read {text:?}"),
    }
}

/// The declared fractional-second precision (6 when none is declared).
fn precision(typmod: i32) -> i32 {
    if typmod < 0 {
        6
    } else {
        typmod
    }
}

/// The envelope; `source.name` and `source.db` from `server_name` and
/// `database`; `lsn` is the change's own position, `orders` its
/// `(total_order, data_collection_order)` in the transaction when the
/// transaction block is wanted.
///
/// `source.lsn` is the change's position, as Debezium's. `source.sequence`
/// is `["<commit LSN>","<change LSN>"]`: Debezium puts the last commit
/// *before* the transaction first; either way the pair sorts records in
/// the stream's order (transactions in commit order, changes in WAL order
/// within one), which the change LSN alone does not. The transaction block
/// (Debezium's `provide.transaction.metadata`) has the `id`
/// `"<xid>:<commit LSN>"` (an xid alone repeats after wraparound).
#[allow(clippy::too_many_arguments)]
pub(super) fn envelope(
    (server_name, database): (&str, &str),
    op: &str,
    rel: &Relation,
    tx: &TxInfo,
    (lsn, orders): (Lsn, Option<(u64, u64)>),
    before: Value,
    after: Value,
    now: PgTimestamp,
) -> Value {
    let ms = millis;
    json!({
        "before": before,
        "after": after,
        "source": {
            "version": concat!("pgwal-kafka ", env!("CARGO_PKG_VERSION")),
            "connector": "postgresql",
            "name": server_name,
            "ts_ms": ms(tx.commit_time),
            "snapshot": "false",
            "db": database,
            "sequence": sequence(tx.commit_lsn, lsn),
            "schema": rel.namespace,
            "table": rel.name,
            "txId": tx.xid,
            "lsn": lsn.0,
            "xmin": null,
        },
        "op": op,
        "ts_ms": ms(now),
        "transaction": orders.map(|(total, table)| transaction(tx, total, table)),
    })
}

fn transaction(tx: &TxInfo, total_order: u64, table_order: u64) -> Value {
    json!({
        "id": transaction_id(tx),
        "total_order": total_order,
        "data_collection_order": table_order,
    })
}

fn sequence(commit: Lsn, lsn: Lsn) -> String {
    format!("[\"{}\",\"{}\"]", commit.0, lsn.0)
}

fn transaction_id(tx: &TxInfo) -> String {
    format!("{}:{}", tx.xid, tx.commit_lsn.0)
}

/// Sets the commit fields of an envelope written before the commit, and
/// its transaction block's orders from `order` when it has one.
pub(super) fn stamp(v: &mut Value, tx: &TxInfo, order: Option<&mut TxOrder>) {
    let lsn = Lsn(v["source"]["lsn"].as_u64().unwrap_or(0));
    v["source"]["ts_ms"] = json!(millis(tx.commit_time));
    v["source"]["txId"] = json!(tx.xid);
    v["source"]["sequence"] = json!(sequence(tx.commit_lsn, lsn));
    if let Some(order) = order {
        let (total, table) = order.next(
            v["source"]["schema"].as_str().unwrap_or_default(),
            v["source"]["table"].as_str().unwrap_or_default(),
        );
        v["transaction"] = transaction(tx, total, table);
    }
}

fn millis(t: PgTimestamp) -> i64 {
    (t.0 + EPOCH_MICROS).div_euclid(1000)
}

/// One column's value.
pub(super) fn value(
    col: &RelationColumn,
    v: &ColumnValue,
    decimal: DecimalMode,
) -> Result<Value, pgwal::Error> {
    let text = match v {
        ColumnValue::Text(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    let decoded = decode(col.type_oid, v)?;
    typed(
        col.type_oid,
        col.type_modifier,
        &decoded,
        text.as_deref(),
        decimal,
    )
}

fn typed(
    type_oid: u32,
    typmod: i32,
    v: &Pg,
    text: Option<&str>,
    decimal: DecimalMode,
) -> Result<Value, pgwal::Error> {
    // The server's text; without it (binary mode, array elements) only
    // what pgwal decoded to that same text, never a Rust rendering.
    let raw = |v: &Pg| -> Result<Value, pgwal::Error> {
        Ok(Value::String(match (text, v) {
            (Some(t), _) => t.to_owned(),
            (None, Pg::Text(s) | Pg::Numeric(s)) => s.clone(),
            (None, Pg::Json(j)) => j.to_string(),
            (None, Pg::Uuid(u)) => pgwal::types::uuid_text(u),
            (None, _) => {
                return Err(pgwal::Error::Column {
                    column: format!("type {type_oid}"),
                    reason: "no Debezium form for this value outside text mode; stream with \
                             binary off"
                        .into(),
                })
            }
        }))
    };
    Ok(match v {
        Pg::Null => Value::Null,
        Pg::Bool(b) => Value::Bool(*b),
        Pg::Int(i) => Value::from(*i),
        Pg::Float(f) => Number::from_f64(*f).map_or_else(
            || {
                Value::String(
                    if f.is_nan() {
                        "NaN"
                    } else if *f > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    }
                    .into(),
                )
            },
            Value::Number,
        ),
        Pg::Numeric(s) => numeric(s, typmod, decimal)?,
        Pg::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        Pg::Date(d) if *d == i32::MAX || *d == i32::MIN => Value::Null,
        Pg::Date(d) => Value::from(i64::from(*d) + EPOCH_DAYS),
        Pg::Timestamp(t) if t.0 == i64::MAX || t.0 == i64::MIN => Value::Null,
        Pg::Timestamp(t) if type_oid == oid::TIMESTAMPTZ => {
            let iso = t.to_iso8601();
            // "....SS.ffffffZ" without trailing zeros
            let (head, frac) = iso
                .trim_end_matches('Z')
                .split_once('.')
                .unwrap_or((&iso, ""));
            let mut out = head.to_owned();
            temporal::push_fraction(&mut out, frac.parse().unwrap_or(0));
            out.push('Z');
            Value::String(out)
        }
        Pg::Timestamp(t) => {
            let micros = t.0 + EPOCH_MICROS;
            if precision(typmod) <= 3 {
                Value::from(micros.div_euclid(1000))
            } else {
                Value::from(micros)
            }
        }
        Pg::Array(items) => {
            let elem = oid::array_element(type_oid).unwrap_or(oid::TEXT);
            Value::Array(
                items
                    .iter()
                    .map(|i| typed(elem, typmod, i, None, decimal))
                    .collect::<Result<_, _>>()?,
            )
        }
        Pg::Text(s) => match type_oid {
            oid::TIME => {
                let micros = temporal::time_micros(s).ok_or_else(|| bad("time", s))?;
                if precision(typmod) <= 3 {
                    Value::from(micros / 1000)
                } else {
                    Value::from(micros)
                }
            }
            oid::TIMETZ => Value::String(temporal::timetz_utc(s).ok_or_else(|| bad("timetz", s))?),
            oid::INTERVAL => {
                Value::from(temporal::interval_micros(s).ok_or_else(|| bad("interval", s))?)
            }
            _ => Value::String(s.clone()),
        },
        // json and jsonb (Debezium's Json is the document's text), uuid, and
        // the rest
        _ => raw(v)?,
    })
}

/// A numeric in the chosen [`DecimalMode`].
fn numeric(s: &str, typmod: i32, mode: DecimalMode) -> Result<Value, pgwal::Error> {
    let finite = !matches!(s, "NaN" | "Infinity" | "-Infinity");
    Ok(match mode {
        DecimalMode::String => Value::String(s.to_owned()),
        DecimalMode::Double => match s.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => Value::Number(n),
            None => Value::String(s.to_owned()),
        },
        DecimalMode::Precise if !finite => Value::Null,
        DecimalMode::Precise => {
            let digits_after = s.split_once('.').map_or(0, |(_, f)| f.len());
            // numeric(p, s): typmod = ((p << 16) | s) + 4
            let declared = (typmod >= 4).then(|| ((typmod - 4) & 0xffff) as usize);
            let scale = declared.unwrap_or(digits_after).max(digits_after);
            let unscaled = unscaled_bytes(s, scale).ok_or_else(|| bad("numeric", s))?;
            let b64 = base64::engine::general_purpose::STANDARD.encode(unscaled);
            match declared {
                Some(_) => Value::String(b64),
                None => json!({"scale": scale, "value": b64}),
            }
        }
    })
}

/// `s` × 10^`scale` as big-endian two's-complement bytes (Java's
/// `BigInteger.toByteArray`: the fewest bytes that keep the sign).
fn unscaled_bytes(s: &str, scale: usize) -> Option<Vec<u8>> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > scale {
        return None;
    }
    let digits: Vec<u8> = int
        .bytes()
        .chain(frac.bytes())
        .chain(std::iter::repeat_n(b'0', scale - frac.len()))
        .map(|b| b.is_ascii_digit().then(|| b - b'0'))
        .collect::<Option<_>>()?;
    // decimal digits -> base-256 magnitude, least significant byte first
    let mut mag: Vec<u8> = Vec::new();
    for d in digits {
        let mut carry = u32::from(d);
        for byte in mag.iter_mut() {
            let x = u32::from(*byte) * 10 + carry;
            *byte = (x & 0xff) as u8;
            carry = x >> 8;
        }
        while carry > 0 {
            mag.push((carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    mag.reverse();
    if mag.is_empty() {
        mag.push(0);
    }
    if mag[0] & 0x80 != 0 {
        mag.insert(0, 0);
    }
    if neg && mag.iter().any(|b| *b != 0) {
        // two's complement: invert and add one
        for b in mag.iter_mut() {
            *b = !*b;
        }
        for b in mag.iter_mut().rev() {
            let (x, overflow) = b.overflowing_add(1);
            *b = x;
            if !overflow {
                break;
            }
        }
        // drop a redundant leading 0xff
        while mag.len() > 1 && mag[0] == 0xff && mag[1] & 0x80 != 0 {
            mag.remove(0);
        }
    }
    Some(mag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unscaled_like_java_biginteger() {
        // new BigInteger("12345").toByteArray() = [0x30, 0x39]
        assert_eq!(unscaled_bytes("123.45", 2).unwrap(), [0x30, 0x39]);
        assert_eq!(unscaled_bytes("0", 0).unwrap(), [0]);
        assert_eq!(unscaled_bytes("128", 0).unwrap(), [0x00, 0x80]);
        assert_eq!(unscaled_bytes("-1", 0).unwrap(), [0xff]);
        assert_eq!(unscaled_bytes("-128", 0).unwrap(), [0x80]);
        assert_eq!(unscaled_bytes("-129", 0).unwrap(), [0xff, 0x7f]);
        assert_eq!(unscaled_bytes("-0.5", 2).unwrap(), [0xce]); // -50
        assert_eq!(unscaled_bytes("1.5", 0), None);
        // 2^64 = 18446744073709551616
        assert_eq!(
            unscaled_bytes("18446744073709551616", 0).unwrap(),
            [1, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn numeric_modes() {
        // numeric(10,2): typmod (10 << 16 | 2) + 4
        let tm = (10 << 16 | 2) + 4;
        assert_eq!(
            numeric("123.45", tm, DecimalMode::Precise).unwrap(),
            json!("MDk=")
        );
        assert_eq!(
            numeric("123.45", -1, DecimalMode::Precise).unwrap(),
            json!({"scale": 2, "value": "MDk="})
        );
        assert_eq!(
            numeric("NaN", tm, DecimalMode::Precise).unwrap(),
            Value::Null
        );
        assert_eq!(
            numeric("123.45", tm, DecimalMode::String).unwrap(),
            json!("123.45")
        );
        assert_eq!(
            numeric("123.45", tm, DecimalMode::Double).unwrap(),
            json!(123.45)
        );
    }

    #[test]
    fn temporal_values() {
        let t = |oid: u32, typmod: i32, v: Pg, text: &str| {
            typed(oid, typmod, &v, Some(text), DecimalMode::Precise).unwrap()
        };
        assert_eq!(t(oid::DATE, -1, Pg::Date(0), "2000-01-01"), json!(10957));
        assert_eq!(
            t(
                oid::TIMESTAMP,
                -1,
                Pg::Timestamp(PgTimestamp(1_500_000)),
                "x"
            ),
            json!(946_684_801_500_000i64)
        );
        assert_eq!(
            t(
                oid::TIMESTAMP,
                3,
                Pg::Timestamp(PgTimestamp(1_500_000)),
                "x"
            ),
            json!(946_684_801_500i64)
        );
        assert_eq!(
            t(
                oid::TIMESTAMPTZ,
                -1,
                Pg::Timestamp(PgTimestamp(1_500_000)),
                "x"
            ),
            json!("2000-01-01T00:00:01.5Z")
        );
        assert_eq!(
            t(oid::TIMESTAMPTZ, -1, Pg::Timestamp(PgTimestamp(0)), "x"),
            json!("2000-01-01T00:00:00Z")
        );
        assert_eq!(
            t(oid::TIME, -1, Pg::Text("00:00:01.5".into()), "x"),
            json!(1_500_000)
        );
        assert_eq!(
            t(oid::TIME, 0, Pg::Text("00:00:01.5".into()), "x"),
            json!(1500)
        );
        assert_eq!(
            t(oid::DATE, -1, Pg::Date(i32::MAX), "infinity"),
            Value::Null
        );
        assert_eq!(t(oid::FLOAT8, -1, Pg::Float(f64::NAN), "NaN"), json!("NaN"));
    }

    #[test]
    fn array_elements_without_text() {
        let arr = |elem: Pg| {
            typed(
                2951,
                -1,
                &Pg::Array(vec![elem]),
                Some("{...}"),
                DecimalMode::Precise,
            )
        };
        let mut u = [0u8; 16];
        u[15] = 1;
        assert_eq!(
            arr(Pg::Uuid(u)).unwrap(),
            json!(["00000000-0000-0000-0000-000000000001"])
        );
        // never a Rust rendering of a value pgwal has no text for
        assert!(typed(oid::TEXT, -1, &Pg::Money(1234), None, DecimalMode::Precise).is_err());
    }
}
