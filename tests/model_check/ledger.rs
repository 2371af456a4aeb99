//! The observer every model shares: it reads the lifecycle events a model
//! emits, one at a time and in order, and keeps just enough of them to judge
//! the safety properties. Nothing here looks at the machine's own state, so a
//! property that holds over the ledger holds over what a watcher of the
//! session's event stream would see.

use respcoord::{
    decision::{self, Presence, Stamp},
    events::SharedEvent,
    ids::{ResponseId, SessionId},
    machine::{EventKind, Outcome, Phase},
    session::{Call, Session},
};

/// Decides `call` on `session` with the decision both backends run
/// (`decision::decide`), its response ids and seqs from `first_seq`; the
/// reply and the events as a watcher would see them. The models answer a
/// replayed Start themselves, before deciding (as `distributed` does), so
/// none comes here.
pub fn decide(
    session: &mut Session,
    session_id: &SessionId,
    call: &Call,
    first_seq: u64,
) -> (Outcome, Vec<SharedEvent>) {
    let stamp = Stamp {
        first_seq,
        unix_nanos: 0,
        new_response: ResponseId::new(first_seq).expect("models number seqs from 1"),
    };
    // history_limit 0: retained events are not what is checked here, and
    // keeping them would only make states bigger.
    let decided = decision::decide(session, Presence::Stored, session_id, call, 0)
        .expect("a stored session is never refused")
        .settle(stamp, 0);
    assert!(!decided.replayed(), "the models answer replays themselves");
    let events = decided
        .change()
        .map(|change| change.events(session_id, first_seq).into_iter().collect())
        .unwrap_or_default();
    (decided.reply, events)
}

/// A sticky record of something a property forbids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fault {
    /// `ended` for a response that never started.
    EndedUnknown = 1 << 0,
    /// `started` for an id that already started.
    StartedTwice = 1 << 1,
    /// A response id not above every earlier one.
    IdNotIncreasing = 1 << 2,
    /// `started` after `terminated`.
    StartedAfterTerminated = 1 << 3,
    /// A second `terminated`.
    TerminatedTwice = 1 << 4,
    /// `cancel_requested` for a response that is not live.
    CancelRequestedNotLive = 1 << 5,
    /// Revisions with a gap, or seqs not consecutive from the call's first seq.
    Numbering = 1 << 6,
    /// The reply to a call disagrees with the events it emitted.
    OutcomeMismatch = 1 << 7,
    /// An `ended` for a response that already ended.
    EndedTwice = 1 << 8,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ledger {
    /// +1 per `started`, -1 per `ended`.
    pub live: i8,
    /// The highest and lowest `live` ever reached after any single event (not
    /// only between transitions).
    pub max_live: i8,
    pub min_live: i8,
    /// Every started response id in start order, with its number of `ended`s.
    pub responses: Vec<(u64, u8)>,
    /// Number of `terminated` events.
    pub terminated: u8,
    /// Last revision seen.
    pub revision: u64,
    faults: u16,
}

impl Ledger {
    fn fault(&mut self, fault: Fault) {
        self.faults |= fault as u16;
    }

    pub fn has(&self, fault: Fault) -> bool {
        self.faults & fault as u16 != 0
    }

    /// Feeds one event kind.
    pub fn observe(&mut self, kind: &EventKind) {
        match *kind {
            EventKind::Started { response, .. } => {
                let id = response.get();
                if self.terminated > 0 {
                    self.fault(Fault::StartedAfterTerminated);
                }
                if self.responses.iter().any(|(seen, _)| *seen == id) {
                    self.fault(Fault::StartedTwice);
                }
                if self.responses.last().is_some_and(|(last, _)| *last >= id) {
                    self.fault(Fault::IdNotIncreasing);
                }
                self.responses.push((id, 0));
                self.live += 1;
            }
            EventKind::CancelRequested { response, .. } => {
                if self.open() != Some(response.get()) {
                    self.fault(Fault::CancelRequestedNotLive);
                }
            }
            EventKind::Ended { response, .. } => {
                let id = response.get();
                match self.responses.iter_mut().find(|(seen, _)| *seen == id) {
                    Some((_, ends)) => {
                        *ends += 1;
                        if *ends > 1 {
                            self.fault(Fault::EndedTwice);
                        }
                    }
                    None => self.fault(Fault::EndedUnknown),
                }
                self.live -= 1;
            }
            EventKind::Terminated { .. } => {
                self.terminated += 1;
                if self.terminated > 1 {
                    self.fault(Fault::TerminatedTwice);
                }
            }
        }
        self.max_live = self.max_live.max(self.live);
        self.min_live = self.min_live.min(self.live);
    }

    /// Feeds the stamped events of one call, checking their numbering.
    pub fn observe_stamped(&mut self, first_seq: u64, events: &[SharedEvent]) {
        for (offset, event) in (0u64..).zip(events) {
            if event.revision != self.revision + 1 || event.seq != first_seq + offset {
                self.fault(Fault::Numbering);
            }
            self.revision = event.revision;
            self.observe(&event.kind);
        }
    }

