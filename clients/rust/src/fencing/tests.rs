use super::*;
use crate::test_events::{cancel_requested, event, started, state};

fn terminated(session: &str, revision: u64) -> pb::LifecycleEvent {
    event(
        session,
        revision,
        Kind::Terminated(pb::SessionTerminated {
            reason: pb::CancelReason::Requested.into(),
        }),
    )
}

#[test]
fn the_first_response_opens_the_watch_from_its_start_and_it_lingers_after_the_last() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    assert!(
        !tracks.watched("s"),
        "a session handle alone watches nothing"
    );
    let first = Liveness::new(10);
    let order = tracks.register(&guard, &first, 7, true).expect("a watch");
    assert_eq!(
        (&*order.session, order.after_revision, order.expect_started),
        ("s", Some(6), Some(10)),
        "replays the response's own start"
    );
    let second = Liveness::new(11);
    assert!(
        tracks.register(&guard, &second, 9, true).is_none(),
        "one watch a session"
    );
    assert_eq!(tracks.unregister(&guard, &first), None, "one still live");
    let idle = tracks.apply(&[event("s", 10, started(12))]);
    assert_eq!(second.reason(), Some(StopReason::Superseded));
    assert_eq!(idle.len(), 1, "the last live response stopped: idle");
    assert!(!order.stop.is_cancelled(), "the watch lingers");
    tracks.linger_over(&idle[0]);
    assert!(order.stop.is_cancelled(), "closed once the linger is over");
    let replayed = Liveness::new(20);
    let order = tracks
        .register(&guard, &replayed, 30, false)
        .expect("a new watch");
    assert_eq!(
        (order.after_revision, order.expect_started),
        (Some(30), None)
    );
}

#[test]
fn a_start_inside_the_linger_reuses_the_watch_and_the_stale_linger_changes_nothing() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let first = Liveness::new(10);
    let order = tracks.register(&guard, &first, 7, true).expect("a watch");
    let idle = tracks
        .unregister(&guard, &first)
        .expect("idle with its watch open");
    let next = Liveness::new(11);
    assert!(
        tracks.register(&guard, &next, 9, true).is_none(),
        "no Watch call: the lingering watch carries it"
    );
    tracks.linger_over(&idle);
    assert!(!order.stop.is_cancelled(), "a response registered since");
    tracks.apply(&[event(
        "s",
        10,
        cancel_requested(11, pb::CancelReason::Requested),
    )]);
    assert_eq!(next.reason(), Some(StopReason::Cancelled));
    assert!(tracks.watched("s"));
}

#[test]
fn a_track_outlives_its_last_handle_while_its_watch_lingers() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let response = Liveness::new(10);
    let order = tracks
        .register(&guard, &response, 7, true)
        .expect("a watch");
    tracks.apply(&[event(
        "s",
        8,
        cancel_requested(10, pb::CancelReason::Requested),
    )]);
    let idle = tracks.unregister(&guard, &response);
    assert_eq!(idle, None, "the event already made it idle");
    drop(guard);
    assert_eq!(
        tracks.dead_through("s"),
        Some(10),
        "kept while the watch lingers"
    );
    let again = tracks.track("s");
    let late = Liveness::new(10);
    assert!(tracks.register(&again, &late, 7, true).is_none());
    assert_eq!(late.reason(), Some(StopReason::Cancelled));
    drop(again);
    tracks.linger_over(&Idle {
        session: Arc::from("s"),
        generation: 1,
    });
    assert!(order.stop.is_cancelled());
    assert_eq!(tracks.dead_through("s"), None, "forgotten after the linger");
}

#[test]
fn opening_ahead_reads_first_and_lingers_from_then() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let effects = tracks.open_ahead(&guard);
    let order = effects.open.expect("a watch");
    assert_eq!((order.after_revision, order.expect_started), (None, None));
    let idle = effects.idle.expect("nothing live: it lingers from now");
    let again = tracks.open_ahead(&guard);
    assert!(again.open.is_none(), "already open");
    let response = Liveness::new(3);
    assert!(tracks.register(&guard, &response, 1, true).is_none());
    tracks.linger_over(&idle);
    tracks.linger_over(&again.idle.expect("a second linger"));
    assert!(!order.stop.is_cancelled(), "stale lingers close nothing");
    assert!(
        tracks.open_ahead(&guard).idle.is_none(),
        "a response is live"
    );
}

#[test]
fn a_read_judges_every_start_it_reached_whenever_it_registered() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let first = tracks.open_ahead(&guard);
    assert!(first.open.is_some());
    let ticket = tracks.ticket();
    // Registered after the read was sent, but the read reached its Start
    // (revision 4 <= 6) and its cancel.
    let answered_late = Liveness::new(8);
    tracks.register(&guard, &answered_late, 4, true);
    tracks.apply_state(&state("s", pb::Phase::Idle, 0, 6), ticket);
    assert_eq!(answered_late.reason(), Some(StopReason::Gone));
    // Registered after the read was applied: the read's fact judges it.
    let after_the_read = Liveness::new(9);
    assert!(tracks.register(&guard, &after_the_read, 5, true).is_none());
    assert_eq!(after_the_read.reason(), Some(StopReason::Gone));
    // A Start past the read is the watch's to judge.
    let past = Liveness::new(10);
    tracks.register(&guard, &past, 7, true);
    assert!(past.is_current());
}

