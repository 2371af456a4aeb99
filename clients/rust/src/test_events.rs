//! Wire values for the table's and the watches' tests.

use respcoord_proto::v1::{self as pb, lifecycle_event::Kind};

pub(crate) fn event(session: &str, revision: u64, kind: Kind) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        session_id: session.into(),
        revision,
        seq: revision,
        unix_nanos: 0,
        kind: Some(kind),
    }
}

pub(crate) fn started(id: u64) -> Kind {
    Kind::Started(pb::ResponseStarted {
        response_id: id,
        source: pb::Source::Client.into(),
    })
}

pub(crate) fn cancel_requested(id: u64, reason: pb::CancelReason) -> Kind {
    Kind::CancelRequested(pb::ResponseCancelRequested {
        response_id: id,
        reason: reason.into(),
        source: pb::Source::Unspecified.into(),
    })
}

pub(crate) fn state(
    session: &str,
    phase: pb::Phase,
    active: u64,
    revision: u64,
) -> pb::SessionState {
    pb::SessionState {
        session_id: session.into(),
        phase: phase.into(),
        active_response_id: active,
        revision,
        ..Default::default()
    }
}
