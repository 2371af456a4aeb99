//! One session's record: the M3 phase plus what the coordinator keeps around
//! it (revision counter, retained events, request-id replay window, idle and
//! tombstone deadlines). Pure like the machine: time comes in as an argument,
//! nothing here locks, awaits or reads a clock. The memory registry owns one
//! of these per session under its shard's lock, which is what makes each
//! session a single-writer actor; the NATS backend rebuilds one from the
//! stored entry for each call and writes it back with compare-and-set.
//!
//! A session has one shape per layer that holds it, each with only what
//! that layer needs:
//! - [`Session`]: the record a call is decided on (phase, revision,
//!   retained events, replay window, last activity); the memory backend
//!   keeps it.
//! - [`Persisted`]: the record without its retained events, which a store
//!   keeps apart (NATS: the key's history); what `nats/entry.rs` writes.
//! - `StoredSession` (`nats/entry.rs`): `Persisted`'s bytes in the bucket,
//!   a protobuf message whose tags must not change.
//! - `Known` (`nats/mirror.rs`): what a NATS replica's mirror keeps of every
//!   session to list, count and expire them, and to confirm a read: no
//!   replay window, no events.
//! - [`SessionSnapshot`]: what a reply and GetState report.

use std::collections::VecDeque;

use history::{History, RetainedEvent};

/// The call a session takes is the machine's (`machine::Call`).
pub use crate::machine::Call;
use crate::{
    event::{Change, LifecycleEvent, SharedEvent},
    ids::{RequestId, ResponseId, SessionId},
    machine::{self, ActiveResponse, EventKind, Outcome, Phase, Source},
};

mod history;

/// A time in milliseconds on the clock of the backend that keeps the
/// session: on the memory backend its monotonic clock, counted from when it
/// started (`shared::Clock::now`); on NATS the stream's clock, in Unix
/// milliseconds (`nats::clock::UnixMillis`, taken in here at the decision).
/// The record only compares and adds them, so either works, but a session
/// never mixes the two. Tests supply their own.
pub type Millis = u64;

/// Request ids remembered per session for Start replay. The contract asks for
/// at least 16; older ones are forgotten first.
pub const REPLAY_WINDOW: usize = 16;

/// What a Start with a known request id answered the first time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StartRecord {
    pub response: ResponseId,
    pub superseded: Option<ResponseId>,
}

/// The observable state of a session, as GetState and every reply report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSnapshot {
    pub session_id: SessionId,
    pub phase: Phase,
    pub revision: u64,
    pub responses_started: u64,
    /// When the session last changed (the time of its event `revision`):
    /// filled in a listing only (`Session::listed`, the NATS mirror's
    /// `Known::listed`), `None` in GetState and every reply, so that the
    /// two always agree.
    pub changed_unix_nanos: Option<i64>,
}

/// What a transition stamps on its events and mints for a Start. A backend
/// makes it only for a change that `decision::decide` hands back ready to
/// apply, so one whose stamp costs something (the memory log's lock) pays it
/// only then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The seq of the transition's first event (0 where the store assigns
    /// seqs later: NATS).
    pub first_seq: u64,
    pub unix_nanos: i64,
    /// The id a Start that is accepted gives its response; it must exceed
    /// every id this session has used.
    pub new_response: ResponseId,
}

/// A session's durable fields, for a backend that stores sessions outside
/// the process (the NATS backend's key-value entry). Retained events and the
/// expiry-index bookkeeping are not part of it: that backend keeps events in
/// the bucket's per-key history instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persisted {
    pub phase: Phase,
    pub revision: u64,
    pub responses_started: u64,
    /// Oldest first, at most [`REPLAY_WINDOW`].
    pub replays: Vec<(RequestId, StartRecord)>,
    pub since: Millis,
}

/// The two TTLs, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttls {
    pub idle: Millis,
    pub tombstone: Millis,
}

