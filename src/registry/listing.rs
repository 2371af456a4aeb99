//! ListSessions on the registry: pages in (shard, hash, id) order, each one
//! pass over the shards it reads.

use std::{collections::BinaryHeap, hash::BuildHasher};

use super::Registry;
use crate::{
    error::CoordError,
    ids::{SessionId, SessionScope},
    session::SessionSnapshot,
    shared::PageCursor,
};

/// One page of ListSessions.
#[derive(Clone, Debug)]
pub struct Page {
    pub sessions: Vec<SessionSnapshot>,
    pub next: Option<PageCursor>,
    /// Every event with seq at or below this is reflected in `sessions`.
    pub seq: u64,
}

impl Registry {
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
            let in_scope = guard.sessions.keys().filter(|id| scope.contains(id));
            let mut keys = self.smallest_keys(in_scope, after.as_ref(), wanted + 1);
            let more_here = keys.len() > wanted;
            keys.truncate(wanted);
            let mut last = None;
            for (hash, id) in keys {
                if let Some((id, session)) = guard.sessions.get_key_value(id) {
                    sessions.push(session.listed(id));
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

    /// The `count` smallest (hash, id) listing keys of `ids` past `after`,
    /// smallest first.
    fn smallest_keys<'a>(
        &self,
        ids: impl Iterator<Item = &'a SessionId>,
        after: Option<&(u64, SessionId)>,
        count: usize,
    ) -> Vec<(u64, &'a str)> {
        let mut smallest: BinaryHeap<(u64, &str)> = BinaryHeap::with_capacity(count);
        for id in ids {
            let key = (self.inner.hasher.hash_one(id.as_str()), id.as_str());
            if after.is_some_and(|(hash, last)| key <= (*hash, last.as_str())) {
                continue;
            }
            if smallest.len() < count {
                smallest.push(key);
            } else if smallest.peek().is_some_and(|largest| key < *largest) {
                smallest.pop();
                smallest.push(key);
            }
        }
        smallest.into_sorted_vec()
    }
}
