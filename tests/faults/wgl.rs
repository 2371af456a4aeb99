//! The sequential specification and the search for one session's history.
//!
//! The specification is the project's own decision core: every step runs
//! `respcoord::decision::decide` on a real `Session`, so the checker cannot
//! drift from the code it judges. The search is Wing & Gong's with Lowe's
//! just-in-time linearization: walk the history's invocation and completion
//! entries in time order, linearize a call as soon as its invocation is
//! reached and the model gives its answer, back up when a completion is
//! reached whose call is not linearized yet; a set of (linearized calls,
//! model state) already explored is never explored again, which is what
//! keeps thousands of calls with ~16 in flight to seconds.

use std::collections::{HashMap, HashSet};

use respcoord::{
    decision::{decide, Presence, Room, Stamp},
    error::CoordError,
    ids::{ResponseId, SessionId},
    machine::{self, Outcome, Phase},
    session::{Call, Session},
};

use crate::history::{Answer, EventKind};

/// The time every call is decided at. The checker models no expiry (fault
/// runs keep TTLs far longer than the run), and a constant keeps the idle
/// clock out of the states the memo tells apart.
const NOW: u64 = 1;

/// The session a search is about: its id, and what the replicas' watch
/// recordings say each revision was. Every transition the coordinator
/// stored is in the watch at its revision, so a step whose events differ
/// from the recorded ones at the same revisions cannot be the one that
/// happened: the search drops it at once instead of finding out many calls
/// later (what keeps a long hot session with open unknown calls decidable).
/// This only removes orders, so it can never hide a violation; a revision
/// no recording holds (a replica restarted, a gap) constrains nothing.
#[derive(Clone, Debug)]
pub struct Subject {
    pub id: SessionId,
    pub watched: HashMap<u64, EventKind>,
}

impl Subject {
    /// Whether events `kinds`, the first at `first_revision`, agree with
    /// the recordings.
    fn agrees(&self, first_revision: u64, kinds: &[machine::EventKind]) -> bool {
        kinds.iter().zip(first_revision..).all(|(kind, revision)| {
            self.watched
                .get(&revision)
                .is_none_or(|watched| *watched == seen(kind))
        })
    }
}

/// A domain event as a watch recording holds it.
fn seen(kind: &machine::EventKind) -> EventKind {
    match kind {
        machine::EventKind::Started { response, .. } => EventKind::Started {
            response: response.get(),
        },
        machine::EventKind::CancelRequested { response, .. } => EventKind::CancelRequested {
            response: response.get(),
        },
        machine::EventKind::Ended { response, .. } => EventKind::Ended {
            response: response.get(),
        },
        machine::EventKind::Terminated { .. } => EventKind::Terminated,
    }
}

/// The sequential state: the session record (`None` until a Start or
/// Shutdown creates it) and the highest response id minted so far, which the
/// record itself forgets once a response ends but every new id must exceed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Model {
    pub session: Option<Session>,
    pub last: u64,
}

impl Model {
    pub fn absent() -> Self {
        Self {
            session: None,
            last: 0,
        }
    }

    /// What GetState answers in this state.
    pub fn observe(&self, id: &SessionId) -> Answer {
        let Some(session) = &self.session else {
            return Answer::NotFound;
        };
        let snapshot = session.snapshot(id);
        Answer::State {
            active: snapshot.phase.active().map(|a| a.id.get()),
            terminated: snapshot.phase == Phase::Terminated,
            revision: snapshot.revision,
            responses_started: snapshot.responses_started,
        }
    }

    /// One line for a violation report.
    pub fn describe(&self, id: &SessionId) -> String {
        match self.observe(id) {
            Answer::State {
                active,
                terminated,
                revision,
                responses_started,
            } => {
                let phase = match (terminated, active) {
                    (true, _) => "terminated".to_owned(),
                    (false, Some(a)) => format!("active {a}"),
                    (false, None) => "idle".to_owned(),
                };
                format!(
                    "{phase}, revision {revision}, {responses_started} started, last id {}",
                    self.last
                )
            }
            _ => "absent (never created)".to_owned(),
        }
    }
}

/// What a call is to the specification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Call(Call),
    GetState,
}

