//! Judges every replica's watch-all recording against the contract's
//! invariants and the acknowledged answers:
//!
//! - each recording: seqs strictly increasing; per session, revisions
//!   gap-free and increasing (so no (session, revision) twice); M3 on the
//!   stream: at most one live response (Started .. Ended), every
//!   CancelRequested followed by its response's Ended, no Ended but of the
//!   live response (so exactly one per Started), response ids strictly
//!   increasing across Started events, nothing after Terminated;
//! - recordings against each other: an event both hold is the same event
//!   (kind and seq, which the NATS backend derives from the stream sequence)
//!   and their common events come in the same order;
//! - every acknowledged transition is in every complete recording, with the
//!   events its transition emits (src/machine.rs): a supersede is
//!   CancelRequested(old), Ended(old), Started(new); a cancel is
//!   CancelRequested, Ended; a shutdown of a live response CancelRequested,
//!   Ended, Terminated; a Finish that applied ends its response without a
//!   CancelRequested before.
//!
//! A recording that is not complete (its replica was killed) may start late
//! and stop early: its sessions may open at any revision, and it is not
//! asked to hold acknowledged transitions.

use std::{
    collections::{HashMap, HashSet},
    fmt,
};

use crate::{
    history::{Answer, Call, EventKind, Op, Outcome, WatchedEvent},
    linearizability::Violation,
};

/// One replica's watch-all recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recording {
    pub replica: usize,
    pub events: Vec<WatchedEvent>,
    /// The watch ran for the whole run; `false` when the replica was killed,
    /// so the recording may miss events at its ends.
    pub complete: bool,
}

/// What the watch check looked at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    pub recordings: usize,
    pub events: usize,
    pub sessions: usize,
    /// Acknowledged transitions found in every complete recording.
    pub acknowledged: usize,
}

impl fmt::Display for WatchStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "watches: {} recordings, {} events, {} sessions, {} acknowledged answers found in them",
            self.recordings, self.events, self.sessions, self.acknowledged
        )
    }
}

/// Checks each recording on its own, the recordings against each other, and
/// every acknowledged transition against every complete recording.
pub fn check_watches(ops: &[Op], recordings: &[Recording]) -> Result<WatchStats, Box<Violation>> {
    let mut sessions = HashSet::new();
    for recording in recordings {
        sessions.extend(recording.events.iter().map(|e| e.session.as_str()));
        check_recording(recording)?;
    }
    for (i, a) in recordings.iter().enumerate() {
        for b in &recordings[i + 1..] {
            check_agreement(a, b)?;
        }
    }
    let acknowledged = check_acknowledged(ops, recordings)?;
    Ok(WatchStats {
        recordings: recordings.len(),
        events: recordings.iter().map(|r| r.events.len()).sum(),
        sessions: sessions.len(),
        acknowledged,
    })
}

fn violation<'a>(
    session: Option<&str>,
    reason: String,
    events: impl IntoIterator<Item = (usize, &'a WatchedEvent)>,
) -> Box<Violation> {
    let mut violation = Violation::new("watch", session, reason);
    violation.events = events.into_iter().map(|(r, e)| (r, e.clone())).collect();
    Box::new(violation)
}

/// What an acknowledged answer lacks in a recording, and the events near
/// where it should be.
type Missing<'a> = (String, Vec<(usize, &'a WatchedEvent)>);

/// What a recording has shown of one session so far.
#[derive(Default)]
struct Stream<'a> {
    last: Option<&'a WatchedEvent>,
    /// `None` until known (an incomplete recording that opens mid-session).
    live: Option<Option<u64>>,
    last_started: Option<u64>,
    terminated: bool,
    /// A CancelRequested whose Ended must come next (one transition).
    cancelling: Option<u64>,
}

