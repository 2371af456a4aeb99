//! Metrics: OpenTelemetry instruments, read by Prometheus on the metrics port
//! (`/metrics`, next to `/healthz` and `/readyz`) and pushed over OTLP when
//! the standard variables configure it (see `telemetry`).
//!
//! Everything but the process series (below) is recorded through the
//! OpenTelemetry metrics API. The
//! Prometheus side is `opentelemetry-prometheus` (the OpenTelemetry project's
//! pull exporter, released in step with the SDK) rendering into a
//! `prometheus` registry that `/metrics` encodes as text. Each server has
//! its own meter provider, so several servers in one process (tests) never
//! share a series.
//!
//! The call path records one call-duration sample per RPC as two atomic
//! adds in a table of its own ([`calls`]: the OpenTelemetry SDK's histogram
//! cost a Start about 1,700 instructions; with OTLP metric export on, that
//! histogram is kept, since OTLP reads only SDK instruments), and on the
//! NATS backend one SDK histogram sample per store request. Everything else
//! is observed when a reader collects: the registry's per-shard counters
//! ([`crate::stats`]), the watch counters and the NATS backend's atomics,
//! read at scrape time.
//!
//! The series, with their Prometheus names (the README lists them too). The
//! `respcoord_nats_*` ones exist only with `--backend nats`:
//!
//! | OpenTelemetry name | Prometheus | labels |
//! |---|---|---|
//! | `rpc.server.call.duration` (histogram, s) | `rpc_server_call_duration_seconds_{bucket,sum,count}` | `rpc_system_name`, `rpc_method`, `rpc_response_status_code` |
//! | `respcoord.transitions` | `respcoord_transitions_total` | `kind` |
//! | `respcoord.sessions` | `respcoord_sessions` | `phase` |
//! | `respcoord.events` | `respcoord_events_total` | `kind` |
//! | `respcoord.watchers` | `respcoord_watchers` | `scope` |
//! | `respcoord.watchers.lagged` | `respcoord_watchers_lagged_total` | `scope` |
//! | `respcoord.responses.ended` | `respcoord_responses_ended_total` | `outcome`: `completed`, `failed`, `superseded`, `requested`, `shutdown`, `expired` |
//! | `respcoord.responses.duration` (s, summed) | `respcoord_responses_duration_seconds_total` | `outcome` |
//! | `respcoord.responses.stopped` | `respcoord_responses_stopped_total` | `reason`: `superseded`, `requested`, `shutdown`, `expired`; `source`: `client`, `vad`, `unspecified`, `none` |
//! | `respcoord.sessions.expired` | `respcoord_sessions_expired_total` | |
//! | `respcoord.request_id.replays` | `respcoord_request_id_replays_total` | |
//! | `respcoord.nats.cas_conflicts` | `respcoord_nats_cas_conflicts_total` | |
//! | `respcoord.nats.store.retries` | `respcoord_nats_store_retries_total` | `reason`: `not_ready`, `no_responders`, `timeout`, `other` |
//! | `respcoord.nats.store.duration` (histogram, s) | `respcoord_nats_store_duration_seconds_{bucket,sum,count}` | `op`: `read`, `write`, `purge`, `quorum_point` |
//! | `respcoord.nats.connected` | `respcoord_nats_connected` | |
//! | `respcoord.nats.reconnects` | `respcoord_nats_reconnects_total` | |
//! | `respcoord.nats.lame_duck_events` | `respcoord_nats_lame_duck_events_total` | |
//! | `respcoord.nats.follower.lag_messages` | `respcoord_nats_follower_lag_messages` | |
//! | `respcoord.nats.follower.restarts` | `respcoord_nats_follower_restarts_total` | |
//! | `respcoord.nats.expiry_lease.held` | `respcoord_nats_expiry_lease_held` | |
//!
//! On Linux `/metrics` also has the standard process series, from procfs
//! at scrape time and not through OpenTelemetry (`process`, which says
//! why): `process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`.

pub mod calls;
#[cfg(target_os = "linux")]
mod process;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};
use opentelemetry::{
    metrics::{AsyncInstrument, Histogram, Meter, MeterProvider as _},
    KeyValue,
};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use tokio::net::TcpListener;

use self::calls::{CallDurations, CallDurationsCollector, Method, DURATION_BUCKETS};
use crate::{
    backend::Coordinator,
    grpc::status,
    nats::{NatsCounts, RETRY_REASONS},
    stats::{TransitionKind, EVENT_KINDS, OUTCOMES, STOPPERS, STOP_REASONS},
    watchers::{WatchKind, WatchStats},
};

/// What the observed instruments read.
#[derive(Clone)]
pub struct Sources {
    pub coordinator: Coordinator,
    pub watches: Arc<WatchStats>,
}

