//! Session watches: one Watch stream per session where this client has a
//! live response, opened when the fencing table asks (`fencing.rs`) and
//! closed when it says so. A gateway's cost follows its own sessions, not
//! the deployment's traffic.
//!
//! # One stream's life
//! - Opened with `after_revision` just below the Start reply's revision, so
//!   the first event is the response's own `started`: proof that the stream
//!   follows the session the Start was applied to. Anything else first (the
//!   session was recreated since, say after a coordinator restart), or
//!   nothing within an attempt timeout, sends it to a state read.
//! - Every event goes through [`Tracks::apply`]; the position is the
//!   highest revision seen.
//! - After `terminated` the stream ends and so does the watch.
//! - Broken (transport, server shutdown, fell behind) or OUT_OF_RANGE: the
//!   session's state is read (GetState) before the stream is reopened,
//!   from the state's revision. A session not found, or at a revision below
//!   the position (recreated), means the responses the read covered are
//!   gone; so does any state that no longer has them active.
//!
//! # Connections
//! Streams share a small pool of connections of their own (not the calls'
//! connection), at most [`STREAMS_PER_CONNECTION`] each: the server allows
//! 1024 concurrent streams per connection by default, and a gateway with
//! thousands of calls must not queue watches behind that limit.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use tonic::{transport::Endpoint, Code, Request, Status};

use super::{
    connect::Auth,
    fencing::{Tracks, WatchOrder},
    RawClient, RetryPolicy,
};
use respcoord_proto::v1::{
    self as pb, lifecycle_event::Kind, response_coordinator_client::ResponseCoordinatorClient,
};

/// Watch streams one pooled connection carries at most.
pub const STREAMS_PER_CONNECTION: usize = 500;

/// What a session watch needs from the wire: the seam the Python and
/// TypeScript clients have too (an injected watch transport), so that the
/// watch's reactions are tested against a scripted server.
pub(crate) trait Transport: Send + Sync + 'static {
    type Messages: Messages;

    /// Watch(session_id, after_revision).
    fn watch(
        &self,
        session: &str,
        after_revision: u64,
    ) -> impl Future<Output = Result<Self::Messages, Status>> + Send;

    /// One GetState attempt within `timeout`.
    fn get_state(
        &self,
        session: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<pb::SessionState, Status>> + Send;
}

/// An open watch stream's messages.
pub(crate) trait Messages: Send + 'static {
    /// The next message; `None` when the stream ended with OK.
    fn next(&mut self) -> impl Future<Output = Result<Option<pb::WatchResponse>, Status>> + Send;
}

impl Transport for RawClient {
    type Messages = tonic::Streaming<pb::WatchResponse>;

    fn watch(
        &self,
        session: &str,
        after_revision: u64,
    ) -> impl Future<Output = Result<Self::Messages, Status>> + Send {
        let mut raw = self.clone();
        let request = pb::WatchRequest {
            session_id: session.to_owned(),
            after_revision: Some(after_revision),
            after_seq: None,
        };
        async move {
            ResponseCoordinatorClient::watch(&mut raw, Request::new(request))
                .await
                .map(tonic::Response::into_inner)
        }
    }

    fn get_state(
        &self,
        session: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<pb::SessionState, Status>> + Send {
        let mut raw = self.clone();
        let mut request = Request::new(pb::GetStateRequest {
            session_id: session.to_owned(),
        });
        request.set_timeout(timeout);
        async move {
            let reply = ResponseCoordinatorClient::get_state(&mut raw, request)
                .await?
                .into_inner();
            Ok(reply.state.unwrap_or_default())
        }
    }
}

impl Messages for tonic::Streaming<pb::WatchResponse> {
    fn next(&mut self) -> impl Future<Output = Result<Option<pb::WatchResponse>, Status>> + Send {
        self.message()
    }
}

/// How this client's session watches are doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchStatus {
    /// Session watches running now: one per session with a live response.
    pub open: u64,
    /// Watch streams opened so far, reopenings included.
    pub opened: u64,
    /// Streams reopened after a break, OUT_OF_RANGE or a failed check.
    pub reconnects: u64,
    /// Session states read (GetState) to resume a watch.
    pub rereads: u64,
    /// Connections in the watch pool.
    pub connections: u64,
}

