//! Machine M3: response coordination for one session, as a pure function.
//!
//! This is the whole of the transition logic. [`transition`] is total over
//! `(Phase, Call)`, deterministic, and free of I/O, clocks and async:
//! `session` runs it on a session's record, `decision` decides everything
//! around it (presence, the session limit, replay), and each backend stamps,
//! stores and publishes what it returns. Because a call is one call of
//! [`transition`], applied to a session atomically (the memory registry's
//! shard lock, the NATS backend's compare-and-set), superseding a response
//! cancels the old one and starts the new one in a single step; the spec's
//! `atomic start` (`proto/PROTOCOL.md`, "The formal model") is this
//! function's shape, and the legacy dual-writer race it removes cannot be
//! expressed here.
//!
//! The state is an enum whose variants carry only their own data, so "active
//! with no response" or "terminated with a live response" cannot be written.

use arrayvec::ArrayVec;

use crate::ids::{RequestId, ResponseId};

/// Which gateway path asked. Recorded for observability only: no transition
/// ever depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Source {
    #[default]
    Unspecified,
    Client,
    Vad,
}

/// The response that is live in an active session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActiveResponse {
    pub id: ResponseId,
    pub source: Source,
}

/// The session's phase. `Terminated` is absorbing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Phase {
    #[default]
    Idle,
    Active(ActiveResponse),
    Terminated,
}

impl Phase {
    pub fn active(self) -> Option<ActiveResponse> {
        match self {
            Phase::Active(active) => Some(active),
            Phase::Idle | Phase::Terminated => None,
        }
    }
}

/// How a response reported its own end. Cancellation is never reported by the
/// response itself, so it is not a variant (the edge rejects it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishStatus {
    Completed,
    Failed,
}

/// Why a session is torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TeardownReason {
    /// An explicit Shutdown call.
    Shutdown,
    /// No call named the session for the idle TTL.
    Expired,
}

/// Why a response was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CancelReason {
    Superseded,
    Requested,
    Shutdown,
    Expired,
}

impl From<TeardownReason> for CancelReason {
    fn from(reason: TeardownReason) -> Self {
        match reason {
            TeardownReason::Shutdown => CancelReason::Shutdown,
            TeardownReason::Expired => CancelReason::Expired,
        }
    }
}

/// A response's terminal. Only a cancellation carries a reason, so an `ended`
/// event with status COMPLETED and a reason cannot be constructed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Terminal {
    Completed,
    Failed,
    Cancelled(CancelReason),
}

impl From<FinishStatus> for Terminal {
    fn from(status: FinishStatus) -> Self {
        match status {
            FinishStatus::Completed => Terminal::Completed,
            FinishStatus::Failed => Terminal::Failed,
        }
    }
}

/// What one transition emits, in order. Each becomes one `LifecycleEvent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Started {
        response: ResponseId,
        source: Source,
    },
    CancelRequested {
        response: ResponseId,
        reason: CancelReason,
        /// Who asked: the superseding Start's source, the Cancel's, the
        /// Shutdown's; unspecified for expiry, which has no caller.
        /// Recorded only, like every source.
        source: Source,
    },
    Ended {
        response: ResponseId,
        ending: Terminal,
    },
    Terminated {
        reason: TeardownReason,
    },
}

/// A call on a session: the spec's actions, with the data each carries.
/// The machine's input as it is the backend's: what only the layers around
/// the machine read (a Start's idempotency key, who asked for a Cancel) is
/// carried here and never changes a transition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// StartFromClient / StartFromVad. The id the response gets is minted
    /// by the caller and given to [`transition`] beside the call.
    Start {
        source: Source,
        /// The idempotency key the session's replay window answers a retry
        /// by (`session`); the machine never reads it.
        request_id: Option<RequestId>,
    },
    /// FinishCurrent, fenced by id: only the active response may finish.
    /// `None` (wire id 0) never matches and is therefore always stale.
    Finish {
        response: Option<ResponseId>,
        status: FinishStatus,
    },
    /// CancelReq. With `only_if`, cancels only that response.
    Cancel {
        only_if: Option<ResponseId>,
        /// Who asked: recorded for the metrics (stops by source), never
        /// part of the transition.
        source: Source,
    },
    /// Shutdown (explicit) or idle expiry. `source`: who asked for a
    /// Shutdown, recorded on the cancel of its live response (unspecified
    /// for expiry, which has no caller).
    Teardown {
        reason: TeardownReason,
        source: Source,
    },
}

impl Call {
    /// Whether the call creates the session it names when there is none:
    /// Start does, and Shutdown (a tombstone, so a later Start is refused).
    pub fn creates(&self) -> bool {
        matches!(
            self,
            Call::Start { .. }
                | Call::Teardown {
                    reason: TeardownReason::Shutdown,
                    ..
                }
        )
    }

