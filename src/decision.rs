//! The decision of one call, written once for both backends (quinn-proto's
//! sans-IO shape): a pure function of the session record, the call, the time
//! and the id/seq stamp that says everything the call does, and one for
//! expiry. No I/O, no lock, no clock: the memory registry applies a decision
//! under its shard lock, the NATS backend under its compare-and-set loop, and
//! both carry out its effects (publish, store, count) in their own way.

pub use crate::session::Stamp;
use crate::{
    error::CoordError,
    event::Change,
    ids::{ResponseId, SessionId},
    machine::{Outcome, Phase, TeardownReason},
    session::{Call, ExpiryCheck, Millis, Session, SessionSnapshot, Ttls},
};

/// What a backend knows of the session a call names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// A stored record: the `session` given to [`decide`] is it.
    Stored,
    /// No record; the `session` given is a fresh one. `room` says whether
    /// one more session fits under the limit.
    Absent { room: Room },
}

/// Whether a new session fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    Available,
    Full { max: usize },
}

/// What a call answers, whichever call it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    Started {
        response: ResponseId,
        superseded: Option<ResponseId>,
        /// The first answer to an earlier Start with the same request id.
        replayed: bool,
    },
    /// A Start on a terminated session.
    StartRefused,
    Finished {
        applied: bool,
    },
    /// Cancel's answer: the response it cancelled, if any.
    Cancelled {
        cancelled: Option<ResponseId>,
    },
    /// A teardown's (Shutdown, expiry): the response it cancelled, if any.
    TornDown {
        cancelled: Option<ResponseId>,
    },
}

impl Reply {
    /// The response the reply names (started, or cancelled by a Cancel or
    /// teardown) and the one a Start superseded.
    pub fn responses(&self) -> (Option<ResponseId>, Option<ResponseId>) {
        match *self {
            Reply::Started {
                response,
                superseded,
                ..
            } => (Some(response), superseded),
            Reply::Cancelled { cancelled } | Reply::TornDown { cancelled } => (cancelled, None),
            Reply::StartRefused | Reply::Finished { .. } => (None, None),
        }
    }
}

/// A decided call: its answer and what the backend must do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub reply: Reply,
    /// The session after the call, as the reply reports it.
    pub state: SessionSnapshot,
    /// The call created the session (the backend stores the fresh record).
    pub created: bool,
    /// The phase before the call (for the session counts).
    pub before: Phase,
    /// When the response live before the call started, if known: how long
    /// a response this call ended ran (for the metrics).
    pub live_since: Option<i64>,
    /// The events it emitted; empty when the machine changed nothing.
    pub change: Change,
}

impl Decision {
    /// A replay: the first answer to an earlier Start with the same request
    /// id; the session was only touched.
    pub fn replayed(&self) -> bool {
        matches!(self.reply, Reply::Started { replayed: true, .. })
    }

    /// Whether the session record changed beyond the touch: it must be
    /// written (NATS) or was created (memory: stored).
    pub fn changed(&self) -> bool {
        self.created || !self.change.is_empty()
    }
}

/// Decides `call` on `session` at `now`. `session` is the stored record
/// (`Presence::Stored`) or a fresh `Session::new(now)` (`Presence::Absent`);
/// it is updated in place (touched, transitioned). `history_limit` is how
/// many events the record retains itself (0 where the store keeps them).
pub fn decide(
    session: &mut Session,
    presence: Presence,
    id: &SessionId,
    call: &Call,
    now: Millis,
    stamp: impl FnOnce() -> Stamp,
    history_limit: usize,
) -> Result<Decision, CoordError> {
    let created = match presence {
        Presence::Stored => false,
        Presence::Absent { .. } if !call.creates() => {
            return Err(CoordError::SessionNotFound(id.clone()))
        }
        Presence::Absent {
            room: Room::Full { max },
        } => return Err(CoordError::SessionLimit { max }),
        Presence::Absent {
            room: Room::Available,
        } => true,
    };
    session.touch(now);
    let before = session.phase();
    let live_since = session.live_since();
    if let Some(record) = call.request_id().and_then(|r| session.replayed(r)) {
        return Ok(Decision {
            reply: Reply::Started {
                response: record.response,
                superseded: record.superseded,
                replayed: true,
            },
            state: session.snapshot(id),
            created,
            before,
            live_since,
            change: Change {
                first_revision: session.revision() + 1,
                unix_nanos: 0,
                kinds: Default::default(),
            },
        });
    }
    let (outcome, change) = session.apply(call, stamp(), history_limit, now);
    let decision = Decision {
        reply: reply_of(outcome),
        state: session.snapshot(id),
        created,
        before,
        live_since,
        change,
    };
    trace(id, call, &decision);
    Ok(decision)
}

