//! Property tests: random operation sequences run against the real
//! [`Registry`] and, side by side, against a deliberately naive reference
//! model written here from the contract's semantics table (it shares no logic
//! with `respcoord::machine` or `respcoord::session`).
//!
//! After every operation the two replies must agree (error kind, applied,
//! cancelled id, replayed, phase, revision, responses_started); at the end the
//! whole event stream (read back through `watch_all(Some(0))`, a live
//! watch-all and per-session watches opened before the first call) must be the
//! model's, with seqs strictly increasing and dense.
//!
//! Response ids are minted by the coordinator, so the model learns each new
//! id from the Start reply and only checks its relations: nonzero and strictly
//! greater than every id the session used before (hence never reused).
//!
//! Cases: 1024 by default, `PROPTEST_CASES=N` to change it; sequences of 1 to
//! 63 operations over 4 session ids, 1 to 4 shards, a session limit of 2 to 5.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    pin::pin,
    task::{Context, Poll, Waker},
};

use proptest::{prelude::*, test_runner::FileFailurePersistence};
use respcoord::{
    error::CoordError,
    events::{Delivery, SharedEvent, Subscription},
    ids::{RequestId, ResponseId, SessionId},
    machine::{self, CancelReason, EventKind, FinishStatus, TeardownReason, Terminal},
    registry::{CoordConfig, Registry},
    session::SessionSnapshot,
};

const SESSIONS: [&str; 4] = ["s0", "s1", "s2", "s3"];
/// A small pool, so retries (replays) are frequent. Fewer than the replay
/// window per session, so the model never has to guess what was forgotten.
const REQUEST_IDS: [&str; 5] = ["r0", "r1", "r2", "r3", "r4"];
/// An id the coordinator never mints in a test (its ids are near "now" in ns).
const NEVER_ISSUED: u64 = u64::MAX;

// ---------------------------------------------------------------------------
// Operations

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    Unspecified,
    Client,
    Vad,
}

/// Which response id an operation names; resolved against what has been
/// issued so far when the operation runs (so shrinking keeps it meaningful).
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// The session's active response, else its latest one, else 0.
    Current,
    /// Index into every id issued so far (any session), plus 0 and an id
    /// that was never issued.
    Other(usize),
}

#[derive(Clone, Debug)]
enum Op {
    Start {
        s: usize,
        source: Src,
        request: Option<usize>,
    },
    Finish {
        s: usize,
        id: Pick,
        failed: bool,
    },
    Cancel {
        s: usize,
        only_if: Option<Pick>,
    },
    Shutdown {
        s: usize,
    },
    GetState {
        s: usize,
    },
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![3 => Just(Pick::Current), 2 => (0usize..64).prop_map(Pick::Other)]
}

fn op() -> impl Strategy<Value = Op> {
    let s = || 0..SESSIONS.len();
    let source = prop_oneof![Just(Src::Unspecified), Just(Src::Client), Just(Src::Vad)];
    prop_oneof![
        6 => (s(), source, proptest::option::of(0..REQUEST_IDS.len()))
            .prop_map(|(s, source, request)| Op::Start { s, source, request }),
        4 => (s(), pick(), any::<bool>()).prop_map(|(s, id, failed)| Op::Finish { s, id, failed }),
        3 => (s(), proptest::option::of(pick())).prop_map(|(s, only_if)| Op::Cancel { s, only_if }),
        1 => s().prop_map(|s| Op::Shutdown { s }),
        2 => s().prop_map(|s| Op::GetState { s }),
    ]
}

