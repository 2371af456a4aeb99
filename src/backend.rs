//! The backend seam: where the gRPC layer's calls go.
//!
//! Two backends keep sessions: [`Registry`] (the embedded in-memory default,
//! one process is the authority) and [`NatsCoordinator`] (a JetStream
//! key-value bucket is the authority, any number of replicas serve it). Both
//! run every transition through the same pure record (`session::Session`)
//! and machine (`machine::transition`), publish through the same event log
//! and fan-out (`events`), and answer with the same types, so the gRPC layer,
//! the watch delivery and the metrics are shared and cannot tell them apart.
//!
//! An enum rather than a trait object: the memory path stays a direct,
//! synchronous call with no boxing, and the set of backends is closed.

use opentelemetry::metrics::Histogram;

pub use crate::shared::{PageToken, SessionPage};
use crate::{
    decision::{Changed, Started},
    error::CoordError,
    events::Subscription,
    ids::{RequestId, ResponseId, SessionId, SessionScope},
    machine::{FinishStatus, Source},
    nats::{NatsCoordinator, NatsCounts},
    registry::Registry,
    session::SessionSnapshot,
    stats::CoordStats,
};

/// The coordinator the server serves: cheap to clone.
#[derive(Clone)]
pub enum Coordinator {
    Memory(Registry),
    Nats(NatsCoordinator),
}

impl From<Registry> for Coordinator {
    fn from(registry: Registry) -> Self {
        Coordinator::Memory(registry)
    }
}

impl From<NatsCoordinator> for Coordinator {
    fn from(nats: NatsCoordinator) -> Self {
        Coordinator::Nats(nats)
    }
}

const OTHER_BACKEND: &str =
    "was issued by a coordinator with another backend; list again from the start";

impl Coordinator {
    pub async fn start(
        &self,
        id: &SessionId,
        source: Source,
        request_id: Option<RequestId>,
    ) -> Result<Started, CoordError> {
        match self {
            Coordinator::Memory(registry) => registry.start(id, source, request_id),
            Coordinator::Nats(nats) => nats.start(id, source, request_id).await,
        }
    }

    pub async fn finish(
        &self,
        id: &SessionId,
        response: Option<ResponseId>,
        status: FinishStatus,
    ) -> Result<Changed<bool>, CoordError> {
        match self {
            Coordinator::Memory(registry) => registry.finish(id, response, status),
            Coordinator::Nats(nats) => nats.finish(id, response, status).await,
        }
    }

    pub async fn cancel(
        &self,
        id: &SessionId,
        only_if: Option<ResponseId>,
        source: Source,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        match self {
            Coordinator::Memory(registry) => registry.cancel(id, only_if, source),
            Coordinator::Nats(nats) => nats.cancel(id, only_if, source).await,
        }
    }

    pub async fn shutdown(
        &self,
        id: &SessionId,
        source: Source,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        match self {
            Coordinator::Memory(registry) => registry.shutdown_from(id, source),
            Coordinator::Nats(nats) => nats.shutdown_from(id, source).await,
        }
    }

    pub async fn state(&self, id: &SessionId) -> Result<SessionSnapshot, CoordError> {
        match self {
            Coordinator::Memory(registry) => registry.state(id),
            Coordinator::Nats(nats) => nats.state(id).await,
        }
    }

    pub async fn list(
        &self,
        scope: &SessionScope,
        page_size: usize,
        token: Option<PageToken>,
    ) -> Result<SessionPage, CoordError> {
        match self {
            Coordinator::Memory(registry) => {
                let cursor = match token {
                    None => None,
                    Some(PageToken::Registry(cursor)) => Some(cursor),
                    Some(PageToken::AfterId(_)) => {
                        return Err(CoordError::invalid("page_token", OTHER_BACKEND))
                    }
                };
                let page = registry.list_scoped(scope, page_size, cursor)?;
                Ok(SessionPage {
                    sessions: page.sessions,
                    next: page.next.map(PageToken::Registry),
                    seq: page.seq,
                })
            }
            Coordinator::Nats(nats) => {
                let after = match token {
                    None => None,
                    Some(PageToken::AfterId(id)) => Some(id),
                    Some(PageToken::Registry(_)) => {
                        return Err(CoordError::invalid("page_token", OTHER_BACKEND))
                    }
                };
                nats.list(scope, page_size, after).await
            }
        }
    }

    pub async fn watch_session(
        &self,
        id: &SessionId,
        after_revision: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        match self {
            Coordinator::Memory(registry) => registry.watch_session(id, after_revision),
            Coordinator::Nats(nats) => nats.watch_session(id, after_revision).await,
        }
    }

    pub async fn watch_all(
        &self,
        scope: &SessionScope,
        after_seq: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        match self {
            Coordinator::Memory(registry) => registry.watch_all_scoped(scope, after_seq),
            Coordinator::Nats(nats) => nats.watch_all(scope, after_seq).await,
        }
    }

    /// Sessions held (memory) or known to this replica's mirror (NATS).
    pub fn session_count(&self) -> usize {
        match self {
            Coordinator::Memory(registry) => registry.session_count(),
            Coordinator::Nats(nats) => nats.session_count(),
        }
    }

    /// Counters for the metrics. NATS: sessions by phase from the mirror
    /// (the whole cluster), transitions and events this replica applied.
    pub fn stats(&self) -> CoordStats {
        match self {
            Coordinator::Memory(registry) => registry.stats(),
            Coordinator::Nats(nats) => nats.stats(),
        }
    }

    /// The NATS backend's own counters (store, connection, follower,
    /// lease); `None` on the memory backend, which has no such series.
    pub fn nats_stats(&self) -> Option<NatsCounts> {
        match self {
            Coordinator::Memory(_) => None,
            Coordinator::Nats(nats) => Some(nats.nats_stats()),
        }
    }

    /// Where the NATS backend records each store request's round trip; the
    /// memory backend makes none.
    pub fn record_store_latency(&self, histogram: Histogram<f64>) {
        if let Coordinator::Nats(nats) = self {
            nats.record_store_latency(histogram);
        }
    }

    /// Runs the backend's background work (expiry; for NATS also the bucket
    /// follower) until `stop` resolves.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        match self {
            Coordinator::Memory(registry) => registry.run_expiry(stop).await,
            Coordinator::Nats(nats) => nats.run(stop).await,
        }
    }

    pub fn backend_name(&self) -> &'static str {
        match self {
            Coordinator::Memory(_) => "memory",
            Coordinator::Nats(_) => "nats",
        }
    }
}
