use super::*;
use crate::{
    ids::RequestId,
    machine::{CancelReason, EventKind, FinishStatus, Source, Terminal},
};

const TTLS: Ttls = Ttls {
    idle: 1_000,
    tombstone: 100,
};

fn sid() -> SessionId {
    SessionId::parse("s").unwrap()
}

fn start(request_id: Option<&str>) -> Call {
    Call::Start {
        source: Source::Client,
        request_id: request_id.map(|r| RequestId::parse_optional(r).unwrap().unwrap()),
    }
}

fn stamp(first_seq: u64) -> Stamp {
    Stamp {
        first_seq,
        unix_nanos: 7,
        new_response: ResponseId::new(first_seq).unwrap(),
    }
}

/// Decides `call` on a stored `session` with response ids from `first_seq`.
fn on(session: &mut Session, call: &Call, first_seq: u64, history: usize) -> Decision {
    decide(session, Presence::Stored, &sid(), call, 0)
        .unwrap()
        .settle(stamp(first_seq), history)
}

#[test]
fn absent_sessions_are_created_only_by_start_and_shutdown_and_only_with_room() {
    let absent = Presence::Absent {
        room: Room::Available,
    };
    let calls = [
        (start(None), true),
        (
            Call::Teardown {
                reason: TeardownReason::Shutdown,
                source: crate::machine::Source::Unspecified,
            },
            true,
        ),
        (
            Call::Finish {
                response: ResponseId::new(1),
                status: FinishStatus::Completed,
            },
            false,
        ),
        (
            Call::Cancel {
                only_if: None,
                source: Source::Client,
            },
            false,
        ),
        (EXPIRY, false),
    ];
    let id = sid();
    for (call, creates) in calls {
        let mut fresh = Session::new(0);
        let decided = decide(&mut fresh, absent, &id, &call, 0);
        match decided {
            Ok(decided) => {
                let decision = decided.settle(stamp(10), 0);
                assert!(creates, "{call:?} must not create");
                assert!(decision.created() && decision.changed());
            }
            Err(error) => {
                assert!(!creates, "{call:?} must create");
                assert!(matches!(error, CoordError::SessionNotFound(_)));
            }
        }
        let full = Presence::Absent {
            room: Room::Full { max: 3 },
        };
        let mut fresh = Session::new(0);
        let refused = decide(&mut fresh, full, &id, &call, 0);
        let expected = if creates { "limit" } else { "not found" };
        match refused {
            Err(CoordError::SessionLimit { max: 3 }) => assert_eq!(expected, "limit"),
            Err(CoordError::SessionNotFound(_)) => assert_eq!(expected, "not found"),
            other => panic!("{call:?} on a full coordinator: {other:?}"),
        }
    }
}

#[test]
fn the_stamp_is_taken_only_when_the_machine_runs() {
    let mut session = Session::new(0);
    let call = start(Some("once"));
    on(&mut session, &call, 10, 0);
    let id = sid();
    let Ok(Decided::Answered(replay)) = decide(&mut session, Presence::Stored, &id, &call, 0)
    else {
        panic!("a replay needs no stamp");
    };
    assert!(replay.replayed() && !replay.changed());
    assert_eq!(
        replay.reply,
        Outcome::Started {
            response: ResponseId::new(10).unwrap(),
            superseded: None,
        }
    );
    let cancel = Call::Cancel {
        only_if: None,
        source: Source::Client,
    };
    let absent = Presence::Absent {
        room: Room::Available,
    };
    // NOT_FOUND needs no stamp.
    let mut fresh = Session::new(0);
    let missing = decide(&mut fresh, absent, &id, &cancel, 0);
    assert!(missing.is_err());
}

#[test]
fn revisions_are_gap_free_and_response_ids_come_from_the_stamp() {
    let mut session = Session::new(0);
    let a = on(&mut session, &start(None), 100, 64);
    assert_eq!(a.change().unwrap().first_revision, 1);
    assert_eq!(a.change().unwrap().kinds.len(), 1);
    let b = on(&mut session, &start(None), 101, 64);
    let events = b.change().unwrap().events(&sid(), 101);
    let revisions: Vec<u64> = events.iter().map(|e| e.revision).collect();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(revisions, [2, 3, 4]);
    assert_eq!(seqs, [101, 102, 103]);
    assert!(events
        .iter()
        .all(|e| e.unix_nanos == 7 && e.session_id == sid()));
    assert_eq!(
        b.reply,
        Outcome::Started {
            response: ResponseId::new(101).unwrap(),
            superseded: ResponseId::new(100),
        }
    );
    assert!(!b.replayed());
    assert_eq!(
        events[1].kind,
        EventKind::Ended {
            response: ResponseId::new(100).unwrap(),
            ending: Terminal::Cancelled(CancelReason::Superseded)
        }
    );
    assert_eq!(b.state.responses_started, 2);
    assert_eq!(b.state.revision, 4);
    // The retained history holds the same events, with the same seqs.
    let retained = session.history_after(&sid(), 1).unwrap();
    assert_eq!(
        retained.iter().map(|e| (**e).clone()).collect::<Vec<_>>(),
        events.iter().map(|e| (**e).clone()).collect::<Vec<_>>()
    );
}