impl<'a> Stream<'a> {
    fn accept(&mut self, event: &'a WatchedEvent, complete: bool) -> Result<(), String> {
        match self.last.map(|last| last.revision) {
            None if complete && event.revision != 1 => {
                return Err(format!(
                    "a complete recording opens the session at revision {}, not 1",
                    event.revision
                ))
            }
            None => self.live = (event.revision == 1).then_some(None),
            Some(last) if event.revision == last => {
                return Err(format!("revision {last} delivered twice"))
            }
            Some(last) if event.revision < last => {
                return Err(format!("revision {} after {last}", event.revision))
            }
            Some(last) if event.revision > last + 1 => {
                return Err(format!(
                    "gap: revisions {} to {} missing",
                    last + 1,
                    event.revision - 1
                ))
            }
            Some(_) => {}
        }
        self.last = Some(event);
        if self.terminated {
            return Err(format!("{:?} after Terminated", event.kind));
        }
        if let Some(cancelling) = self.cancelling.take() {
            if event.kind
                != (EventKind::Ended {
                    response: cancelling,
                })
            {
                return Err(format!(
                    "CancelRequested {cancelling} is not followed by its Ended"
                ));
            }
        }
        match (event.kind, self.live) {
            (EventKind::Started { response }, Some(Some(live))) => {
                return Err(format!(
                    "two live responses: {response} started while {live} is live"
                ))
            }
            (EventKind::Started { response }, _) => {
                if let Some(last) = self.last_started.filter(|&last| response <= last) {
                    return Err(format!(
                        "response ids not increasing: {response} started after {last}"
                    ));
                }
                self.last_started = Some(response);
                self.live = Some(Some(response));
            }
            (EventKind::CancelRequested { response }, Some(Some(live))) if live == response => {
                self.cancelling = Some(response);
            }
            (EventKind::CancelRequested { response }, None) => {
                self.cancelling = Some(response);
                self.live = Some(Some(response));
            }
            (EventKind::CancelRequested { response }, Some(live)) => {
                return Err(format!(
                    "CancelRequested {response} while the live response is {live:?}"
                ))
            }
            (EventKind::Ended { response }, Some(Some(live))) if live == response => {
                self.live = Some(None);
            }
            (EventKind::Ended { .. }, None) => self.live = Some(None),
            (EventKind::Ended { response }, Some(live)) => {
                return Err(format!(
                    "Ended {response} while the live response is {live:?} \
                     (a second Ended, or one never Started)"
                ))
            }
            (EventKind::Terminated, Some(Some(live))) => {
                return Err(format!("Terminated while {live} is live"))
            }
            (EventKind::Terminated, _) => self.terminated = true,
        }
        Ok(())
    }
}

fn check_recording(recording: &Recording) -> Result<(), Box<Violation>> {
    let replica = recording.replica;
    let mut previous: Option<&WatchedEvent> = None;
    let mut streams: HashMap<&str, Stream> = HashMap::new();
    for event in &recording.events {
        if let Some(previous) = previous.filter(|p| event.seq <= p.seq) {
            return Err(violation(
                Some(&event.session),
                format!("replica {replica}'s seqs are not strictly increasing"),
                [(replica, previous), (replica, event)],
            ));
        }
        previous = Some(event);
        let stream = streams.entry(event.session.as_str()).or_default();
        let before = stream.last;
        stream.accept(event, recording.complete).map_err(|reason| {
            violation(
                Some(&event.session),
                format!("replica {replica}: {reason}"),
                before.into_iter().chain([event]).map(|e| (replica, e)),
            )
        })?;
    }
    if !recording.complete {
        return Ok(());
    }
    for (session, stream) in streams {
        if let (Some(cancelling), Some(last)) = (stream.cancelling, stream.last) {
            return Err(violation(
                Some(session),
                format!("replica {replica}: CancelRequested {cancelling} is never followed by its Ended"),
                [(replica, last)],
            ));
        }
    }
    Ok(())
}

/// Events both recordings hold are the same and in the same order.
fn check_agreement(a: &Recording, b: &Recording) -> Result<(), Box<Violation>> {
    let index: HashMap<(&str, u64), (usize, &WatchedEvent)> = (b.events.iter().enumerate())
        .map(|(i, e)| ((e.session.as_str(), e.revision), (i, e)))
        .collect();
    let mut last: Option<(usize, &WatchedEvent, &WatchedEvent)> = None;
    for ea in &a.events {
        let Some(&(position, eb)) = index.get(&(ea.session.as_str(), ea.revision)) else {
            continue;
        };
        if ea.kind != eb.kind || ea.seq != eb.seq {
            return Err(violation(
                Some(&ea.session),
                format!(
                    "replicas {} and {} disagree on revision {} of the session",
                    a.replica, b.replica, ea.revision
                ),
                [(a.replica, ea), (b.replica, eb)],
            ));
        }
        if let Some((_, la, lb)) = last.filter(|(p, ..)| position < *p) {
            return Err(violation(
                Some(&ea.session),
                format!(
                    "replicas {} and {} deliver events in different orders",
                    a.replica, b.replica
                ),
                [
                    (a.replica, la),
                    (a.replica, ea),
                    (b.replica, eb),
                    (b.replica, lb),
                ],
            ));
        }
        last = Some((position, ea, eb));
    }
    Ok(())
}

