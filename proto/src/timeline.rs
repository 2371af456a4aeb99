//! A session's events read as responses: who started each, when, how it
//! ended and why, and which Start superseded it. The answer to "what
//! happened to that response, and who did it?" that `respcoordctl timeline`
//! prints and the server's web view draws, folded in one place so both say
//! the same thing.
//!
//! Pure: a fold over [`pb::LifecycleEvent`]s in revision order, no I/O and
//! no clock. It reads the contract's events; it never decides a transition,
//! so it does not need the lifecycle machine, only what its events mean
//! (PROTOCOL.md): a supersede is the old response's `ended` (reason
//! SUPERSEDED) followed, in the same transition, by the new `started`.
//!
//! A row says who started a response and who stopped it: the source on
//! its `cancel_requested` (the Cancel's, the superseding Start's or the
//! Shutdown's; an expiry, and an event stored before 0.2.0, say unspecified)
//! and, for a supersede, which response's Start stopped it.

use std::collections::VecDeque;

use crate::v1::{self as pb, lifecycle_event::Kind};

/// Most responses one [`Timeline`] keeps; older rows are dropped first. A
/// session retains far fewer events than this (`--session-history`), so the
/// bound only matters to a view that follows a session for hours.
pub const MAX_RESPONSES: usize = 512;

/// One response's life, as far as the events seen show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseRow {
    pub response_id: u64,
    /// SOURCE_UNSPECIFIED too when the `started` event was not seen.
    pub source: pb::Source,
    /// `None` when the `started` event is older than the retained history.
    pub started: Option<Stamp>,
    pub cancel_requested: Option<Stamp>,
    /// Who asked for the cancel: the source on its `cancel_requested`.
    pub cancel_source: Option<pb::Source>,
    pub ended: Option<End>,
    /// The response whose Start stopped this one, and that Start's source.
    pub superseded_by: Option<(u64, pb::Source)>,
}

/// When an event happened: its revision and wall-clock time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub revision: u64,
    pub unix_nanos: i64,
}

/// How a response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    pub at: Stamp,
    pub status: pb::TerminalStatus,
    /// CANCEL_REASON_UNSPECIFIED unless `status` is CANCELLED.
    pub reason: pb::CancelReason,
}

impl ResponseRow {
    fn new(response_id: u64) -> Self {
        Self {
            response_id,
            source: pb::Source::Unspecified,
            started: None,
            cancel_requested: None,
            cancel_source: None,
            ended: None,
            superseded_by: None,
        }
    }

    /// From start to end, when both were seen.
    pub fn duration_nanos(&self) -> Option<i64> {
        Some(self.ended?.at.unix_nanos - self.started?.unix_nanos)
    }

    pub fn is_live(&self) -> bool {
        self.ended.is_none()
    }
}

/// How the session was torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Teardown {
    pub at: Stamp,
    /// SHUTDOWN or EXPIRED.
    pub reason: pb::CancelReason,
}

/// The rows an event changed: the response it names and, for the `started`
/// of a supersede, the response it stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    ids: [Option<u64>; 2],
}

impl Changed {
    fn one(id: u64) -> Self {
        Self {
            ids: [Some(id), None],
        }
    }

    pub fn response_ids(self) -> impl Iterator<Item = u64> {
        self.ids.into_iter().flatten()
    }
}

/// One session's responses, folded from its events in revision order.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    responses: VecDeque<ResponseRow>,
    terminated: Option<Teardown>,
    last_revision: u64,
    dropped: u64,
}

impl Timeline {
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event in. Events at or below the last revision seen are
    /// ignored (a resumed watch may repeat what a snapshot showed).
    pub fn apply(&mut self, event: &pb::LifecycleEvent) -> Changed {
        if event.revision <= self.last_revision {
            return Changed::default();
        }
        self.last_revision = event.revision;
        let at = Stamp {
            revision: event.revision,
            unix_nanos: event.unix_nanos,
        };
        match &event.kind {
            Some(Kind::Started(started)) => {
                let superseded = self.supersede_by(at, started.response_id, started.source());
                let row = self.row(started.response_id);
                row.source = started.source();
                row.started = Some(at);
                Changed {
                    ids: [Some(started.response_id), superseded],
                }
            }
            Some(Kind::CancelRequested(cancel)) => {
                let row = self.row(cancel.response_id);
                row.cancel_requested = Some(at);
                row.cancel_source = Some(cancel.source());
                Changed::one(cancel.response_id)
            }
            Some(Kind::Ended(ended)) => {
                self.row(ended.response_id).ended = Some(End {
                    at,
                    status: ended.status(),
                    reason: ended.reason(),
                });
                Changed::one(ended.response_id)
            }
            Some(Kind::Terminated(terminated)) => {
                self.terminated = Some(Teardown {
                    at,
                    reason: terminated.reason(),
                });
                Changed::default()
            }
            None => Changed::default(),
        }
    }

    /// Marks the response that the `started` at `at` superseded: the one
    /// that ended SUPERSEDED at the revision just before it (the same
    /// transition). Returns its id.
    fn supersede_by(&mut self, at: Stamp, by: u64, source: pb::Source) -> Option<u64> {
        let stopped = self.responses.iter_mut().rev().find(|row| {
            row.ended.is_some_and(|end| {
                end.reason == pb::CancelReason::Superseded && end.at.revision + 1 == at.revision
            })
        })?;
        stopped.superseded_by = Some((by, source));
        Some(stopped.response_id)
    }

