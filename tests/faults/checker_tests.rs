//! The checker on hand-made histories: it must accept what a correct
//! coordinator can answer and reject each kind of wrong answer a faulty one
//! gives (a stale read, a lost update, a reused id, a gap in a watch, two
//! replicas disagreeing, an acknowledged transition missing). These run
//! everywhere, without root or NATS: the fault runs depend on them.

use tonic::Code;

use crate::{
    history::{Answer, Call, EventKind, Op, Outcome, WatchedEvent},
    linearizability::check_linearizable,
    watch_check::{check_watches, Recording},
};

const SESSION: &str = "s-1";

fn op(client: usize, call: Call, invoked: u64, completed: u64, outcome: Outcome) -> Op {
    Op {
        client,
        replica: 0,
        session: SESSION.to_owned(),
        call,
        invoked,
        completed: Some(completed),
        outcome,
    }
}

fn start() -> Call {
    Call::Start { request_id: None }
}

fn started(response: u64, superseded: Option<u64>) -> Outcome {
    Outcome::Ok(Answer::Started {
        response,
        superseded,
        replayed: false,
    })
}

fn finish(response: u64) -> Call {
    Call::Finish {
        response: Some(response),
    }
}

fn finished(applied: bool) -> Outcome {
    Outcome::Ok(Answer::Finished { applied })
}

fn state(active: Option<u64>, revision: u64, responses_started: u64) -> Outcome {
    Outcome::Ok(Answer::State {
        active,
        terminated: false,
        revision,
        responses_started,
    })
}

fn event(revision: u64, kind: EventKind) -> WatchedEvent {
    WatchedEvent {
        session: SESSION.to_owned(),
        revision,
        seq: revision * 10,
        kind,
    }
}

/// The events of: Start 100; Start 200 superseding it; Finish 200.
fn clean_events() -> Vec<WatchedEvent> {
    vec![
        event(1, EventKind::Started { response: 100 }),
        event(2, EventKind::CancelRequested { response: 100 }),
        event(3, EventKind::Ended { response: 100 }),
        event(4, EventKind::Started { response: 200 }),
        event(5, EventKind::Ended { response: 200 }),
    ]
}

/// The calls that made `clean_events`, one after another, with reads.
fn clean_history() -> Vec<Op> {
    vec![
        op(0, start(), 0, 10, started(100, None)),
        op(1, Call::GetState, 11, 20, state(Some(100), 1, 1)),
        op(0, start(), 21, 30, started(200, Some(100))),
        op(1, finish(100), 31, 40, finished(false)),
        op(0, finish(200), 41, 50, finished(true)),
        op(1, Call::GetState, 51, 60, state(None, 5, 2)),
    ]
}

fn recording(replica: usize, events: Vec<WatchedEvent>) -> Recording {
    Recording {
        replica,
        events,
        complete: true,
    }
}

#[test]
fn a_sequential_history_of_correct_answers_is_linearizable() {
    let stats = check_linearizable(&clean_history(), &[clean_events()]).expect("linearizable");
    assert_eq!((stats.sessions, stats.ops, stats.ok), (1, 6, 6));
}

#[test]
fn overlapping_calls_may_take_effect_in_either_order() {
    // Two Starts in flight at once: the second to take effect supersedes the
    // first, whichever of them was invoked first.
    let ops = vec![
        op(0, start(), 0, 30, started(200, Some(100))),
        op(1, start(), 5, 20, started(100, None)),
    ];
    check_linearizable(&ops, &[]).expect("linearizable: 100 first, then 200");
}

#[test]
fn a_stale_finish_after_an_acknowledged_start_is_rejected() {
    // The deposed-leader finding: a Finish sent after Start 200 was
    // acknowledged is answered applied=false from the state before it.
    let ops = vec![
        op(0, start(), 0, 10, started(100, None)),
        op(0, finish(100), 11, 20, finished(true)),
        op(0, start(), 21, 30, started(200, None)),
        op(1, finish(200), 31, 40, finished(false)),
    ];
    let violation = check_linearizable(&ops, &[]).expect_err("a stale answer");
    assert_eq!(violation.check, "linearizability");
    let culprit = violation.culprit.expect("a culprit");
    assert_eq!(culprit.call, finish(200), "{culprit:?}");
}

