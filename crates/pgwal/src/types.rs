//! Typed decoding of column values (text and binary formats).

mod range;

pub use range::Range;

use pgwal_protocol::pgoutput::ColumnValue;
use pgwal_protocol::PgTimestamp;

use crate::error::{Error, Result};

/// OIDs of the built-in types this module decodes.
#[allow(missing_docs)]
pub mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const CHAR: u32 = 18;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
    pub const CIDR: u32 = 650;
    pub const MACADDR8: u32 = 774;
    pub const MACADDR: u32 = 829;
    pub const INET: u32 = 869;
    pub const TIME: u32 = 1083;
    pub const INTERVAL: u32 = 1186;
    pub const TIMETZ: u32 = 1266;
    pub const INT2VECTOR: u32 = 22;
    pub const TID: u32 = 27;
    pub const XID: u32 = 28;
    pub const CID: u32 = 29;
    pub const OIDVECTOR: u32 = 30;
    pub const XML: u32 = 142;
    pub const MONEY: u32 = 790;
    pub const BIT: u32 = 1560;
    pub const VARBIT: u32 = 1562;
    pub const REFCURSOR: u32 = 1790;
    pub const TXID_SNAPSHOT: u32 = 2970;
    pub const JSONPATH: u32 = 4072;
    pub const PG_SNAPSHOT: u32 = 5038;
    pub const XID8: u32 = 5069;
    pub const INT4RANGE: u32 = 3904;
    pub const NUMRANGE: u32 = 3906;
    pub const TSRANGE: u32 = 3908;
    pub const TSTZRANGE: u32 = 3910;
    pub const DATERANGE: u32 = 3912;
    pub const INT8RANGE: u32 = 3926;
    pub const INT4MULTIRANGE: u32 = 4451;
    pub const NUMMULTIRANGE: u32 = 4532;
    pub const TSMULTIRANGE: u32 = 4533;
    pub const TSTZMULTIRANGE: u32 = 4534;
    pub const DATEMULTIRANGE: u32 = 4535;
    pub const INT8MULTIRANGE: u32 = 4536;

    /// The element type of a built-in array type.
    pub fn array_element(array: u32) -> Option<u32> {
        Some(match array {
            1000 => BOOL,
            1001 => BYTEA,
            1003 => NAME,
            1005 => INT2,
            1007 => INT4,
            1009 => TEXT,
            1014 => BPCHAR,
            1015 => VARCHAR,
            1016 => INT8,
            1021 => FLOAT4,
            1022 => FLOAT8,
            1028 => OID,
            1182 => DATE,
            1115 => TIMESTAMP,
            1185 => TIMESTAMPTZ,
            1231 => NUMERIC,
            2951 => UUID,
            199 => JSON,
            3807 => JSONB,
            3905 => INT4RANGE,
            3907 => NUMRANGE,
            3909 => TSRANGE,
            3911 => TSTZRANGE,
            3913 => DATERANGE,
            3927 => INT8RANGE,
            _ => return None,
        })
    }
}

/// A decoded column value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An unchanged TOAST value the server did not send.
    UnchangedToast,
    /// `bool`.
    Bool(bool),
    /// `int2`, `int4`, `int8`, `oid`.
    Int(i64),
    /// `float4`, `float8`.
    Float(f64),
    /// `numeric`, in its exact decimal text form (`NaN`, `Infinity` included).
    Numeric(String),
    /// Text types, and any type without a dedicated decoder (its text form).
    Text(String),
    /// `bytea`.
    Bytes(Vec<u8>),
    /// `json`, `jsonb`.
    Json(serde_json::Value),
    /// `uuid`.
    Uuid([u8; 16]),
    /// `timestamp` / `timestamptz` (UTC; `i64::MIN`/`MAX` for ±infinity).
    Timestamp(PgTimestamp),
    /// `date`, days since 2000-01-01.
    Date(i32),
    /// A one- or multi-dimensional array (nested for more dimensions);
    /// also `int2vector` and `oidvector`.
    Array(Vec<Value>),
    /// A built-in range type, bounds decoded as its subtype.
    Range(Box<Range>),
    /// A built-in multirange type (14+).
    Multirange(Vec<Range>),
    /// `money` in binary mode: the amount in the currency's smallest unit
    /// (cents where `lc_monetary` has two fraction digits). Its text form
    /// depends on the server's locale and stays [`Value::Text`].
    Money(i64),
}