#[test]
fn an_unchanged_answer_changes_nothing_but_the_touch() {
    let mut session = Session::new(0);
    let stale = Call::Finish {
        response: ResponseId::new(5),
        status: FinishStatus::Completed,
    };
    on(&mut session, &start(None), 10, 0);
    let decision = on(&mut session, &stale, 20, 0);
    assert_eq!(decision.reply, Outcome::Finished { applied: false });
    assert!(!decision.changed());
    assert_eq!(decision.state.revision, 1);
}

#[test]
fn replay_window_keeps_the_last_sixteen() {
    let mut session = Session::new(0);
    for i in 0..20u64 {
        on(&mut session, &start(Some(&format!("r{i}"))), 10 + i * 3, 64);
    }
    let key = |i: u64| {
        RequestId::parse_optional(&format!("r{i}"))
            .unwrap()
            .unwrap()
    };
    assert_eq!(session.replayed(&key(3)), None);
    assert_eq!(
        session.replayed(&key(4)).map(|r| r.response.get()),
        Some(10 + 4 * 3)
    );
    assert!(session.replayed(&key(19)).is_some());
}

#[test]
fn refused_start_is_not_remembered() {
    let mut session = Session::new(0);
    let shutdown = Call::Teardown {
        reason: TeardownReason::Shutdown,
        source: crate::machine::Source::Unspecified,
    };
    on(&mut session, &shutdown, 5, 64);
    let refused = on(&mut session, &start(Some("late")), 6, 64);
    assert_eq!(refused.reply, Outcome::StartRefused);
    assert!(refused.change().is_none());
    assert!(matches!(
        refused.started(&sid()),
        Err(CoordError::SessionTerminated(_))
    ));
    let key = RequestId::parse_optional("late").unwrap().unwrap();
    assert_eq!(session.replayed(&key), None);
}

#[test]
fn history_is_bounded_and_resume_beyond_it_is_refused() {
    let mut session = Session::new(0);
    for i in 0..5 {
        on(&mut session, &start(None), 10 + i * 3, 4);
    }
    // 1 + 4*3 = 13 events, the last 4 kept: revisions 10..=13.
    assert_eq!(session.revision(), 13);
    let replay = session.history_after(&sid(), 9).unwrap();
    let revisions: Vec<u64> = replay.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, [10, 11, 12, 13]);
    assert_eq!(replay[3].seq, 22 + 2);
    assert_eq!(replay[0].session_id, sid());
    assert_eq!(session.history_after(&sid(), 12).unwrap().len(), 1);
    assert_eq!(session.history_after(&sid(), 13).unwrap().len(), 0);
    assert_eq!(session.history_after(&sid(), 50).unwrap().len(), 0);
    assert_eq!(session.history_after(&sid(), 8).unwrap_err(), 9);
}

#[test]
fn expiry_is_never_early_and_tombstones_are_forgotten() {
    let mut session = Session::new(0);
    let id = sid();
    fn expire<'a>(session: &'a mut Session, id: &'a SessionId, now: Millis) -> ExpiryDecision<'a> {
        decide_expiry(session, id, now, TTLS)
    }
    assert_eq!(
        expire(&mut session, &id, 1_000),
        ExpiryDecision::NotDue { at: 1_001 }
    );
    session.touch(500);
    assert_eq!(
        expire(&mut session, &id, 1_001),
        ExpiryDecision::NotDue { at: 1_501 }
    );
    let ExpiryDecision::Expire(due) = expire(&mut session, &id, 1_501) else {
        panic!("due at 1_501");
    };
    let Expired {
        decision,
        next_check,
    } = due.apply(stamp(5), 64);
    assert_eq!(decision.reply, Outcome::TornDown { cancelled: None });
    assert_eq!(
        decision.change().unwrap().kinds.as_slice(),
        [EventKind::Terminated {
            reason: TeardownReason::Expired
        }]
    );
    assert_eq!(decision.state.phase, Phase::Terminated);
    assert_eq!(next_check, 1_602);
    assert_eq!(
        expire(&mut session, &id, 1_550),
        ExpiryDecision::NotDue { at: 1_602 }
    );
    // Touching a tombstone does not keep it.
    session.touch(1_590);
    assert_eq!(expire(&mut session, &id, 1_602), ExpiryDecision::Forget);
}
