//! Connection configuration: connection strings, environment, defaults.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// How TLS is used, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// Never use TLS.
    Disable,
    /// Use TLS if the server offers it, without verifying the certificate.
    #[default]
    Prefer,
    /// Require TLS, without verifying the certificate.
    Require,
    /// Require TLS and a certificate chain to a trusted root.
    VerifyCa,
    /// Like `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(Error::Config {
                    key: format!("sslmode={s}"),
                    reason: "expected disable, allow, prefer, require, verify-ca or verify-full",
                })
            }
        })
    }
}

/// Which server of a multi-host connection string to settle on, with
/// libpq's `target_session_attrs` meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TargetSessionAttrs {
    /// The first server that accepts the connection.
    #[default]
    Any,
    /// One that accepts writes (not in recovery, `default_transaction_read_only` off).
    ReadWrite,
    /// One that does not accept writes.
    ReadOnly,
    /// One that is not in recovery.
    Primary,
    /// One in recovery (a hot standby).
    Standby,
    /// A standby if any of the hosts is one, else any.
    PreferStandby,
}

impl FromStr for TargetSessionAttrs {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "any" => TargetSessionAttrs::Any,
            "read-write" => TargetSessionAttrs::ReadWrite,
            "read-only" => TargetSessionAttrs::ReadOnly,
            "primary" => TargetSessionAttrs::Primary,
            "standby" => TargetSessionAttrs::Standby,
            "prefer-standby" => TargetSessionAttrs::PreferStandby,
            _ => {
                return Err(Error::Config {
                    key: format!("target_session_attrs={s}"),
                    reason:
                        "expected any, read-write, read-only, primary, standby or prefer-standby",
                })
            }
        })
    }
}

impl TargetSessionAttrs {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }
}

/// Whether SCRAM channel binding (`SCRAM-SHA-256-PLUS`) is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ChannelBinding {
    /// Never.
    Disable,
    /// When TLS is in use and the server offers it.
    #[default]
    Prefer,
    /// Always; authentication without it fails.
    Require,
}

/// Where and how to connect.
///
/// Build one by parsing a URI (`postgresql://user:pw@host:port/db?sslmode=require`)
/// or a key/value string (`host=h port=5432 user=u dbname=d`). Options not in
/// the string come from the `PG*` environment variables (`PGHOST`, `PGPORT`,
/// `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`,
/// `PGAPPNAME`, `PGCONNECT_TIMEOUT`, `PGPASSFILE`), then from libpq's defaults.
/// A missing password is looked up in the password file (`~/.pgpass`).
///
/// A `host` that is an absolute path names a directory holding a Unix-domain
/// socket (`DIR/.s.PGSQL.PORT`), as in libpq; in a URI, percent-encode it
/// (`postgresql://%2Fvar%2Frun%2Fpostgresql/db`) or pass it as `?host=`. As
/// libpq does, TLS is never attempted over a Unix-domain socket (`sslmode`
/// is ignored there), so channel binding is not available on one. Without
/// a host (`host` is empty) each connection attempt uses the first of
/// `/var/run/postgresql` (Debian's socket directory) and `/tmp`
/// (upstream's) that holds the port's socket at that moment, else
/// `localhost` over TCP.
///
/// ```
/// use pgwal::{Config, SslMode};
///
/// let c: Config = "postgresql://alice:s%40cret@db.example:6543/app?sslmode=require".parse().unwrap();
/// assert_eq!(c.host, "db.example");
/// assert_eq!(c.port, 6543);
/// assert_eq!(c.password.as_deref(), Some("s@cret"));
/// assert_eq!(c.ssl_mode, SslMode::Require);
///
/// let c: Config = "host=127.0.0.1 port=5433 user=bob dbname='my db'".parse().unwrap();
/// assert_eq!(c.dbname, "my db");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Host name or IP address, or the absolute path of a Unix-domain
    /// socket directory; empty for the default (see above).
    pub host: String,
    /// Port: TCP port, or the number in the socket file's name.
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password, if any.
    pub password: Option<String>,
    /// Database name (logical replication is per database).
    pub dbname: String,
    /// TLS mode.
    pub ssl_mode: SslMode,
    /// PEM file of trusted roots for `verify-ca`/`verify-full`.
    pub ssl_root_cert: Option<PathBuf>,
    /// Use TLS directly without the SSLRequest round trip (PostgreSQL 17+).
    pub ssl_direct: bool,
    /// SCRAM channel binding.
    pub channel_binding: ChannelBinding,
    /// `application_name` shown in `pg_stat_replication`.
    pub application_name: Option<String>,
    /// Connect timeout.
    pub connect_timeout: Option<Duration>,
    /// TCP keepalive probes on the connection (`keepalives`, default on as
    /// in libpq). With the kernel's defaults the first probe goes out after
    /// two hours of silence; `keepalives_idle`, `keepalives_interval` and
    /// `keepalives_count` shorten that. A replication stream is watched by
    /// its own receive timeout too (see
    /// [`StreamConfig::receive_timeout`](crate::StreamConfig::receive_timeout)).
    pub keepalives: bool,
    /// Idle time before the first keepalive probe (`keepalives_idle`).
    pub keepalives_idle: Option<Duration>,
    /// Time between unanswered probes (`keepalives_interval`).
    pub keepalives_interval: Option<Duration>,
    /// Unanswered probes before the connection is dropped (`keepalives_count`).
    pub keepalives_count: Option<u32>,
    /// How long sent data may stay unacknowledged by the peer before the
    /// kernel drops the connection (`tcp_user_timeout`, Linux only; ignored
    /// elsewhere, as by libpq).
    pub tcp_user_timeout: Option<Duration>,
    /// Password file.
    pub passfile: Option<PathBuf>,
    /// The hosts after the first of a multi-host string (`host=a,b,c
    /// port=5432,5433,5434`, or `postgresql://a:5432,b:5433/db`), tried in
    /// order after `host`/`port` on every connection attempt (reconnects
    /// too), like libpq.
    pub alternate_hosts: Vec<(String, u16)>,
    /// Which of the hosts to settle on.
    pub target_session_attrs: TargetSessionAttrs,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[derive(Default)]