/// A `uuid` in its text form (`8-4-4-4-12` lowercase hex).
///
/// ```
/// let mut u = [0u8; 16];
/// u[15] = 1;
/// assert_eq!(pgwal::types::uuid_text(&u), "00000000-0000-0000-0000-000000000001");
/// ```
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn bad(what: &str, reason: impl Into<String>) -> Error {
    Error::Column {
        column: what.to_owned(),
        reason: reason.into(),
    }
}

/// Decodes `value` of type `type_oid`. Text values are expected in the
/// formats the stream's session uses (`DateStyle=ISO`, `TimeZone=UTC`,
/// `bytea_output=hex`, which [`ReplicationClient`](crate::ReplicationClient)
/// sets at startup).
///
/// ```
/// use bytes::Bytes;
/// use pgwal::protocol::pgoutput::ColumnValue;
/// use pgwal::types::{decode, oid, Value};
///
/// let v = decode(oid::INT4, &ColumnValue::Text(Bytes::from_static(b"42"))).unwrap();
/// assert_eq!(v, Value::Int(42));
/// let v = decode(1007, &ColumnValue::Text(Bytes::from_static(b"{1,NULL,3}"))).unwrap();
/// assert_eq!(v, Value::Array(vec![Value::Int(1), Value::Null, Value::Int(3)]));
/// ```
pub fn decode(type_oid: u32, value: &ColumnValue) -> Result<Value> {
    match value {
        ColumnValue::Null => Ok(Value::Null),
        ColumnValue::UnchangedToast => Ok(Value::UnchangedToast),
        ColumnValue::Text(b) => {
            let s = std::str::from_utf8(b).map_err(|_| bad("text value", "not UTF-8"))?;
            decode_text(type_oid, s)
        }
        ColumnValue::Binary(b) => decode_binary(type_oid, b),
        _ => Err(bad("value", "unknown column value kind")),
    }
}

fn decode_text(t: u32, s: &str) -> Result<Value> {
    if let Some(elem) = oid::array_element(t) {
        return parse_array(elem, s);
    }
    let int = |s: &str| {
        s.parse::<i64>()
            .map(Value::Int)
            .map_err(|e| bad(s, e.to_string()))
    };
    if let Some(sub) = range::subtype(t) {
        return Ok(Value::Range(Box::new(range::from_text(sub, s)?)));
    }
    if let Some(sub) = range::multirange_range(t).and_then(range::subtype) {
        return Ok(Value::Multirange(range::multirange_from_text(sub, s)?));
    }
    Ok(match t {
        oid::BOOL => Value::Bool(s == "t"),
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID | oid::XID | oid::CID | oid::XID8 => int(s)?,
        oid::INT2VECTOR | oid::OIDVECTOR => {
            Value::Array(s.split_whitespace().map(int).collect::<Result<_>>()?)
        }
        oid::FLOAT4 | oid::FLOAT8 => Value::Float(parse_float(s)?),
        oid::NUMERIC => Value::Numeric(s.to_owned()),
        oid::BYTEA => Value::Bytes(parse_hex_bytea(s)?),
        oid::JSON | oid::JSONB => {
            Value::Json(serde_json::from_str(s).map_err(|e| bad(s, e.to_string()))?)
        }
        oid::UUID => Value::Uuid(parse_uuid(s)?),
        oid::TIMESTAMP | oid::TIMESTAMPTZ => Value::Timestamp(parse_timestamp(s)?),
        oid::DATE => Value::Date(parse_date(s)?),
        _ => Value::Text(s.to_owned()),
    })
}

fn parse_float(s: &str) -> Result<f64> {
    match s {
        "NaN" => Ok(f64::NAN),
        "Infinity" => Ok(f64::INFINITY),
        "-Infinity" => Ok(f64::NEG_INFINITY),
        _ => s.parse().map_err(|_| bad(s, "not a float")),
    }
}

fn parse_hex_bytea(s: &str) -> Result<Vec<u8>> {
    let h = s
        .strip_prefix("\\x")
        .ok_or_else(|| bad(s, "bytea not in hex format"))?;
    if h.len() % 2 != 0 {
        return Err(bad(s, "odd hex length"));
    }
    (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).map_err(|_| bad(s, "bad hex digit")))
        .collect()
}

