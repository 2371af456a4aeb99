//! Judges a fault run's history: per session (sessions share nothing, so
//! each is checked alone), is there a sequential order of the operations,
//! consistent with real time, in which the project's own decision core
//! (`respcoord::decision::decide` on a `Session`, see `wgl.rs`) gives every
//! answer the clients saw?
//!
//! - An answered call took effect once, between its invocation and its
//!   completion, and must get exactly its recorded answer.
//! - A failed call did not happen: it is left out.
//! - An unknown call may have taken effect at any time after its invocation,
//!   or never; nothing is known of its answer.
//!
//! Response ids are not predicted (the server mints `max(last + 1, wall-clock
//! nanos)`): an answered Start brings its own, which must exceed every id the
//! session minted before. An unknown Start that took effect minted an id
//! nobody was told directly, so it may take any id the run observed that no
//! answered, non-replayed Start minted: ids in other answers (superseded,
//! cancelled, GetState's active, a replay's response), in calls (Finish,
//! Cancel's only_if) and in the watch recordings' events. With no watch
//! recordings, it may also have minted an id nobody ever observed (one
//! above the last); with them, every Start that took effect is in them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt,
};

use respcoord::{
    ids::{RequestId, ResponseId, SessionId},
    machine::{FinishStatus, Source, TeardownReason},
    session::Call as SpecCall,
};

use crate::{
    history::{Answer, Call, EventKind, Op, Outcome, WatchedEvent},
    report, shrink,
    wgl::{self, Action, Expect, Found, Model, SpecOp, Subject},
};

/// Most (linearized set, state) pairs one session's search may visit before
/// it gives up undecided (about 150 bytes each).
const BUDGET: usize = 4_000_000;

/// What the linearizability check looked at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinearStats {
    pub sessions: usize,
    pub ops: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
    /// (linearized set, model state) pairs the searches visited.
    pub states: usize,
}

impl fmt::Display for LinearStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "linearizable: {} sessions, {} ops ({} ok, {} failed, {} unknown), {} search states",
            self.sessions, self.ops, self.ok, self.failed, self.unknown, self.states
        )
    }
}

/// A history or recording that breaks the contract, with the smallest part
/// of it that still does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which check failed ("linearizability", "watch").
    pub check: &'static str,
    pub session: Option<String>,
    pub reason: String,
    /// What the session may have been before `ops` (linearizability: the
    /// states every order of the earlier calls leaves it in).
    pub states: Vec<String>,
    /// Earlier answered calls that made those states, for the reader.
    pub context: Vec<Op>,
    /// The minimal failing history (linearizability) or the calls a watch
    /// check names.
    pub ops: Vec<Op>,
    /// The call no order can explain (the last of `ops` to complete).
    pub culprit: Option<Op>,
    /// The offending events, with the replica that delivered them.
    pub events: Vec<(usize, WatchedEvent)>,
}

impl Violation {
    pub fn new(check: &'static str, session: Option<&str>, reason: String) -> Self {
        Self {
            check,
            session: session.map(str::to_owned),
            reason,
            states: Vec::new(),
            context: Vec::new(),
            ops: Vec::new(),
            culprit: None,
            events: Vec::new(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        report::violation(self, f)
    }
}

/// Checks every session's operations for linearizability; `watched` (every
/// replica's watch recording) only supplies the ids an unknown Start may
/// have minted.
pub fn check_linearizable(
    ops: &[Op],
    watched: &[Vec<WatchedEvent>],
) -> Result<LinearStats, Box<Violation>> {
    let mut sessions: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        sessions.entry(op.session.as_str()).or_default().push(op);
    }
    let mut stats = LinearStats {
        sessions: sessions.len(),
        ops: ops.len(),
        ..LinearStats::default()
    };
    for op in ops {
        match op.outcome {
            Outcome::Ok(_) => stats.ok += 1,
            Outcome::Failed(_) => stats.failed += 1,
            Outcome::Unknown(_) => stats.unknown += 1,
        }
    }
    // Each session's watched events, gathered in one pass.
    let mut by_session: HashMap<&str, Vec<&WatchedEvent>> = HashMap::new();
    for event in watched.iter().flatten() {
        by_session
            .entry(event.session.as_str())
            .or_default()
            .push(event);
    }
    for (session, recorded) in sessions {
        let id = SessionId::parse(session).map_err(|error| {
            Box::new(Violation::new(
                "linearizability",
                Some(session),
                format!("the history names an invalid session id ({error})"),
            ))
        })?;
        let events = by_session.get(session).map_or(&[][..], Vec::as_slice);
        let problem = Problem::new(id, recorded, events, !watched.is_empty());
        match wgl::search(&problem.subject, &problem.ops, &Model::absent(), BUDGET) {
            Found::Linearizable { states } => stats.states += states,
            Found::Not { .. } => return Err(Box::new(shrink::explain(&problem))),
            Found::Budget { states } => {
                let mut violation = Violation::new(
                    "linearizability",
                    Some(session),
                    format!(
                        "undecided: the search gave up after {states} states \
                         (too many unknown calls in flight at once?)"
                    ),
                );
                violation.ops = problem.recorded.iter().map(|op| (*op).clone()).collect();
                return Err(Box::new(violation));
            }
        }
    }
    Ok(stats)
}

/// One session's history, ready for the search.
pub struct Problem<'a> {
    /// The session and what the watch recordings say of it.
    pub subject: Subject,
    pub recorded: Vec<&'a Op>,
    /// The calls that may have happened (failed ones and unknown GetStates
    /// left out), in recorded order; `SpecOp::source` indexes `recorded`.
    pub ops: Vec<SpecOp>,
    /// The ids an unknown Start may have minted (see the module doc).
    pub candidates: Vec<u64>,
}

