//! Model 4: the NATS backend's call path (`src/nats.rs`, `Inner::call`).
//!
//! One session key in a JetStream key-value bucket, and two coordinator
//! replicas answering gateway calls on it. The store is the key's history
//! of committed writes: KV revision `r` is the `r`-th write, revision 0 is
//! "no entry". A write is a compare-and-set against the revision the call
//! decided on (`kv.update`); a read may be served by a deposed stream leader
//! and so return any committed revision, not only the latest.
//!
//! Each replica runs its calls one at a time (its per-session lock), each
//! call driven by the real attempt machine, `nats::attempts::CallAttempts`,
//! the one `Inner::compare_and_set` drives: the model answers the store
//! requests it makes (a read, possibly stale; a compare-and-set write, whose
//! try may land with its answer lost or go unanswered; a quorum point) and
//! decides each attempt with the real shared decision (one adapter,
//! [`decide`]), so the policy checked is the one that serves: the cache on
//! the first attempt, confirmation of an answer that writes nothing at a
//! quorum point or by writing its entry back, going round after a
//! conflict, and the lost-answer check by the expected revision's
//! successor. Only the driver's part is written here: what a request
//! returns, and that a write whose try went unanswered is sent again and
//! a conflict then reported as possibly its own (`Inner::write`).
//!
//! A ghost sequential run, the real `Session` fed the committed writes in
//! commit order, judges every answer (see [`NatsState::spec`]).

use respcoord::{
    decision::{self, Presence, Room, Stamp},
    error::CoordError,
    ids::{RequestId, ResponseId, SessionId},
    machine::{EventKind, FinishStatus, Outcome, Phase, Source, TeardownReason},
    nats::{
        attempts::{
            CacheChange, CallAttempts, Command, GiveUp, Read, Request, Step, Stored, Successor,
            Written,
        },
        KvRevision,
    },
    session::{Call, Millis, Session},
};
use stateright::{Model, Property};

use crate::ledger::Ledger;

/// The model's clock stands still: idle expiry and the touch interval are
/// not explored, so a touch is never due and no write is a touch only.
const NOW: Millis = 0;

/// A gateway call, as a replica receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Req {
    /// Start with request id `req-<n>`.
    Start(u8),
    Finish(u64),
    /// Cancel, fenced by `if_response_id` when given.
    Cancel(Option<u64>),
    Shutdown,
}

impl Req {
    fn call(self) -> Call {
        match self {
            Req::Start(request) => Call::Start {
                source: Source::Client,
                request_id: RequestId::parse_optional(&format!("req-{request}"))
                    .expect("short request id"),
            },
            Req::Finish(response) => Call::Finish {
                response: ResponseId::new(response),
                status: FinishStatus::Completed,
            },
            Req::Cancel(only_if) => Call::Cancel {
                only_if: only_if.and_then(ResponseId::new),
                source: Source::Client,
            },
            Req::Shutdown => Call::Teardown {
                reason: TeardownReason::Shutdown,
                source: respcoord::machine::Source::Unspecified,
            },
        }
    }
}

/// A stored entry: the session's durable fields (`Session::persisted`, as
/// `nats/entry.rs` stores them), the highest response id it minted, and
/// the kinds of the events of the transition that wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub session: Session,
    pub last_response: u64,
    pub kinds: Vec<EventKind>,
}

/// What the attempt machine needs of an entry, as `nats/call.rs` says it
/// of the stored one.
impl Stored for Entry {
    fn rewritable(&self) -> bool {
        !self.session.is_terminated()
    }

    fn without_events(self) -> Self {
        Entry {
            kinds: Vec::new(),
            ..self
        }
    }
}

/// What a call's reply says, ids as numbers (the model's own type, so the
/// rest of this file does not depend on the decision's types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Said {
    Started {
        response: u64,
        superseded: Option<u64>,
        replayed: bool,
    },
    StartRefused,
    Finished {
        applied: bool,
    },
    Cancelled {
        cancelled: Option<u64>,
    },
    TornDown {
        cancelled: Option<u64>,
    },
}

/// What a gateway is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The reply and the session state it reports.
    Replied {
        said: Said,
        phase: Phase,
        revision: u64,
        responses_started: u64,
    },
    /// NOT_FOUND: no session (Finish and Cancel do not create one).
    NotFound,
}

/// What the shared decision makes of a call on an entry.
pub struct Decided {
    pub answer: Answer,
    /// The entry to write, with the events it carries; `None` for an
    /// answer that writes nothing.
    pub write: Option<Entry>,
}

