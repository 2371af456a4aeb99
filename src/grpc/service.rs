//! The `ResponseCoordinator` service: validate, authorize, call the
//! backend (`backend::Coordinator`), translate.
//!
//! Order of refusals on every call: authentication (the interceptor in front,
//! UNAUTHENTICATED), validation (INVALID_ARGUMENT naming the field), the
//! caller's session scope (PERMISSION_DENIED), then the backend's answer.
//! Each call records `session_id`, `response_id` and `outcome` on its RPC
//! span (`grpc::observe`).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Span;

use crate::{
    auth::{authorize, caller_scope},
    backend::Coordinator,
    error::CoordError,
    grpc::{
        convert::{self, WatchTarget},
        watch::{self, Alarms, WatchKind, WatchStats},
    },
    ids::{response_id_or_zero, SessionId},
    machine::Phase,
    proto::v1::{self as pb, response_coordinator_server::ResponseCoordinator},
};

pub use crate::grpc::watch::WatchSettings;

pub struct CoordinatorService {
    coordinator: Coordinator,
    watch: WatchSettings,
    /// Every open watch's bookmark deadline, and its end at shutdown.
    alarms: Arc<Alarms>,
    watches: Arc<WatchStats>,
}

impl CoordinatorService {
    /// `shutdown` ends every open watch cleanly when it is cancelled.
    pub fn new(
        coordinator: Coordinator,
        watch: WatchSettings,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            coordinator,
            watch,
            alarms: Alarms::new(watch.bookmark_interval, shutdown),
            watches: Arc::default(),
        }
    }

    /// Open watches and lag endings, for the metrics.
    pub fn watch_stats(&self) -> Arc<WatchStats> {
        Arc::clone(&self.watches)
    }
}

/// The RPC span (`grpc::observe`) to record on, or `None` when no
/// subscriber takes DEBUG spans, which the RPC span is: then it is disabled
/// and finding it (`Span::current`, a walk through the subscriber's
/// registry, twice a call) is skipped. One atomic load.
fn rpc_span() -> Option<Span> {
    (tracing::level_filters::LevelFilter::current() >= tracing::Level::DEBUG).then(Span::current)
}

/// Checks the call's (validated) session id against the caller's scope and
/// records it on the RPC span.
fn authorized<T>(request: &Request<T>, session_id: &SessionId) -> Result<(), Status> {
    authorize(&caller_scope(request)?, session_id)?;
    if let Some(span) = rpc_span() {
        span.record("session_id", session_id.as_str());
    }
    Ok(())
}

fn record(outcome: &'static str, response_id: u64) {
    let Some(span) = rpc_span() else {
        return;
    };
    span.record("outcome", outcome);
    if response_id != 0 {
        // As text: ids are 64-bit, past what a JSON number keeps exactly in
        // JavaScript and most log stores, where searching by id must work.
        // `display` formats only if the span is recorded: no allocation per
        // call otherwise.
        span.record("response_id", tracing::field::display(response_id));
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Idle => "idle",
        Phase::Active(_) => "active",
        Phase::Terminated => "terminated",
    }
}

#[tonic::async_trait]
impl ResponseCoordinator for CoordinatorService {
    async fn start(
        &self,
        request: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        let args = convert::start(request.get_ref())?;
        authorized(&request, &args.session_id)?;
        let started = self
            .coordinator
            .start(&args.session_id, args.source, args.request_id)
            .await?;
        let outcome = match (started.replayed, started.superseded) {
            (true, _) => "replayed",
            (false, Some(_)) => "superseded",
            (false, None) => "started",
        };
        record(outcome, started.response.get());
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
        authorized(&request, &args.session_id)?;
        let finished = self
            .coordinator
            .finish(&args.session_id, args.response, args.status)
            .await?;
        record(
            if finished.result { "applied" } else { "stale" },
            response_id_or_zero(args.response),
        );
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
        authorized(&request, &args.session_id)?;
        let cancelled = self
            .coordinator
            .cancel(&args.session_id, args.only_if, args.source)
            .await?;
        record(
            if cancelled.result.is_some() {
                "cancelled"
            } else {
                "nothing_to_cancel"
            },
            response_id_or_zero(cancelled.result),
        );
        Ok(Response::new(pb::CancelResponse {
            cancelled_response_id: response_id_or_zero(cancelled.result),
            state: Some(convert::state(&cancelled.state)),
        }))
    }

