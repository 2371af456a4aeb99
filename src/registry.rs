//! The session registry: a sharded map of session actors keyed by session id.
//!
//! A session's actor is its [`Session`] record under its shard's
//! `std::sync::Mutex`: every call on a session is one synchronous critical
//! section (look up, run the pure machine, sequence and publish the events,
//! snapshot the reply), so calls on one session are serialized and a reply is
//! only built after its events are in the log. No lock is held across an
//! `.await`, which is why a plain mutex beats a task-per-session here: a
//! million sessions cost a million records, not a million tasks.
//!
//! Sessions hash to shards, so calls on sessions in different shards never
//! wait for each other's session work; they share only the event log's short
//! sequencing lock, which is what gives watch-all its total order.
//!
//! Expiry: each shard keeps a min-heap of (due time, session) with at most one
//! live entry per session. A call only moves the time the session was last
//! used (`Session::touch`); the entry is looked at when it comes due and
//! refiled if the session was used meanwhile. So a call costs no index work,
//! and an idle coordinator wakes only when something is actually due, never
//! to scan every session.

use std::{
    cmp::Reverse,
    collections::{hash_map::Entry, BinaryHeap},
    hash::BuildHasher,
    sync::{Arc, PoisonError},
    time::Duration,
};

use tokio::sync::Notify;

use crate::sync::{
    atomic::{AtomicU64, AtomicUsize, Ordering},
    Mutex, MutexGuard,
};
use crate::{
    decision::{self, Decided, Decision, Presence, Room, Stamp},
    error::CoordError,
    events::{Append, EventLog, Feed, LogLimits, SessionFeeds},
    ids::{ResponseId, SessionId},
    machine::{Call, Phase, Source, TeardownReason},
    session::{Millis, Session, SessionSnapshot, Ttls},
    stats::CoordStats,
};
pub use crate::{
    decision::{Changed, Started},
    shared::{Clock, CoordConfig, PageCursor},
};

/// Session ids are short strings hashed on every call, twice (shard, then
/// the shard's table): foldhash is several times cheaper than SipHash for
/// them and still seeded per process, so ids cannot be chosen to collide.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct Shard {
    /// A hash map, not a tree: a call is one hash and about one cache miss
    /// even with a million sessions; listing pays instead (see `list`).
    sessions: HashMap<SessionId, Session>,
    expiry: BinaryHeap<Reverse<(Millis, SessionId)>>,
    /// Feeds of the sessions someone watches (most have no entry).
    watchers: SessionFeeds,
    /// This shard's counters for the metrics, kept under its lock.
    stats: CoordStats,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    /// The seq numbering's starting point; also names this instance.
    base_seq: u64,
    log: Arc<EventLog>,
    config: CoordConfig,
    ttls: Ttls,
    clock: Clock,
    session_count: AtomicUsize,
    /// When the expirer next plans to wake; a new entry due earlier wakes it.
    expiry_target: AtomicU64,
    expiry_wake: Notify,
}