/// What the history says a call answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    Answer(Answer),
    /// May or may not have happened. A Start that happened minted one of
    /// `ids` (0 stands for an id nobody observed: one above the last).
    Unknown {
        ids: Vec<u64>,
    },
}

/// One call of one session, as the search sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecOp {
    pub action: Action,
    pub expect: Expect,
    pub invoked: u64,
    /// `u64::MAX` for an unknown call: it may take effect at any later time.
    pub completed: u64,
    /// Index of the recorded op it came from.
    pub source: usize,
}

impl SpecOp {
    pub fn is_ok(&self) -> bool {
        matches!(self.expect, Expect::Answer(_))
    }

    fn choices(&self) -> usize {
        match (&self.expect, &self.action) {
            (Expect::Unknown { ids }, Action::Call(Call::Start { .. })) => ids.len(),
            _ => 1,
        }
    }

    /// The state after this call taken as its `choice`, or `None` if the
    /// specification cannot give the recorded answer here. An unknown call
    /// that would change nothing is refused too: leaving it out is the same
    /// history with one option more.
    pub fn step(&self, subject: &Subject, model: &Model, choice: usize) -> Option<Model> {
        let id = &subject.id;
        let call = match &self.action {
            Action::GetState => {
                return match &self.expect {
                    Expect::Answer(answer) => (model.observe(id) == *answer).then(|| model.clone()),
                    Expect::Unknown { .. } => None,
                }
            }
            Action::Call(call) => call,
        };
        let minted = match (&self.expect, call) {
            (Expect::Answer(Answer::Started { response, .. }), _) => *response,
            (Expect::Unknown { ids }, Call::Start { .. }) => match ids[choice] {
                0 => model.last + 1,
                id if id <= model.last => return None,
                id => id,
            },
            _ => model.last + 1,
        };
        let new_response = ResponseId::new(minted)?;
        let (mut session, presence) = match &model.session {
            Some(session) => (session.clone(), Presence::Stored),
            None => (
                Session::new(NOW),
                Presence::Absent {
                    room: Room::Available,
                },
            ),
        };
        let stamp = Stamp {
            first_seq: 0,
            unix_nanos: 0,
            new_response,
        };
        let reply = match decide(&mut session, presence, id, call, NOW) {
            Ok(decided) => {
                let decision = decided.settle(stamp, 0);
                match decision.change() {
                    Some(change) if !subject.agrees(change.first_revision, &change.kinds) => {
                        return None
                    }
                    _ => Some((decision.reply, decision.replayed())),
                }
            }
            Err(CoordError::SessionNotFound(_)) => None,
            Err(_) => return None,
        };
        let last = match reply {
            Some((Outcome::Started { response, .. }, false)) if response.get() <= model.last => {
                return None
            }
            Some((Outcome::Started { response, .. }, false)) => response.get(),
            _ => model.last,
        };
        let next = Model {
            session: match reply {
                Some(_) => Some(session),
                None => model.session.clone(),
            },
            last,
        };
        match &self.expect {
            Expect::Answer(answer) => answers(reply, answer).then_some(next),
            Expect::Unknown { .. } => (next != *model).then_some(next),
        }
    }
}

/// Whether the specification's reply is the recorded answer (`None`: the
/// session does not exist, NOT_FOUND).
fn answers(reply: Option<(Outcome, bool)>, answer: &Answer) -> bool {
    let id = |id: Option<ResponseId>| id.map(ResponseId::get);
    match (reply, answer) {
        (None, Answer::NotFound) => true,
        (
            Some((
                Outcome::Started {
                    response,
                    superseded,
                },
                replayed,
            )),
            Answer::Started {
                response: r,
                superseded: s,
                replayed: p,
            },
        ) => response.get() == *r && id(superseded) == *s && replayed == *p,
        (Some((Outcome::StartRefused, _)), Answer::StartRefused) => true,
        (Some((Outcome::Finished { applied }, _)), Answer::Finished { applied: a }) => {
            applied == *a
        }
        (Some((Outcome::Cancelled { cancelled }, _)), Answer::Cancelled { cancelled: c })
        | (Some((Outcome::TornDown { cancelled }, _)), Answer::ShutDown { cancelled: c }) => {
            id(cancelled) == *c
        }
        _ => false,
    }
}

