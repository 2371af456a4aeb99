//! A call's attempts on the bucket as data: the whole per-call policy of the
//! NATS backend, with no awaits, no clock and no store in it.
//!
//! [`CallAttempts`] is told what each store request returned and says what
//! to do next ([`Command`]): read the key, decide on an entry, write with
//! compare-and-set, confirm an answer that writes nothing at a quorum
//! point, purge, or find out whether a write whose answer was lost landed;
//! or it gives the call's answer, with what the replica's entry cache
//! should remember. The async driver (`Inner::compare_and_set`) carries the
//! commands out; model 4 (`tests/model_check/nats_path.rs`) feeds the same
//! machine from a model store, so the policy checked is the one that runs.
//!
//! The policy:
//! - An attempt decides on the entry this replica last wrote (once, on the
//!   first attempt) or on a fresh read. A write is a compare-and-set over
//!   the revision decided on; a conflict sends the call round again, once
//!   the key's first message after that revision shows it is not this
//!   write: a stream leader that a partition deposed without its knowing
//!   can answer "wrong last sequence" to a write the new leader commits
//!   (both receive it while a partition heals, and the first answer wins;
//!   the fault runs' majority/minority split found a Start answered as its
//!   own replay that way).
//! - An answer that writes nothing stands only once the entry it was
//!   decided on is confirmed the key's latest at a quorum point after the
//!   call arrived; else the call goes round again. Once one went
//!   unconfirmed, a later one decided on a live entry is confirmed by
//!   writing that entry back unchanged (without its events), which on a
//!   busy session lands where a quorum point would keep losing.
//! - If that first message is this write, the call answers what it
//!   decided. If it is another's after a conflict answered at once, the
//!   write did not land. After a try that went unanswered (its retry then
//!   meeting its own write is the usual case) the rule is stricter: the
//!   write did not land only if the expected revision is still held, so
//!   nothing between was dropped; else nobody can tell and the call gives
//!   up as unavailable, never writing a second time.
//! - After `max_attempts` attempts the call gives up as contended.

use super::entry::KvRevision;

/// A session's entry as read: its stored record, or nothing (never created,
/// forgotten or purged) with the revision a create must expect.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Read<E> {
    Live { revision: KvRevision, entry: E },
    Absent { revision: KvRevision },
}

impl<E> Read<E> {
    /// The revision a write decided on this read expects.
    pub fn revision(&self) -> KvRevision {
        match self {
            Read::Live { revision, .. } | Read::Absent { revision } => *revision,
        }
    }

    /// The revision of a stored record, `None` for an absent one: what a
    /// quorum point confirms an answer without a write against.
    pub fn live_revision(&self) -> Option<KvRevision> {
        match self {
            Read::Live { revision, .. } => Some(*revision),
            Read::Absent { .. } => None,
        }
    }
}

/// What the machine needs to know of a stored entry.
pub trait Stored: Clone {
    /// Whether an answer that writes nothing, decided on this entry, may be
    /// confirmed by writing it back: not a terminated session's, as a
    /// write would move the time it is forgotten after.
    fn rewritable(&self) -> bool;

    /// The entry as written back to confirm an answer: the record as it
    /// is, with none of the events of the transition that wrote it.
    fn without_events(self) -> Self;
}

/// What one attempt decided on what it read (`Command::Decide`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step<E, A> {
    /// The answer stands as it is (expiry's "nothing to do").
    Stands(A),
    /// An answer that writes nothing: it stands once confirmed.
    Confirm(A),
    /// Write `entry` over the revision read, then answer; on success the
    /// entry is remembered in the cache if `cache`, else the cached one is
    /// dropped.
    Write { entry: E, cache: bool, answer: A },
    /// Purge the key if it is still at the revision read, then answer.
    Purge(A),
}

/// A store request the driver makes for the machine, then reports back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Request {
    /// Read the key from the stream leader: report with
    /// [`CallAttempts::read`].
    Read,
    /// Write [`CallAttempts::entry_to_write`] if the key is still at
    /// `expected`: report with [`CallAttempts::written`].
    Write { expected: KvRevision },
    /// Is `read` (`None`: no record) the key's latest at a quorum point
    /// after the call arrived? Report with [`CallAttempts::confirmed`].
    Confirm { read: Option<KvRevision> },
    /// Purge the key if it is still at `expected`: report with
    /// [`CallAttempts::purged`].
    Purge { expected: KvRevision },
    /// The key's first message after `expected`, and whether its bytes are
    /// the ones this write sent: report with [`CallAttempts::successor`].
    Successor { expected: KvRevision },
    /// Does the stream still hold the key's message at `revision`? Report
    /// with [`CallAttempts::held`].
    Held { revision: KvRevision },
}

