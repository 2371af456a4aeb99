//! The event log and fan-out: sequencing, retention and delivery to watchers.
//!
//! On the memory backend every transition's events pass through an
//! [`Append`] ([`EventLog::begin_append`]), which gives them their
//! coordinator-wide `seq` under one short lock (the NATS backend's come with
//! their seqs, `EventLog::publish`), keeps a bounded
//! window of them for `after_seq` resume, and hands them to watchers through
//! bounded `Feed`s (`events/feed.rs`): every session's to watch-all
//! through one, each watched session's to its watchers through its own.
//! Sending never waits, so a slow watcher can only fall behind, never slow a
//! call: when it falls further behind than its bound, its receiver reports
//! the lag and the watch is ended with a status that says so (never a silent
//! gap).
//!
//! `seq` starts just above the Unix time in nanoseconds at boot. Any seq a
//! previous process handed out is therefore below this process's first one, so
//! a client resuming across a restart gets OUT_OF_RANGE (re-list) instead of
//! silently skipping, and response ids (which are seqs, see the registry) are
//! never reused across restarts.

use std::{
    collections::VecDeque,
    num::NonZeroU64,
    sync::{Arc, PoisonError},
    task::{Context, Poll},
};

use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex, MutexGuard,
};
use crate::{error::CoordError, ids::SessionScope};

pub use crate::event::{LifecycleEvent, SharedEvent};
pub(crate) use feed::{Feed, FeedReceiver};
pub(crate) use session_feeds::{HoldsFeeds, LiveFeed, SessionFeeds};

mod feed;
mod session_feeds;

/// Sizes of the log's buffers.
#[derive(Clone, Copy, Debug)]
pub struct LogLimits {
    /// Events kept for watch-all resume (`after_seq`).
    pub retained_events: usize,
    /// Events a watch-all watcher may trail the log by before it is ended.
    pub watch_all_buffer: usize,
}

pub struct EventLog {
    inner: Mutex<LogInner>,
    /// Highest seq whose events have been handed to every channel. Read
    /// without the lock by bookmarks and listings; written inside it.
    published_seq: AtomicU64,
    /// The seq "before the first event" of this process.
    base_seq: u64,
    /// Bumped by [`EventLog::break_watches`]; a subscription whose feed
    /// closes under a newer generation was cut off, not finished.
    generation: AtomicU64,
}

struct LogInner {
    next_seq: u64,
    /// The events themselves, not shared pointers: evicting a pointer
    /// touched the event's allocation (its count, then the free) one full
    /// window after it was made, a cache miss or more per event; in place,
    /// the window is one sequential ring (docs/performance.md).
    retained: VecDeque<LifecycleEvent>,
    retained_capacity: usize,
    /// Every seq up to here has been dropped from `retained`.
    evicted_through: u64,
    watch_all: Arc<Feed>,
    watch_all_capacity: usize,
}

impl EventLog {
    pub fn new(base_seq: u64, limits: LogLimits) -> Self {
        let watch_all = Feed::new(limits.watch_all_buffer);
        Self {
            inner: Mutex::new(LogInner {
                next_seq: base_seq + 1,
                retained: VecDeque::with_capacity(limits.retained_events.min(4096)),
                retained_capacity: limits.retained_events,
                evicted_through: base_seq,
                watch_all,
                watch_all_capacity: limits.watch_all_buffer.max(1),
            }),
            published_seq: AtomicU64::new(base_seq),
            base_seq,
            generation: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        // A panic while appending cannot leave the log half-written in a way
        // that matters more than stopping the service would, so keep serving.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn published_seq(&self) -> u64 {
        self.published_seq.load(Ordering::Acquire)
    }

    /// Opens an append: the log's lock, held until the append is dropped,
    /// so the seq it reports is the one the next published event carries.
    ///
    /// Taken with the session's shard locked, so per-session order is the
    /// shard's; this lock makes the global order. Both are held only for
    /// in-memory work: no await, no I/O.
    pub fn begin_append(&self) -> Append<'_> {
        Append {
            log: self,
            inner: self.lock(),
        }
    }

    /// Publishes events that already carry their seqs: a backend whose order
    /// is made elsewhere (NATS: the stream's). Events at or below the last
    /// published seq are a redelivery and are dropped.
    pub(crate) fn publish(&self, session_watchers: Option<&Feed>, events: &[SharedEvent]) {
        let mut inner = self.lock();
        for event in events {
            if event.seq < inner.next_seq {
                continue;
            }
            inner.retain(event);
            let one = std::slice::from_ref(event);
            inner.watch_all.send(one);
            if let Some(watchers) = session_watchers {
                watchers.send(one);
            }
            inner.next_seq = event.seq + 1;
            self.published_seq.store(event.seq, Ordering::Release);
        }
    }