/// How a search ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Linearizable {
        states: usize,
    },
    Not {
        states: usize,
    },
    /// Gave up after the state budget: undecided.
    Budget {
        states: usize,
    },
}

/// A reachable configuration with every answered call linearized: which
/// calls (indices into the ops) and the state.
pub type Config = (Vec<usize>, Model);

/// Whether `ops` linearize from `init`.
pub fn search(subject: &Subject, ops: &[SpecOp], init: &Model, budget: usize) -> Found {
    let mut found = false;
    let outcome = Walk::new(subject, ops, init.clone()).run(budget, |_, _| {
        found = true;
        false
    });
    match (outcome, found) {
        (Walked::Budget(states), _) => Found::Budget { states },
        (Walked::Done(states), true) => Found::Linearizable { states },
        (Walked::Done(states), false) => Found::Not { states },
    }
}

/// Every configuration reachable with all answered calls of `ops`
/// linearized (unknown ones in any subset that changes the state), or
/// `None` past the budget.
pub fn configurations(
    subject: &Subject,
    ops: &[SpecOp],
    init: &Model,
    budget: usize,
) -> Option<Vec<Config>> {
    let mut configs = Vec::new();
    let outcome = Walk::new(subject, ops, init.clone()).run(budget, |linearized, model| {
        configs.push((linearized.to_vec(), model.clone()));
        true
    });
    match outcome {
        Walked::Done(_) => Some(configs),
        Walked::Budget(_) => None,
    }
}

enum Walked {
    Done(usize),
    Budget(usize),
}

const END: usize = usize::MAX;

/// The search's state: the entries still to linearize as a doubly linked
/// list (Lowe's "lift" and "unlift" are unlinking and relinking), the stack
/// of linearized calls, and the memo.
struct Walk<'a> {
    subject: &'a Subject,
    ops: &'a [SpecOp],
    /// (op, is its completion), in time order; node `entries.len()` is the head.
    entries: Vec<(usize, bool)>,
    next: Vec<usize>,
    prev: Vec<usize>,
    call_node: Vec<usize>,
    return_node: Vec<Option<usize>>,
    /// Per op, a random 128-bit key; a linearized set's hash is the xor of
    /// its keys (Zobrist), kept up to date in O(1) per step. Two sets share
    /// a hash with probability ~2^-128 per pair, so the memo keeps the hash
    /// in place of the set.
    keys: Vec<u128>,
    /// Per unknown op, the unknown op just before it (in entry order) with
    /// the same call and expectation. Both are open forever once invoked, so
    /// either can stand for the other: the search only linearizes the later
    /// one after the earlier, which keeps n interchangeable unknown calls
    /// (a timed-out Cancel retried by many clients) from costing 2^n sets.
    twin: Vec<Option<usize>>,
    model: Model,
}

impl<'a> Walk<'a> {
    fn new(subject: &'a Subject, ops: &'a [SpecOp], model: Model) -> Self {
        let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (index, op) in ops.iter().enumerate() {
            order.push((op.invoked, false, index));
            if op.is_ok() {
                order.push((op.completed, true, index));
            }
        }
        // Invocations before completions at the same instant: calls that
        // touch in time count as concurrent (the weaker reading).
        order.sort_unstable();
        let head = order.len();
        let mut call_node = vec![0; ops.len()];
        let mut return_node = vec![None; ops.len()];
        let mut entries = Vec::with_capacity(order.len());
        for (node, &(_, ret, op)) in order.iter().enumerate() {
            if ret {
                return_node[op] = Some(node);
            } else {
                call_node[op] = node;
            }
            entries.push((op, ret));
        }
        let next = (0..=head)
            .map(|node| match node {
                n if n == head && head == 0 => END,
                n if n == head => 0,
                n if n + 1 == head => END,
                n => n + 1,
            })
            .collect();
        let prev = (0..=head)
            .map(|node| match node {
                0 => head,
                n if n == head => END,
                n => n - 1,
            })
            .collect();
        let keys = (0..ops.len() as u64)
            .map(|i| (u128::from(splitmix(i * 2)) << 64) | u128::from(splitmix(i * 2 + 1)))
            .collect();
        let twin = twins(ops, &entries);
        Self {
            subject,
            ops,
            entries,
            next,
            prev,
            call_node,
            return_node,
            keys,
            twin,
            model,
        }
    }

