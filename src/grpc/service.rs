//! The `ResponseCoordinator` service: validate, call the registry, translate.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::{
    grpc::{
        convert::{self, WatchTarget},
        watch::{self, WatchItem},
    },
    ids::response_id_or_zero,
    proto::v1::{self as pb, response_coordinator_server::ResponseCoordinator},
    registry::Registry,
};

pub use crate::grpc::watch::WatchSettings;

pub struct CoordinatorService {
    registry: Registry,
    watch: WatchSettings,
    /// Cancelled at shutdown: every open watch ends cleanly.
    shutdown: CancellationToken,
}

impl CoordinatorService {
    pub fn new(registry: Registry, watch: WatchSettings, shutdown: CancellationToken) -> Self {
        Self {
            registry,
            watch,
            shutdown,
        }
    }
}

#[tonic::async_trait]
impl ResponseCoordinator for CoordinatorService {
    async fn start(
        &self,
        request: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        let args = convert::start(request.get_ref())?;
        let started = self
            .registry
            .start(&args.session_id, args.source, args.request_id)?;
        tracing::debug!(session_id = %args.session_id, response_id = %started.response, replayed = started.replayed, "start");
        Ok(Response::new(pb::StartResponse {
            response_id: started.response.get(),
            superseded_response_id: response_id_or_zero(started.superseded),
            state: Some(convert::state(&started.state)),
            replayed: started.replayed,
        }))
    }

    async fn finish(
        &self,
        request: Request<pb::FinishRequest>,
    ) -> Result<Response<pb::FinishResponse>, Status> {
        let args = convert::finish(request.get_ref())?;
        let finished = self
            .registry
            .finish(&args.session_id, args.response, args.status)?;
        Ok(Response::new(pb::FinishResponse {
            applied: finished.result,
            state: Some(convert::state(&finished.state)),
        }))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let args = convert::cancel(request.get_ref())?;
        let cancelled = self.registry.cancel(&args.session_id, args.only_if)?;
        Ok(Response::new(pb::CancelResponse {
            cancelled_response_id: response_id_or_zero(cancelled.result),
            state: Some(convert::state(&cancelled.state)),
        }))
    }

    async fn shutdown(
        &self,
        request: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        let session_id = convert::session_id(&request.get_ref().session_id)?;
        let shut = self.registry.shutdown(&session_id)?;
        Ok(Response::new(pb::ShutdownResponse {
            cancelled_response_id: response_id_or_zero(shut.result),
            state: Some(convert::state(&shut.state)),
        }))
    }

    async fn get_state(
        &self,
        request: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::GetStateResponse>, Status> {
        let session_id = convert::session_id(&request.get_ref().session_id)?;
        let state = self.registry.state(&session_id)?;
        Ok(Response::new(pb::GetStateResponse {
            state: Some(convert::state(&state)),
        }))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let args = convert::list(request.get_ref())?;
        let page = self.registry.list(args.page_size, args.cursor)?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: page.sessions.iter().map(convert::state).collect(),
            next_page_token: page.next.map(|c| c.encode()).unwrap_or_default(),
            seq: page.seq,
        }))
    }

    type WatchStream = ReceiverStream<WatchItem>;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // Subscribe before answering: once the caller has the stream, every
        // later event is on it.
        let subscription = match convert::watch(request.get_ref())? {
            WatchTarget::Session {
                session_id,
                after_revision,
            } => self.registry.watch_session(&session_id, after_revision)?,
            WatchTarget::All { after_seq } => self.registry.watch_all(after_seq)?,
        };
        let (tx, rx) = mpsc::channel(self.watch.stream_buffer.max(1));
        tokio::spawn(watch::pump(
            subscription,
            tx,
            self.watch,
            self.shutdown.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
