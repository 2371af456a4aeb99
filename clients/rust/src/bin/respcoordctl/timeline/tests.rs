use super::*;
use pb::lifecycle_event::Kind;

const SECOND: i64 = 1_000_000_000;
/// 2026-12-06T12:00:00Z.
const NOON: i64 = 1_796_558_400 * SECOND;

fn event(revision: u64, at_millis: i64, kind: Kind) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        session_id: "call-42".into(),
        revision,
        seq: revision,
        unix_nanos: NOON + at_millis * 1_000_000,
        kind: Some(kind),
    }
}

fn started(id: u64, source: pb::Source) -> Kind {
    Kind::Started(pb::ResponseStarted {
        response_id: id,
        source: source.into(),
    })
}

fn stop(id: u64, reason: pb::CancelReason) -> [Kind; 2] {
    stop_by(id, reason, pb::Source::Unspecified)
}

fn stop_by(id: u64, reason: pb::CancelReason, source: pb::Source) -> [Kind; 2] {
    [
        Kind::CancelRequested(pb::ResponseCancelRequested {
            response_id: id,
            reason: reason.into(),
            source: source.into(),
        }),
        Kind::Ended(pb::ResponseEnded {
            response_id: id,
            status: pb::TerminalStatus::Cancelled.into(),
            reason: reason.into(),
        }),
    ]
}

/// A scripted session: a completed reply, a reply cut off by a VAD
/// barge-in, the barge-in's reply cancelled, a new reply still live.
fn scripted() -> (pb::SessionState, Timeline) {
    let [req1, end1] = stop_by(2, pb::CancelReason::Superseded, pb::Source::Vad);
    let [req2, end2] = stop_by(3, pb::CancelReason::Requested, pb::Source::Client);
    let events = [
        event(1, 0, started(1, pb::Source::Client)),
        event(
            2,
            2_310,
            Kind::Ended(pb::ResponseEnded {
                response_id: 1,
                status: pb::TerminalStatus::Completed.into(),
                reason: 0,
            }),
        ),
        event(3, 5_002, started(2, pb::Source::Client)),
        event(4, 6_842, req1),
        event(5, 6_842, end1),
        event(6, 6_842, started(3, pb::Source::Vad)),
        event(7, 7_362, req2),
        event(8, 7_362, end2),
        event(9, 10_462, started(4, pb::Source::Client)),
    ];
    let mut timeline = Timeline::new();
    for event in &events {
        timeline.apply(event);
    }
    let state = pb::SessionState {
        session_id: "call-42".into(),
        phase: pb::Phase::Active.into(),
        active_response_id: 4,
        active_source: pb::Source::Client.into(),
        revision: 9,
        responses_started: 4,
        ..Default::default()
    };
    (state, timeline)
}

#[test]
fn a_scripted_session_reads_as_its_responses() {
    let (state, timeline) = scripted();
    let lines = render(&state, &timeline, 0);
    let expected = [
        "call-42 active revision=9 responses_started=4 response=4 source=client",
        "     #  source  started             ran  lane                              outcome",
        "     1  client  12:00:00.000    2.310 s  ████████                          completed after 2.310 s",
        "        idle 2.692 s",
        "     2  client  12:00:05.002    1.840 s                 ██████             superseded by 3 (vad) after 1.840 s",
        "     3  vad     12:00:06.842    0.520 s                      ███           cancelled: requested by client after 0.520 s",
        "        idle 3.100 s",
        "     4  client  12:00:10.462       live                                 >  live",
    ];
    assert_eq!(lines, expected, "\n{}", lines.join("\n"));
}

#[test]
fn a_history_that_lost_its_start_and_a_teardown() {
    let [req, end] = stop(7, pb::CancelReason::Shutdown);
    let mut timeline = Timeline::new();
    for event in [
        event(21, 0, req),
        event(22, 0, end),
        event(
            23,
            0,
            Kind::Terminated(pb::SessionTerminated {
                reason: pb::CancelReason::Shutdown.into(),
            }),
        ),
    ] {
        timeline.apply(&event);
    }
    let state = pb::SessionState {
        session_id: "call-42".into(),
        phase: pb::Phase::Terminated.into(),
        revision: 23,
        responses_started: 7,
        ..Default::default()
    };
    let lines = render(&state, &timeline, 20);
    assert_eq!(
        lines[1],
        "history from revision 21 (earlier events are no longer retained)"
    );
    assert!(lines[3].contains("     7  unspecified ?"), "{}", lines[3]);
    assert!(lines[3].ends_with("cancelled: shutdown"), "{}", lines[3]);
    assert_eq!(lines[4], "session torn down at 12:00:00.000: shutdown");
}

#[test]
fn an_empty_history_says_so() {
    let state = pb::SessionState {
        session_id: "call-42".into(),
        phase: pb::Phase::Idle.into(),
        ..Default::default()
    };
    let lines = render(&state, &Timeline::new(), 0);
    assert_eq!(lines[1], "no responses in the retained history");
}