    fn head(&self) -> usize {
        self.entries.len()
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != END {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != END {
            self.prev[next] = node;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call_node[op]);
        if let Some(node) = self.return_node[op] {
            self.unlink(node);
        }
    }

    fn unlift(&mut self, op: usize) {
        if let Some(node) = self.return_node[op] {
            self.relink(node);
        }
        self.relink(self.call_node[op]);
    }

    /// Runs the search; `complete` is told of every configuration with all
    /// answered calls linearized and says whether to go on looking.
    fn run(mut self, budget: usize, mut complete: impl FnMut(&[usize], &Model) -> bool) -> Walked {
        let mut remaining = self.ops.iter().filter(|op| op.is_ok()).count();
        let mut memo: HashSet<(u128, Model)> = HashSet::new();
        let mut stack: Vec<(usize, usize, Model)> = Vec::new();
        let mut linearized: Vec<usize> = Vec::new();
        let mut is_linearized = vec![false; self.ops.len()];
        let mut hash = 0u128;
        let mut node = self.next[self.head()];
        let mut first_choice = 0;
        // Whether the current configuration is new (not yet offered).
        let mut fresh = true;
        loop {
            if fresh && remaining == 0 && !complete(&linearized, &self.model) {
                return Walked::Done(memo.len());
            }
            fresh = false;
            let backtrack = match (node, self.entries.get(node)) {
                (END, _) | (_, None) => true,
                (_, Some(&(_, true))) => true,
                (_, Some(&(op, false))) => {
                    let spec = &self.ops[op];
                    let mut advanced = false;
                    let stand_in = self.twin[op].is_some_and(|twin| !is_linearized[twin]);
                    let choices = if stand_in { 0 } else { spec.choices() };
                    for choice in first_choice..choices {
                        let Some(next) = spec.step(self.subject, &self.model, choice) else {
                            continue;
                        };
                        let key = (hash ^ self.keys[op], next);
                        if memo.contains(&key) {
                            continue;
                        }
                        let next = key.1.clone();
                        memo.insert(key);
                        if memo.len() > budget {
                            return Walked::Budget(memo.len());
                        }
                        stack.push((op, choice, std::mem::replace(&mut self.model, next)));
                        linearized.push(op);
                        is_linearized[op] = true;
                        hash ^= self.keys[op];
                        self.lift(op);
                        if spec.is_ok() {
                            remaining -= 1;
                        }
                        fresh = true;
                        advanced = true;
                        break;
                    }
                    first_choice = 0;
                    node = if advanced {
                        self.next[self.head()]
                    } else {
                        self.next[node]
                    };
                    false
                }
            };
            if backtrack {
                let Some((op, choice, model)) = stack.pop() else {
                    return Walked::Done(memo.len());
                };
                self.model = model;
                linearized.pop();
                is_linearized[op] = false;
                hash ^= self.keys[op];
                self.unlift(op);
                if self.ops[op].is_ok() {
                    remaining += 1;
                }
                node = self.call_node[op];
                first_choice = choice + 1;
            }
        }
    }
}

/// See `Walk::twin`.
fn twins(ops: &[SpecOp], entries: &[(usize, bool)]) -> Vec<Option<usize>> {
    let mut twin = vec![None; ops.len()];
    let mut last_of_kind: Vec<usize> = Vec::new();
    for &(op, _) in entries.iter().filter(|(op, ret)| !ret && !ops[*op].is_ok()) {
        let same = |other: &usize| {
            ops[*other].action == ops[op].action && ops[*other].expect == ops[op].expect
        };
        match last_of_kind.iter_mut().find(|other| same(other)) {
            Some(previous) => {
                twin[op] = Some(*previous);
                *previous = op;
            }
            None => last_of_kind.push(op),
        }
    }
    twin
}

fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
