//! The entries this replica wrote last (see [`EntryCache`]).

use std::{collections::HashMap, sync::PoisonError};

use super::{
    entry::{self, KvRevision},
    locks::shard_of,
};
use crate::{ids::SessionId, sync::Mutex};

/// The entries this replica wrote last, by session: a call that finds its
/// session here writes against the cached revision without reading first
/// (one round trip instead of two); if another replica wrote meanwhile the
/// compare-and-set fails and the call reads fresh. Bounded: beyond capacity
/// an arbitrary entry is dropped, which costs only a read later.
/// Session -> (revision, entry) this replica wrote.
type CacheShard = HashMap<SessionId, (KvRevision, entry::Entry)>;

pub(super) struct EntryCache {
    shards: Box<[Mutex<CacheShard>]>,
    per_shard: usize,
}

impl EntryCache {
    pub(super) fn new(shards: usize, capacity: usize) -> Self {
        let shards = shards.max(1);
        Self {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            per_shard: (capacity / shards).max(1),
        }
    }

    fn shard(&self, id: &SessionId) -> crate::sync::MutexGuard<'_, CacheShard> {
        self.shards[shard_of(id, self.shards.len())]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn take(&self, id: &SessionId) -> Option<(KvRevision, entry::Entry)> {
        self.shard(id).remove(id)
    }

    pub(super) fn put(&self, id: &SessionId, revision: KvRevision, entry: entry::Entry) {
        let mut shard = self.shard(id);
        if shard.len() >= self.per_shard {
            if let Some(evicted) = shard.keys().next().cloned() {
                shard.remove(&evicted);
            }
        }
        shard.insert(id.clone(), (revision, entry));
    }
}