/// What the replica's entry cache does once the call is answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CacheChange<E> {
    /// Leave it as it is.
    Keep,
    /// Remember this entry at this revision: the replica wrote it.
    Put(KvRevision, E),
    /// Drop the session's entry.
    Forget,
}

/// Why a call gave up without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GiveUp {
    /// Every attempt lost: `lost` writes met another write first,
    /// `unconfirmed` answers were not the latest at their quorum point.
    Contended { lost: u32, unconfirmed: u32 },
    /// A write's answer was lost and whether it landed cannot be told.
    LandingUnknown,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Command<E, A> {
    /// Make this store request and report what it returned.
    Request(Request),
    /// Decide on this read and report the step with
    /// [`CallAttempts::decided`].
    Decide(Read<E>),
    /// The call's answer, and what the cache does.
    Answer(A, CacheChange<E>),
    /// The call ends without an answer.
    GiveUp(GiveUp),
}

/// What a compare-and-set write came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Written {
    /// It landed at this revision.
    At(KvRevision),
    /// Answered "another write came first" (which a deposed stream leader
    /// may answer to a write the new leader commits).
    Conflict,
    /// A try went unanswered and a later one met a conflict: that may be
    /// the write's own first try.
    ConflictAfterUnanswered,
}

/// The key's first message after a write's expected revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Successor {
    pub revision: KvRevision,
    /// Its bytes are the ones the write sent.
    pub ours: bool,
}

/// Where the current attempt is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Pending<E, A> {
    /// Between a read (or the cached entry) and its decision.
    Deciding,
    /// An answer that writes nothing, waiting for its quorum point.
    Confirming(A),
    /// A write (or a rewrite) in flight, or being asked after.
    Writing {
        entry: E,
        cache: bool,
        answer: A,
    },
    Purging(A),
    /// Answered or given up.
    Done,
}

/// The attempts of one call: see the module.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallAttempts<E, A> {
    max_attempts: u32,
    attempts: u32,
    lost: u32,
    unconfirmed: u32,
    /// The entry this replica last wrote, for the first attempt.
    cached: Option<(KvRevision, E)>,
    /// The read the current attempt decided on.
    expected: KvRevision,
    read: Option<KvRevision>,
    /// The entry read, kept to be written back once an answer went
    /// unconfirmed.
    rewritable: Option<E>,
    /// The write in flight met its conflict after a try that went
    /// unanswered.
    after_unanswered: bool,
    pending: Pending<E, A>,
}

impl<E: Stored, A> CallAttempts<E, A> {
    /// A call that may decide its first attempt on `cached`, the entry this
    /// replica last wrote, and makes at most `max_attempts` attempts.
    pub fn new(cached: Option<(KvRevision, E)>, max_attempts: u32) -> Self {
        Self {
            max_attempts,
            attempts: 0,
            lost: 0,
            unconfirmed: 0,
            cached,
            expected: KvRevision::NONE,
            read: None,
            rewritable: None,
            after_unanswered: false,
            pending: Pending::Done,
        }
    }

    /// The first command.
    pub fn start(&mut self) -> Command<E, A> {
        self.attempt()
    }

    /// The next attempt: on the cached entry if this is the first, else a
    /// fresh read; or the call gives up.
    fn attempt(&mut self) -> Command<E, A> {
        if self.attempts >= self.max_attempts {
            self.pending = Pending::Done;
            return Command::GiveUp(GiveUp::Contended {
                lost: self.lost,
                unconfirmed: self.unconfirmed,
            });
        }
        self.attempts += 1;
        match self.cached.take() {
            Some((revision, entry)) => self.read(Read::Live { revision, entry }),
            None => Command::Request(Request::Read),
        }
    }

    /// The key as read: decide on it.
    pub fn read(&mut self, read: Read<E>) -> Command<E, A> {
        self.expected = read.revision();
        self.read = read.live_revision();
        self.rewritable = match &read {
            Read::Live { entry, .. } if self.unconfirmed > 0 && entry.rewritable() => {
                Some(entry.clone())
            }
            _ => None,
        };
        self.pending = Pending::Deciding;
        Command::Decide(read)
    }

