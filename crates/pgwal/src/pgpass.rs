//! The password file (`~/.pgpass`, `PGPASSFILE`).

/// Splits one line into its five fields, honouring `\:` and `\\`.
fn fields(line: &str) -> Option<[String; 5]> {
    let mut out: Vec<String> = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.last_mut()?.push(chars.next().unwrap_or('\\')),
            ':' if out.len() < 5 => out.push(String::new()),
            c => out.last_mut()?.push(c),
        }
    }
    out.try_into().ok()
}

/// Finds the password for a connection in a password file's text: the first
/// line whose host, port, database and user match (`*` matches anything).
pub(crate) fn lookup(
    text: &str,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Option<String> {
    let port = port.to_string();
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .filter_map(fields)
        .find(|[h, p, d, u, _]| {
            let m = |pat: &str, v: &str| pat == "*" || pat == v;
            (m(h, host) || (h == "localhost" && host == "127.0.0.1"))
                && m(p, &port)
                && m(d, dbname)
                && m(u, user)
        })
        .map(|[.., pw]| pw)
}

#[cfg(test)]
mod tests {
    use super::lookup;

    #[test]
    fn matches_first_line_with_wildcards_and_escapes() {
        let f = "# comment\nother:5432:*:*:no\n127.0.0.1:5433:db:u:p\\:w\\\\d\n*:*:*:u:fallback\n";
        assert_eq!(
            lookup(f, "127.0.0.1", 5433, "db", "u").as_deref(),
            Some("p:w\\d")
        );
        assert_eq!(lookup(f, "h", 1, "x", "u").as_deref(), Some("fallback"));
        assert_eq!(lookup(f, "h", 1, "x", "v"), None);
        assert_eq!(lookup("bad:line", "h", 1, "x", "v"), None);
    }
}
