//! The shared watch: one watch-all stream per client that stops every
//! response the coordinator cancels or supersedes, whichever gateway asked.
//!
//! # Fencing state
//! Per tracked session the client keeps one number, `dead_through`: every
//! response id of the session up to it is known to be no longer live. Each
//! event and each re-listed state only ever *raises* it with a fact that is
//! true whenever it is applied:
//!
//! | seen | raise to | because |
//! |---|---|---|
//! | `started(y)` | `y - 1` | at most one live response, ids increase |
//! | `cancel_requested(x)`, `ended(x)` | `x` | `x` is done |
//! | `terminated` at seq `q` | `q` | nothing lives after teardown; a later session with this id mints ids above `q` |
//! | listed Active(z) | `z - 1` | as `started(z)` |
//! | listed Idle or Terminated, page seq `q` | `q` | every event up to `q` is reflected, none is live |
//! | not listed (list began at seq `q`) | `q` | the session did not exist throughout: anything it had up to `q` is gone |
//!
//! Because every update is a `max` of true facts, replaying events the
//! client already applied, or applying them in another order than a
//! listing, is harmless; that is what makes resume and re-list simple.
//!
//! # No missed stop
//! A session is tracked before its Start is sent, and the stream is
//! positioned before that (see `Client::ensure_watcher`), so every event of
//! the Start's response passes through [`Tracks::apply`] after the track
//! exists. A response registered after its stop was already applied finds
//! `id <= dead_through` and is stopped on registration.
//!
//! # Resume
//! The task remembers the highest seq it has seen (events and bookmarks).
//! After a broken stream it reconnects with backoff and `after_seq` = that
//! position; OUT_OF_RANGE (history gone, or the coordinator restarted: its
//! seqs start above its boot time) makes it re-list, raise every tracked
//! session from the listing, and watch from the first page's seq.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
    },
};

use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Status};

use super::{RawClient, RetryPolicy, StopReason};
use respcoord_proto::v1::{self as pb, lifecycle_event::Kind};

/// One started response's liveness, shared by its handle, its fences and
/// the watch. Once stopped, it stays stopped.
#[derive(Debug)]
pub(crate) struct Liveness {
    pub(crate) id: u64,
    token: CancellationToken,
    reason: OnceLock<StopReason>,
}

impl Liveness {
    pub(crate) fn new(id: u64) -> Arc<Self> {
        Arc::new(Self {
            id,
            token: CancellationToken::new(),
            reason: OnceLock::new(),
        })
    }

    /// Stops it (the first reason wins). True if this call stopped it.
    pub(crate) fn stop(&self, reason: StopReason) -> bool {
        if self.reason.set(reason).is_ok() {
            self.token.cancel();
            true
        } else {
            false
        }
    }

    /// One atomic load: the fence check.
    pub(crate) fn is_current(&self) -> bool {
        !self.token.is_cancelled()
    }

    pub(crate) fn reason(&self) -> Option<StopReason> {
        if self.token.is_cancelled() {
            self.reason.get().copied()
        } else {
            None
        }
    }

    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }
}

#[derive(Debug)]
struct Track {
    /// Session handles and response handles holding this track.
    refs: usize,
    dead_through: u64,
    /// Why `dead_through` last rose (for responses registered late).
    reason: StopReason,
    /// Live responses of this client in this session (usually one).
    responses: Vec<Arc<Liveness>>,
    /// The re-list epoch when the track was made: a re-list that began
    /// earlier cannot judge it absent.
    epoch: u64,
}

impl Track {
    fn raise(&mut self, through: u64, reason: StopReason) {
        if through > self.dead_through {
            self.dead_through = through;
            self.reason = reason;
        }
        self.responses.retain(|response| {
            if response.id <= through {
                response.stop(reason);
                false
            } else {
                true
            }
        });
    }
}

/// The sessions this client tracks, shared by the handles and the task.
#[derive(Debug, Default)]
pub(crate) struct Tracks {
    map: Mutex<HashMap<Arc<str>, Track>>,
    epoch: AtomicU64,
}

