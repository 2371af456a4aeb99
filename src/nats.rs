//! The NATS JetStream backend: any number of coordinator replicas share one
//! key-value bucket, which is the authority; no replica holds state another
//! needs, so any may die or roll at any time.
//!
//! A call on a session: take this replica's local lock for the session (calls
//! on one session within a replica queue here instead of fighting over
//! compare-and-set), take the session's entry (the one this replica last
//! wrote, from `cache`, else a read from the stream leader), decide the call
//! with the shared decision (`decision::decide`, the same code the memory
//! backend runs), apply a change with this replica's stamp, and write the
//! new entry with compare-and-set on the revision it was decided on. A
//! conflict (another replica wrote first, or the read was stale) costs one
//! retry; nothing is written twice. An answer that writes nothing (a replay,
//! a call that changes nothing, a refusal) stands only once a quorum point
//! shows its entry still the key's latest (`Inner::confirmed`), or once
//! its entry is written back unchanged (`attempts`). The entry
//! carries the new state and the transition's events (`entry`), so the reply
//! is sent only once both are durable in the bucket.
//!
//! Watches are served from every replica's mirror of the bucket (`mirror`);
//! session watches read their backlog from the key's history in the bucket.
//! Expiry runs on the one replica holding the expirer lease (`expiry`), and is
//! decided per session by the same pure decision (`decision::decide_expiry`)
//! inside the same compare-and-set path, so even two expirers at once could
//! not expire a session twice.
//!
//! Where: this file assembles a replica and serves the calls; `attempts`
//! is a call's policy as a pure machine, `call` the decisions and the loop
//! that drives the machine, `requests` the store requests each attempt
//! makes (through `failure::Patience`), `store` the bucket behind them, and
//! `timings` holds every retry count, pause, timeout and bound. See
//! `docs/cluster.md` for the consistency each call gets and what each
//! failure does.

pub mod attempts;
mod cache;
mod call;
#[cfg(test)]
mod call_tests;
mod clock;
mod entry;
mod expiry;
mod failure;
mod follow;
mod landed;
mod locks;
mod mirror;
mod observed;
mod quorum;
mod requests;
mod setup;
mod store;
pub(crate) mod timings;
mod turnover;
mod watch;
#[cfg(test)]
mod watch_tests;

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use async_nats::jetstream::kv;
use tokio_util::sync::CancellationToken;

use self::{
    cache::EntryCache,
    clock::{StreamClock, UnixMillis},
    failure::Patience,
    locks::KeyedLocks,
    observed::NatsStats,
    quorum::QuorumPoints,
    requests::quorum_points,
    store::{Faulty, NatsStore, Store},
    turnover::Turnover,
};
use crate::{
    decision::{Changed, Started},
    error::CoordError,
    events::{EventLog, LogLimits},
    ids::{RequestId, ResponseId, SessionId, SessionScope},
    machine::{Call, FinishStatus, Source, TeardownReason},
    nats::mirror::Mirror,
    session::{Millis, SessionSnapshot, Ttls},
    shared::{Clock, CoordConfig, PageToken, SessionPage},
    stats::CoordStats,
    sync::Mutex,
};
pub use entry::KvRevision;
pub use observed::{NatsCounts, RETRY_REASONS};
pub use setup::{NatsError, NatsSecurity, NatsSettings, Secret};

/// A replica of the NATS-backed coordinator: cheap to clone.
#[derive(Clone)]
pub struct NatsCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    /// The authority: the requests a call makes of the bucket (`store`).
    store: Arc<dyn Store>,
    /// The bucket itself, for the expirer's lease and a watch's history.
    kv: kv::Store,
    /// Calls on one session within this replica, one at a time.
    locks: KeyedLocks,
    /// The entries this replica wrote last (one round trip a call).
    cache: EntryCache,
    /// What a call is decided and waited by.
    rules: Rules,
    /// This replica's view of the bucket, and what keeps it current.
    view: View,
    /// Turnovers: the stream leader or the connection moved (`turnover`).
    turnover: Arc<Turnover>,
    /// Transitions this replica applied, for the metrics.
    stats: Mutex<CoordStats>,
    /// The backend's own counters (store, connection, follower, lease).
    observed: Arc<NatsStats>,
    /// Names this replica in the expirer lease.
    replica: String,
}

