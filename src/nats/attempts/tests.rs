//! Each rule of the attempt machine, driven directly. Model 4 checks the
//! same machine against every interleaving of a model store; these pin the
//! rules one by one, the ones the model does not reach among them (a
//! history that dropped the expected revision, the attempt bound).

use super::*;

/// A stored entry: its name, whether it may be written back, and how many
/// events it carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Entry {
    name: &'static str,
    terminated: bool,
    events: u8,
}

impl Stored for Entry {
    fn rewritable(&self) -> bool {
        !self.terminated
    }

    fn without_events(self) -> Self {
        Entry { events: 0, ..self }
    }
}

fn entry(name: &'static str) -> Entry {
    Entry {
        name,
        terminated: false,
        events: 2,
    }
}

fn live(revision: u64, name: &'static str) -> Read<Entry> {
    Read::Live {
        revision: KvRevision::at(revision),
        entry: entry(name),
    }
}

type Attempts = CallAttempts<Entry, &'static str>;

fn write(expected: u64) -> Command<Entry, &'static str> {
    Command::Request(Request::Write {
        expected: KvRevision::at(expected),
    })
}

fn written(name: &'static str, revision: u64) -> Command<Entry, &'static str> {
    Command::Answer(
        "answer",
        CacheChange::Put(KvRevision::at(revision), entry(name)),
    )
}

fn a_write_of(name: &'static str) -> Step<Entry, &'static str> {
    Step::Write {
        entry: entry(name),
        cache: true,
        answer: "answer",
    }
}

/// A write over `expected` is answered "conflict", and the key's next
/// message is another's: what the machine does next.
fn lost_to_another(attempts: &mut Attempts, expected: u64) -> Command<Entry, &'static str> {
    assert_eq!(
        attempts.written(Written::Conflict),
        Command::Request(Request::Successor {
            expected: KvRevision::at(expected)
        })
    );
    attempts.successor(Successor {
        revision: KvRevision::at(expected + 1),
        ours: false,
    })
}

/// Reads, decides `step` on what was read, and returns the next command.
fn on_read(
    attempts: &mut Attempts,
    read: Read<Entry>,
    step: Step<Entry, &'static str>,
) -> Command<Entry, &'static str> {
    assert_eq!(attempts.read(read.clone()), Command::Decide(read));
    attempts.decided(step)
}

#[test]
fn the_first_attempt_decides_on_the_cached_entry_and_later_ones_on_a_read() {
    let mut attempts = Attempts::new(Some((KvRevision::at(7), entry("cached"))), 4);
    assert_eq!(attempts.start(), Command::Decide(live(7, "cached")));
    assert_eq!(attempts.decided(a_write_of("next")), write(7));
    assert_eq!(attempts.entry_to_write(), Some(&entry("next")));
    // Another replica wrote since: the cache is not asked again.
    assert_eq!(
        lost_to_another(&mut attempts, 7),
        Command::Request(Request::Read)
    );
    assert_eq!(
        on_read(&mut attempts, live(9, "fresh"), a_write_of("next")),
        write(9)
    );
    assert_eq!(
        attempts.written(Written::At(KvRevision::at(10))),
        written("next", 10)
    );
}

#[test]
fn a_write_that_lands_is_cached_or_forgotten_as_decided() {
    let mut attempts = Attempts::new(None, 4);
    assert_eq!(attempts.start(), Command::Request(Request::Read));
    let forget = Step::Write {
        entry: entry("expired"),
        cache: false,
        answer: "answer",
    };
    assert_eq!(on_read(&mut attempts, live(3, "read"), forget), write(3));
    assert_eq!(
        attempts.written(Written::At(KvRevision::at(4))),
        Command::Answer("answer", CacheChange::Forget)
    );
}

#[test]
fn an_absent_key_is_created_over_its_revision_and_confirmed_as_absent() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    let absent = Read::Absent {
        revision: KvRevision::at(5),
    };
    assert_eq!(
        on_read(&mut attempts, absent.clone(), a_write_of("new")),
        write(5)
    );
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    assert_eq!(
        on_read(&mut attempts, absent, Step::Confirm("not found")),
        Command::Request(Request::Confirm { read: None })
    );
    assert_eq!(
        attempts.confirmed(true),
        Command::Answer("not found", CacheChange::Keep)
    );
}

