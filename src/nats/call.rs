//! A call on the bucket: the decisions its attempts make on what they
//! read (the shared `decision::decide`, GetState's touch; expiry's is in
//! `expiry`), and the loop that drives the attempts (`attempts`, where the
//! policy is) by making each store request they ask for (`requests`).

use std::sync::PoisonError;

use bytes::Bytes;

use super::{
    attempts::{self, CacheChange, CallAttempts, Command, GiveUp, Request, Successor, Written},
    entry::{self, KvRevision},
    failure::Patience,
    timings, unavailable, unix_millis, Inner,
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

/// A session's entry as the machine sees it.
pub(super) type Read = attempts::Read<entry::Entry>;

/// What one attempt of a call decided, its answer a result.
pub(super) type Step<T> = attempts::Step<entry::Entry, Result<T, CoordError>>;

impl attempts::Stored for entry::Entry {
    fn rewritable(&self) -> bool {
        self.persisted.phase != Phase::Terminated
    }

    fn without_events(self) -> Self {
        entry::Entry {
            events: Vec::new(),
            ..self
        }
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
        let (mut session, last_response, presence) = self.session_of(read, now);
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
            Err(refusal) => return Step::Confirm(Err(refusal)),
        };
        if !decision.changed() && !touch_due {
            return Step::Confirm(Ok(decision));
        }
        let last_response = match (&decision.effect, decision.reply) {
            (Effect::Changed { .. }, Outcome::Started { response, .. }) => response.get(),
            _ => last_response,
        };
        let entry = entry::Entry::written(session.persisted(), last_response, &decision, nanos);
        Step::Write {
            entry,
            // Decided before this replica knew the stream's clock, the
            // entry holds a time of its own clock, which a later touch
            // check must not trust: the next call reads the stamped one.
            cache: stream_now.is_some(),
            answer: Ok(decision),
        }
    }

    /// The session a call is decided on, from what was read: the session,
    /// the last response id it minted, and whether it is stored (or,
    /// absent, whether there is room for it).
    fn session_of(&self, read: Read, now: Millis) -> (Session, u64, Presence) {
        match read {
            Read::Live { entry, .. } => {
                let mut session = Session::from_persisted(entry.persisted);
                session.remember_live_since(entry.unix_nanos);
                (session, entry.last_response, Presence::Stored)
            }
            Read::Absent { .. } => {
                let max = self.rules.config.max_sessions;
                let room = if self.view.mirror.session_count() >= max {
                    Room::Full { max }
                } else {
                    Room::Available
                };
                let presence = Presence::Absent { room };
                (Session::new(now), 0, presence)
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
        let entry = match read {
            Read::Live { entry, .. } => entry,
            Read::Absent { .. } => {
                return Step::Confirm(Err(CoordError::SessionNotFound(id.clone())))
            }
        };
        let now = self.now().millis();
        let mut session = Session::from_persisted(entry.persisted);
        let snapshot = session.snapshot(id);
        if session.is_terminated() || !session.touch_due(now, self.rules.touch_interval) {
            // Someone touched it since the mirror's view; the read stands
            // only if confirmed, like any answer without a write.
            return Step::Confirm(Ok(snapshot));
        }
        session.touch(now);
        let touched = entry::Entry {
            persisted: session.persisted(),
            events: Vec::new(),
            ..entry
        };
        Step::Write {
            entry: touched,
            cache: true,
            answer: Ok(snapshot),
        }
    }

    /// Drives a call's attempts (`attempts::CallAttempts`, the policy)
    /// from `cached`, the entry this replica last wrote, if any: carries out
    /// each store request it makes, has `decide` say what an attempt does
    /// with what it read, and applies the answer's cache change.
    pub(super) async fn compare_and_set<T>(
        &self,
        id: &SessionId,
        cached: Option<(KvRevision, entry::Entry)>,
        mut patience: Patience,
        mut decide: impl FnMut(Read) -> Step<T>,
    ) -> Result<T, CoordError> {
        let key = entry::key(id);
        let mut attempts = CallAttempts::new(cached, timings::MAX_ATTEMPTS);
        // The bytes of the write in flight, which its successor is
        // compared with when its answer was lost.
        let mut sent = Bytes::new();
        let mut command = attempts.start();
        loop {
            command = match command {
                Command::Decide(read) => attempts.decided(decide(read)),
                Command::Request(request) => {
                    let report = self
                        .request(id, &key, request, &attempts, &mut sent, &mut patience)
                        .await?;
                    report.to(&mut attempts)
                }
                Command::Answer(answer, cache) => {
                    match cache {
                        CacheChange::Keep => {}
                        CacheChange::Put(revision, entry) => self.cache.put(id, revision, entry),
                        CacheChange::Forget => drop(self.cache.take(id)),
                    }
                    return answer;
                }
                Command::GiveUp(why) => return Err(gave_up(id, &key, why)),
            };
        }
    }

    /// Makes one store request of a call's attempts.
    async fn request<T>(
        &self,
        id: &SessionId,
        key: &str,
        request: Request,
        attempts: &CallAttempts<entry::Entry, T>,
        sent: &mut Bytes,
        patience: &mut Patience,
    ) -> Result<Report, CoordError> {
        Ok(match request {
            Request::Read => Report::Read(self.read(id, key, patience).await?),
            Request::Write { expected } => {
                *sent = attempts
                    .entry_to_write()
                    .map(entry::Entry::encode)
                    .ok_or_else(|| unavailable("a write was asked for with no entry to write"))?;
                Report::Written(self.write(key, sent, expected, patience).await?)
            }
            Request::Confirm { read } => {
                Report::Confirmed(self.confirmed(id, read, patience).await?)
            }
            Request::Purge { expected } => {
                let purged = self.purge(key, expected, patience).await?;
                if purged {
                    tracing::debug!(session_id = %id, "forgot terminated session");
                }
                Report::Purged(purged)
            }
            Request::Successor { expected } => {
                Report::Successor(self.successor(key, expected, sent, patience).await?)
            }
            Request::Held { revision } => {
                Report::Held(self.still_held(key, revision, patience).await?)
            }
        })
    }

    pub(super) fn count(&self, call: &Call, decision: &Decision) {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(call, decision);
    }
}

/// What a store request of a call returned, for its attempts.
enum Report {
    Read(Read),
    Written(Written),
    Confirmed(bool),
    Purged(bool),
    Successor(Successor),
    Held(bool),
}

impl Report {
    fn to<A>(self, attempts: &mut CallAttempts<entry::Entry, A>) -> Command<entry::Entry, A> {
        match self {
            Report::Read(read) => attempts.read(read),
            Report::Written(written) => attempts.written(written),
            Report::Confirmed(confirmed) => attempts.confirmed(confirmed),
            Report::Purged(purged) => attempts.purged(purged),
            Report::Successor(successor) => attempts.successor(successor),
            Report::Held(held) => attempts.held(held),
        }
    }
}

/// The error a call that gave up is answered.
fn gave_up(id: &SessionId, key: &str, why: GiveUp) -> CoordError {
    match why {
        GiveUp::Contended { lost, unconfirmed } => {
            tracing::debug!(session_id = %id, lost, unconfirmed, "contended: compare-and-sets lost, answers unconfirmed");
            CoordError::Contended(id.clone())
        }
        GiveUp::LandingUnknown => CoordError::Unavailable(format!(
            "the answer to a write of {key} was lost and the stream no longer holds what it \
             was written over, so whether it landed cannot be told; retry"
        )),
    }
}
