//! The real coordinator service, wrapped to record what reaches it: every
//! Finish (per response id), every Start, and to lose one Start reply on
//! demand (the Start applies, the caller sees UNAVAILABLE), as a dropped
//! connection would. Shared by `tests/client.rs` and the cross-language
//! scenario fixture (`examples/scenario_fixture.rs`), so every client is
//! judged by the same counts.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
};

use respcoord::{
    grpc::CoordinatorService,
    proto::v1::{self as pb, response_coordinator_server::ResponseCoordinator},
};
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct Counting {
    inner: Arc<CoordinatorService>,
    finishes: Arc<Mutex<HashMap<u64, usize>>>,
    starts: Arc<AtomicUsize>,
    lose_next_start_reply: Arc<AtomicBool>,
}

impl Counting {
    pub fn new(inner: CoordinatorService) -> Self {
        Self {
            inner: Arc::new(inner),
            finishes: Arc::default(),
            starts: Arc::default(),
            lose_next_start_reply: Arc::default(),
        }
    }

    /// Finish calls that reached the server for `response_id`.
    pub fn finishes_of(&self, response_id: u64) -> usize {
        let finishes = self.finishes.lock().unwrap_or_else(PoisonError::into_inner);
        finishes.get(&response_id).copied().unwrap_or(0)
    }

    /// Start calls that reached the server.
    pub fn starts(&self) -> usize {
        self.starts.load(Ordering::SeqCst)
    }

    /// The next Start applies, and its caller is answered UNAVAILABLE.
    pub fn lose_next_start_reply(&self) {
        self.lose_next_start_reply.store(true, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl ResponseCoordinator for Counting {
    async fn start(
        &self,
        request: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let reply = self.inner.start(request).await?;
        if self.lose_next_start_reply.swap(false, Ordering::SeqCst) {
            return Err(Status::unavailable("reply lost on the way back"));
        }
        Ok(reply)
    }
    async fn finish(
        &self,
        request: Request<pb::FinishRequest>,
    ) -> Result<Response<pb::FinishResponse>, Status> {
        *self
            .finishes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(request.get_ref().response_id)
            .or_default() += 1;
        self.inner.finish(request).await
    }
    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        self.inner.cancel(request).await
    }
    async fn shutdown(
        &self,
        request: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        self.inner.shutdown(request).await
    }
    async fn get_state(
        &self,
        request: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::GetStateResponse>, Status> {
        self.inner.get_state(request).await
    }
    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        self.inner.list_sessions(request).await
    }
    type WatchStream = <CoordinatorService as ResponseCoordinator>::WatchStream;
    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.inner.watch(request).await
    }
}