#[test]
fn a_stale_get_state_is_rejected() {
    let ops = vec![
        op(0, start(), 0, 10, started(100, None)),
        op(0, start(), 11, 20, started(200, Some(100))),
        op(1, Call::GetState, 21, 30, state(Some(100), 1, 1)),
    ];
    let violation = check_linearizable(&ops, &[]).expect_err("a stale read");
    assert_eq!(violation.culprit.map(|c| c.call), Some(Call::GetState));
}

#[test]
fn a_lost_update_is_rejected() {
    // Without compare-and-set both Starts create the session from nothing:
    // neither says it superseded the other, which no order explains.
    let ops = vec![
        op(0, start(), 0, 20, started(100, None)),
        op(1, start(), 1, 21, started(200, None)),
    ];
    check_linearizable(&ops, &[]).expect_err("a lost update");
}

#[test]
fn a_response_id_not_above_the_last_is_rejected() {
    let ops = vec![
        op(0, start(), 0, 10, started(200, None)),
        op(0, finish(200), 11, 20, finished(true)),
        op(0, start(), 21, 30, started(150, None)),
    ];
    check_linearizable(&ops, &[]).expect_err("ids must increase");
}

#[test]
fn an_unknown_start_may_have_applied_or_not() {
    let timed_out = |invoked| Op {
        completed: None,
        outcome: Outcome::Unknown(Code::DeadlineExceeded),
        ..op(0, start(), invoked, 0, started(0, None))
    };
    // It applied: a later read sees the id it minted.
    let applied = vec![
        timed_out(0),
        op(1, Call::GetState, 50, 60, state(Some(100), 1, 1)),
    ];
    check_linearizable(&applied, &[]).expect("the unknown Start took effect");
    // It did not: the session was never created.
    let not_applied = vec![
        timed_out(0),
        op(1, Call::GetState, 50, 60, Outcome::Ok(Answer::NotFound)),
    ];
    check_linearizable(&not_applied, &[]).expect("the unknown Start never took effect");
}

#[test]
fn a_failed_call_is_taken_not_to_have_happened() {
    let ops = vec![
        op(0, start(), 0, 10, Outcome::Failed(Code::Aborted)),
        op(1, Call::GetState, 11, 20, Outcome::Ok(Answer::NotFound)),
    ];
    check_linearizable(&ops, &[]).expect("linearizable");
    let contradicted = vec![
        op(0, start(), 0, 10, Outcome::Failed(Code::Aborted)),
        op(1, Call::GetState, 11, 20, state(Some(100), 1, 1)),
    ];
    check_linearizable(&contradicted, &[]).expect_err("a failed call applied");
}

#[test]
fn clean_recordings_hold_every_acknowledged_transition() {
    let recordings = [recording(0, clean_events()), recording(1, clean_events())];
    let stats = check_watches(&clean_history(), &recordings).expect("clean");
    assert_eq!((stats.recordings, stats.events, stats.sessions), (2, 10, 1));
    // Start, Start, Finish applied and both reads; the refused Finish
    // changed nothing and has nothing to find.
    assert_eq!(stats.acknowledged, 5);
}

#[test]
fn a_gap_in_a_recording_is_rejected() {
    let mut events = clean_events();
    events.remove(2);
    let violation = check_watches(&[], &[recording(0, events)]).expect_err("a gap");
    assert!(violation.reason.contains("gap"), "{}", violation.reason);
}

#[test]
fn a_revision_delivered_twice_is_rejected() {
    let mut events = clean_events();
    let again = events[1].clone();
    events.insert(
        2,
        WatchedEvent {
            seq: again.seq + 1,
            ..again
        },
    );
    let violation = check_watches(&[], &[recording(0, events)]).expect_err("a duplicate");
    assert!(violation.reason.contains("twice"), "{}", violation.reason);
}

#[test]
fn two_live_responses_are_rejected() {
    let events = vec![
        event(1, EventKind::Started { response: 100 }),
        event(2, EventKind::Started { response: 200 }),
    ];
    let violation = check_watches(&[], &[recording(0, events)]).expect_err("two live");
    assert!(
        violation.reason.contains("two live"),
        "{}",
        violation.reason
    );
}