struct Raw {
    host: Option<String>,
    port: Option<String>,
    user: Option<String>,
    password: Option<String>,
    dbname: Option<String>,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslnegotiation: Option<String>,
    channel_binding: Option<String>,
    application_name: Option<String>,
    connect_timeout: Option<String>,
    keepalives: Option<String>,
    keepalives_idle: Option<String>,
    keepalives_interval: Option<String>,
    keepalives_count: Option<String>,
    tcp_user_timeout: Option<String>,
    passfile: Option<String>,
    target_session_attrs: Option<String>,
}

impl Raw {
    fn set(&mut self, key: &str, value: String) -> Result<()> {
        let slot = match key {
            "host" | "hostaddr" => &mut self.host,
            "port" => &mut self.port,
            "user" => &mut self.user,
            "password" => &mut self.password,
            "dbname" => &mut self.dbname,
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslnegotiation" => &mut self.sslnegotiation,
            "channel_binding" => &mut self.channel_binding,
            "application_name" => &mut self.application_name,
            "connect_timeout" => &mut self.connect_timeout,
            "keepalives" => &mut self.keepalives,
            "keepalives_idle" => &mut self.keepalives_idle,
            "keepalives_interval" => &mut self.keepalives_interval,
            "keepalives_count" => &mut self.keepalives_count,
            "tcp_user_timeout" => &mut self.tcp_user_timeout,
            "passfile" => &mut self.passfile,
            "target_session_attrs" => &mut self.target_session_attrs,
            // Accepted and ignored: set by this library itself.
            "replication" | "client_encoding" | "options" | "fallback_application_name" => {
                return Ok(())
            }
            _ => {
                return Err(Error::Config {
                    key: key.to_owned(),
                    reason: "unknown connection option",
                })
            }
        };
        *slot = Some(value);
        Ok(())
    }
}

fn percent_decode(s: &str, key: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(v) => out.push(v),
                None => {
                    return Err(Error::Config {
                        key: key.to_owned(),
                        reason: "bad percent-encoding",
                    })
                }
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::Config {
        key: key.to_owned(),
        reason: "not UTF-8 after percent-decoding",
    })
}

