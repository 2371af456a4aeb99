//! A gateway's client for respcoord: run responses safely across processes.
//!
//! Its own crate: a gateway that depends on it builds no server code. It turns
//! the wire contract's rules for gateways ("Gateways' side of the bargain" in
//! the contract) into types, so a gateway author does not re-derive them:
//!
//! - [`Client`] holds the connection (plaintext or TLS, an optional bearer
//!   token on every call) and one Watch stream per session it serves (a
//!   live response there, a watch opened ahead, or a linger after the last
//!   response), which delivers every cancellation and supersession of its
//!   responses, whichever gateway asked. A gateway's watch traffic follows
//!   its own sessions, not the deployment's. A broken stream is resumed
//!   after reading the session's state (GetState).
//! - [`Session`] is a per-session handle; its responses' stops reach it.
//! - [`Session::start`] returns a [`Response`]: it knows its id, is stopped
//!   (a [`CancellationToken`] fires, [`Response::stopped`] resolves) when the
//!   coordinator cancels or supersedes it, from ANY gateway, and has a cheap
//!   synchronous fence check ([`Response::is_current`], or a cloneable
//!   [`Fence`]) for the output path to call before every chunk.
//! - [`Session::run`] is the whole pattern: start, run the body with a token,
//!   drop the body the moment the coordinator stops the response, report
//!   Finish exactly once when the body ends by itself, never when it was
//!   stopped.
//! - Every Start carries a request id (generated unless given), so a retry
//!   after a lost reply is answered as a replay and never supersedes its own
//!   response; retries back off with jitter and honour a deadline
//!   ([`RetryPolicy`]).
//!
//! The patterns and the guarantee each gives are in `docs/client.md`.
//!
//! # Layout
//! - `connect` — endpoint, TLS, token ([`ConnectOptions`]).
//! - `retry` — backoff with jitter under a deadline ([`RetryPolicy`]).
//! - `fencing` — the fencing table: which of the client's responses are
//!   known dead, from events and state reads (pure).
//! - `watch` — the session watches that feed it: open, resume, close.
//! - `response` — [`Session`], [`Response`], [`Fence`], [`Session::run`].

mod connect;
mod fencing;
mod response;
mod retry;
#[cfg(test)]
mod test_events;
mod watch;

use std::{sync::Arc, time::Duration};

pub use tokio_util::sync::CancellationToken;
use tonic::{
    transport::{Channel, Endpoint},
    Code, Request, Status,
};

pub use connect::{
    Auth, ConnectOptions, RawClient, TlsOptions, DEFAULT_ENDPOINT, DEFAULT_WATCH_LINGER,
};
/// The wire types (generated from `proto/respcoord/v1/coordinator.proto`),
/// for the raw calls and the answers the library passes through.
pub use respcoord_proto::v1 as pb;
pub use respcoord_proto::v1::{Phase, SessionState, Source, TerminalStatus};
use respcoord_proto::{ids::SessionId, v1::response_coordinator_client::ResponseCoordinatorClient};
pub use response::{
    Fence, Finished, Response, ResponseCtx, RunOutcome, Session, StartOptions, StopReason, Terminal,
};
pub use retry::RetryPolicy;
pub use watch::{WatchStatus, STREAMS_PER_CONNECTION};

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Refused locally before anything was sent (the server would refuse it
    /// too, with INVALID_ARGUMENT).
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// Bad connection settings: endpoint, TLS files, token file.
    #[error("{0}")]
    Config(String),
    /// The channel could not be set up or connected.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The server (or the transport, as UNAVAILABLE/DEADLINE_EXCEEDED after
    /// the retries ran out) answered with this status.
    #[error("{}", status_text(.0))]
    Status(#[from] Status),
}

impl ClientError {
    /// The gRPC code, where there is one. Local refusals count as
    /// INVALID_ARGUMENT; a channel that never connected as UNAVAILABLE.
    pub fn code(&self) -> Code {
        match self {
            ClientError::InvalidArgument { .. } | ClientError::Config(_) => Code::InvalidArgument,
            ClientError::Connect(_) => Code::Unavailable,
            ClientError::Status(status) => status.code(),
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl ToString) -> Self {
        ClientError::InvalidArgument {
            field,
            reason: reason.to_string(),
        }
    }
}

/// An error and its sources, `outer: inner: innermost`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text += ": ";
        text += &inner.to_string();
        source = inner.source();
    }
    text
}

/// A connection that could not be made: where to, and why, said once
/// ("cannot connect to http://127.0.0.1:50051: connection refused").
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {endpoint}: {}", cause(.source))]
pub struct ConnectError {
    endpoint: String,
    #[source]
    source: tonic::transport::Error,
}

impl ConnectError {
    pub(crate) fn new(endpoint: &Endpoint, source: tonic::transport::Error) -> Self {
        Self {
            endpoint: endpoint.uri().to_string().trim_end_matches('/').to_owned(),
            source,
        }
    }

