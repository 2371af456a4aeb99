//! Logging and tracing: `tracing` to stderr (human-readable or JSON lines),
//! and, when the standard OpenTelemetry variables ask for it, spans exported
//! over OTLP/gRPC with W3C trace context taken from incoming calls.
//!
//! OTLP is configured only through the standard variables, read by the
//! OpenTelemetry SDK itself: `OTEL_EXPORTER_OTLP_ENDPOINT` (or the per-signal
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `..._METRICS_ENDPOINT`), `..._HEADERS`,
//! `..._TIMEOUT`, `OTEL_SERVICE_NAME` (default `respcoord`),
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` / `..._ARG`, `OTEL_BSP_*`,
//! `OTEL_METRIC_EXPORT_INTERVAL`; `OTEL_SDK_DISABLED=true` turns it all off.
//! With none of them set nothing is exported and nothing is said about it.
//!
//! The exporters are tonic clients: build them (call [`init`]) inside the
//! tokio runtime that serves, and call [`Telemetry::shutdown`] outside it
//! (after `block_on`) so the last spans are flushed.

use opentelemetry::{
    propagation::{Extractor, TextMapPropagator},
    trace::{TraceContextExt, TracerProvider as _},
};
use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::SdkTracerProvider, Resource};
use tracing_subscriber::{
    filter::{LevelFilter, Targets},
    fmt,
    layer::SubscriberExt,
    util::SubscriberInitExt,
    EnvFilter, Layer,
};

/// The target of the per-call span (`grpc::observe`); the OTLP layer below
/// selects it by name, so the name lives with the layer that depends on it.
pub const RPC_SPAN_TARGET: &str = "respcoord::rpc";

/// How log lines are written (`--log-format`). Here rather than in `config`
/// because [`init`] consumes it: `config` parses flags into it, and nothing in
/// the library has to import the flag parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// Which OTLP signals the environment asks to export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtlpSignals {
    pub traces: bool,
    pub metrics: bool,
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

impl OtlpSignals {
    /// From the standard variables: a signal is exported when its endpoint,
    /// or the common one, is set, unless `OTEL_SDK_DISABLED=true` or
    /// `OTEL_{TRACES,METRICS}_EXPORTER=none`.
    pub fn from_env() -> Self {
        let disabled =
            std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let exporter_off =
            |var: &str| std::env::var(var).is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"));
        let common = env_set("OTEL_EXPORTER_OTLP_ENDPOINT");
        Self {
            traces: !disabled
                && !exporter_off("OTEL_TRACES_EXPORTER")
                && (common || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")),
            metrics: !disabled
                && !exporter_off("OTEL_METRICS_EXPORTER")
                && (common || env_set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")),
        }
    }
}

/// The OpenTelemetry resource: the SDK's environment detectors, with
/// `service.name` defaulting to `respcoord`.
pub fn resource() -> Resource {
    let named = env_set("OTEL_SERVICE_NAME")
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    let builder = if named {
        builder
    } else {
        builder.with_service_name("respcoord")
    };
    builder
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build()
}

/// Why telemetry could not start. Each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("--log: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("OTEL_EXPORTER_OTLP_*: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// Holds the trace pipeline; flushes it on [`Telemetry::shutdown`].
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still queued. Blocks: call it outside the runtime's
    /// worker threads (after `block_on` returned).
    pub fn shutdown(self) {
        if let Some(provider) = self.tracer_provider {
            if let Err(error) = provider.shutdown() {
                eprintln!("warning: flushing OTLP spans: {error}");
            }
        }
    }
}

/// Installs the global subscriber: log lines filtered by `filter` (the
/// `--log` flag) and, when `signals.traces`, an OTLP span pipeline fed with
/// the RPC spans (and anything at INFO and above, whatever `--log` says). Must run inside
/// the tokio runtime.
pub fn init(
    format: LogFormat,
    filter: &str,
    signals: OtlpSignals,
) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_new(filter)?;
    let logs = fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        // Colour for a terminal only: escape codes in a file or a pipe make
        // lines that grep and log shippers cannot match.
        LogFormat::Human => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => logs.json().flatten_event(true).with_ansi(false).boxed(),
    };
    let tracer_provider = if signals.traces {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?;
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource())
                .build(),
        )
    } else {
        None
    };
    let spans = tracer_provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("respcoord"))
            .with_filter(
                Targets::new()
                    .with_default(LevelFilter::INFO)
                    .with_target(RPC_SPAN_TARGET, LevelFilter::DEBUG),
            )
    });
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(Telemetry { tracer_provider })
}

/// Reads W3C trace context (`traceparent`, `tracestate`) from a call's HTTP/2
/// headers (gRPC metadata). `None` without a valid `traceparent`.
pub fn remote_context(headers: &http::HeaderMap) -> Option<opentelemetry::Context> {
    // A static name: looking a `&str` up parses it on every call.
    static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
    if !headers.contains_key(&TRACEPARENT) {
        return None;
    }
    let context = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    context.span().span_context().is_valid().then_some(context)
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceId;

    #[test]
    fn remote_context_reads_traceparent() {
        let mut headers = http::HeaderMap::new();
        assert!(remote_context(&headers).is_none());
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let context = remote_context(&headers).expect("a valid traceparent");
        assert_eq!(
            context.span().span_context().trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        headers.insert("traceparent", "garbage".parse().unwrap());
        assert!(remote_context(&headers).is_none());
    }
}
