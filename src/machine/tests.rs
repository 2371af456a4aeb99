//! The exhaustive transition table: one literal row per (phase, input) cell of
//! the contract's semantics table, over representative values (an active
//! response `A` from each source, a newer id `N`, an unrelated id `O`, wire id
//! 0). A coverage check proves the rows are exactly the cartesian product, so a
//! new phase or input cannot slip in untested.

use super::*;
use std::collections::HashSet;

fn id(raw: u64) -> ResponseId {
    ResponseId::new(raw).expect("test ids are nonzero")
}
const A: u64 = 10;
const N: u64 = 20;
const O: u64 = 5;

use CancelReason::{Expired as RExpired, Requested, Shutdown as RShutdown, Superseded};
use FinishStatus::{Completed, Failed};
use Source::{Client, Unspecified, Vad};

fn active(raw: u64, source: Source) -> Phase {
    Phase::Active(ActiveResponse {
        id: id(raw),
        source,
    })
}
/// Every Start here would give its response id `N`.
fn start(source: Source) -> Call {
    Call::Start {
        source,
        request_id: None,
    }
}
fn finish(raw: u64, status: FinishStatus) -> Call {
    Call::Finish {
        response: ResponseId::new(raw),
        status,
    }
}
fn cancel_from(raw: u64, source: Source) -> Call {
    Call::Cancel {
        only_if: ResponseId::new(raw),
        source,
    }
}
fn teardown(reason: TeardownReason) -> Call {
    Call::Teardown {
        reason,
        source: Unspecified,
    }
}
fn started(raw: u64, source: Source) -> EventKind {
    EventKind::Started {
        response: id(raw),
        source,
    }
}
fn cancel_requested(raw: u64, reason: CancelReason, source: Source) -> EventKind {
    EventKind::CancelRequested {
        response: id(raw),
        reason,
        source,
    }
}
fn ended(raw: u64, ending: Terminal) -> EventKind {
    EventKind::Ended {
        response: id(raw),
        ending,
    }
}
fn terminated(reason: TeardownReason) -> EventKind {
    EventKind::Terminated { reason }
}
fn o_started(raw: u64, superseded: u64) -> Outcome {
    Outcome::Started {
        response: id(raw),
        superseded: ResponseId::new(superseded),
    }
}
fn o_finished(applied: bool) -> Outcome {
    Outcome::Finished { applied }
}
fn o_cancelled(raw: u64) -> Outcome {
    Outcome::Cancelled {
        cancelled: ResponseId::new(raw),
    }
}
fn o_torn(raw: u64) -> Outcome {
    Outcome::TornDown {
        cancelled: ResponseId::new(raw),
    }
}

type Row = (Phase, Call, Phase, Vec<EventKind>, Outcome);

fn table() -> Vec<Row> {
    use TeardownReason::{Expired, Shutdown};
    use Terminal::Cancelled;
    let idle = Phase::Idle;
    let term = Phase::Terminated;
    let mut rows: Vec<Row> = Vec::new();

    // none/Idle row group.
    for source in [Unspecified, Client, Vad] {
        rows.push((
            idle,
            start(source),
            active(N, source),
            vec![started(N, source)],
            o_started(N, 0),
        ));
    }
    for raw in [0, A, O] {
        for status in [Completed, Failed] {
            rows.push((idle, finish(raw, status), idle, vec![], o_finished(false)));
        }
        for source in [Unspecified, Client, Vad] {
            rows.push((idle, cancel_from(raw, source), idle, vec![], o_cancelled(0)));
        }
    }
    rows.push((
        idle,
        teardown(Shutdown),
        term,
        vec![terminated(Shutdown)],
        o_torn(0),
    ));
    rows.push((
        idle,
        teardown(Expired),
        term,
        vec![terminated(Expired)],
        o_torn(0),
    ));

    // Active(A) row group, for an active response from each source.
    for a_source in [Client, Vad] {
        let act = active(A, a_source);
        for source in [Unspecified, Client, Vad] {
            rows.push((
                act,
                start(source),
                active(N, source),
                vec![
                    cancel_requested(A, Superseded, source),
                    ended(A, Cancelled(Superseded)),
                    started(N, source),
                ],
                o_started(N, A),
            ));
        }
        rows.push((
            act,
            finish(A, Completed),
            idle,
            vec![ended(A, Terminal::Completed)],
            o_finished(true),
        ));
        rows.push((
            act,
            finish(A, Failed),
            idle,
            vec![ended(A, Terminal::Failed)],
            o_finished(true),
        ));
        for stale in [0, O] {
            for status in [Completed, Failed] {
                rows.push((act, finish(stale, status), act, vec![], o_finished(false)));
            }
        }
        for only_if in [0, A] {
            for source in [Unspecified, Client, Vad] {
                rows.push((
                    act,
                    cancel_from(only_if, source),
                    idle,
                    vec![
                        cancel_requested(A, Requested, source),
                        ended(A, Cancelled(Requested)),
                    ],
                    o_cancelled(A),
                ));
            }
        }
        for source in [Unspecified, Client, Vad] {
            rows.push((act, cancel_from(O, source), act, vec![], o_cancelled(0)));
        }
        rows.push((
            act,
            teardown(Shutdown),
            term,
            vec![
                cancel_requested(A, RShutdown, Unspecified),
                ended(A, Cancelled(RShutdown)),
                terminated(Shutdown),
            ],
            o_torn(A),
        ));
        rows.push((
            act,
            teardown(Expired),
            term,
            vec![
                cancel_requested(A, RExpired, Unspecified),
                ended(A, Cancelled(RExpired)),
                terminated(Expired),
            ],
            o_torn(A),
        ));
    }

    // Terminated row group: absorbing, silent.
    for source in [Unspecified, Client, Vad] {
        rows.push((term, start(source), term, vec![], Outcome::StartRefused));
    }
    for raw in [0, A, O] {
        for status in [Completed, Failed] {
            rows.push((term, finish(raw, status), term, vec![], o_finished(false)));
        }
        for source in [Unspecified, Client, Vad] {
            rows.push((term, cancel_from(raw, source), term, vec![], o_cancelled(0)));
        }
    }
    rows.push((term, teardown(Shutdown), term, vec![], o_torn(0)));
    rows.push((term, teardown(Expired), term, vec![], o_torn(0)));
    rows
}

