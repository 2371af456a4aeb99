//! Sessions and responses: start, fence, finish, and `run`.

use std::{future::Future, sync::Arc};

use tokio_util::sync::CancellationToken;

use super::{
    fencing::{Liveness, TrackGuard},
    Client, ClientError, SessionState, Source, TerminalStatus,
};
use respcoord_proto::{
    ids::{RequestId, SessionId},
    v1::{self as pb, CancelReason},
};

/// Why a response stopped being current.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// A newer Start on the session replaced it (from any gateway).
    Superseded,
    /// A Cancel call cancelled it.
    Cancelled,
    /// The session was shut down.
    Shutdown,
    /// The session expired (no call for the idle TTL).
    Expired,
    /// A Finish for this id ended it, sent by someone else (another process
    /// holding the same id, or an operator).
    Ended,
    /// The coordinator no longer has it live and the watch could not see
    /// how it ended: found by a re-list after OUT_OF_RANGE, for example when
    /// the coordinator restarted and lost its in-memory sessions.
    Gone,
    /// This handle reported Finish (local: seen only through a [`Fence`]).
    Finished,
    /// The handle was dropped without Finish (local: seen only through a
    /// [`Fence`]).
    Released,
}

/// The stop a cancellation event means (clients/scenarios/rules.json).
impl From<CancelReason> for StopReason {
    fn from(reason: CancelReason) -> Self {
        match reason {
            CancelReason::Superseded => StopReason::Superseded,
            CancelReason::Requested => StopReason::Cancelled,
            CancelReason::Shutdown => StopReason::Shutdown,
            CancelReason::Expired => StopReason::Expired,
            CancelReason::Unspecified => StopReason::Gone,
        }
    }
}

/// The terminal a gateway reports for its own response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminal {
    Completed,
    Failed,
}

impl From<Terminal> for TerminalStatus {
    fn from(terminal: Terminal) -> Self {
        match terminal {
            Terminal::Completed => TerminalStatus::Completed,
            Terminal::Failed => TerminalStatus::Failed,
        }
    }
}

/// What became of a Finish.
#[derive(Clone, Debug, PartialEq)]
pub enum Finished {
    /// The coordinator ended the response with this terminal.
    Applied(SessionState),
    /// The response was no longer active (someone cancelled or superseded
    /// it while the Finish was on its way): nothing changed. After a retried
    /// Finish this may also be our own earlier attempt having applied.
    Stale(SessionState),
    /// Not sent: the coordinator had already stopped the response.
    NotSent(StopReason),
}

/// Options of one Start.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// The idempotency key. None: a fresh one is generated, which still makes
    /// this call's own retries safe; give one to make retries of a whole
    /// operation (across restarts of the gateway) safe too.
    pub request_id: Option<String>,
}

/// A handle on one session. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Session {
    client: Client,
    id: SessionId,
    guard: TrackGuard,
}

impl Session {
    pub(crate) fn new(client: Client, id: SessionId, guard: TrackGuard) -> Self {
        debug_assert_eq!(guard.session(), id.as_str());
        Self { client, id, guard }
    }