/// What a call is decided and waited by.
struct Rules {
    config: CoordConfig,
    /// TTLs as the pure expiry check applies them: the idle TTL plus the
    /// touch interval (see `touch_interval`), so a session whose last touch
    /// was not written never expires early.
    ttls: Ttls,
    touch_interval: Millis,
    /// How long a call rides out transient store failures and waits for
    /// this replica's mirror to reach a quorum point (`Patience`).
    patience: Duration,
}

impl Rules {
    fn new(config: CoordConfig, patience: Duration) -> Self {
        let touch_interval = timings::touch_interval(config.idle_ttl);
        Self {
            ttls: Ttls {
                idle: timings::millis(config.idle_ttl).saturating_add(touch_interval),
                tombstone: timings::millis(config.tombstone_ttl),
            },
            touch_interval,
            patience,
            config,
        }
    }
}

/// This replica's view of the bucket: the mirror its follower keeps, the
/// stream's clock it reads off the stamps, and how a call gets the mirror
/// caught up to a point after it arrived.
struct View {
    mirror: Arc<Mirror>,
    /// The stream's clock, which idleness, expiry and the lease are timed
    /// by (`clock`).
    clock: Arc<StreamClock>,
    /// Tells the follower a call found the mirror behind (`follow`).
    nudge: Arc<tokio::sync::Notify>,
    quorum_points: Arc<QuorumPoints>,
    /// Stops the follower when the replica goes.
    follower: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.view.follower.cancel();
    }
}

/// This replica's wall clock in milliseconds: only until the stream's clock
/// is known (`Inner::now`), and in the fault build that times expiry by it.
fn unix_millis() -> UnixMillis {
    UnixMillis::new(u64::try_from(Clock::unix_nanos() / 1_000_000).unwrap_or(0))
}

fn unavailable(error: impl std::fmt::Display) -> CoordError {
    CoordError::Unavailable(error.to_string())
}

impl NatsCoordinator {
    /// Connects, creates the bucket if it does not exist, loads the mirror
    /// and starts following the bucket.
    pub async fn connect(settings: &NatsSettings, config: CoordConfig) -> Result<Self, NatsError> {
        Self::connect_with(settings, config, |store| {
            use crate::shared::faults;
            if faults::unguarded_writes() || faults::unconfirmed_reads() {
                return Arc::new(Faulty {
                    store,
                    unguarded_writes: faults::unguarded_writes(),
                    unconfirmed_reads: faults::unconfirmed_reads(),
                });
            }
            Arc::new(store)
        })
        .await
    }

