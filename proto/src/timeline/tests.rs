use super::*;

/// Events as the coordinator emits them for one session: revision and seq
/// follow each other, a transition's events share a time.
struct Session {
    events: Vec<pb::LifecycleEvent>,
}

impl Session {
    fn new() -> Self {
        Self { events: Vec::new() }
    }

    fn push(&mut self, unix_nanos: i64, kind: Kind) -> &mut Self {
        let revision = self.events.len() as u64 + 1;
        self.events.push(pb::LifecycleEvent {
            session_id: "call-1".into(),
            revision,
            seq: revision + 100,
            unix_nanos,
            kind: Some(kind),
        });
        self
    }

    fn start(&mut self, at: i64, id: u64, source: pb::Source) -> &mut Self {
        self.push(
            at,
            Kind::Started(pb::ResponseStarted {
                response_id: id,
                source: source.into(),
            }),
        )
    }

    fn stop(&mut self, at: i64, id: u64, reason: pb::CancelReason) -> &mut Self {
        self.stop_by(at, id, reason, pb::Source::Unspecified)
    }

    fn stop_by(
        &mut self,
        at: i64,
        id: u64,
        reason: pb::CancelReason,
        source: pb::Source,
    ) -> &mut Self {
        self.push(
            at,
            Kind::CancelRequested(pb::ResponseCancelRequested {
                response_id: id,
                reason: reason.into(),
                source: source.into(),
            }),
        )
        .push(
            at,
            Kind::Ended(pb::ResponseEnded {
                response_id: id,
                status: pb::TerminalStatus::Cancelled.into(),
                reason: reason.into(),
            }),
        )
    }

    fn finish(&mut self, at: i64, id: u64, status: pb::TerminalStatus) -> &mut Self {
        self.push(
            at,
            Kind::Ended(pb::ResponseEnded {
                response_id: id,
                status: status.into(),
                reason: pb::CancelReason::Unspecified.into(),
            }),
        )
    }

    fn teardown(&mut self, at: i64, reason: pb::CancelReason) -> &mut Self {
        self.push(
            at,
            Kind::Terminated(pb::SessionTerminated {
                reason: reason.into(),
            }),
        )
    }

    fn timeline(&self) -> Timeline {
        let mut timeline = Timeline::new();
        for event in &self.events {
            timeline.apply(event);
        }
        timeline
    }
}

const MS: i64 = 1_000_000;

#[test]
fn a_supersede_names_the_start_that_stopped_the_response() {
    let mut session = Session::new();
    session
        .start(1_000 * MS, 1, pb::Source::Client)
        .stop_by(2_840 * MS, 1, pb::CancelReason::Superseded, pb::Source::Vad)
        .start(2_840 * MS, 2, pb::Source::Vad)
        .stop_by(
            3_000 * MS,
            2,
            pb::CancelReason::Requested,
            pb::Source::Client,
        )
        .start(4_000 * MS, 3, pb::Source::Client)
        .finish(5_500 * MS, 3, pb::TerminalStatus::Completed);
    let timeline = session.timeline();
    let rows: Vec<_> = timeline.responses().collect();
    assert_eq!(rows.len(), 3);

    assert_eq!(rows[0].source, pb::Source::Client);
    assert_eq!(rows[0].superseded_by, Some((2, pb::Source::Vad)));
    assert_eq!(rows[0].duration_nanos(), Some(1_840 * MS));
    let end = rows[0].ended.expect("ended");
    assert_eq!(end.status, pb::TerminalStatus::Cancelled);
    assert_eq!(end.reason, pb::CancelReason::Superseded);
    assert_eq!(rows[0].cancel_requested.map(|at| at.revision), Some(2));
    assert_eq!(rows[0].cancel_source, Some(pb::Source::Vad));
    // Who cancelled: the Cancel's source; none asked for the finished one.
    assert_eq!(rows[1].cancel_source, Some(pb::Source::Client));
    assert_eq!(rows[2].cancel_source, None);

    // A Cancel's stop is not a supersede, though a Start follows later.
    assert_eq!(rows[1].superseded_by, None);
    assert_eq!(
        rows[1].ended.map(|end| end.reason),
        Some(pb::CancelReason::Requested)
    );
    assert_eq!(rows[2].superseded_by, None);
    assert_eq!(
        rows[2].ended.map(|end| end.status),
        Some(pb::TerminalStatus::Completed)
    );
    assert!(rows.iter().all(|row| !row.is_live()));
    assert_eq!(timeline.last_revision(), 8);
}