fn parse_uri(s: &str, raw: &mut Raw) -> Result<()> {
    let rest = s
        .strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))
        .ok_or(Error::Config {
            key: s.to_owned(),
            reason: "not a postgres:// URI",
        })?;
    let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = main.split_once('/').unwrap_or((main, ""));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if let Some(u) = userinfo {
        let (user, pw) = match u.split_once(':') {
            Some((a, b)) => (a, Some(b)),
            None => (u, None),
        };
        if !user.is_empty() {
            raw.user = Some(percent_decode(user, "user")?);
        }
        if let Some(pw) = pw {
            raw.password = Some(percent_decode(pw, "password")?);
        }
    }
    // host[:port][,host[:port]...]: kept as libpq's comma lists
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    for hp in hostport.split(',') {
        let (host, port) = if let Some(h) = hp.strip_prefix('[') {
            let (h, rest) = h.split_once(']').ok_or(Error::Config {
                key: hp.to_owned(),
                reason: "unterminated IPv6 address",
            })?;
            (h, rest.strip_prefix(':'))
        } else {
            match hp.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hp, None),
            }
        };
        hosts.push(percent_decode(host, "host")?);
        ports.push(port.unwrap_or("").to_owned());
    }
    if hosts.iter().any(|h| !h.is_empty()) {
        raw.host = Some(hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        raw.port = Some(ports.join(","));
    }
    if !path.is_empty() {
        raw.dbname = Some(percent_decode(path, "dbname")?);
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or(Error::Config {
            key: pair.to_owned(),
            reason: "expected key=value",
        })?;
        raw.set(&percent_decode(k, k)?, percent_decode(v, k)?)?;
    }
    Ok(())
}

fn parse_kv(s: &str, raw: &mut Raw) -> Result<()> {
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(());
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(Error::Config {
                key,
                reason: "expected '=' after key",
            });
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => break,
                    },
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => {
                        return Err(Error::Config {
                            key,
                            reason: "unterminated quoted value",
                        })
                    }
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        value.push(n);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        raw.set(&key, value)?;
    }
}

impl Config {
    /// Parses a connection string, filling gaps from the environment and defaults.
    pub fn parse(s: &str) -> Result<Config> {
        let mut raw = Raw::default();
        let t = s.trim();
        if t.starts_with("postgres://") || t.starts_with("postgresql://") {
            parse_uri(t, &mut raw)?;
        } else {
            parse_kv(t, &mut raw)?;
        }
        Config::from_raw(raw)
    }

    /// Configuration from the environment and defaults only.
    pub fn from_env() -> Result<Config> {
        Config::from_raw(Raw::default())
    }

