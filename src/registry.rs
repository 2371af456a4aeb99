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
//! live entry per session. A call only moves the session's `last_call`; the
//! entry is looked at when it comes due and refiled if the session was used
//! meanwhile. So a call costs no index work, and an idle coordinator wakes
//! only when something is actually due, never to scan every session.

use std::{
    cmp::Reverse,
    collections::{hash_map::Entry, BinaryHeap, VecDeque},
    hash::BuildHasher,
    sync::{Arc, PoisonError},
    time::Duration,
};

use tokio::sync::{broadcast, Notify};

use crate::sync::{
    atomic::{AtomicU64, AtomicUsize, Ordering},
    Mutex, MutexGuard,
};
use crate::{
    decision::{self, Decision, ExpiryDecision, Presence, Room, Stamp},
    error::CoordError,
    events::{Append, EventLog, LogLimits, OnDrop, Scope, SharedEvent, Subscription},
    ids::{ResponseId, SessionId, SessionScope},
    machine::{Phase, TeardownReason},
    session::{Call, Millis, Session, SessionSnapshot, Ttls},
    stats::CoordStats,
};
pub use crate::{
    decision::{Changed, Started},
    shared::{Clock, PageCursor, RegistryConfig},
};

/// One page of ListSessions.
#[derive(Clone, Debug)]
pub struct Page {
    pub sessions: Vec<SessionSnapshot>,
    pub next: Option<PageCursor>,
    /// Every event with seq at or below this is reflected in `sessions`.
    pub seq: u64,
}

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
    watchers: HashMap<SessionId, broadcast::Sender<SharedEvent>>,
    /// This shard's counters for the metrics, kept under its lock.
    stats: CoordStats,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    /// The seq numbering's starting point; also names this instance.
    base_seq: u64,
    log: Arc<EventLog>,
    config: RegistryConfig,
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

/// Expired and forgotten sessions handled per shard lock, so a mass expiry
/// never holds one shard for long.
const EXPIRY_BATCH: usize = 1024;

impl Registry {
    pub fn new(config: RegistryConfig) -> Self {
        // Seqs (and so response ids) start above the boot time in
        // nanoseconds: see `events` for why that survives restarts.
        let base_seq = u64::try_from(Clock::unix_nanos()).unwrap_or(0).max(1);
        Self::with_base_seq(config, base_seq)
    }