#[test]
fn the_started_of_a_supersede_changes_both_rows() {
    let mut session = Session::new();
    session
        .start(1, 1, pb::Source::Client)
        .stop(2, 1, pb::CancelReason::Superseded)
        .start(2, 2, pb::Source::Vad);
    let mut timeline = Timeline::new();
    let changed: Vec<Vec<u64>> = session
        .events
        .iter()
        .map(|event| timeline.apply(event).response_ids().collect())
        .collect();
    assert_eq!(changed, vec![vec![1], vec![1], vec![1], vec![2, 1]]);
    assert!(timeline.response(2).is_some_and(ResponseRow::is_live));
}

#[test]
fn a_teardown_stops_the_live_response_and_is_recorded() {
    let mut session = Session::new();
    session
        .start(1, 1, pb::Source::Vad)
        .stop(5, 1, pb::CancelReason::Shutdown)
        .teardown(5, pb::CancelReason::Shutdown);
    let timeline = session.timeline();
    let teardown = timeline.terminated().expect("terminated");
    assert_eq!(teardown.reason, pb::CancelReason::Shutdown);
    assert_eq!(teardown.at.revision, 4);
    assert_eq!(
        timeline
            .response(1)
            .and_then(|row| row.ended)
            .map(|e| e.reason),
        Some(pb::CancelReason::Shutdown)
    );
}

#[test]
fn history_that_starts_mid_response_keeps_what_it_saw() {
    let mut session = Session::new();
    session
        .start(1, 1, pb::Source::Client)
        .stop(2, 1, pb::CancelReason::Superseded)
        .start(2, 2, pb::Source::Vad)
        .finish(3, 2, pb::TerminalStatus::Failed);
    // The retained history begins at revision 3: response 1's start and
    // stop request are gone.
    let mut timeline = Timeline::new();
    for event in &session.events[2..] {
        timeline.apply(event);
    }
    let first = timeline.response(1).expect("row of the ended response");
    assert_eq!(first.started, None);
    assert_eq!(first.source, pb::Source::Unspecified);
    assert_eq!(first.duration_nanos(), None);
    assert_eq!(first.superseded_by, Some((2, pb::Source::Vad)));
}

#[test]
fn repeated_events_are_ignored() {
    let mut session = Session::new();
    session
        .start(1, 1, pb::Source::Client)
        .finish(2, 1, pb::TerminalStatus::Completed);
    let mut timeline = session.timeline();
    let before: Vec<ResponseRow> = timeline.responses().cloned().collect();
    for event in &session.events {
        assert_eq!(timeline.apply(event), Changed::default());
    }
    assert_eq!(timeline.responses().cloned().collect::<Vec<_>>(), before);
}

#[test]
fn a_long_followed_session_keeps_its_newest_rows() {
    let mut session = Session::new();
    let total = MAX_RESPONSES as u64 + 10;
    for id in 1..=total {
        session.start(id as i64, id, pb::Source::Client).finish(
            id as i64,
            id,
            pb::TerminalStatus::Completed,
        );
    }
    let timeline = session.timeline();
    assert_eq!(timeline.responses().len(), MAX_RESPONSES);
    assert_eq!(timeline.dropped(), 10);
    assert_eq!(
        timeline.responses().next().map(|row| row.response_id),
        Some(11)
    );
}