    /// Everything up to `seq` has been published (a stored write that carried
    /// no event): bookmarks may promise it.
    pub fn advance(&self, seq: u64) {
        let mut inner = self.lock();
        if seq >= inner.next_seq {
            inner.next_seq = seq + 1;
            self.published_seq.store(seq, Ordering::Release);
        }
    }

    /// Ends every open watch-all as fallen behind (RESOURCE_EXHAUSTED, resume
    /// from its last seq), and forgets the retained window: for a backend that
    /// learns it lost events it can no longer deliver in order.
    pub fn break_watches(&self) {
        let mut inner = self.lock();
        self.generation.fetch_add(1, Ordering::AcqRel);
        inner.watch_all.close();
        inner.watch_all = Feed::new(inner.watch_all_capacity);
        inner.retained.clear();
        inner.evicted_through = inner.next_seq.saturating_sub(1);
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// As [`EventLog::subscribe_all`], seeing only the sessions in `scope`.
    pub fn subscribe_all_within(
        self: &Arc<Self>,
        scope: &SessionScope,
        after_seq: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        Ok(self.subscribe_all(after_seq)?.within(scope.clone()))
    }

    /// Watch every session from `after_seq` (replaying what is retained) or,
    /// with `None`, from now on.
    pub fn subscribe_all(
        self: &Arc<Self>,
        after_seq: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        let inner = self.lock();
        let live = inner.watch_all.subscribe();
        let mut retained = Vec::new();
        let mut skip_through = 0;
        if let Some(after) = after_seq {
            // 0 means "from this coordinator's first event".
            let after = if after == 0 { self.base_seq } else { after };
            if after < inner.evicted_through {
                return Err(CoordError::HistoryUnavailable {
                    field: "after_seq",
                    requested: after,
                    oldest_available: inner.evicted_through,
                });
            }
            let start = inner.retained.partition_point(|e| e.seq <= after);
            retained.extend(inner.retained.range(start..).cloned());
            skip_through = after;
        }
        drop(inner);
        // Shared outside the lock: a resume from far back is one allocation
        // per event, which transitions need not wait for.
        let backlog = retained.into_iter().map(Arc::new).collect();
        Ok(Subscription::new(
            Scope::All {
                skip_through_seq: skip_through,
            },
            // Taken under the lock that orders publication, so no event can be
            // both here and live; the handover rule is still the shared one.
            backlog,
            live,
            Arc::clone(self),
            None,
        ))
    }
}

/// An open append (see [`EventLog::begin_append`]).
pub struct Append<'a> {
    log: &'a EventLog,
    inner: MutexGuard<'a, LogInner>,
}

impl Append<'_> {
    /// The seq the next published event must carry.
    pub fn next_seq(&self) -> u64 {
        self.inner.next_seq
    }

    /// Publishes one transition's events, which carry consecutive seqs from
    /// [`Append::next_seq`]: retained for resume, sent to watch-all and to
    /// the session's watchers.
    pub(crate) fn publish(&mut self, session_watchers: Option<&Feed>, events: &[SharedEvent]) {
        let Some(last) = events.last() else {
            return;
        };
        debug_assert_eq!(
            last.seq,
            self.inner.next_seq + events.len() as u64 - 1,
            "events carry consecutive seqs from next_seq"
        );
        for event in events {
            self.inner.retain(event);
        }
        self.inner.watch_all.send(events);
        if let Some(watchers) = session_watchers {
            watchers.send(events);
        }
        self.inner.next_seq = last.seq + 1;
        self.log.published_seq.store(last.seq, Ordering::Release);
    }
}

impl LogInner {
    fn retain(&mut self, event: &LifecycleEvent) {
        if self.retained_capacity == 0 {
            self.evicted_through = event.seq;
            return;
        }
        if self.retained.len() == self.retained_capacity {
            if let Some(old) = self.retained.pop_front() {
                self.evicted_through = old.seq;
            }
        }
        self.retained.push_back(event.clone());
    }
}

/// What a watch covers, and which live events it has already been given (or
/// asked to skip) through its backlog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    Session { skip_through_revision: u64 },
    All { skip_through_seq: u64 },
}

