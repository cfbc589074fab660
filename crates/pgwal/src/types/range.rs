//! Range and multirange values (`int4range`, `tstzrange`, `datemultirange`,
//! ...): both formats decode to the same [`Range`], its bounds decoded as
//! the range's subtype.

use std::ops::Bound;

use super::{bad, decode_binary, decode_text, oid, Value};
use crate::error::Result;

/// A range value.
///
/// ```
/// use std::ops::Bound;
/// use bytes::Bytes;
/// use pgwal::protocol::pgoutput::ColumnValue;
/// use pgwal::types::{decode, oid, Range, Value};
///
/// let v = decode(oid::INT4RANGE, &ColumnValue::Text(Bytes::from_static(b"[1,5)"))).unwrap();
/// assert_eq!(
///     v,
///     Value::Range(Box::new(Range::Bounds(
///         Bound::Included(Value::Int(1)),
///         Bound::Excluded(Value::Int(5))
///     )))
/// );
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Range {
    /// `empty`.
    Empty,
    /// Lower and upper bound (`Unbounded`: infinite on that side).
    Bounds(Bound<Value>, Bound<Value>),
}

/// The subtype of a built-in range type.
pub(crate) fn subtype(range: u32) -> Option<u32> {
    Some(match range {
        oid::INT4RANGE => oid::INT4,
        oid::NUMRANGE => oid::NUMERIC,
        oid::TSRANGE => oid::TIMESTAMP,
        oid::TSTZRANGE => oid::TIMESTAMPTZ,
        oid::DATERANGE => oid::DATE,
        oid::INT8RANGE => oid::INT8,
        _ => return None,
    })
}

/// The range type of a built-in multirange type.
pub(crate) fn multirange_range(multirange: u32) -> Option<u32> {
    Some(match multirange {
        oid::INT4MULTIRANGE => oid::INT4RANGE,
        oid::NUMMULTIRANGE => oid::NUMRANGE,
        oid::TSMULTIRANGE => oid::TSRANGE,
        oid::TSTZMULTIRANGE => oid::TSTZRANGE,
        oid::DATEMULTIRANGE => oid::DATERANGE,
        oid::INT8MULTIRANGE => oid::INT8RANGE,
        _ => return None,
    })
}

// range_send's flags (rangetypes.h)
const EMPTY: u8 = 0x01;
const LB_INC: u8 = 0x02;
const UB_INC: u8 = 0x04;
const LB_INF: u8 = 0x08;
const UB_INF: u8 = 0x10;

/// `range_send`: flags, then each finite bound as length and bytes.
pub(crate) fn from_binary(subtype: u32, b: &[u8]) -> Result<Range> {
    let (&flags, mut rest) = b
        .split_first()
        .ok_or_else(|| bad("range", "binary value too short"))?;
    if flags & EMPTY != 0 {
        return Ok(Range::Empty);
    }
    let mut bound = |inf: u8, inc: u8| -> Result<Bound<Value>> {
        if flags & inf != 0 {
            return Ok(Bound::Unbounded);
        }
        let len = super::be::<4>(rest, "range bound")?;
        let len = usize::try_from(i32::from_be_bytes(len))
            .map_err(|_| bad("range", "negative bound length"))?;
        let v = rest
            .get(4..4 + len)
            .ok_or_else(|| bad("range", "bound past the end"))?;
        rest = &rest[4 + len..];
        let v = decode_binary(subtype, v)?;
        Ok(if flags & inc != 0 {
            Bound::Included(v)
        } else {
            Bound::Excluded(v)
        })
    };
    let lower = bound(LB_INF, LB_INC)?;
    let upper = bound(UB_INF, UB_INC)?;
    Ok(Range::Bounds(lower, upper))
}

/// `multirange_send`: a count, then each range as length and `range_send` bytes.
pub(crate) fn multirange_from_binary(subtype: u32, b: &[u8]) -> Result<Vec<Range>> {
    let n = u32::from_be_bytes(super::be(b, "multirange")?);
    let mut rest = &b[4..];
    let mut out = Vec::with_capacity((n as usize).min(b.len()));
    for _ in 0..n {
        let len = u32::from_be_bytes(super::be(rest, "multirange")?) as usize;
        let r = rest
            .get(4..4 + len)
            .ok_or_else(|| bad("multirange", "range past the end"))?;
        out.push(from_binary(subtype, r)?);
        rest = &rest[4 + len..];
    }
    Ok(out)
}

/// `range_out`'s text: `empty`, or `[`/`(`, lower, `,`, upper, `]`/`)`,
/// a bound being empty (unbounded), plain, or double-quoted with `\` and
/// `""` escapes.
pub(crate) fn from_text(subtype: u32, s: &str) -> Result<Range> {
    let (r, rest) = parse_range(subtype, s)?;
    if !rest.trim().is_empty() {
        return Err(bad(s, "junk after range"));
    }
    Ok(r)
}

/// `multirange_out`'s text: `{` ranges separated by `,` `}`.
pub(crate) fn multirange_from_text(subtype: u32, s: &str) -> Result<Vec<Range>> {
    let inner = s
        .trim()
        .strip_prefix('{')
        .and_then(|x| x.strip_suffix('}'))
        .ok_or_else(|| bad(s, "multirange not in braces"))?;
    let mut rest = inner.trim_start();
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (r, after) = parse_range(subtype, rest)?;
        out.push(r);
        rest = after.trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
        } else if !rest.is_empty() {
            return Err(bad(s, "expected ',' between ranges"));
        }
    }
    Ok(out)
}

