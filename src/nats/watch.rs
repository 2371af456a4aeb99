//! Watches on the NATS backend: a session's from the key's history in the
//! bucket handed over to this replica's mirror, and every session's from
//! the mirror (the handover rule is the shared one, `Scope::after_backlog`).

use std::{collections::VecDeque, sync::Arc};

use async_nats::jetstream::kv::Operation;
use tokio_stream::StreamExt as _;

use super::{call::Read, entry, failure::StoreFailure, unavailable, Inner, NatsCoordinator};
use crate::{
    error::CoordError,
    events::{Scope, SharedEvent, Subscription},
    ids::{SessionId, SessionScope},
    machine::Phase,
};

impl NatsCoordinator {
    /// Watch one session: its retained entries with revision above
    /// `after_revision` from the key's history in the bucket, then live
    /// events from this replica's mirror, with no gap and no duplicate
    /// (subscribed before the bucket is read; live events at or below the
    /// last revision the backlog holds are skipped, see `Scope::after_backlog`).
    pub async fn watch_session(
        &self,
        id: &SessionId,
        after_revision: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        // Opening a watch is a call naming the session (idle expiry counts
        // it, as the memory backend does); keeping it open is not.
        match self.inner.touch(id).await {
            Ok(_) | Err(CoordError::SessionNotFound(_)) => {}
            Err(error) => return Err(error),
        }
        let live = self.inner.view.mirror.subscribe_session(id);
        let key = entry::key(id);
        let mut patience = self.inner.patience();
        let read = self.inner.read(id, &key, &mut patience).await?;
        let (current, terminated) = match &read {
            Read::Live { entry, .. } => (
                entry.persisted.revision,
                entry.persisted.phase == Phase::Terminated,
            ),
            Read::Absent { .. } => (0, false),
        };
        // Fetched after the read, so it may hold revisions above `current`
        // that also arrive live: the subscription skips live events through
        // the backlog's last revision, not through `current`.
        let backlog = match after_revision {
            Some(after) if after < current => {
                self.inner
                    .history_after(id, &key, after, patience.remaining())
                    .await?
            }
            _ => VecDeque::new(),
        };
        Ok(live.into_subscription(
            Scope::session(after_revision, current),
            backlog,
            Arc::clone(self.inner.view.mirror.log()),
            terminated,
        ))
    }

    /// Watch every session. "From now" means from the bucket's now, not
    /// this replica's mirror's (which may trail it): events of writes
    /// acknowledged before the call are skipped when they reach the mirror,
    /// as ListSessions waits for them.
    pub async fn watch_all(
        &self,
        scope: &SessionScope,
        after_seq: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        let from = match after_seq {
            Some(after) => after,
            None => {
                let last = self
                    .inner
                    .store
                    .last_sequence()
                    .await
                    .map_err(StoreFailure::into_error)?;
                entry::last_seq_of_write(last)
            }
        };
        // The mirror's backlog and live stream are taken under the event
        // log's lock, so this handover cannot repeat an event (and it uses
        // the same rule as every other watch, `Scope::after_backlog`).
        self.inner.view.mirror.watch_all(scope, Some(from))
    }
}

impl Inner {
    /// The session's events with revision above `after` from the key's
    /// history in the bucket, or OUT_OF_RANGE when they are no longer there.
    /// Bounded by `patience`: the key's history is read through a consumer,
    /// and a stream that stops delivering must not hold the Watch call open.
    async fn history_after(
        &self,
        id: &SessionId,
        key: &str,
        after: u64,
        patience: std::time::Duration,
    ) -> Result<VecDeque<SharedEvent>, CoordError> {
        tokio::time::timeout(patience, self.read_history_after(id, key, after))
            .await
            .map_err(|_| {
                unavailable("reading the session's history from the bucket timed out; retry")
            })?
    }

    async fn read_history_after(
        &self,
        id: &SessionId,
        key: &str,
        after: u64,
    ) -> Result<VecDeque<SharedEvent>, CoordError> {
        let mut history = self.kv.history(key).await.map_err(unavailable)?;
        let mut events: Vec<SharedEvent> = Vec::new();
        let mut oldest_seen: Option<u64> = None;
        while let Some(stored) = history.next().await {
            let stored = stored.map_err(unavailable)?;
            if stored.operation != Operation::Put {
                // The session was forgotten here: what follows is a new one.
                events.clear();
                oldest_seen = None;
                continue;
            }
            let Ok(entry) = entry::decode(&stored.value) else {
                continue;
            };
            // Every event after this entry's first revision (for a touch,
            // which carries none: after its revision) is in this entry or a
            // later one; the events before it are gone. A history left with
            // only touches therefore proves the events the watch asked for
            // gone too (OUT_OF_RANGE), rather than passing for an empty,
            // gap-free backlog.
            oldest_seen.get_or_insert(entry.first_revision());
            if entry.events.is_empty() {
                continue;
            }
            events.extend(
                entry
                    .lifecycle_events(id, stored.revision)
                    .into_iter()
                    .filter(|event| event.revision > after),
            );
            if stored.delta == 0 {
                break;
            }
        }
        match oldest_seen {
            Some(oldest) if oldest > after + 1 => Err(CoordError::HistoryUnavailable {
                field: "after_revision",
                requested: after,
                oldest_available: oldest - 1,
            }),
            _ => Ok(events.into()),
        }
    }
}
