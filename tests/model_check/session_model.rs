//! Model 1: the spec's `Session` role, driven through the real code.
//!
//! Each action is one of the spec's actions (`StartFromClient`,
//! `StartFromVad`, `FinishCurrent`, `CancelReq`, `Shutdown`), plus the inputs
//! the real machine takes that the spec folds away: a Finish naming a
//! response that is no longer the active one (a late or duplicated report),
//! a Cancel fenced by `if_response_id`, a Finish with status FAILED, and
//! teardown by idle expiry. Every action is carried out by
//! `respcoord::session::Session::apply`, which calls
//! `respcoord::machine::transition`; the model adds nothing but the choice of
//! input and a ledger of the events that came out.

use respcoord::{
    ids::{ResponseId, SessionId},
    machine::{FinishStatus, Outcome, Phase, Source, TeardownReason},
    session::{Call, Session},
};
use stateright::{Model, Property};

use crate::ledger::Ledger;

/// The spec's bound: at most this many responses start.
pub const MAX_RESPONSES: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpecAction {
    StartFromClient,
    StartFromVad,
    /// The spec's FinishCurrent: the active response reports its terminal.
    /// With no active response it names id 0, which is always stale.
    FinishCurrent(FinishStatus),
    /// A Finish naming a response that already ended or was superseded.
    FinishStale(u64),
    /// The spec's CancelReq (no `if_response_id`).
    CancelReq,
    /// CancelReq fenced with `if_response_id`.
    CancelIf(u64),
    /// The spec's Shutdown.
    Shutdown,
    /// Idle expiry: the same teardown, reason EXPIRED.
    Expire,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SpecState {
    pub session: Session,
    /// The event log's next seq. A call's events take seqs from here, and a
    /// Start's response id is the seq of the call's first event, as in the
    /// registry.
    pub next_seq: u64,
    pub ledger: Ledger,
    /// The last action, the reply it got and how many events it emitted, for
    /// the reachability properties.
    pub last: Option<(SpecAction, Outcome, usize)>,
}

pub struct SessionModel {
    pub session_id: SessionId,
}

impl SessionModel {
    pub fn new() -> Self {
        Self {
            session_id: SessionId::parse("model-session").expect("valid session id"),
        }
    }

    fn call(state: &SpecState, action: SpecAction) -> Call {
        match action {
            SpecAction::StartFromClient => Call::Start {
                source: Source::Client,
                request_id: None,
            },
            SpecAction::StartFromVad => Call::Start {
                source: Source::Vad,
                request_id: None,
            },
            SpecAction::FinishCurrent(status) => Call::Finish {
                response: state.session.phase().active().map(|active| active.id),
                status,
            },
            SpecAction::FinishStale(id) => Call::Finish {
                response: ResponseId::new(id),
                status: FinishStatus::Completed,
            },
            SpecAction::CancelReq => Call::Cancel {
                only_if: None,
                source: Source::Client,
            },
            SpecAction::CancelIf(id) => Call::Cancel {
                only_if: ResponseId::new(id),
                source: Source::Client,
            },
            SpecAction::Shutdown => Call::Teardown {
                reason: TeardownReason::Shutdown,
                source: respcoord::machine::Source::Unspecified,
            },
            SpecAction::Expire => Call::Teardown {
                reason: TeardownReason::Expired,
                source: respcoord::machine::Source::Unspecified,
            },
        }
    }
}

fn last(state: &SpecState) -> Option<(SpecAction, Outcome)> {
    state.last.map(|(action, outcome, _)| (action, outcome))
}

fn last_events(state: &SpecState) -> usize {
    state.last.map_or(0, |(_, _, events)| events)
}

fn active_id(state: &SpecState) -> Option<u64> {
    state.session.phase().active().map(|active| active.id.get())
}

impl Model for SessionModel {
    type State = SpecState;
    type Action = SpecAction;

    fn init_states(&self) -> Vec<SpecState> {
        vec![SpecState {
            session: Session::new(0),
            // The real log starts above zero; any positive base will do.
            next_seq: 1,
            ledger: Ledger::default(),
            last: None,
        }]
    }

    fn actions(&self, state: &SpecState, actions: &mut Vec<SpecAction>) {
        // Like the spec's `require next_id < MAX_RESPONSES`, but a Start is
        // still offered once the session is torn down (the real service gets
        // them; they must be refused).
        if state.ledger.responses.len() < MAX_RESPONSES {
            actions.push(SpecAction::StartFromClient);
            actions.push(SpecAction::StartFromVad);
        }
        actions.push(SpecAction::FinishCurrent(FinishStatus::Completed));
        actions.push(SpecAction::FinishCurrent(FinishStatus::Failed));
        let active = active_id(state);
        for id in state.ledger.started() {
            if Some(id) != active {
                actions.push(SpecAction::FinishStale(id));
            }
            actions.push(SpecAction::CancelIf(id));
        }
        actions.push(SpecAction::CancelReq);
        actions.push(SpecAction::Shutdown);
        actions.push(SpecAction::Expire);
    }

    fn next_state(&self, state: &SpecState, action: SpecAction) -> Option<SpecState> {
        let mut next = state.clone();
        let call = Self::call(state, action);
        let first_seq = next.next_seq;
        let (reply, events) =
            crate::ledger::decide(&mut next.session, &self.session_id, &call, first_seq);
        next.next_seq += events.len() as u64;
        next.ledger.observe_stamped(first_seq, &events);
        next.ledger.check_outcome(&reply, &events);
        next.last = Some((action, reply, events.len()));
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // ---- safety ----
            Property::always("at most one live response", |_, s: &SpecState| {
                s.ledger.at_most_one_live()
            }),
            Property::always(
                "phase, revision and start count agree with the events",
                |m: &SessionModel, s: &SpecState| {
                    s.ledger.session_consistent(&s.session, &m.session_id)
                },
            ),
            Property::always(
                "every started response gets exactly one terminal",
                |_, s: &SpecState| s.ledger.one_terminal_each(),
            ),
            Property::always("nothing starts after terminated", |_, s: &SpecState| {
                s.ledger.nothing_after_terminated()
            }),
            Property::always(
                "ids increase, numbering is gap-free, replies match events",
                |_, s: &SpecState| s.ledger.well_numbered_and_replies_agree(),
            ),
            // ---- reachability: each action fires with effect ----
            Property::sometimes("start from idle", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::StartFromClient,
                        Outcome::Started {
                            superseded: None,
                            ..
                        }
                    ))
                )
            }),
            Property::sometimes("VAD start supersedes", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::StartFromVad,
                        Outcome::Started {
                            superseded: Some(_),
                            ..
                        }
                    ))
                )
            }),
            Property::sometimes("client start supersedes", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::StartFromClient,
                        Outcome::Started {
                            superseded: Some(_),
                            ..
                        }
                    ))
                )
            }),
            Property::sometimes("finish completed applied", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::FinishCurrent(FinishStatus::Completed),
                        Outcome::Finished { applied: true }
                    ))
                )
            }),
            Property::sometimes("finish failed applied", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::FinishCurrent(FinishStatus::Failed),
                        Outcome::Finished { applied: true }
                    ))
                )
            }),
            Property::sometimes(
                "stale finish ignored while a newer response is live",
                |_, s: &SpecState| {
                    matches!(
                        last(s),
                        Some((
                            SpecAction::FinishStale(_),
                            Outcome::Finished { applied: false }
                        ))
                    ) && active_id(s).is_some()
                },
            ),
            Property::sometimes("cancel applied", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::CancelReq,
                        Outcome::Cancelled { cancelled: Some(_) }
                    ))
                )
            }),
            Property::sometimes("fenced cancel applied", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::CancelIf(_),
                        Outcome::Cancelled { cancelled: Some(_) }
                    ))
                )
            }),
            Property::sometimes(
                "fenced cancel refused while another response is live",
                |_, s: &SpecState| {
                    matches!(
                        last(s),
                        Some((
                            SpecAction::CancelIf(_),
                            Outcome::Cancelled { cancelled: None }
                        ))
                    ) && active_id(s).is_some()
                },
            ),
            Property::sometimes(
                "shutdown cancels the active response",
                |_, s: &SpecState| {
                    matches!(
                        last(s),
                        Some((
                            SpecAction::Shutdown,
                            Outcome::TornDown { cancelled: Some(_) }
                        ))
                    )
                },
            ),
            Property::sometimes("shutdown of an idle session", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((SpecAction::Shutdown, Outcome::TornDown { cancelled: None }))
                ) && last_events(s) == 1
                    && !s.ledger.responses.is_empty()
            }),
            Property::sometimes("repeated shutdown is a no-op", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((SpecAction::Shutdown, Outcome::TornDown { cancelled: None }))
                ) && last_events(s) == 0
            }),
            Property::sometimes("expiry cancels the active response", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((SpecAction::Expire, Outcome::TornDown { cancelled: Some(_) }))
                )
            }),
            Property::sometimes("start refused after teardown", |_, s: &SpecState| {
                matches!(
                    last(s),
                    Some((
                        SpecAction::StartFromClient | SpecAction::StartFromVad,
                        Outcome::StartRefused
                    ))
                )
            }),
            Property::sometimes(
                "all MAX_RESPONSES started, then torn down",
                |_, s: &SpecState| {
                    s.ledger.responses.len() == MAX_RESPONSES
                        && s.session.phase() == Phase::Terminated
                },
            ),
        ]
    }
}