impl Ttls {
    /// The deadline of a session in `phase` whose `since` is the time of
    /// its last call (live) or of its termination (a tombstone): the one
    /// rule of both backends' expiry, which acts strictly after it.
    pub fn deadline(self, phase: Phase, since: Millis) -> Millis {
        match phase {
            Phase::Terminated => since.saturating_add(self.tombstone),
            Phase::Idle | Phase::Active(_) => since.saturating_add(self.idle),
        }
    }
}

/// Clone, Eq and Hash let model checkers hold sessions as state.
///
/// A million idle sessions are a million of these in the registry's tables,
/// so the record is laid out to fit 64 bytes: the phase is kept as its kind
/// and the live response's id side by side (a `Phase` field would be 16
/// bytes with padding that no other field can use), and the expiry entry is
/// remembered by the low half of its due time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Session {
    phase: PhaseKind,
    /// The live response's id while `phase` is active; `ResponseId::MIN`
    /// otherwise, so equal sessions compare equal.
    active_response: ResponseId,
    revision: u64,
    responses_started: u64,
    /// The last events; the newest has revision `revision`.
    history: History,
    /// Boxed and created on first use: most sessions never send a request id,
    /// and this keeps them a pointer smaller.
    #[allow(clippy::box_collection)]
    replays: Option<Box<VecDeque<(RequestId, StartRecord)>>>,
    /// While live, the time of the last call (idle expiry counts from it);
    /// once terminated, the time of termination (the tombstone TTL counts
    /// from it). One field because a session never needs both.
    since: Millis,
    /// The low 32 bits of the due time of this session's live entry in the
    /// registry's expiry index; entries with another time are stale and
    /// skipped. Two of one session's entries 2^32 ms (49.7 days) apart would
    /// both be taken for live, which costs only a refile: the expiry decision
    /// checks the deadline itself.
    expiry_entry: u32,
}

/// [`Phase`] without the live response's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PhaseKind {
    Idle,
    Active(Source),
    Terminated,
}

impl Session {
    pub fn new(now: Millis) -> Self {
        Self::with_phase(Phase::Idle, 0, 0, None, now)
    }

    #[allow(clippy::box_collection)] // as the `replays` field
    fn with_phase(
        phase: Phase,
        revision: u64,
        responses_started: u64,
        replays: Option<Box<VecDeque<(RequestId, StartRecord)>>>,
        since: Millis,
    ) -> Self {
        let mut session = Self {
            phase: PhaseKind::Idle,
            active_response: ResponseId::MIN,
            revision,
            responses_started,
            history: History::default(),
            replays,
            since,
            expiry_entry: 0,
        };
        session.set_phase(phase);
        session
    }

    pub fn phase(&self) -> Phase {
        match self.phase {
            PhaseKind::Idle => Phase::Idle,
            PhaseKind::Active(source) => Phase::Active(ActiveResponse {
                id: self.active_response,
                source,
            }),
            PhaseKind::Terminated => Phase::Terminated,
        }
    }