    /// The endpoint, as connected to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// Why a connection failed, in the innermost error's words: the layers
/// above it ("transport error", "tcp connect error") repeat themselves and
/// add nothing. `Connection refused (os error 111)` reads `connection
/// refused`.
fn cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = error;
    while let Some(inner) = innermost.source() {
        innermost = inner;
    }
    let text = innermost.to_string();
    let text = match text.find(" (os error ") {
        Some(at) if text.ends_with(')') => &text[..at],
        _ => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if chars.clone().next().is_some_and(char::is_lowercase) => {
            first.to_lowercase().chain(chars).collect()
        }
        _ => text.to_owned(),
    }
}

/// `NOT_FOUND: message`, with the transport's own error where there is one.
fn status_text(status: &Status) -> String {
    let mut text = format!("{}: {}", code_name(status.code()), status.message());
    if let Some(source) = std::error::Error::source(status) {
        text += ": ";
        text += &chain(source);
    }
    text
}

fn code_name(code: Code) -> String {
    format!("{code:?}")
        .chars()
        .flat_map(|c| {
            let upper = c.is_ascii_uppercase();
            [upper.then_some('_'), Some(c.to_ascii_uppercase())]
        })
        .flatten()
        .skip(1)
        .collect()
}

/// A connection to respcoord. Cheap to clone; the clones share the
/// connections and the session watches.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("watch", &self.watch_status())
            .finish_non_exhaustive()
    }
}

struct Inner {
    raw: RawClient,
    retry: RetryPolicy,
    tracks: Arc<fencing::Tracks>,
    /// Session watches, on connections of their own so that calls and
    /// long-lived streams never share HTTP/2 flow control.
    watches: watch::Watches,
}