/// The one place this model calls the real decision, as `Inner::call` does
/// (`read` is the entry decided on; `None`: the key holds none). Response
/// ids are minted as `nats::mint` does with the wall clock at 0: one above
/// the highest the session minted.
pub fn decide(session_id: &SessionId, read: Option<&Entry>, req: Req) -> Decided {
    let call = req.call();
    let (mut session, presence, last_response) = match read {
        Some(entry) => (entry.session.clone(), Presence::Stored, entry.last_response),
        None => (
            Session::new(NOW),
            Presence::Absent {
                room: Room::Available,
            },
            0,
        ),
    };
    let stamp = Stamp {
        first_seq: 0,
        unix_nanos: 0,
        new_response: ResponseId::new(last_response + 1).expect("ids start at 1"),
    };
    let decision = match decision::decide(&mut session, presence, session_id, &call, NOW) {
        // History limit 0: the store keeps the events, as on NATS.
        Ok(decided) => decided.settle(stamp, 0),
        Err(CoordError::SessionNotFound(_)) => {
            return Decided {
                answer: Answer::NotFound,
                write: None,
            }
        }
        Err(other) => panic!("{req:?} refused with {other:?}"),
    };
    let id = |response: Option<ResponseId>| response.map(ResponseId::get);
    let said = match decision.reply {
        Outcome::Started {
            response,
            superseded,
        } => Said::Started {
            response: response.get(),
            superseded: id(superseded),
            replayed: decision.replayed(),
        },
        Outcome::StartRefused => Said::StartRefused,
        Outcome::Finished { applied } => Said::Finished { applied },
        Outcome::Cancelled { cancelled } => Said::Cancelled {
            cancelled: id(cancelled),
        },
        Outcome::TornDown { cancelled } => Said::TornDown {
            cancelled: id(cancelled),
        },
    };
    let kinds = decision
        .change()
        .map(|change| change.kinds.to_vec())
        .unwrap_or_default();
    let answer = Answer::Replied {
        said,
        phase: decision.state.phase,
        revision: decision.state.revision,
        responses_started: decision.state.responses_started,
    };
    let write = decision.changed().then(|| {
        let last_response = match said {
            Said::Started {
                response,
                replayed: false,
                ..
            } => response,
            _ => last_response,
        };
        // What the entry stores, as a replica reading it back rebuilds it.
        let session = Session::from_persisted(session.persisted());
        Entry {
            session,
            last_response,
            kinds,
        }
    });
    Decided { answer, write }
}

/// Whether `answer` is the replay of the Start answered `original`.
fn replays(original: Answer, answer: Answer) -> bool {
    match (original, answer) {
        (
            Answer::Replied {
                said:
                    Said::Started {
                        response,
                        superseded,
                        replayed: false,
                    },
                ..
            },
            Answer::Replied {
                said:
                    Said::Started {
                        response: again,
                        superseded: superseded_again,
                        replayed: true,
                    },
                ..
            },
        ) => (response, superseded) == (again, superseded_again),
        _ => false,
    }
}

/// Attempts a call makes in the model before it gives up as contended:
/// enough for every path the properties name (a conflict, an unconfirmed
/// answer, then a rewrite; a lost answer, then a fresh decision), and few,
/// as each attempt the counter tells apart is a state of its own.
const MODEL_ATTEMPTS: u32 = 3;

/// A broken driver or store: each must make a property fail. The attempt
/// machine's own policy is mutated in its source instead
/// (`scripts/mutants.sh`, docs/verification.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The driver and store as they are.
    None,
    /// The driver takes the cached entry for the latest: a write decided
    /// on it is sent as a plain put, not a compare-and-set.
    TrustCache,
    /// The store ignores the expected revision: every write is a put.
    CasOff,
}

/// Whether a write's try can go unanswered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// Every try is answered.
    Reliable,
    /// A try may go unanswered (a timeout during a stream leader move),
    /// having landed (its acknowledgement lost) or not: `Inner::write`
    /// sends the same write over the same revision again, and a conflict it
    /// then meets is reported as possibly its own
    /// (`Written::ConflictAfterUnanswered`). No other replica writes before
    /// that call is answered.
    LostRereadFirst,
    /// The same, and other replicas may write in between.
    Lost,
}

