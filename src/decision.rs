//! The decision of one call, written once for both backends (quinn-proto's
//! sans-IO shape), in two phases that never call back into the backend.
//! [`decide`] reads the session record, the call and the time and says what
//! the call answers without a change (not found, session limit, replay, a
//! call the machine leaves as it was), or hands back a change ready to
//! apply ([`ReadyChange`]); the backend then takes its own locks, makes the
//! [`Stamp`] (seqs, time, the id a Start mints) and applies it. Likewise
//! [`decide_expiry`] for expiry. No I/O, no lock, no clock: the memory
//! registry applies under its shard lock, the NATS backend under its
//! compare-and-set loop, and both carry out the effects (publish, store,
//! count) in their own way.

pub use crate::session::Stamp;
use crate::{
    error::CoordError,
    event::Change,
    ids::{ResponseId, SessionId},
    machine::{Call, Outcome, Phase, Source, TeardownReason},
    session::{Millis, Session, SessionSnapshot, Ttls},
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

/// A decided call: its answer and what the backend must do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The machine's outcome, which is the call's reply (a replay's is the
    /// one the Start first had).
    pub reply: Outcome,
    /// The session after the call, as the reply reports it.
    pub state: SessionSnapshot,
    /// The phase before the call; `None` when the call created the session
    /// (the backend stores the fresh record).
    pub before: Option<Phase>,
    /// What the call did to the session beyond the touch.
    pub effect: Effect,
}

/// What a decided call did to the session beyond the touch every call is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Answered from the replay window: the first answer to an earlier
    /// Start with the same request id.
    Replayed,
    /// The machine left the session as it was (a Start on a terminated
    /// session, a stale Finish, a Cancel or teardown of nothing).
    Unchanged,
    /// A transition, with the events it emitted.
    Changed {
        change: Change,
        /// When the response live before the call started, if known: how
        /// long a response this call ended ran (for the metrics).
        live_since: Option<i64>,
    },
}

impl Decision {
    /// The call created the session.
    pub fn created(&self) -> bool {
        self.before.is_none()
    }

    /// A replay: the first answer to an earlier Start with the same request
    /// id; the session was only touched.
    pub fn replayed(&self) -> bool {
        matches!(self.effect, Effect::Replayed)
    }

    /// The events the call emitted, if the machine changed the session.
    pub fn change(&self) -> Option<&Change> {
        match &self.effect {
            Effect::Changed { change, .. } => Some(change),
            Effect::Replayed | Effect::Unchanged => None,
        }
    }

    /// Whether the session record changed beyond the touch: it must be
    /// written (NATS) or was created (memory: stored).
    pub fn changed(&self) -> bool {
        self.created() || self.change().is_some()
    }
}

/// What [`decide`] makes of a call before anything is stamped.
#[derive(Debug, PartialEq, Eq)]
pub enum Decided<'a> {
    /// The call's answer, which changes nothing but the touch: a replay, or
    /// a call the machine leaves as it was.
    Answered(Decision),
    /// A change, ready to apply once the backend has its stamp.
    Ready(ReadyChange<'a>),
}

impl Decided<'_> {
    /// The answer, or the change applied with `stamp`: for a backend whose
    /// stamp costs nothing to make whether or not it is used (NATS, tests).
    pub fn settle(self, stamp: Stamp, history_limit: usize) -> Decision {
        match self {
            Decided::Answered(decision) => decision,
            Decided::Ready(ready) => ready.apply(stamp, history_limit),
        }
    }
}

/// A call that changes its session, decided but not yet applied: the
/// backend takes its own locks, makes the [`Stamp`] and calls
/// [`ReadyChange::apply`].
#[derive(Debug, PartialEq, Eq)]
pub struct ReadyChange<'a> {
    session: &'a mut Session,
    id: &'a SessionId,
    call: &'a Call,
    now: Millis,
    before: Option<Phase>,
    live_since: Option<i64>,
}

impl<'a> ReadyChange<'a> {
    /// Runs the call through the machine with `stamp` (its events stamped
    /// and retained, up to `history_limit`; 0 where the store keeps them).
    pub fn apply(self, stamp: Stamp, history_limit: usize) -> Decision {
        self.apply_to(stamp, history_limit).0
    }

    /// As `apply`, giving the session back.
    fn apply_to(self, stamp: Stamp, history_limit: usize) -> (Decision, &'a mut Session) {
        let (outcome, change) = self
            .session
            .apply(self.call, stamp, history_limit, self.now);
        let decision = Decision {
            reply: outcome,
            state: self.session.snapshot(self.id),
            before: self.before,
            effect: Effect::Changed {
                change,
                live_since: self.live_since,
            },
        };
        trace(self.id, self.call, &decision);
        (decision, self.session)
    }
}