impl Scope {
    /// A session watch asked for events after `after_revision` (or, with
    /// `None`, live ones only) of a session read at revision `current`.
    /// Both backends open session watches through this, so they skip alike.
    pub(crate) fn session(after_revision: Option<u64>, current: u64) -> Self {
        Scope::Session {
            skip_through_revision: after_revision.unwrap_or(current),
        }
    }

    /// The scope once `backlog` is the watch's replay: live events the
    /// backlog already holds are skipped, whatever it was asked to skip.
    ///
    /// This is the one handover rule of every watch (`Subscription::new`
    /// applies it), and it is decided from what the backlog actually holds,
    /// not from a revision read at another moment: a backend that reads its
    /// backlog after subscribing to the live stream (NATS: the key's history,
    /// fetched after the entry was read) can find there events that also
    /// arrive live, and delivering both would repeat revisions. A backlog
    /// taken under the lock that orders publication (memory) holds nothing
    /// that arrives live, so for it this changes nothing.
    pub(crate) fn after_backlog(self, backlog: &VecDeque<SharedEvent>) -> Self {
        match self {
            Scope::Session {
                skip_through_revision,
            } => Scope::Session {
                skip_through_revision: backlog
                    .iter()
                    .map(|e| e.revision)
                    .fold(skip_through_revision, u64::max),
            },
            Scope::All { skip_through_seq } => Scope::All {
                skip_through_seq: backlog
                    .iter()
                    .map(|e| e.seq)
                    .fold(skip_through_seq, u64::max),
            },
        }
    }
}

pub use crate::error::Lagged;

/// The next thing a watch should send.
#[derive(Debug)]
pub enum Delivery {
    /// Events in order. The watch ends after sending them if `last` is true.
    Events {
        events: Vec<SharedEvent>,
        last: bool,
    },
    /// Nothing more will come: end the stream cleanly.
    End,
}

/// Runs a closure when dropped: how a session watch releases its channel.
pub(crate) struct OnDrop(Option<Box<dyn FnOnce() + Send + Sync>>);