impl Tracks {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Track>> {
        // Every critical section leaves the map consistent.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn track(self: &Arc<Self>, session: &str) -> TrackGuard {
        let mut map = self.lock();
        let session: Arc<str> = match map.get_key_value(session) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::from(session),
        };
        map.entry(Arc::clone(&session))
            .or_insert_with(|| Track {
                refs: 0,
                dead_through: 0,
                reason: StopReason::Gone,
                responses: Vec::new(),
                epoch: self.epoch.load(Ordering::Acquire),
            })
            .refs += 1;
        TrackGuard {
            tracks: Arc::clone(self),
            session,
        }
    }

    /// Adds a started response; stops it at once if the watch already saw
    /// its end.
    pub(crate) fn register(&self, guard: &TrackGuard, response: &Arc<Liveness>) {
        let mut map = self.lock();
        let Some(track) = map.get_mut(&guard.session) else {
            return;
        };
        if response.id <= track.dead_through {
            response.stop(track.reason);
        } else if response.is_current() {
            track.responses.push(Arc::clone(response));
        }
    }

    pub(crate) fn unregister(&self, guard: &TrackGuard, response: &Arc<Liveness>) {
        if let Some(track) = self.lock().get_mut(&guard.session) {
            track.responses.retain(|r| !Arc::ptr_eq(r, response));
        }
    }

    /// Applies one WatchResponse's events; returns the highest seq seen.
    fn apply(&self, events: &[pb::LifecycleEvent]) -> u64 {
        let mut map = self.lock();
        let mut high = 0;
        for event in events {
            high = high.max(event.seq);
            let Some(track) = map.get_mut(event.session_id.as_str()) else {
                continue;
            };
            match &event.kind {
                Some(Kind::Started(s)) => {
                    track.raise(s.response_id.saturating_sub(1), StopReason::Superseded)
                }
                Some(Kind::CancelRequested(c)) => {
                    track.raise(c.response_id, StopReason::from_cancel(c.reason()))
                }
                Some(Kind::Ended(e)) => {
                    let reason = if e.status() == pb::TerminalStatus::Cancelled {
                        StopReason::from_cancel(e.reason())
                    } else {
                        StopReason::Ended
                    };
                    track.raise(e.response_id, reason)
                }
                Some(Kind::Terminated(t)) => {
                    track.raise(event.seq, StopReason::from_cancel(t.reason()))
                }
                None => {}
            }
        }
        high
    }

    fn apply_listed(&self, page_seq: u64, states: &[pb::SessionState], seen: &mut HashSet<String>) {
        let mut map = self.lock();
        for state in states {
            let Some(track) = map.get_mut(state.session_id.as_str()) else {
                continue;
            };
            seen.insert(state.session_id.clone());
            match state.phase() {
                pb::Phase::Active => track.raise(
                    state.active_response_id.saturating_sub(1),
                    StopReason::Superseded,
                ),
                pb::Phase::Terminated => track.raise(page_seq, StopReason::Shutdown),
                pb::Phase::Idle | pb::Phase::Unspecified => track.raise(page_seq, StopReason::Gone),
            }
        }
    }

    fn apply_absent(&self, list_epoch: u64, first_seq: u64, seen: &HashSet<String>) {
        let mut map = self.lock();
        for (session, track) in map.iter_mut() {
            if track.epoch < list_epoch && !seen.contains(&**session) {
                track.raise(first_seq, StopReason::Gone);
            }
        }
    }

    fn begin_relist(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    #[cfg(test)]
    fn dead_through(&self, session: &str) -> Option<u64> {
        self.lock().get(session).map(|t| t.dead_through)
    }
}

/// Keeps a session tracked while held.
#[derive(Debug)]
pub(crate) struct TrackGuard {
    tracks: Arc<Tracks>,
    session: Arc<str>,
}

impl TrackGuard {
    pub(crate) fn session(&self) -> &str {
        &self.session
    }
}

impl Clone for TrackGuard {
    fn clone(&self) -> Self {
        if let Some(track) = self.tracks.lock().get_mut(&self.session) {
            track.refs += 1;
        }
        Self {
            tracks: Arc::clone(&self.tracks),
            session: Arc::clone(&self.session),
        }
    }
}

impl Drop for TrackGuard {
    fn drop(&mut self) {
        let mut map = self.tracks.lock();
        if let Some(track) = map.get_mut(&self.session) {
            track.refs -= 1;
            if track.refs == 0 {
                map.remove(&self.session);
            }
        }
    }
}

/// How the shared watch is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchStatus {
    /// A stream is open.
    pub connected: bool,
    /// The seq it would resume after.
    pub position: u64,
    /// Streams opened after the first one.
    pub reconnects: u64,
    /// Re-lists after OUT_OF_RANGE.
    pub relists: u64,
}