#[test]
fn the_response_a_read_found_live_survives_registering_after_it() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    tracks.open_ahead(&guard);
    tracks.apply_state(&state("s", pb::Phase::Active, 8, 6), tracks.ticket());
    let live = Liveness::new(8);
    tracks.register(&guard, &live, 6, true);
    assert!(live.is_current());
    let older = Liveness::new(7);
    tracks.register(&guard, &older, 5, true);
    assert_eq!(older.reason(), Some(StopReason::Superseded));
}

#[test]
fn termination_ends_the_lingering_watch_and_the_next_start_opens_another() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let response = Liveness::new(5);
    let order = tracks
        .register(&guard, &response, 2, true)
        .expect("a watch");
    tracks.unregister(&guard, &response).expect("idle");
    assert!(tracks.apply(&[terminated("s", 3)]).is_empty());
    assert!(order.stop.is_cancelled(), "nothing more comes on it");
    let reborn = Liveness::new(9);
    let next = tracks
        .register(&guard, &reborn, 1, true)
        .expect("a new watch with its proof");
    assert_eq!(next.expect_started, Some(9));
}

#[test]
fn a_terminated_read_stops_everything_and_ends_the_watch() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let order = tracks.open_ahead(&guard).open.expect("a watch");
    let ticket = tracks.ticket();
    let response = Liveness::new(4);
    tracks.register(&guard, &response, 9, true);
    assert_eq!(
        tracks.apply_state(&state("s", pb::Phase::Terminated, 0, 3), ticket),
        None
    );
    assert_eq!(response.reason(), Some(StopReason::Shutdown));
    assert!(order.stop.is_cancelled());
}

#[test]
fn supersede_stops_the_old_response_and_not_the_new_one() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let old = Liveness::new(10);
    tracks.register(&guard, &old, 1, true);
    tracks.apply(&[
        event("s", 1, started(10)),
        event("s", 2, cancel_requested(10, pb::CancelReason::Superseded)),
        event("s", 4, started(20)),
    ]);
    assert_eq!(old.reason(), Some(StopReason::Superseded));
    // The new response registers after the watch saw its own start.
    let new = Liveness::new(20);
    tracks.register(&guard, &new, 4, true);
    assert!(new.is_current());
    assert_eq!(tracks.dead_through("s"), Some(19));
}

#[test]
fn a_response_registered_after_its_stop_was_seen_is_stopped_at_once() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let other = Liveness::new(1);
    tracks.register(&guard, &other, 1, true);
    tracks.apply(&[event(
        "s",
        3,
        cancel_requested(30, pb::CancelReason::Requested),
    )]);
    let late = Liveness::new(30);
    assert!(tracks.register(&guard, &late, 2, true).is_none());
    assert_eq!(late.reason(), Some(StopReason::Cancelled));
}

#[test]
fn termination_stops_every_response_and_a_reborn_session_lives() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let a = Liveness::new(5);
    tracks.register(&guard, &a, 1, true);
    tracks.apply(&[event(
        "s",
        2,
        Kind::Terminated(pb::SessionTerminated {
            reason: pb::CancelReason::Expired.into(),
        }),
    )]);
    assert_eq!(a.reason(), Some(StopReason::Expired));
    let reborn = Liveness::new(100);
    tracks.register(&guard, &reborn, 1, true);
    assert!(reborn.is_current());
}

#[test]
fn untracked_sessions_are_ignored_and_tracks_go_with_their_guards() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let second = guard.clone();
    tracks.apply(&[event("other", 3, started(3))]);
    assert_eq!(tracks.dead_through("other"), None);
    drop(guard);
    assert!(tracks.dead_through("s").is_some());
    drop(second);
    assert_eq!(tracks.dead_through("s"), None);
}

#[test]
fn a_state_read_stops_what_it_covered_and_spares_later_starts() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let (old, active) = (Liveness::new(5), Liveness::new(6));
    tracks.register(&guard, &old, 1, true);
    tracks.register(&guard, &active, 3, true);
    let ticket = tracks.ticket();
    // Registered while the read was on its way: the read cannot judge it.
    let later = Liveness::new(9);
    tracks.register(&guard, &later, 9, true);
    tracks.apply_state(&state("s", pb::Phase::Active, 6, 4), ticket);
    assert_eq!(old.reason(), Some(StopReason::Superseded));
    assert!(active.is_current(), "the active response lives on");
    assert!(later.is_current());
    tracks.apply_state(&state("s", pb::Phase::Idle, 0, 8), ticket);
    assert_eq!(active.reason(), Some(StopReason::Gone));
    assert!(later.is_current(), "started after the read was sent");
}

#[test]
fn a_session_gone_or_recreated_stops_the_responses_the_read_covered() {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let lost = Liveness::new(5);
    let order = tracks.register(&guard, &lost, 3, true).expect("a watch");
    let ticket = tracks.ticket();
    let idle = tracks.apply_gone("s", ticket).expect("idle");
    assert_eq!(lost.reason(), Some(StopReason::Gone));
    tracks.linger_over(&idle);
    assert!(order.stop.is_cancelled());
    let terminated = Liveness::new(7);
    tracks.register(&guard, &terminated, 1, true);
    tracks.apply_state(&state("s", pb::Phase::Terminated, 0, 2), tracks.ticket());
    assert_eq!(terminated.reason(), Some(StopReason::Shutdown));
}
