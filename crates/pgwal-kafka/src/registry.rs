//! A client of a schema registry's Confluent-compatible REST API (Confluent
//! Schema Registry, Apicurio Registry's `ccompat` API, Karapace, Redpanda):
//! registering a subject's schema for its id, and setting a subject's
//! compatibility mode.
//!
//! Schemas are registered, never only looked up: registering a schema the
//! subject already has returns its id and changes nothing, and a new one is
//! checked by the registry against the subject's compatibility mode, which
//! refuses it with HTTP 409. That refusal ends the sink
//! ([`RegistryError::Incompatible`]) before any record of the new shape is
//! written: the Kafka transaction holding the change is never committed
//! and the slot never acknowledged past it, so after the mode or the
//! schema change is sorted out, the change comes again.
//!
//! Ids are kept per (subject, schema): a registry is asked once per shape
//! of a table per run. Unreachable registries and 5xx answers are retried
//! with backoff for `retry_for`; other answers are final.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

const CONTENT: &str = "application/vnd.schemaregistry.v1+json";

/// A subject's compatibility mode, the registry's `compatibility` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compatibility {
    /// A new schema reads data of the last one.
    Backward,
    /// ... of every earlier one.
    BackwardTransitive,
    /// The last schema reads data of the new one.
    Forward,
    /// Every earlier schema reads data of the new one.
    ForwardTransitive,
    /// Backward and forward, with the last schema.
    Full,
    /// ... with every earlier one.
    FullTransitive,
    /// No check.
    None,
}

impl Compatibility {
    /// The registry's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Compatibility::Backward => "BACKWARD",
            Compatibility::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Compatibility::Forward => "FORWARD",
            Compatibility::ForwardTransitive => "FORWARD_TRANSITIVE",
            Compatibility::Full => "FULL",
            Compatibility::FullTransitive => "FULL_TRANSITIVE",
            Compatibility::None => "NONE",
        }
    }
}

/// Which subject a record's schema is registered under, as the Confluent
/// serializers' `*.subject.name.strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SubjectStrategy {
    /// `<topic>-key`, `<topic>-value` (the default, Debezium's).
    #[default]
    TopicName,
    /// The record's full name (`<server>.<schema>.<table>.Envelope`).
    RecordName,
    /// `<topic>-<record's full name>`.
    TopicRecordName,
}

impl SubjectStrategy {
    /// The subject of a schema named `record` in `topic`'s keys (`key`) or
    /// values.
    pub fn subject(self, topic: &str, key: bool, record: &str) -> String {
        match self {
            SubjectStrategy::TopicName => {
                format!("{topic}-{}", if key { "key" } else { "value" })
            }
            SubjectStrategy::RecordName => record.to_owned(),
            SubjectStrategy::TopicRecordName => format!("{topic}-{record}"),
        }
    }
}

/// Where the registry is and how to use it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RegistryConfig {
    /// The API's base URL (`http://host:8081`, or Apicurio's
    /// `http://host:8080/apis/ccompat/v7`); `https` verifies the server's
    /// certificate and name. User and password in it are used as HTTP
    /// basic authentication.
    pub url: String,
    /// Basic authentication (Confluent Cloud: the API key and secret);
    /// overrides the URL's.
    pub basic_auth: Option<(String, String)>,
    /// PEM file of the CAs to trust for `https` (default: the Mozilla
    /// roots).
    pub ca_file: Option<PathBuf>,
    /// Set on each subject before its first schema of this run; `None`:
    /// the registry's default (global setting) applies.
    pub compatibility: Option<Compatibility>,
    /// Subject names.
    pub subject_strategy: SubjectStrategy,
    /// Limit of each request.
    pub timeout: Duration,
    /// How long an unreachable registry is retried.
    pub retry_for: Duration,
}

impl RegistryConfig {
    /// Defaults: the registry's own compatibility, topic-named subjects,
    /// 30 s per request, retried for 5 minutes.
    pub fn new(url: impl Into<String>) -> RegistryConfig {
        RegistryConfig {
            url: url.into(),
            basic_auth: None,
            ca_file: None,
            compatibility: None,
            subject_strategy: SubjectStrategy::TopicName,
            timeout: Duration::from_secs(30),
            retry_for: Duration::from_secs(300),
        }
    }
}

