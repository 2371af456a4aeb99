//! Model 2: gateways talking to one coordinator over a bad network.
//!
//! Actor 0 is the coordinator. Its state holds a real
//! `respcoord::session::Session`, and it handles each request the way the
//! registry does: a Start whose `request_id` the session already applied is
//! answered from `Session::replayed` (here, so the `NoReplay` mutation can
//! skip it), anything else goes through the shared decision
//! (`respcoord::decision::decide`, via `ledger::decide`, and so through
//! `respcoord::machine::transition`). The
//! event log's seq is a counter in the coordinator's state that advances by
//! the number of events each call emits, and a Start's response id is the
//! seq of the call's first event, exactly as in the registry.
//!
//! The other actors are gateways. Each issues a bounded number of requests,
//! one at a time, choosing each nondeterministically among Start, Finish of
//! the response it believes it runs, Cancel fenced with that response's id,
//! unfenced Cancel and Shutdown (as its [`GatewaySpec`] allows). A gateway
//! may time out at any moment while a request is outstanding; it then resends
//! the same request (same `request_id` for a Start) up to `retries` times, and
//! after that gives up and moves on, leaving the old request in flight.
//!
//! The network is stateright's unordered duplicating network: any message in
//! flight may be delivered at any time, in any order, any number of times,
//! and (with `lossy`) may be dropped.

use std::borrow::Cow;

use respcoord::{
    events::SharedEvent,
    ids::{RequestId, ResponseId, SessionId},
    machine::{EventKind, FinishStatus, Outcome as Decided, Phase, Source, TeardownReason},
    session::{Call, Session},
};
use stateright::actor::{
    model_timeout, Actor, ActorModel, ActorModelState, Id, LossyNetwork, Network, Out,
};
use stateright::Expectation;

use crate::ledger::Ledger;

/// The coordinator is actor 0.
fn coordinator_id() -> Id {
    Id::from(0usize)
}

/// Which gateway path a gateway stands for (observability only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    ClientReadLoop,
    Vad,
    /// The session's owner (M1) tearing it down.
    Supervisor,
}

