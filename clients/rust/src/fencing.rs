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
//! | state Idle or Terminated | stop every response registered before the read was sent | the read saw their Starts, and none of them is live |
//! | NOT_FOUND, or a lower revision than the watch had reached | stop every response registered before the read was sent, as gone | the session they belong to no longer exists |
//!
//! Because every update is a `max` of true facts or stops responses the
//! read already covered, replaying events, or applying a state read while
//! events arrive, is harmless: that is what makes resume simple.
//!
//! # Which sessions are watched
//! A session's events reach this client only while it has a live response
//! there: [`Tracks::register`] asks for the session's watch when the first
//! one registers (from the Start reply's revision, so a stop that lands
//! between the reply and the watch is replayed), and the watch is closed
//! when the last one stops or is released.
//!
//! # No missed stop
//! A response registers right after its Start reply, and its session's
//! watch replays from the reply's revision, so every event after the Start
//! passes through [`Tracks::apply`]. A response registered after its stop
//! was already applied finds `id <= dead_through` and is stopped at once.

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
}

#[derive(Debug)]
struct Track {
    /// Session handles and response handles holding this track.
    refs: usize,
    dead_through: u64,
    /// Why `dead_through` last rose (for responses registered late).
    reason: StopReason,
    /// Live responses of this client in this session (usually one).
    responses: Vec<Registered>,
    /// The session's watch, open while `responses` is not empty.
    watch: Option<CancellationToken>,
}

impl Track {
    fn raise(&mut self, through: u64, reason: StopReason) {
        if through > self.dead_through {
            self.dead_through = through;
            self.reason = reason;
        }
        self.stop_where(reason, |r| r.liveness.id <= through);
    }

    /// Stops the registered responses `which` selects, raising
    /// `dead_through` over them.
    fn stop_where(&mut self, reason: StopReason, which: impl Fn(&Registered) -> bool) {
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
        self.close_watch_when_idle();
    }

    fn close_watch_when_idle(&mut self) {
        if self.responses.is_empty() {
            if let Some(watch) = self.watch.take() {
                watch.cancel();
            }
        }
    }
}