/// One debug event per transition, here for both backends and expiry (as
/// quinn-proto traces inside its state machine): filtering
/// `respcoord::decision=debug` shows every change of every session.
fn trace(id: &SessionId, call: &Call, decision: &Decision) {
    if decision.change.is_empty() {
        return;
    }
    let (response, superseded) = decision.reply.responses();
    // Names and ids as text, not Rust's `Debug` of the types.
    tracing::debug!(
        session_id = %id,
        call = call.name(),
        response_id = response.map(tracing::field::display),
        superseded_response_id = superseded.map(tracing::field::display),
        revision = decision.state.revision,
        events = decision.change.kinds.len(),
        "transition"
    );
}

fn reply_of(outcome: Outcome) -> Reply {
    match outcome {
        Outcome::Started {
            response,
            superseded,
        } => Reply::Started {
            response,
            superseded,
            replayed: false,
        },
        Outcome::StartRefused => Reply::StartRefused,
        Outcome::Finished { applied } => Reply::Finished { applied },
        Outcome::Cancelled { cancelled } => Reply::Cancelled { cancelled },
        Outcome::TornDown { cancelled } => Reply::TornDown { cancelled },
    }
}

/// What expiry does with a session it looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpiryDecision {
    /// Not due: look again at this time.
    NotDue { at: Millis },
    /// Terminated for the tombstone TTL: forget the record.
    Forget,
    /// Idle for the TTL: torn down with reason EXPIRED (the record is
    /// updated in place); look again at `next_check` to forget it.
    Expired {
        decision: Decision,
        next_check: Millis,
    },
}

/// The teardown that expiry makes.
pub const EXPIRY: Call = Call::Teardown {
    reason: TeardownReason::Expired,
};

/// Decides what expiry does with `session` at `now` (a forget is traced by
/// the backend that carries it out, once it has). Strictly after the
/// deadline, so a session never expires before its TTL even with
/// millisecond rounding.
pub fn decide_expiry(
    session: &mut Session,
    id: &SessionId,
    now: Millis,
    ttls: Ttls,
    stamp: impl FnOnce() -> Stamp,
    history_limit: usize,
) -> ExpiryDecision {
    match session.expiry_check(now, ttls) {
        ExpiryCheck::NotBefore(at) => ExpiryDecision::NotDue { at },
        ExpiryCheck::Forget => ExpiryDecision::Forget,
        ExpiryCheck::Expire => {
            let before = session.phase();
            let live_since = session.live_since();
            let (outcome, change) = session.apply(&EXPIRY, stamp(), history_limit, now);
            let decision = Decision {
                reply: reply_of(outcome),
                state: session.snapshot(id),
                created: false,
                before,
                live_since,
                change,
            };
            trace(id, &EXPIRY, &decision);
            ExpiryDecision::Expired {
                decision,
                next_check: session.next_deadline(ttls).saturating_add(1),
            }
        }
    }
}

/// Start's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    pub response: ResponseId,
    pub superseded: Option<ResponseId>,
    pub replayed: bool,
    pub state: SessionSnapshot,
}

/// Reply of Finish (`applied`), Cancel and Shutdown (`cancelled`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed<T> {
    pub result: T,
    pub state: SessionSnapshot,
}

impl Decision {
    /// As Start's reply: a started (or replayed) response, or the refusal of
    /// a terminated session.
    pub fn started(self, id: &SessionId) -> Result<Started, CoordError> {
        match self.reply {
            Reply::Started {
                response,
                superseded,
                replayed,
            } => Ok(Started {
                response,
                superseded,
                replayed,
                state: self.state,
            }),
            Reply::StartRefused
            | Reply::Finished { .. }
            | Reply::Cancelled { .. }
            | Reply::TornDown { .. } => Err(CoordError::SessionTerminated(id.clone())),
        }
    }

    /// As Finish's reply: whether it applied.
    pub fn finished(self) -> Changed<bool> {
        Changed {
            result: matches!(self.reply, Reply::Finished { applied: true }),
            state: self.state,
        }
    }

    /// As Cancel's and Shutdown's reply: the response they cancelled.
    pub fn cancelled(self) -> Changed<Option<ResponseId>> {
        let result = match self.reply {
            Reply::Cancelled { cancelled } | Reply::TornDown { cancelled } => cancelled,
            Reply::Started { .. } | Reply::StartRefused | Reply::Finished { .. } => None,
        };
        Changed {
            result,
            state: self.state,
        }
    }
}

#[cfg(test)]
mod tests;
