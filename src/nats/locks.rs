//! Per-session async locks, so calls on one session within this replica run
//! one at a time (they would only fight over compare-and-set otherwise), and
//! the shard function they share with the entry cache.

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError},
};

use crate::{ids::SessionId, sync::Mutex};

type LockShard = HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>;

/// Per-session async locks, so calls on one session within this replica run
/// one at a time (they would only fight over compare-and-set otherwise).
/// An entry exists only while some call holds or waits for it.
pub(super) struct KeyedLocks {
    shards: Box<[Mutex<LockShard>]>,
}

pub(super) struct KeyedGuard<'a> {
    locks: &'a KeyedLocks,
    id: SessionId,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut shard = self.locks.shard(&self.id);
        if shard
            .get(&self.id)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            shard.remove(&self.id);
        }
    }
}

impl KeyedLocks {
    pub(super) fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, id: &SessionId) -> crate::sync::MutexGuard<'_, LockShard> {
        self.shards[shard_of(id, self.shards.len())]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) async fn lock(&self, id: &SessionId) -> KeyedGuard<'_> {
        let lock = Arc::clone(self.shard(id).entry(id.clone()).or_default());
        let guard = lock.lock_owned().await;
        KeyedGuard {
            locks: self,
            id: id.clone(),
            guard: Some(guard),
        }
    }
}

/// The shard of the per-session locks and the entry cache. Fixed-seeded:
/// both tables must agree for the process's life, and they are bounded by
/// calls in flight and the cache capacity, not by client choice of ids.
pub(super) fn shard_of(id: &SessionId, shards: usize) -> usize {
    use std::hash::BuildHasher;
    let hash = foldhash::fast::FixedState::default().hash_one(id.as_str());
    (hash % shards as u64) as usize
}
