//! One session's record: the M3 phase plus what the coordinator keeps around
//! it (revision counter, retained events, request-id replay window, idle and
//! tombstone deadlines). Pure like the machine: time comes in as an argument,
//! nothing here locks, awaits or reads a clock. The registry owns one of these
//! per session under its shard's lock, which is what makes each session a
//! single-writer actor.

use std::{collections::VecDeque, sync::Arc};

use arrayvec::ArrayVec;

use crate::{
    events::{LifecycleEvent, SharedEvent},
    ids::{RequestId, ResponseId, SessionId},
    machine::{
        self, EventKind, FinishStatus, Input, Outcome, Phase, Source, TeardownReason,
        MAX_EVENTS_PER_TRANSITION,
    },
};

/// A point on the coordinator's monotonic clock, in milliseconds since it
/// started. The registry's clock supplies it; tests supply their own.
pub type Millis = u64;

/// Request ids remembered per session for Start replay. The contract asks for
/// at least 16; older ones are forgotten first.
pub const REPLAY_WINDOW: usize = 16;

/// A call as the registry hands it to a session (already validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Start {
        source: Source,
        request_id: Option<RequestId>,
    },
    Finish {
        response: Option<ResponseId>,
        status: FinishStatus,
    },
    Cancel {
        only_if: Option<ResponseId>,
    },
    Teardown {
        reason: TeardownReason,
    },
}

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
}

/// The result of applying one call.
#[derive(Debug)]
pub struct Applied {
    pub outcome: Outcome,
    pub events: ArrayVec<SharedEvent, MAX_EVENTS_PER_TRANSITION>,
}

impl AsRef<[SharedEvent]> for Applied {
    fn as_ref(&self) -> &[SharedEvent] {
        &self.events
    }
}

/// What a transition stamps on its events and mints for a Start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The seq of the transition's first event.
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

/// When the registry's expiry index should next look at a session, and what
/// it finds then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiryCheck {
    /// Not due: look again at this time.
    NotBefore(Millis),
    /// Idle for the TTL: tear it down with reason EXPIRED.
    Expire,
    /// Terminated for the tombstone TTL: forget it.
    Forget,
}

/// The two TTLs, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttls {
    pub idle: Millis,
    pub tombstone: Millis,
}

/// A retained event, without what the session already knows (its id, and its
/// revision, which follows from its position). A million idle sessions keep
/// their last events, so this is kept to 32 bytes and stored inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RetainedEvent {
    seq: u64,
    unix_nanos: i64,
    kind: EventKind,
}

/// Clone, Eq and Hash let model checkers hold sessions as state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Session {
    phase: Phase,
    revision: u64,
    responses_started: u64,
    /// The last events, oldest first; the newest has revision `revision`.
    history: VecDeque<RetainedEvent>,
    /// Boxed and created on first use: most sessions never send a request id,
    /// and this keeps them a pointer smaller.
    #[allow(clippy::box_collection)]
    replays: Option<Box<VecDeque<(RequestId, StartRecord)>>>,
    /// While live, the time of the last call (idle expiry counts from it);
    /// once terminated, the time of termination (the tombstone TTL counts
    /// from it). One field because a session never needs both.
    since: Millis,
    /// Due time of this session's live entry in the registry's expiry index;
    /// entries with another time are stale and skipped.
    expiry_entry: Millis,
}