// ---------------------------------------------------------------------------
// What both sides answer, in one comparable shape

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RPhase {
    Idle,
    Active { id: u64, source: Src },
    Terminated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RState {
    phase: RPhase,
    revision: u64,
    responses_started: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RErr {
    NotFound,
    Terminated,
    Limit,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    Err(RErr),
    Started {
        id: u64,
        superseded: u64,
        replayed: bool,
        state: RState,
    },
    Finished {
        applied: bool,
        state: RState,
    },
    Cancelled {
        cancelled: u64,
        state: RState,
    },
    ShutDown {
        cancelled: u64,
        state: RState,
    },
    State(RState),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Superseded,
    Requested,
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum REvent {
    Started(u64, Src),
    CancelRequested(u64, Why),
    Ended(u64, REnd),
    Terminated(Why),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum REnd {
    Completed,
    Failed,
    Cancelled(Why),
}

// ---------------------------------------------------------------------------
// The reference model: the semantics table, written out naively

#[derive(Debug)]
struct RefSession {
    phase: RPhase,
    revision: u64,
    responses_started: u64,
    /// Every response id this session started, in order.
    issued: Vec<u64>,
    /// request_id -> (response, superseded) of the Start that applied it.
    requests: BTreeMap<usize, (u64, u64)>,
}

#[derive(Debug)]
struct Model {
    max_sessions: usize,
    sessions: BTreeMap<usize, RefSession>,
    /// (session index, revision, event), in emission order.
    events: Vec<(usize, u64, REvent)>,
}

impl Model {
    fn new(max_sessions: usize) -> Self {
        Self {
            max_sessions,
            sessions: BTreeMap::new(),
            events: Vec::new(),
        }
    }

    fn state(&self, s: usize) -> RState {
        let session = &self.sessions[&s];
        RState {
            phase: session.phase,
            revision: session.revision,
            responses_started: session.responses_started,
        }
    }

    fn emit(&mut self, s: usize, event: REvent) {
        let session = self.sessions.get_mut(&s).expect("emitting session exists");
        session.revision += 1;
        if let REvent::Started(..) = event {
            session.responses_started += 1;
        }
        self.events.push((s, session.revision, event));
    }

    /// Creates `s` if missing; false if the session limit forbids it.
    fn create(&mut self, s: usize) -> bool {
        if self.sessions.contains_key(&s) {
            return true;
        }
        if self.sessions.len() >= self.max_sessions {
            return false;
        }
        self.sessions.insert(
            s,
            RefSession {
                phase: RPhase::Idle,
                revision: 0,
                responses_started: 0,
                issued: Vec::new(),
                requests: BTreeMap::new(),
            },
        );
        true
    }

    /// The id an operation's `Pick` names right now.
    fn resolve(&self, s: usize, pick: Pick) -> u64 {
        match pick {
            Pick::Current => match self.sessions.get(&s) {
                Some(RefSession {
                    phase: RPhase::Active { id, .. },
                    ..
                }) => *id,
                Some(session) => session.issued.last().copied().unwrap_or(0),
                None => 0,
            },
            Pick::Other(k) => {
                let mut pool: Vec<u64> = self
                    .sessions
                    .values()
                    .flat_map(|session| session.issued.iter().copied())
                    .collect();
                pool.sort_unstable();
                pool.push(0);
                pool.push(NEVER_ISSUED);
                pool[k % pool.len()]
            }
        }
    }

    /// Applies `op`. `minted` is the id the real coordinator answered a Start
    /// with: used (after checking it) only if the model says a new response
    /// starts here.
    fn apply(&mut self, op: &Op, resolved: u64, minted: Option<u64>) -> Reply {
        match *op {
            Op::Start { s, source, request } => {
                if !self.create(s) {
                    return Reply::Err(RErr::Limit);
                }
                if let Some(r) = request {
                    if let Some(&(id, superseded)) = self.sessions[&s].requests.get(&r) {
                        return Reply::Started {
                            id,
                            superseded,
                            replayed: true,
                            state: self.state(s),
                        };
                    }
                }
                let phase = self.sessions[&s].phase;
                let superseded = match phase {
                    RPhase::Terminated => return Reply::Err(RErr::Terminated),
                    RPhase::Idle => 0,
                    RPhase::Active { id, .. } => id,
                };
                let new = minted.expect("the coordinator started a response too");
                let session = &self.sessions[&s];
                assert_ne!(new, 0, "response ids are nonzero");
                if let Some(&last) = session.issued.last() {
                    assert!(
                        new > last,
                        "response ids strictly increase within a session: {new} after {last}"
                    );
                }
                if superseded != 0 {
                    self.emit(s, REvent::CancelRequested(superseded, Why::Superseded));
                    self.emit(
                        s,
                        REvent::Ended(superseded, REnd::Cancelled(Why::Superseded)),
                    );
                }
                self.emit(s, REvent::Started(new, source));
                let session = self.sessions.get_mut(&s).expect("exists");
                session.phase = RPhase::Active { id: new, source };
                session.issued.push(new);
                if let Some(r) = request {
                    session.requests.insert(r, (new, superseded));
                }
                Reply::Started {
                    id: new,
                    superseded,
                    replayed: false,
                    state: self.state(s),
                }
            }
            Op::Finish { s, failed, .. } => {
                let Some(session) = self.sessions.get(&s) else {
                    return Reply::Err(RErr::NotFound);
                };
                let applied = match session.phase {
                    RPhase::Active { id, .. } if id == resolved => {
                        let end = if failed {
                            REnd::Failed
                        } else {
                            REnd::Completed
                        };
                        self.emit(s, REvent::Ended(id, end));
                        self.sessions.get_mut(&s).expect("exists").phase = RPhase::Idle;
                        true
                    }
                    _ => false,
                };
                Reply::Finished {
                    applied,
                    state: self.state(s),
                }
            }
            Op::Cancel { s, only_if } => {
                let Some(session) = self.sessions.get(&s) else {
                    return Reply::Err(RErr::NotFound);
                };
                let cancelled = match session.phase {
                    // if_response_id 0 is no condition at all.
                    RPhase::Active { id, .. }
                        if only_if.is_none() || resolved == 0 || resolved == id =>
                    {
                        self.emit(s, REvent::CancelRequested(id, Why::Requested));
                        self.emit(s, REvent::Ended(id, REnd::Cancelled(Why::Requested)));
                        self.sessions.get_mut(&s).expect("exists").phase = RPhase::Idle;
                        id
                    }
                    _ => 0,
                };
                Reply::Cancelled {
                    cancelled,
                    state: self.state(s),
                }
            }
            Op::Shutdown { s } => {
                if !self.create(s) {
                    return Reply::Err(RErr::Limit);
                }
                let cancelled = match self.sessions[&s].phase {
                    RPhase::Terminated => {
                        return Reply::ShutDown {
                            cancelled: 0,
                            state: self.state(s),
                        }
                    }
                    RPhase::Idle => 0,
                    RPhase::Active { id, .. } => {
                        self.emit(s, REvent::CancelRequested(id, Why::Shutdown));
                        self.emit(s, REvent::Ended(id, REnd::Cancelled(Why::Shutdown)));
                        id
                    }
                };
                self.emit(s, REvent::Terminated(Why::Shutdown));
                self.sessions.get_mut(&s).expect("exists").phase = RPhase::Terminated;
                Reply::ShutDown {
                    cancelled,
                    state: self.state(s),
                }
            }
            Op::GetState { s } => match self.sessions.get(&s) {
                None => Reply::Err(RErr::NotFound),
                Some(_) => Reply::State(self.state(s)),
            },
        }
    }
}

// ---------------------------------------------------------------------------
// The real registry, its answers translated into the shapes above

fn sid(s: usize) -> SessionId {
    SessionId::parse(SESSIONS[s]).expect("valid session id")
}

fn to_source(src: Src) -> machine::Source {
    match src {
        Src::Unspecified => machine::Source::Unspecified,
        Src::Client => machine::Source::Client,
        Src::Vad => machine::Source::Vad,
    }
}

fn from_source(src: machine::Source) -> Src {
    match src {
        machine::Source::Unspecified => Src::Unspecified,
        machine::Source::Client => Src::Client,
        machine::Source::Vad => Src::Vad,
    }
}

fn state_of(snapshot: &SessionSnapshot) -> RState {
    RState {
        phase: match snapshot.phase {
            machine::Phase::Idle => RPhase::Idle,
            machine::Phase::Active(active) => RPhase::Active {
                id: active.id.get(),
                source: from_source(active.source),
            },
            machine::Phase::Terminated => RPhase::Terminated,
        },
        revision: snapshot.revision,
        responses_started: snapshot.responses_started,
    }
}

fn err_of(error: CoordError) -> RErr {
    match error {
        CoordError::SessionNotFound(_) => RErr::NotFound,
        CoordError::SessionTerminated(_) => RErr::Terminated,
        CoordError::SessionLimit { .. } => RErr::Limit,
        other => {
            panic!("the registry answered an error the contract does not allow here: {other:?}")
        }
    }
}

fn raw(id: Option<ResponseId>) -> u64 {
    id.map_or(0, ResponseId::get)
}

fn why_of(reason: CancelReason) -> Why {
    match reason {
        CancelReason::Superseded => Why::Superseded,
        CancelReason::Requested => Why::Requested,
        CancelReason::Shutdown => Why::Shutdown,
        CancelReason::Expired => panic!("nothing expires in these tests"),
    }
}

fn event_of(kind: &EventKind) -> REvent {
    match *kind {
        EventKind::Started { response, source } => {
            REvent::Started(response.get(), from_source(source))
        }
        EventKind::CancelRequested {
            response, reason, ..
        } => REvent::CancelRequested(response.get(), why_of(reason)),
        EventKind::Ended { response, ending } => REvent::Ended(
            response.get(),
            match ending {
                Terminal::Completed => REnd::Completed,
                Terminal::Failed => REnd::Failed,
                Terminal::Cancelled(reason) => REnd::Cancelled(why_of(reason)),
            },
        ),
        EventKind::Terminated { reason } => REvent::Terminated(match reason {
            TeardownReason::Shutdown => Why::Shutdown,
            TeardownReason::Expired => panic!("nothing expires in these tests"),
        }),
    }
}

fn run_real(registry: &Registry, op: &Op, resolved: u64) -> Reply {
    match *op {
        Op::Start { s, source, request } => {
            let request = request.map(|r| {
                RequestId::parse_optional(REQUEST_IDS[r])
                    .expect("valid")
                    .expect("non-empty")
            });
            match registry.start(&sid(s), to_source(source), request) {
                Ok(started) => Reply::Started {
                    id: started.response.get(),
                    superseded: raw(started.superseded),
                    replayed: started.replayed,
                    state: state_of(&started.state),
                },
                Err(e) => Reply::Err(err_of(e)),
            }
        }
        Op::Finish { s, failed, .. } => {
            let status = if failed {
                FinishStatus::Failed
            } else {
                FinishStatus::Completed
            };
            match registry.finish(&sid(s), ResponseId::new(resolved), status) {
                Ok(changed) => Reply::Finished {
                    applied: changed.result,
                    state: state_of(&changed.state),
                },
                Err(e) => Reply::Err(err_of(e)),
            }
        }
        Op::Cancel { s, only_if } => {
            let only_if = only_if.and_then(|_| ResponseId::new(resolved));
            match registry.cancel(&sid(s), only_if, machine::Source::Client) {
                Ok(changed) => Reply::Cancelled {
                    cancelled: raw(changed.result),
                    state: state_of(&changed.state),
                },
                Err(e) => Reply::Err(err_of(e)),
            }
        }
        Op::Shutdown { s } => match registry.shutdown(&sid(s)) {
            Ok(changed) => Reply::ShutDown {
                cancelled: raw(changed.result),
                state: state_of(&changed.state),
            },
            Err(e) => Reply::Err(err_of(e)),
        },
        Op::GetState { s } => match registry.state(&sid(s)) {
            Ok(snapshot) => Reply::State(state_of(&snapshot)),
            Err(e) => Reply::Err(err_of(e)),
        },
    }
}

/// Everything a subscription can deliver without waiting, and whether it
/// ended. Polls with a no-op waker: every event is already published by the
/// time this runs, so nothing here depends on timing.
fn drain_now(subscription: &mut Subscription) -> (Vec<SharedEvent>, bool) {
    let mut out = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let next = pin!(subscription.next(1024));
        match next.poll(&mut cx) {
            Poll::Pending => return (out, false),
            Poll::Ready(Ok(Delivery::Events { events, last })) => {
                out.extend(events);
                if last {
                    return (out, true);
                }
            }
            Poll::Ready(Ok(Delivery::End)) => return (out, true),
            Poll::Ready(Err(lagged)) => panic!("a test watcher lagged: {lagged:?}"),
        }
    }
}

fn index_of(session: &SessionId) -> usize {
    SESSIONS
        .iter()
        .position(|s| *s == session.as_str())
        .expect("an event of a session the test used")
}

// ---------------------------------------------------------------------------
// The property

fn check(ops: &[Op], shards: usize, max_sessions: usize) -> Result<(), TestCaseError> {
    let registry = Registry::new(CoordConfig {
        shards,
        max_sessions,
        ..CoordConfig::default()
    });
    let base = registry.published_seq();
    let mut live_all = registry.watch_all(None).expect("watch all");
    let mut live_sessions: Vec<Subscription> = (0..SESSIONS.len())
        .map(|s| registry.watch_session(&sid(s), Some(0)).expect("watch"))
        .collect();
    let mut model = Model::new(max_sessions);

    for (step, op) in ops.iter().enumerate() {
        let s = match *op {
            Op::Start { s, .. }
            | Op::Finish { s, .. }
            | Op::Cancel { s, .. }
            | Op::Shutdown { s }
            | Op::GetState { s } => s,
        };
        let resolved = match *op {
            Op::Finish { id, .. } => model.resolve(s, id),
            Op::Cancel {
                only_if: Some(id), ..
            } => model.resolve(s, id),
            _ => 0,
        };
        let real = run_real(&registry, op, resolved);
        let minted = match real {
            Reply::Started { id, .. } => Some(id),
            _ => None,
        };
        let expected = model.apply(op, resolved, minted);
        prop_assert_eq!(
            &real,
            &expected,
            "step {} {:?} (resolved id {})",
            step,
            op,
            resolved
        );
    }

    // The full event stream, read back from the retained log.
    let mut from_start = registry.watch_all(Some(0)).expect("watch all from 0");
    let (log, ended) = drain_now(&mut from_start);
    prop_assert!(!ended, "a watch-all never ends by itself");
    let got: Vec<(usize, u64, REvent)> = log
        .iter()
        .map(|e| (index_of(&e.session_id), e.revision, event_of(&e.kind)))
        .collect();
    prop_assert_eq!(&got, &model.events, "event stream");
    for (i, event) in log.iter().enumerate() {
        prop_assert_eq!(event.seq, base + 1 + i as u64, "seqs dense from the base");
    }
    prop_assert_eq!(registry.published_seq(), base + log.len() as u64);

    // The same stream, as a live watcher opened before the first call saw it.
    let (live, _) = drain_now(&mut live_all);
    let seqs = |events: &[SharedEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    prop_assert_eq!(seqs(&live), seqs(&log), "live watch-all");
    prop_assert!(live.iter().zip(&log).all(|(a, b)| a == b));

    // Each session's watcher: exactly its events, ending after `terminated`.
    for (s, subscription) in live_sessions.iter_mut().enumerate() {
        let (events, ended) = drain_now(subscription);
        let want: Vec<&SharedEvent> = log
            .iter()
            .filter(|e| index_of(&e.session_id) == s)
            .collect();
        prop_assert_eq!(events.len(), want.len(), "session {} watch", s);
        prop_assert!(events.iter().zip(&want).all(|(a, b)| a == *b));
        let terminated = model
            .sessions
            .get(&s)
            .is_some_and(|session| session.phase == RPhase::Terminated);
        prop_assert_eq!(ended, terminated, "session {} watch ends iff terminated", s);
    }

    // Final states: GetState-free listing agrees with the model.
    let page = registry.list(1000, None).expect("list");
    prop_assert!(page.next.is_none());
    prop_assert_eq!(page.seq, registry.published_seq());
    let listed: BTreeMap<usize, RState> = page
        .sessions
        .iter()
        .map(|snapshot| (index_of(&snapshot.session_id), state_of(snapshot)))
        .collect();
    let modelled: BTreeMap<usize, RState> = model
        .sessions
        .keys()
        .map(|&s| (s, model.state(s)))
        .collect();
    prop_assert_eq!(listed, modelled);
    prop_assert_eq!(registry.session_count(), model.sessions.len());

    // Ids: one `started` per id, never reused anywhere in the stream.
    let started: Vec<u64> = model
        .events
        .iter()
        .filter_map(|(_, _, e)| match e {
            REvent::Started(id, _) => Some(*id),
            _ => None,
        })
        .collect();
    let distinct: BTreeSet<u64> = started.iter().copied().collect();
    prop_assert_eq!(distinct.len(), started.len(), "a response id was reused");
    Ok(())
}

/// 1024 cases (about 2 s in a debug build); `PROPTEST_CASES=N` overrides.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    ProptestConfig {
        cases,
        // A failing case is saved beside this file
        // (registry_properties.proptest-regressions) and retried first.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn registry_matches_the_reference_model(
        ops in proptest::collection::vec(op(), 1..64),
        shards in 1usize..=4,
        max_sessions in 2usize..=5,
    ) {
        check(&ops, shards, max_sessions)?;
    }
}

/// The model and the comparison are not vacuous: a hand-written sequence
/// covering every row of the semantics table passes, and the model rejects a
/// registry answer that differs.
#[test]
fn a_fixed_sequence_covers_every_row() {
    use Op::*;
    let ops = [
        Start {
            s: 0,
            source: Src::Client,
            request: Some(0),
        },
        Start {
            s: 0,
            source: Src::Vad,
            request: Some(1),
        },
        Start {
            s: 0,
            source: Src::Vad,
            request: Some(0),
        },
        Finish {
            s: 0,
            id: Pick::Other(0),
            failed: false,
        },
        Finish {
            s: 0,
            id: Pick::Current,
            failed: true,
        },
        Finish {
            s: 0,
            id: Pick::Current,
            failed: false,
        },
        Start {
            s: 0,
            source: Src::Unspecified,
            request: None,
        },
        Cancel {
            s: 0,
            only_if: Some(Pick::Other(0)),
        },
        Cancel {
            s: 0,
            only_if: Some(Pick::Current),
        },
        Cancel {
            s: 0,
            only_if: None,
        },
        Start {
            s: 1,
            source: Src::Client,
            request: None,
        },
        Shutdown { s: 1 },
        Shutdown { s: 1 },
        Start {
            s: 1,
            source: Src::Client,
            request: None,
        },
        Shutdown { s: 2 },
        GetState { s: 3 },
        Finish {
            s: 3,
            id: Pick::Current,
            failed: false,
        },
        Cancel {
            s: 3,
            only_if: None,
        },
        Start {
            s: 3,
            source: Src::Client,
            request: None,
        },
        Start {
            s: 0,
            source: Src::Client,
            request: Some(0),
        },
    ];
    check(&ops, 2, 3).expect("the fixed sequence agrees with the model");

    let mut model = Model::new(1);
    assert_eq!(
        model.apply(
            &Start {
                s: 0,
                source: Src::Vad,
                request: None
            },
            0,
            Some(7)
        ),
        Reply::Started {
            id: 7,
            superseded: 0,
            replayed: false,
            state: RState {
                phase: RPhase::Active {
                    id: 7,
                    source: Src::Vad
                },
                revision: 1,
                responses_started: 1,
            },
        }
    );
    assert_eq!(
        model.apply(&Shutdown { s: 1 }, 0, None),
        Reply::Err(RErr::Limit)
    );
    assert_eq!(model.events.len(), 1);
}