/// Why the metrics pipeline could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("Prometheus exporter: {0}")]
    Prometheus(#[from] opentelemetry_sdk::error::OTelSdkError),
    #[error("OTEL_EXPORTER_OTLP_*: {0}")]
    Otlp(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The per-RPC instrument, handed to the observation layer: the table
/// `/metrics` reads ([`calls`]), or with OTLP metric export on the SDK's
/// histogram, which both readers take.
#[derive(Clone, Debug)]
pub enum RpcMetrics {
    Table(Arc<CallDurations>),
    Sdk(Histogram<f64>),
}

impl RpcMetrics {
    /// One finished call. `method` is the call's method (or `_OTHER` for
    /// methods the server does not have), `code` its status code.
    pub fn record_call(&self, method: Method, code: tonic::Code, elapsed: Duration) {
        match self {
            RpcMetrics::Table(table) => table.record(method, code, elapsed),
            RpcMetrics::Sdk(histogram) => histogram.record(
                elapsed.as_secs_f64(),
                &[
                    KeyValue::new("rpc.system.name", "grpc"),
                    KeyValue::new("rpc.method", method.name()),
                    KeyValue::new("rpc.response.status_code", status::code_name(code)),
                ],
            ),
        }
    }
}

/// One server's metrics pipeline.
pub struct Metrics {
    provider: SdkMeterProvider,
    prometheus: prometheus::Registry,
    rpc: RpcMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Builds the instruments over `sources`; with `otlp`, also pushes them
    /// every `OTEL_METRIC_EXPORT_INTERVAL` (default 60 s) over OTLP/gRPC
    /// (build it inside the tokio runtime).
    pub fn new(sources: Sources, otlp: bool) -> Result<Self, MetricsError> {
        let prometheus = prometheus::Registry::new();
        #[cfg(target_os = "linux")]
        match process::ProcessCollector::new() {
            Some(collector) => {
                if let Err(error) = prometheus.register(Box::new(collector)) {
                    tracing::warn!(%error, "process metrics");
                }
            }
            None => tracing::warn!("process metrics: /proc is not readable"),
        }
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(prometheus.clone())
            .scope_info_enabled(false)
            .build()?;
        let mut builder = SdkMeterProvider::builder()
            .with_reader(exporter)
            .with_resource(crate::telemetry::resource());
        if otlp {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .build()?;
            builder = builder.with_periodic_exporter(exporter);
        }
        let provider = builder.build();
        let meter = provider.meter("respcoord");
        let rpc = rpc_metrics(&meter, &prometheus, otlp);
        observe_nats(&meter, &sources.coordinator);
        observe(&meter, sources);
        Ok(Self {
            provider,
            prometheus,
            rpc,
        })
    }

    pub fn rpc(&self) -> RpcMetrics {
        self.rpc.clone()
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(error) =
            prometheus::TextEncoder::new().encode_utf8(&self.prometheus.gather(), &mut out)
        {
            tracing::warn!(%error, "rendering metrics");
        }
        out
    }

    /// Pushes the last OTLP export, if any. Blocks while it does: call it
    /// from a blocking thread.
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::debug!(%error, "metrics shutdown");
        }
    }
}

/// The call-duration instrument: the SDK's histogram when OTLP exports
/// metrics (OTLP reads only SDK instruments; the Prometheus reader takes it
/// too), else the table `/metrics` reads at scrape time (`calls`).
fn rpc_metrics(meter: &Meter, prometheus: &prometheus::Registry, otlp: bool) -> RpcMetrics {
    if otlp {
        RpcMetrics::Sdk(
            meter
                .f64_histogram("rpc.server.call.duration")
                .with_unit("s")
                .with_description(calls::HELP)
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
        )
    } else {
        let table = Arc::new(CallDurations::default());
        match CallDurationsCollector::new(Arc::clone(&table)) {
            Ok(collector) => {
                if let Err(error) = prometheus.register(Box::new(collector)) {
                    tracing::warn!(%error, "call duration metrics");
                }
            }
            Err(error) => tracing::warn!(%error, "call duration metrics"),
        }
        RpcMetrics::Table(table)
    }
}

/// Registers the instruments read at collection time. The meter provider
/// keeps their callbacks for its lifetime.
fn observe(meter: &Meter, sources: Sources) {
    observe_sessions(meter, &sources.coordinator);
    observe_responses(meter, &sources.coordinator);
    observe_watches(meter, &sources.watches);
}

