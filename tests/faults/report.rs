//! How the checkers print what they found: one call or event a line, with
//! its times, client and replica, so a failing run reads without a debugger.

use std::fmt::{self, Write as _};

use crate::{
    history::{Answer, Call, EventKind, Op, Outcome, WatchedEvent},
    linearizability::Violation,
};

pub fn violation(v: &Violation, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{} violation", v.check)?;
    if let Some(session) = &v.session {
        write!(f, " on session {session:?}")?;
    }
    writeln!(f, ": {}", v.reason)?;
    if !v.states.is_empty() {
        writeln!(f, "  before them the session is in one of these states:")?;
        for state in &v.states {
            writeln!(f, "    {state}")?;
        }
    }
    if !v.context.is_empty() {
        writeln!(f, "  the last settled calls that changed it:")?;
        for op in &v.context {
            writeln!(f, "    {}", op_line(op))?;
        }
    }
    if !v.ops.is_empty() {
        writeln!(f, "  calls:")?;
        for op in &v.ops {
            let mark = match &v.culprit {
                Some(culprit) if culprit == op => "  <== cannot be explained",
                _ => "",
            };
            writeln!(f, "    {}{mark}", op_line(op))?;
        }
    }
    if !v.events.is_empty() {
        writeln!(f, "  events:")?;
        for (replica, event) in &v.events {
            writeln!(f, "    replica {replica}: {}", event_line(event))?;
        }
    }
    Ok(())
}

/// `[invoked .. completed] client c -> replica r: call => outcome`, times in
/// seconds since the run began.
pub fn op_line(op: &Op) -> String {
    let seconds = |nanos: u64| format!("{:.6}", nanos as f64 / 1e9);
    let completed = op.completed.map_or_else(|| "never".to_owned(), seconds);
    format!(
        "[{} .. {}] client {} -> replica {}: {} => {}",
        seconds(op.invoked),
        completed,
        op.client,
        op.replica,
        call(&op.call),
        outcome(&op.outcome)
    )
}

pub fn event_line(event: &WatchedEvent) -> String {
    let kind = match event.kind {
        EventKind::Started { response } => format!("Started {response}"),
        EventKind::CancelRequested { response } => format!("CancelRequested {response}"),
        EventKind::Ended { response } => format!("Ended {response}"),
        EventKind::Terminated => "Terminated".to_owned(),
    };
    format!(
        "session {:?} revision {} seq {}: {kind}",
        event.session, event.revision, event.seq
    )
}

fn call(call: &Call) -> String {
    match call {
        Call::Start { request_id: None } => "Start".to_owned(),
        Call::Start {
            request_id: Some(id),
        } => format!("Start(request {id:?})"),
        Call::Finish { response } => format!("Finish({})", id(*response)),
        Call::Cancel { only_if: None } => "Cancel".to_owned(),
        Call::Cancel {
            only_if: Some(only),
        } => format!("Cancel(only if {only})"),
        Call::Shutdown => "Shutdown".to_owned(),
        Call::GetState => "GetState".to_owned(),
    }
}

fn outcome(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Ok(answer) => self::answer(answer),
        Outcome::Failed(code) => format!("failed ({code:?}: did not happen)"),
        Outcome::Unknown(code) => format!("unknown ({code:?}: may or may not have happened)"),
    }
}

fn answer(answer: &Answer) -> String {
    match answer {
        Answer::Started {
            response,
            superseded,
            replayed,
        } => {
            let mut text = format!("started {response}");
            if let Some(old) = superseded {
                let _ = write!(text, ", superseding {old}");
            }
            if *replayed {
                text.push_str(" (replayed)");
            }
            text
        }
        Answer::Finished { applied } => format!("finished, applied={applied}"),
        Answer::Cancelled { cancelled } => format!("cancelled {}", id(*cancelled)),
        Answer::ShutDown { cancelled } => format!("shut down, cancelled {}", id(*cancelled)),
        Answer::State {
            active,
            terminated,
            revision,
            responses_started,
        } => format!(
            "state: active {}, terminated={terminated}, revision {revision}, {responses_started} started",
            id(*active)
        ),
        Answer::StartRefused => "refused (FAILED_PRECONDITION: terminated)".to_owned(),
        Answer::NotFound => "NOT_FOUND".to_owned(),
    }
}

fn id(id: Option<u64>) -> String {
    id.map_or_else(|| "none".to_owned(), |id| id.to_string())
}