/// A committed write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub entry: Entry,
    /// Ghost: the revision the writer decided on (with compare-and-set,
    /// always the one before).
    pub based_on: u8,
    /// Ghost: the call that wrote it (replica, index in its script).
    pub writer: (u8, u8),
    /// Ghost: the sequential run's entry after this write (`NatsState::spec`).
    pub spec: Option<Entry>,
    /// Ghost: what the sequential run answers the writer's call here.
    pub answer: Answer,
}

/// A replica's current call: the real attempt machine, the store request
/// it waits on, and what the driver and the checker know of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InFlight {
    pub attempts: CallAttempts<Entry, Answer>,
    pub request: Request,
    /// The key's latest revision when the call arrived.
    pub invoked_at: u8,
    /// Driver: a try of the write in flight went unanswered (`tries > 1`
    /// in `Inner::write`), so a conflict may be its own.
    pub resent: bool,
    /// A try of this call's writes went unanswered; at most one per call,
    /// which bounds the writes a call makes.
    pub lost_try: bool,
    /// Ghost: the attempt in progress decided on the cached entry.
    pub from_cache: bool,
    /// Ghost: attempts decided so far, counted to two (went round again).
    pub decisions: u8,
    /// Ghost: the write in flight writes back the entry read, to confirm
    /// an answer without a write.
    pub rewrite: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Calls of its script answered so far (the current one's index).
    pub next: u8,
    /// The revision of the entry this replica last wrote (`EntryCache`;
    /// the entry itself is the store's at that revision, which never
    /// changes once committed).
    pub cache: Option<u8>,
    pub call: Option<InFlight>,
}

/// What the last step did, for the reachability properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    /// A read returned an older revision than the latest.
    StaleRead,
    /// A compare-and-set found the key past the revision it expected.
    Conflict { from_cache: bool },
    /// A quorum point showed the entry a no-write answer was decided on
    /// superseded; the call goes round again.
    Unconfirmed,
    /// A no-write answer confirmed at a quorum point.
    Confirmed { retried: bool, replay: bool },
    /// A write committed and answered.
    Wrote { from_cache: bool, retried: bool },
    /// A no-write answer confirmed by writing its entry back, answered.
    Rewritten,
    /// A write landed, its acknowledgement lost.
    AckLost,
    /// A try of a write went unanswered without landing.
    Unanswered,
    /// The call's own unacknowledged write was found (the successor of the
    /// revision it expected); it is answered. `after_another_write`: the
    /// key had moved past it.
    Recognised { after_another_write: bool },
    /// A write landed and a deposed stream leader answered it "conflict".
    ConflictAnswered,
    /// The same write found as the successor of the revision it expected,
    /// and answered as the call's own.
    RecognisedAfterConflict,
    /// A retry met a conflict after an unanswered try, and the successor
    /// of the expected revision is another call's: the write did not land,
    /// and the call goes round again.
    NotLanded,
    /// The same for a create (expected revision 0): what it was written
    /// over is not in the stream, so whether it landed cannot be told. The
    /// call is answered UNAVAILABLE, an error that applies nothing.
    Unavailable,
    /// Every attempt lost: ABORTED "contended", which applies nothing.
    Contended,
}

/// Sticky violations found when a call is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Fault {
    /// An answer no sequential run gives at any point of the call's
    /// interval, or a write that stores what no sequential run stores.
    NotLinearizable = 1 << 0,
    /// One call's write landed twice.
    AppliedTwice = 1 << 1,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NatsState {
    /// The key's committed history: revision `r` is `store[r - 1]`.
    pub store: Vec<Version>,
    pub replicas: Vec<Replica>,
    /// The committed events in commit order, as the bucket's stream (and
    /// so every watcher and mirror) sees them.
    pub ledger: Ledger,
    pub faults: u8,
    pub last: Option<Effect>,
}

impl NatsState {
    fn latest(&self) -> u8 {
        u8::try_from(self.store.len()).expect("a handful of writes")
    }

    fn entry_at(&self, revision: u8) -> Option<&Entry> {
        revision
            .checked_sub(1)
            .map(|index| &self.store[usize::from(index)].entry)
    }

    /// The key as a read at `revision` returns it.
    fn read_at(&self, revision: u8) -> Read<Entry> {
        match self.entry_at(revision) {
            Some(entry) => Read::Live {
                revision: KvRevision::at(u64::from(revision)),
                entry: entry.clone(),
            },
            None => Read::Absent {
                revision: KvRevision::NONE,
            },
        }
    }

    fn call(&mut self, replica: u8) -> &mut InFlight {
        self.replicas[usize::from(replica)]
            .call
            .as_mut()
            .expect("a replica in a call")
    }

