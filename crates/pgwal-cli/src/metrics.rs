//! `pgwal stream --metrics ADDR`: the stream's counters in the Prometheus
//! exposition format (OpenMetrics text, `prometheus-client`), served over
//! HTTP (`hyper`) at `/metrics`, with health checks for a supervisor:
//! `/livez` (200 while the process serves) and `/readyz` (200 while it
//! streams, 503 otherwise).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The label of `pgwal_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Kind {
    kind: String,
}

/// What `pgwal stream` reports.
#[derive(Clone, Default)]
pub(crate) struct StreamMetrics {
    events: Family<Kind, Counter>,
    output_bytes: Counter,
    reconnects: Counter,
    consumer_wait: Counter<f64, AtomicU64>,
    acked: Gauge,
    confirmed: Gauge,
    server_end: Gauge,
    lag_bytes: Gauge,
    lag_seconds: Gauge<f64, AtomicU64>,
    slot_safe_wal: Gauge,
}

/// Whether pgwal streams now (`/readyz`).
pub(crate) type Ready = Arc<dyn Fn() -> bool + Send + Sync>;

impl StreamMetrics {
    /// A registry holding these metrics.
    pub(crate) fn registry(&self) -> Registry {
        let mut r = Registry::default();
        self.register(&mut r);
        r
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "pgwal_events",
            "Events written, by kind (begin, insert, commit, ...)",
            self.events.clone(),
        );
        r.register(
            "pgwal_output_bytes",
            "Bytes of JSON lines written to stdout",
            self.output_bytes.clone(),
        );
        r.register(
            "pgwal_reconnects",
            "Sessions started again after a lost connection",
            self.reconnects.clone(),
        );
        r.register(
            "pgwal_consumer_wait_seconds",
            "Time spent writing output, nearly all of it waiting for a consumer that does not keep up",
            self.consumer_wait.clone(),
        );
        r.register(
            "pgwal_acked_lsn",
            "Highest position acknowledged as processed (as an integer)",
            self.acked.clone(),
        );
        r.register(
            "pgwal_confirmed_lsn",
            "Position last confirmed to the server's slot (as an integer)",
            self.confirmed.clone(),
        );
        r.register(
            "pgwal_server_wal_end_lsn",
            "The server's WAL end from its latest message (as an integer)",
            self.server_end.clone(),
        );
        r.register(
            "pgwal_lag_bytes",
            "Bytes of server WAL beyond what the slot confirmed or the consumer acknowledged",
            self.lag_bytes.clone(),
        );
        r.register(
            "pgwal_lag_seconds",
            "When the last commit was written: how long after its commit on the server",
            self.lag_seconds.clone(),
        );
        r.register(
            "pgwal_slot_safe_wal_bytes",
            "WAL that may still be written before max_slot_wal_keep_size invalidates the slot (-1: no limit)",
            self.slot_safe_wal.clone(),
        );
    }

    /// Only the slot's room, beside other metrics (the Kafka sink's).
    pub(crate) fn register_slot_room(&self, r: &mut Registry) {
        r.register(
            "pgwal_slot_safe_wal_bytes",
            "WAL that may still be written before max_slot_wal_keep_size invalidates the slot (-1: no limit)",
            self.slot_safe_wal.clone(),
        );
    }

    pub(crate) fn slot_room(&self, r: crate::slot_watch::SlotRoom) {
        self.slot_safe_wal.set(r.safe_wal_bytes.unwrap_or(-1));
    }

    pub(crate) fn event(&self, kind: &str, bytes: usize) {
        self.events
            .get_or_create(&Kind {
                kind: kind.to_owned(),
            })
            .inc();
        self.output_bytes.inc_by(bytes as u64);
        if kind == "reconnect" {
            self.reconnects.inc();
        }
    }

    pub(crate) fn consumer_wait(&self, d: Duration) {
        self.consumer_wait.inc_by(d.as_secs_f64());
    }

    pub(crate) fn commit_lag(&self, seconds: f64) {
        self.lag_seconds.set(seconds.max(0.0));
    }

    pub(crate) fn positions(&self, acked: u64, confirmed: u64, server_end: u64) {
        self.acked.set(acked as i64);
        self.confirmed.set(confirmed as i64);
        self.server_end.set(server_end as i64);
        self.lag_bytes
            .set(server_end.saturating_sub(acked.max(confirmed)) as i64);
    }
}

/// Binds `addr` and serves `/metrics`, `/livez` and `/readyz` until the
/// process ends; returns the bound address (port 0 picks one).
pub(crate) async fn serve(
    addr: SocketAddr,
    registry: Registry,
    ready: Ready,
) -> std::io::Result<SocketAddr> {
    let registry = Arc::new(registry);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let registry = registry.clone();
            let ready = ready.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let registry = registry.clone();
                    let ready = ready.clone();
                    async move { Ok::<_, Infallible>(respond(&req, &registry, &ready)) }
                });
                // a scraper that disconnects mid-response is its own business
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    Ok(bound)
}

fn respond(req: &Request<Incoming>, registry: &Registry, ready: &Ready) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    match req.uri().path() {
        "/metrics" => {}
        "/livez" => {
            *resp.body_mut() = Full::new(Bytes::from_static(b"live\n"));
            return resp;
        }
        "/readyz" => {
            if ready() {
                *resp.body_mut() = Full::new(Bytes::from_static(b"ready\n"));
            } else {
                *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                *resp.body_mut() = Full::new(Bytes::from_static(b"not streaming\n"));
            }
            return resp;
        }
        _ => {
            *resp.status_mut() = StatusCode::NOT_FOUND;
            return resp;
        }
    }
    let mut body = String::new();
    if encode(&mut body, registry).is_err() {
        *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return resp;
    }
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    *resp.body_mut() = Full::new(Bytes::from(body));
    resp
}