impl<'a> Problem<'a> {
    /// `events`: the session's events in every watch recording;
    /// `watch_recorded`: whether there are any recordings at all.
    fn new(
        id: SessionId,
        recorded: Vec<&'a Op>,
        events: &[&WatchedEvent],
        watch_recorded: bool,
    ) -> Self {
        let mut candidates = candidate_ids(&recorded, events);
        if !watch_recorded {
            candidates.push(0);
        }
        let ops = recorded
            .iter()
            .enumerate()
            .filter_map(|(source, op)| spec_op(op, source, &candidates))
            .collect();
        let watched: HashMap<u64, EventKind> = events
            .iter()
            .map(|event| (event.revision, event.kind))
            .collect();
        Self {
            subject: Subject { id, watched },
            recorded,
            ops,
            candidates,
        }
    }

    /// `op` as if its answer had been lost: it may or may not have happened.
    /// An answered Start keeps the id it was answered with.
    pub fn weaken(&self, op: &SpecOp) -> SpecOp {
        let ids = match &op.expect {
            Expect::Answer(Answer::Started {
                response,
                replayed: false,
                ..
            }) => vec![*response],
            _ => self.candidates.clone(),
        };
        SpecOp {
            expect: Expect::Unknown { ids },
            completed: u64::MAX,
            ..op.clone()
        }
    }
}

fn spec_op(op: &Op, source: usize, candidates: &[u64]) -> Option<SpecOp> {
    let response = |id: &Option<u64>| id.and_then(ResponseId::new);
    let action = match &op.call {
        Call::Start { request_id } => Action::Call(SpecCall::Start {
            source: Source::Client,
            request_id: request_id
                .as_deref()
                .and_then(|raw| RequestId::parse_optional(raw).ok().flatten()),
        }),
        Call::Finish { response: id } => Action::Call(SpecCall::Finish {
            response: response(id),
            status: FinishStatus::Completed,
        }),
        Call::Cancel { only_if } => Action::Call(SpecCall::Cancel {
            only_if: response(only_if),
            source: Source::Client,
        }),
        Call::Shutdown => Action::Call(SpecCall::Teardown {
            reason: TeardownReason::Shutdown,
            source: respcoord::machine::Source::Unspecified,
        }),
        Call::GetState => Action::GetState,
    };
    let (expect, completed) = match &op.outcome {
        Outcome::Failed(_) => return None,
        Outcome::Unknown(_) if action == Action::GetState => return None,
        Outcome::Unknown(_) => (
            Expect::Unknown {
                ids: candidates.to_vec(),
            },
            u64::MAX,
        ),
        Outcome::Ok(answer) => (
            Expect::Answer(answer.clone()),
            op.completed.unwrap_or(u64::MAX),
        ),
    };
    Some(SpecOp {
        action,
        expect,
        invoked: op.invoked,
        completed,
        source,
    })
}

/// Observed response ids of `session` that no answered, non-replayed Start
/// minted, ascending.
fn candidate_ids(ops: &[&Op], events: &[&WatchedEvent]) -> Vec<u64> {
    let mut observed = BTreeSet::new();
    let mut minted = HashSet::new();
    for op in ops {
        match op.call {
            Call::Finish { response: Some(id) } | Call::Cancel { only_if: Some(id) } => {
                observed.insert(id);
            }
            _ => {}
        }
        let Outcome::Ok(answer) = &op.outcome else {
            continue;
        };
        match *answer {
            Answer::Started {
                response,
                superseded,
                replayed,
            } => {
                if replayed {
                    observed.insert(response);
                } else {
                    minted.insert(response);
                }
                observed.extend(superseded);
            }
            Answer::Cancelled { cancelled } | Answer::ShutDown { cancelled } => {
                observed.extend(cancelled)
            }
            Answer::State { active, .. } => observed.extend(active),
            Answer::Finished { .. } | Answer::StartRefused | Answer::NotFound => {}
        }
    }
    for event in events {
        match event.kind {
            EventKind::Started { response }
            | EventKind::CancelRequested { response }
            | EventKind::Ended { response } => {
                observed.insert(response);
            }
            EventKind::Terminated => {}
        }
    }
    observed
        .into_iter()
        .filter(|id| *id != 0 && !minted.contains(id))
        .collect()
}