    pub fn id(&self) -> &str {
        self.id.as_str()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens this session's watch now, when the gateway begins serving the
    /// session, so that its first Start needs no Watch set-up: a stop that
    /// lands right after that Start (a user talking over the greeting)
    /// reaches the fence at once. Does not wait. The watch stays open while
    /// a response of this client is live there, and for the watch linger
    /// after the later of this call and the last response
    /// ([`crate::ConnectOptions::watch_linger`]; with zero linger this does
    /// nothing). The session need not exist yet.
    pub fn open_watch(&self) {
        let watches = self.client.watches();
        if watches.linger().is_off() {
            return;
        }
        watches.carry_out(self.client.tracks().open_ahead(&self.guard));
    }

    /// Starts a response (superseding the session's live one, wherever it
    /// runs). The returned handle is stopped when the coordinator cancels or
    /// supersedes it. FAILED_PRECONDITION once the session is terminated.
    pub async fn start(&self, source: Source) -> Result<Response, ClientError> {
        self.start_with(source, StartOptions::default()).await
    }

    pub async fn start_with(
        &self,
        source: Source,
        options: StartOptions,
    ) -> Result<Response, ClientError> {
        let request_id = match options.request_id {
            // Empty on the wire means "no key", which would make a retried
            // Start a second Start: every Start this client sends has one.
            Some(raw) if raw.is_empty() => {
                return Err(ClientError::invalid(
                    "request_id",
                    "must not be empty (omit it to have one generated)",
                ))
            }
            Some(raw) => {
                RequestId::parse_optional(&raw)
                    .map_err(|e| ClientError::invalid("request_id", e))?;
                raw
            }
            None => super::new_request_id(),
        };
        let reply = self
            .client
            .start_call(self.id(), source, Some(&request_id))
            .await?;
        let liveness = Liveness::new(reply.response_id);
        let state = reply.state.clone().unwrap_or_default();
        if reply.replayed && state.active_response_id != reply.response_id {
            // A retry of a Start that applied earlier, whose response has
            // already been replaced or ended.
            liveness.stop(match state.phase() {
                pb::Phase::Terminated => StopReason::Shutdown,
                pb::Phase::Active => StopReason::Superseded,
                _ => StopReason::Gone,
            });
        }
        let guard = self.guard.clone();
        // The session's watch (if this is its only live response) replays
        // from the reply's revision: a stop that lands before the watch
        // opens is not missed.
        if let Some(order) =
            self.client
                .tracks()
                .register(&guard, &liveness, state.revision, !reply.replayed)
        {
            self.client.watches().open(order);
        }
        Ok(Response {
            client: self.client.clone(),
            session: self.id.clone(),
            liveness,
            guard,
            superseded: reply.superseded_response_id,
            replayed: reply.replayed,
            state,
        })
    }

    /// The whole pattern: start a response, run `body` with its context,
    /// and
    /// - if the coordinator stops the response first (superseded or
    ///   cancelled by any gateway, session shut down or expired, or gone),
    ///   cancel the context's token and drop the body at once, send no
    ///   Finish, and return [`RunOutcome::Stopped`];
    /// - otherwise, when the body returns, report Finish exactly once:
    ///   COMPLETED for `Ok`, FAILED for `Err`.
    ///
    /// Output the body emits should pass [`ResponseCtx::is_current`] first;
    /// work it hands to other tasks should watch [`ResponseCtx::token`].
    pub async fn run<T, E, F, Fut>(
        &self,
        source: Source,
        body: F,
    ) -> Result<RunOutcome<T, E>, ClientError>
    where
        F: FnOnce(ResponseCtx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_with(source, StartOptions::default(), body).await
    }

    pub async fn run_with<T, E, F, Fut>(
        &self,
        source: Source,
        options: StartOptions,
        body: F,
    ) -> Result<RunOutcome<T, E>, ClientError>
    where
        F: FnOnce(ResponseCtx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let response = self.start_with(source, options).await?;
        let response_id = response.id();
        let body = body(ResponseCtx {
            fence: response.fence(),
            token: response.token(),
        });
        let result = {
            let stopped = response.liveness.token().cancelled();
            tokio::pin!(body, stopped);
            tokio::select! {
                // A stop that is ready together with the body's end wins: the
                // coordinator has already ended the response.
                biased;
                () = &mut stopped => None,
                result = &mut body => Some(result),
            }
        };
        Ok(match result {
            None => RunOutcome::Stopped {
                response_id,
                reason: response.stop_reason().unwrap_or(StopReason::Gone),
            },
            Some(Ok(value)) => RunOutcome::Completed {
                response_id,
                value,
                finished: response.finish(Terminal::Completed).await,
            },
            Some(Err(error)) => RunOutcome::Failed {
                response_id,
                error,
                finished: response.finish(Terminal::Failed).await,
            },
        })
    }

    /// Cancels the session's live response, or only `if_response_id` if
    /// given. Returns the cancelled id, None if nothing was cancelled.
    pub async fn cancel(
        &self,
        source: Source,
        if_response_id: Option<u64>,
    ) -> Result<Option<u64>, ClientError> {
        let reply = self
            .client
            .cancel_call(self.id(), source, if_response_id)
            .await?;
        Ok(nonzero(reply.cancelled_response_id))
    }

    /// Tears the session down (idempotent), asked for by `source`. Returns
    /// the cancelled id.
    pub async fn shutdown(&self, source: Source) -> Result<Option<u64>, ClientError> {
        let reply = self.client.shutdown_call(self.id(), source).await?;
        Ok(nonzero(reply.cancelled_response_id))
    }

    pub async fn state(&self) -> Result<SessionState, ClientError> {
        self.client.get_state(self.id()).await
    }
}

fn nonzero(id: u64) -> Option<u64> {
    (id != 0).then_some(id)
}

/// What [`Session::run`] gives the body.
#[derive(Clone, Debug)]
pub struct ResponseCtx {
    fence: Fence,
    token: CancellationToken,
}

impl ResponseCtx {
    pub fn response_id(&self) -> u64 {
        self.fence.id()
    }