    /// The sequential run: the state the real `Session` reaches when the
    /// committed calls are applied one after another in commit order,
    /// after the first `revision` writes. This is what a linearizable
    /// store holds; a write decided on a superseded entry diverges from it.
    pub fn spec(&self, revision: u8) -> Option<&Entry> {
        revision
            .checked_sub(1)
            .and_then(|index| self.store[usize::from(index)].spec.as_ref())
    }

    pub fn has(&self, fault: Fault) -> bool {
        self.faults & fault as u8 != 0
    }

    /// Every acknowledged write is still part of the key's state: walking
    /// back from the latest entry through the revision each write was
    /// decided on passes every committed revision (acknowledged or not,
    /// which is stronger). A write decided on an older revision than the
    /// one before it overwrites what came in between: a lost update.
    pub fn nothing_lost(&self) -> bool {
        let mut kept = 0u32;
        let mut at = self.latest();
        while at > 0 {
            kept |= 1 << at;
            at = self.store[usize::from(at - 1)].based_on;
        }
        (1..=self.latest()).all(|revision| kept & (1 << revision) != 0)
    }
}

/// A KV revision of the model's store, as its index.
fn small(revision: KvRevision) -> u8 {
    u8::try_from(revision.get()).expect("a handful of writes")
}

pub struct NatsPath {
    pub session_id: SessionId,
    /// Each replica's calls, in the order it receives them.
    pub scripts: Vec<Vec<Req>>,
    pub acks: Acks,
    pub mutation: Mutation,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The replica takes its next call; with an entry in its cache it
    /// decides on it at once.
    Invoke(u8),
    /// The store serves the replica's read at this revision: the latest
    /// (the stream leader), or an older one (a deposed leader).
    Read { replica: u8, revision: u8 },
    /// A quorum point: is the entry the answer was decided on the latest?
    Confirm(u8),
    /// The write: compare-and-set, or a plain put under a mutation.
    Write(u8),
    /// The write lands, and its acknowledgement is lost.
    WriteAckLost(u8),
    /// A try of the write goes unanswered without landing.
    WriteUnanswered(u8),
    /// The write lands, and a deposed stream leader answers it "conflict"
    /// first (both hold the stream's subject while a partition heals).
    WriteConflictAnswered(u8),
}

impl NatsPath {
    pub fn new(scripts: Vec<Vec<Req>>, acks: Acks, mutation: Mutation) -> Self {
        Self {
            session_id: SessionId::parse("model-session").expect("valid session id"),
            scripts,
            acks,
            mutation,
        }
    }

    fn req(&self, state: &NatsState, replica: u8) -> Req {
        let r = &state.replicas[usize::from(replica)];
        self.scripts[usize::from(replica)][usize::from(r.next)]
    }

    /// Carries out the machine's commands as the driver
    /// (`Inner::compare_and_set`) does, up to the next store request the
    /// checker chooses how to answer; the lost-answer lookups are answered
    /// at once, from the store.
    fn run(&self, state: &mut NatsState, replica: u8, mut command: Command<Entry, Answer>) {
        let call = (replica, state.replicas[usize::from(replica)].next);
        loop {
            let latest = state.latest();
            let in_flight = state.call(replica);
            command = match command {
                Command::Decide(read) => {
                    in_flight.decisions = (in_flight.decisions + 1).min(2);
                    let step =
                        match decide(&self.session_id, entry_of(&read), self.req(state, replica)) {
                            Decided {
                                answer,
                                write: Some(entry),
                            } => Step::Write {
                                entry,
                                cache: true,
                                answer,
                            },
                            Decided {
                                answer,
                                write: None,
                            } => Step::Confirm(answer),
                        };
                    let rewrite = matches!(step, Step::Confirm(_));
                    let in_flight = state.call(replica);
                    let next = in_flight.attempts.decided(step);
                    if let Command::Request(Request::Write { .. }) = next {
                        in_flight.rewrite = rewrite;
                        in_flight.resent = false;
                    }
                    next
                }
                Command::Request(Request::Successor { expected }) => {
                    // A compare-and-set lands only over the revision it
                    // expects: the key's first write after it is this
                    // call's, or this call's did not land.
                    let resent = in_flight.resent;
                    let revision = small(expected) + 1;
                    let ours = state.store[usize::from(small(expected))].writer == call;
                    let after_another_write = revision < latest;
                    match (ours, resent) {
                        (true, true) => {
                            state.last = Some(Effect::Recognised {
                                after_another_write,
                            });
                        }
                        (true, false) => state.last = Some(Effect::RecognisedAfterConflict),
                        (false, true) => state.last = Some(Effect::NotLanded),
                        // A conflict answered at once, another's write next:
                        // the conflict it was (`Effect::Conflict`).
                        (false, false) => {}
                    }
                    state.call(replica).attempts.successor(Successor {
                        revision: KvRevision::at(u64::from(revision)),
                        ours,
                    })
                }
                // The stream's per-key history is not modelled as dropping
                // anything: what a write expected is always still held.
                Command::Request(Request::Held { .. }) => in_flight.attempts.held(true),
                Command::Request(request) => {
                    in_flight.request = request;
                    return;
                }
                Command::Answer(answer, cache) => {
                    let r = &mut state.replicas[usize::from(replica)];
                    match cache {
                        CacheChange::Keep => {}
                        CacheChange::Put(revision, _) => r.cache = Some(small(revision)),
                        CacheChange::Forget => r.cache = None,
                    }
                    self.answered(state, replica, answer);
                    return;
                }
                Command::GiveUp(why) => {
                    // Either error applies nothing and claims nothing.
                    state.last = Some(match why {
                        GiveUp::LandingUnknown => Effect::Unavailable,
                        GiveUp::Contended { .. } => Effect::Contended,
                    });
                    Self::next_call(state, replica);
                    return;
                }
            };
        }
    }