/// The coordinator: cheap to clone, shared by every RPC handler.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl Registry {
    pub fn new(config: CoordConfig) -> Self {
        // Seqs (and so response ids) start above the boot time in
        // nanoseconds: see `events` for why that survives restarts.
        let base_seq = u64::try_from(Clock::unix_nanos()).unwrap_or(0).max(1);
        Self::with_base_seq(config, base_seq)
    }

    /// As [`Registry::new`], with the seq numbering's starting point given.
    pub fn with_base_seq(config: CoordConfig, base_seq: u64) -> Self {
        let shards = config.shards.max(1);
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Mutex::default()).collect(),
                hasher: Default::default(),
                base_seq,
                log: Arc::new(EventLog::new(
                    base_seq,
                    LogLimits {
                        retained_events: config.global_history,
                        watch_all_buffer: config.watch_all_buffer,
                    },
                )),
                config,
                ttls: Ttls {
                    idle: millis(config.idle_ttl),
                    tombstone: millis(config.tombstone_ttl),
                },
                clock: Clock::new(),
                session_count: AtomicUsize::new(0),
                expiry_target: AtomicU64::new(u64::MAX),
                expiry_wake: Notify::new(),
            }),
        }
    }

    pub fn config(&self) -> &CoordConfig {
        &self.inner.config
    }

    pub fn clock(&self) -> Clock {
        self.inner.clock
    }

    pub fn session_count(&self) -> usize {
        self.inner.session_count.load(Ordering::Relaxed)
    }

    pub fn published_seq(&self) -> u64 {
        self.inner.log.published_seq()
    }

    pub fn start(
        &self,
        id: &SessionId,
        source: crate::machine::Source,
        request_id: Option<crate::ids::RequestId>,
    ) -> Result<Started, CoordError> {
        self.inner
            .call(id, &Call::Start { source, request_id })?
            .started(id)
    }

    pub fn finish(
        &self,
        id: &SessionId,
        response: Option<ResponseId>,
        status: crate::machine::FinishStatus,
    ) -> Result<Changed<bool>, CoordError> {
        let call = Call::Finish { response, status };
        Ok(self.inner.call(id, &call)?.finished())
    }

    pub fn cancel(
        &self,
        id: &SessionId,
        only_if: Option<ResponseId>,
        source: crate::machine::Source,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        Ok(self
            .inner
            .call(id, &Call::Cancel { only_if, source })?
            .cancelled())
    }

    /// Shutdown creates a tombstone for an unknown id, so a later Start on it
    /// is refused.
    pub fn shutdown(&self, id: &SessionId) -> Result<Changed<Option<ResponseId>>, CoordError> {
        self.shutdown_from(id, Source::Unspecified)
    }

    /// [`Registry::shutdown`] asked for by `source` (recorded on the cancel
    /// of the live response).
    pub fn shutdown_from(
        &self,
        id: &SessionId,
        source: Source,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        let call = Call::Teardown {
            reason: TeardownReason::Shutdown,
            source,
        };
        Ok(self.inner.call(id, &call)?.cancelled())
    }

    /// GetState. Counts as a call for idle expiry.
    pub fn state(&self, id: &SessionId) -> Result<SessionSnapshot, CoordError> {
        let now = self.inner.clock.now();
        let mut shard = self.inner.shard(id);
        let session = shard
            .sessions
            .get_mut(id.as_str())
            .ok_or_else(|| CoordError::SessionNotFound(id.clone()))?;
        session.touch(now);
        Ok(session.snapshot(id))
    }

    /// The counters of every shard, summed (one short lock per shard).
    pub fn stats(&self) -> CoordStats {
        let mut total = CoordStats::default();
        for index in 0..self.inner.shards.len() {
            total.add(&self.inner.lock_shard(index).stats);
        }
        total
    }
}

impl Inner {
    fn shard_index(&self, id: &SessionId) -> usize {
        // The modulo of a 64-bit hash by a small count is uniform enough.
        (self.hasher.hash_one(id.as_str()) % self.shards.len() as u64) as usize
    }

