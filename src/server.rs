//! Server assembly: the coordinator service behind authentication and
//! limits, gRPC health and reflection, TLS, the per-RPC observation layer,
//! the metrics port, the expiry task, and graceful shutdown.
//!
//! What a call passes through, outside in:
//! - TLS (optional, mutual with a client CA);
//! - tonic's per-call deadline: the shorter of the caller's `grpc-timeout`
//!   and `--request-timeout`;
//! - [`ObserveLayer`]: span, trace context, call metrics, debug log;
//! - the router; health is reached directly (probes are never shed, never
//!   need a token);
//! - coordinator and reflection: load shedding over one global concurrency
//!   limit ([`Guarded`], `server::guard`): a call beyond
//!   `--max-concurrent-calls` in flight is answered UNAVAILABLE at once
//!   rather than queued;
//! - coordinator only: the bearer-token interceptor (`auth`), always, also
//!   with authentication off (it records the every-session scope the service
//!   requires), then the service with its message size limits.
//!
//! TLS material is read and checked in `server::tls`.
//!
//! Shutdown order (SIGTERM or the caller's signal): `/readyz` turns 503 and
//! health NOT_SERVING for both service names; open watches end with OK; the
//! server stops accepting and lets in-flight calls finish for up to the grace
//! period; then the metrics port closes.

mod guard;
mod tls;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server};
use tonic_health::ServingStatus;
use tower::limit::GlobalConcurrencyLimitLayer;

pub use self::{
    guard::Guarded,
    tls::{Pem, TlsConfig},
};
use crate::{
    auth::{Authenticated, Authenticator, Tokens},
    backend::Coordinator,
    grpc::{observe::ObserveLayer, CoordinatorService, WatchSettings},
    metrics::{self, Metrics, Readiness, Sources},
    proto::{self, v1::response_coordinator_server::ResponseCoordinatorServer},
    registry::Registry,
    shared::CoordConfig,
    web,
};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub registry: CoordConfig,
    pub watch: WatchSettings,
    /// How long in-flight calls may run after shutdown begins.
    pub shutdown_grace: Duration,
    pub limits: Limits,
    /// Serve TLS (mutual TLS with a client CA) instead of plaintext.
    pub tls: Option<TlsConfig>,
    /// Require a bearer token from this set on coordinator calls.
    pub auth: Option<Tokens>,
    /// Also push metrics over OTLP (`telemetry::OtlpSignals`).
    pub otlp_metrics: bool,
    /// Serve the read-only web view on the metrics port (`web`).
    pub web_ui: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            registry: CoordConfig::default(),
            watch: WatchSettings::default(),
            shutdown_grace: Duration::from_secs(10),
            limits: Limits::default(),
            tls: None,
            auth: None,
            otlp_metrics: false,
            web_ui: false,
        }
    }
}

/// Resource limits of the gRPC server; see `config` for their flags.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest a call may take before its response starts; a shorter
    /// `grpc-timeout` from the caller wins. Watch streams are not cut by it.
    pub request_timeout: Duration,
    /// Calls in flight at once (coordinator and reflection); beyond it calls
    /// are answered UNAVAILABLE at once.
    pub max_concurrent_calls: usize,
    /// Largest request or response message.
    pub max_message_bytes: usize,
    /// HTTP/2 PING interval on idle connections (`None`: no pings).
    pub http2_keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// Concurrent HTTP/2 streams (calls, watches) per connection.
    pub max_concurrent_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            max_concurrent_calls: 1024,
            max_message_bytes: 4 * 1024 * 1024,
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(20),
            max_concurrent_streams: 1024,
        }
    }
}

/// The sockets a server serves: gRPC, and optionally the metrics port.
#[derive(Debug)]
pub struct Listeners {
    pub grpc: TcpListener,
    pub metrics: Option<TcpListener>,
}

impl From<TcpListener> for Listeners {
    fn from(grpc: TcpListener) -> Self {
        Self {
            grpc,
            metrics: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] metrics::MetricsError),
}

/// Serves on `listeners` until `shutdown` resolves, then drains.
pub async fn serve(
    config: ServerConfig,
    listeners: impl Into<Listeners>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_coordinator(
        Registry::new(config.registry).into(),
        config,
        listeners,
        shutdown,
    )
    .await
}