impl Role {
    fn source(self) -> Source {
        match self {
            Role::ClientReadLoop => Source::Client,
            Role::Vad => Source::Vad,
            Role::Supervisor => Source::Unspecified,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Req {
    Start { role: Role },
    Finish { response: u64 },
    Cancel { if_response: Option<u64> },
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reply {
    Started {
        response: u64,
        superseded: Option<u64>,
        replayed: bool,
    },
    /// FAILED_PRECONDITION: the session is terminated.
    StartRefused,
    Finished {
        applied: bool,
    },
    Cancelled {
        cancelled: Option<u64>,
    },
    ShutDown {
        cancelled: Option<u64>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Msg {
    /// `tag` numbers the gateway's requests; a Start's `request_id` is
    /// derived from the gateway and the tag, so every attempt carries the same
    /// one. `attempt` only tells retries apart on the wire (0 = first send).
    Request {
        tag: u8,
        attempt: u8,
        req: Req,
    },
    Reply {
        tag: u8,
        reply: Reply,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    Start,
    FinishMine,
    CancelMine,
    CancelAny,
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    Retry,
}

/// What one gateway may do.
#[derive(Clone, Copy, Debug)]
pub struct GatewaySpec {
    pub role: Role,
    /// Requests it issues in all.
    pub ops: u8,
    /// Of which at most this many are Starts.
    pub starts: u8,
    /// Whether it may send an unfenced Cancel.
    pub cancel_any: bool,
    /// Whether it may send Shutdown.
    pub shutdown: bool,
    /// Resends of one request before giving up on it.
    pub retries: u8,
}

/// Deliberate bugs the coordinator can be built with, to show that each of
/// the distributed properties can fail (the real code is never changed:
/// the mutation is in how this actor calls it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The coordinator as the registry is: no mutation.
    None,
    /// Skip the replay lookup: every delivery of a Start is applied.
    NoReplay,
    /// Finish whatever is active, whatever id the Finish names.
    FinishIgnoresId,
    /// Drop `if_response_id` from Cancel.
    CancelIgnoresFence,
}

pub enum Node {
    Coordinator(SessionId, Mutation),
    Gateway(GatewaySpec),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pending {
    pub tag: u8,
    pub attempt: u8,
    pub req: Req,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GatewayState {
    pub issued: u8,
    pub starts: u8,
    pub pending: Option<Pending>,
    /// The response this gateway believes it runs (it is not told when
    /// another gateway supersedes it, so this may be stale).
    pub mine: Option<u64>,
}

/// Whose response a Start superseded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    SameGateway,
    OtherGateway,
}

/// What the coordinator's last delivered request did, for the reachability
/// properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    Replayed {
        retry: bool,
        after_teardown: bool,
    },
    Started {
        by_retry: bool,
        superseded: Option<Owner>,
    },
    StartRefused,
    Finish {
        applied: bool,
        other_live: bool,
    },
    Cancel {
        fenced: bool,
        cancelled: bool,
        other_live: bool,
    },
    Shutdown {
        cancelled: bool,
        repeat: bool,
    },
}

/// Sticky violations only the coordinator can see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CoordFault {
    /// A Start superseded a response started by the same request id.
    RetrySupersededOwn = 1 << 0,
    /// A request id went through `apply` twice.
    StartAppliedTwice = 1 << 1,
    /// A replay answered something other than the original answer.
    ReplayMismatch = 1 << 2,
    /// A Finish for X ended a response other than X.
    FinishEndedOther = 1 << 3,
    /// A Cancel with `if_response_id` X ended a response other than X.
    FencedCancelEndedOther = 1 << 4,
}

/// A Start's identity: the gateway and its request tag.
pub type StartKey = (Id, u8);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CoordinatorState {
    pub session: Session,
    pub next_seq: u64,
    pub ledger: Ledger,
    /// Ghost: every Start that went through `apply` and was accepted, with
    /// its reply.
    pub applied_starts: Vec<(StartKey, u64, Option<u64>)>,
    pub faults: u8,
    pub last: Option<Effect>,
}

impl CoordinatorState {
    fn fault(&mut self, fault: CoordFault) {
        self.faults |= fault as u8;
    }

    pub fn has(&self, fault: CoordFault) -> bool {
        self.faults & fault as u8 != 0
    }

    fn owner_of(&self, response: u64) -> Option<StartKey> {
        self.applied_starts
            .iter()
            .find(|(_, id, _)| *id == response)
            .map(|(key, _, _)| *key)
    }

    fn active(&self) -> Option<u64> {
        self.session.phase().active().map(|active| active.id.get())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeState {
    Coordinator(Box<CoordinatorState>),
    Gateway(GatewayState),
}

fn request_id(key: StartKey) -> RequestId {
    RequestId::parse_optional(&format!("gw{}-req{}", usize::from(key.0), key.1))
        .expect("short request id")
        .expect("non-empty request id")
}

fn ended(events: &[SharedEvent]) -> impl Iterator<Item = u64> + '_ {
    events.iter().filter_map(|event| match event.kind {
        EventKind::Ended { response, .. } => Some(response.get()),
        _ => None,
    })
}

impl Node {
    fn coordinator_handle(
        session_id: &SessionId,
        mutation: Mutation,
        state: &mut CoordinatorState,
        src: Id,
        tag: u8,
        attempt: u8,
        req: Req,
    ) -> Reply {
        let active_before = state.active();
        let was_terminated = state.session.phase() == Phase::Terminated;
        let call = match req {
            Req::Start { role } => {
                let key = (src, tag);
                let request_id = request_id(key);
                // The registry's order: replay first, apply otherwise.
                let replayed = match mutation {
                    Mutation::NoReplay => None,
                    _ => state.session.replayed(&request_id),
                };
                if let Some(record) = replayed {
                    let original = state
                        .applied_starts
                        .iter()
                        .find(|(seen, _, _)| *seen == key)
                        .map(|(_, response, superseded)| (*response, *superseded));
                    let answered = (
                        record.response.get(),
                        record.superseded.map(ResponseId::get),
                    );
                    if original != Some(answered) {
                        state.fault(CoordFault::ReplayMismatch);
                    }
                    state.last = Some(Effect::Replayed {
                        retry: attempt > 0,
                        after_teardown: was_terminated,
                    });
                    return Reply::Started {
                        response: answered.0,
                        superseded: answered.1,
                        replayed: true,
                    };
                }
                Call::Start {
                    source: role.source(),
                    // Without replay the coordinator must not see the key at
                    // all (the shared decision would replay it itself).
                    request_id: match mutation {
                        Mutation::NoReplay => None,
                        _ => Some(request_id),
                    },
                }
            }
            Req::Finish { response } => Call::Finish {
                response: match mutation {
                    Mutation::FinishIgnoresId => active_before.and_then(ResponseId::new),
                    _ => ResponseId::new(response),
                },
                status: FinishStatus::Completed,
            },
            Req::Cancel { if_response } => Call::Cancel {
                only_if: match mutation {
                    Mutation::CancelIgnoresFence => None,
                    _ => if_response.and_then(ResponseId::new),
                },
                source: Source::Client,
            },
            Req::Shutdown => Call::Teardown {
                reason: TeardownReason::Shutdown,
                source: respcoord::machine::Source::Unspecified,
            },
        };
        let first_seq = state.next_seq;
        let (decided, events) =
            crate::ledger::decide(&mut state.session, session_id, &call, first_seq);
        state.next_seq += events.len() as u64;
        state.ledger.observe_stamped(first_seq, &events);
        state.ledger.check_outcome(&decided, &events);
        let other_live = state.active().is_some_and(|now| match req {
            Req::Finish { response } => now != response,
            Req::Cancel {
                if_response: Some(fence),
            } => now != fence,
            _ => false,
        });
        match (req, decided) {
            (
                Req::Start { .. },
                Decided::Started {
                    response,
                    superseded,
                },
            ) => {
                let key = (src, tag);
                if state.applied_starts.iter().any(|(seen, _, _)| *seen == key) {
                    state.fault(CoordFault::StartAppliedTwice);
                }
                let superseded = superseded.map(ResponseId::get);
                let owner = superseded.and_then(|old| state.owner_of(old));
                if owner == Some(key) {
                    state.fault(CoordFault::RetrySupersededOwn);
                }
                state.applied_starts.push((key, response.get(), superseded));
                state.last = Some(Effect::Started {
                    by_retry: attempt > 0,
                    superseded: owner.map(|(gateway, _)| {
                        if gateway == src {
                            Owner::SameGateway
                        } else {
                            Owner::OtherGateway
                        }
                    }),
                });
                Reply::Started {
                    response: response.get(),
                    superseded,
                    replayed: false,
                }
            }
            (_, Decided::StartRefused) => {
                state.last = Some(Effect::StartRefused);
                Reply::StartRefused
            }
            (Req::Finish { response }, Decided::Finished { applied }) => {
                if ended(&events).any(|id| id != response) {
                    state.fault(CoordFault::FinishEndedOther);
                }
                state.last = Some(Effect::Finish {
                    applied,
                    other_live,
                });
                Reply::Finished { applied }
            }
            (Req::Cancel { if_response }, Decided::Cancelled { cancelled }) => {
                if let Some(fence) = if_response {
                    if ended(&events).any(|id| id != fence) {
                        state.fault(CoordFault::FencedCancelEndedOther);
                    }
                }
                state.last = Some(Effect::Cancel {
                    fenced: if_response.is_some(),
                    cancelled: cancelled.is_some(),
                    other_live,
                });
                Reply::Cancelled {
                    cancelled: cancelled.map(ResponseId::get),
                }
            }
            (_, Decided::TornDown { cancelled }) => {
                state.last = Some(Effect::Shutdown {
                    cancelled: cancelled.is_some(),
                    repeat: was_terminated,
                });
                Reply::ShutDown {
                    cancelled: cancelled.map(ResponseId::get),
                }
            }
            (req, outcome) => {
                panic!("{req:?} answered with {outcome:?} (active before: {active_before:?})")
            }
        }
    }

    fn choose_next(spec: &GatewaySpec, state: &GatewayState, o: &mut Out<Self>) {
        if state.issued >= spec.ops {
            return;
        }
        let mut options = Vec::new();
        if state.starts < spec.starts {
            options.push(Op::Start);
        }
        if state.mine.is_some() {
            options.push(Op::FinishMine);
            options.push(Op::CancelMine);
        }
        if spec.cancel_any {
            options.push(Op::CancelAny);
        }
        if spec.shutdown {
            options.push(Op::Shutdown);
        }
        if !options.is_empty() {
            o.choose_random("next request", options);
        }
    }
}

impl Actor for Node {
    type Msg = Msg;
    type State = NodeState;
    type Timer = Timer;
    type Random = Op;
    type Storage = ();

    fn on_start(&self, _id: Id, _storage: &Option<()>, o: &mut Out<Self>) -> NodeState {
        match self {
            Node::Coordinator(..) => NodeState::Coordinator(Box::new(CoordinatorState {
                session: Session::new(0),
                next_seq: 1,
                ledger: Ledger::default(),
                applied_starts: Vec::new(),
                faults: 0,
                last: None,
            })),
            Node::Gateway(spec) => {
                let state = GatewayState {
                    issued: 0,
                    starts: 0,
                    pending: None,
                    mine: None,
                };
                Self::choose_next(spec, &state, o);
                NodeState::Gateway(state)
            }
        }
    }

    fn on_msg(&self, _id: Id, state: &mut Cow<NodeState>, src: Id, msg: Msg, o: &mut Out<Self>) {
        match (self, msg) {
            (Node::Coordinator(session_id, mutation), Msg::Request { tag, attempt, req }) => {
                let NodeState::Coordinator(coordinator) = state.to_mut() else {
                    return;
                };
                let reply = Self::coordinator_handle(
                    session_id,
                    *mutation,
                    coordinator,
                    src,
                    tag,
                    attempt,
                    req,
                );
                o.send(src, Msg::Reply { tag, reply });
            }
            (Node::Gateway(spec), Msg::Reply { tag, reply }) => {
                let NodeState::Gateway(gateway) = &**state else {
                    return;
                };
                let Some(pending) = gateway.pending.filter(|p| p.tag == tag) else {
                    return; // a late or duplicated reply: already handled
                };
                let mut next = gateway.clone();
                next.pending = None;
                next.mine = match (pending.req, reply) {
                    (_, Reply::Started { response, .. }) => Some(response),
                    (Req::Finish { .. }, _) | (_, Reply::ShutDown { .. }) => None,
                    // It asked to cancel its own response: either it did, or
                    // that response had already ended.
                    (
                        Req::Cancel {
                            if_response: Some(_),
                        },
                        _,
                    ) => None,
                    (Req::Cancel { if_response: None }, Reply::Cancelled { cancelled })
                        if cancelled == next.mine =>
                    {
                        None
                    }
                    _ => next.mine,
                };
                o.cancel_timer(Timer::Retry);
                Self::choose_next(spec, &next, o);
                *state = Cow::Owned(NodeState::Gateway(next));
            }
            _ => {}
        }
    }

    fn on_timeout(&self, _id: Id, state: &mut Cow<NodeState>, _timer: &Timer, o: &mut Out<Self>) {
        let Node::Gateway(spec) = self else {
            return;
        };
        let NodeState::Gateway(gateway) = &**state else {
            return;
        };
        let Some(pending) = gateway.pending else {
            return;
        };
        let mut next = gateway.clone();
        if pending.attempt < spec.retries {
            let retry = Pending {
                attempt: pending.attempt + 1,
                ..pending
            };
            o.send(
                coordinator_id(),
                Msg::Request {
                    tag: retry.tag,
                    attempt: retry.attempt,
                    req: retry.req,
                },
            );
            o.set_timer(Timer::Retry, model_timeout());
            next.pending = Some(retry);
        } else {
            // Give up on it; it may still arrive.
            next.pending = None;
            Self::choose_next(spec, &next, o);
        }
        *state = Cow::Owned(NodeState::Gateway(next));
    }

    fn on_random(&self, _id: Id, state: &mut Cow<NodeState>, op: &Op, o: &mut Out<Self>) {
        let Node::Gateway(spec) = self else {
            return;
        };
        let NodeState::Gateway(gateway) = &**state else {
            return;
        };
        let mut next = gateway.clone();
        let req = match (*op, next.mine) {
            (Op::Start, _) => {
                next.starts += 1;
                Req::Start { role: spec.role }
            }
            (Op::FinishMine, Some(mine)) => Req::Finish { response: mine },
            (Op::CancelMine, Some(mine)) => Req::Cancel {
                if_response: Some(mine),
            },
            (Op::CancelAny, _) => Req::Cancel { if_response: None },
            (Op::Shutdown, _) => Req::Shutdown,
            (Op::FinishMine | Op::CancelMine, None) => return,
        };
        let tag = next.issued;
        next.issued += 1;
        next.pending = Some(Pending {
            tag,
            attempt: 0,
            req,
        });
        o.send(
            coordinator_id(),
            Msg::Request {
                tag,
                attempt: 0,
                req,
            },
        );
        o.set_timer(Timer::Retry, model_timeout());
        *state = Cow::Owned(NodeState::Gateway(next));
    }
}

pub type System = ActorModel<Node, (), ()>;
pub type SystemState = ActorModelState<Node, ()>;

pub fn coordinator(state: &SystemState) -> &CoordinatorState {
    match &*state.actor_states[usize::from(coordinator_id())] {
        NodeState::Coordinator(coordinator) => coordinator,
        NodeState::Gateway(_) => unreachable!("actor 0 is the coordinator"),
    }
}

fn last(state: &SystemState) -> Option<Effect> {
    coordinator(state).last
}

/// The two networks the models run over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    /// stateright's unordered duplicating network, not lossy: every message
    /// sent stays deliverable forever, so it can be delayed past anything,
    /// reordered, and delivered any number of times. A client resend would
    /// be one more copy of a message the network can already redeliver, so
    /// gateways run with `retries: 0` here.
    Duplicating,
    /// stateright's unordered non-duplicating network with loss: any message
    /// may be dropped or delayed and reordered; copies come only from client
    /// retries (`retries >= 1`), which resend the same request id.
    LossyWithRetries,
}

/// The system: the coordinator, then one actor per gateway.
pub fn system(gateways: &[GatewaySpec], net: Net, mutation: Mutation) -> System {
    let session_id = SessionId::parse("model-session").expect("valid session id");
    let (network, lossy) = match net {
        Net::Duplicating => (Network::new_unordered_duplicating([]), LossyNetwork::No),
        Net::LossyWithRetries => (Network::new_unordered_nonduplicating([]), LossyNetwork::Yes),
    };
    for gateway in gateways {
        match net {
            Net::Duplicating => assert_eq!(gateway.retries, 0, "{gateway:?}"),
            Net::LossyWithRetries => assert!(gateway.retries > 0, "{gateway:?}"),
        }
    }
    let model = ActorModel::new((), ())
        .actor(Node::Coordinator(session_id, mutation))
        .actors(gateways.iter().copied().map(Node::Gateway))
        .init_network(network)
        .lossy_network(lossy);
    let model = common_reachability(safety_properties(model));
    match net {
        Net::Duplicating => model.property(
            Expectation::Sometimes,
            "a duplicated Start is answered by replay",
            |_, s| {
                matches!(
                    last(s),
                    Some(Effect::Replayed {
                        retry: false,
                        after_teardown: false
                    })
                )
            },
        ),
        Net::LossyWithRetries => model
            .property(
                Expectation::Sometimes,
                "a retried Start is answered by replay",
                |_, s| {
                    matches!(
                        last(s),
                        Some(Effect::Replayed {
                            retry: true,
                            after_teardown: false
                        })
                    )
                },
            )
            .property(
                Expectation::Sometimes,
                "a Start's original arrives after its retry and is answered by replay",
                |_, s| {
                    matches!(
                        last(s),
                        Some(Effect::Replayed {
                            retry: false,
                            after_teardown: false
                        })
                    )
                },
            )
            .property(
                Expectation::Sometimes,
                "a retry is the first attempt of a Start to arrive",
                |_, s| matches!(last(s), Some(Effect::Started { by_retry: true, .. })),
            ),
    }
}

fn safety_properties(model: System) -> System {
    model
        // ---- safety: the single-session properties, over the real events ----
        .property(Expectation::Always, "at most one live response", |_, s| {
            coordinator(s).ledger.at_most_one_live()
        })
        .property(
            Expectation::Always,
            "phase, revision and start count agree with the events",
            |m, s| {
                let Node::Coordinator(session_id, _) = &m.actors[usize::from(coordinator_id())]
                else {
                    unreachable!("actor 0 is the coordinator")
                };
                let c = coordinator(s);
                c.ledger.session_consistent(&c.session, session_id)
            },
        )
        .property(
            Expectation::Always,
            "every started response gets exactly one terminal",
            |_, s| coordinator(s).ledger.one_terminal_each(),
        )
        .property(
            Expectation::Always,
            "nothing starts after terminated",
            |_, s| coordinator(s).ledger.nothing_after_terminated(),
        )
        .property(
            Expectation::Always,
            "ids increase, numbering is gap-free, replies match events",
            |_, s| coordinator(s).ledger.well_numbered_and_replies_agree(),
        )
        // ---- safety: retries, duplicates, stale and fenced calls ----
        .property(
            Expectation::Always,
            "a retried Start never supersedes its own response",
            |_, s| !coordinator(s).has(CoordFault::RetrySupersededOwn),
        )
        .property(
            Expectation::Always,
            "a request id is applied at most once and replays answer the original",
            |_, s| {
                let c = coordinator(s);
                !c.has(CoordFault::StartAppliedTwice) && !c.has(CoordFault::ReplayMismatch)
            },
        )
        .property(
            Expectation::Always,
            "a Finish for X only ever ends X",
            |_, s| !coordinator(s).has(CoordFault::FinishEndedOther),
        )
        .property(
            Expectation::Always,
            "a Cancel with if_response_id X only ever cancels X",
            |_, s| !coordinator(s).has(CoordFault::FencedCancelEndedOther),
        )
}

fn common_reachability(model: System) -> System {
    model
        // ---- reachability: the interesting cases did happen ----
        .property(
            Expectation::Sometimes,
            "a replay is answered after teardown",
            |_, s| {
                matches!(
                    last(s),
                    Some(Effect::Replayed {
                        after_teardown: true,
                        ..
                    })
                )
            },
        )
        .property(
            Expectation::Sometimes,
            "a Start supersedes another gateway's response",
            |_, s| {
                matches!(
                    last(s),
                    Some(Effect::Started {
                        superseded: Some(Owner::OtherGateway),
                        ..
                    })
                )
            },
        )
        .property(
            Expectation::Sometimes,
            "a stale Finish arrives while a newer response is live",
            |_, s| {
                matches!(
                    last(s),
                    Some(Effect::Finish {
                        applied: false,
                        other_live: true
                    })
                )
            },
        )
        .property(Expectation::Sometimes, "a Finish applies", |_, s| {
            matches!(last(s), Some(Effect::Finish { applied: true, .. }))
        })
        .property(
            Expectation::Sometimes,
            "a fenced Cancel is refused while another response is live",
            |_, s| {
                matches!(
                    last(s),
                    Some(Effect::Cancel {
                        fenced: true,
                        cancelled: false,
                        other_live: true
                    })
                )
            },
        )
        .property(Expectation::Sometimes, "a fenced Cancel applies", |_, s| {
            matches!(
                last(s),
                Some(Effect::Cancel {
                    fenced: true,
                    cancelled: true,
                    ..
                })
            )
        })
        .property(
            Expectation::Sometimes,
            "Shutdown cancels the active response",
            |_, s| {
                matches!(
                    last(s),
                    Some(Effect::Shutdown {
                        cancelled: true,
                        ..
                    })
                )
            },
        )
        .property(
            Expectation::Sometimes,
            "a Start is refused after teardown",
            |_, s| matches!(last(s), Some(Effect::StartRefused)),
        )
}