/// One complete recording, looked up by (session, revision) and by
/// (session, kind); kinds are unique per session in a recording that
/// passed `check_recording`.
struct Index<'a> {
    replica: usize,
    at: HashMap<(&'a str, u64), &'a WatchedEvent>,
    by_kind: HashMap<(&'a str, EventKind), u64>,
    latest: HashMap<&'a str, u64>,
}

impl<'a> Index<'a> {
    fn new(recording: &'a Recording) -> Self {
        let mut index = Self {
            replica: recording.replica,
            at: HashMap::new(),
            by_kind: HashMap::new(),
            latest: HashMap::new(),
        };
        for event in &recording.events {
            let session = event.session.as_str();
            index.at.insert((session, event.revision), event);
            index.by_kind.insert((session, event.kind), event.revision);
            let latest = index.latest.entry(session).or_default();
            *latest = (*latest).max(event.revision);
        }
        index
    }

    fn kind_at(&self, session: &str, revision: u64) -> Option<EventKind> {
        self.at.get(&(session, revision)).map(|e| e.kind)
    }

    /// The events of `session` from `from` to `to` (revisions), for a report.
    fn around(&self, session: &str, from: u64, to: u64) -> Vec<(usize, &'a WatchedEvent)> {
        (from.max(1)..=to)
            .filter_map(|r| self.at.get(&(session, r)).map(|e| (self.replica, *e)))
            .collect()
    }

    /// Whether `op`'s acknowledged answer is in this recording: `Ok(true)`
    /// checked, `Ok(false)` nothing to check, `Err` what is missing.
    fn holds(&self, op: &Op) -> Result<bool, Missing<'a>> {
        let Outcome::Ok(answer) = &op.outcome else {
            return Ok(false);
        };
        let s = op.session.as_str();
        let find = |kind: EventKind| {
            self.by_kind.get(&(s, kind)).copied().ok_or_else(|| {
                let latest = self.latest.get(s).copied().unwrap_or(0);
                (
                    format!("no {kind:?} event"),
                    self.around(s, latest.saturating_sub(2), latest),
                )
            })
        };
        let expect = |revision: u64, kind: EventKind, what: &str| {
            if revision == 0 || self.kind_at(s, revision) != Some(kind) {
                let near = self.around(s, revision.saturating_sub(2), revision + 2);
                return Err((format!("{what}: revision {revision} is not {kind:?}"), near));
            }
            Ok(())
        };
        match *answer {
            Answer::Started {
                response,
                superseded,
                replayed,
            } => {
                let started = find(EventKind::Started { response })?;
                if let (false, Some(old)) = (replayed, superseded) {
                    let what = "the supersede is not CancelRequested, Ended, Started";
                    expect(started - 1, EventKind::Ended { response: old }, what)?;
                    expect(
                        started - 2,
                        EventKind::CancelRequested { response: old },
                        what,
                    )?;
                }
            }
            Answer::StartRefused => {
                find(EventKind::Terminated)?;
            }
            Answer::Finished { applied: true } => {
                let Call::Finish {
                    response: Some(response),
                } = op.call
                else {
                    return Ok(false);
                };
                let ended = find(EventKind::Ended { response })?;
                if self.kind_at(s, ended - 1) == Some(EventKind::CancelRequested { response }) {
                    return Err((
                        "a Finish that applied, but its response was cancelled".to_owned(),
                        self.around(s, ended - 1, ended),
                    ));
                }
            }
            Answer::Cancelled {
                cancelled: Some(response),
            } => {
                let requested = find(EventKind::CancelRequested { response })?;
                expect(requested + 1, EventKind::Ended { response }, "a cancel")?;
            }
            Answer::ShutDown { cancelled } => {
                let terminated = find(EventKind::Terminated)?;
                if let Some(response) = cancelled {
                    let what = "the shutdown of a live response";
                    expect(terminated - 1, EventKind::Ended { response }, what)?;
                    expect(
                        terminated - 2,
                        EventKind::CancelRequested { response },
                        what,
                    )?;
                }
            }
            Answer::State {
                active,
                terminated,
                revision,
                ..
            } => {
                if revision > 0 && self.kind_at(s, revision).is_none() {
                    return Err((
                        format!(
                            "GetState saw revision {revision}, the recording has no such event"
                        ),
                        self.around(s, revision.saturating_sub(2), revision),
                    ));
                }
                if let Some(response) = active {
                    find(EventKind::Started { response })?;
                }
                if terminated {
                    find(EventKind::Terminated)?;
                }
            }
            Answer::Finished { applied: false }
            | Answer::Cancelled { cancelled: None }
            | Answer::NotFound => return Ok(false),
        }
        Ok(true)
    }
}

/// Every acknowledged transition is in every complete recording; returns
/// how many answers were checked.
fn check_acknowledged(ops: &[Op], recordings: &[Recording]) -> Result<usize, Box<Violation>> {
    let indexes: Vec<Index> = recordings
        .iter()
        .filter(|r| r.complete)
        .map(Index::new)
        .collect();
    let mut checked = 0;
    for op in ops {
        let mut any = false;
        for index in &indexes {
            match index.holds(op) {
                Ok(held) => any |= held,
                Err((what, events)) => {
                    let mut violation = violation(
                        Some(&op.session),
                        format!(
                            "an acknowledged answer is missing from replica {}'s complete recording: {what}",
                            index.replica
                        ),
                        events,
                    );
                    violation.ops = vec![op.clone()];
                    return Err(violation);
                }
            }
        }
        checked += usize::from(any);
    }
    Ok(checked)
}
