//! The fencing table: per tracked session, which of this client's responses
//! are known to be no longer live. Pure: the session watches (`watch.rs`)
//! feed it events and re-read states, and carry out the one effect it asks
//! for, opening or closing a session's watch.
//!
//! # The table
//! Per tracked session the client keeps `dead_through`: every response id of
//! the session up to it is known to be no longer live. Each event and each
//! re-read state only ever *raises* it, or stops registered responses, with
//! a fact that is true whenever it is applied:
//!
//! | seen | effect | because |
//! |---|---|---|
//! | `started(y)` | raise to `y - 1` | at most one live response, ids increase |
//! | `cancel_requested(x)`, `ended(x)` | raise to `x` | `x` is done |
//! | `terminated` | stop every registered response | nothing of this session lives after teardown, and none starts |
//! | state Active(z) | raise to `z - 1` | as `started(z)` |
//! | state Idle or Terminated | stop every response the read judged: registered before it was sent, or whose Start reply's revision it reached | the read saw their Starts, and none of them is live |
//! | NOT_FOUND, or a lower revision than the watch had reached | stop every response registered before the read was sent, as gone | the session they belong to no longer exists |
//!
//! Because every update is a `max` of true facts or stops responses the
//! read already covered, replaying events, or applying a state read while
//! events arrive, is harmless: that is what makes resume simple. The last
//! read applied is kept while its watch lives, so a Start whose reply
//! arrives after the read (and that the read reached) is judged by it too.
//!
//! # Which sessions are watched
//! A session's events reach this client while it has a live response
//! there, and for a linger after the last one ends: [`Tracks::register`]
//! asks for the session's watch when the first one registers (from the
//! Start reply's revision, so a stop that lands between the reply and the
//! watch is replayed), and every later Start finds it open. When the last
//! response stops, the table hands the shell an [`Idle`] notice; the shell
//! waits out the linger and hands it back ([`Tracks::linger_over`]), and
//! the watch closes unless the session was used again. [`Tracks::open_ahead`]
//! opens it before the first Start (from a state read). The table never
//! reads a clock.
//!
//! # No missed stop
//! A response registers right after its Start reply. Its session's watch
//! either replays from the reply's revision, or was already open: then it
//! delivers every event after its position with no gap, and what lies at
//! or below its position was applied or judged by a read. A response
//! registered after its stop was already applied finds `id <= dead_through`
//! (or a read that reached its Start) and is stopped at once.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
    },
};

use tokio_util::sync::CancellationToken;

use super::StopReason;
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

/// A live response of this client, with when it registered.
#[derive(Debug)]
struct Registered {
    liveness: Arc<Liveness>,
    /// The client-wide registration ticket ([`Tracks::ticket`]).
    ticket: u64,
    /// The revision its Start reply carried: a state read at or past it
    /// judged the response.
    revision: u64,
}

/// The last state read applied while the current watch lives: a true fact
/// about the session at `revision`, for responses whose Start replies
/// arrive after the read was applied.
#[derive(Clone, Copy, Debug)]
struct ReadFact {
    revision: u64,
    /// The one response live at `revision`, if any.
    live: Option<u64>,
    /// Why any other response started at or before `revision` is not live.
    reason: StopReason,
}

#[derive(Debug)]
struct Track {
    session: Arc<str>,
    /// Session handles and response handles holding this track.
    refs: usize,
    dead_through: u64,
    /// Why `dead_through` last rose (for responses registered late).
    reason: StopReason,
    /// Live responses of this client in this session (usually one).
    responses: Vec<Registered>,
    /// The session's watch: open while `responses` is not empty, opened
    /// ahead, or lingering after the last response.
    watch: Option<CancellationToken>,
    /// Bumped by every registration and every open-ahead: a linger that
    /// began before either is stale.
    generation: u64,
    read: Option<ReadFact>,
}

impl Track {
    /// Whether the track became idle.
    fn raise(&mut self, through: u64, reason: StopReason) -> bool {
        if through > self.dead_through {
            self.dead_through = through;
            self.reason = reason;
        }
        self.stop_where(reason, |r| r.liveness.id <= through)
    }

    /// Stops the registered responses `which` selects, raising
    /// `dead_through` over them. Whether the track became idle.
    fn stop_where(&mut self, reason: StopReason, which: impl Fn(&Registered) -> bool) -> bool {
        let before = self.responses.len();
        let mut highest = None;
        self.responses.retain(|registered| {
            if which(registered) {
                registered.liveness.stop(reason);
                highest = highest.max(Some(registered.liveness.id));
                false
            } else {
                true
            }
        });
        if let Some(highest) = highest.filter(|&id| id > self.dead_through) {
            self.dead_through = highest;
            self.reason = reason;
        }
        before > 0 && self.responses.is_empty()
    }

