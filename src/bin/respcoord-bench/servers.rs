//! The in-process servers the commands measure: the "empty" server, the
//! ceiling of the stack (the same proto and transport, handlers that do
//! nothing), and respcoord itself over a registry, both on 127.0.0.1.

use std::{net::SocketAddr, time::Duration};

use respcoord::{
    grpc::WatchSettings,
    proto::v1::{
        self as pb,
        response_coordinator_server::{ResponseCoordinator, ResponseCoordinatorServer},
    },
    registry::Registry,
    server::{self, ServerConfig},
};
use tokio::{net::TcpListener, runtime::Runtime, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{
    transport::{server::TcpIncoming, Server},
    Request, Response, Status,
};

/// The ceiling: the same proto and transport, handlers that do nothing.
pub struct Empty;

#[tonic::async_trait]
impl ResponseCoordinator for Empty {
    async fn start(
        &self,
        _: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn finish(
        &self,
        _: Request<pb::FinishRequest>,
    ) -> Result<Response<pb::FinishResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn cancel(
        &self,
        _: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn shutdown(
        &self,
        _: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn get_state(
        &self,
        _: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::GetStateResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn list_sessions(
        &self,
        _: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    type WatchStream = tokio_stream::Pending<Result<pb::WatchResponse, Status>>;

    async fn watch(
        &self,
        _: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Ok(Response::new(tokio_stream::pending()))
    }
}

/// A server on 127.0.0.1 that stops when `stop` is cancelled.
pub struct Running {
    pub url: String,
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Running {
    pub fn shut(self, runtime: &Runtime) {
        self.stop.cancel();
        let handle = self.handle;
        let _ = runtime
            .block_on(async move { tokio::time::timeout(Duration::from_secs(10), handle).await });
    }
}

pub fn bind(runtime: &Runtime) -> (TcpListener, SocketAddr) {
    let listener = runtime
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    (listener, addr)
}

/// Serves the empty server on `listener` until `stop`.
pub async fn serve_empty(listener: TcpListener, stop: impl std::future::Future<Output = ()>) {
    let served = Server::builder()
        .add_service(ResponseCoordinatorServer::new(Empty))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), stop)
        .await;
    if let Err(error) = served {
        eprintln!("empty server: {error}");
    }
}

pub fn start_empty(runtime: &Runtime) -> Running {
    let (listener, addr) = bind(runtime);
    let stop = CancellationToken::new();
    let handle = runtime.spawn(serve_empty(listener, stop.clone().cancelled_owned()));
    Running {
        url: format!("http://{addr}"),
        stop,
        handle,
    }
}

/// respcoord on its default configuration, but for `max_watchers` when a
/// run opens more watches than the default admits.
pub fn start_respcoord(runtime: &Runtime, registry: Registry, max_watchers: usize) -> Running {
    let (listener, addr) = bind(runtime);
    let stop = CancellationToken::new();
    let config = ServerConfig {
        registry: *registry.config(),
        watch: WatchSettings {
            max_watchers: max_watchers.max(WatchSettings::default().max_watchers),
            ..WatchSettings::default()
        },
        shutdown_grace: Duration::from_secs(2),
        ..ServerConfig::default()
    };
    let handle = runtime.spawn({
        let stop = stop.clone();
        async move {
            if let Err(error) =
                server::serve_coordinator(registry.into(), config, listener, stop.cancelled_owned())
                    .await
            {
                eprintln!("respcoord server: {error}");
            }
        }
    });
    Running {
        url: format!("http://{addr}"),
        stop,
        handle,
    }
}
