//! The server's text forms of time, timetz and interval (`DateStyle` ISO,
//! `IntervalStyle` postgres, which pgwal's connections set), as Debezium's
//! numbers and strings.

/// `HH:MM:SS[.ffffff]` as microseconds since midnight.
pub(super) fn time_micros(s: &str) -> Option<i64> {
    let (hms, frac) = match s.split_once('.') {
        Some((a, b)) => (a, b),
        None => (s, ""),
    };
    let mut parts = hms.split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let sec: i64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let micros: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().ok()?
    };
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + micros)
}

/// `HH:MM:SS[.ffffff]±HH[:MM[:SS]]` moved to UTC, printed as Debezium's
/// `ZonedTime`: `HH:MM:SS[.fraction]Z` without trailing zeros.
pub(super) fn timetz_utc(s: &str) -> Option<String> {
    let at = s.rfind(['+', '-'])?;
    let (time, zone) = s.split_at(at);
    let local = time_micros(time)?;
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let mut z = zone[1..].split(':');
    let zh: i64 = z.next()?.parse().ok()?;
    let zm: i64 = z.next().map_or(Some(0), |x| x.parse().ok())?;
    let zs: i64 = z.next().map_or(Some(0), |x| x.parse().ok())?;
    let offset = sign * ((zh * 60 + zm) * 60 + zs) * 1_000_000;
    let utc = (local - offset).rem_euclid(86_400_000_000);
    Some(format!("{}Z", clock(utc)))
}

/// `HH:MM:SS[.fraction]`, the fraction without trailing zeros.
pub(super) fn clock(micros: i64) -> String {
    let secs = micros / 1_000_000;
    let mut out = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    push_fraction(&mut out, micros % 1_000_000);
    out
}

/// `.ffffff` without trailing zeros; nothing for a whole second.
pub(super) fn push_fraction(out: &mut String, micros: i64) {
    if micros != 0 {
        let f = format!("{micros:06}");
        out.push('.');
        out.push_str(f.trim_end_matches('0'));
    }
}

/// An interval in the postgres style (`1 year 2 mons -3 days 04:05:06.5`)
/// as Debezium's `MicroDuration`: months count as 365.25 / 12 days.
pub(super) fn interval_micros(s: &str) -> Option<i64> {
    const DAY: f64 = 86_400_000_000.0;
    let mut total = 0f64;
    let mut words = s.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w.contains(':') {
            let (neg, t) = match w.strip_prefix('-') {
                Some(t) => (true, t),
                None => (false, w.strip_prefix('+').unwrap_or(w)),
            };
            // hours may exceed 23 here
            let micros = time_micros(t)? as f64;
            total += if neg { -micros } else { micros };
            continue;
        }
        let n: f64 = w.parse().ok()?;
        let unit = words.next()?;
        total += n * match unit.trim_end_matches('s') {
            "year" => 365.25 * DAY,
            "mon" => 365.25 / 12.0 * DAY,
            "day" => DAY,
            _ => return None,
        };
    }
    Some(total.round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(time_micros("04:05:06.5"), Some(14_706_500_000));
        assert_eq!(time_micros("24:00:00"), Some(86_400_000_000));
        assert_eq!(time_micros("04:05"), None);
        assert_eq!(
            timetz_utc("04:05:06.25-03:30").as_deref(),
            Some("07:35:06.25Z")
        );
        assert_eq!(timetz_utc("01:00:00+02").as_deref(), Some("23:00:00Z"));
        assert_eq!(interval_micros("00:00:00"), Some(0));
        assert_eq!(interval_micros("3 days"), Some(3 * 86_400_000_000));
        assert_eq!(
            interval_micros("1 mon -1 days +01:00:00"),
            Some((30.4375 * 86_400e6) as i64 - 86_400_000_000 + 3_600_000_000)
        );
        assert_eq!(interval_micros("-00:00:00.000001"), Some(-1));
        assert_eq!(interval_micros("100:00:00"), Some(360_000_000_000));
        assert_eq!(interval_micros("1 fortnight"), None);
    }
}
