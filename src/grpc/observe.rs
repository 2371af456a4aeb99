//! The per-RPC observation layer, in front of every service the server has:
//! one tracing span per call, parented on the caller's W3C trace context,
//! one `rpc.server.call.duration` sample with the final status code, and one
//! debug log line. A call ends when its response body does (the trailers
//! carry the status), so a Watch is measured and traced for the whole
//! stream; a call dropped before it ends (client reset, deadline) counts as
//! CANCELLED.
//!
//! The span follows the OpenTelemetry RPC conventions (name `Service/Method`,
//! kind SERVER, `rpc.system.name`, `rpc.method`, `rpc.response.status_code`)
//! plus `session_id`, `response_id` and `outcome`, which the service records.
//! Request metadata is never recorded: tokens stay out of spans and logs.

use std::{
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Instant,
};

use http::{HeaderMap, HeaderName, Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::{body::Body, Code, Status};
use tower::{BoxError, Layer, Service};
use tracing::{field::Empty, Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use crate::telemetry::RPC_SPAN_TARGET;
use crate::{
    grpc::status,
    metrics::{calls::Method, RpcMetrics},
    telemetry,
};

/// Adds [`Observe`] to a service.
#[derive(Clone, Debug)]
pub struct ObserveLayer {
    metrics: RpcMetrics,
}

impl ObserveLayer {
    pub fn new(metrics: RpcMetrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Observe<S> {
    inner: S,
    metrics: RpcMetrics,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<B>> for Observe<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<ObservedBody>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<ObservedBody>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = Method::of_path(request.uri().path());
        // DEBUG, so the log layer at its default `info` never sees (and
        // formats) it; the OTLP layer takes it whatever `--log` says. At
        // INFO the fmt layer's span formatting cost ~13% of server CPU per
        // call (docs/performance.md).
        let span = tracing::debug_span!(
            target: RPC_SPAN_TARGET,
            "rpc",
            otel.name = %method.name(),
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system.name = "grpc",
            rpc.method = %method.name(),
            rpc.response.status_code = Empty,
            session_id = Empty,
            response_id = Empty,
            outcome = Empty,
        );
        if let Some(parent) = telemetry::remote_context(request.headers()) {
            // Fails only when no OpenTelemetry layer is installed.
            let _ = span.set_parent(parent);
        }
        let finish = Finish {
            span: Finish::keep(&span),
            method,
            started: Instant::now(),
            metrics: self.metrics.clone(),
            done: false,
        };
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Box::pin(
            async move {
                match future.await {
                    Ok(response) => {
                        // Trailers-only: the call failed before any message
                        // and the status is in the headers.
                        let finish = match grpc_status(response.headers()) {
                            Some(code) => {
                                finish.complete(code);
                                None
                            }
                            None => Some(finish),
                        };
                        Ok(response.map(|inner| ObservedBody { inner, finish }))
                    }
                    Err(error) => {
                        let error = error.into();
                        let code = error
                            .downcast_ref::<Status>()
                            .map_or(Code::Unknown, Status::code);
                        finish.complete(code);
                        Err(error)
                    }
                }
            }
            .instrument(span),
        )
    }
}

/// A static header name: a lookup by `&str` parses the name on every call.
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

fn grpc_status(headers: &HeaderMap) -> Option<Code> {
    headers
        .get(&GRPC_STATUS)
        .map(|value| Code::from_bytes(value.as_bytes()))
}

/// Records a call's end exactly once: when completed, or as CANCELLED when
/// dropped unfinished.
///
/// It lives in the response body, so as long as a Watch stream does: the
/// span is held only when some subscriber took it, boxed (8 bytes, not a
/// `Span`'s 40, in every open watch).
struct Finish {
    span: Option<Box<Span>>,
    method: Method,
    started: Instant,
    metrics: RpcMetrics,
    done: bool,
}

impl Finish {
    /// The call's span, if it is recorded at all.
    fn keep(span: &Span) -> Option<Box<Span>> {
        (!span.is_disabled()).then(|| Box::new(span.clone()))
    }

    fn complete(mut self, code: Code) {
        self.done = true;
        self.record(code);
    }

    fn record(&self, code: Code) {
        let elapsed = self.started.elapsed();
        let name = status::code_name(code);
        self.metrics.record_call(self.method, code, elapsed);
        let span = self.span.as_deref();
        if let Some(span) = span {
            span.record("rpc.response.status_code", name);
            if status::is_server_error(code) {
                span.record("otel.status_code", "ERROR");
            }
        }
        // A disabled span as the parent is no parent: the same event.
        tracing::debug!(
            parent: span.and_then(Span::id),
            code = name,
            elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            "rpc"
        );
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            self.record(Code::Cancelled);
        }
    }
}

/// A response body that reports the call's status when its trailers pass.
pub struct ObservedBody {
    inner: Body,
    finish: Option<Finish>,
}

impl HttpBody for ObservedBody {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let code = match &frame {
            Some(Ok(frame)) => frame
                .trailers_ref()
                .map(|trailers| grpc_status(trailers).unwrap_or(Code::Unknown)),
            Some(Err(status)) => Some(status.code()),
            None => Some(Code::Unknown),
        };
        if let Some(code) = code {
            if let Some(finish) = this.finish.take() {
                finish.complete(code);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
