//! Proto <-> domain. Requests are validated here, field by field, before the
//! registry sees anything, so a refused request changes nothing; every
//! refusal names the offending field.

use crate::{
    backend::PageToken,
    error::CoordError,
    events::LifecycleEvent,
    ids::{response_id_or_zero, RequestId, ResponseId, SessionId},
    machine::{CancelReason, EventKind, FinishStatus, Phase, Source, Terminal},
    proto::v1 as pb,
    session::SessionSnapshot,
};

/// ListSessions page size when the request leaves it 0.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest page ListSessions returns; larger requests are clamped.
pub const MAX_PAGE_SIZE: usize = 1000;

pub fn session_id(raw: &str) -> Result<SessionId, CoordError> {
    SessionId::parse(raw).map_err(|e| CoordError::invalid("session_id", e))
}

fn source(raw: i32) -> Result<Source, CoordError> {
    match pb::Source::try_from(raw) {
        Ok(pb::Source::Unspecified) => Ok(Source::Unspecified),
        Ok(pb::Source::Client) => Ok(Source::Client),
        Ok(pb::Source::Vad) => Ok(Source::Vad),
        Err(_) => Err(CoordError::invalid(
            "source",
            format!("{raw} is not a Source value (0, 1 or 2)"),
        )),
    }
}

fn finish_status(raw: i32) -> Result<FinishStatus, CoordError> {
    match pb::TerminalStatus::try_from(raw) {
        Ok(pb::TerminalStatus::Unspecified | pb::TerminalStatus::Completed) => {
            Ok(FinishStatus::Completed)
        }
        Ok(pb::TerminalStatus::Failed) => Ok(FinishStatus::Failed),
        Ok(pb::TerminalStatus::Cancelled) => Err(CoordError::invalid(
            "status",
            "TERMINAL_STATUS_CANCELLED cannot be reported by Finish; cancel with Cancel",
        )),
        Err(_) => Err(CoordError::invalid(
            "status",
            format!("{raw} is not a TerminalStatus value (0 to 3)"),
        )),
    }
}

pub struct StartArgs {
    pub session_id: SessionId,
    pub source: Source,
    pub request_id: Option<RequestId>,
}

pub fn start(request: &pb::StartRequest) -> Result<StartArgs, CoordError> {
    Ok(StartArgs {
        session_id: session_id(&request.session_id)?,
        source: source(request.source)?,
        request_id: RequestId::parse_optional(&request.request_id)
            .map_err(|e| CoordError::invalid("request_id", e))?,
    })
}

pub struct FinishArgs {
    pub session_id: SessionId,
    pub response: Option<ResponseId>,
    pub status: FinishStatus,
}

pub fn finish(request: &pb::FinishRequest) -> Result<FinishArgs, CoordError> {
    Ok(FinishArgs {
        session_id: session_id(&request.session_id)?,
        response: ResponseId::new(request.response_id),
        status: finish_status(request.status)?,
    })
}

pub struct CancelArgs {
    pub session_id: SessionId,
    pub only_if: Option<ResponseId>,
    /// For observability only (stops by source); never changes a transition.
    pub source: Source,
}

pub fn cancel(request: &pb::CancelRequest) -> Result<CancelArgs, CoordError> {
    let session_id = session_id(&request.session_id)?;
    Ok(CancelArgs {
        session_id,
        only_if: ResponseId::new(request.if_response_id),
        source: source(request.source)?,
    })
}

pub struct ShutdownArgs {
    pub session_id: SessionId,
    pub source: Source,
}

pub fn shutdown(request: &pb::ShutdownRequest) -> Result<ShutdownArgs, CoordError> {
    Ok(ShutdownArgs {
        session_id: session_id(&request.session_id)?,
        source: source(request.source)?,
    })
}

pub struct ListArgs {
    pub page_size: usize,
    pub cursor: Option<PageToken>,
}

pub fn list(request: &pb::ListSessionsRequest) -> Result<ListArgs, CoordError> {
    let page_size = match usize::try_from(request.page_size).unwrap_or(MAX_PAGE_SIZE) {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    };
    let cursor = if request.page_token.is_empty() {
        None
    } else {
        Some(
            PageToken::decode(&request.page_token)
                .map_err(|e| CoordError::invalid("page_token", e))?,
        )
    };
    Ok(ListArgs { page_size, cursor })
}

