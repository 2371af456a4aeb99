//! Model 3: the legacy dual-writer mechanism, deliberately broken.
//!
//! This is the spec's `start()` with `serial` instead of `atomic`: starting a
//! response is two steps, (1) cancel the registered response if any, then (2)
//! spawn a new one and register it, and the two callers that start responses
//! (the client read loop and the VAD path) can each run between the other's
//! steps. It is written here, not in `src/`, on purpose: the real machine
//! cannot express it. The model emits the same lifecycle events the real one
//! would, into the same [`Ledger`], and is checked against the same
//! properties, so a checker that finds this race shows those properties are
//! not vacuous.

use respcoord::{
    ids::ResponseId,
    machine::{CancelReason, EventKind, Source, TeardownReason, Terminal},
};
use stateright::{Model, Property};

use crate::ledger::Ledger;

pub const MAX_RESPONSES: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    ClientReadLoop,
    Vad,
}

impl Caller {
    const ALL: [Caller; 2] = [Caller::ClientReadLoop, Caller::Vad];

    fn index(self) -> usize {
        match self {
            Caller::ClientReadLoop => 0,
            Caller::Vad => 1,
        }
    }

    fn source(self) -> Source {
        match self {
            Caller::ClientReadLoop => Source::Client,
            Caller::Vad => Source::Vad,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LegacyAction {
    /// Step 1 of a start: cancel whatever is registered.
    CancelRegistered(Caller),
    /// Step 2 of a start: spawn a new response and register it.
    SpawnAndRegister(Caller),
    FinishCurrent,
    CancelReq,
    Shutdown,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LegacyState {
    pub registered: Option<u64>,
    pub next_id: u64,
    pub torn: bool,
    /// Per caller: between step 1 and step 2 of a start.
    pub mid_start: [bool; 2],
    pub ledger: Ledger,
}

pub struct LegacyModel;

fn id(raw: u64) -> ResponseId {
    ResponseId::new(raw).expect("legacy ids start at 1")
}

fn cancel(state: &mut LegacyState, reason: CancelReason) {
    if let Some(old) = state.registered.take() {
        state.ledger.observe(&EventKind::CancelRequested {
            response: id(old),
            reason,
            source: Source::Unspecified,
        });
        state.ledger.observe(&EventKind::Ended {
            response: id(old),
            ending: Terminal::Cancelled(reason),
        });
    }
}

impl Model for LegacyModel {
    type State = LegacyState;
    type Action = LegacyAction;

    fn init_states(&self) -> Vec<LegacyState> {
        vec![LegacyState {
            registered: None,
            next_id: 0,
            torn: false,
            mid_start: [false; 2],
            ledger: Ledger::default(),
        }]
    }

    fn actions(&self, state: &LegacyState, actions: &mut Vec<LegacyAction>) {
        for caller in Caller::ALL {
            if state.mid_start[caller.index()] {
                actions.push(LegacyAction::SpawnAndRegister(caller));
            } else if state.next_id < MAX_RESPONSES && !state.torn {
                actions.push(LegacyAction::CancelRegistered(caller));
            }
        }
        actions.push(LegacyAction::FinishCurrent);
        actions.push(LegacyAction::CancelReq);
        actions.push(LegacyAction::Shutdown);
    }

    fn next_state(&self, state: &LegacyState, action: LegacyAction) -> Option<LegacyState> {
        let mut next = state.clone();
        match action {
            LegacyAction::CancelRegistered(caller) => {
                cancel(&mut next, CancelReason::Superseded);
                next.mid_start[caller.index()] = true;
            }
            LegacyAction::SpawnAndRegister(caller) => {
                next.next_id += 1;
                next.ledger.observe(&EventKind::Started {
                    response: id(next.next_id),
                    source: caller.source(),
                });
                next.registered = Some(next.next_id);
                next.mid_start[caller.index()] = false;
            }
            LegacyAction::FinishCurrent => {
                let current = next.registered.take()?;
                next.ledger.observe(&EventKind::Ended {
                    response: id(current),
                    ending: Terminal::Completed,
                });
            }
            LegacyAction::CancelReq => {
                next.registered?;
                cancel(&mut next, CancelReason::Requested);
            }
            LegacyAction::Shutdown => {
                if next.torn {
                    return None;
                }
                cancel(&mut next, CancelReason::Shutdown);
                next.torn = true;
                next.ledger.observe(&EventKind::Terminated {
                    reason: TeardownReason::Shutdown,
                });
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one live response", |_, s: &LegacyState| {
                s.ledger.at_most_one_live()
            }),
            Property::always(
                "every started response gets exactly one terminal",
                |_, s: &LegacyState| s.ledger.one_terminal_each(),
            ),
            Property::always("nothing starts after terminated", |_, s: &LegacyState| {
                s.ledger.nothing_after_terminated()
            }),
        ]
    }
}