    fn lock_shard(&self, index: usize) -> MutexGuard<'_, Shard> {
        // Critical sections only touch in-memory records and cannot leave one
        // half-updated in a way that is worse than refusing service, so a
        // poisoned lock (a panic elsewhere) is recovered, not propagated.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn shard(&self, id: &SessionId) -> MutexGuard<'_, Shard> {
        self.lock_shard(self.shard_index(id))
    }

    /// Files `session`'s expiry entry at `due`, waking the expirer if that is
    /// before it planned to look.
    fn file_expiry(
        &self,
        expiry: &mut BinaryHeap<Reverse<(Millis, SessionId)>>,
        session: &mut Session,
        id: &SessionId,
        due: Millis,
    ) {
        session.set_expiry_entry(due);
        expiry.push(Reverse((due, id.clone())));
        if due < self.expiry_target.load(Ordering::Acquire) {
            self.expiry_wake.notify_one();
        }
    }

    /// Applies a change `decide` handed back: its stamp is the log's next
    /// seq (which doubles as the id of a response it starts: unique,
    /// increasing, never reused), with the log's lock taken here and held,
    /// in the `Append` returned, until the events are published. An answer
    /// without a change takes no lock.
    fn settle(&self, decided: Decided<'_>) -> (Decision, Option<Append<'_>>) {
        match decided {
            Decided::Answered(decision) => (decision, None),
            Decided::Ready(ready) => {
                let append = self.log.begin_append();
                let stamp = Self::stamp(append.next_seq());
                (
                    ready.apply(stamp, self.config.session_history),
                    Some(append),
                )
            }
        }
    }

    fn stamp(first_seq: u64) -> Stamp {
        Stamp {
            first_seq,
            unix_nanos: Clock::unix_nanos(),
            // The log's seqs start above zero, so this never falls back.
            new_response: ResponseId::new(first_seq).unwrap_or(ResponseId::MIN),
        }
    }

    /// Publishes a decision's events (under the shard lock, with the log's
    /// lock `settle` took) and counts it.
    fn carry_out(
        watchers: Option<&Feed>,
        stats: &mut CoordStats,
        append: Option<Append<'_>>,
        id: &SessionId,
        call: &Call,
        decision: &Decision,
    ) {
        if let (Some(mut append), Some(change)) = (append, decision.change()) {
            let first_seq = append.next_seq();
            let events = change.events(id, first_seq);
            append.publish(watchers, &events);
        }
        stats.record(call, decision);
    }

    /// The one path every gateway call that may change a session takes: the
    /// shared decision (`decision::decide`) under the session's shard lock,
    /// then, for a change, the log's lock, the stamp and the change applied.
    fn call(&self, id: &SessionId, call: &Call) -> Result<Decision, CoordError> {
        let now = self.clock.now();
        let mut guard = self.shard(id);
        let Shard {
            sessions,
            expiry,
            watchers,
            stats,
        } = &mut *guard;
        // One probe for the common case (the session exists).
        let (session, (decision, append)) = match sessions.entry(id.clone()) {
            Entry::Occupied(entry) => {
                let session = entry.into_mut();
                let decided = decision::decide(session, Presence::Stored, id, call, now)?;
                let settled = self.settle(decided);
                (session, settled)
            }
            Entry::Vacant(entry) => {
                let room = self.reserve_session();
                let mut fresh = Session::new(now);
                let presence = Presence::Absent { room };
                match decision::decide(&mut fresh, presence, id, call, now) {
                    Ok(decided) => {
                        let settled = self.settle(decided);
                        (entry.insert(fresh), settled)
                    }
                    Err(refused) => {
                        if room == Room::Available {
                            self.session_count.fetch_sub(1, Ordering::AcqRel);
                        }
                        return Err(refused);
                    }
                }
            }
        };
        Self::carry_out(watchers.get(id), stats, append, id, call, &decision);
        let newly_terminated =
            decision.before != Some(Phase::Terminated) && decision.state.phase == Phase::Terminated;
        // A new tombstone's deadline may come before the live entry's (the
        // idle one), so it gets its own entry; the older one is then stale.
        if decision.created() || newly_terminated {
            let deadline = session.next_deadline(self.ttls).saturating_add(1);
            self.file_expiry(expiry, session, id, deadline);
        }
        Ok(decision)
    }

    /// Reserves room for one more session under the limit.
    fn reserve_session(&self) -> Room {
        let max = self.config.max_sessions;
        match self
            .session_count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
                (count < max).then_some(count + 1)
            }) {
            Ok(_) => Room::Available,
            Err(_) => Room::Full { max },
        }
    }
}

mod expiry;
mod listing;
mod watch;

pub use listing::Page;

#[cfg(test)]
mod tests;