#[test]
fn an_answer_without_a_write_stands_once_confirmed_and_else_goes_round() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    assert_eq!(
        on_read(&mut attempts, live(3, "read"), Step::Confirm("noop")),
        Command::Request(Request::Confirm {
            read: Some(KvRevision::at(3))
        })
    );
    assert_eq!(attempts.entry_to_write(), None);
    assert_eq!(
        attempts.confirmed(true),
        Command::Answer("noop", CacheChange::Keep)
    );
}

/// After one answer went unconfirmed, the next is confirmed by writing the
/// entry it was decided on back, without its events; a terminated one is
/// confirmed at a quorum point instead.
#[test]
fn after_an_unconfirmed_answer_the_entry_read_is_written_back() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    on_read(&mut attempts, live(3, "read"), Step::Confirm("noop"));
    assert_eq!(attempts.confirmed(false), Command::Request(Request::Read));
    assert_eq!(
        on_read(&mut attempts, live(4, "again"), Step::Confirm("noop")),
        write(4)
    );
    let rewritten = Entry {
        events: 0,
        ..entry("again")
    };
    assert_eq!(attempts.entry_to_write(), Some(&rewritten));
    assert_eq!(
        attempts.written(Written::At(KvRevision::at(6))),
        Command::Answer("noop", CacheChange::Put(KvRevision::at(6), rewritten))
    );

    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    on_read(&mut attempts, live(3, "read"), Step::Confirm("noop"));
    attempts.confirmed(false);
    let terminated = Read::Live {
        revision: KvRevision::at(4),
        entry: Entry {
            terminated: true,
            ..entry("gone")
        },
    };
    assert_eq!(
        on_read(&mut attempts, terminated, Step::Confirm("noop")),
        Command::Request(Request::Confirm {
            read: Some(KvRevision::at(4))
        })
    );
    // And a write the attempt decides is written as decided.
    assert_eq!(attempts.confirmed(false), Command::Request(Request::Read));
    assert_eq!(
        on_read(&mut attempts, live(5, "live"), a_write_of("next")),
        write(5)
    );
    assert_eq!(attempts.entry_to_write(), Some(&entry("next")));
}

#[test]
fn a_lost_answer_is_recognised_from_the_successor_of_the_expected_revision() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    on_read(&mut attempts, live(3, "read"), a_write_of("mine"));
    assert_eq!(
        attempts.written(Written::ConflictAfterUnanswered),
        Command::Request(Request::Successor {
            expected: KvRevision::at(3)
        })
    );
    let successor = Successor {
        revision: KvRevision::at(4),
        ours: true,
    };
    assert_eq!(attempts.successor(successor), written("mine", 4));
}

/// A deposed stream leader answered "conflict" while the new one committed
/// the write: the next message is the write's own, and the call answers
/// what it decided instead of deciding again (and, for a Start, answering
/// its own write as a replay).
#[test]
fn a_conflict_answered_for_a_write_that_landed_is_recognised() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    on_read(&mut attempts, live(3, "read"), a_write_of("mine"));
    assert_eq!(
        attempts.written(Written::Conflict),
        Command::Request(Request::Successor {
            expected: KvRevision::at(3)
        })
    );
    let mine = Successor {
        revision: KvRevision::at(4),
        ours: true,
    };
    assert_eq!(attempts.successor(mine), written("mine", 4));
}

/// A conflict answered at once whose next message is another's: the write
/// did not land, whatever the history still holds (a create's too).
#[test]
fn a_conflict_answered_at_once_for_another_write_goes_round() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    let absent = Read::Absent {
        revision: KvRevision::NONE,
    };
    on_read(&mut attempts, absent, a_write_of("mine"));
    assert_eq!(
        lost_to_another(&mut attempts, 0),
        Command::Request(Request::Read)
    );
}