/// What a Watch asks for.
pub enum WatchTarget {
    Session {
        session_id: SessionId,
        after_revision: Option<u64>,
    },
    All {
        after_seq: Option<u64>,
    },
}

pub fn watch(request: &pb::WatchRequest) -> Result<WatchTarget, CoordError> {
    if request.session_id.is_empty() {
        if request.after_revision.is_some() {
            return Err(CoordError::invalid(
                "after_revision",
                "applies to a single-session watch; a watch of every session (empty session_id) resumes with after_seq",
            ));
        }
        return Ok(WatchTarget::All {
            after_seq: request.after_seq,
        });
    }
    let session_id = session_id(&request.session_id)?;
    if request.after_seq.is_some() {
        return Err(CoordError::invalid(
            "after_seq",
            "applies to a watch of every session (empty session_id); a single-session watch resumes with after_revision",
        ));
    }
    Ok(WatchTarget::Session {
        session_id,
        after_revision: request.after_revision,
    })
}

fn source_to_proto(source: Source) -> pb::Source {
    match source {
        Source::Unspecified => pb::Source::Unspecified,
        Source::Client => pb::Source::Client,
        Source::Vad => pb::Source::Vad,
    }
}

fn reason_to_proto(reason: CancelReason) -> pb::CancelReason {
    match reason {
        CancelReason::Superseded => pb::CancelReason::Superseded,
        CancelReason::Requested => pb::CancelReason::Requested,
        CancelReason::Shutdown => pb::CancelReason::Shutdown,
        CancelReason::Expired => pb::CancelReason::Expired,
    }
}

pub fn state(snapshot: &SessionSnapshot) -> pb::SessionState {
    let (phase, active) = match snapshot.phase {
        Phase::Idle => (pb::Phase::Idle, None),
        Phase::Active(active) => (pb::Phase::Active, Some(active)),
        Phase::Terminated => (pb::Phase::Terminated, None),
    };
    pb::SessionState {
        session_id: snapshot.session_id.as_str().to_owned(),
        phase: phase.into(),
        active_response_id: response_id_or_zero(active.map(|a| a.id)),
        active_source: active
            .map_or(pb::Source::Unspecified, |a| source_to_proto(a.source))
            .into(),
        revision: snapshot.revision,
        responses_started: snapshot.responses_started,
        changed_unix_nanos: snapshot.changed_unix_nanos.unwrap_or(0),
    }
}

pub fn event(event: &LifecycleEvent) -> pb::LifecycleEvent {
    use pb::lifecycle_event::Kind;
    let kind = match event.kind {
        EventKind::Started { response, source } => Kind::Started(pb::ResponseStarted {
            response_id: response.get(),
            source: source_to_proto(source).into(),
        }),
        EventKind::CancelRequested {
            response,
            reason,
            source,
        } => Kind::CancelRequested(pb::ResponseCancelRequested {
            response_id: response.get(),
            reason: reason_to_proto(reason).into(),
            source: source_to_proto(source).into(),
        }),
        EventKind::Ended { response, ending } => {
            let (status, reason) = match ending {
                Terminal::Completed => {
                    (pb::TerminalStatus::Completed, pb::CancelReason::Unspecified)
                }
                Terminal::Failed => (pb::TerminalStatus::Failed, pb::CancelReason::Unspecified),
                Terminal::Cancelled(reason) => {
                    (pb::TerminalStatus::Cancelled, reason_to_proto(reason))
                }
            };
            Kind::Ended(pb::ResponseEnded {
                response_id: response.get(),
                status: status.into(),
                reason: reason.into(),
            })
        }
        EventKind::Terminated { reason } => Kind::Terminated(pb::SessionTerminated {
            reason: reason_to_proto(reason.into()).into(),
        }),
    };
    pb::LifecycleEvent {
        session_id: event.session_id.as_str().to_owned(),
        revision: event.revision,
        seq: event.seq,
        unix_nanos: event.unix_nanos,
        kind: Some(kind),
    }
}