    /// A call is answered. If a write of the call landed, the answer is
    /// the sequential run's there; else it is what the sequential run
    /// answers, without a change, at some revision that was the latest
    /// during the call.
    fn answered(&self, state: &mut NatsState, replica: u8, answer: Answer) {
        let req = self.req(state, replica);
        let r = &state.replicas[usize::from(replica)];
        let invoked_at = r.call.as_ref().expect("a call").invoked_at;
        let call = (replica, r.next);
        let linearizable = match state.store.iter().find(|v| v.writer == call) {
            // A write of this call landed: the call took effect there, so
            // that is where its answer must come from; or, for a Start, the
            // replay of that answer that a client's retry would get later
            // (the contract's replay: same ids, the state as it is now).
            Some(landed) => landed.answer == answer || replays(landed.answer, answer),
            None => (invoked_at..=state.latest()).any(|revision| {
                let sequential = decide(&self.session_id, state.spec(revision), req);
                sequential.write.is_none() && sequential.answer == answer
            }),
        };
        if !linearizable {
            state.faults |= Fault::NotLinearizable as u8;
        }
        Self::next_call(state, replica);
    }

    fn next_call(state: &mut NatsState, replica: u8) {
        let r = &mut state.replicas[usize::from(replica)];
        r.next += 1;
        r.call = None;
    }

    /// Commits the replica's write at the next revision. The write is
    /// linearized here: the sequential run, given the call next, must
    /// answer the same and store the same (a rewrite: store nothing new
    /// and answer the same).
    fn commit(&self, state: &mut NatsState, replica: u8, expected: u8) {
        let req = self.req(state, replica);
        let writer = (replica, state.replicas[usize::from(replica)].next);
        let in_flight = state.call(replica);
        let rewrite = in_flight.rewrite;
        let entry = in_flight
            .attempts
            .entry_to_write()
            .expect("a write in flight")
            .clone();
        if state.store.iter().any(|v| v.writer == writer) {
            state.faults |= Fault::AppliedTwice as u8;
        }
        let before = state.spec(state.latest()).cloned();
        let sequential = decide(&self.session_id, before.as_ref(), req);
        let spec = match sequential.write {
            _ if rewrite => {
                if sequential.write.is_some() {
                    state.faults |= Fault::NotLinearizable as u8;
                }
                before
            }
            Some(spec) => {
                if spec != entry {
                    state.faults |= Fault::NotLinearizable as u8;
                }
                Some(spec)
            }
            None => {
                state.faults |= Fault::NotLinearizable as u8;
                before
            }
        };
        for kind in &entry.kinds {
            state.ledger.observe(kind);
        }
        state.store.push(Version {
            entry,
            based_on: expected,
            writer,
            spec,
            answer: sequential.answer,
        });
    }
}

/// The entry a read holds, as the shared decision takes it.
fn entry_of(read: &Read<Entry>) -> Option<&Entry> {
    match read {
        Read::Live { entry, .. } => Some(entry),
        Read::Absent { .. } => None,
    }
}