impl Client {
    /// Connects (failing fast if the endpoint is unreachable within the
    /// connect timeout). The channel reconnects by itself afterwards.
    pub async fn connect(options: ConnectOptions) -> Result<Self, ClientError> {
        let endpoint = options.endpoint()?;
        let auth = options.auth()?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| ConnectError::new(&endpoint, source))?;
        Ok(Self::from_parts(channel, endpoint, auth, &options))
    }

    /// As [`Client::connect`], without waiting for the connection: the
    /// first call connects (and is retried like any call).
    pub fn connect_lazy(options: ConnectOptions) -> Result<Self, ClientError> {
        let endpoint = options.endpoint()?;
        let auth = options.auth()?;
        Ok(Self::from_parts(
            endpoint.connect_lazy(),
            endpoint,
            auth,
            &options,
        ))
    }

    fn from_parts(
        unary: Channel,
        endpoint: Endpoint,
        auth: Auth,
        options: &ConnectOptions,
    ) -> Self {
        let tracks = Arc::<fencing::Tracks>::default();
        let retry = options.retry.clone();
        Self {
            inner: Arc::new(Inner {
                raw: ResponseCoordinatorClient::with_interceptor(unary, auth.clone()),
                watches: watch::Watches::new(
                    endpoint,
                    auth,
                    retry.clone(),
                    Arc::clone(&tracks),
                    options.watch_linger,
                ),
                retry,
                tracks,
            }),
        }
    }

    /// The generated client (with the token interceptor) for calls this API
    /// does not wrap.
    pub fn raw(&self) -> RawClient {
        self.inner.raw.clone()
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// A handle on one session. Its session's events reach this client
    /// while a [`Response`] of it is live, and for the watch linger after
    /// ([`ConnectOptions::watch_linger`]); [`Session::open_watch`] opens
    /// them ahead of the first Start.
    pub fn session(&self, session_id: &str) -> Result<Session, ClientError> {
        let id = SessionId::parse(session_id).map_err(|e| ClientError::invalid("session_id", e))?;
        let guard = self.inner.tracks.track(id.as_str());
        Ok(Session::new(self.clone(), id, guard))
    }

    /// How this client's session watches are doing.
    pub fn watch_status(&self) -> WatchStatus {
        self.inner.watches.status()
    }

    pub(crate) fn tracks(&self) -> &fencing::Tracks {
        &self.inner.tracks
    }

    pub(crate) fn watches(&self) -> &watch::Watches {
        &self.inner.watches
    }

    // ---- unary calls, each retried per the policy when that is safe ----

    /// GetState. Idempotent: retried.
    pub async fn get_state(&self, session_id: &str) -> Result<SessionState, ClientError> {
        let (reply, _) = self
            .call(
                true,
                |mut raw, request| async move { raw.get_state(request).await },
                pb::GetStateRequest {
                    session_id: session_id.into(),
                },
            )
            .await?;
        Ok(reply.state.unwrap_or_default())
    }

    /// One ListSessions page. Idempotent: retried.
    pub async fn list_page(
        &self,
        page_size: u32,
        page_token: String,
    ) -> Result<pb::ListSessionsResponse, ClientError> {
        let request = pb::ListSessionsRequest {
            page_size,
            page_token,
        };
        let (reply, _) = self
            .call(
                true,
                |mut raw, request| async move { raw.list_sessions(request).await },
                request,
            )
            .await?;
        Ok(reply)
    }

    /// Start. With a request id (one is generated when `request_id` is None)
    /// a retry is a replay, so it is retried.
    pub async fn start_call(
        &self,
        session_id: &str,
        source: Source,
        request_id: Option<&str>,
    ) -> Result<pb::StartResponse, ClientError> {
        let request = pb::StartRequest {
            session_id: session_id.into(),
            source: source.into(),
            request_id: request_id.map_or_else(new_request_id, str::to_owned),
        };
        let (reply, _) = self
            .call(
                true,
                |mut raw, request| async move { raw.start(request).await },
                request,
            )
            .await?;
        Ok(reply)
    }

    /// Finish. The id makes it idempotent, so it is retried; after a retry,
    /// `applied == false` may mean an earlier attempt applied (the second is
    /// then stale). Returns the reply and the number of attempts.
    pub async fn finish_call(
        &self,
        session_id: &str,
        response_id: u64,
        status: TerminalStatus,
    ) -> Result<(pb::FinishResponse, u32), ClientError> {
        let request = pb::FinishRequest {
            session_id: session_id.into(),
            response_id,
            status: status.into(),
        };
        self.call(
            true,
            |mut raw, request| async move { raw.finish(request).await },
            request,
        )
        .await
    }

    /// Cancel. Retried only with `if_response_id`: a blind retry of "cancel
    /// whatever is live" could cancel a response started in between.
    pub async fn cancel_call(
        &self,
        session_id: &str,
        source: Source,
        if_response_id: Option<u64>,
    ) -> Result<pb::CancelResponse, ClientError> {
        let request = pb::CancelRequest {
            session_id: session_id.into(),
            source: source.into(),
            if_response_id: if_response_id.unwrap_or(0),
        };
        let (reply, _) = self
            .call(
                if_response_id.is_some(),
                |mut raw, request| async move { raw.cancel(request).await },
                request,
            )
            .await?;
        Ok(reply)
    }

    /// Shutdown, asked for by `source` (recorded on the live response's
    /// `cancel_requested`). Idempotent: retried.
    pub async fn shutdown_call(
        &self,
        session_id: &str,
        source: Source,
    ) -> Result<pb::ShutdownResponse, ClientError> {
        let request = pb::ShutdownRequest {
            session_id: session_id.into(),
            source: source.into(),
        };
        let (reply, _) = self
            .call(
                true,
                |mut raw, request| async move { raw.shutdown(request).await },
                request,
            )
            .await?;
        Ok(reply)
    }

    /// Runs one unary call under the retry policy: each attempt gets the
    /// attempt timeout (capped by what is left of the deadline, and sent as
    /// `grpc-timeout`); only idempotent calls are tried again.
    async fn call<M, T, F, Fut>(
        &self,
        idempotent: bool,
        mut attempt: F,
        message: M,
    ) -> Result<(T, u32), ClientError>
    where
        M: Clone,
        F: FnMut(RawClient, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let policy = if idempotent {
            self.inner.retry.clone()
        } else {
            self.inner.retry.clone().single_attempt()
        };
        retry::run(&policy, |timeout: Duration| {
            let mut request = Request::new(message.clone());
            request.set_timeout(timeout);
            let call = attempt(self.inner.raw.clone(), request);
            async move { call.await.map(tonic::Response::into_inner) }
        })
        .await
        .map_err(ClientError::from)
    }
}

/// A fresh request id: 128 random bits, hex.
pub fn new_request_id() -> String {
    format!("rc-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// The proto enum name without its prefix, lower case: `PHASE_ACTIVE` is
/// `active`. For readable output.
pub use respcoord_proto::timeline::short_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_read_like_the_wire() {
        assert_eq!(code_name(Code::NotFound), "NOT_FOUND");
        assert_eq!(code_name(Code::Unavailable), "UNAVAILABLE");
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }

    #[test]
    fn short_names() {
        assert_eq!(short_name(Phase::Active.as_str_name()), "active");
        assert_eq!(short_name(Source::Vad.as_str_name()), "vad");
        assert_eq!(
            short_name(respcoord_proto::v1::CancelReason::Superseded.as_str_name()),
            "superseded"
        );
    }

    #[test]
    fn request_ids_are_distinct_and_within_the_limit() {
        let a = new_request_id();
        assert_ne!(a, new_request_id());
        assert!(a.len() <= respcoord_proto::ids::MAX_REQUEST_ID_BYTES);
    }
}