fn parse_uuid(s: &str) -> Result<[u8; 16]> {
    let h: String = s.chars().filter(|c| *c != '-').collect();
    let v = parse_hex_bytea(&format!("\\x{h}"))?;
    v.try_into().map_err(|_| bad(s, "uuid must have 16 bytes"))
}

/// Days from 2000-01-01 to the civil date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468 - 10_957
}

fn parse_date(s: &str) -> Result<i32> {
    match s {
        "infinity" => return Ok(i32::MAX),
        "-infinity" => return Ok(i32::MIN),
        _ => {}
    }
    let (s, bc) = match s.strip_suffix(" BC") {
        Some(x) => (x, true),
        None => (s, false),
    };
    let mut it = s.splitn(3, '-');
    let mut num = || -> Result<i64> {
        it.next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| bad(s, "bad date"))
    };
    let (y, m, d) = (num()?, num()?, num()?);
    let y = if bc { 1 - y } else { y };
    i32::try_from(days_from_civil(y, m, d)).map_err(|_| bad(s, "date out of range"))
}

fn parse_timestamp(s: &str) -> Result<PgTimestamp> {
    match s {
        "infinity" => return Ok(PgTimestamp(i64::MAX)),
        "-infinity" => return Ok(PgTimestamp(i64::MIN)),
        _ => {}
    }
    let (date, rest) = s.split_once(' ').ok_or_else(|| bad(s, "bad timestamp"))?;
    let days = i64::from(parse_date(date)?);
    // Time, then an optional zone offset (+HH, +HH:MM, +HH:MM:SS).
    let zpos = rest.find(['+', '-']);
    let (time, zone) = match zpos {
        Some(p) => (&rest[..p], Some(&rest[p..])),
        None => (rest, None),
    };
    let mut parts = time.splitn(3, ':');
    let mut num = || -> Result<&str> { parts.next().ok_or_else(|| bad(s, "bad time")) };
    let h: i64 = num()?.parse().map_err(|_| bad(s, "bad hour"))?;
    let mi: i64 = num()?.parse().map_err(|_| bad(s, "bad minute"))?;
    let sec = num()?;
    let (whole, frac) = sec.split_once('.').unwrap_or((sec, ""));
    let whole: i64 = whole.parse().map_err(|_| bad(s, "bad second"))?;
    let mut micros: i64 = 0;
    for (i, c) in frac.chars().take(6).enumerate() {
        micros += i64::from(c.to_digit(10).ok_or_else(|| bad(s, "bad fraction"))?)
            * 10i64.pow(5 - i as u32);
    }
    let mut offset = 0i64;
    if let Some(z) = zone {
        let sign = if z.starts_with('-') { -1 } else { 1 };
        let mut f = z[1..]
            .split(':')
            .map(|p| p.parse::<i64>().map_err(|_| bad(s, "bad zone")));
        let zh = f.next().transpose()?.unwrap_or(0);
        let zm = f.next().transpose()?.unwrap_or(0);
        let zs = f.next().transpose()?.unwrap_or(0);
        offset = sign * (zh * 3600 + zm * 60 + zs);
    }
    let secs = days * 86_400 + h * 3600 + mi * 60 + whole - offset;
    Ok(PgTimestamp(secs * 1_000_000 + micros))
}

/// Parses an array literal such as `{1,2,NULL,"a b"}` or `{{1,2},{3,4}}`.
fn parse_array(elem: u32, s: &str) -> Result<Value> {
    // Skip an optional dimension decoration: `[0:1]={...}`.
    let s = match s.find('=') {
        Some(p) if s.starts_with('[') => &s[p + 1..],
        _ => s,
    };
    let chars: Vec<char> = s.chars().collect();
    let mut pos = 0;
    let v = parse_array_level(elem, &chars, &mut pos, s)?;
    if pos != chars.len() {
        return Err(bad(s, "trailing characters after array"));
    }
    Ok(v)
}