/// Transitions, sessions by phase, events and expiries.
fn observe_sessions(meter: &Meter, source: &Coordinator) {
    let coordinator = source.clone();
    meter
        .u64_observable_counter("respcoord.transitions")
        .with_unit("{transition}")
        .with_description("Session state changes applied, by kind")
        .with_callback(move |observer| {
            let stats = coordinator.stats();
            for kind in TransitionKind::ALL {
                observer.observe(
                    stats.transitions_of(kind),
                    &[KeyValue::new("kind", kind.as_str())],
                );
            }
        })
        .build();

    let coordinator = source.clone();
    meter
        .i64_observable_up_down_counter("respcoord.sessions")
        .with_unit("{session}")
        .with_description("Sessions held, by phase (terminated ones are tombstones)")
        .with_callback(move |observer| {
            let sessions = coordinator.stats().sessions;
            let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            for (phase, n) in [
                ("idle", sessions.idle),
                ("active", sessions.active),
                ("terminated", sessions.terminated),
            ] {
                observer.observe(count(n), &[KeyValue::new("phase", phase)]);
            }
        })
        .build();

    let coordinator = source.clone();
    meter
        .u64_observable_counter("respcoord.events")
        .with_unit("{event}")
        .with_description("Lifecycle events emitted, by kind")
        .with_callback(move |observer| {
            let stats = coordinator.stats();
            for (kind, n) in EVENT_KINDS.into_iter().zip(stats.events) {
                observer.observe(n, &[KeyValue::new("kind", kind)]);
            }
        })
        .build();

    let coordinator = source.clone();
    meter
        .u64_observable_counter("respcoord.sessions.expired")
        .with_unit("{session}")
        .with_description("Sessions shut down for idleness (reason EXPIRED)")
        .with_callback(move |observer| observer.observe(coordinator.stats().expiries(), &[]))
        .build();
}

/// Responses ended and stopped, the time they ran, and Start replays.
fn observe_responses(meter: &Meter, source: &Coordinator) {
    let coordinator = source.clone();
    meter
        .u64_observable_counter("respcoord.responses.ended")
        .with_unit("{response}")
        .with_description(
            "Responses ended, by outcome: completed, failed, or the reason it was stopped",
        )
        .with_callback(move |observer| {
            let stats = coordinator.stats();
            for (outcome, n) in OUTCOMES.into_iter().zip(stats.ended) {
                observer.observe(n, &[KeyValue::new("outcome", outcome)]);
            }
        })
        .build();

    let coordinator = source.clone();
    meter
        .f64_observable_counter("respcoord.responses.duration")
        .with_unit("s")
        .with_description(
            "Time the ended responses ran, from started to ended, summed by outcome \
             (divide by respcoord_responses_ended_total for the mean)",
        )
        .with_callback(move |observer| {
            let stats = coordinator.stats();
            for (outcome, nanos) in OUTCOMES.into_iter().zip(stats.ended_nanos) {
                observer.observe(nanos as f64 / 1e9, &[KeyValue::new("outcome", outcome)]);
            }
        })
        .build();

    let coordinator = source.clone();
    meter
        .u64_observable_counter("respcoord.responses.stopped")
        .with_unit("{response}")
        .with_description(
            "Responses stopped before their Finish, by reason and by who stopped them \
             (the source of the superseding Start or of the Cancel; none for a teardown)",
        )
        .with_callback(move |observer| {
            let stats = coordinator.stats();
            for (reason, row) in STOP_REASONS.into_iter().zip(stats.stopped) {
                for (source, n) in STOPPERS.into_iter().zip(row) {
                    observer.observe(
                        n,
                        &[
                            KeyValue::new("reason", reason),
                            KeyValue::new("source", source),
                        ],
                    );
                }
            }
        })
        .build();

    let coordinator = source.clone();
    meter
        .u64_observable_counter("respcoord.request_id.replays")
        .with_unit("{call}")
        .with_description("Start calls answered from the request_id replay window")
        .with_callback(move |observer| observer.observe(coordinator.stats().replays, &[]))
        .build();
}

/// Open watches and watches ended for lag, by scope.
fn observe_watches(meter: &Meter, watches: &Arc<WatchStats>) {
    let open = Arc::clone(watches);
    meter
        .i64_observable_up_down_counter("respcoord.watchers")
        .with_unit("{watcher}")
        .with_description("Open Watch streams, by scope (one session or all)")
        .with_callback(move |observer| {
            for kind in [WatchKind::Session, WatchKind::All] {
                observer.observe(
                    i64::try_from(open.open(kind)).unwrap_or(i64::MAX),
                    &[KeyValue::new("scope", kind.as_str())],
                );
            }
        })
        .build();

    let watches = Arc::clone(watches);
    meter
        .u64_observable_counter("respcoord.watchers.lagged")
        .with_unit("{watcher}")
        .with_description("Watches ended with RESOURCE_EXHAUSTED for falling behind, by scope")
        .with_callback(move |observer| {
            for kind in [WatchKind::Session, WatchKind::All] {
                observer.observe(
                    watches.lagged(kind),
                    &[KeyValue::new("scope", kind.as_str())],
                );
            }
        })
        .build();
}

