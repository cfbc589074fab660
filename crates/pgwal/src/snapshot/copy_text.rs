//! COPY's text format: lines of tab-separated fields with backslash escapes.

use crate::error::{Error, Result};

/// The fields of one line (without its newline).
pub(crate) fn fields(line: &[u8]) -> Result<Vec<Option<String>>> {
    line.split(|b| *b == b'\t').map(unescape).collect()
}

/// Decodes one field of COPY's text format.
pub(crate) fn unescape(field: &[u8]) -> Result<Option<String>> {
    if field == b"\\N" {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' || i + 1 == field.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let n = field[i + 1];
        i += 2;
        match n {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(n - b'0');
                let mut k = 0;
                while k < 2 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + u32::from(field[i] - b'0');
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut k = 0;
                while k < 2 && i < field.len() && field[i].is_ascii_hexdigit() {
                    v = v * 16 + (field[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).map(Some).map_err(|_| Error::Column {
        column: "COPY field".into(),
        reason: "not UTF-8".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn copy_text_fields() {
        assert_eq!(unescape(b"\\N").unwrap(), None);
        assert_eq!(
            unescape(b"a\\tb\\\\c\\nd").unwrap().as_deref(),
            Some("a\tb\\c\nd")
        );
        assert_eq!(unescape(b"\\101\\x42").unwrap().as_deref(), Some("AB"));
    }
}