fn parse_array_level(elem: u32, c: &[char], pos: &mut usize, src: &str) -> Result<Value> {
    if c.get(*pos) != Some(&'{') {
        return Err(bad(src, "expected '{'"));
    }
    *pos += 1;
    let mut items = Vec::new();
    if c.get(*pos) == Some(&'}') {
        *pos += 1;
        return Ok(Value::Array(items));
    }
    loop {
        match c.get(*pos) {
            Some('{') => items.push(parse_array_level(elem, c, pos, src)?),
            Some('"') => {
                *pos += 1;
                let mut v = String::new();
                loop {
                    match c.get(*pos) {
                        Some('\\') => {
                            v.push(*c.get(*pos + 1).ok_or_else(|| bad(src, "bad escape"))?);
                            *pos += 2;
                        }
                        Some('"') => {
                            *pos += 1;
                            break;
                        }
                        Some(ch) => {
                            v.push(*ch);
                            *pos += 1;
                        }
                        None => return Err(bad(src, "unterminated quoted element")),
                    }
                }
                items.push(decode_text(elem, &v)?);
            }
            Some(_) => {
                let start = *pos;
                while let Some(ch) = c.get(*pos) {
                    if *ch == ',' || *ch == '}' {
                        break;
                    }
                    *pos += 1;
                }
                let v: String = c[start..*pos].iter().collect();
                let v = v.trim();
                items.push(if v == "NULL" {
                    Value::Null
                } else {
                    decode_text(elem, v)?
                });
            }
            None => return Err(bad(src, "unterminated array")),
        }
        match c.get(*pos) {
            Some(',') => *pos += 1,
            Some('}') => {
                *pos += 1;
                return Ok(Value::Array(items));
            }
            _ => return Err(bad(src, "expected ',' or '}'")),
        }
    }
}

fn be<const N: usize>(b: &[u8], what: &str) -> Result<[u8; N]> {
    b.get(..N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| bad(what, "binary value too short"))
}

