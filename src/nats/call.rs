//! A call's attempts: each decides on what was read (the shared
//! `decision::decide`, or GetState's touch, or expiry's), and what it decided
//! is carried out (`Step`): a compare-and-set write, a purge, or an answer
//! that writes nothing, which stands once confirmed at a quorum point or by
//! writing its entry back. A conflict or an unconfirmed answer goes round
//! again from a fresh read, up to `timings::MAX_ATTEMPTS`.

use std::sync::PoisonError;

use super::{
    entry::{self, KvRevision},
    failure::Patience,
    timings, unix_millis, Inner,
};
use crate::{
    decision::{self, Decision, Effect, Presence, Room, Stamp},
    error::CoordError,
    ids::{ResponseId, SessionId},
    machine::{Call, Outcome, Phase},
    session::{self, Millis, Session, SessionSnapshot},
    shared::Clock,
};

/// The id a Start written now gives its response: above every id the
/// session minted, and at least the wall clock in nanoseconds, so ids keep
/// rising across a forgotten session's successor too (docs/cluster.md on
/// clocks).
fn mint(last_response: u64, unix_nanos: i64) -> ResponseId {
    let minted = last_response
        .saturating_add(1)
        .max(u64::try_from(unix_nanos).unwrap_or(0));
    ResponseId::new(minted).unwrap_or(ResponseId::MIN)
}

/// A session's entry as read: its stored record, or nothing (never created,
/// or forgotten) with the revision a create must expect.
pub(super) enum Read {
    Live {
        revision: KvRevision,
        entry: entry::Entry,
    },
    Absent {
        revision: KvRevision,
    },
}

impl Read {
    /// The entry read and its revision, if an answer decided on it may be
    /// confirmed by writing it back (`Inner::rewrite`): a live session's.
    /// A terminated one's is not rewritten (that would move the time it is
    /// forgotten after), and nothing else writes it but a touch.
    fn rewritable(&self) -> Option<(KvRevision, entry::Entry)> {
        match self {
            Read::Live { revision, entry } if entry.persisted.phase != Phase::Terminated => {
                Some((*revision, entry.clone()))
            }
            _ => None,
        }
    }

    /// The KV revision of a stored record read, `None` for an absent one:
    /// what `Inner::confirmed` checks an answer without a write against.
    fn live_revision(&self) -> Option<KvRevision> {
        match self {
            Read::Live { revision, .. } => Some(*revision),
            Read::Absent { .. } => None,
        }
    }
}

/// What one attempt of `Inner::compare_and_set` does with what it read.
pub(super) enum Step<T> {
    /// The answer stands as it is (expiry's "nothing to do").
    Stands(Result<T, CoordError>),
    /// An answer that writes nothing: it stands once the entry it was
    /// decided on (`read`, as `Read::live_revision`) is confirmed the key's
    /// latest at a quorum point, else the call goes round again.
    Confirm {
        read: Option<KvRevision>,
        answer: Result<T, CoordError>,
    },
    /// Write `entry` if the key is still at `expected`, then answer; the
    /// entry is remembered in the cache if `cache`, else the cached one is
    /// dropped.
    Write {
        expected: KvRevision,
        entry: entry::Entry,
        cache: bool,
        answer: T,
    },
    /// Purge a forgotten session's entry if the key is still at
    /// `expected`, then answer.
    Purge { expected: KvRevision, answer: T },
}

impl<T> Step<T> {
    fn confirm(read: Option<KvRevision>, answer: Result<T, CoordError>) -> Self {
        Step::Confirm { read, answer }
    }
}

impl Inner {
    /// The one path every call that may change a session takes: the shared
    /// decision (`decision::decide`) under this replica's per-session lock,
    /// written with compare-and-set against the revision it was decided on
    /// (`compare_and_set`).
    pub(super) async fn call(&self, id: &SessionId, call: &Call) -> Result<Decision, CoordError> {
        let _serialized = self.locks.lock(id).await;
        // The entry this replica last wrote saves the read: a write against
        // it that succeeds proves it was current. An answer that writes
        // nothing proves nothing by itself, so it stands only once confirmed
        // at a quorum point (`confirmed`), else it is decided again from a
        // fresh read.
        let cached = self.cache.take(id);
        let decision = self
            .compare_and_set(id, cached, self.patience(), |read| {
                self.decide_call(id, call, read)
            })
            .await?;
        self.count(call, &decision);
        Ok(decision)
    }

