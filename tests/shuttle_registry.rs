//! Concurrency tests of the real registry under shuttle.
//!
//! Built only with the test-only `shuttle` feature, which makes `src/sync.rs`
//! hand the registry and the event log shuttle's `Mutex` and atomics instead
//! of std's; nothing else in the code under test changes. Shuttle then runs
//! the threads below one step at a time and picks, at every lock and atomic
//! access, which thread goes next (random and PCT schedulers), so each
//! iteration is one interleaving of the real `Registry` code.
//!
//!     cargo test --features shuttle --test shuttle_registry
//!
//! (Only this test target may be run with the feature: shuttle's primitives
//! panic outside a shuttle execution.) `SHUTTLE_ITERATIONS=N` changes the
//! number of schedules per scheduler and scenario (default 1000).
//!
//! After every interleaving the recorded replies and the event log must show:
//! seqs dense and strictly increasing; per session, revisions 1, 2, 3, ... in
//! seq order; at most one live response, exactly one `ended` per `started`
//! (but the one still live), nothing after `terminated`; every reply's state
//! equal to the state the log reaches at that reply's revision, and its
//! events at exactly those revisions (each call one indivisible transition);
//! revisions seen by one thread never going back; watchers opened mid-run
//! (live, resumed from a revision, list-then-watch from a page's seq) getting
//! every later event exactly once and in order.
#![cfg(feature = "shuttle")]

use std::{
    collections::BTreeMap,
    future::Future,
    pin::pin,
    task::{Context, Poll, Waker},
};

use respcoord::{
    error::CoordError,
    events::{Delivery, SharedEvent, Subscription},
    ids::{RequestId, ResponseId, SessionId},
    machine::{CancelReason, EventKind, FinishStatus, Phase, Source, TeardownReason, Terminal},
    registry::{CoordConfig, Page, Registry},
    session::SessionSnapshot,
};
use shuttle::thread;