#[test]
fn another_write_after_a_held_revision_means_the_write_did_not_land() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    on_read(&mut attempts, live(3, "read"), a_write_of("mine"));
    attempts.written(Written::ConflictAfterUnanswered);
    let theirs = Successor {
        revision: KvRevision::at(4),
        ours: false,
    };
    assert_eq!(
        attempts.successor(theirs),
        Command::Request(Request::Held {
            revision: KvRevision::at(3)
        })
    );
    assert_eq!(attempts.held(true), Command::Request(Request::Read));
    // It counts as a lost write.
    let mut one_attempt = Attempts::new(None, 1);
    one_attempt.start();
    on_read(&mut one_attempt, live(3, "read"), a_write_of("mine"));
    one_attempt.written(Written::ConflictAfterUnanswered);
    one_attempt.successor(theirs);
    assert_eq!(
        one_attempt.held(true),
        Command::GiveUp(GiveUp::Contended {
            lost: 1,
            unconfirmed: 0
        })
    );
}

#[test]
fn whether_a_write_landed_cannot_be_told_without_what_it_was_written_over() {
    // The expected revision left the key's history.
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    on_read(&mut attempts, live(3, "read"), a_write_of("mine"));
    attempts.written(Written::ConflictAfterUnanswered);
    let theirs = Successor {
        revision: KvRevision::at(9),
        ours: false,
    };
    attempts.successor(theirs);
    assert_eq!(
        attempts.held(false),
        Command::GiveUp(GiveUp::LandingUnknown)
    );
    // A create was written over no message at all.
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    let absent = Read::Absent {
        revision: KvRevision::NONE,
    };
    on_read(&mut attempts, absent, a_write_of("mine"));
    attempts.written(Written::ConflictAfterUnanswered);
    assert_eq!(
        attempts.successor(theirs),
        Command::GiveUp(GiveUp::LandingUnknown)
    );
}

#[test]
fn a_purge_forgets_the_cached_entry_and_a_refused_one_goes_round() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    assert_eq!(
        on_read(&mut attempts, live(8, "tombstone"), Step::Purge("forgot")),
        Command::Request(Request::Purge {
            expected: KvRevision::at(8)
        })
    );
    assert_eq!(attempts.purged(false), Command::Request(Request::Read));
    on_read(&mut attempts, live(9, "tombstone"), Step::Purge("forgot"));
    assert_eq!(
        attempts.purged(true),
        Command::Answer("forgot", CacheChange::Forget)
    );
}

#[test]
fn an_answer_that_stands_is_given_at_once() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    assert_eq!(
        on_read(&mut attempts, live(8, "read"), Step::Stands("nothing due")),
        Command::Answer("nothing due", CacheChange::Keep)
    );
}

/// The bound counts every attempt (the cached one too) and says what was
/// lost and what went unconfirmed.
#[test]
fn a_call_gives_up_as_contended_after_its_attempts() {
    let mut attempts = Attempts::new(Some((KvRevision::at(1), entry("cached"))), 3);
    attempts.start();
    attempts.decided(a_write_of("next"));
    assert_eq!(
        lost_to_another(&mut attempts, 1),
        Command::Request(Request::Read)
    );
    on_read(&mut attempts, live(2, "read"), Step::Confirm("noop"));
    assert_eq!(attempts.confirmed(false), Command::Request(Request::Read));
    on_read(&mut attempts, live(3, "read"), Step::Confirm("noop"));
    assert_eq!(
        lost_to_another(&mut attempts, 3),
        Command::GiveUp(GiveUp::Contended {
            lost: 2,
            unconfirmed: 1
        })
    );
}

/// A report that answers no request made (a driver bug) answers nothing: the
/// call goes round again.
#[test]
fn a_report_out_of_turn_answers_nothing() {
    let mut attempts = Attempts::new(None, 4);
    attempts.start();
    on_read(&mut attempts, live(3, "read"), a_write_of("mine"));
    assert_eq!(attempts.confirmed(true), Command::Request(Request::Read));
    on_read(&mut attempts, live(4, "read"), Step::Confirm("noop"));
    assert_eq!(attempts.purged(true), Command::Request(Request::Read));
    on_read(&mut attempts, live(5, "read"), Step::Purge("forgot"));
    assert_eq!(
        attempts.written(Written::At(KvRevision::at(6))),
        Command::Request(Request::Read)
    );
}