    /// What the attempt decided on its read.
    pub fn decided(&mut self, step: Step<E, A>) -> Command<E, A> {
        let expected = self.expected;
        match step {
            Step::Stands(answer) => self.answer(answer, CacheChange::Keep),
            Step::Confirm(answer) => match self.rewritable.take() {
                Some(entry) => {
                    self.pending = Pending::Writing {
                        entry: entry.without_events(),
                        cache: true,
                        answer,
                    };
                    Command::Request(Request::Write { expected })
                }
                None => {
                    self.pending = Pending::Confirming(answer);
                    Command::Request(Request::Confirm { read: self.read })
                }
            },
            Step::Write {
                entry,
                cache,
                answer,
            } => {
                self.pending = Pending::Writing {
                    entry,
                    cache,
                    answer,
                };
                Command::Request(Request::Write { expected })
            }
            Step::Purge(answer) => {
                self.pending = Pending::Purging(answer);
                Command::Request(Request::Purge { expected })
            }
        }
    }

    /// The entry the write in flight sends.
    pub fn entry_to_write(&self) -> Option<&E> {
        match &self.pending {
            Pending::Writing { entry, .. } => Some(entry),
            _ => None,
        }
    }

    /// What the write came to.
    pub fn written(&mut self, written: Written) -> Command<E, A> {
        match written {
            Written::At(revision) => self.landed(revision),
            Written::Conflict | Written::ConflictAfterUnanswered => {
                self.after_unanswered = written == Written::ConflictAfterUnanswered;
                Command::Request(Request::Successor {
                    expected: self.expected,
                })
            }
        }
    }

    /// The key's first message after the expected revision.
    pub fn successor(&mut self, successor: Successor) -> Command<E, A> {
        if successor.ours {
            return self.landed(successor.revision);
        }
        if !self.after_unanswered {
            // Answered at once: the write was sent once, and the first
            // message after what it expected is another's.
            self.lost += 1;
            return self.attempt();
        }
        if self.expected == KvRevision::NONE {
            // A create: what it was written over is no message at all, so
            // whether an earlier message of the key was this write's
            // cannot be told.
            return self.give_up(GiveUp::LandingUnknown);
        }
        Command::Request(Request::Held {
            revision: self.expected,
        })
    }

    /// Whether the stream still holds the expected revision's message.
    pub fn held(&mut self, held: bool) -> Command<E, A> {
        if !held {
            return self.give_up(GiveUp::LandingUnknown);
        }
        // Nothing between the expected revision and its successor was
        // dropped, and the successor is another write: this one did not
        // land.
        self.lost += 1;
        self.attempt()
    }

    /// Whether the read an answer was decided on was the latest at a
    /// quorum point.
    pub fn confirmed(&mut self, confirmed: bool) -> Command<E, A> {
        if !confirmed {
            self.unconfirmed += 1;
            return self.attempt();
        }
        match std::mem::replace(&mut self.pending, Pending::Done) {
            Pending::Confirming(answer) => Command::Answer(answer, CacheChange::Keep),
            _ => self.out_of_turn(),
        }
    }

    /// Whether the purge found the key still at the revision read.
    pub fn purged(&mut self, purged: bool) -> Command<E, A> {
        if !purged {
            return self.attempt();
        }
        match std::mem::replace(&mut self.pending, Pending::Done) {
            Pending::Purging(answer) => Command::Answer(answer, CacheChange::Forget),
            _ => self.out_of_turn(),
        }
    }

    /// The write in flight landed at `revision`.
    fn landed(&mut self, revision: KvRevision) -> Command<E, A> {
        match std::mem::replace(&mut self.pending, Pending::Done) {
            Pending::Writing {
                entry,
                cache,
                answer,
            } => {
                let change = if cache {
                    CacheChange::Put(revision, entry)
                } else {
                    CacheChange::Forget
                };
                Command::Answer(answer, change)
            }
            _ => self.out_of_turn(),
        }
    }

    fn answer(&mut self, answer: A, cache: CacheChange<E>) -> Command<E, A> {
        self.pending = Pending::Done;
        Command::Answer(answer, cache)
    }

    fn give_up(&mut self, why: GiveUp) -> Command<E, A> {
        self.pending = Pending::Done;
        Command::GiveUp(why)
    }

    /// A report that answers no request this machine made (a driver bug):
    /// nothing is answered from it, the call goes round again.
    fn out_of_turn(&mut self) -> Command<E, A> {
        self.attempt()
    }
}

#[cfg(test)]
mod tests;