/// What the caller of [`Tracks::register`] must do: open the session's
/// watch, stopped by `stop`.
#[derive(Debug)]
pub(crate) struct WatchOrder {
    pub(crate) session: Arc<str>,
    /// Watch with `after_revision` = this.
    pub(crate) after_revision: u64,
    /// The response whose `started` event must come first (at
    /// `after_revision + 1`): proof that the watch follows the session the
    /// Start was applied to, not one recreated since.
    pub(crate) expect_started: Option<u64>,
    pub(crate) stop: CancellationToken,
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
                refs: 0,
                dead_through: 0,
                reason: StopReason::Gone,
                responses: Vec::new(),
                watch: None,
            })
            .refs += 1;
        TrackGuard {
            tracks: Arc::clone(self),
            session,
        }
    }

    /// Adds a started response whose Start reply carried `revision`;
    /// stops it at once if a watch already saw its end. Returns the watch
    /// to open when the session has none. `fresh`: the reply was not a
    /// replay, so the response's `started` event is at `revision`.
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
        if !response.is_current() {
            return None;
        }
        track.responses.push(Registered {
            liveness: Arc::clone(response),
            ticket: self.tickets.fetch_add(1, Ordering::AcqRel) + 1,
        });
        if track.watch.is_some() {
            return None;
        }
        let stop = CancellationToken::new();
        track.watch = Some(stop.clone());
        Some(WatchOrder {
            session: Arc::clone(&guard.session),
            after_revision: if fresh {
                revision.saturating_sub(1)
            } else {
                revision
            },
            expect_started: fresh.then_some(response.id),
            stop,
        })
    }

    pub(crate) fn unregister(&self, guard: &TrackGuard, response: &Arc<Liveness>) {
        if let Some(track) = self.lock().get_mut(&guard.session) {
            track
                .responses
                .retain(|r| !Arc::ptr_eq(&r.liveness, response));
            track.close_watch_when_idle();
        }
    }

    /// Every response registered so far has a ticket at or below this: take
    /// it before sending a read, and the read's answer covers them.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.load(Ordering::Acquire)
    }

    /// Applies one WatchResponse's events.
    pub(crate) fn apply(&self, events: &[pb::LifecycleEvent]) {
        let mut map = self.lock();
        for event in events {
            let Some(track) = map.get_mut(event.session_id.as_str()) else {
                continue;
            };
            match &event.kind {
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
                    track.stop_where(StopReason::from(t.reason()), |_| true)
                }
                None => {}
            }
        }
    }

    /// Applies a state read (GetState) sent when [`Tracks::ticket`] was
    /// `ticket`.
    pub(crate) fn apply_state(&self, state: &pb::SessionState, ticket: u64) {
        let mut map = self.lock();
        let Some(track) = map.get_mut(state.session_id.as_str()) else {
            return;
        };
        let read = |r: &Registered| r.ticket <= ticket;
        match state.phase() {
            pb::Phase::Active => {
                let active = state.active_response_id;
                track.raise(active.saturating_sub(1), StopReason::Superseded);
                track.stop_where(StopReason::Gone, |r| read(r) && r.liveness.id != active);
            }
            pb::Phase::Terminated => track.stop_where(StopReason::Shutdown, read),
            pb::Phase::Idle | pb::Phase::Unspecified => track.stop_where(StopReason::Gone, read),
        }
    }

    /// The session was not found (or was recreated) by a read sent at
    /// `ticket`: the responses it covered belonged to a session that is gone.
    pub(crate) fn apply_gone(&self, session: &str, ticket: u64) {
        if let Some(track) = self.lock().get_mut(session) {
            track.stop_where(StopReason::Gone, |r| r.ticket <= ticket);
        }
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
                if let Some(watch) = track.watch.take() {
                    watch.cancel();
                }
                map.remove(&self.session);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(session: &str, revision: u64, kind: Kind) -> pb::LifecycleEvent {
        pb::LifecycleEvent {
            session_id: session.into(),
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

    fn cancel_requested(id: u64, reason: pb::CancelReason) -> Kind {
        Kind::CancelRequested(pb::ResponseCancelRequested {
            response_id: id,
            reason: reason.into(),
            source: pb::Source::Unspecified.into(),
        })
    }

    fn state(session: &str, phase: pb::Phase, active: u64, revision: u64) -> pb::SessionState {
        pb::SessionState {
            session_id: session.into(),
            phase: phase.into(),
            active_response_id: active,
            revision,
            ..Default::default()
        }
    }

    #[test]
    fn the_first_response_opens_the_watch_from_its_start_and_the_last_closes_it() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        assert!(
            !tracks.watched("s"),
            "a session handle alone watches nothing"
        );
        let first = Liveness::new(10);
        let order = tracks.register(&guard, &first, 7, true).expect("a watch");
        assert_eq!(
            (&*order.session, order.after_revision, order.expect_started),
            ("s", 6, Some(10)),
            "replays the response's own start"
        );
        let second = Liveness::new(11);
        assert!(
            tracks.register(&guard, &second, 9, true).is_none(),
            "one watch a session"
        );
        tracks.unregister(&guard, &first);
        assert!(!order.stop.is_cancelled());
        tracks.apply(&[event("s", 10, started(12))]);
        assert_eq!(second.reason(), Some(StopReason::Superseded));
        assert!(
            order.stop.is_cancelled(),
            "no live response left: the watch closes"
        );
        let replayed = Liveness::new(20);
        let order = tracks
            .register(&guard, &replayed, 30, false)
            .expect("a new watch");
        assert_eq!((order.after_revision, order.expect_started), (30, None));
        drop(guard);
        assert!(
            order.stop.is_cancelled(),
            "the track went with its last guard"
        );
    }

    #[test]
    fn supersede_stops_the_old_response_and_not_the_new_one() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let old = Liveness::new(10);
        tracks.register(&guard, &old, 1, true);
        tracks.apply(&[
            event("s", 1, started(10)),
            event("s", 2, cancel_requested(10, pb::CancelReason::Superseded)),
            event("s", 4, started(20)),
        ]);
        assert_eq!(old.reason(), Some(StopReason::Superseded));
        // The new response registers after the watch saw its own start.
        let new = Liveness::new(20);
        tracks.register(&guard, &new, 4, true);
        assert!(new.is_current());
        assert_eq!(tracks.dead_through("s"), Some(19));
    }

    #[test]
    fn a_response_registered_after_its_stop_was_seen_is_stopped_at_once() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let other = Liveness::new(1);
        tracks.register(&guard, &other, 1, true);
        tracks.apply(&[event(
            "s",
            3,
            cancel_requested(30, pb::CancelReason::Requested),
        )]);
        let late = Liveness::new(30);
        assert!(tracks.register(&guard, &late, 2, true).is_none());
        assert_eq!(late.reason(), Some(StopReason::Cancelled));
    }

    #[test]
    fn termination_stops_every_response_and_a_reborn_session_lives() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let a = Liveness::new(5);
        tracks.register(&guard, &a, 1, true);
        tracks.apply(&[event(
            "s",
            2,
            Kind::Terminated(pb::SessionTerminated {
                reason: pb::CancelReason::Expired.into(),
            }),
        )]);
        assert_eq!(a.reason(), Some(StopReason::Expired));
        let reborn = Liveness::new(100);
        tracks.register(&guard, &reborn, 1, true);
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
    fn a_state_read_stops_what_it_covered_and_spares_later_starts() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let (old, active) = (Liveness::new(5), Liveness::new(6));
        tracks.register(&guard, &old, 1, true);
        tracks.register(&guard, &active, 3, true);
        let ticket = tracks.ticket();
        // Registered while the read was on its way: the read cannot judge it.
        let later = Liveness::new(9);
        tracks.register(&guard, &later, 9, true);
        tracks.apply_state(&state("s", pb::Phase::Active, 6, 4), ticket);
        assert_eq!(old.reason(), Some(StopReason::Superseded));
        assert!(active.is_current(), "the active response lives on");
        assert!(later.is_current());
        tracks.apply_state(&state("s", pb::Phase::Idle, 0, 8), ticket);
        assert_eq!(active.reason(), Some(StopReason::Gone));
        assert!(later.is_current(), "started after the read was sent");
    }

    #[test]
    fn a_session_gone_or_recreated_stops_the_responses_the_read_covered() {
        let tracks = Arc::new(Tracks::default());
        let guard = tracks.track("s");
        let lost = Liveness::new(5);
        let order = tracks.register(&guard, &lost, 3, true).expect("a watch");
        let ticket = tracks.ticket();
        tracks.apply_gone("s", ticket);
        assert_eq!(lost.reason(), Some(StopReason::Gone));
        assert!(order.stop.is_cancelled());
        let terminated = Liveness::new(7);
        tracks.register(&guard, &terminated, 1, true);
        tracks.apply_state(&state("s", pb::Phase::Terminated, 0, 2), tracks.ticket());
        assert_eq!(terminated.reason(), Some(StopReason::Shutdown));
    }
}
