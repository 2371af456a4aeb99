//! Counters of what the coordinator did, for the metrics (`metrics`):
//! sessions per phase, transitions by kind, events by kind, request-id
//! replays. Plain integers: each registry shard keeps its own under the lock
//! the call already holds, so counting adds no shared cache line to the call
//! path; a reader sums the shards ([`crate::registry::Registry::stats`]).

use crate::{
    decision::{Decision, Reply},
    machine::{EventKind, Phase, TeardownReason},
    session::Call,
};

/// A state change of a session, named for dashboards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransitionKind {
    /// Start on an idle (or new) session.
    Start,
    /// Start on an active session: the old response is cancelled.
    Supersede,
    /// Finish of the active response.
    Finish,
    /// Cancel of the active response.
    Cancel,
    /// Shutdown call.
    Shutdown,
    /// Idle expiry.
    Expire,
}

impl TransitionKind {
    pub const ALL: [TransitionKind; 6] = [
        TransitionKind::Start,
        TransitionKind::Supersede,
        TransitionKind::Finish,
        TransitionKind::Cancel,
        TransitionKind::Shutdown,
        TransitionKind::Expire,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TransitionKind::Start => "start",
            TransitionKind::Supersede => "supersede",
            TransitionKind::Finish => "finish",
            TransitionKind::Cancel => "cancel",
            TransitionKind::Shutdown => "shutdown",
            TransitionKind::Expire => "expire",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The kind of a call that emitted events; `None` if nothing changed.
    fn of(call: &Call, decision: &Decision) -> Option<Self> {
        if decision.change.is_empty() {
            return None;
        }
        Some(match call {
            Call::Start { .. } => match decision.reply {
                Reply::Started {
                    superseded: Some(_),
                    ..
                } => TransitionKind::Supersede,
                _ => TransitionKind::Start,
            },
            Call::Finish { .. } => TransitionKind::Finish,
            Call::Cancel { .. } => TransitionKind::Cancel,
            Call::Teardown {
                reason: TeardownReason::Shutdown,
            } => TransitionKind::Shutdown,
            Call::Teardown {
                reason: TeardownReason::Expired,
            } => TransitionKind::Expire,
        })
    }
}

/// Event kinds as the wire names them (`LifecycleEvent.kind`).
pub const EVENT_KINDS: [&str; 4] = ["started", "cancel_requested", "ended", "terminated"];

fn event_index(kind: &EventKind) -> usize {
    match kind {
        EventKind::Started { .. } => 0,
        EventKind::CancelRequested { .. } => 1,
        EventKind::Ended { .. } => 2,
        EventKind::Terminated { .. } => 3,
    }
}

/// Sessions held now, by phase (terminated ones are tombstones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseCounts {
    pub idle: u64,
    pub active: u64,
    pub terminated: u64,
}

impl PhaseCounts {
    fn slot(&mut self, phase: Phase) -> &mut u64 {
        match phase {
            Phase::Idle => &mut self.idle,
            Phase::Active(_) => &mut self.active,
            Phase::Terminated => &mut self.terminated,
        }
    }
}

/// Everything counted, for one shard or (summed) the whole registry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoordStats {
    pub sessions: PhaseCounts,
    /// Transitions applied since boot, indexed like [`TransitionKind::ALL`].
    pub transitions: [u64; 6],
    /// Events emitted since boot, indexed like [`EVENT_KINDS`].
    pub events: [u64; 4],
    /// Starts answered from the request-id replay window since boot.
    pub replays: u64,
}

impl CoordStats {
    pub fn transitions_of(&self, kind: TransitionKind) -> u64 {
        self.transitions[kind.index()]
    }

    /// Sessions expired for idleness since boot.
    pub fn expiries(&self) -> u64 {
        self.transitions_of(TransitionKind::Expire)
    }

    /// A terminated session's record was dropped.
    pub(crate) fn forgotten(&mut self) {
        self.sessions.terminated = self.sessions.terminated.saturating_sub(1);
    }

    /// Counts what a decided (and carried out) `call` did: a created record
    /// (records start idle), a replay, a phase change, a transition and its
    /// events. The one place both backends count calls and expiries.
    pub(crate) fn record(&mut self, call: &Call, decision: &Decision) {
        if decision.created {
            self.sessions.idle += 1;
        }
        if decision.replayed() {
            self.replays += 1;
        }
        let before = if decision.created {
            Phase::Idle
        } else {
            decision.before
        };
        let after = decision.state.phase;
        if std::mem::discriminant(&before) != std::mem::discriminant(&after) {
            let old = self.sessions.slot(before);
            *old = old.saturating_sub(1);
            *self.sessions.slot(after) += 1;
        }
        if let Some(kind) = TransitionKind::of(call, decision) {
            self.transitions[kind.index()] += 1;
        }
        for kind in &decision.change.kinds {
            self.events[event_index(kind)] += 1;
        }
    }

    /// Adds another shard's counts.
    pub fn add(&mut self, other: &CoordStats) {
        self.sessions.idle += other.sessions.idle;
        self.sessions.active += other.sessions.active;
        self.sessions.terminated += other.sessions.terminated;
        for (sum, n) in self.transitions.iter_mut().zip(other.transitions) {
            *sum += n;
        }
        for (sum, n) in self.events.iter_mut().zip(other.events) {
            *sum += n;
        }
        self.replays += other.replays;
    }
}