#[derive(Debug, Default)]
struct Cells {
    connected: AtomicBool,
    position: AtomicU64,
    opened: AtomicU64,
    relists: AtomicU64,
}

/// The running watch task.
#[derive(Debug)]
pub(crate) struct Handle {
    stop: CancellationToken,
    cells: Arc<Cells>,
}

impl Handle {
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    pub(crate) fn status(&self) -> WatchStatus {
        WatchStatus {
            connected: self.cells.connected.load(Ordering::Acquire),
            position: self.cells.position.load(Ordering::Acquire),
            reconnects: self.cells.opened.load(Ordering::Acquire).saturating_sub(1),
            relists: self.cells.relists.load(Ordering::Acquire),
        }
    }
}

pub(crate) fn spawn(
    raw: RawClient,
    tracks: Arc<Tracks>,
    retry: RetryPolicy,
    position: u64,
) -> Handle {
    let stop = CancellationToken::new();
    let cells = Arc::new(Cells::default());
    cells.position.store(position, Ordering::Release);
    let task = Task {
        raw,
        tracks,
        retry,
        position,
        cells: Arc::clone(&cells),
    };
    tokio::spawn(task.run(stop.clone()));
    Handle { stop, cells }
}

struct Task {
    raw: RawClient,
    tracks: Arc<Tracks>,
    retry: RetryPolicy,
    position: u64,
    cells: Arc<Cells>,
}

/// How one stream ended.
enum Ended {
    /// The position is no longer retained (or the coordinator restarted).
    OutOfRange,
    /// Anything else: broken transport, fell behind, server shutdown (OK).
    /// `progressed`: the stream delivered something before it ended.
    Broken {
        progressed: bool,
        status: Option<Status>,
    },
}

impl Task {
    async fn run(mut self, stop: CancellationToken) {
        let mut failures = 0u32;
        loop {
            let ended = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                ended = self.follow() => ended,
            };
            self.cells.connected.store(false, Ordering::Release);
            match ended {
                Ended::OutOfRange => {
                    let relisted = tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        relisted = self.relist() => relisted,
                    };
                    match relisted {
                        Ok(()) => {
                            failures = 0;
                            continue;
                        }
                        Err(status) => {
                            tracing::info!(code = ?status.code(), message = status.message(), "re-list failed");
                        }
                    }
                }
                Ended::Broken { progressed, status } => {
                    if progressed {
                        failures = 0;
                    }
                    if let Some(status) = status {
                        tracing::info!(code = ?status.code(), message = status.message(), position = self.position, "watch broke; resuming");
                    }
                }
            }
            failures = failures.saturating_add(1);
            let pause = self.retry.backoff(failures);
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Opens a watch-all from the position and applies it until it ends.
    async fn follow(&mut self) -> Ended {
        let request = pb::WatchRequest {
            session_id: String::new(),
            after_revision: None,
            after_seq: Some(self.position),
        };
        let mut stream = match self.raw.watch(Request::new(request)).await {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == Code::OutOfRange => return Ended::OutOfRange,
            Err(status) => {
                return Ended::Broken {
                    progressed: false,
                    status: Some(status),
                }
            }
        };
        self.cells.opened.fetch_add(1, Ordering::AcqRel);
        self.cells.connected.store(true, Ordering::Release);
        let mut progressed = false;
        loop {
            match stream.message().await {
                Ok(Some(message)) => {
                    progressed = true;
                    let high = self.tracks.apply(&message.events).max(message.progress_seq);
                    if high > self.position {
                        self.position = high;
                        self.cells.position.store(high, Ordering::Release);
                    }
                }
                Ok(None) => {
                    return Ended::Broken {
                        progressed,
                        status: None,
                    }
                }
                Err(status) if status.code() == Code::OutOfRange => return Ended::OutOfRange,
                Err(status) => {
                    return Ended::Broken {
                        progressed,
                        status: Some(status),
                    }
                }
            }
        }
    }