fn decode_binary(t: u32, b: &[u8]) -> Result<Value> {
    if oid::array_element(t).is_some() || t == oid::INT2VECTOR || t == oid::OIDVECTOR {
        return decode_binary_array(b);
    }
    if let Some(sub) = range::subtype(t) {
        return Ok(Value::Range(Box::new(range::from_binary(sub, b)?)));
    }
    if let Some(sub) = range::multirange_range(t).and_then(range::subtype) {
        return Ok(Value::Multirange(range::multirange_from_binary(sub, b)?));
    }
    let utf8 =
        |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| bad("binary value", "text not UTF-8"));
    Ok(match t {
        oid::BOOL => Value::Bool(be::<1>(b, "bool")?[0] != 0),
        oid::INT2 => Value::Int(i16::from_be_bytes(be(b, "int2")?).into()),
        oid::INT4 => Value::Int(i32::from_be_bytes(be(b, "int4")?).into()),
        oid::OID => Value::Int(u32::from_be_bytes(be(b, "oid")?).into()),
        oid::INT8 => Value::Int(i64::from_be_bytes(be(b, "int8")?)),
        oid::FLOAT4 => Value::Float(f32::from_be_bytes(be(b, "float4")?).into()),
        oid::FLOAT8 => Value::Float(f64::from_be_bytes(be(b, "float8")?)),
        oid::NUMERIC => Value::Numeric(binary_numeric(b)?),
        oid::BYTEA => Value::Bytes(b.to_vec()),
        oid::JSON => {
            Value::Json(serde_json::from_slice(b).map_err(|e| bad("json", e.to_string()))?)
        }
        oid::JSONB => {
            let body = b
                .strip_prefix(&[1])
                .ok_or_else(|| bad("jsonb", "unknown jsonb version"))?;
            Value::Json(serde_json::from_slice(body).map_err(|e| bad("jsonb", e.to_string()))?)
        }
        oid::UUID => Value::Uuid(be(b, "uuid")?),
        oid::TIMESTAMP | oid::TIMESTAMPTZ => {
            Value::Timestamp(PgTimestamp(i64::from_be_bytes(be(b, "timestamp")?)))
        }
        oid::DATE => Value::Date(i32::from_be_bytes(be(b, "date")?)),
        // their binary form is their text
        oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME => {
            Value::Text(String::from_utf8(b.to_vec()).map_err(|_| bad("text", "not UTF-8"))?)
        }
        // decoded to the text the server prints (DateStyle ISO, IntervalStyle postgres)
        oid::TIME => Value::Text(time_text(i64::from_be_bytes(be(b, "time")?))),
        oid::TIMETZ => {
            let micros = i64::from_be_bytes(be(b, "timetz")?);
            let zone = i32::from_be_bytes(be(b.get(8..).unwrap_or(&[]), "timetz")?);
            Value::Text(format!("{}{}", time_text(micros), zone_text(-zone)))
        }
        oid::INTERVAL => {
            let micros = i64::from_be_bytes(be(b, "interval")?);
            let days = i32::from_be_bytes(be(b.get(8..).unwrap_or(&[]), "interval")?);
            let months = i32::from_be_bytes(be(b.get(12..).unwrap_or(&[]), "interval")?);
            Value::Text(interval_text(months, days, micros))
        }
        oid::INET | oid::CIDR => Value::Text(inet_text(b)?),
        oid::MACADDR | oid::MACADDR8 => {
            let n = if t == oid::MACADDR { 6 } else { 8 };
            let bytes = b
                .get(..n)
                .filter(|_| b.len() == n)
                .ok_or_else(|| bad("macaddr", "wrong length"))?;
            Value::Text(
                bytes
                    .iter()
                    .map(|x| format!("{x:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
            )
        }
        oid::XID | oid::CID => Value::Int(u32::from_be_bytes(be(b, "xid")?).into()),
        oid::XID8 => Value::Int(
            i64::try_from(u64::from_be_bytes(be(b, "xid8")?))
                .map_err(|_| bad("xid8", "beyond i64"))?,
        ),
        oid::MONEY => Value::Money(i64::from_be_bytes(be(b, "money")?)),
        oid::CHAR => Value::Text(char_text(be::<1>(b, "char")?[0])),
        oid::TID => {
            let block = u32::from_be_bytes(be(b, "tid")?);
            let offset = u16::from_be_bytes(be(b.get(4..).unwrap_or(&[]), "tid")?);
            Value::Text(format!("({block},{offset})"))
        }
        oid::BIT | oid::VARBIT => Value::Text(bits_text(b)?),
        // sent as their text
        oid::XML | oid::REFCURSOR => Value::Text(utf8(b)?),
        oid::JSONPATH => match b.split_first() {
            Some((1, text)) => Value::Text(utf8(text)?),
            _ => return Err(bad("jsonpath", "unknown binary version")),
        },
        oid::TXID_SNAPSHOT | oid::PG_SNAPSHOT => Value::Text(snapshot_text(b)?),
        // never read other bytes as text: a type without a decoder (reg*,
        // geometric, pg_lsn, tsvector, extension types...) is an error
        _ => {
            return Err(bad(
                "binary value",
                format!("type OID {t} has no binary decoder; stream it in text mode (binary off)"),
            ))
        }
    })
}

/// `charout`: the byte itself, a backslash and three octal digits with the
/// high bit set, empty for 0.
fn char_text(c: u8) -> String {
    match c {
        0 => String::new(),
        c if c >= 0x80 => format!("\\{c:03o}"),
        c => char::from(c).to_string(),
    }
}

/// `bit_send`: the length in bits, then the bits, high first.
fn bits_text(b: &[u8]) -> Result<String> {
    let n = i32::from_be_bytes(be(b, "bit")?);
    let n = usize::try_from(n).map_err(|_| bad("bit", "negative length"))?;
    let bytes = &b[4..];
    if bytes.len() != n.div_ceil(8) {
        return Err(bad("bit", "length does not match the bytes"));
    }
    Ok((0..n)
        .map(|i| {
            if bytes[i / 8] & (0x80 >> (i % 8)) != 0 {
                '1'
            } else {
                '0'
            }
        })
        .collect())
}

/// `pg_snapshot_send`: the in-progress count, xmin, xmax, then each
/// in-progress xid; printed `xmin:xmax:xip,xip`.
fn snapshot_text(b: &[u8]) -> Result<String> {
    let n = i32::from_be_bytes(be(b, "snapshot")?);
    let n = usize::try_from(n).map_err(|_| bad("snapshot", "negative count"))?;
    let u64_at = |i: usize| -> Result<u64> {
        Ok(u64::from_be_bytes(be(
            b.get(i..).unwrap_or(&[]),
            "snapshot",
        )?))
    };
    if b.len() != 20 + 8 * n {
        return Err(bad("snapshot", "length does not match the count"));
    }
    let xips: Vec<String> = (0..n)
        .map(|i| u64_at(20 + 8 * i).map(|x| x.to_string()))
        .collect::<Result<_>>()?;
    Ok(format!("{}:{}:{}", u64_at(4)?, u64_at(12)?, xips.join(",")))
}

/// `HH:MM:SS[.ffffff]` of microseconds since midnight, as the server prints it.
fn time_text(micros: i64) -> String {
    let secs = micros / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}{}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        fraction(micros % 1_000_000)
    )
}

