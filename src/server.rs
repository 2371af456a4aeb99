//! Server assembly: the coordinator service, gRPC health and reflection, the
//! expiry task, and graceful shutdown.
//!
//! Shutdown order (SIGTERM or the caller's signal): health turns NOT_SERVING
//! for both service names, open watches end with OK, the server stops
//! accepting and lets in-flight calls finish for up to the grace period.

use std::{future::Future, time::Duration};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server};
use tonic_health::ServingStatus;

use crate::{
    grpc::{CoordinatorService, WatchSettings},
    proto::{self, v1::response_coordinator_server::ResponseCoordinatorServer},
    registry::{Registry, RegistryConfig},
};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub registry: RegistryConfig,
    pub watch: WatchSettings,
    /// How long in-flight calls may run after shutdown begins.
    pub shutdown_grace: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Serves on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_registry(Registry::new(config.registry), config, listener, shutdown).await
}

/// As [`serve`], over a registry the caller already holds (tests inspect it).
pub async fn serve_registry(
    registry: Registry,
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let stop = CancellationToken::new();
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ResponseCoordinatorServer<CoordinatorService>>()
        .await;
    health.set_service_status("", ServingStatus::Serving).await;

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let expiry = tokio::spawn({
        let registry = registry.clone();
        let stop = stop.clone();
        async move { registry.run_expiry(stop.cancelled_owned()).await }
    });

    let service = CoordinatorService::new(registry, config.watch, stop.clone());
    let drain = CancellationToken::new();
    let server = Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(ResponseCoordinatorServer::new(service))
        .serve_with_incoming_shutdown(
            // Without TCP_NODELAY a unary reply's trailing frames wait on
            // Nagle's algorithm (tens of milliseconds per call).
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            drain.clone().cancelled_owned(),
        );
    tokio::pin!(server);

    tokio::select! {
        result = &mut server => {
            stop.cancel();
            return result.map_err(Into::into);
        }
        () = shutdown => {}
    }
    tracing::info!("shutting down: health NOT_SERVING, ending watches, draining calls");
    health
        .set_not_serving::<ResponseCoordinatorServer<CoordinatorService>>()
        .await;
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    stop.cancel();
    drain.cancel();
    let result = match tokio::time::timeout(config.shutdown_grace, &mut server).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => {
            tracing::warn!(grace = ?config.shutdown_grace, "in-flight calls outlived the shutdown grace period");
            Ok(())
        }
    };
    let _ = expiry.await;
    result
}