    /// The call as logs name it.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Start { .. } => "start",
            Call::Finish { .. } => "finish",
            Call::Cancel { .. } => "cancel",
            Call::Teardown {
                reason: TeardownReason::Shutdown,
                ..
            } => "shutdown",
            Call::Teardown {
                reason: TeardownReason::Expired,
                ..
            } => "expire",
        }
    }

    /// A Start's idempotency key, if it carries one.
    pub fn request_id(&self) -> Option<&RequestId> {
        match self {
            Call::Start { request_id, .. } => request_id.as_ref(),
            _ => None,
        }
    }
}

/// The reply a transition owes its caller, and so the reply of the call
/// (a replayed Start answers with the outcome it first had).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Started {
        response: ResponseId,
        superseded: Option<ResponseId>,
    },
    /// Start on a terminated session: nothing changed.
    StartRefused,
    Finished {
        applied: bool,
    },
    Cancelled {
        cancelled: Option<ResponseId>,
    },
    TornDown {
        cancelled: Option<ResponseId>,
    },
}

impl Outcome {
    /// The response the outcome names (started, or cancelled by a Cancel or
    /// teardown) and the one a Start superseded.
    pub fn responses(&self) -> (Option<ResponseId>, Option<ResponseId>) {
        match *self {
            Outcome::Started {
                response,
                superseded,
            } => (Some(response), superseded),
            Outcome::Cancelled { cancelled } | Outcome::TornDown { cancelled } => (cancelled, None),
            Outcome::StartRefused | Outcome::Finished { .. } => (None, None),
        }
    }
}

/// Most events one transition emits (supersede and teardown emit three).
pub const MAX_EVENTS_PER_TRANSITION: usize = 3;

/// The result of one transition: next phase, its events in order, the reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub next: Phase,
    pub events: ArrayVec<EventKind, MAX_EVENTS_PER_TRANSITION>,
    pub outcome: Outcome,
}

impl Transition {
    fn unchanged(phase: Phase, outcome: Outcome) -> Self {
        Self {
            next: phase,
            events: ArrayVec::new(),
            outcome,
        }
    }
}

/// The events that stop `active` for `reason`, asked for by `source`: first
/// the request to stop, then its cancelled terminal. Every path that cancels
/// goes through here, so every cancellation is announced the same way.
fn cancel_events(
    events: &mut ArrayVec<EventKind, MAX_EVENTS_PER_TRANSITION>,
    active: ActiveResponse,
    reason: CancelReason,
    source: Source,
) {
    events.push(EventKind::CancelRequested {
        response: active.id,
        reason,
        source,
    });
    events.push(EventKind::Ended {
        response: active.id,
        ending: Terminal::Cancelled(reason),
    });
}

/// M3's transition function. Total: every `(phase, call)` pair has an
/// answer. `new_response` is minted by the caller (it must exceed every id
/// this session has used); it is only consumed if the transition accepts a
/// start.
pub fn transition(phase: Phase, call: &Call, new_response: ResponseId) -> Transition {
    let mut events = ArrayVec::new();
    match (phase, call) {
        (Phase::Terminated, Call::Start { .. }) => {
            Transition::unchanged(phase, Outcome::StartRefused)
        }
        (Phase::Idle | Phase::Active(_), &Call::Start { source, .. }) => {
            let superseded = phase.active();
            if let Some(old) = superseded {
                cancel_events(&mut events, old, CancelReason::Superseded, source);
            }
            events.push(EventKind::Started {
                response: new_response,
                source,
            });
            Transition {
                next: Phase::Active(ActiveResponse {
                    id: new_response,
                    source,
                }),
                events,
                outcome: Outcome::Started {
                    response: new_response,
                    superseded: superseded.map(|old| old.id),
                },
            }
        }
        (Phase::Active(active), &Call::Finish { response, status })
            if response == Some(active.id) =>
        {
            events.push(EventKind::Ended {
                response: active.id,
                ending: status.into(),
            });
            Transition {
                next: Phase::Idle,
                events,
                outcome: Outcome::Finished { applied: true },
            }
        }
        (_, Call::Finish { .. }) => {
            Transition::unchanged(phase, Outcome::Finished { applied: false })
        }
        (Phase::Active(active), &Call::Cancel { only_if, source })
            if only_if.is_none_or(|id| id == active.id) =>
        {
            cancel_events(&mut events, active, CancelReason::Requested, source);
            Transition {
                next: Phase::Idle,
                events,
                outcome: Outcome::Cancelled {
                    cancelled: Some(active.id),
                },
            }
        }
        (_, Call::Cancel { .. }) => {
            Transition::unchanged(phase, Outcome::Cancelled { cancelled: None })
        }
        (Phase::Terminated, Call::Teardown { .. }) => {
            Transition::unchanged(phase, Outcome::TornDown { cancelled: None })
        }
        (Phase::Idle | Phase::Active(_), &Call::Teardown { reason, source }) => {
            let cancelled = phase.active();
            if let Some(active) = cancelled {
                cancel_events(&mut events, active, reason.into(), source);
            }
            events.push(EventKind::Terminated { reason });
            Transition {
                next: Phase::Terminated,
                events,
                outcome: Outcome::TornDown {
                    cancelled: cancelled.map(|active| active.id),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests;