    /// One attempt of a call: the shared decision on what was read, and
    /// what it writes, if anything.
    fn decide_call(&self, id: &SessionId, call: &Call, read: Read) -> Step<Decision> {
        let stream_now = self.view.clock.now();
        let now = stream_now.unwrap_or_else(unix_millis).millis();
        let read_revision = read.live_revision();
        let (expected, mut session, last_response, presence) = self.session_of(read, now);
        // Before the decision touches the session: due by the stored time.
        // Unlike GetState's (`decide_touch`), a call's touch is due on a
        // tombstone too.
        let touch_due = session.touch_due(now, self.rules.touch_interval);
        let nanos = Clock::unix_nanos();
        let stamp = Stamp {
            first_seq: 0,
            unix_nanos: nanos,
            new_response: mint(last_response, nanos),
        };
        let decision = match decision::decide(&mut session, presence, id, call, now) {
            Ok(decided) => decided.settle(stamp, 0),
            // A refusal (not found, terminated, full) is an answer that
            // writes nothing too.
            Err(refusal) => return Step::confirm(read_revision, Err(refusal)),
        };
        if !decision.changed() && !touch_due {
            return Step::confirm(read_revision, Ok(decision));
        }
        let last_response = match (&decision.effect, decision.reply) {
            (Effect::Changed { .. }, Outcome::Started { response, .. }) => response.get(),
            _ => last_response,
        };
        let entry = entry::Entry::written(session.persisted(), last_response, &decision, nanos);
        Step::Write {
            expected,
            entry,
            // Decided before this replica knew the stream's clock, the
            // entry holds a time of its own clock, which a later touch
            // check must not trust: the next call reads the stamped one.
            cache: stream_now.is_some(),
            answer: decision,
        }
    }

    /// The session a call is decided on, from what was read: the revision
    /// a write must expect, the session, the last response id it minted,
    /// and whether it is stored (or, absent, whether there is room for it).
    fn session_of(&self, read: Read, now: Millis) -> (KvRevision, Session, u64, Presence) {
        match read {
            Read::Live { revision, entry } => {
                let mut session = Session::from_persisted(entry.persisted);
                session.remember_live_since(entry.unix_nanos);
                (revision, session, entry.last_response, Presence::Stored)
            }
            Read::Absent { revision } => {
                let max = self.rules.config.max_sessions;
                let room = if self.view.mirror.session_count() >= max {
                    Room::Full { max }
                } else {
                    Room::Available
                };
                let presence = Presence::Absent { room };
                (revision, Session::new(now), 0, presence)
            }
        }
    }

    /// GetState's read, with the touch it counts as.
    pub(super) async fn touch(&self, id: &SessionId) -> Result<SessionSnapshot, CoordError> {
        let _serialized = self.locks.lock(id).await;
        let patience = self.patience();
        self.quorum_point(patience.remaining()).await?;
        if let Some(known) = self.view.mirror.known(id) {
            let touch_due = known.phase != Phase::Terminated
                && session::touch_due(known.since, self.now().millis(), self.rules.touch_interval);
            if !touch_due {
                return Ok(known.snapshot(id));
            }
        }
        // A touch is due, or the mirror holds nothing (absent, or an entry
        // the follower could not read): the bucket decides. The touch is a
        // compare-and-set write, which validates its read.
        self.compare_and_set(id, None, patience, |read| self.decide_touch(id, read))
            .await
    }

    /// One attempt of GetState's touch on what was read.
    fn decide_touch(&self, id: &SessionId, read: Read) -> Step<SessionSnapshot> {
        let (revision, entry) = match read {
            Read::Live { revision, entry } => (revision, entry),
            Read::Absent { .. } => {
                return Step::confirm(None, Err(CoordError::SessionNotFound(id.clone())))
            }
        };
        let now = self.now().millis();
        let mut session = Session::from_persisted(entry.persisted);
        let snapshot = session.snapshot(id);
        if session.is_terminated() || !session.touch_due(now, self.rules.touch_interval) {
            // Someone touched it since the mirror's view; the read stands
            // only if confirmed, like any answer without a write.
            return Step::confirm(Some(revision), Ok(snapshot));
        }
        session.touch(now);
        let touched = entry::Entry {
            persisted: session.persisted(),
            events: Vec::new(),
            ..entry
        };
        Step::Write {
            expected: revision,
            entry: touched,
            cache: true,
            answer: snapshot,
        }
    }