/// As [`serve`], over a coordinator the caller built (the NATS backend, or a
/// registry a test inspects).
pub async fn serve_coordinator(
    backend: Coordinator,
    config: ServerConfig,
    listeners: impl Into<Listeners>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listeners = listeners.into();
    let stop = CancellationToken::new();
    let readiness = Readiness::default();
    readiness.set(true);
    let (health, health_service) = tonic_health::server::health_reporter();
    serving(&health).await;

    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let service = Arc::new(CoordinatorService::new(
        backend.clone(),
        config.watch,
        stop.clone(),
    ));
    let metrics = Arc::new(Metrics::new(
        Sources {
            coordinator: backend.clone(),
            watches: service.watch_stats(),
        },
        config.otlp_metrics,
    )?);

    let limits = config.limits;
    let authenticator = Authenticator::new(config.auth.clone());
    let web = config
        .web_ui
        .then(|| web::WebView::new(Arc::clone(&service), authenticator.clone()));
    let coordinator = coordinator_service(service, limits, authenticator);
    let in_flight = GlobalConcurrencyLimitLayer::new(limits.max_concurrent_calls);
    let max_in_flight = limits.max_concurrent_calls;

    let expiry = tokio::spawn({
        let (backend, stop) = (backend.clone(), stop.clone());
        async move { backend.run(stop.cancelled_owned()).await }
    });
    let port_stop = CancellationToken::new();
    let port = listeners
        .metrics
        .map(|listener| spawn_metrics_port(listener, &metrics, &readiness, web, &port_stop));

    let drain = CancellationToken::new();
    let server = grpc_builder(&config)?
        .layer(ObserveLayer::new(metrics.rpc()))
        .add_service(health_service)
        .add_service(Guarded::new(reflection_v1, &in_flight, max_in_flight))
        .add_service(Guarded::new(reflection_v1alpha, &in_flight, max_in_flight))
        .add_service(Guarded::new(coordinator, &in_flight, max_in_flight))
        .serve_with_incoming_shutdown(
            // Without TCP_NODELAY a unary reply's trailing frames wait on
            // Nagle's algorithm (tens of milliseconds per call).
            TcpIncoming::from(listeners.grpc).with_nodelay(Some(true)),
            drain.clone().cancelled_owned(),
        );
    tokio::pin!(server);

    let result = tokio::select! {
        result = &mut server => {
            stop.cancel();
            result.map_err(Into::into)
        }
        () = shutdown => {
            tracing::info!("shutting down: not ready, health NOT_SERVING, ending watches, draining calls");
            not_serving(&readiness, &health).await;
            stop.cancel();
            drain.cancel();
            drain_calls(server, config.shutdown_grace).await
        }
    };
    let _ = expiry.await;
    close_metrics_port(&port_stop, port).await;
    let _ = tokio::task::spawn_blocking(move || metrics.shutdown()).await;
    result
}

/// Health says the coordinator service (and the server) is serving.
async fn serving(health: &tonic_health::server::HealthReporter) {
    health
        .set_serving::<ResponseCoordinatorServer<CoordinatorService>>()
        .await;
    health.set_service_status("", ServingStatus::Serving).await;
}

/// Reflection over the coordinator's and the health service's protos.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// The coordinator service with its message limits, behind the
/// authenticator.
fn coordinator_service(
    service: Arc<CoordinatorService>,
    limits: Limits,
    authenticator: Authenticator,
) -> Authenticated<ResponseCoordinatorServer<CoordinatorService>> {
    let coordinator = ResponseCoordinatorServer::from_arc(service)
        .max_decoding_message_size(limits.max_message_bytes)
        .max_encoding_message_size(limits.max_message_bytes);
    // Always behind the authenticator, with or without tokens: the service
    // refuses a call that carries no caller scope (`auth::caller_scope`).
    Authenticated::new(coordinator, authenticator)
}

/// The gRPC server with the configured limits and TLS.
fn grpc_builder(config: &ServerConfig) -> Result<Server, ServeError> {
    let limits = config.limits;
    let builder = Server::builder()
        .timeout(limits.request_timeout)
        .http2_keepalive_interval(limits.http2_keepalive_interval)
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
        .max_concurrent_streams(limits.max_concurrent_streams);
    Ok(match &config.tls {
        Some(tls) => builder.tls_config(tls.server_config())?,
        None => builder,
    })
}

/// Serves the metrics routes (and the web view's, when it is on) on
/// `listener` until `stop` is cancelled.
fn spawn_metrics_port(
    listener: TcpListener,
    metrics: &Arc<Metrics>,
    readiness: &Readiness,
    web: Option<web::WebView>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let mut routes = metrics::router(Arc::clone(metrics), readiness.clone());
    if let Some(web) = web {
        routes = routes.merge(web::router(web));
    }
    tokio::spawn(metrics::serve_port(
        listener,
        routes,
        stop.clone().cancelled_owned(),
    ))
}

/// Says the server is shutting down: not ready, health NOT_SERVING.
async fn not_serving(readiness: &Readiness, health: &tonic_health::server::HealthReporter) {
    readiness.set(false);
    health
        .set_not_serving::<ResponseCoordinatorServer<CoordinatorService>>()
        .await;
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
}

/// Lets in-flight calls finish, for `grace` at most.
async fn drain_calls(
    server: impl Future<Output = Result<(), tonic::transport::Error>> + Unpin,
    grace: Duration,
) -> Result<(), ServeError> {
    match tokio::time::timeout(grace, server).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => {
            tracing::warn!(grace = %humantime::format_duration(grace), "in-flight calls outlived the shutdown grace period");
            Ok(())
        }
    }
}

async fn close_metrics_port(
    stop: &CancellationToken,
    port: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
) {
    stop.cancel();
    let Some(port) = port else {
        return;
    };
    match tokio::time::timeout(Duration::from_secs(5), port).await {
        Ok(Ok(Err(error))) => tracing::warn!(%error, "metrics port"),
        Err(_) => tracing::warn!("metrics port did not close in 5s"),
        Ok(_) => {}
    }
}