    async fn shutdown(
        &self,
        request: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        let args = convert::shutdown(request.get_ref())?;
        authorized(&request, &args.session_id)?;
        let shut = self
            .coordinator
            .shutdown(&args.session_id, args.source)
            .await?;
        record("terminated", response_id_or_zero(shut.result));
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
        authorized(&request, &session_id)?;
        let state = self.coordinator.state(&session_id).await?;
        record(
            phase_name(state.phase),
            response_id_or_zero(state.phase.active().map(|a| a.id)),
        );
        Ok(Response::new(pb::GetStateResponse {
            state: Some(convert::state(&state)),
        }))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let args = convert::list(request.get_ref())?;
        let page = self
            .coordinator
            .list(&caller_scope(&request)?, args.page_size, args.cursor)
            .await?;
        record("listed", 0);
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: page.sessions.iter().map(convert::state).collect(),
            next_page_token: page.next.map(|c| c.encode()).unwrap_or_default(),
            seq: page.seq,
        }))
    }

    type WatchStream = watch::WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let target = convert::watch(request.get_ref())?;
        let scope = caller_scope(&request)?;
        let kind = match &target {
            WatchTarget::Session { session_id, .. } => {
                authorize(&scope, session_id)?;
                Span::current().record("session_id", session_id.as_str());
                WatchKind::Session
            }
            WatchTarget::All { .. } => WatchKind::All,
        };
        let max = self.watch.max_watchers;
        let slot = self
            .watches
            .try_open(kind, max)
            .ok_or(CoordError::WatcherLimit { max })?;
        // Subscribe before answering: once the caller has the stream, every
        // later event is on it.
        let subscription = match target {
            WatchTarget::Session {
                session_id,
                after_revision,
            } => {
                self.coordinator
                    .watch_session(&session_id, after_revision)
                    .await?
            }
            WatchTarget::All { after_seq } => self.coordinator.watch_all(&scope, after_seq).await?,
        };
        // The stream carries the RPC's span: the span lasts as long as the
        // stream, and records how it ended.
        Ok(Response::new(watch::responses(
            subscription,
            self.watch.max_batch,
            &self.alarms,
            Some(slot),
            Span::current(),
        )))
    }
}

#[cfg(test)]
mod tests {
    //! Fail closed: the service refuses a call the authenticator never saw,
    //! whatever the call, and serves the same call once it has.

    use tonic::{service::Interceptor, Code};

    use super::*;
    use crate::{
        auth::Authenticator,
        registry::{CoordConfig, Registry},
    };

    fn service() -> CoordinatorService {
        CoordinatorService::new(
            Registry::new(CoordConfig::default()).into(),
            WatchSettings::default(),
            CancellationToken::new(),
        )
    }

    fn start() -> pb::StartRequest {
        pb::StartRequest {
            session_id: "s-1".into(),
            source: pb::Source::Client.into(),
            request_id: String::new(),
        }
    }

    /// `message` as the interceptor would pass it (authentication off).
    fn intercepted<T>(message: T) -> Request<T> {
        let passed = Authenticator::new(None)
            .call(Request::new(()))
            .expect("auth off lets every call in");
        let (metadata, extensions, ()) = passed.into_parts();
        Request::from_parts(metadata, extensions, message)
    }

    fn refused<T: std::fmt::Debug>(result: Result<T, Status>) {
        let status = result.expect_err("a call without the interceptor is refused");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }

    #[tokio::test]
    async fn a_service_reached_without_the_interceptor_denies() {
        let service = service();
        refused(service.start(Request::new(start())).await);
        refused(
            service
                .get_state(Request::new(pb::GetStateRequest {
                    session_id: "s-1".into(),
                }))
                .await,
        );
        refused(
            service
                .list_sessions(Request::new(pb::ListSessionsRequest::default()))
                .await,
        );
        refused(
            service
                .watch(Request::new(pb::WatchRequest::default()))
                .await
                .map(|_| ()),
        );
        // Nothing was created by the refused Start.
        let listed = service
            .list_sessions(intercepted(pb::ListSessionsRequest::default()))
            .await
            .expect("intercepted list")
            .into_inner();
        assert!(listed.sessions.is_empty(), "{listed:?}");
        // The same call through the interceptor is served.
        let started = service
            .start(intercepted(start()))
            .await
            .expect("intercepted start")
            .into_inner();
        assert_ne!(started.response_id, 0);
    }
}