    /// The row of `response_id`, made if this is its first event seen.
    fn row(&mut self, response_id: u64) -> &mut ResponseRow {
        let index = match self
            .responses
            .iter()
            .rposition(|row| row.response_id == response_id)
        {
            Some(index) => index,
            None => {
                if self.responses.len() == MAX_RESPONSES {
                    self.responses.pop_front();
                    self.dropped += 1;
                }
                self.responses.push_back(ResponseRow::new(response_id));
                self.responses.len() - 1
            }
        };
        &mut self.responses[index]
    }

    /// Oldest first.
    pub fn responses(&self) -> impl ExactSizeIterator<Item = &ResponseRow> {
        self.responses.iter()
    }

    pub fn response(&self, response_id: u64) -> Option<&ResponseRow> {
        self.responses
            .iter()
            .rev()
            .find(|row| row.response_id == response_id)
    }

    /// The rows an [`apply`](Timeline::apply) changed, as they are now.
    pub fn changed_rows(&self, changed: Changed) -> impl Iterator<Item = &ResponseRow> {
        changed.response_ids().filter_map(|id| self.response(id))
    }

    pub fn terminated(&self) -> Option<Teardown> {
        self.terminated
    }

    pub fn last_revision(&self) -> u64 {
        self.last_revision
    }

    /// Rows dropped to stay within [`MAX_RESPONSES`].
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// A session's state as one event leaves it: what a list of sessions shows
/// for the session after each change, without reading the state again.
/// Every transition's last event says where it left the session (a
/// supersede ends in its `started`, a cancel in its `ended`), so the state
/// after a transition is the one after its last event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionChange {
    pub session_id: String,
    pub phase: pb::Phase,
    /// 0 unless active.
    pub active_response_id: u64,
    pub active_source: pb::Source,
    pub revision: u64,
    pub changed_unix_nanos: i64,
}

impl SessionChange {
    pub fn after(event: &pb::LifecycleEvent) -> Self {
        let (phase, active_response_id, active_source) = match &event.kind {
            Some(Kind::Started(started)) => {
                (pb::Phase::Active, started.response_id, started.source())
            }
            // A cancel is requested of the live response, which stays live
            // until its `ended`, the next event of the same transition.
            Some(Kind::CancelRequested(cancel)) => (
                pb::Phase::Active,
                cancel.response_id,
                pb::Source::Unspecified,
            ),
            Some(Kind::Ended(_)) | None => (pb::Phase::Idle, 0, pb::Source::Unspecified),
            Some(Kind::Terminated(_)) => (pb::Phase::Terminated, 0, pb::Source::Unspecified),
        };
        Self {
            session_id: event.session_id.clone(),
            phase,
            active_response_id,
            active_source,
            revision: event.revision,
            changed_unix_nanos: event.unix_nanos,
        }
    }
}

/// The revision a watch can resume after, as a Watch's OUT_OF_RANGE answer
/// states it ("... (resume from N or later) ..."): where a session's
/// retained history now starts, so a timeline can read from there.
pub fn resume_point(message: &str) -> Option<u64> {
    let rest = message.split("resume from ").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Opens a watch of a session's whole retained history: from its first
/// event, or, when that is no longer retained, from where the OUT_OF_RANGE
/// answer says the history now starts ([`resume_point`]). `open` makes one
/// Watch with the given `after_revision`; the answer is the open watch and
/// the revision its history starts after. Each retry starts later, so it
/// ends. Written once for `respcoordctl timeline` and the web view.
pub async fn open_retained<W, F, Fut>(mut open: F) -> Result<(W, u64), tonic::Status>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<W, tonic::Status>>,
{
    let mut after = 0;
    loop {
        match open(after).await {
            Ok(watch) => return Ok((watch, after)),
            Err(status) if status.code() == tonic::Code::OutOfRange => {
                match resume_point(status.message()) {
                    Some(oldest) if oldest > after => after = oldest,
                    _ => return Err(status),
                }
            }
            Err(status) => return Err(status),
        }
    }
}

/// A contract enum's value name without its prefix, lower case
/// (`SOURCE_VAD` → `vad`), as the tools print and the web view's JSON says.
pub fn short_name(full: &'static str) -> &'static str {
    let short = ["PHASE_", "SOURCE_", "TERMINAL_STATUS_", "CANCEL_REASON_"]
        .iter()
        .find_map(|prefix| full.strip_prefix(prefix))
        .unwrap_or(full);
    LOWER
        .iter()
        .find(|(upper, _)| *upper == short)
        .map_or(short, |(_, lower)| lower)
}

/// Every value name of the contract's enums, lower-cased once here so that
/// [`short_name`] returns a `&'static str` without allocating.
const LOWER: &[(&str, &str)] = &[
    ("UNSPECIFIED", "unspecified"),
    ("IDLE", "idle"),
    ("ACTIVE", "active"),
    ("TERMINATED", "terminated"),
    ("CLIENT", "client"),
    ("VAD", "vad"),
    ("COMPLETED", "completed"),
    ("FAILED", "failed"),
    ("CANCELLED", "cancelled"),
    ("SUPERSEDED", "superseded"),
    ("REQUESTED", "requested"),
    ("SHUTDOWN", "shutdown"),
    ("EXPIRED", "expired"),
];

#[cfg(feature = "serde")]
mod json;
#[cfg(feature = "serde")]
pub use json::{
    id_text, optional_id_text, EventJson, ResponseJson, SessionChangeJson, StateJson, TeardownJson,
};

#[cfg(test)]
mod tests;