#[test]
fn replicas_that_disagree_on_an_event_are_rejected() {
    let mut other = clean_events();
    other[4] = event(5, EventKind::CancelRequested { response: 200 });
    other.push(event(6, EventKind::Ended { response: 200 }));
    let recordings = [recording(0, clean_events()), recording(1, other)];
    let violation = check_watches(&[], &recordings).expect_err("disagreement");
    assert!(
        violation.reason.contains("disagree"),
        "{}",
        violation.reason
    );
}

#[test]
fn an_acknowledged_transition_missing_from_a_complete_recording_is_rejected() {
    let mut events = clean_events();
    events.pop(); // Finish 200's Ended
    let lost = [recording(0, events.clone())];
    let violation = check_watches(&clean_history(), &lost).expect_err("lost");
    assert!(violation.reason.contains("missing"), "{}", violation.reason);
    assert_eq!(violation.ops.first().map(|o| &o.call), Some(&finish(200)));
    // A replica that was killed may have stopped recording before it.
    let cut_short = [Recording {
        complete: false,
        ..recording(0, events)
    }];
    check_watches(&clean_history(), &cut_short).expect("incomplete recordings may end early");
}

/// Starts that each find the session idle, with as many interchangeable
/// timed-out Cancels in flight since the beginning as the Starts need: each
/// new Start is explained only if one of them ended the response before it.
fn starts_after_unknown_cancels(periods: u64) -> Vec<Op> {
    let cancel = |client| Op {
        completed: None,
        outcome: Outcome::Unknown(Code::DeadlineExceeded),
        ..op(
            client,
            Call::Cancel { only_if: None },
            0,
            0,
            started(0, None),
        )
    };
    let mut ops: Vec<Op> = (1..periods).map(|c| cancel(c as usize)).collect();
    for k in 1..=periods {
        ops.push(op(0, start(), 10 * k, 10 * k + 1, started(100 * k, None)));
    }
    ops
}

#[test]
fn interchangeable_unknown_calls_do_not_multiply_the_search() {
    // 24 open Cancels could be chosen in 2^24 sets; any one stands for
    // another, so the search tries them in one order only (a soak session
    // with many timed-out Cancels stayed undecided at the state budget).
    let periods = 25;
    let mut ops = starts_after_unknown_cancels(periods);
    let last = 100 * periods;
    ops.push(op(
        1,
        Call::GetState,
        1000,
        1001,
        state(Some(last), 1 + 3 * 24, 25),
    ));
    let stats = check_linearizable(&ops, &[]).expect("one Cancel before each Start");
    assert!(stats.states < 10_000, "{} search states", stats.states);
    // Nothing explains a read of revision 0 at the end: exhausting every
    // order is as cheap, and the verdict is a violation, not undecided.
    let mut impossible = starts_after_unknown_cancels(periods);
    impossible.push(op(1, Call::GetState, 1000, 1001, state(Some(last), 0, 25)));
    let violation = check_linearizable(&impossible, &[]).expect_err("not linearizable");
    assert!(
        !violation.reason.contains("undecided"),
        "{}",
        violation.reason
    );
    assert_eq!(violation.culprit.map(|c| c.call), Some(Call::GetState));
}

#[test]
fn an_order_whose_events_differ_from_the_watch_is_not_taken() {
    // Alone, either Start may have taken effect first. The watch says 200
    // started at revision 1, so only that order stands, and the answers
    // claim the other one.
    let ops = vec![
        op(0, start(), 0, 30, started(200, Some(100))),
        op(1, start(), 5, 20, started(100, None)),
    ];
    check_linearizable(&ops, &[]).expect("either order without recordings");
    let watched = vec![
        event(1, EventKind::Started { response: 200 }),
        event(2, EventKind::CancelRequested { response: 200 }),
        event(3, EventKind::Ended { response: 200 }),
        event(4, EventKind::Started { response: 100 }),
    ];
    let violation = check_linearizable(&ops, &[watched]).expect_err("the watch decides");
    assert_eq!(violation.check, "linearizability");
    // A revision no recording holds constrains nothing.
    let partial = vec![event(4, EventKind::Started { response: 200 })];
    check_linearizable(&ops, &[partial]).expect("revisions 1 to 3 unrecorded");
}
