//! The registry's expirer: each shard's min-heap of (due time, session)
//! entries, worked through in batches with the shared expiry decision
//! (`decision::decide_expiry`), and the task that sleeps until the next one.

use std::{cmp::Reverse, time::Duration};

use super::{Inner, Registry, Shard};
use crate::{
    decision::{self, Expired, ExpiryDecision},
    session::Millis,
    sync::atomic::Ordering,
};

/// Expired and forgotten sessions handled per shard lock, so a mass expiry
/// never holds one shard for long.
pub(super) const EXPIRY_BATCH: usize = 1024;

impl Registry {
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
            if !session.is_expiry_entry(due) {
                continue; // superseded by a newer entry for the same session
            }
            match decision::decide_expiry(session, &id, now, self.ttls) {
                ExpiryDecision::NotDue { at } => self.file_expiry(expiry, session, &id, at),
                ExpiryDecision::Expire(ready) => {
                    let append = self.log.begin_append();
                    let stamp = Self::stamp(append.next_seq());
                    let Expired {
                        decision,
                        next_check,
                    } = ready.apply(stamp, history);
                    let watchers = watchers.get(&id);
                    let call = &decision::EXPIRY;
                    Self::carry_out(watchers, stats, Some(append), &id, call, &decision);
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
}
