//! Model 4: the NATS backend's call path (`src/nats.rs`, `Inner::call`).
//!
//! One session key in a JetStream key-value bucket, and two coordinator
//! replicas answering gateway calls on it. The store is the key's history
//! of committed writes: KV revision `r` is the `r`-th write, revision 0 is
//! "no entry". A write is a compare-and-set against the revision the call
//! decided on (`kv.update`); a read may be served by a deposed stream leader
//! and so return any committed revision, not only the latest.
//!
//! Each replica runs its calls one at a time (its per-session lock) the way
//! `Inner::call` does: take the entry this replica last wrote from its cache
//! (`nats/cache.rs`) or read the key; decide with the real shared decision
//! (one adapter, [`decide`]); an answer that changes something is written
//! with compare-and-set, and a conflict sends the call round again from a
//! fresh read; an answer that writes nothing (a no-op, a replay, a refusal)
//! is given only once a quorum point after the call arrived shows the entry
//! it was decided on still the key's latest (`Inner::confirmed`,
//! `nats/quorum.rs`), else the call goes round again; once an answer went
//! unconfirmed, a no-write answer decided again on a live session's entry
//! is confirmed by writing that entry back unchanged with compare-and-set
//! (`Inner::rewrite`), a write like any other here. A write whose try
//! went unanswered is tried again, the same bytes over the same revision
//! (`Inner::write`); if the retry meets a conflict, the key's first write
//! after that revision tells whether the call's write landed
//! (`nats/landed.rs`).
//!
//! A ghost sequential run, the real `Session` fed the committed writes in
//! commit order, judges every answer (see [`NatsState::spec`]).

use respcoord::{
    decision::{self, Presence, Room, Stamp},
    error::CoordError,
    ids::{RequestId, ResponseId, SessionId},
    machine::{EventKind, FinishStatus, Outcome, Phase, Source, TeardownReason},
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
/// `nats/entry.rs` stores them) and the highest response id it minted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub session: Session,
    pub last_response: u64,
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
    /// The entry to write and the events it carries; `None` for an answer
    /// that writes nothing.
    pub write: Option<(Entry, Vec<EventKind>)>,
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
        let entry = Entry {
            session,
            last_response,
        };
        (entry, kinds)
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

/// Deliberately broken replicas: each must make a property fail. The
/// mutation is in how this model's replica runs the call path; `src/` is
/// unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The call path as `Inner::call` is.
    None,
    /// An answer that writes nothing is given at once, from whatever entry
    /// it was decided on (a deposed leader's read, or the cache), with no
    /// quorum point.
    SkipConfirmation,
    /// The cached entry is taken for the latest: a write decided on it is
    /// a plain put, not a compare-and-set.
    TrustCache,
    /// Every write is a plain put (`kv.put`), with no expected revision.
    CasOff,
    /// The call path before `nats/landed.rs`: a retry that meets a conflict
    /// after an unanswered try sends the call round again, and the call
    /// recognises its own write only if a read returns it, that is, in
    /// practice, only while it is still the key's latest entry.
    OwnWriteOnlyIfLatest,
}

/// Whether a write's try can go unanswered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// Every try is answered.
    Reliable,
    /// A try may go unanswered (a timeout during a stream leader move),
    /// having landed (its acknowledgement lost) or not: `Inner::write`
    /// sends the same write over the same revision again. If that retry
    /// meets a conflict, the key's first write after the expected revision
    /// (`Inner::landed`) tells whether the call's write landed there. No
    /// other replica writes before that call's retry has been answered.
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