    /// Lists every session, raises the tracked ones from their states, and
    /// moves the position to the first page's seq.
    async fn relist(&mut self) -> Result<(), Status> {
        self.cells.relists.fetch_add(1, Ordering::AcqRel);
        let epoch = self.tracks.begin_relist();
        let mut seen = HashSet::new();
        let mut first_seq = None;
        let mut page_token = String::new();
        loop {
            let request = pb::ListSessionsRequest {
                page_size: 1000,
                page_token: page_token.clone(),
            };
            let raw = &self.raw;
            let (page, _) = super::retry::run(&self.retry, |timeout| {
                let mut request = Request::new(request.clone());
                request.set_timeout(timeout);
                let mut raw = raw.clone();
                async move {
                    raw.list_sessions(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
            first_seq.get_or_insert(page.seq);
            self.tracks
                .apply_listed(page.seq, &page.sessions, &mut seen);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let first_seq = first_seq.unwrap_or_default();
        self.tracks.apply_absent(epoch, first_seq, &seen);
        tracing::info!(position = first_seq, "re-listed after OUT_OF_RANGE");
        self.position = first_seq;
        self.cells.position.store(first_seq, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(session: &str, seq: u64, kind: Kind) -> pb::LifecycleEvent {
        pb::LifecycleEvent {
            session_id: session.into(),
            revision: 0,
            seq,
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

    fn cancel_requested(id: u64, reason: pb::CancelReason) -> Kind {
        Kind::CancelRequested(pb::ResponseCancelRequested {
            response_id: id,
            reason: reason.into(),
        })
    }

    #[test]
    fn supersede_stops_the_old_response_and_not_the_new_one() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let old = Liveness::new(10);
        tracks.register(&guard, &old);
        tracks.apply(&[
            event("s", 10, started(10)),
            event("s", 20, cancel_requested(10, pb::CancelReason::Superseded)),
            event("s", 22, started(20)),
        ]);
        assert_eq!(old.reason(), Some(StopReason::Superseded));
        // The new response registers after the watch saw its own start.
        let new = Liveness::new(20);
        tracks.register(&guard, &new);
        assert!(new.is_current());
        assert_eq!(tracks.dead_through("s"), Some(19));
    }

    #[test]
    fn a_response_registered_after_its_stop_was_seen_is_stopped_at_once() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        tracks.apply(&[event(
            "s",
            31,
            cancel_requested(30, pb::CancelReason::Requested),
        )]);
        let late = Liveness::new(30);
        tracks.register(&guard, &late);
        assert_eq!(late.reason(), Some(StopReason::Cancelled));
    }

    #[test]
    fn termination_is_fenced_at_its_seq_so_a_reborn_session_lives() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let a = Liveness::new(5);
        tracks.register(&guard, &a);
        tracks.apply(&[event(
            "s",
            8,
            Kind::Terminated(pb::SessionTerminated {
                reason: pb::CancelReason::Expired.into(),
            }),
        )]);
        assert_eq!(a.reason(), Some(StopReason::Expired));
        let reborn = Liveness::new(100);
        tracks.register(&guard, &reborn);
        assert!(reborn.is_current());
    }

    #[test]
    fn untracked_sessions_are_ignored_and_tracks_go_with_their_guards() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let second = guard.clone();
        tracks.apply(&[event("other", 3, started(3))]);
        assert_eq!(tracks.dead_through("other"), None);
        drop(guard);
        assert!(tracks.dead_through("s").is_some());
        drop(second);
        assert_eq!(tracks.dead_through("s"), None);
    }

    #[test]
    fn relisting_raises_from_states_and_absence() {
        let tracks = Arc::new(Tracks::default());
        let (a, b, c) = (tracks.track("a"), tracks.track("b"), tracks.track("c"));
        let (ra, rb, rc) = (Liveness::new(5), Liveness::new(6), Liveness::new(7));
        tracks.register(&a, &ra);
        tracks.register(&b, &rb);
        tracks.register(&c, &rc);
        let epoch = tracks.begin_relist();
        // Tracked during the listing: never judged absent by it.
        let d = tracks.track("d");
        let rd = Liveness::new(8);
        tracks.register(&d, &rd);
        let mut seen = HashSet::new();
        let active = |id: &str, response: u64| pb::SessionState {
            session_id: id.into(),
            phase: pb::Phase::Active.into(),
            active_response_id: response,
            ..Default::default()
        };
        tracks.apply_listed(50, &[active("a", 5), active("b", 40)], &mut seen);
        tracks.apply_absent(epoch, 50, &seen);
        assert!(ra.is_current(), "still the active response");
        assert_eq!(rb.reason(), Some(StopReason::Superseded));
        assert_eq!(rc.reason(), Some(StopReason::Gone), "absent: gone");
        assert!(rd.is_current());
    }
}