fn iterations() -> usize {
    std::env::var("SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn registry() -> Registry {
    Registry::new(CoordConfig {
        shards: 2,
        ..CoordConfig::default()
    })
}

fn sid(name: &str) -> SessionId {
    SessionId::parse(name).expect("valid session id")
}

fn rid(name: &str) -> Option<RequestId> {
    RequestId::parse_optional(name).expect("valid request id")
}

// ---------------------------------------------------------------------------
// What the threads record

#[derive(Debug)]
enum Seen {
    Started {
        response: ResponseId,
        superseded: Option<ResponseId>,
        replayed: bool,
        request: Option<&'static str>,
    },
    StartRefused,
    Finished {
        response: ResponseId,
        applied: bool,
    },
    Cancelled {
        only_if: Option<ResponseId>,
        cancelled: Option<ResponseId>,
    },
    ShutDown {
        cancelled: Option<ResponseId>,
    },
    State,
    NotFound,
}

#[derive(Debug)]
struct Record {
    session: &'static str,
    seen: Seen,
    state: Option<SessionSnapshot>,
}

/// One thread's calls, in the order it made them.
struct Caller {
    registry: Option<Registry>,
    records: Vec<Record>,
}

impl Caller {
    fn new(registry: &Registry) -> Self {
        Self {
            registry: Some(registry.clone()),
            records: Vec::new(),
        }
    }

    fn registry(&self) -> &Registry {
        self.registry.as_ref().expect("caller has a registry")
    }

    fn push(&mut self, session: &'static str, seen: Seen, state: Option<SessionSnapshot>) {
        self.records.push(Record {
            session,
            seen,
            state,
        });
    }

    fn refused(&mut self, session: &'static str, error: CoordError) {
        let seen = match error {
            CoordError::SessionTerminated(_) => Seen::StartRefused,
            CoordError::SessionNotFound(_) => Seen::NotFound,
            other => panic!("unexpected error {other:?}"),
        };
        self.push(session, seen, None);
    }

    fn start(
        &mut self,
        session: &'static str,
        source: Source,
        request: Option<&'static str>,
    ) -> Option<ResponseId> {
        let reply = self
            .registry()
            .start(&sid(session), source, request.and_then(rid));
        match reply {
            Ok(started) => {
                let response = started.response;
                let seen = Seen::Started {
                    response,
                    superseded: started.superseded,
                    replayed: started.replayed,
                    request,
                };
                self.push(session, seen, Some(started.state));
                Some(response)
            }
            Err(error) => {
                self.refused(session, error);
                None
            }
        }
    }

    fn finish(&mut self, session: &'static str, response: ResponseId) {
        match self
            .registry()
            .finish(&sid(session), Some(response), FinishStatus::Completed)
        {
            Ok(changed) => {
                let seen = Seen::Finished {
                    response,
                    applied: changed.result,
                };
                self.push(session, seen, Some(changed.state));
            }
            Err(error) => self.refused(session, error),
        }
    }

    fn cancel(&mut self, session: &'static str, only_if: Option<ResponseId>) {
        match self
            .registry()
            .cancel(&sid(session), only_if, Source::Client)
        {
            Ok(changed) => {
                let seen = Seen::Cancelled {
                    only_if,
                    cancelled: changed.result,
                };
                self.push(session, seen, Some(changed.state));
            }
            Err(error) => self.refused(session, error),
        }
    }

    fn shutdown(&mut self, session: &'static str) {
        let changed = self.registry().shutdown(&sid(session)).expect("shutdown");
        let seen = Seen::ShutDown {
            cancelled: changed.result,
        };
        self.push(session, seen, Some(changed.state));
    }

    fn state(&mut self, session: &'static str) -> Option<u64> {
        match self.registry().state(&sid(session)) {
            Ok(snapshot) => {
                let revision = snapshot.revision;
                self.push(session, Seen::State, Some(snapshot));
                Some(revision)
            }
            Err(error) => {
                self.refused(session, error);
                None
            }
        }
    }

    /// Drops the registry handle so the thread's result is plain data.
    fn done(mut self) -> Vec<Record> {
        self.registry = None;
        self.records
    }
}

/// A watcher opened mid-run: what it asked for, and what it got.
struct Watcher {
    /// Session and after_revision, or None for watch-all.
    session: Option<(&'static str, u64)>,
    after_seq: u64,
    /// For list-then-watch: the page the watch resumed from.
    page: Option<Page>,
    subscription: Subscription,
    got: Vec<SharedEvent>,
}

/// Everything a subscription can deliver without waiting. Polls with a no-op
/// waker, so nothing depends on timing.
fn drain_now(subscription: &mut Subscription, into: &mut Vec<SharedEvent>) {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let next = pin!(subscription.next(1024));
        match next.poll(&mut cx) {
            Poll::Pending | Poll::Ready(Ok(Delivery::End)) => return,
            Poll::Ready(Ok(Delivery::Events { events, last })) => {
                into.extend(events);
                if last {
                    return;
                }
            }
            Poll::Ready(Err(lagged)) => panic!("a test watcher lagged: {lagged:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// The checks

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reconstructed {
    phase: Phase,
    responses_started: u64,
}

/// Per session: its events by revision (index 0 unused) and the state the
/// log reaches after each revision (index 0: before any event).
struct SessionLog {
    events: Vec<Option<EventKind>>,
    states: Vec<Reconstructed>,
}

/// Checks the global log and rebuilds every session's history from it.
fn check_log(log: &[SharedEvent], base_seq: u64) -> BTreeMap<String, SessionLog> {
    let mut sessions: BTreeMap<String, SessionLog> = BTreeMap::new();
    for (i, event) in log.iter().enumerate() {
        assert_eq!(event.seq, base_seq + 1 + i as u64, "seqs dense, increasing");
        let session = sessions
            .entry(event.session_id.as_str().to_owned())
            .or_insert_with(|| SessionLog {
                events: vec![None],
                states: vec![Reconstructed {
                    phase: Phase::Idle,
                    responses_started: 0,
                }],
            });
        assert_eq!(
            event.revision,
            session.events.len() as u64,
            "revisions gap-free and in seq order: {event:?}"
        );
        let before = *session.states.last().expect("initial state");
        assert_ne!(
            before.phase,
            Phase::Terminated,
            "event after terminated: {event:?}"
        );
        let live = before.phase.active().map(|a| a.id);
        let mut after = before;
        match event.kind {
            EventKind::Started { response, source } => {
                assert_eq!(live, None, "two live responses: {event:?}");
                let previous = session.events.iter().rev().find_map(|e| match e {
                    Some(EventKind::Started { response, .. }) => Some(*response),
                    _ => None,
                });
                assert!(
                    previous.is_none_or(|p| p < response),
                    "response ids increase"
                );
                after.phase = Phase::Active(respcoord::machine::ActiveResponse {
                    id: response,
                    source,
                });
                after.responses_started += 1;
            }
            EventKind::CancelRequested { response, .. } => {
                assert_eq!(live, Some(response), "cancel of a response not live");
            }
            EventKind::Ended { response, ending } => {
                assert_eq!(live, Some(response), "end of a response not live");
                if let Terminal::Cancelled(reason) = ending {
                    assert!(
                        matches!(
                            session.events.last().copied().flatten(),
                            Some(EventKind::CancelRequested { response: r, reason: why, .. })
                                if r == response && why == reason
                        ),
                        "a cancelled end follows its cancel_requested"
                    );
                }
                after.phase = Phase::Idle;
            }
            EventKind::Terminated { .. } => {
                assert_eq!(live, None, "terminated with a live response");
                after.phase = Phase::Terminated;
            }
        }
        session.events.push(Some(event.kind));
        session.states.push(after);
    }
    // Exactly one terminal per started response, but the one still live.
    for (name, session) in &sessions {
        let kinds = session.events.iter().flatten();
        let started = kinds
            .clone()
            .filter(|k| matches!(k, EventKind::Started { .. }))
            .count();
        let ended = kinds
            .filter(|k| matches!(k, EventKind::Ended { .. }))
            .count();
        let live = usize::from(
            session
                .states
                .last()
                .is_some_and(|s| s.phase.active().is_some()),
        );
        assert_eq!(started, ended + live, "{name}: started vs ended");
    }
    sessions
}

fn event_at(sessions: &BTreeMap<String, SessionLog>, session: &str, revision: u64) -> EventKind {
    sessions[session].events[revision as usize].expect("an event at that revision")
}

/// Every reply against the log: its state is the log's state at its
/// revision, and the events it caused sit exactly at the revisions just
/// before it.
fn check_replies(threads: &[Vec<Record>], sessions: &BTreeMap<String, SessionLog>) {
    // The one non-replayed Start per (session, request id).
    let mut originals: BTreeMap<(&str, &str), (ResponseId, Option<ResponseId>)> = BTreeMap::new();
    for record in threads.iter().flatten() {
        if let Seen::Started {
            response,
            superseded,
            replayed: false,
            request: Some(request),
        } = record.seen
        {
            let first = originals.insert((record.session, request), (response, superseded));
            assert_eq!(first, None, "a request id applied twice");
        }
    }
    for records in threads {
        let mut last_revision: BTreeMap<&str, u64> = BTreeMap::new();
        for record in records {
            let Some(state) = &record.state else {
                match record.seen {
                    Seen::StartRefused => assert!(
                        sessions[record.session]
                            .events
                            .iter()
                            .any(|e| matches!(e, Some(EventKind::Terminated { .. }))),
                        "start refused on a session that never terminated"
                    ),
                    Seen::NotFound => {}
                    ref other => panic!("reply without a state: {other:?}"),
                }
                continue;
            };
            let session = &sessions[record.session];
            let r = state.revision;
            let at = session.states[r as usize];
            assert_eq!(
                (state.phase, state.responses_started),
                (at.phase, at.responses_started),
                "reply state differs from the log's at revision {r}: {record:?}"
            );
            let previous = last_revision.insert(record.session, r).unwrap_or(0);
            assert!(previous <= r, "revisions went back within one thread");
            let before = |n: u64| session.states[(r - n) as usize].phase;
            match record.seen {
                Seen::Started {
                    response,
                    superseded,
                    replayed: false,
                    ..
                } => {
                    assert!(matches!(
                        event_at(sessions, record.session, r),
                        EventKind::Started { response: id, .. } if id == response
                    ));
                    match superseded {
                        Some(old) => {
                            assert_eq!(
                                event_at(sessions, record.session, r - 1),
                                EventKind::Ended {
                                    response: old,
                                    ending: Terminal::Cancelled(CancelReason::Superseded)
                                }
                            );
                            assert_eq!(before(3).active().map(|a| a.id), Some(old));
                        }
                        None => assert_eq!(before(1), Phase::Idle),
                    }
                }
                Seen::Started {
                    response,
                    superseded,
                    replayed: true,
                    request,
                } => {
                    let request = request.expect("only starts with a request id replay");
                    assert_eq!(
                        originals.get(&(record.session, request)),
                        Some(&(response, superseded)),
                        "a replay answers the original start"
                    );
                }
                Seen::Finished {
                    response,
                    applied: true,
                } => {
                    assert_eq!(
                        event_at(sessions, record.session, r),
                        EventKind::Ended {
                            response,
                            ending: Terminal::Completed
                        }
                    );
                    assert_eq!(before(1).active().map(|a| a.id), Some(response));
                }
                Seen::Finished {
                    response,
                    applied: false,
                } => assert_ne!(state.phase.active().map(|a| a.id), Some(response)),
                Seen::Cancelled {
                    cancelled: Some(id),
                    ..
                } => {
                    assert_eq!(
                        event_at(sessions, record.session, r),
                        EventKind::Ended {
                            response: id,
                            ending: Terminal::Cancelled(CancelReason::Requested)
                        }
                    );
                    assert_eq!(before(2).active().map(|a| a.id), Some(id));
                }
                Seen::Cancelled {
                    only_if,
                    cancelled: None,
                } => {
                    if let Some(active) = state.phase.active() {
                        assert!(only_if.is_some_and(|id| id != active.id));
                    }
                }
                Seen::ShutDown { cancelled } => {
                    assert_eq!(state.phase, Phase::Terminated);
                    let terminated_at = session
                        .events
                        .iter()
                        .position(|e| matches!(e, Some(EventKind::Terminated { .. })))
                        .expect("a terminated event")
                        as u64;
                    if cancelled.is_none() && terminated_at == r {
                        assert_eq!(before(1), Phase::Idle, "shutdown of an idle session");
                    }
                    if let Some(id) = cancelled {
                        assert_eq!(terminated_at, r, "shutdown's own terminated");
                        assert_eq!(
                            event_at(sessions, record.session, r - 1),
                            EventKind::Ended {
                                response: id,
                                ending: Terminal::Cancelled(CancelReason::Shutdown)
                            }
                        );
                    }
                    assert!(matches!(
                        event_at(sessions, record.session, terminated_at),
                        EventKind::Terminated {
                            reason: TeardownReason::Shutdown
                        }
                    ));
                }
                Seen::State => {}
                Seen::StartRefused | Seen::NotFound => unreachable!("no state"),
            }
        }
    }
}

/// Watchers opened mid-run got every later event once, in order.
fn check_watchers(watchers: &mut [Watcher], log: &[SharedEvent]) {
    for watcher in watchers {
        drain_now(&mut watcher.subscription, &mut watcher.got);
        let expected: Vec<&SharedEvent> = match watcher.session {
            Some((session, after_revision)) => log
                .iter()
                .filter(|e| e.session_id.as_str() == session && e.revision > after_revision)
                .collect(),
            None => log.iter().filter(|e| e.seq > watcher.after_seq).collect(),
        };
        let got: Vec<(u64, &str, u64)> = watcher
            .got
            .iter()
            .map(|e| (e.seq, e.session_id.as_str(), e.revision))
            .collect();
        let want: Vec<(u64, &str, u64)> = expected
            .iter()
            .map(|e| (e.seq, e.session_id.as_str(), e.revision))
            .collect();
        assert_eq!(got, want, "watcher {:?}", watcher.session);
        // List-then-watch: the page plus the events after its seq rebuild
        // every session with no gap.
        if let Some(page) = &watcher.page {
            for event in log.iter().filter(|e| e.seq <= page.seq) {
                let listed = page
                    .sessions
                    .iter()
                    .find(|s| s.session_id == event.session_id)
                    .expect("a session with an event at or below the page seq is listed");
                assert!(listed.revision >= event.revision, "page misses an event");
            }
            for listed in &page.sessions {
                let mut revision = listed.revision;
                for event in watcher
                    .got
                    .iter()
                    .filter(|e| e.session_id == listed.session_id)
                {
                    if event.revision <= revision {
                        continue; // already reflected in the listed state
                    }
                    assert_eq!(event.revision, revision + 1, "gap after the listing");
                    revision = event.revision;
                }
            }
        }
    }
}

/// What one caller thread does.
type Body = Box<dyn FnOnce(&mut Caller) + Send>;

/// Runs one interleaving: `threads` call the registry concurrently while an
/// observer lists and opens watches; then everything is checked.
fn run(threads: Vec<Body>, watched: &'static str) {
    let registry = registry();
    let base_seq = registry.published_seq();
    let mut from_start_live = registry.watch_all(None).expect("watch all");
    let mut session_live = registry
        .watch_session(&sid(watched), Some(0))
        .expect("watch session");

    let mut handles = Vec::new();
    for body in threads {
        let mut caller = Caller::new(&registry);
        handles.push(thread::spawn(move || {
            body(&mut caller);
            caller.done()
        }));
    }
    // The observer: a state read and a resume from it, a list-then-watch,
    // and a live watch-all from whatever is published by then.
    let observer = {
        let mut caller = Caller::new(&registry);
        thread::spawn(move || {
            let mut watchers = Vec::new();
            let registry = caller.registry().clone();
            if let Some(revision) = caller.state(watched) {
                let subscription = registry
                    .watch_session(&sid(watched), Some(revision))
                    .expect("resume from a state's revision");
                watchers.push(Watcher {
                    session: Some((watched, revision)),
                    after_seq: 0,
                    page: None,
                    subscription,
                    got: Vec::new(),
                });
            }
            let page = registry.list(100, None).expect("list");
            let subscription = registry
                .watch_all(Some(page.seq))
                .expect("watch after page");
            watchers.push(Watcher {
                session: None,
                after_seq: page.seq,
                page: Some(page),
                subscription,
                got: Vec::new(),
            });
            let published = registry.published_seq();
            let subscription = registry.watch_all(Some(published)).expect("watch all");
            watchers.push(Watcher {
                session: None,
                after_seq: published,
                page: None,
                subscription,
                got: Vec::new(),
            });
            for watcher in &mut watchers {
                drain_now(&mut watcher.subscription, &mut watcher.got);
            }
            (caller.done(), watchers)
        })
    };

    let mut results: Vec<Vec<Record>> = handles
        .into_iter()
        .map(|h| h.join().expect("caller thread"))
        .collect();
    let (observed, mut watchers) = observer.join().expect("observer thread");
    results.push(observed);

    let mut log = Vec::new();
    drain_now(&mut registry.watch_all(Some(0)).expect("replay"), &mut log);
    assert!(!log.is_empty(), "the scenario produced events");
    assert_eq!(registry.published_seq(), log.last().expect("events").seq);
    let sessions = check_log(&log, base_seq);
    check_replies(&results, &sessions);

    // Watchers opened before the first call saw the log exactly.
    let mut live = Vec::new();
    drain_now(&mut from_start_live, &mut live);
    assert_eq!(live, log, "watch-all opened before the run");
    let mut session_events = Vec::new();
    drain_now(&mut session_live, &mut session_events);
    let watched_log: Vec<SharedEvent> = log
        .iter()
        .filter(|e| e.session_id.as_str() == watched)
        .cloned()
        .collect();
    assert_eq!(
        session_events, watched_log,
        "session watch opened before the run"
    );
    check_watchers(&mut watchers, &log);

    // Final states agree with the log.
    for (name, session) in &sessions {
        let snapshot = registry.state(&sid(name)).expect("state");
        let end = session.states.last().expect("final state");
        assert_eq!(snapshot.revision, session.events.len() as u64 - 1);
        assert_eq!(
            (snapshot.phase, snapshot.responses_started),
            (end.phase, end.responses_started)
        );
    }
}

// ---------------------------------------------------------------------------
// Scenarios

/// Several callers on one session: starts that supersede each other, a
/// retried request id, finishes and cancels fenced by id.
fn one_session() {
    run(
        vec![
            Box::new(|c: &mut Caller| {
                if let Some(id) = c.start("s", Source::Client, Some("a")) {
                    c.finish("s", id);
                }
                c.start("s", Source::Vad, None);
            }),
            Box::new(|c: &mut Caller| {
                let id = c.start("s", Source::Vad, None);
                c.cancel("s", id);
                c.state("s");
            }),
            Box::new(|c: &mut Caller| {
                c.start("s", Source::Client, Some("a"));
                c.cancel("s", None);
            }),
        ],
        "s",
    );
}

/// Shutdown racing starts on one session, next to calls on another: nothing
/// starts after teardown, and the two sessions share one global order.
fn teardown_race() {
    run(
        vec![
            Box::new(|c: &mut Caller| {
                let id = c.start("s", Source::Client, None);
                c.start("t", Source::Client, None);
                if let Some(id) = id {
                    c.finish("s", id);
                }
            }),
            Box::new(|c: &mut Caller| {
                c.shutdown("s");
                c.start("s", Source::Client, None);
            }),
            Box::new(|c: &mut Caller| {
                c.start("s", Source::Vad, Some("b"));
                c.start("s", Source::Vad, Some("b"));
            }),
            Box::new(|c: &mut Caller| {
                c.cancel("t", None);
                c.start("t", Source::Vad, Some("b"));
                c.shutdown("t");
            }),
        ],
        "s",
    );
}

#[test]
fn one_session_random_schedules() {
    shuttle::check_random(one_session, iterations());
}

#[test]
fn one_session_pct_schedules() {
    shuttle::check_pct(one_session, iterations(), 3);
}

#[test]
fn teardown_race_random_schedules() {
    shuttle::check_random(teardown_race, iterations());
}

#[test]
fn teardown_race_pct_schedules() {
    shuttle::check_pct(teardown_race, iterations(), 3);
}