#[derive(Debug, Default)]
struct Cells {
    open: AtomicU64,
    opened: AtomicU64,
    reconnects: AtomicU64,
    rereads: AtomicU64,
}

struct Slot {
    raw: RawClient,
    streams: usize,
}

/// Spawns session watches on a pool of connections.
pub(crate) struct Watches {
    endpoint: Endpoint,
    auth: Auth,
    retry: RetryPolicy,
    tracks: Arc<Tracks>,
    slots: Arc<Mutex<Vec<Slot>>>,
    cells: Arc<Cells>,
}

impl Watches {
    pub(crate) fn new(
        endpoint: Endpoint,
        auth: Auth,
        retry: RetryPolicy,
        tracks: Arc<Tracks>,
    ) -> Self {
        Self {
            endpoint,
            auth,
            retry,
            tracks,
            slots: Arc::default(),
            cells: Arc::default(),
        }
    }

    pub(crate) fn status(&self) -> WatchStatus {
        let load = |cell: &AtomicU64| cell.load(Ordering::Acquire);
        WatchStatus {
            open: load(&self.cells.open),
            opened: load(&self.cells.opened),
            reconnects: load(&self.cells.reconnects),
            rereads: load(&self.cells.rereads),
            connections: self
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len() as u64,
        }
    }

    /// Carries out a [`WatchOrder`]: the watch runs on its own task until
    /// the order's token is cancelled or the session ends.
    pub(crate) fn open(&self, order: WatchOrder) {
        let (slot, raw) = self.acquire();
        self.cells.open.fetch_add(1, Ordering::AcqRel);
        let watch = SessionWatch {
            transport: raw,
            tracks: Arc::clone(&self.tracks),
            retry: self.retry.clone(),
            cells: Arc::clone(&self.cells),
            session: order.session.to_string(),
            position: order.after_revision,
            expect_started: order.expect_started,
        };
        let (slots, cells) = (Arc::clone(&self.slots), Arc::clone(&self.cells));
        tokio::spawn(async move {
            watch.run(order.stop).await;
            cells.open.fetch_sub(1, Ordering::AcqRel);
            if let Some(slot) = slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(slot)
            {
                slot.streams -= 1;
            }
        });
    }

    /// The first pooled connection with room, or a new one.
    fn acquire(&self) -> (usize, RawClient) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let index = match slots
            .iter()
            .position(|s| s.streams < STREAMS_PER_CONNECTION)
        {
            Some(index) => index,
            None => {
                slots.push(Slot {
                    raw: ResponseCoordinatorClient::with_interceptor(
                        self.endpoint.connect_lazy(),
                        self.auth.clone(),
                    ),
                    streams: 0,
                });
                slots.len() - 1
            }
        };
        slots[index].streams += 1;
        (index, slots[index].raw.clone())
    }
}

struct SessionWatch<T> {
    transport: T,
    tracks: Arc<Tracks>,
    retry: RetryPolicy,
    cells: Arc<Cells>,
    session: String,
    /// The highest revision applied.
    position: u64,
    /// The response whose `started` must come first on the first stream.
    expect_started: Option<u64>,
}

/// How one stream ended.
enum Ended {
    /// After `terminated`: the session will emit nothing more.
    Over,
    /// Read the state before reopening. `progressed`: the stream delivered
    /// something first (a later failure starts the backoff afresh).
    Reread {
        progressed: bool,
        status: Option<Status>,
    },
}

/// What a state read found.
enum Read {
    /// Watch on from this revision.
    From(u64),
    /// The session does not exist: the responses the read covered are gone.
    Gone,
}