impl Model for NatsPath {
    type State = NatsState;
    type Action = Action;

    fn init_states(&self) -> Vec<NatsState> {
        let replica = Replica {
            next: 0,
            cache: None,
            call: None,
        };
        vec![NatsState {
            store: Vec::new(),
            replicas: vec![replica; self.scripts.len()],
            ledger: Ledger::default(),
            faults: 0,
            last: None,
        }]
    }

    fn actions(&self, state: &NatsState, actions: &mut Vec<Action>) {
        let rereading = state
            .replicas
            .iter()
            .position(|r| r.call.as_ref().is_some_and(|call| call.lost_try));
        for (index, r) in state.replicas.iter().enumerate() {
            let may_write = self.acks != Acks::LostRereadFirst
                || rereading.is_none_or(|waiting| waiting == index);
            let replica = u8::try_from(index).expect("a few replicas");
            let Some(call) = &r.call else {
                if usize::from(r.next) < self.scripts[index].len() {
                    actions.push(Action::Invoke(replica));
                }
                continue;
            };
            match call.request {
                Request::Read => actions.extend(
                    (0..=state.latest()).map(|revision| Action::Read { replica, revision }),
                ),
                Request::Confirm { .. } => actions.push(Action::Confirm(replica)),
                Request::Write { .. } if may_write => {
                    actions.push(Action::Write(replica));
                    if self.acks != Acks::Reliable && !call.lost_try {
                        actions.push(Action::WriteAckLost(replica));
                        actions.push(Action::WriteUnanswered(replica));
                        actions.push(Action::WriteConflictAnswered(replica));
                    }
                }
                Request::Write { .. } => {}
                other => unreachable!("{other:?} is not a request this model makes"),
            }
        }
    }

