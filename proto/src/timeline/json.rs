//! The timeline and the contract's messages as JSON, the one shape
//! `respcoordctl timeline -o json` prints and the web view's API answers
//! (docs/web-ui.md). Times are milliseconds since the Unix epoch, with a
//! fraction: nanoseconds as a JSON number lose precision in JavaScript.

use serde::Serialize;

use super::{short_name, ResponseRow, SessionChange, Stamp, Teardown};
use crate::v1::{self as pb, lifecycle_event::Kind};

/// Response ids and seqs as decimal strings: they are 64-bit, past what a
/// JSON number keeps exactly in JavaScript (ids a few apart would collide).
pub fn id_text<S: serde::Serializer>(id: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(id)
}

/// [`id_text`] for an id that may be absent (`null` then).
pub fn optional_id_text<S: serde::Serializer>(
    id: &Option<u64>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => serializer.collect_str(id),
        None => serializer.serialize_none(),
    }
}

fn millis(unix_nanos: i64) -> f64 {
    unix_nanos as f64 / 1e6
}

fn stamp_millis(stamp: Option<Stamp>) -> Option<f64> {
    stamp.map(|stamp| millis(stamp.unix_nanos))
}

/// One response row.
#[derive(Serialize)]
pub struct ResponseJson {
    #[serde(serialize_with = "id_text")]
    pub response_id: u64,
    pub source: &'static str,
    pub started_ms: Option<f64>,
    pub started_revision: Option<u64>,
    pub cancel_requested_ms: Option<f64>,
    /// Who asked for the cancel (`None` until one is requested).
    pub cancel_source: Option<&'static str>,
    pub ended_ms: Option<f64>,
    pub status: Option<&'static str>,
    /// Why a cancelled response stopped; `None` unless cancelled.
    pub reason: Option<&'static str>,
    pub duration_ms: Option<f64>,
    #[serde(serialize_with = "optional_id_text")]
    pub superseded_by: Option<u64>,
    pub superseded_by_source: Option<&'static str>,
}

impl From<&ResponseRow> for ResponseJson {
    fn from(row: &ResponseRow) -> Self {
        let cancelled = row
            .ended
            .filter(|end| end.status == pb::TerminalStatus::Cancelled);
        Self {
            response_id: row.response_id,
            source: short_name(row.source.as_str_name()),
            started_ms: stamp_millis(row.started),
            started_revision: row.started.map(|stamp| stamp.revision),
            cancel_requested_ms: stamp_millis(row.cancel_requested),
            cancel_source: row
                .cancel_source
                .map(|source| short_name(source.as_str_name())),
            ended_ms: stamp_millis(row.ended.map(|end| end.at)),
            status: row.ended.map(|end| short_name(end.status.as_str_name())),
            reason: cancelled.map(|end| short_name(end.reason.as_str_name())),
            duration_ms: row.duration_nanos().map(millis),
            superseded_by: row.superseded_by.map(|(id, _)| id),
            superseded_by_source: row
                .superseded_by
                .map(|(_, source)| short_name(source.as_str_name())),
        }
    }
}

/// How the session was torn down.
#[derive(Serialize)]
pub struct TeardownJson {
    pub reason: &'static str,
    pub time_ms: f64,
    pub revision: u64,
}

impl From<Teardown> for TeardownJson {
    fn from(teardown: Teardown) -> Self {
        Self {
            reason: short_name(teardown.reason.as_str_name()),
            time_ms: millis(teardown.at.unix_nanos),
            revision: teardown.at.revision,
        }
    }
}

/// One lifecycle event.
#[derive(Serialize)]
pub struct EventJson<'a> {
    pub session_id: &'a str,
    pub revision: u64,
    /// As a string too: seqs start near the boot time in nanoseconds.
    #[serde(serialize_with = "id_text")]
    pub seq: u64,
    pub time_ms: f64,
    pub kind: &'static str,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "optional_id_text"
    )]
    pub response_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

impl<'a> From<&'a pb::LifecycleEvent> for EventJson<'a> {
    fn from(event: &'a pb::LifecycleEvent) -> Self {
        let mut json = EventJson {
            session_id: &event.session_id,
            revision: event.revision,
            seq: event.seq,
            time_ms: millis(event.unix_nanos),
            kind: "unknown",
            response_id: None,
            source: None,
            status: None,
            reason: None,
        };
        match &event.kind {
            Some(Kind::Started(started)) => {
                json.kind = "started";
                json.response_id = Some(started.response_id);
                json.source = Some(short_name(started.source().as_str_name()));
            }
            Some(Kind::CancelRequested(cancel)) => {
                json.kind = "cancel_requested";
                json.response_id = Some(cancel.response_id);
                json.source = Some(short_name(cancel.source().as_str_name()));
                json.reason = Some(short_name(cancel.reason().as_str_name()));
            }
            Some(Kind::Ended(ended)) => {
                json.kind = "ended";
                json.response_id = Some(ended.response_id);
                json.status = Some(short_name(ended.status().as_str_name()));
                if ended.status() == pb::TerminalStatus::Cancelled {
                    json.reason = Some(short_name(ended.reason().as_str_name()));
                }
            }
            Some(Kind::Terminated(terminated)) => {
                json.kind = "terminated";
                json.reason = Some(short_name(terminated.reason().as_str_name()));
            }
            None => {}
        }
        json
    }
}

/// A session's state, as GetState and ListSessions answer it.
#[derive(Serialize)]
pub struct StateJson<'a> {
    pub session_id: &'a str,
    pub phase: &'static str,
    #[serde(serialize_with = "id_text")]
    pub active_response_id: u64,
    pub active_source: &'static str,
    pub revision: u64,
    pub responses_started: u64,
    /// When the session last changed, where the answer says (ListSessions):
    /// omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_ms: Option<f64>,
}

impl<'a> From<&'a pb::SessionState> for StateJson<'a> {
    fn from(state: &'a pb::SessionState) -> Self {
        Self {
            session_id: &state.session_id,
            phase: short_name(state.phase().as_str_name()),
            active_response_id: state.active_response_id,
            active_source: short_name(state.active_source().as_str_name()),
            revision: state.revision,
            responses_started: state.responses_started,
            changed_ms: (state.changed_unix_nanos != 0).then(|| millis(state.changed_unix_nanos)),
        }
    }
}

/// A session as one event left it.
#[derive(Serialize)]
pub struct SessionChangeJson<'a> {
    pub session_id: &'a str,
    pub phase: &'static str,
    #[serde(serialize_with = "id_text")]
    pub active_response_id: u64,
    pub active_source: &'static str,
    pub revision: u64,
    pub changed_ms: f64,
}

impl<'a> From<&'a SessionChange> for SessionChangeJson<'a> {
    fn from(change: &'a SessionChange) -> Self {
        Self {
            session_id: &change.session_id,
            phase: short_name(change.phase.as_str_name()),
            active_response_id: change.active_response_id,
            active_source: short_name(change.active_source.as_str_name()),
            revision: change.revision,
            changed_ms: millis(change.changed_unix_nanos),
        }
    }
}
