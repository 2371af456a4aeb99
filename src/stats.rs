//! Counters of what the coordinator did, for the metrics (`metrics`):
//! sessions per phase, transitions by kind, events by kind, request-id
//! replays. Plain integers: each registry shard keeps its own under the lock
//! the call already holds, so counting adds no shared cache line to the call
//! path; a reader sums the shards ([`crate::registry::Registry::stats`]).

use crate::{
    decision::{Decision, Effect},
    machine::{Call, CancelReason, EventKind, Outcome, Phase, Source, TeardownReason, Terminal},
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

    /// The kind of a call that emitted events.
    fn of(call: &Call, reply: &Outcome) -> Self {
        match call {
            Call::Start { .. } => match reply {
                Outcome::Started {
                    superseded: Some(_),
                    ..
                } => TransitionKind::Supersede,
                _ => TransitionKind::Start,
            },
            Call::Finish { .. } => TransitionKind::Finish,
            Call::Cancel { .. } => TransitionKind::Cancel,
            Call::Teardown {
                reason: TeardownReason::Shutdown,
                ..
            } => TransitionKind::Shutdown,
            Call::Teardown {
                reason: TeardownReason::Expired,
                ..
            } => TransitionKind::Expire,
        }
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

/// How responses end, named for dashboards: the terminal status, and for a
/// cancelled one why (`respcoord_responses_ended_total{outcome}`).
pub const OUTCOMES: [&str; 6] = [
    "completed",
    "failed",
    "superseded",
    "requested",
    "shutdown",
    "expired",
];

fn outcome_index(ending: Terminal) -> usize {
    match ending {
        Terminal::Completed => 0,
        Terminal::Failed => 1,
        Terminal::Cancelled(reason) => 2 + stop_index(reason),
    }
}

/// Why a response was stopped, indexed like the cancelled [`OUTCOMES`].
pub const STOP_REASONS: [&str; 4] = ["superseded", "requested", "shutdown", "expired"];

fn stop_index(reason: CancelReason) -> usize {
    match reason {
        CancelReason::Superseded => 0,
        CancelReason::Requested => 1,
        CancelReason::Shutdown => 2,
        CancelReason::Expired => 3,
    }
}

/// Who stopped a response: the source of the superseding Start or of the
/// Cancel; `none` for a teardown (a Shutdown's source is on its event, not
/// counted here; expiry is the coordinator's own).
pub const STOPPERS: [&str; 4] = ["client", "vad", "unspecified", "none"];

fn stopper_index(call: &Call) -> usize {
    match call {
        Call::Start { source, .. } | Call::Cancel { source, .. } => match source {
            Source::Client => 0,
            Source::Vad => 1,
            Source::Unspecified => 2,
        },
        Call::Finish { .. } | Call::Teardown { .. } => 3,
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
    /// A session went from `before` to `after` (`None`: not held): a
    /// created, moved or dropped record. The one place both backends count
    /// sessions by phase (the registry's shards, a NATS replica's mirror).
    pub(crate) fn moved(&mut self, before: Option<Phase>, after: Option<Phase>) {
        if let (Some(before), Some(after)) = (before, after) {
            if std::mem::discriminant(&before) == std::mem::discriminant(&after) {
                return;
            }
        }
        if let Some(before) = before {
            let old = self.slot(before);
            *old = old.saturating_sub(1);
        }
        if let Some(after) = after {
            *self.slot(after) += 1;
        }
    }

    fn add(&mut self, other: &PhaseCounts) {
        self.idle += other.idle;
        self.active += other.active;
        self.terminated += other.terminated;
    }

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
    /// Responses ended since boot, indexed like [`OUTCOMES`].
    pub ended: [u64; 6],
    /// How long those responses ran in all, in nanoseconds, where their
    /// start was known (`Effect::Changed`'s `live_since`); indexed like [`OUTCOMES`].
    pub ended_nanos: [u64; 6],
    /// Responses stopped since boot, by [`STOP_REASONS`] and [`STOPPERS`].
    pub stopped: [[u64; 4]; 4],
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
        self.sessions.moved(Some(Phase::Terminated), None);
    }

    /// Counts what a decided (and carried out) `call` did: a created record
    /// or a phase change, a replay, a transition and its events. The one
    /// place both backends count calls and expiries.
    pub(crate) fn record(&mut self, call: &Call, decision: &Decision) {
        self.sessions
            .moved(decision.before, Some(decision.state.phase));
        let (change, live_since) = match &decision.effect {
            Effect::Replayed => {
                self.replays += 1;
                return;
            }
            Effect::Unchanged => return,
            Effect::Changed { change, live_since } => (change, *live_since),
        };
        self.transitions[TransitionKind::of(call, &decision.reply).index()] += 1;
        for kind in &change.kinds {
            self.events[event_index(kind)] += 1;
            if let EventKind::Ended { ending, .. } = kind {
                let outcome = outcome_index(*ending);
                self.ended[outcome] += 1;
                if let Some(since) = live_since {
                    let ran = change.unix_nanos.saturating_sub(since);
                    self.ended_nanos[outcome] += u64::try_from(ran).unwrap_or(0);
                }
                if let Terminal::Cancelled(reason) = ending {
                    self.stopped[stop_index(*reason)][stopper_index(call)] += 1;
                }
            }
        }
    }

    /// Adds another shard's counts.
    pub fn add(&mut self, other: &CoordStats) {
        self.sessions.add(&other.sessions);
        for (sum, n) in self.transitions.iter_mut().zip(other.transitions) {
            *sum += n;
        }
        for (sum, n) in self.events.iter_mut().zip(other.events) {
            *sum += n;
        }
        self.replays += other.replays;
        for (sum, n) in self.ended.iter_mut().zip(other.ended) {
            *sum += n;
        }
        for (sum, n) in self.ended_nanos.iter_mut().zip(other.ended_nanos) {
            *sum += n;
        }
        for (sums, row) in self.stopped.iter_mut().zip(other.stopped) {
            for (sum, n) in sums.iter_mut().zip(row) {
                *sum += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decision::{decide, Presence, Room, Stamp},
        ids::{ResponseId, SessionId},
        machine::FinishStatus,
        session::Session,
    };

    const SECOND: i64 = 1_000_000_000;

    /// Calls on one session, each decided at `t` seconds, counted as both
    /// backends count them; `history` is what the session retains itself
    /// (0: a NATS session, which is told its last change instead).
    fn counted(calls: &[(i64, Call)], history: usize) -> CoordStats {
        let id = SessionId::parse("s").unwrap();
        let mut session = Session::new(0);
        let mut stats = CoordStats::default();
        let mut last_change = 0;
        for (n, (t, call)) in calls.iter().enumerate() {
            if history == 0 {
                session.remember_live_since(last_change);
            }
            let presence = if n == 0 {
                Presence::Absent {
                    room: Room::Available,
                }
            } else {
                Presence::Stored
            };
            let stamp = Stamp {
                first_seq: 1 + 10 * n as u64,
                unix_nanos: t * SECOND,
                new_response: ResponseId::new(1 + n as u64).unwrap(),
            };
            let decided = decide(&mut session, presence, &id, call, 0).unwrap();
            let decision = decided.settle(stamp, history);
            if let Some(change) = decision.change() {
                last_change = change.unix_nanos;
            }
            stats.record(call, &decision);
        }
        stats
    }

    fn start(source: Source) -> Call {
        Call::Start {
            source,
            request_id: None,
        }
    }

    #[test]
    fn stops_are_counted_by_reason_and_by_who_stopped_them_with_how_long_each_ran() {
        let calls = [
            (10, start(Source::Client)),
            // The VAD's barge-in supersedes it after 2 s.
            (12, start(Source::Vad)),
            // The client's read loop cancels that one after 3 s.
            (
                15,
                Call::Cancel {
                    only_if: None,
                    source: Source::Client,
                },
            ),
            (20, start(Source::Client)),
            (
                24,
                Call::Finish {
                    response: ResponseId::new(4),
                    status: FinishStatus::Completed,
                },
            ),
            // A stale Finish and a Cancel of nothing stop nothing.
            (
                25,
                Call::Finish {
                    response: ResponseId::new(4),
                    status: FinishStatus::Failed,
                },
            ),
            (
                25,
                Call::Cancel {
                    only_if: None,
                    source: Source::Vad,
                },
            ),
            (30, start(Source::Unspecified)),
            (
                31,
                Call::Teardown {
                    reason: TeardownReason::Shutdown,
                    source: crate::machine::Source::Unspecified,
                },
            ),
        ];
        for history in [0, 64] {
            let stats = counted(&calls, history);
            // completed, failed, superseded, requested, shutdown, expired
            assert_eq!(stats.ended, [1, 0, 1, 1, 1, 0], "history {history}");
            let s = SECOND as u64;
            assert_eq!(
                stats.ended_nanos,
                [4 * s, 0, 2 * s, 3 * s, s, 0],
                "history {history}"
            );
            let mut stopped = [[0; 4]; 4];
            stopped[0][1] = 1; // superseded by the VAD
            stopped[1][0] = 1; // requested by the client
            stopped[2][3] = 1; // shut down
            assert_eq!(stats.stopped, stopped, "history {history}");
        }
    }

    #[test]
    fn a_response_whose_start_is_not_retained_is_counted_without_a_duration() {
        let calls = [
            (10, start(Source::Client)),
            (
                12,
                Call::Finish {
                    response: ResponseId::new(1),
                    status: FinishStatus::Failed,
                },
            ),
        ];
        // The memory backend keeping no events of its own knows no start.
        let id = SessionId::parse("s").unwrap();
        let mut session = Session::new(0);
        let mut stats = CoordStats::default();
        for (n, (t, call)) in calls.iter().enumerate() {
            let stamp = Stamp {
                first_seq: 1,
                unix_nanos: t * SECOND,
                new_response: ResponseId::new(1).unwrap(),
            };
            let presence = if n == 0 {
                Presence::Absent {
                    room: Room::Available,
                }
            } else {
                Presence::Stored
            };
            let decided = decide(&mut session, presence, &id, call, 0).unwrap();
            let decision = decided.settle(stamp, 0);
            stats.record(call, &decision);
        }
        assert_eq!(stats.ended[1], 1);
        assert_eq!(stats.ended_nanos[1], 0);
    }
}