    /// The fence check: call before emitting each chunk.
    pub fn is_current(&self) -> bool {
        self.fence.is_current()
    }

    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Cancelled when the coordinator stops the response. A child token:
    /// cancelling it does not stop the response.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// How [`Session::run`] ended.
#[derive(Debug)]
pub enum RunOutcome<T, E> {
    /// The body returned `Ok`; Finish(COMPLETED) was reported (see
    /// `finished`: Stale or NotSent if the coordinator stopped the response
    /// at the same moment).
    Completed {
        response_id: u64,
        value: T,
        finished: Result<Finished, ClientError>,
    },
    /// The body returned `Err`; Finish(FAILED) was reported.
    Failed {
        response_id: u64,
        error: E,
        finished: Result<Finished, ClientError>,
    },
    /// The coordinator stopped the response; the body was dropped and no
    /// Finish was sent.
    Stopped {
        response_id: u64,
        reason: StopReason,
    },
}

impl<T, E> RunOutcome<T, E> {
    pub fn response_id(&self) -> u64 {
        match self {
            RunOutcome::Completed { response_id, .. }
            | RunOutcome::Failed { response_id, .. }
            | RunOutcome::Stopped { response_id, .. } => *response_id,
        }
    }
}

/// A started response. Finish it with [`Response::finish`] (at most once:
/// it takes the handle). Dropping it unfinished sends nothing: the
/// coordinator keeps it live until it is superseded, cancelled or expires.
#[derive(Debug)]
pub struct Response {
    client: Client,
    session: SessionId,
    liveness: Arc<Liveness>,
    guard: TrackGuard,
    superseded: u64,
    replayed: bool,
    state: SessionState,
}

impl Response {
    /// The response id: the fencing token.
    pub fn id(&self) -> u64 {
        self.liveness.id
    }

    pub fn session_id(&self) -> &str {
        self.session.as_str()
    }

    /// The response this Start superseded, if any.
    pub fn superseded(&self) -> Option<u64> {
        nonzero(self.superseded)
    }

    /// True if the Start was answered as a replay of an earlier attempt.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// The session's state in the Start reply.
    pub fn start_state(&self) -> &SessionState {
        &self.state
    }

    /// The fence check (one atomic load): false once the coordinator stopped
    /// this response or it was finished.
    pub fn is_current(&self) -> bool {
        self.liveness.is_current()
    }

    /// A cloneable fence for the output path (audio sink, conversation
    /// append, tool calls).
    pub fn fence(&self) -> Fence {
        Fence(Arc::clone(&self.liveness))
    }

    /// Cancelled when the response stops (a child token: cancelling it does
    /// not stop the response).
    pub fn token(&self) -> CancellationToken {
        self.liveness.token().child_token()
    }

    /// Resolves when the response stops, with why.
    pub async fn stopped(&self) -> StopReason {
        self.liveness.token().cancelled().await;
        self.stop_reason().unwrap_or(StopReason::Gone)
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        self.liveness.reason()
    }

    /// Reports this response's own terminal, unless the coordinator has
    /// already stopped it (then nothing is sent: [`Finished::NotSent`]).
    /// The fence closes first, so no output follows a Finish.
    pub async fn finish(self, terminal: Terminal) -> Result<Finished, ClientError> {
        if !self.liveness.stop(StopReason::Finished) {
            return Ok(Finished::NotSent(
                self.liveness.reason().unwrap_or(StopReason::Gone),
            ));
        }
        let (reply, _) = self
            .client
            .finish_call(self.session_id(), self.id(), terminal.into())
            .await?;
        let state = reply.state.unwrap_or_default();
        Ok(if reply.applied {
            Finished::Applied(state)
        } else {
            Finished::Stale(state)
        })
    }

    /// Cancels this response (only if it is still the live one). True if the
    /// coordinator cancelled it.
    pub async fn cancel(self, source: Source) -> Result<bool, ClientError> {
        let cancelled = self
            .client
            .cancel_call(self.session_id(), source, Some(self.id()))
            .await?;
        Ok(cancelled.cancelled_response_id == self.id())
    }
}

impl Drop for Response {
    fn drop(&mut self) {
        self.liveness.stop(StopReason::Released);
        let idle = self.client.tracks().unregister(&self.guard, &self.liveness);
        self.client.watches().linger().begin(idle);
    }
}

/// The output path's fence: cheap to clone and to check.
#[derive(Clone, Debug)]
pub struct Fence(Arc<Liveness>);

impl Fence {
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// One atomic load. False once the response was stopped by the
    /// coordinator, finished, or its handle dropped: drop the output.
    pub fn is_current(&self) -> bool {
        self.0.is_current()
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        self.0.reason()
    }
}