    fn next_state(&self, last_state: &NatsState, action: Action) -> Option<NatsState> {
        let mut state = last_state.clone();
        state.last = None;
        match action {
            Action::Invoke(replica) => {
                let invoked_at = state.latest();
                // `EntryCache::take`: the cached entry serves this call only.
                let cached =
                    state.replicas[usize::from(replica)]
                        .cache
                        .take()
                        .and_then(|revision| {
                            let entry = state.entry_at(revision)?.clone();
                            Some((KvRevision::at(u64::from(revision)), entry))
                        });
                let mut attempts = CallAttempts::new(cached.clone(), MODEL_ATTEMPTS);
                let first = attempts.start();
                state.replicas[usize::from(replica)].call = Some(InFlight {
                    attempts,
                    request: Request::Read,
                    invoked_at,
                    resent: false,
                    lost_try: false,
                    from_cache: cached.is_some(),
                    decisions: 0,
                    rewrite: false,
                });
                self.run(&mut state, replica, first);
            }
            Action::Read { replica, revision } => {
                if revision < state.latest() {
                    state.last = Some(Effect::StaleRead);
                }
                let read = state.read_at(revision);
                let in_flight = state.call(replica);
                in_flight.from_cache = false;
                let next = in_flight.attempts.read(read);
                self.run(&mut state, replica, next);
            }
            Action::Confirm(replica) => {
                let latest = state.latest();
                let in_flight = state.call(replica);
                let Request::Confirm { read } = in_flight.request else {
                    unreachable!("only a confirming replica confirms")
                };
                let confirmed = read.map_or(0, small) == latest;
                let retried = in_flight.decisions > 1;
                let next = in_flight.attempts.confirmed(confirmed);
                state.last = Some(match &next {
                    Command::Answer(answer, _) => Effect::Confirmed {
                        retried,
                        replay: matches!(
                            answer,
                            Answer::Replied {
                                said: Said::Started { replayed: true, .. },
                                ..
                            }
                        ),
                    },
                    _ => Effect::Unconfirmed,
                });
                self.run(&mut state, replica, next);
            }
            Action::WriteUnanswered(replica) => {
                let in_flight = state.call(replica);
                (in_flight.resent, in_flight.lost_try) = (true, true);
                state.last = Some(Effect::Unanswered);
            }
            Action::Write(replica) => self.write(&mut state, replica, Answered::Acked),
            Action::WriteAckLost(replica) => self.write(&mut state, replica, Answered::Not),
            Action::WriteConflictAnswered(replica) => {
                self.write(&mut state, replica, Answered::Conflict);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            // ---- safety ----
            Property::always("every answer is linearizable", |_, s: &NatsState| {
                !s.has(Fault::NotLinearizable)
            }),
            Property::always("nothing acknowledged is lost", |_, s: &NatsState| {
                s.nothing_lost()
            }),
            Property::always("a call takes effect at most once", |_, s: &NatsState| {
                !s.has(Fault::AppliedTwice)
            }),
            Property::always("at most one live response", |_, s: &NatsState| {
                s.ledger.at_most_one_live()
            }),
            Property::always(
                "every started response gets exactly one terminal",
                |_, s: &NatsState| s.ledger.one_terminal_each(),
            ),
            Property::always("nothing starts after terminated", |_, s: &NatsState| {
                s.ledger.nothing_after_terminated()
            }),
            // ---- reachability: the paths the protocol exists for ----
            Property::sometimes(
                "a read is served stale by a deposed leader",
                |_, s: &NatsState| s.last == Some(Effect::StaleRead),
            ),
            Property::sometimes(
                "a compare-and-set conflict sends the call round again",
                |_, s: &NatsState| matches!(s.last, Some(Effect::Conflict { from_cache: false })),
            ),
            Property::sometimes(
                "a write against a stale cached entry is refused by compare-and-set",
                |_, s: &NatsState| matches!(s.last, Some(Effect::Conflict { from_cache: true })),
            ),
            Property::sometimes(
                "a call decided again after a conflict is answered with a write",
                |_, s: &NatsState| {
                    matches!(
                        s.last,
                        Some(Effect::Wrote {
                            from_cache: false,
                            retried: true
                        })
                    )
                },
            ),
            Property::sometimes(
                "a write against the cached entry succeeds",
                |_, s: &NatsState| {
                    matches!(
                        s.last,
                        Some(Effect::Wrote {
                            from_cache: true,
                            ..
                        })
                    )
                },
            ),
            Property::sometimes(
                "an answer without a write is not confirmed at the quorum point",
                |_, s: &NatsState| s.last == Some(Effect::Unconfirmed),
            ),
            Property::sometimes(
                "an answer without a write is confirmed at the quorum point",
                |_, s: &NatsState| matches!(s.last, Some(Effect::Confirmed { retried: false, .. })),
            ),
            Property::sometimes(
                "an answer without a write is confirmed after going round again",
                |_, s: &NatsState| matches!(s.last, Some(Effect::Confirmed { retried: true, .. })),
            ),
        ];
        let starts = self.scripts.iter().flatten().filter_map(|req| match req {
            Req::Start(request) => Some(request),
            _ => None,
        });
        let retried_start = starts
            .clone()
            .enumerate()
            .any(|(at, request)| starts.clone().skip(at + 1).any(|other| other == request));
        // After a Shutdown every no-write answer is on a terminated
        // session, which is confirmed at a quorum point, not rewritten.
        if !self
            .scripts
            .iter()
            .flatten()
            .any(|req| *req == Req::Shutdown)
        {
            properties.push(Property::sometimes(
                "an unconfirmed answer is confirmed by writing its entry back",
                |_, s: &NatsState| s.last == Some(Effect::Rewritten),
            ));
        }
        if retried_start {
            properties.push(Property::sometimes(
                "a Start retried on the other replica is answered by a confirmed replay",
                |_, s: &NatsState| matches!(s.last, Some(Effect::Confirmed { replay: true, .. })),
            ));
        }
        if self.acks != Acks::Reliable {
            properties.extend([
                Property::sometimes(
                    "a write whose acknowledgement was lost is recognised as the call's own",
                    |_, s: &NatsState| matches!(s.last, Some(Effect::Recognised { .. })),
                ),
                Property::sometimes(
                    "a write a deposed leader answered \"conflict\" is recognised as the call's own",
                    |_, s: &NatsState| s.last == Some(Effect::RecognisedAfterConflict),
                ),
            ]);
        }
        if self.acks == Acks::Lost {
            properties.extend([
                Property::sometimes(
                    "a lost acknowledgement is recognised from the successor after another write",
                    |_, s: &NatsState| {
                        s.last
                            == Some(Effect::Recognised {
                                after_another_write: true,
                            })
                    },
                ),
                Property::sometimes(
                    "an unanswered write that another write preceded is decided again",
                    |_, s: &NatsState| s.last == Some(Effect::NotLanded),
                ),
                Property::sometimes(
                    "an unanswered create that cannot be told is answered UNAVAILABLE",
                    |_, s: &NatsState| s.last == Some(Effect::Unavailable),
                ),
            ]);
        }
        properties
    }
}

impl NatsPath {
    /// The replica's write try: compare-and-set (or a plain put under a
    /// mutation), answered as `answered` says when it lands.
    fn write(&self, state: &mut NatsState, replica: u8, answered: Answered) {
        let latest = state.latest();
        let in_flight = state.call(replica);
        let Request::Write { expected } = in_flight.request else {
            unreachable!("only a writing replica writes")
        };
        let expected = small(expected);
        let guarded = match self.mutation {
            Mutation::CasOff => false,
            Mutation::TrustCache => !in_flight.from_cache,
            Mutation::None => true,
        };
        if guarded && expected != latest {
            let from_cache = in_flight.from_cache;
            let written = if in_flight.resent {
                Written::ConflictAfterUnanswered
            } else {
                state.last = Some(Effect::Conflict { from_cache });
                Written::Conflict
            };
            let next = state.call(replica).attempts.written(written);
            self.run(state, replica, next);
            return;
        }
        self.commit(state, replica, expected);
        let revision = state.latest();
        let in_flight = state.call(replica);
        match answered {
            Answered::Acked => {}
            Answered::Not => {
                // `Inner::write` sends the same write again, which will
                // meet a conflict: its own write, or later ones.
                (in_flight.resent, in_flight.lost_try) = (true, true);
                state.last = Some(Effect::AckLost);
                return;
            }
            Answered::Conflict => {
                in_flight.lost_try = true;
                let next = in_flight.attempts.written(Written::Conflict);
                state.last = Some(Effect::ConflictAnswered);
                self.run(state, replica, next);
                return;
            }
        }
        let effect = if in_flight.rewrite {
            Effect::Rewritten
        } else {
            Effect::Wrote {
                from_cache: in_flight.from_cache,
                retried: in_flight.decisions > 1,
            }
        };
        let next = in_flight
            .attempts
            .written(Written::At(KvRevision::at(u64::from(revision))));
        state.last = Some(effect);
        self.run(state, replica, next);
    }
}

/// How a write's try that lands is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answered {
    /// With its revision.
    Acked,
    /// Not at all: it is sent again.
    Not,
    /// "Conflict", by a deposed stream leader.
    Conflict,
}