/// Decides `call` on `session` at `now`. `session` is the stored record
/// (`Presence::Stored`) or a fresh `Session::new(now)` (`Presence::Absent`);
/// it is touched in place here, and a change is applied to it through the
/// [`ReadyChange`] handed back, which borrows it until then.
pub fn decide<'a>(
    session: &'a mut Session,
    presence: Presence,
    id: &'a SessionId,
    call: &'a Call,
    now: Millis,
) -> Result<Decided<'a>, CoordError> {
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
    let before = (!created).then(|| session.phase());
    let answered = |reply, effect| Decision {
        reply,
        state: session.snapshot(id),
        before,
        effect,
    };
    if let Some(record) = call.request_id().and_then(|r| session.replayed(r)) {
        let reply = Outcome::Started {
            response: record.response,
            superseded: record.superseded,
        };
        return Ok(Decided::Answered(answered(reply, Effect::Replayed)));
    }
    if let Some(outcome) = session.unchanged_by(call) {
        return Ok(Decided::Answered(answered(outcome, Effect::Unchanged)));
    }
    let live_since = session.live_since();
    Ok(Decided::Ready(ReadyChange {
        session,
        id,
        call,
        now,
        before,
        live_since,
    }))
}

/// One debug event per transition, here for both backends and expiry (as
/// quinn-proto traces inside its state machine): filtering
/// `respcoord::decision=debug` shows every change of every session.
fn trace(id: &SessionId, call: &Call, decision: &Decision) {
    let Some(change) = decision.change() else {
        return;
    };
    let (response, superseded) = decision.reply.responses();
    // Names and ids as text, not Rust's `Debug` of the types.
    tracing::debug!(
        session_id = %id,
        call = call.name(),
        response_id = response.map(tracing::field::display),
        superseded_response_id = superseded.map(tracing::field::display),
        revision = decision.state.revision,
        events = change.kinds.len(),
        "transition"
    );
}

/// What expiry does with a session it looks at.
#[derive(Debug, PartialEq, Eq)]
pub enum ExpiryDecision<'a> {
    /// Not due: look again at this time.
    NotDue { at: Millis },
    /// Terminated for the tombstone TTL: forget the record.
    Forget,
    /// Idle for the TTL: to be torn down with reason EXPIRED once the
    /// backend has its stamp.
    Expire(ReadyExpiry<'a>),
}

/// An expiry decided but not yet applied (see [`ReadyChange`]).
#[derive(Debug, PartialEq, Eq)]
pub struct ReadyExpiry<'a> {
    change: ReadyChange<'a>,
    ttls: Ttls,
}

/// An applied expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expired {
    pub decision: Decision,
    /// When to look again, to forget the tombstone.
    pub next_check: Millis,
}

impl ReadyExpiry<'_> {
    /// Tears the session down with `stamp` (see [`ReadyChange::apply`]).
    pub fn apply(self, stamp: Stamp, history_limit: usize) -> Expired {
        let (decision, session) = self.change.apply_to(stamp, history_limit);
        Expired {
            decision,
            next_check: session.next_deadline(self.ttls).saturating_add(1),
        }
    }
}

/// The teardown that expiry makes.
pub const EXPIRY: Call = Call::Teardown {
    reason: TeardownReason::Expired,
    source: Source::Unspecified,
};

/// Decides what expiry does with `session` at `now` (a forget is traced by
/// the backend that carries it out, once it has). Strictly after the
/// deadline, so a session never expires before its TTL even with
/// millisecond rounding.
pub fn decide_expiry<'a>(
    session: &'a mut Session,
    id: &'a SessionId,
    now: Millis,
    ttls: Ttls,
) -> ExpiryDecision<'a> {
    let deadline = session.next_deadline(ttls);
    if now <= deadline {
        return ExpiryDecision::NotDue {
            at: deadline.saturating_add(1),
        };
    }
    if session.is_terminated() {
        return ExpiryDecision::Forget;
    }
    let before = Some(session.phase());
    let live_since = session.live_since();
    ExpiryDecision::Expire(ReadyExpiry {
        change: ReadyChange {
            session,
            id,
            call: &EXPIRY,
            now,
            before,
            live_since,
        },
        ttls,
    })
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
        let replayed = self.replayed();
        match self.reply {
            Outcome::Started {
                response,
                superseded,
            } => Ok(Started {
                response,
                superseded,
                replayed,
                state: self.state,
            }),
            Outcome::StartRefused
            | Outcome::Finished { .. }
            | Outcome::Cancelled { .. }
            | Outcome::TornDown { .. } => Err(CoordError::SessionTerminated(id.clone())),
        }
    }

    /// As Finish's reply: whether it applied.
    pub fn finished(self) -> Changed<bool> {
        Changed {
            result: matches!(self.reply, Outcome::Finished { applied: true }),
            state: self.state,
        }
    }

    /// As Cancel's and Shutdown's reply: the response they cancelled.
    pub fn cancelled(self) -> Changed<Option<ResponseId>> {
        let result = match self.reply {
            Outcome::Cancelled { cancelled } | Outcome::TornDown { cancelled } => cancelled,
            Outcome::Started { .. } | Outcome::StartRefused | Outcome::Finished { .. } => None,
        };
        Changed {
            result,
            state: self.state,
        }
    }
}

#[cfg(test)]
mod tests;