    /// Reads (or takes `cached`, the entry this replica last wrote), has
    /// `decide` say what one attempt does with what was read, and carries
    /// that out (`Step`): a write with compare-and-set over the revision read
    /// (`write`, which knows a write whose answer was lost), or an answer
    /// that writes nothing once `confirmed`. A conflict or an unconfirmed
    /// answer goes round again from a fresh read, up to
    /// `timings::MAX_ATTEMPTS`.
    pub(super) async fn compare_and_set<T>(
        &self,
        id: &SessionId,
        mut cached: Option<(KvRevision, entry::Entry)>,
        mut patience: Patience,
        mut decide: impl FnMut(Read) -> Step<T>,
    ) -> Result<T, CoordError> {
        let key = entry::key(id);
        let (mut lost, mut unconfirmed) = (0_u32, 0_u32);
        for _ in 0..timings::MAX_ATTEMPTS {
            let read = match cached.take() {
                Some((revision, entry)) => Read::Live { revision, entry },
                None => self.read(id, &key, &mut patience).await?,
            };
            let rewritable = (unconfirmed > 0).then(|| read.rewritable()).flatten();
            match decide(read) {
                Step::Stands(answer) => return answer,
                Step::Confirm { read, answer } => match rewritable {
                    Some((revision, entry)) if read == Some(revision) => {
                        if self
                            .rewrite(id, &key, revision, entry, &mut patience)
                            .await?
                        {
                            return answer;
                        }
                        lost += 1;
                    }
                    _ => {
                        if self.confirmed(id, read, &patience).await? {
                            return answer;
                        }
                        unconfirmed += 1;
                    }
                },
                Step::Write {
                    expected,
                    entry,
                    cache,
                    answer,
                } => {
                    let value = entry.encode();
                    if let Some(revision) =
                        self.write(&key, &value, expected, &mut patience).await?
                    {
                        if cache {
                            self.cache.put(id, revision, entry);
                        } else {
                            self.cache.take(id);
                        }
                        return Ok(answer);
                    }
                    lost += 1;
                }
                Step::Purge { expected, answer } => {
                    if self.purge(&key, expected, &mut patience).await? {
                        self.cache.take(id);
                        tracing::debug!(session_id = %id, "forgot terminated session");
                        return Ok(answer);
                    }
                }
            }
        }
        tracing::debug!(session_id = %id, lost, unconfirmed, "contended: compare-and-sets lost, answers unconfirmed");
        Err(CoordError::Contended(id.clone()))
    }

    /// Confirms an answer that writes nothing by writing the entry it was
    /// decided on back unchanged (no events: as a touch), with
    /// compare-and-set over its revision: a write that lands proves that
    /// revision was the key's latest when it landed, within the call. Used
    /// once an answer went unconfirmed: on a session another replica writes
    /// every few milliseconds, a quorum point (a write, then the mirror
    /// catching up to it) nearly always comes after the next of those
    /// writes, and confirming that way went round until the call was
    /// answered "contended" (`respcoord-bench failover`, docs/cluster.md).
    /// `false` if another write came first. Two replicas rewriting one
    /// revision write the same bytes, so after a lost answer `landed` may
    /// take the other's rewrite for this one's: harmless, as the entry then
    /// stored is the one this answer was decided on, at a point within the
    /// call.
    async fn rewrite(
        &self,
        id: &SessionId,
        key: &str,
        revision: KvRevision,
        entry: entry::Entry,
        patience: &mut Patience,
    ) -> Result<bool, CoordError> {
        let entry = entry::Entry {
            events: Vec::new(),
            ..entry
        };
        match self.write(key, &entry.encode(), revision, patience).await? {
            Some(written) => {
                self.cache.put(id, written, entry);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub(super) fn count(&self, call: &Call, decision: &Decision) {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(call, decision);
    }
}