#[test]
fn the_session_after_each_event_ends_where_its_transition_left_it() {
    let mut session = Session::new();
    session
        .start(1, 1, pb::Source::Client)
        .stop(2, 1, pb::CancelReason::Superseded)
        .start(2, 2, pb::Source::Vad)
        .stop(3, 2, pb::CancelReason::Requested)
        .teardown(4, pb::CancelReason::Expired);
    let after: Vec<(pb::Phase, u64, pb::Source)> = session
        .events
        .iter()
        .map(SessionChange::after)
        .map(|change| {
            (
                change.phase,
                change.active_response_id,
                change.active_source,
            )
        })
        .collect();
    use pb::{Phase::*, Source};
    assert_eq!(
        after,
        vec![
            (Active, 1, Source::Client),
            (Active, 1, Source::Unspecified),
            (Idle, 0, Source::Unspecified),
            (Active, 2, Source::Vad),
            (Active, 2, Source::Unspecified),
            (Idle, 0, Source::Unspecified),
            (Terminated, 0, Source::Unspecified),
        ]
    );
}

#[test]
fn the_resume_point_is_read_from_an_out_of_range_answer() {
    let message = "after_revision=0 is no longer retained (resume from 1180 or later); \
                   re-read the state and watch from its revision";
    assert_eq!(resume_point(message), Some(1180));
    assert_eq!(resume_point("something else"), None);
}

#[test]
fn every_value_of_the_contract_enums_has_a_short_lower_case_name() {
    let names = (0..8)
        .filter_map(|n| pb::Phase::try_from(n).ok().map(|v| v.as_str_name()))
        .chain((0..8).filter_map(|n| pb::Source::try_from(n).ok().map(|v| v.as_str_name())))
        .chain((0..8).filter_map(|n| {
            pb::TerminalStatus::try_from(n)
                .ok()
                .map(|v| v.as_str_name())
        }))
        .chain((0..8).filter_map(|n| pb::CancelReason::try_from(n).ok().map(|v| v.as_str_name())));
    let mut count = 0;
    for name in names {
        let short = short_name(name);
        assert!(
            !short.is_empty() && short.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{name} -> {short}"
        );
        assert!(
            name.to_ascii_lowercase().ends_with(short),
            "{name} -> {short}"
        );
        count += 1;
    }
    assert_eq!(count, 16);
}

#[cfg(feature = "serde")]
#[test]
fn rows_and_events_as_json() {
    let mut session = Session::new();
    session
        .start(1_000 * MS, 1, pb::Source::Client)
        .stop_by(2_500 * MS, 1, pb::CancelReason::Superseded, pb::Source::Vad)
        .start(2_500 * MS, 2, pb::Source::Vad);
    let timeline = session.timeline();
    let row = serde_json::to_value(ResponseJson::from(timeline.response(1).unwrap())).unwrap();
    assert_eq!(
        row,
        serde_json::json!({
            "response_id": "1", "source": "client",
            "started_ms": 1000.0, "started_revision": 1,
            "cancel_requested_ms": 2500.0, "cancel_source": "vad", "ended_ms": 2500.0,
            "status": "cancelled", "reason": "superseded", "duration_ms": 1500.0,
            "superseded_by": "2", "superseded_by_source": "vad",
        })
    );
    let live = serde_json::to_value(ResponseJson::from(timeline.response(2).unwrap())).unwrap();
    assert_eq!(live["ended_ms"], serde_json::Value::Null);
    assert_eq!(live["status"], serde_json::Value::Null);
    assert_eq!(live["cancel_source"], serde_json::Value::Null);
    let cancel = serde_json::to_value(EventJson::from(&session.events[1])).unwrap();
    assert_eq!(cancel["kind"], "cancel_requested");
    assert_eq!(cancel["source"], "vad");
    let event = serde_json::to_value(EventJson::from(&session.events[2])).unwrap();
    assert_eq!(
        event,
        serde_json::json!({
            "session_id": "call-1", "revision": 3, "seq": "103", "time_ms": 2500.0,
            "kind": "ended", "response_id": "1", "status": "cancelled", "reason": "superseded",
        })
    );
}