/// A registry that did not take a schema.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The URL cannot be used.
    #[error("schema registry URL {url:?}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The CA file.
    #[error("schema registry CA file {path:?}: {reason}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The subject's compatibility mode refuses the new schema (HTTP 409).
    /// Nothing of the change that needed it was written or acknowledged.
    #[error(
        "the schema registry refuses the new schema of subject {subject:?} under its \
         compatibility mode{}: {message}. Nothing from the transaction that changed the table \
         on was written to Kafka or acknowledged; set a mode that allows the change (registry \
         or --kafka-schema-compatibility), then restart", .mode.map(|m| format!(" ({})", m.as_str())).unwrap_or_default()
    )]
    Incompatible {
        /// The subject.
        subject: String,
        /// The mode pgwal set, if it set one.
        mode: Option<Compatibility>,
        /// The registry's explanation.
        message: String,
        /// The schema refused.
        schema: String,
    },
    /// An answer other than success, 409 or a retried one (401, 403,
    /// 422 for a schema the registry cannot parse, ...).
    #[error("the schema registry answered {status} to {what}: {message}")]
    Refused {
        /// What was asked.
        what: String,
        /// HTTP status.
        status: u16,
        /// The registry's `error_code`, if it gave one.
        error_code: Option<i64>,
        /// Its `message`, or the body.
        message: String,
    },
    /// The registry could not be reached (or answered 5xx) for
    /// `retry_for`.
    #[error("the schema registry at {url} failed for {:.0?}: {last}", .for_)]
    Unreachable {
        /// The URL.
        url: String,
        /// How long.
        for_: Duration,
        /// The last failure.
        last: String,
    },
}

/// What one request came to.
enum Answer {
    Ok(Value),
    Status(StatusCode, Value, String),
}

/// The API's base, parsed.
#[derive(Debug, Clone)]
struct Base {
    tls: bool,
    host: String,
    port: u16,
    /// Without a trailing `/`.
    path: String,
    auth: Option<String>,
}

fn parse_base(url: &str, basic: Option<&(String, String)>) -> Result<Base, RegistryError> {
    let bad = |reason: &str| RegistryError::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(bad("not an http or https URL")),
    };
    let authority = uri.authority().ok_or_else(|| bad("no host"))?.as_str();
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let auth = match (basic, userinfo) {
        (Some((u, p)), _) => Some(format!("{u}:{p}")),
        (None, Some(u)) => Some(u.to_owned()),
        (None, None) => None,
    }
    .map(|c| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(c)
        )
    });
    let default_port = if tls { 443 } else { 80 };
    let port = |p: Option<&str>| match p {
        Some(p) => p.parse::<u16>().map_err(|_| bad("bad port")),
        None => Ok(default_port),
    };
    let (host, port) = match hostport.strip_prefix('[') {
        // [v6]:port
        Some(rest) => {
            let (h, after) = rest.split_once(']').ok_or_else(|| bad("bad host"))?;
            (h.to_owned(), port(after.strip_prefix(':'))?)
        }
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), port(Some(p))?),
            None => (hostport.to_owned(), port(None)?),
        },
    };
    Ok(Base {
        tls,
        host,
        port,
        path: uri.path().trim_end_matches('/').to_owned(),
        auth,
    })
}

/// Percent-encodes a path segment.
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The registry client, with the ids it was given this run.
pub struct SchemaRegistry {
    config: RegistryConfig,
    base: Base,
    tls: Option<tokio_rustls::TlsConnector>,
    ids: HashMap<(String, Arc<str>), u32>,
    configured: HashSet<String>,
}

impl std::fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaRegistry")
            .field("url", &self.config.url)
            .field("schemas", &self.ids.len())
            .finish()
    }
}

