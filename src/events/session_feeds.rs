//! The feeds of the sessions someone watches, for both backends: a registry
//! shard holds one table of them, a NATS replica's mirror another. A feed
//! is made when a session's first watcher subscribes and dropped when its
//! last watcher goes; a session watch is its backlog handed over to that
//! feed ([`LiveFeed::into_subscription`]).

use std::{collections::VecDeque, sync::Arc};

use super::{EventLog, Feed, FeedReceiver, OnDrop, Scope, SharedEvent, Subscription};
use crate::ids::SessionId;

/// Session ids are short strings hashed on every publish: foldhash, as the
/// registry's tables (seeded per process).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// What keeps a [`SessionFeeds`] under a lock of its own (a registry shard,
/// a replica's mirror): how a watcher's release finds its session's feed.
pub(crate) trait HoldsFeeds: Send + Sync + 'static {
    /// Runs `f` on the table holding `id`'s feed, under its lock.
    fn with_feeds(&self, id: &SessionId, f: impl FnOnce(&mut SessionFeeds));
}

/// Feeds of the sessions watched (most sessions have no entry).
#[derive(Default)]
pub(crate) struct SessionFeeds {
    feeds: HashMap<SessionId, Arc<Feed>>,
}

impl SessionFeeds {
    /// The feed of `id`'s watchers, if it has any: where its events go.
    pub(crate) fn get(&self, id: &SessionId) -> Option<&Feed> {
        self.feeds.get(id.as_str()).map(Arc::as_ref)
    }

    #[cfg(test)]
    pub(crate) fn contains_key(&self, id: &str) -> bool {
        self.feeds.contains_key(id)
    }

    /// A new watcher of `id` (its feed made, bounded by `capacity`, if it is
    /// the first), subscribed now, under `holder`'s lock; dropping the
    /// subscription made from it releases the feed through `holder`.
    pub(crate) fn subscribe<H: HoldsFeeds>(
        &mut self,
        holder: &Arc<H>,
        id: &SessionId,
        capacity: usize,
    ) -> LiveFeed {
        let receiver = self
            .feeds
            .entry(id.clone())
            .or_insert_with(|| Feed::new(capacity))
            .subscribe();
        let holder = Arc::clone(holder);
        let released = id.clone();
        let release =
            OnDrop::new(move || holder.with_feeds(&released, |feeds| feeds.release(&released)));
        LiveFeed { receiver, release }
    }

    /// Drops `id`'s feed once its last watcher is gone.
    fn release(&mut self, id: &SessionId) {
        if self
            .feeds
            .get(id.as_str())
            .is_some_and(|feed| feed.receiver_count() == 0)
        {
            self.feeds.remove(id.as_str());
        }
    }

    /// Closes every feed, ending its watches, and forgets them.
    pub(crate) fn close_all(&mut self) {
        for (_, feed) in self.feeds.drain() {
            feed.close();
        }
    }
}

/// One watcher's live events of a session, from when it subscribed, and
/// what releases the session's feed when the watch ends.
pub(crate) struct LiveFeed {
    receiver: FeedReceiver,
    release: OnDrop,
}

impl LiveFeed {
    /// The session watch: `backlog`, then live events beyond both `scope`
    /// and the backlog (`Scope::after_backlog`). A watch on a session that
    /// has already ended (`terminated`) ends after its backlog.
    pub(crate) fn into_subscription(
        self,
        scope: Scope,
        backlog: VecDeque<SharedEvent>,
        log: Arc<EventLog>,
        terminated: bool,
    ) -> Subscription {
        let subscription =
            Subscription::new(scope, backlog, self.receiver, log, Some(self.release));
        if terminated {
            subscription.finish_after_backlog()
        } else {
            subscription
        }
    }
}