/// Replica 0: Start, then Cancel fenced by response 1 (the first id
/// minted); replica 1: Start. Two Starts race to create and supersede,
/// and the Cancel is a write (1 is live) or a refusal (1 was superseded).
pub fn supersede_and_fenced_cancel(mutation: Mutation) -> NatsPath {
    NatsPath::new(
        vec![
            vec![Req::Start(1), Req::Cancel(Some(1))],
            vec![Req::Start(2)],
        ],
        Acks::Reliable,
        mutation,
    )
}

/// Replica 0: Start, then Finish of response 1; replica 1: Shutdown. The
/// Start may be refused (the session already torn down), the Finish a
/// write or a no-op.
pub fn finish_and_shutdown(mutation: Mutation) -> NatsPath {
    NatsPath::new(
        vec![vec![Req::Start(1), Req::Finish(1)], vec![Req::Shutdown]],
        Acks::Reliable,
        mutation,
    )
}

/// Replica 0: Start, then an unfenced Cancel; replica 1: Start, then
/// Finish of response 2; a write's try may go unanswered (`acks`).
pub fn lost_acks(acks: Acks, mutation: Mutation) -> NatsPath {
    NatsPath::new(
        vec![
            vec![Req::Start(1), Req::Cancel(None)],
            vec![Req::Start(2), Req::Finish(2)],
        ],
        acks,
        mutation,
    )
}

/// Replica 0: Start with request id 1, then Finish of response 1;
/// replica 1: the client's retry of the same Start (its first replica
/// seemed gone), then an unfenced Cancel. The retry is a replay, an answer
/// without a write, wherever the first attempt was applied.
pub fn retried_start(mutation: Mutation) -> NatsPath {
    NatsPath::new(
        vec![
            vec![Req::Start(1), Req::Finish(1)],
            vec![Req::Start(1), Req::Cancel(None)],
        ],
        Acks::Reliable,
        mutation,
    )
}

/// Three replicas, five calls: Start and a fenced Cancel; Start and a
/// Finish; Shutdown.
pub fn three_replicas(mutation: Mutation) -> NatsPath {
    NatsPath::new(
        vec![
            vec![Req::Start(1), Req::Cancel(Some(1))],
            vec![Req::Start(2), Req::Finish(2)],
            vec![Req::Shutdown],
        ],
        Acks::Reliable,
        mutation,
    )
}
