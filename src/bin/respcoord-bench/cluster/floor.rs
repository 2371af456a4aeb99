//! The floor of any gRPC coordinator on a KV bucket: the contract's proto
//! and transport (tonic on its defaults, as the empty server), whose Start
//! and Finish each make one raw compare-and-set on the session's key and
//! nothing else: no read, no decision, no entry, no lock, no watch. With a
//! follower reading every write beside it, it is what a call costs before
//! any of respcoord's own work; respcoord's calls against it are what is
//! left to cut (docs/performance.md, "The cluster call, profiled").

use respcoord::proto::v1::{
    self as pb,
    response_coordinator_server::{ResponseCoordinator, ResponseCoordinatorServer},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{
    transport::{server::TcpIncoming, Server},
    Request, Response, Status,
};

use super::RawWrites;

/// Start and Finish as one compare-and-set each on `k{slot}`, for the
/// bench's session ids `bench-{slot}`.
struct CasOnly {
    writes: RawWrites,
}

impl CasOnly {
    async fn write(&self, session_id: &str) -> Result<(), Status> {
        let slot = session_id
            .strip_prefix("bench-")
            .and_then(|slot| slot.parse::<usize>().ok())
            .filter(|slot| *slot < self.writes.revisions.len())
            .ok_or_else(|| Status::invalid_argument("session_id: not a bench session"))?;
        if self.writes.clone().write_slot(slot).await {
            Ok(())
        } else {
            Err(Status::unavailable("compare-and-set failed"))
        }
    }
}

#[tonic::async_trait]
impl ResponseCoordinator for CasOnly {
    async fn start(
        &self,
        request: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        self.write(&request.get_ref().session_id).await?;
        // Non-zero, so the bench's caller finishes it next.
        Ok(Response::new(pb::StartResponse {
            response_id: 1,
            ..Default::default()
        }))
    }
    async fn finish(
        &self,
        request: Request<pb::FinishRequest>,
    ) -> Result<Response<pb::FinishResponse>, Status> {
        self.write(&request.get_ref().session_id).await?;
        Ok(Response::new(Default::default()))
    }
    async fn cancel(
        &self,
        _: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        Err(Status::unimplemented("the floor serves Start and Finish"))
    }
    async fn shutdown(
        &self,
        _: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        Err(Status::unimplemented("the floor serves Start and Finish"))
    }
    async fn get_state(
        &self,
        _: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::GetStateResponse>, Status> {
        Err(Status::unimplemented("the floor serves Start and Finish"))
    }
    async fn list_sessions(
        &self,
        _: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        Err(Status::unimplemented("the floor serves Start and Finish"))
    }

    type WatchStream = tokio_stream::Pending<Result<pb::WatchResponse, Status>>;

    async fn watch(
        &self,
        _: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("the floor serves Start and Finish"))
    }
}

/// Serves the floor over `writes` on 127.0.0.1 until `stop`: its URL.
pub(super) async fn serve(writes: RawWrites, stop: CancellationToken) -> Result<String, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let served = Server::builder()
            .add_service(ResponseCoordinatorServer::new(CasOnly { writes }))
            .serve_with_incoming_shutdown(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                stop.cancelled_owned(),
            )
            .await;
        if let Err(error) = served {
            eprintln!("floor server: {error}");
        }
    });
    Ok(format!("http://{addr}"))
}