    /// The session emits nothing more on this watch (terminated): it ends,
    /// and the next Start opens a new one with its proof.
    fn end_watch(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.cancel();
        }
        self.read = None;
    }
}

/// A session whose last response ended while its watch is open: the shell
/// waits out the linger, then hands it back ([`Tracks::linger_over`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Idle {
    pub(crate) session: Arc<str>,
    generation: u64,
}

/// What the caller of [`Tracks::register`] or [`Tracks::open_ahead`] must
/// do: open the session's watch, stopped by `stop`.
#[derive(Debug)]
pub(crate) struct WatchOrder {
    pub(crate) session: Arc<str>,
    /// Watch with `after_revision` = this; `None`: read the session's state
    /// first and watch from its revision (a watch opened ahead).
    pub(crate) after_revision: Option<u64>,
    /// The response whose `started` event must come first (at
    /// `after_revision + 1`): proof that the watch follows the session the
    /// Start was applied to, not one recreated since.
    pub(crate) expect_started: Option<u64>,
    pub(crate) stop: CancellationToken,
}

/// What the shell must carry out after a change to the table.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    pub(crate) open: Option<WatchOrder>,
    pub(crate) idle: Option<Idle>,
}

/// The sessions this client tracks, shared by the handles and the watches.
#[derive(Debug, Default)]
pub(crate) struct Tracks {
    map: Mutex<HashMap<Arc<str>, Track>>,
    tickets: AtomicU64,
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
                session: Arc::clone(&session),
                refs: 0,
                dead_through: 0,
                reason: StopReason::Gone,
                responses: Vec::new(),
                watch: None,
                generation: 0,
                read: None,
            })
            .refs += 1;
        TrackGuard {
            tracks: Arc::clone(self),
            session,
        }
    }

    /// Adds a started response whose Start reply carried `revision`;
    /// stops it at once if a watch or a read already saw its end. Returns
    /// the watch to open when the session has none. `fresh`: the reply was
    /// not a replay, so the response's `started` event is at `revision`.
    pub(crate) fn register(
        &self,
        guard: &TrackGuard,
        response: &Arc<Liveness>,
        revision: u64,
        fresh: bool,
    ) -> Option<WatchOrder> {
        let mut map = self.lock();
        let track = map.get_mut(&guard.session)?;
        if response.id <= track.dead_through {
            response.stop(track.reason);
            return None;
        }
        if let Some(read) = track.read.filter(|read| revision <= read.revision) {
            if read.live != Some(response.id) {
                response.stop(read.reason);
                return None;
            }
        }
        if !response.is_current() {
            return None;
        }
        track.generation += 1;
        track.responses.push(Registered {
            liveness: Arc::clone(response),
            ticket: self.tickets.fetch_add(1, Ordering::AcqRel) + 1,
            revision,
        });
        if track.watch.is_some() {
            return None;
        }
        let stop = CancellationToken::new();
        track.watch = Some(stop.clone());
        Some(WatchOrder {
            session: Arc::clone(&guard.session),
            after_revision: Some(if fresh {
                revision.saturating_sub(1)
            } else {
                revision
            }),
            expect_started: fresh.then_some(response.id),
            stop,
        })
    }

    /// The gateway serves this session: its watch opens now (from a state
    /// read) if it is not open, and lingers from now if no response is live.
    pub(crate) fn open_ahead(&self, guard: &TrackGuard) -> Effects {
        let mut map = self.lock();
        let Some(track) = map.get_mut(&guard.session) else {
            return Effects::default();
        };
        track.generation += 1;
        let idle = track.responses.is_empty().then(|| Idle {
            session: Arc::clone(&guard.session),
            generation: track.generation,
        });
        let open = track.watch.is_none().then(|| {
            let stop = CancellationToken::new();
            track.watch = Some(stop.clone());
            WatchOrder {
                session: Arc::clone(&guard.session),
                after_revision: None,
                expect_started: None,
                stop,
            }
        });
        Effects { open, idle }
    }

    pub(crate) fn unregister(&self, guard: &TrackGuard, response: &Arc<Liveness>) -> Option<Idle> {
        let mut map = self.lock();
        let track = map.get_mut(&guard.session)?;
        let before = track.responses.len();
        track
            .responses
            .retain(|r| !Arc::ptr_eq(&r.liveness, response));
        let emptied = before > 0 && track.responses.is_empty();
        idle_notice(track, emptied)
    }

    /// The linger that `idle` began is over: the watch closes unless a
    /// response registered or the watch was opened ahead since; the track
    /// goes when no handle holds it.
    pub(crate) fn linger_over(&self, idle: &Idle) {
        let mut map = self.lock();
        let Some(track) = map.get_mut(&idle.session) else {
            return;
        };
        if track.generation != idle.generation || !track.responses.is_empty() {
            return;
        }
        track.end_watch();
        forget_if_unheld(&mut map, &idle.session);
    }

    /// Every response registered so far has a ticket at or below this: take
    /// it before sending a read, and the read's answer covers them.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.load(Ordering::Acquire)
    }

    /// Applies one WatchResponse's events.
    pub(crate) fn apply(&self, events: &[pb::LifecycleEvent]) -> Vec<Idle> {
        let mut map = self.lock();
        let mut idle = Vec::new();
        let mut ended = Vec::new();
        for event in events {
            let Some(track) = map.get_mut(event.session_id.as_str()) else {
                continue;
            };
            let emptied = match &event.kind {
                Some(Kind::Started(s)) => {
                    track.raise(s.response_id.saturating_sub(1), StopReason::Superseded)
                }
                Some(Kind::CancelRequested(c)) => {
                    track.raise(c.response_id, StopReason::from(c.reason()))
                }
                Some(Kind::Ended(e)) => {
                    let reason = if e.status() == pb::TerminalStatus::Cancelled {
                        StopReason::from(e.reason())
                    } else {
                        StopReason::Ended
                    };
                    track.raise(e.response_id, reason)
                }
                Some(Kind::Terminated(t)) => {
                    track.stop_where(StopReason::from(t.reason()), |_| true);
                    track.end_watch();
                    ended.push(Arc::clone(&track.session));
                    false
                }
                None => false,
            };
            idle.extend(idle_notice(track, emptied));
        }
        for session in ended {
            forget_if_unheld(&mut map, &session);
        }
        idle
    }

    /// Applies a state read (GetState) sent when [`Tracks::ticket`] was
    /// `ticket`. It judged every response registered before it was sent,
    /// and every one whose Start reply's revision it reached.
    pub(crate) fn apply_state(&self, state: &pb::SessionState, ticket: u64) -> Option<Idle> {
        let mut map = self.lock();
        let track = map.get_mut(state.session_id.as_str())?;
        let read = |r: &Registered| r.ticket <= ticket || r.revision <= state.revision;
        let fact = match state.phase() {
            pb::Phase::Active => ReadFact {
                revision: state.revision,
                live: Some(state.active_response_id),
                reason: StopReason::Superseded,
            },
            pb::Phase::Terminated => ReadFact {
                revision: state.revision,
                live: None,
                reason: StopReason::Shutdown,
            },
            pb::Phase::Idle | pb::Phase::Unspecified => ReadFact {
                revision: state.revision,
                live: None,
                reason: StopReason::Gone,
            },
        };
        let emptied = match fact.live {
            Some(active) => {
                let superseded = track.raise(active.saturating_sub(1), fact.reason);
                track.stop_where(StopReason::Gone, |r| read(r) && r.liveness.id != active)
                    || superseded
            }
            None => track.stop_where(fact.reason, read),
        };
        if state.phase() == pb::Phase::Terminated {
            // Nothing more will happen on this session: what is still
            // registered belongs to no live session either.
            track.stop_where(StopReason::Shutdown, |_| true);
            track.end_watch();
            forget_if_unheld(&mut map, &state.session_id);
            return None;
        }
        track.read = Some(fact);
        idle_notice(track, emptied)
    }

    /// The session was not found (or was recreated) by a read sent at
    /// `ticket`: the responses it covered belonged to a session that is
    /// gone. Revisions of a gone session judge nothing.
    pub(crate) fn apply_gone(&self, session: &str, ticket: u64) -> Option<Idle> {
        let mut map = self.lock();
        let track = map.get_mut(session)?;
        let emptied = track.stop_where(StopReason::Gone, |r| r.ticket <= ticket);
        track.read = None;
        idle_notice(track, emptied)
    }

    #[cfg(test)]
    fn dead_through(&self, session: &str) -> Option<u64> {
        self.lock().get(session).map(|t| t.dead_through)
    }

    #[cfg(test)]
    fn watched(&self, session: &str) -> bool {
        self.lock().get(session).is_some_and(|t| t.watch.is_some())
    }
}

/// The notice for a track that just lost its last live response while its
/// watch is open.
fn idle_notice(track: &Track, emptied: bool) -> Option<Idle> {
    (emptied && track.watch.is_some()).then(|| Idle {
        session: Arc::clone(&track.session),
        generation: track.generation,
    })
}

/// Drops a track that no handle holds and no watch keeps.
fn forget_if_unheld(map: &mut HashMap<Arc<str>, Track>, session: &str) {
    if map
        .get(session)
        .is_some_and(|track| track.refs == 0 && track.watch.is_none())
    {
        map.remove(session);
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
        }
        // A lingering watch keeps the track (and what it knows) until the
        // linger is over.
        forget_if_unheld(&mut map, &self.session);
    }
}

#[cfg(test)]
mod tests;
