//! The real coordinator service, wrapped to record what reaches it: every
//! Finish (per response id), every Start, and to lose one Start reply on
//! demand (the Start applies, the caller sees UNAVAILABLE), as a dropped
//! connection would; and to hold the next Watch until released, so that a
//! test can land a stop between a Start's reply and its session's watch. Shared by `tests/client.rs` and the cross-language
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
    hold: Arc<WatchHold>,
}

/// The gate [`Counting::hold_next_watch`] arms.
struct WatchHold {
    armed: AtomicBool,
    held: AtomicUsize,
    open: tokio::sync::watch::Sender<bool>,
}

impl Default for WatchHold {
    fn default() -> Self {
        Self {
            armed: AtomicBool::new(false),
            held: AtomicUsize::new(0),
            open: tokio::sync::watch::Sender::new(true),
        }
    }
}

impl Counting {
    pub fn new(inner: CoordinatorService) -> Self {
        Self {
            inner: Arc::new(inner),
            finishes: Arc::default(),
            starts: Arc::default(),
            lose_next_start_reply: Arc::default(),
            hold: Arc::default(),
        }
    }

    /// The next Watch call waits (before the server sees it) until
    /// [`Counting::release_watches`].
    pub fn hold_next_watch(&self) {
        self.hold.open.send_replace(false);
        self.hold.armed.store(true, Ordering::SeqCst);
    }

    /// Watch calls waiting at the gate now.
    pub fn held_watches(&self) -> usize {
        self.hold.held.load(Ordering::SeqCst)
    }

    pub fn release_watches(&self) {
        self.hold.open.send_replace(true);
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
        if self.hold.armed.swap(false, Ordering::SeqCst) {
            self.hold.held.fetch_add(1, Ordering::SeqCst);
            let mut open = self.hold.open.subscribe();
            let _ = open.wait_for(|open| *open).await;
            self.hold.held.fetch_sub(1, Ordering::SeqCst);
        }
        self.inner.watch(request).await
    }
}