    fn from_raw(r: Raw) -> Result<Config> {
        let port_list = r
            .port
            .or_else(|| env("PGPORT"))
            .unwrap_or_else(|| "5432".into());
        let host_list = r.host.or_else(|| env("PGHOST")).unwrap_or_default();
        let hosts: Vec<&str> = host_list.split(',').collect();
        let ports: Vec<u16> = port_list
            .split(',')
            .map(|p| if p.is_empty() { "5432" } else { p })
            .map(|p| {
                p.parse().map_err(|_| Error::Config {
                    key: format!("port={port_list}"),
                    reason: "not a port number",
                })
            })
            .collect::<Result<_>>()?;
        if ports.len() != 1 && ports.len() != hosts.len() {
            return Err(Error::Config {
                key: format!("port={port_list}"),
                reason: "give one port, or one per host",
            });
        }
        let port_of = |i: usize| if ports.len() == 1 { ports[0] } else { ports[i] };
        let (host, port) = (hosts[0].to_owned(), port_of(0));
        let alternate_hosts: Vec<(String, u16)> = hosts
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, h)| (h.to_string(), port_of(i)))
            .collect();
        let target_session_attrs = match r
            .target_session_attrs
            .or_else(|| env("PGTARGETSESSIONATTRS"))
        {
            Some(t) => t.parse()?,
            None => TargetSessionAttrs::Any,
        };
        if hosts.iter().any(|h| h.starts_with('@')) {
            return Err(Error::Config {
                key: format!("host={host_list}"),
                reason: "abstract Unix-domain sockets are not supported",
            });
        }
        let user = r
            .user
            .or_else(|| env("PGUSER"))
            .or_else(|| env("USER"))
            .unwrap_or_else(|| "postgres".into());
        let dbname = r
            .dbname
            .or_else(|| env("PGDATABASE"))
            .unwrap_or_else(|| user.clone());
        let ssl_mode = match r.sslmode.or_else(|| env("PGSSLMODE")) {
            Some(m) => m.parse()?,
            None => SslMode::Prefer,
        };
        let ssl_direct = match r
            .sslnegotiation
            .or_else(|| env("PGSSLNEGOTIATION"))
            .as_deref()
        {
            None | Some("postgres") => false,
            Some("direct") => true,
            Some(other) => {
                return Err(Error::Config {
                    key: format!("sslnegotiation={other}"),
                    reason: "expected postgres or direct",
                })
            }
        };
        let channel_binding = match r
            .channel_binding
            .or_else(|| env("PGCHANNELBINDING"))
            .as_deref()
        {
            None | Some("prefer") => ChannelBinding::Prefer,
            Some("disable") => ChannelBinding::Disable,
            Some("require") => ChannelBinding::Require,
            Some(other) => {
                return Err(Error::Config {
                    key: format!("channel_binding={other}"),
                    reason: "expected disable, prefer or require",
                })
            }
        };
        let connect_timeout = match r.connect_timeout.or_else(|| env("PGCONNECT_TIMEOUT")) {
            Some(t) => {
                let secs: u64 = t.parse().map_err(|_| Error::Config {
                    key: format!("connect_timeout={t}"),
                    reason: "not a number of seconds",
                })?;
                (secs > 0).then(|| Duration::from_secs(secs.max(2)))
            }
            None => None,
        };
        // libpq: an integer, 0 meaning off (keepalives) or the system's
        // default (the others); tcp_user_timeout is in milliseconds.
        let number = |key: &str, v: Option<String>| -> Result<Option<u64>> {
            v.map(|v| {
                v.trim().parse::<u64>().map_err(|_| Error::Config {
                    key: format!("{key}={v}"),
                    reason: "not a non-negative integer",
                })
            })
            .transpose()
        };
        let keepalives = !matches!(number("keepalives", r.keepalives)?, Some(0));
        let secs = |n: Option<u64>| n.filter(|&n| n > 0).map(Duration::from_secs);
        let keepalives_idle = secs(number("keepalives_idle", r.keepalives_idle)?);
        let keepalives_interval = secs(number("keepalives_interval", r.keepalives_interval)?);
        let keepalives_count = match number("keepalives_count", r.keepalives_count)? {
            Some(n) if n > i32::MAX as u64 => {
                return Err(Error::Config {
                    key: format!("keepalives_count={n}"),
                    reason: "too large",
                })
            }
            n => n.filter(|&n| n > 0).map(|n| n as u32),
        };
        let tcp_user_timeout = number("tcp_user_timeout", r.tcp_user_timeout)?
            .filter(|&n| n > 0)
            .map(Duration::from_millis);
        Ok(Config {
            host,
            port,
            user,
            password: r.password.or_else(|| env("PGPASSWORD")),
            dbname,
            ssl_mode,
            ssl_root_cert: r
                .sslrootcert
                .or_else(|| env("PGSSLROOTCERT"))
                .map(PathBuf::from),
            ssl_direct,
            channel_binding,
            application_name: r.application_name.or_else(|| env("PGAPPNAME")),
            connect_timeout,
            keepalives,
            keepalives_idle,
            keepalives_interval,
            keepalives_count,
            tcp_user_timeout,
            passfile: r.passfile.or_else(|| env("PGPASSFILE")).map(PathBuf::from),
            alternate_hosts,
            target_session_attrs,
        })
    }

    /// Every host to try, in order: `host`/`port`, then `alternate_hosts`.
    pub fn hosts(&self) -> Vec<(String, u16)> {
        std::iter::once((self.host.clone(), self.port))
            .chain(self.alternate_hosts.iter().cloned())
            .collect()
    }

    /// This configuration with one host of [`hosts`](Self::hosts) only.
    pub fn with_host(&self, host: &str, port: u16) -> Config {
        Config {
            host: host.to_owned(),
            port,
            alternate_hosts: Vec::new(),
            ..self.clone()
        }
    }

    /// The Unix-domain socket this configuration connects to: in `host`'s
    /// directory if it is one; with no host, in the first default directory
    /// whose socket exists now (checked on every call, i.e. every connection
    /// attempt); otherwise `None` (TCP).
    ///
    /// ```
    /// use pgwal::Config;
    ///
    /// let c: Config = "host=/var/run/postgresql port=5433".parse().unwrap();
    /// assert_eq!(c.unix_socket().unwrap().to_str(), Some("/var/run/postgresql/.s.PGSQL.5433"));
    /// let c: Config = "host=127.0.0.1".parse().unwrap();
    /// assert!(c.unix_socket().is_none());
    /// ```
    pub fn unix_socket(&self) -> Option<PathBuf> {
        if self.host.is_empty() {
            return DEFAULT_SOCKET_DIRS
                .iter()
                .map(|d| socket_path(d, self.port))
                .find(|p| p.exists());
        }
        self.host
            .starts_with('/')
            .then(|| socket_path(&self.host, self.port))
    }

    /// The host name for TCP and TLS: `host`, or `localhost` without one.
    pub(crate) fn tcp_host(&self) -> &str {
        if self.host.is_empty() {
            "localhost"
        } else {
            &self.host
        }
    }

    /// The password to send: the configured one, else the password file's.
    pub fn resolve_password(&self) -> Option<String> {
        if let Some(p) = &self.password {
            return Some(p.clone());
        }
        let file = self
            .passfile
            .clone()
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass")))?;
        let text = std::fs::read_to_string(file).ok()?;
        // libpq matches a connection over the default socket directory as
        // `localhost`; any other socket directory matches by its path.
        let host = match self.host.as_str() {
            h if h.is_empty() || DEFAULT_SOCKET_DIRS.contains(&h.trim_end_matches('/')) => {
                "localhost"
            }
            h => h,
        };
        crate::pgpass::lookup(&text, host, self.port, &self.dbname, &self.user)
    }
}