/// Where a replica is in its current call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// No call in progress.
    Between,
    /// The call needs the key read from the store.
    Reading,
    /// Decided without a write on the entry at revision `read`; waiting for
    /// a quorum point to confirm it.
    Confirming { read: u8, answer: Answer },
    /// Decided with a write against revision `expected`.
    Writing {
        expected: u8,
        entry: Entry,
        kinds: Vec<EventKind>,
        answer: Answer,
        from_cache: bool,
        /// An earlier try of this write went unanswered (`tries > 1` in
        /// `Inner::write`): a conflict now may be the write's own.
        unanswered: bool,
        /// The entry read, written back to confirm a no-write answer
        /// (`Inner::rewrite`): the sequential run changes nothing here.
        rewrite: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Calls of its script answered so far (the current one's index).
    pub next: u8,
    /// The revision of the entry this replica last wrote (`EntryCache`;
    /// the entry itself is the store's at that revision, which never
    /// changes once committed).
    pub cache: Option<u8>,
    pub step: Step,
    /// The key's latest revision when the current call arrived.
    pub invoked_at: u8,
    /// The current call went round again (a conflict, or a read that was
    /// not confirmed).
    pub retried: bool,
    /// A no-write answer of the current call went unconfirmed: the next
    /// one is confirmed by writing its entry back (`Inner::rewrite`).
    pub unconfirmed: bool,
    /// What the current call's write whose try went unanswered (landed or
    /// not) decided; at most one per call, which bounds the writes a call
    /// makes. The real call compares the bytes it tried with the bytes
    /// stored; each write's bytes are unique (they hold the time), so here
    /// the writer of a committed version stands for them. Rewrites of one
    /// revision are the exception: two hold the same bytes, and the real
    /// call may take the other's for its own, answering on the entry that
    /// stands stored (`Inner::rewrite`); here it goes round again instead.
    pub unanswered: Option<Answer>,
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
    /// revision it expected; under `OwnWriteOnlyIfLatest`, a read); it is
    /// answered. `after_another_write`: the key had moved past it.
    Recognised { after_another_write: bool },
    /// A retry met a conflict after an unanswered try, and the successor
    /// of the expected revision is another call's: the write did not land,
    /// and the call goes round again.
    NotLanded,
    /// The same for a create (expected revision 0): what it was written
    /// over is not in the stream, so whether it landed cannot be told. The
    /// call is answered UNAVAILABLE, an error that applies nothing.
    Unavailable,
    /// (Mutation only) a no-write answer given without a quorum point.
    AnsweredUnconfirmed,
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

    /// Decides the replica's call on the entry at `revision` and moves it
    /// on: to a write, to a quorum point, or (mutation) to its answer.
    fn decided(&self, state: &mut NatsState, replica: u8, revision: u8, from_cache: bool) {
        let req = self.req(state, replica);
        let read = state.entry_at(revision);
        let Decided { answer, write } = decide(&self.session_id, read, req);
        // `Read::rewritable`: a live session's entry, not a terminated one's.
        let rewritable = read
            .filter(|entry| {
                state.replicas[usize::from(replica)].unconfirmed && !entry.session.is_terminated()
            })
            .cloned();
        let step = match (write, rewritable) {
            (Some((entry, kinds)), _) => Step::Writing {
                expected: revision,
                entry,
                kinds,
                answer,
                from_cache,
                unanswered: false,
                rewrite: false,
            },
            (None, Some(entry)) if self.mutation != Mutation::SkipConfirmation => Step::Writing {
                expected: revision,
                entry,
                kinds: Vec::new(),
                answer,
                from_cache,
                unanswered: false,
                rewrite: true,
            },
            (None, _) if self.mutation == Mutation::SkipConfirmation => {
                state.last = Some(Effect::AnsweredUnconfirmed);
                self.answered(state, replica, answer);
                return;
            }
            (None, _) => Step::Confirming {
                read: revision,
                answer,
            },
        };
        state.replicas[usize::from(replica)].step = step;
    }

    /// Goes round again from a fresh read.
    fn retry(state: &mut NatsState, replica: u8) {
        let r = &mut state.replicas[usize::from(replica)];
        r.step = Step::Reading;
        r.retried = true;
    }

    /// A call is answered other than by its own acknowledged write (a
    /// no-write answer, or a write of its own recognised on a read). If a
    /// write of the call landed, the answer is the sequential run's there;
    /// else it is what the sequential run answers, without a change, at
    /// some revision that was the latest during the call.
    fn answered(&self, state: &mut NatsState, replica: u8, answer: Answer) {
        let req = self.req(state, replica);
        let r = &state.replicas[usize::from(replica)];
        let (invoked_at, call) = (r.invoked_at, (replica, r.next));
        let linearizable = match state.store.iter().find(|v| v.writer == call) {
            // A write of this call landed (unacknowledged): the call took
            // effect there, so that is where its answer must come from; or,
            // for a Start, the replay of that answer that a client's retry
            // would get later (the contract's replay: same ids, the state
            // as it is now).
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
        r.step = Step::Between;
        r.invoked_at = 0;
        r.retried = false;
        r.unconfirmed = false;
        r.unanswered = None;
    }

    /// Commits the replica's write at the next revision and, if `acked`,
    /// answers it. The write is linearized here: the sequential run, given
    /// the call next, must answer the same and store the same.
    fn commit(&self, state: &mut NatsState, replica: u8, acked: bool) {
        let req = self.req(state, replica);
        let r = &state.replicas[usize::from(replica)];
        let Step::Writing {
            expected,
            entry,
            kinds,
            answer,
            from_cache,
            rewrite,
            ..
        } = r.step.clone()
        else {
            unreachable!("only a writing replica writes")
        };
        let (writer, retried) = ((replica, r.next), r.retried);
        if state.store.iter().any(|v| v.writer == writer) {
            state.faults |= Fault::AppliedTwice as u8;
        }
        let before = state.spec(state.latest()).cloned();
        let sequential = decide(&self.session_id, before.as_ref(), req);
        let spec = match sequential.write {
            // A rewrite stores what was there, and the sequential run,
            // given the call here, writes nothing and answers the same.
            _ if rewrite => {
                if sequential.write.is_some() || sequential.answer != answer {
                    state.faults |= Fault::NotLinearizable as u8;
                }
                before
            }
            Some((spec, _)) => {
                if spec != entry || sequential.answer != answer {
                    state.faults |= Fault::NotLinearizable as u8;
                }
                Some(spec)
            }
            None => {
                state.faults |= Fault::NotLinearizable as u8;
                before
            }
        };
        for kind in &kinds {
            state.ledger.observe(kind);
        }
        state.store.push(Version {
            entry,
            based_on: expected,
            writer,
            spec,
            answer: sequential.answer,
        });
        let revision = state.latest();
        let r = &mut state.replicas[usize::from(replica)];
        if acked {
            r.cache = Some(revision);
            state.last = Some(if rewrite {
                Effect::Rewritten
            } else {
                Effect::Wrote {
                    from_cache,
                    retried,
                }
            });
            Self::next_call(state, replica);
        } else {
            // `Inner::write` sends the same write again (`Action::Write`),
            // which will meet a conflict: its own write, or later ones.
            Self::unanswered(r);
            state.last = Some(Effect::AckLost);
        }
    }

    /// A try of the replica's write went unanswered: it is tried again.
    fn unanswered(r: &mut Replica) {
        let Step::Writing {
            answer,
            ref mut unanswered,
            ..
        } = r.step
        else {
            unreachable!("only a writing replica writes")
        };
        *unanswered = true;
        r.unanswered = Some(answer);
    }

    /// A retry met a conflict after an earlier try went unanswered: did the
    /// write land? `Inner::landed` reads the key's first write after the
    /// expected revision (from the stream leader: a deposed leader's prefix
    /// that lacks it is asked again, a delay). A compare-and-set lands only
    /// over the revision it expects, so if the write landed, it is that
    /// one, however many writes came after. The stream's per-key history
    /// is not modelled as evicting anything: the expected revision's own
    /// write is always still held, except for a create (revision 0).
    fn landed(&self, state: &mut NatsState, replica: u8, expected: u8) {
        let r = &state.replicas[usize::from(replica)];
        let call = (replica, r.next);
        let answer = r.unanswered.expect("an unanswered try");
        if state.store[usize::from(expected)].writer == call {
            // `Landed::At`: the call answers what it decided, and caches
            // the entry at the revision it landed at.
            let revision = expected + 1;
            state.last = Some(Effect::Recognised {
                after_another_write: revision < state.latest(),
            });
            state.replicas[usize::from(replica)].cache = Some(revision);
            self.answered(state, replica, answer);
        } else if expected > 0 {
            // `Landed::No`: decided again from a fresh read.
            state.last = Some(Effect::NotLanded);
            Self::retry(state, replica);
        } else {
            // Whether it landed cannot be told: UNAVAILABLE, which
            // applies nothing and claims nothing.
            state.last = Some(Effect::Unavailable);
            Self::next_call(state, replica);
        }
    }
}

impl Model for NatsPath {
    type State = NatsState;
    type Action = Action;

    fn init_states(&self) -> Vec<NatsState> {
        let replica = Replica {
            next: 0,
            cache: None,
            step: Step::Between,
            invoked_at: 0,
            retried: false,
            unconfirmed: false,
            unanswered: None,
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
        let rereading = state.replicas.iter().position(|r| r.unanswered.is_some());
        for (index, r) in state.replicas.iter().enumerate() {
            let may_write = self.acks != Acks::LostRereadFirst
                || rereading.is_none_or(|waiting| waiting == index);
            let replica = u8::try_from(index).expect("a few replicas");
            match r.step {
                Step::Between if usize::from(r.next) < self.scripts[index].len() => {
                    actions.push(Action::Invoke(replica));
                }
                Step::Between => {}
                Step::Reading => actions.extend(
                    (0..=state.latest()).map(|revision| Action::Read { replica, revision }),
                ),
                Step::Confirming { .. } => actions.push(Action::Confirm(replica)),
                Step::Writing { .. } if may_write => {
                    actions.push(Action::Write(replica));
                    // At most one unanswered try per call, which bounds
                    // the writes a call makes (two).
                    if self.acks != Acks::Reliable && r.unanswered.is_none() {
                        actions.push(Action::WriteAckLost(replica));
                        actions.push(Action::WriteUnanswered(replica));
                    }
                }
                Step::Writing { .. } => {}
            }
        }
    }

    fn next_state(&self, last_state: &NatsState, action: Action) -> Option<NatsState> {
        let mut state = last_state.clone();
        state.last = None;
        match action {
            Action::Invoke(replica) => {
                let latest = state.latest();
                let r = &mut state.replicas[usize::from(replica)];
                r.invoked_at = latest;
                // `EntryCache::take`: the cached entry serves this call only.
                match r.cache.take() {
                    Some(revision) => self.decided(&mut state, replica, revision, true),
                    None => r.step = Step::Reading,
                }
            }
            Action::Read { replica, revision } => {
                let r = &state.replicas[usize::from(replica)];
                let call = (replica, r.next);
                if let (Mutation::OwnWriteOnlyIfLatest, Some(answer), Some(index)) =
                    (self.mutation, r.unanswered, revision.checked_sub(1))
                {
                    if state.store[usize::from(index)].writer == call {
                        // The call's own write, landed after all: its answer.
                        state.last = Some(Effect::Recognised {
                            after_another_write: revision < state.latest(),
                        });
                        self.answered(&mut state, replica, answer);
                        return Some(state);
                    }
                }
                if revision < state.latest() {
                    state.last = Some(Effect::StaleRead);
                }
                self.decided(&mut state, replica, revision, false);
            }
            Action::Confirm(replica) => {
                let Step::Confirming { read, answer } = state.replicas[usize::from(replica)].step
                else {
                    unreachable!("only a confirming replica confirms")
                };
                if read == state.latest() {
                    let retried = state.replicas[usize::from(replica)].retried;
                    let replay = matches!(
                        answer,
                        Answer::Replied {
                            said: Said::Started { replayed: true, .. },
                            ..
                        }
                    );
                    state.last = Some(Effect::Confirmed { retried, replay });
                    self.answered(&mut state, replica, answer);
                } else {
                    state.last = Some(Effect::Unconfirmed);
                    state.replicas[usize::from(replica)].unconfirmed = true;
                    Self::retry(&mut state, replica);
                }
            }
            Action::WriteUnanswered(replica) => {
                Self::unanswered(&mut state.replicas[usize::from(replica)]);
                state.last = Some(Effect::Unanswered);
            }
            Action::Write(replica) | Action::WriteAckLost(replica) => {
                let Step::Writing {
                    expected,
                    from_cache,
                    unanswered,
                    ..
                } = state.replicas[usize::from(replica)].step
                else {
                    unreachable!("only a writing replica writes")
                };
                let guarded = match self.mutation {
                    Mutation::CasOff => false,
                    Mutation::TrustCache => !from_cache,
                    Mutation::None
                    | Mutation::SkipConfirmation
                    | Mutation::OwnWriteOnlyIfLatest => true,
                };
                if guarded && expected != state.latest() {
                    // Before `nats/landed.rs`, a conflict after an unanswered
                    // try was taken as any conflict.
                    if unanswered && self.mutation != Mutation::OwnWriteOnlyIfLatest {
                        self.landed(&mut state, replica, expected);
                    } else {
                        state.last = Some(Effect::Conflict { from_cache });
                        Self::retry(&mut state, replica);
                    }
                } else {
                    // (A first try, or the retry of one that went
                    // unanswered without landing, `Action::WriteUnanswered`.)
                    let acked = action == Action::Write(replica);
                    self.commit(&mut state, replica, acked);
                }
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
            properties.push(Property::sometimes(
                "a write whose acknowledgement was lost is recognised as the call's own",
                |_, s: &NatsState| matches!(s.last, Some(Effect::Recognised { .. })),
            ));
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