    /// Feeds a call's reply and checks it against the call's events.
    pub fn check_outcome(&mut self, outcome: &Outcome, events: &[SharedEvent]) {
        let kinds: Vec<EventKind> = events.iter().map(|event| event.kind).collect();
        if !outcome_agrees(outcome, &kinds) {
            self.fault(Fault::OutcomeMismatch);
        }
    }

    /// The one started response without a terminal, if exactly one.
    pub fn open(&self) -> Option<u64> {
        let mut open = self.responses.iter().filter(|(_, ends)| *ends == 0);
        match (open.next(), open.next()) {
            (Some((id, _)), None) => Some(*id),
            _ => None,
        }
    }

    pub fn started(&self) -> impl Iterator<Item = u64> + '_ {
        self.responses.iter().map(|(id, _)| *id)
    }

    // ---- the properties, as predicates over the ledger ----

    /// At most one live response, at every event.
    pub fn at_most_one_live(&self) -> bool {
        self.min_live >= 0 && self.max_live <= 1 && (0..=1).contains(&self.live)
    }

    /// Every started response gets exactly one terminal: never two, never one
    /// for a response that did not start, and all of them once terminated.
    pub fn one_terminal_each(&self) -> bool {
        !self.has(Fault::EndedUnknown)
            && !self.has(Fault::EndedTwice)
            && !self.has(Fault::StartedTwice)
            && !self.has(Fault::CancelRequestedNotLive)
            && self.responses.iter().all(|(_, ends)| *ends <= 1)
            && (self.terminated == 0 || self.responses.iter().all(|(_, ends)| *ends == 1))
    }

    /// No `started` after `terminated`, and `terminated` at most once.
    pub fn nothing_after_terminated(&self) -> bool {
        !self.has(Fault::StartedAfterTerminated) && !self.has(Fault::TerminatedTwice)
    }

    /// Ids strictly increase; revisions are gap-free; replies match events.
    pub fn well_numbered_and_replies_agree(&self) -> bool {
        !self.has(Fault::IdNotIncreasing)
            && !self.has(Fault::Numbering)
            && !self.has(Fault::OutcomeMismatch)
    }

    /// The session record is what the events say it is: its phase, its
    /// revision (the last event's) and its count of started responses.
    pub fn session_consistent(&self, session: &Session, session_id: &SessionId) -> bool {
        let snapshot = session.snapshot(session_id);
        self.phase_consistent(snapshot.phase)
            && snapshot.revision == self.revision
            && usize::try_from(snapshot.responses_started).ok() == Some(self.responses.len())
    }

    /// The machine's phase is what the events say it is.
    pub fn phase_consistent(&self, phase: Phase) -> bool {
        let open: Vec<u64> = self
            .responses
            .iter()
            .filter(|(_, ends)| *ends == 0)
            .map(|(id, _)| *id)
            .collect();
        match phase {
            Phase::Idle => self.live == 0 && open.is_empty() && self.terminated == 0,
            Phase::Active(active) => {
                self.live == 1 && open == [active.id.get()] && self.terminated == 0
            }
            Phase::Terminated => self.live == 0 && open.is_empty() && self.terminated == 1,
        }
    }
}

/// Whether a reply says what the events did (the contract's semantics table,
/// restated from the reply's side).
pub fn outcome_agrees(outcome: &Outcome, events: &[EventKind]) -> bool {
    let started: Vec<u64> = events
        .iter()
        .filter_map(|kind| match kind {
            EventKind::Started { response, .. } => Some(response.get()),
            _ => None,
        })
        .collect();
    let ended: Vec<u64> = events
        .iter()
        .filter_map(|kind| match kind {
            EventKind::Ended { response, .. } => Some(response.get()),
            _ => None,
        })
        .collect();
    let terminated = events
        .iter()
        .filter(|kind| matches!(kind, EventKind::Terminated { .. }))
        .count();
    let ids = |id: &Option<respcoord::ids::ResponseId>| -> Vec<u64> {
        id.iter().map(|id| id.get()).collect()
    };
    match outcome {
        Outcome::Started {
            response,
            superseded,
        } => {
            started == [response.get()]
                && ended == ids(superseded)
                && terminated == 0
                // the old response's terminal comes before the new start
                && matches!(events.last(), Some(EventKind::Started { .. }))
        }
        Outcome::StartRefused => events.is_empty(),
        Outcome::Finished { applied } => {
            started.is_empty() && ended.len() == usize::from(*applied) && terminated == 0
        }
        Outcome::Cancelled { cancelled } => {
            started.is_empty() && ended == ids(cancelled) && terminated == 0
        }
        Outcome::TornDown { cancelled } => {
            started.is_empty()
                && ended == ids(cancelled)
                && terminated <= 1
                && (events.is_empty()
                    || matches!(events.last(), Some(EventKind::Terminated { .. })))
        }
    }
}
