//! [`Guarded`]: load shedding over the one concurrency limit the
//! coordinator and reflection services share.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::{Request, Response};
use tonic::{body::Body, server::NamedService};
use tower::{
    limit::{ConcurrencyLimit, GlobalConcurrencyLimitLayer},
    load_shed::LoadShed,
    Layer, Service,
};

use crate::grpc::status;

/// A routed service behind load shedding over a shared concurrency limit:
/// when the limit is reached, the call is answered UNAVAILABLE immediately
/// (`grpc::status`) instead of waiting for a slot.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: LoadShed<ConcurrencyLimit<S>>,
    max_in_flight: usize,
}

impl<S> Guarded<S> {
    pub(super) fn new(
        service: S,
        limit: &GlobalConcurrencyLimitLayer,
        max_in_flight: usize,
    ) -> Self {
        Self {
            inner: LoadShed::new(limit.layer(service)),
            max_in_flight,
        }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<Request<Body>> for Guarded<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Load shedding is always ready; when the limit is reached the call
        // itself fails with `Overloaded`, answered below.
        self.inner.poll_ready(cx).map(|_| Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let call = self.inner.call(request);
        let max_in_flight = self.max_in_flight;
        Box::pin(async move {
            Ok(match call.await {
                Ok(response) => response.map(Body::new),
                Err(error) => status::from_layer_error(error, max_in_flight).into_http(),
            })
        })
    }
}