/// `.ffffff` without trailing zeros, or nothing.
fn fraction(micros: i64) -> String {
    if micros == 0 {
        return String::new();
    }
    let f = format!(".{:06}", micros.abs());
    f.trim_end_matches('0').to_owned()
}

/// A UTC offset in seconds east as the server prints it: `+02`, `-03:30`.
fn zone_text(east: i32) -> String {
    let a = east.unsigned_abs();
    let mut s = format!("{}{:02}", if east < 0 { '-' } else { '+' }, a / 3600);
    if a % 3600 != 0 {
        s.push_str(&format!(":{:02}", a / 60 % 60));
        if a % 60 != 0 {
            s.push_str(&format!(":{:02}", a % 60));
        }
    }
    s
}

/// An interval as the server prints it with `IntervalStyle = postgres`:
/// `1 year 2 mons -3 days +04:05:06.5`, `00:00:00` for zero.
fn interval_text(months: i32, days: i32, micros: i64) -> String {
    let mut out = String::new();
    let (mut zero, mut before) = (true, false);
    for (v, unit) in [(months / 12, "year"), (months % 12, "mon"), (days, "day")] {
        if v == 0 {
            continue;
        }
        out.push_str(&format!(
            "{}{}{v} {unit}{}",
            if zero { "" } else { " " },
            if before && v > 0 { "+" } else { "" },
            if v != 1 { "s" } else { "" }
        ));
        before = v < 0;
        zero = false;
    }
    if zero || micros != 0 {
        let a = micros.unsigned_abs();
        let secs = a / 1_000_000;
        out.push_str(&format!(
            "{}{}{:02}:{:02}:{:02}{}",
            if zero { "" } else { " " },
            if micros < 0 {
                "-"
            } else if before {
                "+"
            } else {
                ""
            },
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            fraction((a % 1_000_000) as i64)
        ));
    }
    out
}

/// inet/cidr binary (family, bits, is_cidr, length, address) as the server
/// prints it: the mask is shown for cidr always, for inet unless it is the
/// whole address.
fn inet_text(b: &[u8]) -> Result<String> {
    let (family, bits, is_cidr, n) = match b {
        [f, bits, c, n, ..] => (*f, *bits, *c != 0, *n as usize),
        _ => return Err(bad("inet", "binary value too short")),
    };
    let addr = b
        .get(4..4 + n)
        .ok_or_else(|| bad("inet", "binary value too short"))?;
    let (text, max) = match (family, n) {
        (2, 4) => (
            std::net::Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]).to_string(),
            32,
        ),
        (3, 16) => {
            let a: [u8; 16] = addr.try_into().expect("16 bytes");
            (std::net::Ipv6Addr::from(a).to_string(), 128)
        }
        _ => return Err(bad("inet", "unknown address family")),
    };
    Ok(if is_cidr || bits != max {
        format!("{text}/{bits}")
    } else {
        text
    })
}

fn binary_numeric(b: &[u8]) -> Result<String> {
    let h = |i: usize| -> Result<i16> {
        Ok(i16::from_be_bytes(be(
            b.get(i..).unwrap_or(&[]),
            "numeric",
        )?))
    };
    let (ndigits, weight, sign, dscale) = (h(0)?, h(2)?, h(4)? as u16, h(6)?);
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => {}
    }
    let digits: Vec<i16> = (0..ndigits.max(0) as usize)
        .map(|i| h(8 + 2 * i))
        .collect::<Result<_>>()?;
    let mut int = String::new();
    for i in 0..=weight.max(-1) {
        let d = digits.get(i as usize).copied().unwrap_or(0);
        if int.is_empty() {
            if d != 0 {
                int = d.to_string();
            }
        } else {
            int.push_str(&format!("{d:04}"));
        }
    }
    if int.is_empty() {
        int.push('0');
    }
    let mut frac = String::new();
    let mut i = weight + 1;
    while (frac.len() as i16) < dscale {
        let d = if i >= 0 {
            digits.get(i as usize).copied().unwrap_or(0)
        } else {
            0
        };
        if i < 0 {
            frac.push_str("0000");
        } else {
            frac.push_str(&format!("{d:04}"));
        }
        i += 1;
    }
    frac.truncate(dscale.max(0) as usize);
    let sign = if sign == 0x4000 { "-" } else { "" };
    Ok(if frac.is_empty() {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    })
}