/// A callback observing one number of the NATS backend's counters.
fn reading(
    coordinator: &Coordinator,
    field: fn(&NatsCounts) -> u64,
) -> impl Fn(&dyn AsyncInstrument<u64>) + Send + Sync + 'static {
    let coordinator = coordinator.clone();
    move |observer| {
        if let Some(counts) = coordinator.nats_stats() {
            observer.observe(field(&counts), &[]);
        }
    }
}

/// The NATS store's request latency, recorded by the backend.
fn observe_nats_store(meter: &Meter, coordinator: &Coordinator) {
    coordinator.record_store_latency(
        meter
            .f64_histogram("respcoord.nats.store.duration")
            .with_unit("s")
            .with_description(
                "Round trip of each NATS store request (a retried request is \
                 one sample per try), by operation",
            )
            .with_boundaries(DURATION_BUCKETS.to_vec())
            .build(),
    );
}

/// Registers the NATS backend's instruments, on that backend only: the
/// memory backend has no `respcoord_nats_*` series at all.
fn observe_nats(meter: &Meter, coordinator: &Coordinator) {
    if coordinator.nats_stats().is_none() {
        return;
    }
    observe_nats_store(meter, coordinator);
    meter
        .u64_observable_counter("respcoord.nats.cas_conflicts")
        .with_unit("{conflict}")
        .with_description(
            "Compare-and-set writes and purges that found the session moved on \
             (another replica, or a stale read); each costs a fresh read",
        )
        .with_callback(reading(coordinator, |n| n.cas_conflicts))
        .build();

    let retries = coordinator.clone();
    meter
        .u64_observable_counter("respcoord.nats.store.retries")
        .with_unit("{request}")
        .with_description("NATS store requests tried again after a transient failure, by reason")
        .with_callback(move |observer| {
            if let Some(counts) = retries.nats_stats() {
                for (reason, n) in RETRY_REASONS.into_iter().zip(counts.store_retries) {
                    observer.observe(n, &[KeyValue::new("reason", reason)]);
                }
            }
        })
        .build();

    meter
        .u64_observable_gauge("respcoord.nats.connected")
        .with_description("1 while this replica is connected to NATS, else 0")
        .with_callback(reading(coordinator, |n| u64::from(n.connected)))
        .build();

    meter
        .u64_observable_counter("respcoord.nats.reconnects")
        .with_unit("{connection}")
        .with_description("Connections to NATS made after the first")
        .with_callback(reading(coordinator, |n| n.reconnects))
        .build();

    meter
        .u64_observable_counter("respcoord.nats.lame_duck_events")
        .with_unit("{event}")
        .with_description("Lame-duck notices from NATS servers about to shut down")
        .with_callback(reading(coordinator, |n| n.lame_duck_events))
        .build();

    meter
        .u64_observable_gauge("respcoord.nats.follower.lag_messages")
        .with_unit("{message}")
        .with_description(
            "Stream sequences between the last this replica knows the bucket's \
             stream reached and the last its mirror applied",
        )
        .with_callback(reading(coordinator, |n| n.follower_lag))
        .build();

    meter
        .u64_observable_counter("respcoord.nats.follower.restarts")
        .with_unit("{restart}")
        .with_description("Restarts of the bucket follower (a broken or stalled consumer)")
        .with_callback(reading(coordinator, |n| n.follower_restarts))
        .build();

    meter
        .u64_observable_gauge("respcoord.nats.expiry_lease.held")
        .with_description("1 while this replica holds the expirer lease, else 0")
        .with_callback(reading(coordinator, |n| u64::from(n.expiry_lease_held)))
        .build();
}

/// Whether the server takes new calls: true from start until shutdown
/// begins. `/readyz` answers from it.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct Port {
    metrics: Arc<Metrics>,
    readiness: Readiness,
}

/// The metrics port's routes: `/metrics` (Prometheus text), `/healthz`
/// (200 while the process runs: liveness), `/readyz` (200 while serving,
/// 503 once shutdown began: readiness). No authentication: bind it where
/// only the scraper and the kubelet reach it.
pub fn router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(Port { metrics, readiness })
}

async fn scrape(State(port): State<Port>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        port.metrics.render(),
    )
}

async fn ready(State(port): State<Port>) -> impl IntoResponse {
    if port.readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    }
}

/// Serves `routes` ([`router`], and the web view's when it is on) on
/// `listener` until `stop` resolves.
pub async fn serve_port(
    listener: TcpListener,
    routes: Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::debug!(
        addr = addr.map(tracing::field::display),
        "metrics port serving /metrics, /healthz, /readyz"
    );
    axum::serve(listener, routes)
        .with_graceful_shutdown(stop)
        .await
}
