//! Watches on the registry: a session's retained events handed over to its
//! feed under the shard lock (the shard's `SessionFeeds`, released through
//! it), and the event log's watch-all.

use std::{collections::VecDeque, sync::Arc};

use super::{Inner, Registry};
use crate::{
    error::CoordError,
    events::{HoldsFeeds, Scope, SessionFeeds, Subscription},
    ids::{SessionId, SessionScope},
    machine::Phase,
};

impl Registry {
    /// Watch one session. It need not exist yet. With `after_revision`, the
    /// retained events above it come first (OUT_OF_RANGE if some are gone).
    pub fn watch_session(
        &self,
        id: &SessionId,
        after_revision: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        let now = self.inner.clock.now();
        let mut shard = self.inner.shard(id);
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
        let live = shard.watchers.subscribe(&self.inner, id, capacity);
        drop(shard);
        Ok(live.into_subscription(
            Scope::session(after_revision, current),
            backlog,
            Arc::clone(&self.inner.log),
            terminated,
        ))
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
}

impl HoldsFeeds for Inner {
    fn with_feeds(&self, id: &SessionId, f: impl FnOnce(&mut SessionFeeds)) {
        f(&mut self.shard(id).watchers);
    }
}