impl<T: Transport> SessionWatch<T> {
    async fn run(mut self, stop: CancellationToken) {
        let mut failures = 0u32;
        loop {
            let ended = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                ended = self.follow() => ended,
            };
            let Ended::Reread { progressed, status } = ended else {
                return;
            };
            // The state read settles what the proof would have: the next
            // stream starts at the state's revision, past the Start.
            self.expect_started = None;
            if progressed {
                failures = 0;
            }
            if let Some(status) = &status {
                tracing::debug!(session = %self.session, code = ?status.code(), message = status.message(), "session watch ended; reading the state");
            }
            loop {
                let read = tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    read = self.reread() => read,
                };
                match read {
                    Ok(Read::From(revision)) => {
                        self.position = revision;
                        break;
                    }
                    // Responses registered after the read (a session this
                    // client created anew) keep the watch open: from the
                    // new session's first event.
                    Ok(Read::Gone) => {
                        self.position = 0;
                        break;
                    }
                    Err(status) => {
                        tracing::info!(session = %self.session, code = ?status.code(), message = status.message(), "session state read failed; retrying");
                        failures = failures.saturating_add(1);
                        let pause = self.retry.backoff(failures);
                        tokio::select! {
                            biased;
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(pause) => {}
                        }
                    }
                }
            }
            if !progressed {
                failures = failures.saturating_add(1);
                let pause = self.retry.backoff(failures);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
            self.cells.reconnects.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Opens the session's watch from the position and applies it until it
    /// ends.
    async fn follow(&mut self) -> Ended {
        let reread = |progressed, status| Ended::Reread { progressed, status };
        let mut stream = match self.transport.watch(&self.session, self.position).await {
            Ok(stream) => stream,
            Err(status) => return reread(false, Some(status)),
        };
        self.cells.opened.fetch_add(1, Ordering::AcqRel);
        let mut progressed = false;
        loop {
            let message = match self.expect_started {
                // The proof must come at once: it is replayed history.
                Some(_) => match tokio::time::timeout(self.check_within(), stream.next()).await {
                    Ok(message) => message,
                    Err(_) => {
                        self.expect_started = None;
                        return reread(progressed, None);
                    }
                },
                None => stream.next().await,
            };
            match message {
                Ok(Some(message)) => {
                    if let Some(expected) = self.expect_started.take() {
                        if !starts_with(&message.events, expected, self.position + 1) {
                            // Not the session the Start was applied to.
                            return reread(progressed, None);
                        }
                    }
                    progressed = true;
                    self.tracks.apply(&message.events);
                    for event in &message.events {
                        self.position = self.position.max(event.revision);
                        if matches!(event.kind, Some(Kind::Terminated(_))) {
                            return Ended::Over;
                        }
                    }
                }
                Ok(None) => return reread(progressed, None),
                Err(status) => return reread(progressed, Some(status)),
            }
        }
    }

    fn check_within(&self) -> Duration {
        self.retry.attempt_timeout
    }

    /// GetState, applied to the fencing table; where to watch from next.
    async fn reread(&mut self) -> Result<Read, Status> {
        self.cells.rereads.fetch_add(1, Ordering::AcqRel);
        let ticket = self.tracks.ticket();
        let (transport, session) = (&self.transport, self.session.as_str());
        let answer =
            super::retry::run(&self.retry, |timeout| transport.get_state(session, timeout)).await;
        match answer {
            Ok((state, _)) => {
                if state.revision < self.position {
                    // Revisions start again at 1 when a session is
                    // recreated: this is not the session we watched.
                    self.tracks.apply_gone(&self.session, ticket);
                }
                self.tracks.apply_state(&state, ticket);
                Ok(Read::From(state.revision))
            }
            Err(status) if status.code() == Code::NotFound => {
                self.tracks.apply_gone(&self.session, ticket);
                Ok(Read::Gone)
            }
            Err(status) => Err(status),
        }
    }
}

/// Whether `events` begin with `started(response)` at `revision`.
fn starts_with(events: &[pb::LifecycleEvent], response: u64, revision: u64) -> bool {
    events.first().is_some_and(|event| {
        event.revision == revision
            && matches!(&event.kind, Some(Kind::Started(s)) if s.response_id == response)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::{fencing::Liveness, StopReason};

    /// How a scripted stream goes on once its messages are delivered.
    enum Then {
        /// Stays open, silent.
        Hang,
        /// Fails with this status.
        Fail(Status),
    }

    struct Scripted {
        messages: VecDeque<pb::WatchResponse>,
        then: Option<Then>,
    }

    impl Messages for Scripted {
        fn next(
            &mut self,
        ) -> impl Future<Output = Result<Option<pb::WatchResponse>, Status>> + Send {
            let next = match self.messages.pop_front() {
                Some(message) => Some(Ok(Some(message))),
                None => match self.then.take() {
                    Some(Then::Fail(status)) => Some(Err(status)),
                    Some(Then::Hang) | None => None,
                },
            };
            async move {
                match next {
                    Some(next) => next,
                    None => std::future::pending().await,
                }
            }
        }
    }

    /// What the next Watch call does: open and deliver, then go on so; or fail.
    type Opened = Result<(Vec<pb::WatchResponse>, Then), Status>;

    /// A scripted server: each Watch takes the next stream, each GetState
    /// the next answer (a call past the script waits forever); every call
    /// is recorded.
    #[derive(Default)]
    struct Script {
        watches: Mutex<VecDeque<Opened>>,
        states: Mutex<VecDeque<Result<pb::SessionState, Status>>>,
        calls: Mutex<Vec<String>>,
    }

    impl Script {
        /// The next Watch opens and delivers `messages`, then `then`.
        fn stream(&self, messages: Vec<pb::WatchResponse>, then: Then) {
            self.watches.lock().unwrap().push_back(Ok((messages, then)));
        }

        /// The next Watch fails to open.
        fn refuse(&self, status: Status) {
            self.watches.lock().unwrap().push_back(Err(status));
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Transport for Arc<Script> {
        type Messages = Scripted;

        fn watch(
            &self,
            _session: &str,
            after_revision: u64,
        ) -> impl Future<Output = Result<Scripted, Status>> + Send {
            self.calls
                .lock()
                .unwrap()
                .push(format!("watch {after_revision}"));
            let next = self.watches.lock().unwrap().pop_front();
            async move {
                match next {
                    Some(Ok((messages, then))) => Ok(Scripted {
                        messages: messages.into(),
                        then: Some(then),
                    }),
                    Some(Err(status)) => Err(status),
                    None => std::future::pending().await,
                }
            }
        }

        fn get_state(
            &self,
            _session: &str,
            _timeout: Duration,
        ) -> impl Future<Output = Result<pb::SessionState, Status>> + Send {
            self.calls.lock().unwrap().push("get_state".into());
            let next = self.states.lock().unwrap().pop_front();
            async move {
                match next {
                    Some(answer) => answer,
                    None => std::future::pending().await,
                }
            }
        }
    }

    fn message(events: Vec<pb::LifecycleEvent>) -> pb::WatchResponse {
        pb::WatchResponse {
            events,
            progress_seq: 0,
        }
    }

    fn event(revision: u64, kind: Kind) -> pb::LifecycleEvent {
        pb::LifecycleEvent {
            session_id: "s".into(),
            revision,
            seq: revision,
            unix_nanos: 0,
            kind: Some(kind),
        }
    }

    fn started(id: u64) -> Kind {
        Kind::Started(pb::ResponseStarted {
            response_id: id,
            source: pb::Source::Client.into(),
        })
    }

    fn cancelled(id: u64, reason: pb::CancelReason) -> Kind {
        Kind::CancelRequested(pb::ResponseCancelRequested {
            response_id: id,
            reason: reason.into(),
            source: pb::Source::Unspecified.into(),
        })
    }

    fn active(id: u64, revision: u64) -> pb::SessionState {
        pb::SessionState {
            session_id: "s".into(),
            phase: pb::Phase::Active.into(),
            active_response_id: id,
            revision,
            ..Default::default()
        }
    }

    /// Response 10, whose Start reply carried revision 5, and its session's
    /// watch running against `script`.
    struct Running {
        response: Arc<Liveness>,
        stop: CancellationToken,
        cells: Arc<Cells>,
        _guard: crate::fencing::TrackGuard,
    }

    fn run(script: &Arc<Script>) -> Running {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let response = Liveness::new(10);
        let order = tracks
            .register(&guard, &response, 5, true)
            .expect("the first response opens the watch");
        let cells = Arc::new(Cells::default());
        let watch = SessionWatch {
            transport: Arc::clone(script),
            tracks,
            retry: RetryPolicy::default(),
            cells: Arc::clone(&cells),
            session: "s".into(),
            position: order.after_revision,
            expect_started: order.expect_started,
        };
        let stop = order.stop.clone();
        tokio::spawn(watch.run(order.stop));
        Running {
            response,
            stop,
            cells,
            _guard: guard,
        }
    }

    async fn stopped(response: &Liveness) -> StopReason {
        tokio::time::timeout(Duration::from_secs(600), response.token().cancelled())
            .await
            .expect("stopped");
        response.reason().expect("a reason")
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_replayed_after_the_proof_of_the_start_stops_the_response() {
        let script = Arc::new(Script::default());
        script.stream(
            vec![
                message(vec![event(5, started(10))]),
                message(vec![
                    event(6, cancelled(10, pb::CancelReason::Superseded)),
                    event(8, started(11)),
                ]),
            ],
            Then::Hang,
        );
        let running = run(&script);
        assert_eq!(stopped(&running.response).await, StopReason::Superseded);
        assert!(
            running.stop.is_cancelled(),
            "nothing live: the watch closed"
        );
        assert_eq!(
            script.calls(),
            ["watch 4"],
            "replayed from just below the reply"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_event_that_is_not_the_start_means_a_recreated_session() {
        let script = Arc::new(Script::default());
        script.stream(vec![message(vec![event(5, started(3))])], Then::Hang);
        // Revision 2: below the watch's position, a new session of that id.
        script.states.lock().unwrap().push_back(Ok(active(12, 2)));
        let running = run(&script);
        assert_eq!(stopped(&running.response).await, StopReason::Gone);
        assert_eq!(script.calls(), ["watch 4", "get_state"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_not_found_after_a_break_is_gone() {
        let script = Arc::new(Script::default());
        script.stream(
            vec![message(vec![event(5, started(10))])],
            Then::Fail(Status::unavailable("connection reset")),
        );
        script
            .states
            .lock()
            .unwrap()
            .push_back(Err(Status::not_found("no session s")));
        let running = run(&script);
        assert_eq!(stopped(&running.response).await, StopReason::Gone);
        assert_eq!(script.calls(), ["watch 4", "get_state"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_stream_resumes_from_the_state_it_read() {
        let script = Arc::new(Script::default());
        script.stream(
            vec![message(vec![event(5, started(10))])],
            Then::Fail(Status::unavailable("connection reset")),
        );
        script.stream(
            vec![message(vec![event(
                7,
                cancelled(10, pb::CancelReason::Requested),
            )])],
            Then::Hang,
        );
        script.states.lock().unwrap().push_back(Ok(active(10, 6)));
        let running = run(&script);
        assert_eq!(stopped(&running.response).await, StopReason::Cancelled);
        assert_eq!(script.calls(), ["watch 4", "get_state", "watch 6"]);
        let load = |cell: &AtomicU64| cell.load(Ordering::Acquire);
        let cells = &running.cells;
        assert_eq!(
            (
                load(&cells.opened),
                load(&cells.reconnects),
                load(&cells.rereads)
            ),
            (2, 1, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_proof_within_the_attempt_timeout_is_checked_by_a_state_read() {
        let script = Arc::new(Script::default());
        script.stream(vec![], Then::Hang);
        script.stream(vec![], Then::Hang);
        script.states.lock().unwrap().push_back(Ok(active(10, 5)));
        let running = run(&script);
        tokio::time::timeout(Duration::from_secs(600), async {
            while script.calls().len() < 3 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a state read and a new stream");
        assert_eq!(script.calls(), ["watch 4", "get_state", "watch 5"]);
        assert!(running.response.is_current(), "the state shows it active");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_failed_to_open_resumes_from_the_state_without_waiting_for_a_proof() {
        let script = Arc::new(Script::default());
        script.refuse(Status::unavailable("no connection yet"));
        script.states.lock().unwrap().push_back(Ok(active(10, 7)));
        script.stream(
            vec![message(vec![event(
                8,
                cancelled(10, pb::CancelReason::Requested),
            )])],
            Then::Hang,
        );
        let running = run(&script);
        assert_eq!(stopped(&running.response).await, StopReason::Cancelled);
        // One read: the stream from the state's revision is not held to the
        // Start's proof (it starts past the Start).
        assert_eq!(script.calls(), ["watch 4", "get_state", "watch 7"]);
    }
}