impl SchemaRegistry {
    /// A client; no request is made yet.
    pub fn new(config: RegistryConfig) -> Result<SchemaRegistry, RegistryError> {
        let base = parse_base(&config.url, config.basic_auth.as_ref())?;
        let tls = if base.tls {
            Some(tls_connector(config.ca_file.as_ref())?)
        } else {
            None
        };
        Ok(SchemaRegistry {
            config,
            base,
            tls,
            ids: HashMap::new(),
            configured: HashSet::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The id of Avro schema `schema` in `subject`, registering it if the
    /// subject does not have it (after setting the subject's compatibility
    /// mode, once per run, if one is configured).
    pub async fn id(&mut self, subject: &str, schema: &Arc<str>) -> Result<u32, RegistryError> {
        if let Some(id) = self.ids.get(&(subject.to_owned(), schema.clone())) {
            return Ok(*id);
        }
        if let Some(mode) = self.config.compatibility {
            if !self.configured.contains(subject) {
                let path = format!("/config/{}", segment(subject));
                let body = json!({ "compatibility": mode.as_str() });
                match self.request(Method::PUT, &path, &body).await? {
                    Answer::Ok(_) => {}
                    Answer::Status(status, v, text) => {
                        return Err(refused(&format!("PUT {path}"), status, &v, text))
                    }
                }
                self.configured.insert(subject.to_owned());
            }
        }
        let path = format!("/subjects/{}/versions", segment(subject));
        let body = json!({ "schema": schema.as_ref() });
        let id = match self.request(Method::POST, &path, &body).await? {
            Answer::Ok(v) => v
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| RegistryError::Refused {
                    what: format!("POST {path}"),
                    status: 200,
                    error_code: None,
                    message: format!("an answer without a schema id: {v}"),
                })?,
            Answer::Status(StatusCode::CONFLICT, v, text) => {
                return Err(RegistryError::Incompatible {
                    subject: subject.to_owned(),
                    mode: self.config.compatibility,
                    message: v
                        .get("message")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .unwrap_or(text),
                    schema: schema.to_string(),
                })
            }
            Answer::Status(status, v, text) => {
                return Err(refused(&format!("POST {path}"), status, &v, text))
            }
        };
        tracing::info!(subject, id, "schema registered");
        self.ids.insert((subject.to_owned(), schema.clone()), id);
        Ok(id)
    }

    /// One request, retried while the registry is unreachable or answers
    /// 5xx, for `retry_for`.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: &Value,
    ) -> Result<Answer, RegistryError> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            let last = match tokio::time::timeout(
                self.config.timeout,
                self.once(method.clone(), path, body),
            )
            .await
            {
                Ok(Ok(Answer::Status(s, _, text))) if s.is_server_error() => {
                    format!("HTTP {s}: {text}")
                }
                Ok(Ok(a)) => return Ok(a),
                Ok(Err(e)) => e,
                Err(_) => format!("no answer in {:?}", self.config.timeout),
            };
            if started.elapsed() >= self.config.retry_for {
                return Err(RegistryError::Unreachable {
                    url: self.config.url.clone(),
                    for_: started.elapsed(),
                    last,
                });
            }
            tracing::warn!(url = %self.config.url, error = %last, "schema registry failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn once(&self, method: Method, path: &str, body: &Value) -> Result<Answer, String> {
        let b = &self.base;
        let tcp = TcpStream::connect((b.host.as_str(), b.port))
            .await
            .map_err(|e| format!("connecting to {}:{}: {e}", b.host, b.port))?;
        let _ = tcp.set_nodelay(true);
        let uri = format!("{}{path}", b.path);
        let mut req = Request::builder()
            .method(method)
            .uri(&uri)
            .header(HOST, format!("{}:{}", b.host, b.port))
            .header(CONTENT_TYPE, CONTENT)
            .header(hyper::header::ACCEPT, CONTENT);
        if let Some(a) = &b.auth {
            req = req.header(AUTHORIZATION, a);
        }
        let req = req
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| e.to_string())?;
        let response = match &self.tls {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(b.host.clone())
                    .map_err(|e| format!("server name {:?}: {e}", b.host))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS with {}: {e}", b.host))?;
                send(TokioIo::new(stream), req).await?
            }
            None => send(TokioIo::new(tcp), req).await?,
        };
        let (status, bytes) = response;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(if status.is_success() {
            Answer::Ok(v)
        } else {
            Answer::Status(status, v, text)
        })
    }
}

/// One HTTP/1.1 exchange on `io`.
async fn send<T>(io: TokioIo<T>, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    drop(sender);
    let _ = conn.await;
    Ok((status, body))
}

fn refused(what: &str, status: StatusCode, v: &Value, text: String) -> RegistryError {
    RegistryError::Refused {
        what: what.to_owned(),
        status: status.as_u16(),
        error_code: v.get("error_code").and_then(Value::as_i64),
        message: v
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or(text),
    }
}

fn tls_connector(ca: Option<&PathBuf>) -> Result<tokio_rustls::TlsConnector, RegistryError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let bad = |reason: String| RegistryError::CaFile {
                path: path.clone(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                roots
                    .add(cert.map_err(|e| bad(e.to_string()))?)
                    .map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("no certificate in it".into()));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RegistryError::Url {
            url: String::new(),
            reason: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_subjects() {
        let b = parse_base("http://u:p@127.0.0.1:8080/apis/ccompat/v7/", None).unwrap();
        assert_eq!((b.tls, b.host.as_str(), b.port), (false, "127.0.0.1", 8080));
        assert_eq!(b.path, "/apis/ccompat/v7");
        assert_eq!(b.auth.as_deref(), Some("Basic dTpw"));
        let b = parse_base(
            "https://registry.example:443",
            Some(&("key".into(), "secret".into())),
        )
        .unwrap();
        assert!(b.tls && b.path.is_empty() && b.port == 443);
        assert_eq!(b.auth.as_deref(), Some("Basic a2V5OnNlY3JldA=="));
        assert_eq!(parse_base("https://[::1]/x", None).unwrap().host, "::1");
        assert!(parse_base("ftp://x", None).is_err());
        let s = SubjectStrategy::TopicName;
        assert_eq!(s.subject("app.public.t", true, "r"), "app.public.t-key");
        assert_eq!(
            SubjectStrategy::TopicRecordName.subject("t", false, "a.B"),
            "t-a.B"
        );
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
    }
}
