//! Session watches: one Watch stream per session where this client has a
//! live response (or had one within the linger, or opened it ahead),
//! opened when the fencing table asks (`fencing.rs`) and closed when it
//! says so. A gateway's cost follows its own sessions, not the
//! deployment's traffic.
//!
//! # One stream's life
//! - Opened for a Start with `after_revision` just below the reply's
//!   revision, so the first event is the response's own `started`: proof
//!   that the stream follows the session the Start was applied to.
//!   Anything else first (the session was recreated since, say after a
//!   coordinator restart), or nothing within an attempt timeout, sends it
//!   to a state read. Opened ahead of any Start, it begins with that read.
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
    fencing::{Effects, Idle, Tracks, WatchOrder},
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

/// Waits out a session watch's linger after its last response, then hands
/// the notice back to the table (which closes the watch unless the session
/// was used again meanwhile).
#[derive(Clone)]
pub(crate) struct Linger {
    tracks: Arc<Tracks>,
    after: Duration,
}

impl Linger {
    pub(crate) fn new(tracks: Arc<Tracks>, after: Duration) -> Self {
        Self { tracks, after }
    }

    pub(crate) fn is_off(&self) -> bool {
        self.after.is_zero()
    }

    pub(crate) fn begin(&self, idle: Option<Idle>) {
        let Some(idle) = idle else { return };
        // A handle dropped outside any runtime cannot wait: it closes now.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if !self.after.is_zero() => {
                let (tracks, after) = (Arc::clone(&self.tracks), self.after);
                runtime.spawn(async move {
                    tokio::time::sleep(after).await;
                    tracks.linger_over(&idle);
                });
            }
            _ => self.tracks.linger_over(&idle),
        }
    }
}

/// Spawns session watches on a pool of connections.
pub(crate) struct Watches {
    endpoint: Endpoint,
    auth: Auth,
    retry: RetryPolicy,
    tracks: Arc<Tracks>,
    linger: Linger,
    slots: Arc<Mutex<Vec<Slot>>>,
    cells: Arc<Cells>,
}

impl Watches {
    pub(crate) fn new(
        endpoint: Endpoint,
        auth: Auth,
        retry: RetryPolicy,
        tracks: Arc<Tracks>,
        linger: Duration,
    ) -> Self {
        Self {
            endpoint,
            auth,
            retry,
            linger: Linger::new(Arc::clone(&tracks), linger),
            tracks,
            slots: Arc::default(),
            cells: Arc::default(),
        }
    }

    pub(crate) fn linger(&self) -> &Linger {
        &self.linger
    }

    /// Carries out what the table asked for.
    pub(crate) fn carry_out(&self, effects: Effects) {
        if let Some(order) = effects.open {
            self.open(order);
        }
        self.linger.begin(effects.idle);
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
            linger: self.linger.clone(),
            retry: self.retry.clone(),
            cells: Arc::clone(&self.cells),
            session: order.session.to_string(),
            position: order.after_revision.unwrap_or(0),
            read_first: order.after_revision.is_none(),
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
    linger: Linger,
    retry: RetryPolicy,
    cells: Arc<Cells>,
    session: String,
    /// The highest revision applied.
    position: u64,
    /// Opened ahead of any Start: the first stream starts from a state read.
    read_first: bool,
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
        if self.read_first && !self.read_until_answered(&stop, &mut failures).await {
            return;
        }
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
            if !self.read_until_answered(&stop, &mut failures).await {
                return;
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

    /// Reads the session's state until a read is answered, setting the
    /// position to watch from. False when the watch was stopped meanwhile.
    async fn read_until_answered(&mut self, stop: &CancellationToken, failures: &mut u32) -> bool {
        loop {
            let read = tokio::select! {
                biased;
                () = stop.cancelled() => return false,
                read = self.reread() => read,
            };
            match read {
                Ok(Read::From(revision)) => {
                    self.position = revision;
                    return true;
                }
                // Responses registered after the read (a session this
                // client created anew) keep the watch open: from the
                // new session's first event.
                Ok(Read::Gone) => {
                    self.position = 0;
                    return true;
                }
                Err(status) => {
                    tracing::info!(session = %self.session, code = ?status.code(), message = status.message(), "session state read failed; retrying");
                    *failures = failures.saturating_add(1);
                    let pause = self.retry.backoff(*failures);
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return false,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
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
                    for idle in self.tracks.apply(&message.events) {
                        self.linger.begin(Some(idle));
                    }
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
                    self.linger
                        .begin(self.tracks.apply_gone(&self.session, ticket));
                }
                self.linger.begin(self.tracks.apply_state(&state, ticket));
                Ok(Read::From(state.revision))
            }
            Err(status) if status.code() == Code::NotFound => {
                self.linger
                    .begin(self.tracks.apply_gone(&self.session, ticket));
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
mod tests;