impl OnDrop {
    pub(crate) fn new(f: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self(Some(Box::new(f)))
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// One watcher's view of the stream: the retained backlog it asked for, then
/// live events, with no gap and no duplicate between the two: the live
/// receiver was subscribed before the backlog was read (no gap), and live
/// events the backlog holds are skipped (no duplicate, `Scope::after_backlog`).
pub struct Subscription {
    backlog: VecDeque<SharedEvent>,
    // Field order matters: the receiver must be dropped before `_release`
    // runs, so the release sees this watcher gone.
    live: FeedReceiver,
    scope: Scope,
    /// Sessions this watcher may see (a scoped caller's watch-all).
    filter: SessionScope,
    log: Arc<EventLog>,
    finished: bool,
    // The last event given: resume after it. Never 0 (seqs and revisions
    // start at 1), so each costs 8 bytes, not 16, in every open watch.
    last_seq: Option<NonZeroU64>,
    last_revision: Option<NonZeroU64>,
    /// The log's generation when this watch opened (see `break_watches`).
    generation: u64,
    _release: Option<OnDrop>,
}

impl Subscription {
    pub(crate) fn new(
        scope: Scope,
        backlog: VecDeque<SharedEvent>,
        live: FeedReceiver,
        log: Arc<EventLog>,
        release: Option<OnDrop>,
    ) -> Self {
        let generation = log.generation();
        Self {
            scope: scope.after_backlog(&backlog),
            backlog,
            live,
            filter: SessionScope::All,
            log,
            finished: false,
            last_seq: None,
            last_revision: None,
            generation,
            _release: release,
        }
    }

    /// A session watch whose session already ended: it replays `backlog`
    /// (possibly empty) and then ends.
    fn finish_after_backlog(mut self) -> Self {
        // A terminated session's backlog, if any, ends with its `terminated`
        // event, which ends the watch; with no backlog there is nothing to wait for.
        if self.backlog.is_empty() {
            self.finished = true;
        }
        self
    }

    /// Limits the watch to sessions in `filter`: other sessions' events are
    /// skipped, from the backlog and live. A bookmark's promise then covers
    /// the events this watch matches, as the contract words it.
    pub(crate) fn within(mut self, filter: SessionScope) -> Self {
        if filter != SessionScope::All {
            self.backlog.retain(|e| filter.contains(&e.session_id));
        }
        self.filter = filter;
        self
    }

    fn wanted(&self, event: &LifecycleEvent) -> bool {
        if !self.filter.contains(&event.session_id) {
            return false;
        }
        match self.scope {
            Scope::Session {
                skip_through_revision,
            } => event.revision > skip_through_revision,
            Scope::All { skip_through_seq } => event.seq > skip_through_seq,
        }
    }

    fn lagged(&self, missed: u64) -> Lagged {
        Lagged {
            missed,
            last_revision: self.last_revision.map(NonZeroU64::get),
            last_seq: self.last_seq.map(NonZeroU64::get),
        }
    }

    /// Adds `event` to `batch`; true if the watch must end after it.
    fn take(&mut self, event: SharedEvent, batch: &mut Vec<SharedEvent>) -> bool {
        self.last_seq = NonZeroU64::new(event.seq);
        self.last_revision = NonZeroU64::new(event.revision);
        let ends = matches!(self.scope, Scope::Session { .. }) && event.is_terminated();
        batch.push(event);
        ends
    }

    fn deliver(&mut self, events: Vec<SharedEvent>, last: bool) -> Delivery {
        if last {
            self.finished = true;
            self.backlog.clear();
        }
        Delivery::Events { events, last }
    }

    /// Waits for the next events (at most `max`), backlog first.
    pub async fn next(&mut self, max: usize) -> Result<Delivery, Lagged> {
        std::future::poll_fn(|cx| self.poll_next(cx, max)).await
    }

    /// The next events (at most `max`), backlog first; `Pending` with `cx`
    /// woken when an event is published. A watch's response stream polls
    /// this directly, so an idle watch holds no future (`grpc::watch`).
    pub fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<Result<Delivery, Lagged>> {
        if self.finished {
            return Poll::Ready(Ok(Delivery::End));
        }
        let max = max.max(1);
        let mut batch = Vec::new();
        let mut ends = false;
        if !self.backlog.is_empty() {
            while batch.len() < max && !ends {
                let Some(event) = self.backlog.pop_front() else {
                    break;
                };
                ends = self.take(event, &mut batch);
            }
            return Poll::Ready(Ok(self.deliver(batch, ends)));
        }
        loop {
            match self.live.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(event)) if self.wanted(&event) => {
                    ends = self.take(event, &mut batch);
                    break;
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(RecvError::Lagged(missed))) => {
                    return Poll::Ready(Err(self.lagged(missed)))
                }
                Poll::Ready(Err(RecvError::Closed)) if self.log.generation() != self.generation => {
                    return Poll::Ready(Err(self.lagged(0)))
                }
                Poll::Ready(Err(RecvError::Closed)) => {
                    self.finished = true;
                    return Poll::Ready(Ok(Delivery::End));
                }
            }
        }
        if !ends {
            ends = match self.drain_ready(&mut batch, max) {
                Ok(ends) => ends,
                Err(lagged) => return Poll::Ready(Err(lagged)),
            };
        }
        Poll::Ready(Ok(self.deliver(batch, ends)))
    }

    /// Moves already-published events into `batch` without waiting; true if
    /// the watch must end after them.
    fn drain_ready(&mut self, batch: &mut Vec<SharedEvent>, max: usize) -> Result<bool, Lagged> {
        while batch.len() < max {
            match self.live.try_recv() {
                Ok(event) if self.wanted(&event) => {
                    if self.take(event, batch) {
                        return Ok(true);
                    }
                }
                Ok(_) => {}
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                Err(TryRecvError::Lagged(missed)) => return Err(self.lagged(missed)),
            }
        }
        Ok(false)
    }

    /// For a quiet stream: either events that arrived meanwhile (send them),
    /// or a progress seq every matching event up to which has been delivered.
    pub fn bookmark(&mut self, max: usize) -> Result<Bookmark, Lagged> {
        if !self.backlog.is_empty() || self.finished {
            return Ok(Bookmark::NotNow);
        }
        // Read the published seq first: every event at or below it was handed
        // to our channel before the store, so an empty channel afterwards
        // proves we have them all.
        let published = self.log.published_seq();
        let mut batch = Vec::new();
        let ends = self.drain_ready(&mut batch, max.max(1))?;
        if !batch.is_empty() {
            return Ok(Bookmark::Events(self.deliver(batch, ends)));
        }
        Ok(Bookmark::Progress(
            published.max(self.last_seq.map_or(0, NonZeroU64::get)),
        ))
    }
}

/// The answer to [`Subscription::bookmark`].
#[derive(Debug)]
pub enum Bookmark {
    /// Progress seq for a bookmark message.
    Progress(u64),
    /// Events arrived; send these instead of a bookmark.
    Events(Delivery),
    /// The stream is not quiet (backlog pending) or is ending.
    NotNow,
}

#[cfg(test)]
mod tests;