impl Session {
    pub fn new(now: Millis) -> Self {
        Self {
            phase: Phase::Idle,
            revision: 0,
            responses_started: 0,
            history: VecDeque::new(),
            replays: None,
            since: now,
            expiry_entry: 0,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn snapshot(&self, session_id: &SessionId) -> SessionSnapshot {
        SessionSnapshot {
            session_id: session_id.clone(),
            phase: self.phase,
            revision: self.revision,
            responses_started: self.responses_started,
        }
    }

    /// Any call naming the session keeps it alive.
    pub fn touch(&mut self, now: Millis) {
        if self.phase != Phase::Terminated {
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

    /// Runs one call through the machine and records its effects. `first_seq`
    /// is the seq the log gives this call's first event; it doubles as the id
    /// of a response this call starts (unique, increasing, never reused).
    pub fn apply(
        &mut self,
        session_id: &SessionId,
        call: &Call,
        first_seq: u64,
        unix_nanos: i64,
        history_limit: usize,
        now: Millis,
    ) -> Applied {
        // The log's seqs start above zero, so this never fails; the fallback
        // keeps the function total.
        let new_response = ResponseId::new(first_seq).unwrap_or(ResponseId::MIN);
        let stamp = Stamp {
            first_seq,
            unix_nanos,
            new_response,
        };
        self.apply_stamped(session_id, call, stamp, history_limit, now)
    }

    /// As [`Session::apply`], for a backend whose response ids are not seqs
    /// (the NATS backend learns an event's seq only once it is stored, so it
    /// mints ids itself and stamps `first_seq` later).
    pub fn apply_stamped(
        &mut self,
        session_id: &SessionId,
        call: &Call,
        stamp: Stamp,
        history_limit: usize,
        now: Millis,
    ) -> Applied {
        let Stamp {
            first_seq,
            unix_nanos,
            new_response,
        } = stamp;
        let input = match call {
            Call::Start { source, .. } => Input::Start {
                new_response,
                source: *source,
            },
            Call::Finish { response, status } => Input::Finish {
                response: *response,
                status: *status,
            },
            Call::Cancel { only_if } => Input::Cancel { only_if: *only_if },
            Call::Teardown { reason } => Input::Teardown { reason: *reason },
        };
        let transition = machine::transition(self.phase, input);
        let mut events = ArrayVec::new();
        for (offset, kind) in (0u64..).zip(transition.events) {
            if let EventKind::Started { .. } = kind {
                self.responses_started += 1;
            }
            self.revision += 1;
            let event = Arc::new(LifecycleEvent {
                session_id: session_id.clone(),
                revision: self.revision,
                seq: first_seq + offset,
                unix_nanos,
                kind,
            });
            self.retain(
                RetainedEvent {
                    seq: event.seq,
                    unix_nanos,
                    kind,
                },
                history_limit,
            );
            events.push(event);
        }
        if transition.next == Phase::Terminated && self.phase != Phase::Terminated {
            self.since = now;
        }
        self.phase = transition.next;
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
        Applied {
            outcome: transition.outcome,
            events,
        }
    }

    fn retain(&mut self, event: RetainedEvent, limit: usize) {
        if limit == 0 {
            return;
        }
        if self.history.len() >= limit {
            self.history.pop_front();
        } else if self.history.len() == self.history.capacity() && self.history.len() < 4 {
            // Grow one slot at a time while small: most sessions hold only a
            // handful of events, and doubling would leave half of it empty.
            self.history.reserve_exact(1);
        }
        self.history.push_back(event);
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
            .zip(&self.history)
            .skip(skip)
            .map(|(revision, event)| {
                Arc::new(LifecycleEvent {
                    session_id: session_id.clone(),
                    revision,
                    seq: event.seq,
                    unix_nanos: event.unix_nanos,
                    kind: event.kind,
                })
            })
            .collect())
    }

    /// The durable fields (see [`Persisted`]).
    pub fn persisted(&self) -> Persisted {
        Persisted {
            phase: self.phase,
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
        Self {
            phase,
            revision,
            responses_started,
            history: VecDeque::new(),
            replays: (!replays.is_empty()).then(|| Box::new(replays.into())),
            since,
            expiry_entry: 0,
        }
    }

    pub fn expiry_entry(&self) -> Millis {
        self.expiry_entry
    }

    pub fn set_expiry_entry(&mut self, due: Millis) {
        self.expiry_entry = due;
    }

    /// The deadline this session's expiry entry should be filed under.
    pub fn next_deadline(&self, ttls: Ttls) -> Millis {
        match self.phase {
            Phase::Terminated => self.since.saturating_add(ttls.tombstone),
            Phase::Idle | Phase::Active(_) => self.since.saturating_add(ttls.idle),
        }
    }

    /// What the expiry index should do with this session at `now`. Strictly
    /// after the deadline, so a session never expires before its TTL even
    /// with millisecond rounding.
    pub fn expiry_check(&self, now: Millis, ttls: Ttls) -> ExpiryCheck {
        let deadline = self.next_deadline(ttls);
        if now <= deadline {
            return ExpiryCheck::NotBefore(deadline.saturating_add(1));
        }
        match self.phase {
            Phase::Terminated => ExpiryCheck::Forget,
            Phase::Idle | Phase::Active(_) => ExpiryCheck::Expire,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{CancelReason, Ending};

    const TTLS: Ttls = Ttls {
        idle: 1_000,
        tombstone: 100,
    };

    fn sid() -> SessionId {
        SessionId::parse("s").unwrap()
    }

    fn start(request_id: Option<&str>) -> Call {
        Call::Start {
            source: Source::Client,
            request_id: request_id.map(|r| RequestId::parse_optional(r).unwrap().unwrap()),
        }
    }

    #[test]
    fn revisions_are_gap_free_and_response_ids_come_from_seq() {
        let mut session = Session::new(0);
        let a = session.apply(&sid(), &start(None), 100, 0, 64, 0);
        assert_eq!(a.events.len(), 1);
        assert_eq!(a.events[0].revision, 1);
        let b = session.apply(&sid(), &start(None), 101, 0, 64, 0);
        let revisions: Vec<u64> = b.events.iter().map(|e| e.revision).collect();
        let seqs: Vec<u64> = b.events.iter().map(|e| e.seq).collect();
        assert_eq!(revisions, [2, 3, 4]);
        assert_eq!(seqs, [101, 102, 103]);
        assert_eq!(
            b.outcome,
            Outcome::Started {
                response: ResponseId::new(101).unwrap(),
                superseded: ResponseId::new(100),
            }
        );
        assert_eq!(
            b.events[1].kind,
            EventKind::Ended {
                response: ResponseId::new(100).unwrap(),
                ending: Ending::Cancelled(CancelReason::Superseded)
            }
        );
        assert_eq!(session.snapshot(&sid()).responses_started, 2);
    }

    #[test]
    fn replay_window_keeps_the_last_sixteen() {
        let mut session = Session::new(0);
        for i in 0..20u64 {
            session.apply(&sid(), &start(Some(&format!("r{i}"))), 10 + i * 3, 0, 64, 0);
        }
        let key = |i: u64| {
            RequestId::parse_optional(&format!("r{i}"))
                .unwrap()
                .unwrap()
        };
        assert_eq!(session.replayed(&key(3)), None);
        assert_eq!(
            session.replayed(&key(4)).map(|r| r.response.get()),
            Some(10 + 4 * 3)
        );
        assert!(session.replayed(&key(19)).is_some());
    }

    #[test]
    fn refused_start_is_not_remembered() {
        let mut session = Session::new(0);
        let call = Call::Teardown {
            reason: TeardownReason::Shutdown,
        };
        session.apply(&sid(), &call, 5, 0, 64, 0);
        let refused = session.apply(&sid(), &start(Some("late")), 6, 0, 64, 0);
        assert_eq!(refused.outcome, Outcome::StartRefused);
        assert!(refused.events.is_empty());
        let key = RequestId::parse_optional("late").unwrap().unwrap();
        assert_eq!(session.replayed(&key), None);
    }

    #[test]
    fn history_is_bounded_and_resume_beyond_it_is_refused() {
        let mut session = Session::new(0);
        for i in 0..5 {
            session.apply(&sid(), &start(None), 10 + i * 3, 0, 4, 0);
        }
        // 1 + 4*3 = 13 events, the last 4 kept: revisions 10..=13.
        assert_eq!(session.revision(), 13);
        let replay = session.history_after(&sid(), 9).unwrap();
        let revisions: Vec<u64> = replay.iter().map(|e| e.revision).collect();
        assert_eq!(revisions, [10, 11, 12, 13]);
        assert_eq!(replay[3].seq, 22 + 2);
        assert_eq!(replay[0].session_id, sid());
        assert_eq!(session.history_after(&sid(), 12).unwrap().len(), 1);
        assert_eq!(session.history_after(&sid(), 13).unwrap().len(), 0);
        assert_eq!(session.history_after(&sid(), 50).unwrap().len(), 0);
        assert_eq!(session.history_after(&sid(), 8).unwrap_err(), 9);
    }

    #[test]
    fn expiry_is_never_early_and_tombstones_are_forgotten() {
        let mut session = Session::new(0);
        assert_eq!(
            session.expiry_check(1_000, TTLS),
            ExpiryCheck::NotBefore(1_001)
        );
        session.touch(500);
        assert_eq!(
            session.expiry_check(1_001, TTLS),
            ExpiryCheck::NotBefore(1_501)
        );
        assert_eq!(session.expiry_check(1_501, TTLS), ExpiryCheck::Expire);
        let call = Call::Teardown {
            reason: TeardownReason::Expired,
        };
        session.apply(&sid(), &call, 5, 0, 64, 1_501);
        assert_eq!(
            session.expiry_check(1_550, TTLS),
            ExpiryCheck::NotBefore(1_602)
        );
        // Touching a tombstone does not keep it.
        session.touch(1_590);
        assert_eq!(session.expiry_check(1_602, TTLS), ExpiryCheck::Forget);
    }
}