/// One range at the start of `s`; returns it and what follows.
fn parse_range(subtype: u32, s: &str) -> Result<(Range, &str)> {
    let s = s.trim_start();
    if s.len() >= 5 && s[..5].eq_ignore_ascii_case("empty") {
        return Ok((Range::Empty, &s[5..]));
    }
    let lower_inc = match s.chars().next() {
        Some('[') => true,
        Some('(') => false,
        _ => return Err(bad(s, "range does not start with '[' or '('")),
    };
    let (lower, rest) = parse_bound(&s[1..], s)?;
    let rest = rest
        .strip_prefix(',')
        .ok_or_else(|| bad(s, "expected ',' in range"))?;
    let (upper, rest) = parse_bound(rest, s)?;
    let upper_inc = match rest.chars().next() {
        Some(']') => true,
        Some(')') => false,
        _ => return Err(bad(s, "range does not end with ']' or ')'")),
    };
    let bound = |text: Option<String>, inc: bool| -> Result<Bound<Value>> {
        Ok(match text {
            None => Bound::Unbounded,
            Some(t) if inc => Bound::Included(decode_text(subtype, &t)?),
            Some(t) => Bound::Excluded(decode_text(subtype, &t)?),
        })
    };
    Ok((
        Range::Bounds(bound(lower, lower_inc)?, bound(upper, upper_inc)?),
        &rest[1..],
    ))
}

/// A bound up to the next unquoted `,`, `]` or `)`; `None` if empty.
fn parse_bound<'a>(s: &'a str, whole: &str) -> Result<(Option<String>, &'a str)> {
    let mut out = String::new();
    let mut any = false;
    let mut quoted = false;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' if quoted && chars.peek().map(|x| x.1) == Some('"') => {
                chars.next();
                out.push('"');
            }
            '"' => {
                quoted = !quoted;
                any = true;
            }
            '\\' => match chars.next() {
                Some((_, e)) => {
                    out.push(e);
                    any = true;
                }
                None => break,
            },
            ',' | ']' | ')' if !quoted => {
                return Ok((any.then_some(out), &s[i..]));
            }
            c => {
                out.push(c);
                any = true;
            }
        }
    }
    Err(bad(whole, "unterminated range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms() {
        use Bound::*;
        let int = |v| Value::Int(v);
        assert_eq!(from_text(oid::INT4, "empty").unwrap(), Range::Empty);
        assert_eq!(
            from_text(oid::INT4, "[1,5)").unwrap(),
            Range::Bounds(Included(int(1)), Excluded(int(5)))
        );
        assert_eq!(
            from_text(oid::INT8, "(,5]").unwrap(),
            Range::Bounds(Unbounded, Included(int(5)))
        );
        assert_eq!(
            from_text(oid::NUMERIC, "(1.5,)").unwrap(),
            Range::Bounds(Excluded(Value::Numeric("1.5".into())), Unbounded)
        );
        let ts = from_text(
            oid::TIMESTAMP,
            r#"["2000-01-01 00:00:00","2000-01-01 00:00:01")"#,
        )
        .unwrap();
        assert_eq!(
            ts,
            Range::Bounds(
                Included(Value::Timestamp(pgwal_protocol::PgTimestamp(0))),
                Excluded(Value::Timestamp(pgwal_protocol::PgTimestamp(1_000_000)))
            )
        );
        assert_eq!(
            multirange_from_text(oid::INT4, "{[1,3), [5,7)}").unwrap(),
            vec![
                Range::Bounds(Included(int(1)), Excluded(int(3))),
                Range::Bounds(Included(int(5)), Excluded(int(7)))
            ]
        );
        assert_eq!(multirange_from_text(oid::INT4, "{}").unwrap(), vec![]);
        for bad_text in ["[1,5", "1,5)", "[1;5)", "[1,5)x", "{[1,2)", "{[1,2) [3,4)}"] {
            assert!(
                from_text(oid::INT4, bad_text).is_err()
                    && multirange_from_text(oid::INT4, bad_text).is_err(),
                "{bad_text}"
            );
        }
    }

    #[test]
    fn binary_forms() {
        use Bound::*;
        // [1,5): flags LB_INC, lower len 4 + 1, upper len 4 + 5
        let mut b = vec![LB_INC];
        for v in [4i32, 1, 4, 5] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        let r = from_binary(oid::INT4, &b).unwrap();
        assert_eq!(
            r,
            Range::Bounds(Included(Value::Int(1)), Excluded(Value::Int(5)))
        );
        assert_eq!(from_binary(oid::INT4, &[EMPTY]).unwrap(), Range::Empty);
        assert_eq!(
            from_binary(oid::INT4, &[LB_INF | UB_INF]).unwrap(),
            Range::Bounds(Unbounded, Unbounded)
        );
        // truncated bound: an error, never a short read
        assert!(from_binary(oid::INT4, &b[..b.len() - 1]).is_err());
        let mut m = 2u32.to_be_bytes().to_vec();
        for r in [&b[..], &[EMPTY][..]] {
            m.extend_from_slice(&(r.len() as u32).to_be_bytes());
            m.extend_from_slice(r);
        }
        assert_eq!(
            multirange_from_binary(oid::INT4, &m).unwrap(),
            vec![r, Range::Empty]
        );
        assert!(multirange_from_binary(oid::INT4, &m[..m.len() - 1]).is_err());
    }
}