/// Socket directories tried, in order, when no host is given: Debian's
/// packages, then upstream PostgreSQL's default.
const DEFAULT_SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

fn socket_path(dir: &str, port: u16) -> PathBuf {
    PathBuf::from(dir).join(format!(".s.PGSQL.{port}"))
}

impl FromStr for Config {
    type Err = Error;
    fn from_str(s: &str) -> Result<Config> {
        Config::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_quoting_and_escapes() {
        let c =
            Config::parse(r"host=h port=1 user=u password='it\'s a \\ test' dbname = d").unwrap();
        assert_eq!(c.password.as_deref(), Some(r"it's a \ test"));
        assert_eq!(c.dbname, "d");
        assert!(Config::parse("host").is_err());
        assert!(Config::parse("bogus=1").is_err());
        assert!(Config::parse("password='open").is_err());
        assert!(Config::parse("port=notaport").is_err());
    }

    #[test]
    fn keepalive_keywords() {
        let c = Config::parse("host=h").unwrap();
        assert!(c.keepalives);
        assert_eq!(c.keepalives_idle, None);
        assert_eq!(c.tcp_user_timeout, None);
        let c = Config::parse(
            "host=h keepalives=1 keepalives_idle=5 keepalives_interval=2 keepalives_count=3 \
             tcp_user_timeout=1500",
        )
        .unwrap();
        assert_eq!(c.keepalives_idle, Some(Duration::from_secs(5)));
        assert_eq!(c.keepalives_interval, Some(Duration::from_secs(2)));
        assert_eq!(c.keepalives_count, Some(3));
        assert_eq!(c.tcp_user_timeout, Some(Duration::from_millis(1500)));
        // 0: off (keepalives), the system's default (the others)
        let c = Config::parse("postgres://h/d?keepalives=0&keepalives_idle=0").unwrap();
        assert!(!c.keepalives);
        assert_eq!(c.keepalives_idle, None);
        for bad in [
            "keepalives=yes",
            "keepalives_idle=-1",
            "keepalives_count=99999999999",
        ] {
            assert!(Config::parse(&format!("host=h {bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn uri_forms() {
        let c =
            Config::parse("postgres://[::1]:7/x?application_name=a%20b&sslmode=disable").unwrap();
        assert_eq!(c.host, "::1");
        assert_eq!(c.port, 7);
        assert_eq!(c.application_name.as_deref(), Some("a b"));
        assert_eq!(c.ssl_mode, SslMode::Disable);
        assert!(Config::parse("postgres://h/d?sslmode=nope").is_err());
        assert!(Config::parse("postgres://h/d?x%zz=1").is_err());
        let c = Config::parse("postgresql://u@h?sslnegotiation=direct&sslmode=require").unwrap();
        assert!(c.ssl_direct);
        assert_eq!(c.user, "u");
    }

    #[test]
    fn unix_socket_hosts() {
        let c = Config::parse("postgresql://%2Frun%2Fpg:6000/db").unwrap();
        assert_eq!(c.host, "/run/pg");
        assert_eq!(
            c.unix_socket(),
            Some(PathBuf::from("/run/pg/.s.PGSQL.6000"))
        );
        let c = Config::parse("postgresql:///db?host=/run/pg&port=6001").unwrap();
        assert_eq!(
            c.unix_socket(),
            Some(PathBuf::from("/run/pg/.s.PGSQL.6001"))
        );
        assert!(Config::parse("host=@abstract").is_err());
        // No host: a default directory's socket if it exists at the time of
        // the call, else TCP to localhost.
        let port = 40000 + (std::process::id() % 20000) as u16;
        let c = Config::parse(&format!("port={port} user=u dbname=d")).unwrap();
        assert_eq!((c.host.as_str(), c.tcp_host()), ("", "localhost"));
        let sock = socket_path("/tmp", port);
        if !sock.exists() && !socket_path("/var/run/postgresql", port).exists() {
            assert_eq!(c.unix_socket(), None);
            std::fs::write(&sock, b"").unwrap();
            assert_eq!(c.unix_socket(), Some(sock.clone()));
            std::fs::remove_file(&sock).unwrap();
        }
        assert!(Config::parse("host=a,b port=1,2,3").is_err());
    }

    #[test]
    fn multi_host_strings() {
        let c = Config::parse("host=a,b,/tmp port=5432,5433,5434 target_session_attrs=read-write")
            .unwrap();
        assert_eq!(
            c.hosts(),
            [
                ("a".into(), 5432),
                ("b".into(), 5433),
                ("/tmp".into(), 5434)
            ]
        );
        assert_eq!(c.target_session_attrs, TargetSessionAttrs::ReadWrite);
        let c = Config::parse("host=a,b port=6000").unwrap();
        assert_eq!(c.hosts(), [("a".into(), 6000), ("b".into(), 6000)]);
        assert_eq!(c.target_session_attrs, TargetSessionAttrs::Any);
        let c: Config = "postgresql://u@a:5433,[::1]:5434,c/db?target_session_attrs=primary"
            .parse()
            .unwrap();
        assert_eq!(
            c.hosts(),
            [("a".into(), 5433), ("::1".into(), 5434), ("c".into(), 5432)]
        );
        assert_eq!(c.target_session_attrs, TargetSessionAttrs::Primary);
        assert_eq!(c.with_host("c", 5432).hosts(), [("c".into(), 5432)]);
        assert!(Config::parse("host=a target_session_attrs=writable").is_err());
    }

    #[test]
    fn pgpass_default_socket_dir_is_localhost() {
        let dir = std::env::temp_dir().join(format!("pgwal-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(&file, "localhost:5432:*:u:local\n/sock:5432:*:u:bypath\n").unwrap();
        let conf = |host: &str| {
            let mut c = Config::parse(&format!("host={host} port=5432 user=u dbname=d")).unwrap();
            c.passfile = Some(file.clone());
            c.password = None;
            c
        };
        assert_eq!(
            conf("/var/run/postgresql").resolve_password().as_deref(),
            Some("local")
        );
        assert_eq!(conf("/tmp/").resolve_password().as_deref(), Some("local"));
        assert_eq!(conf("''").resolve_password().as_deref(), Some("local"));
        assert_eq!(conf("/sock").resolve_password().as_deref(), Some("bypath"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
