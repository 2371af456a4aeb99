//! The store requests a call makes on the bucket: a read of a session's
//! entry, a compare-and-set write (which recognises a write of its own
//! whose answer was lost, `landed`), a purge, and a quorum point with the
//! mirror caught up to it. Each goes through the call's `Patience`
//! (`failure`), which retries what is transient.

use std::{sync::Arc, time::Duration};

use super::{
    attempts::Written,
    call::Read,
    clock,
    entry::{self, KvRevision},
    failure::{Patience, StoreFailure},
    observed::{NatsStats, StoreOp},
    quorum::QuorumPoints,
    store::Store,
    timings,
    turnover::Turnover,
    unavailable, Inner,
};
use crate::{error::CoordError, ids::SessionId};

/// The key quorum points are written to (see `Inner::quorum_point`): not a
/// session key, so the follower only counts it as progress; one key for
/// every replica, so the bucket's per-key history bounds what it keeps.
const QUORUM_POINT_KEY: &str = "quorum.point";

/// Quorum points (`Inner::quorum_point`) written to `kv`, each with
/// `patience` for transient store failures.
pub(super) fn quorum_points(
    store: &Arc<dyn Store>,
    observed: &Arc<NatsStats>,
    turnover: &Arc<Turnover>,
    patience: Duration,
) -> Arc<QuorumPoints> {
    let (store, observed, turnover) = (
        Arc::clone(store),
        Arc::clone(observed),
        Arc::clone(turnover),
    );
    QuorumPoints::new(Arc::new(move || {
        let (store, observed) = (Arc::clone(&store), Arc::clone(&observed));
        let turnovers = turnover.subscribe();
        Box::pin(async move {
            Patience::new(patience, turnovers)
                .retry(&observed, StoreOp::QuorumPoint, || {
                    store.put(QUORUM_POINT_KEY, bytes::Bytes::new())
                })
                .await
                .map(KvRevision::get)
                .map_err(|failure| failure.into_error().to_string())
        })
    }))
}

impl Inner {
    /// The session's entry from the stream leader, its last activity taken
    /// from the stream's stamp (`clock`).
    pub(super) async fn read(
        &self,
        id: &SessionId,
        key: &str,
        patience: &mut Patience,
    ) -> Result<Read, CoordError> {
        let stored = patience
            .retry(&self.observed, StoreOp::Read, || self.store.entry(key))
            .await
            .map_err(StoreFailure::into_error)?;
        let Some(stored) = stored else {
            return Ok(Read::Absent {
                revision: KvRevision::NONE,
            });
        };
        let stamp = clock::stamp_millis(stored.created_nanos);
        self.view.clock.observe(stamp);
        if !stored.put {
            return Ok(Read::Absent {
                revision: stored.revision,
            });
        }
        match entry::decode(&stored.value) {
            Ok(mut entry) => {
                entry.persisted.since = clock::last_activity(entry.persisted.since, stamp);
                Ok(Read::Live {
                    revision: stored.revision,
                    entry,
                })
            }
            Err(error) => Err(CoordError::Unreadable {
                session: id.clone(),
                reason: error.to_string(),
            }),
        }
    }

    /// A point in the bucket's history after this call arrived that a
    /// quorum of JetStream nodes committed, with this replica's mirror caught
    /// up to it: the mirror then holds every write acknowledged before the
    /// call. It is a write because only a write proves its leader is still
    /// the leader; a read, even from the stream leader, can be served by a
    /// node a partition has already deposed (docs/cluster.md, "Consistency
    /// each call gets"). Calls asking at once share one (`quorum`).
    /// The mirror is given `patience` to reach the point; every
    /// `timings::NUDGE_AFTER` it has not, the follower is nudged to read what
    /// it misses (a read that found no stream leader is tried again at the
    /// next nudge, not left to the follower's stall check).
    pub(super) async fn quorum_point(&self, patience: Duration) -> Result<u64, CoordError> {
        let point = self.view.quorum_points.point().await.map_err(unavailable)?;
        self.observed.saw_stream_seq(point);
        let deadline = tokio::time::Instant::now() + patience;
        let caught_up = self.view.mirror.caught_up_to(point);
        tokio::pin!(caught_up);
        loop {
            let look = timings::NUDGE_AFTER
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            if tokio::time::timeout(look, &mut caught_up).await.is_ok() {
                return Ok(point);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable(
                    "this replica's view of the bucket is behind; retry",
                ));
            }
            tracing::debug!(
                point,
                mirror = self.view.mirror.stream_seq(),
                "mirror behind a quorum point; nudging the follower"
            );
            self.view.nudge.notify_one();
        }
    }

    /// Whether the entry an answer that writes nothing was decided on (its
    /// KV revision; `None` for an absent session) was still the key's
    /// latest at a quorum point after the call arrived: then the answer is
    /// linearizable at that point. A stale read (a deposed leader's, or this
    /// replica's cache) is not, and the call is decided again. A write by
    /// someone else after the point does not undo it (`Mirror::latest_at`),
    /// so a busy session does not send its no-op calls round and round.
    pub(super) async fn confirmed(
        &self,
        id: &SessionId,
        read: Option<KvRevision>,
        patience: &Patience,
    ) -> Result<bool, CoordError> {
        let point = self.quorum_point(patience.remaining()).await?;
        Ok(self.view.mirror.latest_at(id, point) == Some(read))
    }

    /// Writes `value` if the key is still at `expected`. A transient
    /// failure is tried again with the same bytes and expectation; if an
    /// earlier try landed after all, the retry meets a conflict, which is
    /// then reported as possibly the write's own
    /// (`Written::ConflictAfterUnanswered`).
    pub(super) async fn write(
        &self,
        key: &str,
        value: &bytes::Bytes,
        expected: KvRevision,
        patience: &mut Patience,
    ) -> Result<Written, CoordError> {
        let mut tries = 0_u32;
        let written = patience
            .retry(&self.observed, StoreOp::Write, || {
                tries += 1;
                self.store.update(key, value.clone(), expected)
            })
            .await;
        match written {
            Ok(revision) => Ok(Written::At(revision)),
            Err(StoreFailure::Conflict) if tries > 1 => Ok(Written::ConflictAfterUnanswered),
            Err(StoreFailure::Conflict) => Ok(Written::Conflict),
            Err(failure) => Err(failure.into_error()),
        }
    }

    /// Removes a forgotten session's entry if the key is still at
    /// `expected`: `false` on a conflict.
    pub(super) async fn purge(
        &self,
        key: &str,
        expected: KvRevision,
        patience: &mut Patience,
    ) -> Result<bool, CoordError> {
        let purged = patience
            .retry(&self.observed, StoreOp::Purge, || {
                self.store.purge(key, expected)
            })
            .await;
        match purged {
            Ok(()) => Ok(true),
            Err(StoreFailure::Conflict) => Ok(false),
            Err(failure) => Err(failure.into_error()),
        }
    }
}
