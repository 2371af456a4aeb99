//! How `respcoordctl` prints what it got: readable lines, or JSON (one
//! document per command, one object per line for `watch`).

use std::{
    io::{self, Write},
    time::{Duration, UNIX_EPOCH},
};

use respcoord_client::{pb, short_name};
use respcoord_proto::timeline::EventJson;
use serde::Serialize;

use crate::Output;

/// The established JSON of `get`, `list`, `start`, ...: ids as numbers
/// (the timeline's JSON, shared with the web view, has them as strings).
#[derive(Serialize)]
pub(crate) struct StateOut {
    pub(crate) session_id: String,
    pub(crate) phase: String,
    pub(crate) active_response_id: u64,
    pub(crate) active_source: String,
    pub(crate) revision: u64,
    pub(crate) responses_started: u64,
}

impl From<&pb::SessionState> for StateOut {
    fn from(state: &pb::SessionState) -> Self {
        Self {
            session_id: state.session_id.clone(),
            phase: short_name(state.phase().as_str_name()).to_owned(),
            active_response_id: state.active_response_id,
            active_source: short_name(state.active_source().as_str_name()).to_owned(),
            revision: state.revision,
            responses_started: state.responses_started,
        }
    }
}

#[derive(Serialize)]
pub(crate) struct ListOut {
    /// Every event with seq <= this is reflected (resume a watch-all here).
    pub(crate) seq: u64,
    pub(crate) sessions: Vec<StateOut>,
}

#[derive(Serialize)]
pub(crate) struct StartOut<'a> {
    pub(crate) response_id: u64,
    pub(crate) superseded_response_id: u64,
    pub(crate) replayed: bool,
    pub(crate) request_id: &'a str,
    pub(crate) state: StateOut,
}

#[derive(Serialize)]
pub(crate) struct FinishOut {
    pub(crate) response_id: u64,
    pub(crate) applied: bool,
    pub(crate) state: StateOut,
}

#[derive(Serialize)]
pub(crate) struct CancelOut {
    pub(crate) cancelled_response_id: u64,
    pub(crate) state: StateOut,
}

#[derive(Serialize)]
pub(crate) struct EventOut<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) revision: u64,
    pub(crate) seq: u64,
    pub(crate) unix_nanos: i64,
    pub(crate) event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) response_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'static str>,
}

/// `watch`'s JSON keeps its own names (`event`, `unix_nanos`); what each
/// event says is read as the timeline's JSON reads it.
impl<'a> From<&'a pb::LifecycleEvent> for EventOut<'a> {
    fn from(event: &'a pb::LifecycleEvent) -> Self {
        let json = EventJson::from(event);
        EventOut {
            session_id: json.session_id,
            revision: json.revision,
            seq: json.seq,
            unix_nanos: event.unix_nanos,
            event: json.kind,
            response_id: json.response_id,
            source: json.source,
            status: json.status,
            reason: json.reason,
        }
    }
}

#[derive(Serialize)]
pub(crate) struct BookmarkOut {
    pub(crate) progress_seq: u64,
}

pub(crate) struct Printer(pub(crate) Output);

impl Printer {
    pub(crate) fn line(&self, line: &str) -> io::Result<()> {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "{line}")?;
        stdout.flush()
    }

    pub(crate) fn json<T: Serialize>(&self, value: &T) -> io::Result<()> {
        let line = serde_json::to_string(value).map_err(io::Error::other)?;
        self.line(&line)
    }

    pub(crate) fn state(&self, state: &pb::SessionState) -> io::Result<()> {
        match self.0 {
            Output::Json => self.json(&StateOut::from(state)),
            Output::Text => self.line(&state_text(state)),
        }
    }

    pub(crate) fn started(&self, reply: &pb::StartResponse, request_id: &str) -> io::Result<()> {
        let state = reply.state.clone().unwrap_or_default();
        match self.0 {
            Output::Json => self.json(&StartOut {
                response_id: reply.response_id,
                superseded_response_id: reply.superseded_response_id,
                replayed: reply.replayed,
                request_id,
                state: StateOut::from(&state),
            }),
            Output::Text => {
                let mut line = format!(
                    "started response {} on {} (request_id {request_id}",
                    reply.response_id, state.session_id
                );
                if reply.superseded_response_id != 0 {
                    line += &format!(", superseded {}", reply.superseded_response_id);
                }
                if reply.replayed {
                    line += ", replayed: nothing changed";
                }
                line.push(')');
                self.line(&line)?;
                self.line(&state_text(&state))
            }
        }
    }

    pub(crate) fn finished(&self, reply: &pb::FinishResponse, response_id: u64) -> io::Result<()> {
        let state = reply.state.clone().unwrap_or_default();
        match self.0 {
            Output::Json => self.json(&FinishOut {
                response_id,
                applied: reply.applied,
                state: StateOut::from(&state),
            }),
            Output::Text => {
                self.line(&if reply.applied {
                    format!("finished response {response_id}")
                } else {
                    format!("response {response_id} is not active: nothing changed (stale)")
                })?;
                self.line(&state_text(&state))
            }
        }
    }

    pub(crate) fn cancelled(
        &self,
        what: &str,
        cancelled: u64,
        state: Option<&pb::SessionState>,
    ) -> io::Result<()> {
        let state = state.cloned().unwrap_or_default();
        match self.0 {
            Output::Json => self.json(&CancelOut {
                cancelled_response_id: cancelled,
                state: StateOut::from(&state),
            }),
            Output::Text => {
                self.line(&match (what, cancelled) {
                    ("shutdown", 0) => format!("shut down {} (no live response)", state.session_id),
                    ("shutdown", id) => {
                        format!("shut down {}, cancelled response {id}", state.session_id)
                    }
                    (_, 0) => "nothing cancelled".to_owned(),
                    (_, id) => format!("cancelled response {id}"),
                })?;
                self.line(&state_text(&state))
            }
        }
    }

    pub(crate) fn event(&self, event: &pb::LifecycleEvent) -> io::Result<()> {
        let out = EventOut::from(event);
        match self.0 {
            Output::Json => self.json(&out),
            Output::Text => {
                let nanos = u64::try_from(event.unix_nanos).unwrap_or(0);
                let time =
                    humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_nanos(nanos));
                let mut line = format!(
                    "{time} seq={} {} rev={} {}",
                    out.seq, out.session_id, out.revision, out.event
                );
                if let Some(id) = out.response_id {
                    line += &format!(" response={id}");
                }
                for (key, value) in [
                    ("source", &out.source),
                    ("status", &out.status),
                    ("reason", &out.reason),
                ] {
                    if let Some(value) = value {
                        line += &format!(" {key}={value}");
                    }
                }
                self.line(&line)
            }
        }
    }

    pub(crate) fn bookmark(&self, progress_seq: u64) -> io::Result<()> {
        match self.0 {
            Output::Json => self.json(&BookmarkOut { progress_seq }),
            Output::Text => self.line(&format!("bookmark progress_seq={progress_seq}")),
        }
    }
}

pub(crate) fn state_text(state: &pb::SessionState) -> String {
    let mut line = format!(
        "{} {} revision={} responses_started={}",
        state.session_id,
        short_name(state.phase().as_str_name()),
        state.revision,
        state.responses_started
    );
    if state.phase() == pb::Phase::Active {
        line += &format!(
            " response={} source={}",
            state.active_response_id,
            short_name(state.active_source().as_str_name())
        );
    }
    line
}