    /// [`NatsCoordinator::connect`], its calls' requests made through the
    /// store `wrap` makes of the bucket's.
    async fn connect_with(
        settings: &NatsSettings,
        config: CoordConfig,
        wrap: impl FnOnce(NatsStore) -> Arc<dyn Store>,
    ) -> Result<Self, NatsError> {
        let observed = Arc::new(NatsStats::default());
        let turnover = Turnover::new();
        let opened = setup::open_bucket(settings, &observed, &turnover).await?;
        let (kv, stream) = (opened.kv, opened.stream);
        let subject_prefix = format!("$KV.{}.", settings.bucket);
        let clock = Arc::new(StreamClock::default());
        let state = follow::load(&stream, &subject_prefix, &clock)
            .await
            .map_err(|reason| NatsError::Load {
                bucket: settings.bucket.clone(),
                reason,
            })?;
        // Watch-all resume (`after_seq`) reaches back to this replica's boot:
        // older events are in the bucket only as the latest state.
        let base_seq = entry::last_seq_of_write(state.stream_seq());
        let log = Arc::new(EventLog::new(
            base_seq,
            LogLimits {
                retained_events: config.global_history,
                watch_all_buffer: config.watch_all_buffer,
            },
        ));
        let mirror = Arc::new(Mirror::new(state, log, config.session_watch_buffer));
        let follower = CancellationToken::new();
        tokio::spawn(turnover::follow_leader_elections(
            opened.client,
            format!("KV_{}", settings.bucket),
            Arc::clone(&turnover),
            follower.clone(),
        ));
        let nudge = Arc::new(tokio::sync::Notify::new());
        let following = follow::Follower {
            stream: stream.clone(),
            mirror: Arc::clone(&mirror),
            clock: Arc::clone(&clock),
            subject_prefix,
            stats: Arc::clone(&observed),
            turnovers: turnover.subscribe(),
            nudge: Arc::clone(&nudge),
        };
        tokio::spawn(following.run(follower.clone()));
        let store = wrap(NatsStore {
            kv: kv.clone(),
            stream: stream.clone(),
        });
        let quorum_points = quorum_points(&store, &observed, &turnover, settings.patience);
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                kv,
                locks: KeyedLocks::new(config.shards),
                cache: EntryCache::new(config.shards, timings::ENTRY_CACHE_CAPACITY),
                rules: Rules::new(config, settings.patience),
                view: View {
                    mirror,
                    clock,
                    nudge,
                    quorum_points,
                    follower,
                },
                turnover,
                stats: Mutex::default(),
                observed,
                replica: format!(
                    "{:016x}",
                    Clock::unix_nanos() as u64 ^ u64::from(std::process::id())
                ),
            }),
        })
    }

    pub async fn start(
        &self,
        id: &SessionId,
        source: Source,
        request_id: Option<RequestId>,
    ) -> Result<Started, CoordError> {
        let call = Call::Start { source, request_id };
        self.inner.call(id, &call).await?.started(id)
    }

    pub async fn finish(
        &self,
        id: &SessionId,
        response: Option<ResponseId>,
        status: FinishStatus,
    ) -> Result<Changed<bool>, CoordError> {
        let call = Call::Finish { response, status };
        Ok(self.inner.call(id, &call).await?.finished())
    }

    pub async fn cancel(
        &self,
        id: &SessionId,
        only_if: Option<ResponseId>,
        source: Source,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        let call = Call::Cancel { only_if, source };
        Ok(self.inner.call(id, &call).await?.cancelled())
    }

    pub async fn shutdown(
        &self,
        id: &SessionId,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        self.shutdown_from(id, Source::Unspecified).await
    }

    /// [`NatsCoordinator::shutdown`] asked for by `source` (recorded on the
    /// cancel of the live response).
    pub async fn shutdown_from(
        &self,
        id: &SessionId,
        source: Source,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        let call = Call::Teardown {
            reason: TeardownReason::Shutdown,
            source,
        };
        Ok(self.inner.call(id, &call).await?.cancelled())
    }

    /// GetState: answered from this replica's mirror once it has reached a
    /// quorum point written after the call arrived, so it sees every
    /// acknowledged write. Counts as a call for idle expiry (a touch is
    /// written when the stored one is older than the touch interval).
    pub async fn state(&self, id: &SessionId) -> Result<SessionSnapshot, CoordError> {
        self.inner.touch(id).await
    }

    /// ListSessions from this replica's mirror, after it has reached a
    /// quorum point written after the call arrived (so a client sees every
    /// acknowledged write), in session id order.
    pub async fn list(
        &self,
        scope: &SessionScope,
        page_size: usize,
        after: Option<SessionId>,
    ) -> Result<SessionPage, CoordError> {
        self.inner.quorum_point(timings::LIST_CATCH_UP).await?;
        let (sessions, next, seq) =
            self.inner
                .view
                .mirror
                .list(scope, page_size.max(1), after.as_ref());
        Ok(SessionPage {
            sessions,
            next: next.map(PageToken::AfterId),
            seq,
        })
    }

    pub fn session_count(&self) -> usize {
        self.inner.view.mirror.session_count()
    }

    pub fn stats(&self) -> CoordStats {
        let mut stats = *self
            .inner
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        stats.sessions = self.inner.view.mirror.counts();
        stats
    }

    /// The last stream sequence this replica's mirror has applied.
    pub fn mirror_stream_seq(&self) -> u64 {
        self.inner.view.mirror.stream_seq()
    }

    /// Runs the expirer (when this replica holds the lease) until `stop`.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        expiry::run(self.clone(), stop).await;
        self.inner.view.follower.cancel();
    }
}

impl Inner {
    /// A call's patience, starting now.
    fn patience(&self) -> Patience {
        Patience::new(self.rules.patience, self.turnover.subscribe())
    }

    /// The stream's clock now, at most (`clock`); this replica's own before
    /// any stamp arrived, which only a bucket without a single entry sees.
    fn now(&self) -> UnixMillis {
        self.view.clock.now().unwrap_or_else(unix_millis)
    }
}