fn decode_binary_array(b: &[u8]) -> Result<Value> {
    let i32_at = |i: usize| -> Result<i32> {
        Ok(i32::from_be_bytes(be(b.get(i..).unwrap_or(&[]), "array")?))
    };
    let ndim = i32_at(0)?;
    let elem = i32_at(8)? as u32;
    if ndim == 0 {
        return Ok(Value::Array(vec![]));
    }
    if !(1..=6).contains(&ndim) {
        return Err(bad("array", "bad dimension count"));
    }
    let dims: Vec<usize> = (0..ndim as usize)
        .map(|d| i32_at(12 + 8 * d).map(|n| n.max(0) as usize))
        .collect::<Result<_>>()?;
    let mut pos = 12 + 8 * ndim as usize;
    let total: usize = dims.iter().product();
    let mut flat = Vec::with_capacity(total.min(b.len()));
    for _ in 0..total {
        let len = i32_at(pos)?;
        pos += 4;
        if len < 0 {
            flat.push(Value::Null);
        } else {
            let end = pos + len as usize;
            let v = b
                .get(pos..end)
                .ok_or_else(|| bad("array", "element past end"))?;
            flat.push(decode_binary(elem, v)?);
            pos = end;
        }
    }
    // Re-nest by dimensions, innermost first.
    let mut level = flat;
    for d in dims.iter().skip(1).rev() {
        let mut next = Vec::new();
        let mut it = level.into_iter();
        loop {
            let chunk: Vec<Value> = it.by_ref().take(*d).collect();
            if chunk.is_empty() {
                break;
            }
            next.push(Value::Array(chunk));
        }
        level = next;
    }
    Ok(Value::Array(level))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn t(oid: u32, s: &'static str) -> Value {
        decode(oid, &ColumnValue::Text(Bytes::from_static(s.as_bytes()))).unwrap()
    }

    #[test]
    fn text_values() {
        assert_eq!(t(oid::BOOL, "t"), Value::Bool(true));
        assert_eq!(t(oid::FLOAT8, "1.5"), Value::Float(1.5));
        assert_eq!(t(oid::BYTEA, "\\x00ff"), Value::Bytes(vec![0, 255]));
        assert_eq!(
            t(oid::TIMESTAMPTZ, "2000-01-01 00:00:01.5+00"),
            Value::Timestamp(PgTimestamp(1_500_000))
        );
        assert_eq!(
            t(oid::TIMESTAMPTZ, "2000-01-01 02:00:00+02"),
            Value::Timestamp(PgTimestamp(0))
        );
        assert_eq!(
            t(oid::TIMESTAMP, "1999-12-31 23:59:59"),
            Value::Timestamp(PgTimestamp(-1_000_000))
        );
        assert_eq!(t(oid::DATE, "2000-03-01"), Value::Date(60));
        assert_eq!(t(oid::UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), {
            let mut u = [0u8; 16];
            u.copy_from_slice(&parse_hex_bytea("\\xa0eebc999c0b4ef8bb6d6bb9bd380a11").unwrap());
            Value::Uuid(u)
        });
        assert_eq!(
            t(1009, r#"{a,"b c","d\"e",NULL}"#),
            Value::Array(vec![
                Value::Text("a".into()),
                Value::Text("b c".into()),
                Value::Text("d\"e".into()),
                Value::Null
            ])
        );
        assert_eq!(
            t(1007, "{{1,2},{3,4}}"),
            Value::Array(vec![
                Value::Array(vec![Value::Int(1), Value::Int(2)]),
                Value::Array(vec![Value::Int(3), Value::Int(4)])
            ])
        );
        assert!(decode(1007, &ColumnValue::Text(Bytes::from_static(b"{1,2"))).is_err());
        assert!(decode(oid::INT4, &ColumnValue::Binary(Bytes::from_static(b"\x01"))).is_err());
    }

    #[test]
    fn binary_numeric_forms() {
        // 12345.678: ndigits 3, weight 1, sign +, dscale 3, digits 1 2345 6780
        let mut b = vec![];
        for v in [3i16, 1, 0, 3, 1, 2345, 6780] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(binary_numeric(&b).unwrap(), "12345.678");
        // -0.05: ndigits 1, weight -1, sign -, dscale 2, digits 500
        let mut b = vec![];
        for v in [1i16, -1, 0x4000, 2, 500] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(binary_numeric(&b).unwrap(), "-0.05");
    }
}