fn all_phases() -> Vec<Phase> {
    vec![
        Phase::Idle,
        active(A, Client),
        active(A, Vad),
        Phase::Terminated,
    ]
}

fn all_inputs() -> Vec<Call> {
    let mut inputs = vec![start(Unspecified), start(Client), start(Vad)];
    for raw in [0, A, O] {
        inputs.push(finish(raw, Completed));
        inputs.push(finish(raw, Failed));
        for source in [Unspecified, Client, Vad] {
            inputs.push(cancel_from(raw, source));
        }
    }
    inputs.push(teardown(TeardownReason::Shutdown));
    inputs.push(teardown(TeardownReason::Expired));
    inputs
}

/// Who asked is on the cancel of every kind: a superseding Start's source,
/// a Cancel's, a Shutdown's; expiry has no caller.
#[test]
fn a_cancel_carries_the_source_of_the_call_that_asked() {
    let act = active(A, Client);
    for source in [Unspecified, Client, Vad] {
        let calls = [
            (start(source), Superseded),
            (cancel_from(0, source), Requested),
            (
                Call::Teardown {
                    reason: TeardownReason::Shutdown,
                    source,
                },
                RShutdown,
            ),
        ];
        for (call, reason) in calls {
            let t = transition(act, &call, id(N));
            assert_eq!(t.events[0], cancel_requested(A, reason, source), "{call:?}");
        }
    }
    let expired = transition(act, &teardown(TeardownReason::Expired), id(N));
    assert_eq!(
        expired.events[0],
        cancel_requested(A, RExpired, Unspecified)
    );
}

#[test]
fn table_covers_every_cell_exactly_once() {
    let rows = table();
    let cells: HashSet<(Phase, Call)> = rows.iter().map(|r| (r.0, r.1.clone())).collect();
    assert_eq!(cells.len(), rows.len(), "a cell appears twice in the table");
    let expected: HashSet<(Phase, Call)> = all_phases()
        .into_iter()
        .flat_map(|p| all_inputs().into_iter().map(move |i| (p, i)))
        .collect();
    assert_eq!(cells, expected);
    assert_eq!(rows.len(), 4 * 20);
}

#[test]
fn every_cell_matches_the_table() {
    for (phase, input, next, events, outcome) in table() {
        let t = transition(phase, &input, id(N));
        assert_eq!(t.next, next, "next phase of {phase:?} on {input:?}");
        assert_eq!(
            t.events.as_slice(),
            events.as_slice(),
            "events of {phase:?} on {input:?}"
        );
        assert_eq!(t.outcome, outcome, "outcome of {phase:?} on {input:?}");
    }
}

#[test]
fn at_most_one_live_response_after_any_cell() {
    // Live count before + started - ended must be 0 or 1 in every cell: the
    // spec's AtMostOneLive, checked on the events rather than the phase.
    for (phase, input, ..) in table() {
        let t = transition(phase, &input, id(N));
        let mut live = i32::from(phase.active().is_some());
        for event in &t.events {
            match event {
                EventKind::Started { .. } => live += 1,
                EventKind::Ended { .. } => live -= 1,
                EventKind::CancelRequested { .. } | EventKind::Terminated { .. } => {}
            }
            assert!(
                (0..=1).contains(&live),
                "{phase:?} on {input:?}: live {live}"
            );
        }
        assert_eq!(live, i32::from(t.next.active().is_some()));
    }
}
