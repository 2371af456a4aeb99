//! How `respcoordctl` prints what it got: readable lines, or JSON (one
//! document per command, one object per line for `watch`).

use std::{
    io::{self, Write},
    time::{Duration, UNIX_EPOCH},
};

use respcoord_client::{pb, short_name};
use respcoord_proto::timeline::{id_text, optional_id_text, EventJson, StateJson};
use serde::Serialize;

use crate::Output;

/// Ids, seqs and times in JSON are decimal strings (the contract's JSON
/// mapping of 64-bit integers): past 2^53 a JSON number is rounded by jq and
/// JavaScript, and a rounded response id names another response. Revisions
/// and counters stay numbers. A session's state is the web view's
/// [`StateJson`], so `get`, `list` and `timeline` print the same shape.
#[derive(Serialize)]
pub(crate) struct ListOut<'a> {
    /// Every event with seq <= this is reflected (resume a watch-all here).
    #[serde(serialize_with = "id_text")]
    pub(crate) seq: u64,
    pub(crate) sessions: Vec<StateJson<'a>>,
}

#[derive(Serialize)]
pub(crate) struct StartOut<'a> {
    #[serde(serialize_with = "id_text")]
    pub(crate) response_id: u64,
    #[serde(serialize_with = "id_text")]
    pub(crate) superseded_response_id: u64,
    pub(crate) replayed: bool,
    pub(crate) request_id: &'a str,
    pub(crate) state: StateJson<'a>,
}

#[derive(Serialize)]
pub(crate) struct FinishOut<'a> {
    #[serde(serialize_with = "id_text")]
    pub(crate) response_id: u64,
    pub(crate) applied: bool,
    pub(crate) state: StateJson<'a>,
}

#[derive(Serialize)]
pub(crate) struct CancelOut<'a> {
    #[serde(serialize_with = "id_text")]
    pub(crate) cancelled_response_id: u64,
    pub(crate) state: StateJson<'a>,
}

#[derive(Serialize)]
pub(crate) struct EventOut<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) revision: u64,
    #[serde(serialize_with = "id_text")]
    pub(crate) seq: u64,
    /// A string too: nanoseconds since 1970 are past 2^53.
    #[serde(serialize_with = "int_text")]
    pub(crate) unix_nanos: i64,
    pub(crate) event: &'static str,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "optional_id_text"
    )]
    pub(crate) response_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'static str>,
}

fn int_text<S: serde::Serializer>(value: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
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
    #[serde(serialize_with = "id_text")]
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
            Output::Json => self.json(&StateJson::from(state)),
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
                state: StateJson::from(&state),
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
                state: StateJson::from(&state),
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
                state: StateJson::from(&state),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_seqs_and_times_are_json_strings() {
        let bookmark = serde_json::to_string(&BookmarkOut {
            progress_seq: 1_796_642_205_476_522_484,
        })
        .unwrap();
        assert_eq!(bookmark, r#"{"progress_seq":"1796642205476522484"}"#);
        let event = pb::LifecycleEvent {
            session_id: "s".into(),
            revision: 3,
            seq: 1_796_642_205_476_522_485,
            unix_nanos: 1_796_642_205_476_522_486,
            kind: Some(pb::lifecycle_event::Kind::Started(pb::ResponseStarted {
                response_id: 1_796_642_205_476_522_484,
                source: pb::Source::Vad.into(),
            })),
        };
        let json = serde_json::to_value(EventOut::from(&event)).unwrap();
        assert_eq!(json["response_id"], "1796642205476522484");
        assert_eq!(json["seq"], "1796642205476522485");
        assert_eq!(json["unix_nanos"], "1796642205476522486");
        assert_eq!(json["revision"], 3);
    }
}