    /// As [`Registry::new`], with the seq numbering's starting point given.
    pub fn with_base_seq(config: RegistryConfig, base_seq: u64) -> Self {
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

    pub fn config(&self) -> &RegistryConfig {
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
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        Ok(self.inner.call(id, &Call::Cancel { only_if })?.cancelled())
    }

    /// Shutdown creates a tombstone for an unknown id, so a later Start on it
    /// is refused.
    pub fn shutdown(&self, id: &SessionId) -> Result<Changed<Option<ResponseId>>, CoordError> {
        let call = Call::Teardown {
            reason: TeardownReason::Shutdown,
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

    /// One page of sessions, `page_size` at most (callers clamp it).
    ///
    /// Each page costs one pass over the shards it reads (hash maps have no
    /// order to seek in), keeping only the `page_size` smallest keys past the
    /// cursor; listings are rare operator calls, lookups are the hot path.
    pub fn list(&self, page_size: usize, cursor: Option<PageCursor>) -> Result<Page, CoordError> {
        self.list_scoped(&SessionScope::All, page_size, cursor)
    }

    /// As [`Registry::list`], over the sessions in `scope` only (a tenant's
    /// listing); other sessions are skipped, never counted toward a page.
    pub fn list_scoped(
        &self,
        scope: &SessionScope,
        page_size: usize,
        cursor: Option<PageCursor>,
    ) -> Result<Page, CoordError> {
        let shard_count = self.inner.shards.len();
        let instance = self.inner.base_seq;
        let (mut shard, mut after) = match cursor {
            None => (0, None),
            Some(cursor) if cursor.instance != instance || cursor.shard_count != shard_count => {
                return Err(CoordError::invalid(
                    "page_token",
                    "was issued by another coordinator instance; list again from the start",
                ))
            }
            Some(cursor) => (cursor.shard, cursor.after),
        };
        // Read before any shard is locked: every event up to here was
        // applied inside a shard critical section that has finished by the
        // time we get that shard's lock.
        let seq = self.inner.log.published_seq();
        let page_size = page_size.max(1);
        let mut sessions = Vec::with_capacity(page_size.min(1024));
        let next = loop {
            if shard >= shard_count {
                break None;
            }
            let wanted = page_size - sessions.len();
            let guard = self.inner.lock_shard(shard);
            // The `wanted + 1` smallest keys past the cursor: one more than
            // needed tells whether this shard has more.
            let mut smallest: BinaryHeap<(u64, &str)> = BinaryHeap::with_capacity(wanted + 1);
            for id in guard.sessions.keys() {
                if !scope.contains(id) {
                    continue;
                }
                let key = (self.inner.hasher.hash_one(id.as_str()), id.as_str());
                if after
                    .as_ref()
                    .is_some_and(|(hash, last)| key <= (*hash, last.as_str()))
                {
                    continue;
                }
                if smallest.len() <= wanted {
                    smallest.push(key);
                } else if smallest.peek().is_some_and(|largest| key < *largest) {
                    smallest.pop();
                    smallest.push(key);
                }
            }
            let more_here = smallest.len() > wanted;
            let mut keys = smallest.into_sorted_vec();
            keys.truncate(wanted);
            let mut last = None;
            for (hash, id) in keys {
                if let Some((id, session)) = guard.sessions.get_key_value(id) {
                    sessions.push(session.snapshot(id));
                    last = Some((hash, id.clone()));
                }
            }
            drop(guard);
            if more_here {
                break last.map(|after| PageCursor {
                    instance,
                    shard_count,
                    shard,
                    after: Some(after),
                });
            }
            shard += 1;
            after = None;
            if sessions.len() == page_size {
                break (shard < shard_count).then_some(PageCursor {
                    instance,
                    shard_count,
                    shard,
                    after: None,
                });
            }
        };
        Ok(Page {
            sessions,
            next,
            seq,
        })
    }

    /// Watch one session. It need not exist yet. With `after_revision`, the
    /// retained events above it come first (OUT_OF_RANGE if some are gone).
    pub fn watch_session(
        &self,
        id: &SessionId,
        after_revision: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        let now = self.inner.clock.now();
        let index = self.inner.shard_index(id);
        let mut shard = self.inner.lock_shard(index);
        let (backlog, current, terminated) = match shard.sessions.get_mut(id.as_str()) {
            Some(session) => {
                // Opening a watch is a call naming the session; keeping it
                // open is not (the contract: an open Watch does not count).
                session.touch(now);
                let backlog = match after_revision {
                    Some(after) => session.history_after(id, after).map_err(|oldest| {
                        CoordError::HistoryUnavailable {
                            field: "after_revision",
                            requested: after,
                            oldest_available: oldest,
                        }
                    })?,
                    None => VecDeque::new(),
                };
                (
                    backlog,
                    session.revision(),
                    session.phase() == Phase::Terminated,
                )
            }
            None => (VecDeque::new(), 0, false),
        };
        let capacity = self.inner.config.session_watch_buffer.max(1);
        let live = shard
            .watchers
            .entry(id.clone())
            .or_insert_with(|| broadcast::channel(capacity).0)
            .subscribe();
        drop(shard);
        let inner = Arc::clone(&self.inner);
        let released = id.clone();
        let release = OnDrop::new(move || inner.release_watcher(index, &released));
        let subscription = Subscription::new(
            Scope::session(after_revision, current),
            backlog,
            live,
            Arc::clone(&self.inner.log),
            Some(release),
        );
        Ok(if terminated {
            subscription.finish_after_backlog()
        } else {
            subscription
        })
    }

    /// Watch every session in seq order, from `after_seq` or from now.
    pub fn watch_all(&self, after_seq: Option<u64>) -> Result<Subscription, CoordError> {
        self.inner.log.subscribe_all(after_seq)
    }

    /// As [`Registry::watch_all`], seeing only the sessions in `scope`.
    pub fn watch_all_scoped(
        &self,
        scope: &SessionScope,
        after_seq: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        self.inner.log.subscribe_all_within(scope, after_seq)
    }

    /// The counters of every shard, summed (one short lock per shard).
    pub fn stats(&self) -> CoordStats {
        let mut total = CoordStats::default();
        for index in 0..self.inner.shards.len() {
            total.add(&self.inner.lock_shard(index).stats);
        }
        total
    }

    /// Expires and forgets what is due now; returns when something is next due.
    pub fn expire_due(&self) -> Option<Millis> {
        let now = self.inner.clock.now();
        let mut next_due: Option<Millis> = None;
        for index in 0..self.inner.shards.len() {
            loop {
                let mut shard = self.inner.lock_shard(index);
                match self.inner.expire_batch(&mut shard, now) {
                    BatchEnd::Drained(due) => {
                        next_due = match (next_due, due) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        break;
                    }
                    BatchEnd::MoreDue => continue,
                }
            }
        }
        next_due
    }

    /// Runs the expirer until `stop` resolves: sleeps until the next entry is
    /// due (or an earlier one is filed), never polling every session.
    pub async fn run_expiry(&self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            // While scanning, any new filing must wake us again: it may be due
            // before whatever this scan finds next.
            self.inner.expiry_target.store(u64::MAX, Ordering::Release);
            let next = self.expire_due();
            self.inner
                .expiry_target
                .store(next.unwrap_or(u64::MAX), Ordering::Release);
            let sleep = match next {
                Some(at) => tokio::time::sleep_until(self.inner.clock.instant_at(at)),
                None => tokio::time::sleep(Duration::from_secs(3600)),
            };
            tokio::select! {
                () = &mut stop => return,
                () = sleep => {}
                () = self.inner.expiry_wake.notified() => {}
            }
        }
    }
}

enum BatchEnd {
    /// Nothing more due in this shard; its next due time, if any.
    Drained(Option<Millis>),
    /// The batch limit was hit with more due: release the lock and go again.
    MoreDue,
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

    /// The stamp of a transition about to run: the log's next seq (which
    /// doubles as the id of a response it starts: unique, increasing, never
    /// reused), with the log's lock taken into `append` and held until the
    /// events are published.
    fn stamp<'a>(&'a self, append: &mut Option<Append<'a>>) -> Stamp {
        let first_seq = append.insert(self.log.begin_append()).next_seq();
        Stamp {
            first_seq,
            unix_nanos: Clock::unix_nanos(),
            // The log's seqs start above zero, so this never falls back.
            new_response: ResponseId::new(first_seq).unwrap_or(ResponseId::MIN),
        }
    }

    /// Publishes a decision's events (under the shard lock, with the log's
    /// lock the stamp took) and counts it.
    fn carry_out(
        watchers: Option<&broadcast::Sender<SharedEvent>>,
        stats: &mut CoordStats,
        append: Option<Append<'_>>,
        id: &SessionId,
        call: &Call,
        decision: &Decision,
    ) {
        if let Some(mut append) = append {
            let first_seq = append.next_seq();
            let events = decision.change.events(id, |index| first_seq + index as u64);
            append.publish(watchers, &events);
        }
        stats.record(call, decision);
    }

    /// The one path every gateway call that may change a session takes: the
    /// shared decision (`decision::decide`) under the session's shard lock.
    fn call(&self, id: &SessionId, call: &Call) -> Result<Decision, CoordError> {
        let now = self.clock.now();
        let history = self.config.session_history;
        let mut guard = self.shard(id);
        let Shard {
            sessions,
            expiry,
            watchers,
            stats,
        } = &mut *guard;
        let mut append = None;
        let stamp = || self.stamp(&mut append);
        // One probe for the common case (the session exists).
        let (session, decision) = match sessions.entry(id.clone()) {
            Entry::Occupied(entry) => {
                let session = entry.into_mut();
                let decision =
                    decision::decide(session, Presence::Stored, id, call, now, stamp, history)?;
                (session, decision)
            }
            Entry::Vacant(entry) => {
                let room = self.reserve_session();
                let mut fresh = Session::new(now);
                let presence = Presence::Absent { room };
                match decision::decide(&mut fresh, presence, id, call, now, stamp, history) {
                    Ok(decision) if decision.created => (entry.insert(fresh), decision),
                    refused => {
                        if room == Room::Available {
                            self.session_count.fetch_sub(1, Ordering::AcqRel);
                        }
                        return refused;
                    }
                }
            }
        };
        Self::carry_out(
            watchers.get(id.as_str()),
            stats,
            append,
            id,
            call,
            &decision,
        );
        let newly_terminated =
            decision.before != Phase::Terminated && decision.state.phase == Phase::Terminated;
        let deadline = session.next_deadline(self.ttls).saturating_add(1);
        if decision.created || (newly_terminated && deadline < session.expiry_entry()) {
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

    fn expire_batch(&self, shard: &mut Shard, now: Millis) -> BatchEnd {
        let Shard {
            sessions,
            expiry,
            watchers,
            stats,
        } = shard;
        let history = self.config.session_history;
        for _ in 0..EXPIRY_BATCH {
            let Some(Reverse((due, _))) = expiry.peek() else {
                return BatchEnd::Drained(None);
            };
            if *due > now {
                return BatchEnd::Drained(Some(*due));
            }
            let Some(Reverse((due, id))) = expiry.pop() else {
                return BatchEnd::Drained(None);
            };
            let Some(session) = sessions.get_mut(id.as_str()) else {
                continue;
            };
            if session.expiry_entry() != due {
                continue; // superseded by a newer entry for the same session
            }
            let mut append = None;
            let stamp = || self.stamp(&mut append);
            match decision::decide_expiry(session, &id, now, self.ttls, stamp, history) {
                ExpiryDecision::NotDue { at } => self.file_expiry(expiry, session, &id, at),
                ExpiryDecision::Expired {
                    decision,
                    next_check,
                } => {
                    let watchers = watchers.get(id.as_str());
                    Self::carry_out(watchers, stats, append, &id, &decision::EXPIRY, &decision);
                    self.file_expiry(expiry, session, &id, next_check);
                }
                ExpiryDecision::Forget => {
                    sessions.remove(id.as_str());
                    tracing::debug!(session_id = %id, "forgot terminated session");
                    stats.forgotten();
                    self.session_count.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        BatchEnd::MoreDue
    }

    /// Drops a session's watcher channel once its last watcher is gone.
    fn release_watcher(&self, index: usize, id: &SessionId) {
        let mut shard = self.lock_shard(index);
        if shard
            .watchers
            .get(id.as_str())
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            shard.watchers.remove(id.as_str());
        }
    }
}

#[cfg(test)]
mod tests;