    fn set_phase(&mut self, phase: Phase) {
        (self.phase, self.active_response) = match phase {
            Phase::Idle => (PhaseKind::Idle, ResponseId::MIN),
            Phase::Active(ActiveResponse { id, source }) => (PhaseKind::Active(source), id),
            Phase::Terminated => (PhaseKind::Terminated, ResponseId::MIN),
        };
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn snapshot(&self, session_id: &SessionId) -> SessionSnapshot {
        SessionSnapshot {
            session_id: session_id.clone(),
            phase: self.phase(),
            revision: self.revision,
            responses_started: self.responses_started,
            changed_unix_nanos: None,
        }
    }

    /// [`Session::snapshot`] with the time of the last change, for a
    /// listing of a backend that keeps the session's events here (memory):
    /// the newest retained event's. `None` when none is retained.
    pub fn listed(&self, session_id: &SessionId) -> SessionSnapshot {
        SessionSnapshot {
            changed_unix_nanos: self
                .history
                .newest(self.revision)
                .map(|event| event.unix_nanos),
            ..self.snapshot(session_id)
        }
    }

    /// When the live response started: its `started` event is the newest
    /// one while it is live (any later transition ends it). `None` when
    /// idle, or when that event is not retained.
    pub fn live_since(&self) -> Option<i64> {
        let active = self.phase().active()?;
        let newest = self.history.newest(self.revision)?;
        matches!(newest.kind, EventKind::Started { response, .. } if response == active.id)
            .then_some(newest.unix_nanos)
    }

    /// For a session rebuilt from a store that keeps its events itself
    /// (NATS): the time of the stored record's last change, which is when
    /// the live response started, so [`Session::live_since`] can say it.
    pub fn remember_live_since(&mut self, last_change_unix_nanos: i64) {
        if let Some(active) = self.phase().active() {
            let started = RetainedEvent {
                seq: 0,
                unix_nanos: last_change_unix_nanos,
                kind: EventKind::Started {
                    response: active.id,
                    source: active.source,
                },
            };
            self.history.push(self.revision, started, 1);
        }
    }

    /// Whether a call at `now` that changes nothing is still due to write
    /// a touch, for a store that writes such calls only now and then (NATS,
    /// every `interval`): see [`touch_due`].
    pub fn touch_due(&self, now: Millis, interval: Millis) -> bool {
        touch_due(self.since, now, interval)
    }

    /// Any call naming the session keeps it alive.
    pub fn touch(&mut self, now: Millis) {
        if self.phase != PhaseKind::Terminated {
            self.since = self.since.max(now);
        }
    }

    /// The original answer to a Start carrying `request_id`, if this session
    /// applied one.
    pub fn replayed(&self, request_id: &RequestId) -> Option<StartRecord> {
        self.replays
            .as_deref()?
            .iter()
            .find(|(seen, _)| seen == request_id)
            .map(|(_, record)| *record)
    }

    /// The machine's outcome of `call` if it leaves the session as it was
    /// (emits no event), else `None`. Told without the id a Start would
    /// mint: the machine consumes it only when it accepts the start, which
    /// always emits `started`, so a placeholder stands in for it here.
    pub(crate) fn unchanged_by(&self, call: &Call) -> Option<Outcome> {
        let transition = machine::transition(self.phase(), call, ResponseId::MIN);
        transition.events.is_empty().then_some(transition.outcome)
    }

    /// Runs one call through the machine and records its effects: the
    /// transition's outcome and the events it emitted (stamped with
    /// `stamp.unix_nanos`; retained here, up to `history_limit`, with seqs
    /// from `stamp.first_seq`). Used by `decision`, which decides everything
    /// around it (presence, limit, replay, no change).
    pub(crate) fn apply(
        &mut self,
        call: &Call,
        stamp: Stamp,
        history_limit: usize,
        now: Millis,
    ) -> (Outcome, Change) {
        let Stamp {
            first_seq,
            unix_nanos,
            new_response,
        } = stamp;
        let transition = machine::transition(self.phase(), call, new_response);
        let change = Change {
            first_revision: self.revision + 1,
            unix_nanos,
            kinds: transition.events,
        };
        for (offset, kind) in (0u64..).zip(&change.kinds) {
            if let EventKind::Started { .. } = kind {
                self.responses_started += 1;
            }
            self.revision += 1;
            let retained = RetainedEvent {
                seq: first_seq + offset,
                unix_nanos,
                kind: *kind,
            };
            self.history.push(self.revision, retained, history_limit);
        }
        if transition.next == Phase::Terminated && self.phase != PhaseKind::Terminated {
            self.since = now;
        }
        self.set_phase(transition.next);
        if let (
            Call::Start {
                request_id: Some(request_id),
                ..
            },
            Outcome::Started {
                response,
                superseded,
            },
        ) = (call, transition.outcome)
        {
            let replays = self.replays.get_or_insert_with(Default::default);
            if replays.len() >= REPLAY_WINDOW {
                replays.pop_front();
            }
            replays.push_back((
                request_id.clone(),
                StartRecord {
                    response,
                    superseded,
                },
            ));
        }
        (transition.outcome, change)
    }

    /// Revision of the oldest retained event.
    fn oldest_retained_revision(&self) -> u64 {
        self.revision + 1 - self.history.len() as u64
    }

    /// Retained events with revision above `after`, or `Err(oldest)` (the
    /// oldest retained revision minus one: the earliest resume point) when
    /// some of them are no longer retained.
    pub fn history_after(
        &self,
        session_id: &SessionId,
        after: u64,
    ) -> Result<VecDeque<SharedEvent>, u64> {
        if after >= self.revision {
            return Ok(VecDeque::new());
        }
        let oldest_kept = self.oldest_retained_revision();
        if after + 1 < oldest_kept {
            return Err(oldest_kept - 1);
        }
        let skip = usize::try_from(after + 1 - oldest_kept).unwrap_or(usize::MAX);
        Ok((oldest_kept..)
            .zip(self.history.oldest_first(self.revision))
            .skip(skip)
            .map(|(revision, event)| {
                LifecycleEvent::shared(
                    session_id,
                    revision,
                    event.seq,
                    event.unix_nanos,
                    event.kind,
                )
            })
            .collect())
    }

    /// The durable fields (see [`Persisted`]).
    pub fn persisted(&self) -> Persisted {
        Persisted {
            phase: self.phase(),
            revision: self.revision,
            responses_started: self.responses_started,
            replays: self
                .replays
                .as_deref()
                .map(|r| r.iter().cloned().collect())
                .unwrap_or_default(),
            since: self.since,
        }
    }

    /// A session from its durable fields, with no retained events. Replays
    /// beyond the window keep the newest.
    pub fn from_persisted(persisted: Persisted) -> Self {
        let Persisted {
            phase,
            revision,
            responses_started,
            mut replays,
            since,
        } = persisted;
        let excess = replays.len().saturating_sub(REPLAY_WINDOW);
        replays.drain(..excess);
        let replays = (!replays.is_empty()).then(|| Box::new(replays.into()));
        Self::with_phase(phase, revision, responses_started, replays, since)
    }

    /// Whether `due` is (as far as its low half tells) the due time of this
    /// session's live expiry entry.
    pub fn is_expiry_entry(&self, due: Millis) -> bool {
        self.expiry_entry == expiry_marker(due)
    }

    pub fn set_expiry_entry(&mut self, due: Millis) {
        self.expiry_entry = expiry_marker(due);
    }

    /// The deadline this session's expiry entry should be filed under.
    pub fn next_deadline(&self, ttls: Ttls) -> Millis {
        ttls.deadline(self.phase(), self.since)
    }

    /// Whether the session is a tombstone.
    pub fn is_terminated(&self) -> bool {
        self.phase == PhaseKind::Terminated
    }
}

/// The touch rule of a store that does not write every call's activity
/// (NATS): a call that changes nothing writes a touch once the stored last
/// activity `since` is `interval` or more before `now`, so idle expiry,
/// which allows `interval` on top of the idle TTL, never comes early. For
/// a record of another shape that holds `since` (the NATS mirror's);
/// [`Session::touch_due`] for a session.
pub fn touch_due(since: Millis, now: Millis, interval: Millis) -> bool {
    now.saturating_sub(since) >= interval
}

/// The low 32 bits of an expiry due time (see `Session::expiry_entry`).
fn expiry_marker(due: Millis) -> u32 {
    (due & u64::from(u32::MAX)) as u32
}

// The layout the doc comment on `Session` promises; a field added without
// thought fails the build here rather than quietly costing a million slots.
const _: () = assert!(std::mem::size_of::<Session>() <= 64);
const _: () = assert!(std::mem::size_of::<SessionId>() == 8);
