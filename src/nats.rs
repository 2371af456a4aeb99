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
//! shows its entry still the key's latest (`Inner::confirmed`). The entry
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
//! See `docs/cluster.md` for the consistency each call gets and what each
//! failure does.

mod cache;
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
mod setup;
pub(crate) mod timings;
mod turnover;
mod watch;
#[cfg(test)]
mod watch_tests;

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use async_nats::jetstream::{
    self,
    kv::{self, Operation},
};
use tokio_util::sync::CancellationToken;

use self::{
    cache::EntryCache,
    clock::StreamClock,
    failure::{Patience, StoreFailure},
    landed::Landed,
    locks::KeyedLocks,
    observed::{NatsStats, StoreOp},
    quorum::QuorumPoints,
    turnover::Turnover,
};
use crate::{
    decision::{self, Changed, Decision, Effect, Presence, Room, Stamp, Started},
    error::CoordError,
    events::{EventLog, LogLimits},
    ids::{RequestId, ResponseId, SessionId, SessionScope},
    machine::{Call, FinishStatus, Outcome, Phase, Source, TeardownReason},
    nats::mirror::Mirror,
    session::{self, Millis, Session, SessionSnapshot, Ttls},
    shared::{Clock, CoordConfig, PageToken, SessionPage},
    stats::CoordStats,
    sync::Mutex,
};
pub use observed::{NatsCounts, RETRY_REASONS};
pub use setup::{NatsError, NatsSecurity, NatsSettings, Secret};

/// The key quorum points are written to (see `Inner::quorum_point`): not a
/// session key, so the follower only counts it as progress; one key for
/// every replica, so the bucket's per-key history bounds what it keeps.
const QUORUM_POINT_KEY: &str = "quorum.point";

/// A replica of the NATS-backed coordinator: cheap to clone.
#[derive(Clone)]
pub struct NatsCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    kv: kv::Store,
    stream: jetstream::stream::Stream,
    mirror: Arc<Mirror>,
    locks: KeyedLocks,
    cache: EntryCache,
    config: CoordConfig,
    /// TTLs as the pure expiry check applies them: the idle TTL plus the
    /// touch interval (see `touch_interval`), so a session whose last touch
    /// was not written never expires early.
    ttls: Ttls,
    touch_interval: Millis,
    /// How long a call rides out transient store failures and waits for
    /// this replica's mirror to reach a quorum point (`Patience`).
    patience: Duration,
    /// Turnovers: the stream leader or the connection moved (`turnover`).
    turnover: Arc<Turnover>,
    /// Tells the follower a call found the mirror behind (`follow`).
    nudge: Arc<tokio::sync::Notify>,
    quorum_points: Arc<QuorumPoints>,
    /// Transitions this replica applied, for the metrics.
    stats: Mutex<CoordStats>,
    /// The backend's own counters (store, connection, follower, lease).
    observed: Arc<NatsStats>,
    /// Names this replica in the expirer lease.
    replica: String,
    /// The stream's clock, which idleness, expiry and the lease are timed
    /// by (`clock`).
    clock: Arc<StreamClock>,
    follower: CancellationToken,
    /// Test seam: the next read of a key returns this older revision, as a
    /// deposed stream leader would (`call_tests`).
    #[cfg(test)]
    stale_reads: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Test seam: the next write of a key lands, but its answer is lost
    /// while something else happens (`landed::tests`).
    #[cfg(test)]
    lost_answers: std::sync::Mutex<std::collections::HashMap<String, landed::Meanwhile>>,
    /// Test seam: what the next watch awaits between its steps (`watch`).
    #[cfg(test)]
    watch_step: std::sync::Mutex<Option<landed::Meanwhile>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.follower.cancel();
    }
}

/// This replica's wall clock in milliseconds: only until the stream's clock
/// is known (`Inner::now`), and in the fault build that times expiry by it.
fn unix_millis() -> Millis {
    u64::try_from(Clock::unix_nanos() / 1_000_000).unwrap_or(0)
}

/// The id a Start written now gives its response: above every id the
/// session minted, and at least the wall clock in nanoseconds, so ids keep
/// rising across a forgotten session's successor too (docs/cluster.md on
/// clocks).
fn mint(last_response: u64, unix_nanos: i64) -> ResponseId {
    let minted = last_response
        .saturating_add(1)
        .max(u64::try_from(unix_nanos).unwrap_or(0));
    ResponseId::new(minted).unwrap_or(ResponseId::MIN)
}

fn unavailable(error: impl std::fmt::Display) -> CoordError {
    CoordError::Unavailable(error.to_string())
}

/// A session's entry as read: its stored record, or nothing (never created,
/// or forgotten) with the revision a create must expect.
enum Read {
    Live { revision: u64, entry: entry::Entry },
    Absent { revision: u64 },
}

impl Read {
    /// The entry read and its revision, if an answer decided on it may be
    /// confirmed by writing it back (`Inner::rewrite`): a live session's.
    /// A terminated one's is not rewritten (that would move the time it is
    /// forgotten after), and nothing else writes it but a touch.
    fn rewritable(&self) -> Option<(u64, entry::Entry)> {
        match self {
            Read::Live { revision, entry } if entry.persisted.phase != Phase::Terminated => {
                Some((*revision, entry.clone()))
            }
            _ => None,
        }
    }

    /// The KV revision of a stored record read, `None` for an absent one:
    /// what `Inner::confirmed` checks an answer without a write against.
    fn live_revision(&self) -> Option<u64> {
        match self {
            Read::Live { revision, .. } => Some(*revision),
            Read::Absent { .. } => None,
        }
    }
}

/// What one attempt of `Inner::compare_and_set` does with what it read.
enum Step<T> {
    /// The answer stands as it is (expiry's "nothing to do").
    Stands(Result<T, CoordError>),
    /// An answer that writes nothing: it stands once the entry it was
    /// decided on (`read`, as `Read::live_revision`) is confirmed the key's
    /// latest at a quorum point, else the call goes round again.
    Confirm {
        read: Option<u64>,
        answer: Result<T, CoordError>,
    },
    /// Write `entry` if the key is still at `expected`, then answer; the
    /// entry is remembered in the cache if `cache`, else the cached one is
    /// dropped.
    Write {
        expected: u64,
        entry: entry::Entry,
        cache: bool,
        answer: T,
    },
    /// Purge a forgotten session's entry if the key is still at
    /// `expected`, then answer.
    Purge { expected: u64, answer: T },
}

impl<T> Step<T> {
    fn confirm(read: Option<u64>, answer: Result<T, CoordError>) -> Self {
        Step::Confirm { read, answer }
    }
}

/// Quorum points (`Inner::quorum_point`) written to `kv`, each with
/// `patience` for transient store failures.
fn quorum_points(
    kv: &kv::Store,
    observed: &Arc<NatsStats>,
    turnover: &Arc<Turnover>,
    patience: Duration,
) -> Arc<QuorumPoints> {
    let (kv, observed, turnover) = (kv.clone(), Arc::clone(observed), Arc::clone(turnover));
    QuorumPoints::new(Arc::new(move || {
        let (kv, observed) = (kv.clone(), Arc::clone(&observed));
        let turnovers = turnover.subscribe();
        Box::pin(async move {
            Patience::new(patience, turnovers)
                .retry(&observed, StoreOp::QuorumPoint, || async {
                    kv.put(QUORUM_POINT_KEY, bytes::Bytes::new())
                        .await
                        .map_err(|error| StoreFailure::of(&error))
                })
                .await
                .map_err(|failure| failure.into_error().to_string())
        })
    }))
}

impl NatsCoordinator {
    /// Connects, creates the bucket if it does not exist, loads the mirror
    /// and starts following the bucket.
    pub async fn connect(settings: &NatsSettings, config: CoordConfig) -> Result<Self, NatsError> {
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
        let touch_interval = timings::touch_interval(config.idle_ttl);
        let patience = settings.patience;
        let quorum_points = quorum_points(&kv, &observed, &turnover, patience);
        Ok(Self {
            inner: Arc::new(Inner {
                kv,
                stream,
                mirror,
                locks: KeyedLocks::new(config.shards),
                cache: EntryCache::new(config.shards, timings::ENTRY_CACHE_CAPACITY),
                ttls: Ttls {
                    idle: timings::millis(config.idle_ttl).saturating_add(touch_interval),
                    tombstone: timings::millis(config.tombstone_ttl),
                },
                touch_interval,
                patience: settings.patience,
                turnover,
                nudge,
                quorum_points,
                config,
                stats: Mutex::default(),
                observed,
                replica: format!(
                    "{:016x}",
                    Clock::unix_nanos() as u64 ^ u64::from(std::process::id())
                ),
                clock,
                follower,
                #[cfg(test)]
                stale_reads: std::sync::Mutex::default(),
                #[cfg(test)]
                lost_answers: std::sync::Mutex::default(),
                #[cfg(test)]
                watch_step: std::sync::Mutex::default(),
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
        let (sessions, next, seq) = self
            .inner
            .mirror
            .list(scope, page_size.max(1), after.as_ref());
        Ok(SessionPage {
            sessions,
            next: next.map(PageToken::AfterId),
            seq,
        })
    }

    pub fn session_count(&self) -> usize {
        self.inner.mirror.session_count()
    }

    pub fn stats(&self) -> CoordStats {
        let mut stats = *self
            .inner
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        stats.sessions = self.inner.mirror.counts();
        stats
    }

    /// The last stream sequence this replica's mirror has applied.
    pub fn mirror_stream_seq(&self) -> u64 {
        self.inner.mirror.stream_seq()
    }

    /// Runs the expirer (when this replica holds the lease) until `stop`.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        expiry::run(self.clone(), stop).await;
        self.inner.follower.cancel();
    }
}

impl Inner {
    /// A call's patience, starting now.
    fn patience(&self) -> Patience {
        Patience::new(self.patience, self.turnover.subscribe())
    }

    /// The stream's clock now, at most (`clock`); this replica's own before
    /// any stamp arrived, which only a bucket without a single entry sees.
    fn now(&self) -> Millis {
        self.clock.now().unwrap_or_else(unix_millis)
    }

    /// The session's entry from the stream leader, its last activity taken
    /// from the stream's stamp (`clock`).
    async fn read(
        &self,
        id: &SessionId,
        key: &str,
        patience: &mut Patience,
    ) -> Result<Read, CoordError> {
        #[cfg(test)]
        let stale = self
            .stale_reads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        #[cfg(not(test))]
        let stale = None;
        let stored = patience
            .retry(&self.observed, StoreOp::Read, || async {
                match stale {
                    Some(revision) => self.kv.entry_for_revision(key, revision).await,
                    None => self.kv.entry(key).await,
                }
                .map_err(|error| StoreFailure::of(&error))
            })
            .await
            .map_err(StoreFailure::into_error)?;
        let Some(stored) = stored else {
            return Ok(Read::Absent { revision: 0 });
        };
        let stamp = clock::stamp_millis(stored.created.unix_timestamp_nanos());
        self.clock.observe(stamp);
        if stored.operation != Operation::Put {
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
    async fn quorum_point(&self, patience: Duration) -> Result<u64, CoordError> {
        if crate::shared::faults::unconfirmed_reads() {
            // Whatever the mirror holds stands, as before the fix.
            return Ok(0);
        }
        let point = self.quorum_points.point().await.map_err(unavailable)?;
        self.observed.saw_stream_seq(point);
        let deadline = tokio::time::Instant::now() + patience;
        let caught_up = self.mirror.caught_up_to(point);
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
                mirror = self.mirror.stream_seq(),
                "mirror behind a quorum point; nudging the follower"
            );
            self.nudge.notify_one();
        }
    }

    /// Whether the entry an answer that writes nothing was decided on (its
    /// KV revision; `None` for an absent session) was still the key's
    /// latest at a quorum point after the call arrived: then the answer is
    /// linearizable at that point. A stale read (a deposed leader's, or this
    /// replica's cache) is not, and the call is decided again. A write by
    /// someone else after the point does not undo it (`Mirror::latest_at`),
    /// so a busy session does not send its no-op calls round and round.
    async fn confirmed(
        &self,
        id: &SessionId,
        read: Option<u64>,
        patience: &Patience,
    ) -> Result<bool, CoordError> {
        let point = self.quorum_point(patience.remaining()).await?;
        Ok(self.mirror.latest_at(id, point) == Some(read))
    }

    /// Writes `value` if the key is still at `expected`: the new revision,
    /// or `None` when another write came first. A transient failure is
    /// tried again with the same bytes and expectation; if an earlier try
    /// landed after all, the retry meets a conflict, and whether this write
    /// is what moved the key is read from the stream (`landed`).
    async fn write(
        &self,
        key: &str,
        value: &bytes::Bytes,
        expected: u64,
        patience: &mut Patience,
    ) -> Result<Option<u64>, CoordError> {
        if crate::shared::faults::unguarded_writes() {
            return self
                .kv
                .put(key, value.clone())
                .await
                .map(Some)
                .map_err(unavailable);
        }
        let mut tries = 0_u32;
        let written = patience
            .retry(&self.observed, StoreOp::Write, || {
                tries += 1;
                async {
                    #[cfg(test)]
                    if let Some(meanwhile) = self.take_lost_answer(key) {
                        return self
                            .land_and_lose_the_answer(key, value, expected, meanwhile)
                            .await;
                    }
                    self.kv
                        .update(key, value.clone(), expected)
                        .await
                        .map_err(|error| StoreFailure::of(&error))
                }
            })
            .await;
        match written {
            Ok(revision) => Ok(Some(revision)),
            Err(StoreFailure::Conflict) if tries > 1 => {
                match self.landed(key, expected, value, patience).await? {
                    Landed::At(revision) => Ok(Some(revision)),
                    Landed::No => Ok(None),
                }
            }
            Err(StoreFailure::Conflict) => Ok(None),
            Err(failure) => Err(failure.into_error()),
        }
    }

    /// Removes a forgotten session's entry if the key is still at
    /// `expected`: `false` on a conflict.
    async fn purge(
        &self,
        key: &str,
        expected: u64,
        patience: &mut Patience,
    ) -> Result<bool, CoordError> {
        let purged = patience
            .retry(&self.observed, StoreOp::Purge, || async {
                self.kv
                    .purge_expect_revision(key, Some(expected))
                    .await
                    .map_err(|error| StoreFailure::of(&error))
            })
            .await;
        match purged {
            Ok(()) => Ok(true),
            Err(StoreFailure::Conflict) => Ok(false),
            Err(failure) => Err(failure.into_error()),
        }
    }

    /// The one path every call that may change a session takes: the shared
    /// decision (`decision::decide`) under this replica's per-session lock,
    /// written with compare-and-set against the revision it was decided on
    /// (`compare_and_set`).
    async fn call(&self, id: &SessionId, call: &Call) -> Result<Decision, CoordError> {
        let _serialized = self.locks.lock(id).await;
        // The entry this replica last wrote saves the read: a write against
        // it that succeeds proves it was current. An answer that writes
        // nothing proves nothing by itself, so it stands only once confirmed
        // at a quorum point (`confirmed`), else it is decided again from a
        // fresh read.
        let cached = self.cache.take(id);
        let decision = self
            .compare_and_set(id, cached, self.patience(), |read| {
                self.decide_call(id, call, read)
            })
            .await?;
        self.count(call, &decision);
        Ok(decision)
    }

    /// One attempt of a call: the shared decision on what was read, and
    /// what it writes, if anything.
    fn decide_call(&self, id: &SessionId, call: &Call, read: Read) -> Step<Decision> {
        let stream_now = self.clock.now();
        let now = stream_now.unwrap_or_else(unix_millis);
        let read_revision = read.live_revision();
        let (expected, mut session, last_response, presence) = self.session_of(read, now);
        // Before the decision touches the session: due by the stored time.
        // Unlike GetState's (`decide_touch`), a call's touch is due on a
        // tombstone too, as it always was.
        let touch_due = session.touch_due(now, self.touch_interval);
        let nanos = Clock::unix_nanos();
        let stamp = Stamp {
            first_seq: 0,
            unix_nanos: nanos,
            new_response: mint(last_response, nanos),
        };
        let decision = match decision::decide(&mut session, presence, id, call, now) {
            Ok(decided) => decided.settle(stamp, 0),
            // A refusal (not found, terminated, full) is an answer that
            // writes nothing too.
            Err(refusal) => return Step::confirm(read_revision, Err(refusal)),
        };
        if !decision.changed() && !touch_due {
            return Step::confirm(read_revision, Ok(decision));
        }
        let last_response = match (&decision.effect, decision.reply) {
            (Effect::Changed { .. }, Outcome::Started { response, .. }) => response.get(),
            _ => last_response,
        };
        let entry = entry::Entry::written(session.persisted(), last_response, &decision, nanos);
        Step::Write {
            expected,
            entry,
            // Decided before this replica knew the stream's clock, the
            // entry holds a time of its own clock, which a later touch
            // check must not trust: the next call reads the stamped one.
            cache: stream_now.is_some(),
            answer: decision,
        }
    }

    /// The session a call is decided on, from what was read: the revision
    /// a write must expect, the session, the last response id it minted,
    /// and whether it is stored (or, absent, whether there is room for it).
    fn session_of(&self, read: Read, now: Millis) -> (u64, Session, u64, Presence) {
        match read {
            Read::Live { revision, entry } => {
                let mut session = Session::from_persisted(entry.persisted);
                session.remember_live_since(entry.unix_nanos);
                (revision, session, entry.last_response, Presence::Stored)
            }
            Read::Absent { revision } => {
                let max = self.config.max_sessions;
                let room = if self.mirror.session_count() >= max {
                    Room::Full { max }
                } else {
                    Room::Available
                };
                let presence = Presence::Absent { room };
                (revision, Session::new(now), 0, presence)
            }
        }
    }

    /// GetState's read, with the touch it counts as.
    async fn touch(&self, id: &SessionId) -> Result<SessionSnapshot, CoordError> {
        let _serialized = self.locks.lock(id).await;
        let patience = self.patience();
        self.quorum_point(patience.remaining()).await?;
        if let Some(known) = self.mirror.known(id) {
            let touch_due = known.phase != Phase::Terminated
                && session::touch_due(known.since, self.now(), self.touch_interval);
            if !touch_due {
                return Ok(known.snapshot(id));
            }
        }
        // A touch is due, or the mirror holds nothing (absent, or an entry
        // the follower could not read): the bucket decides. The touch is a
        // compare-and-set write, which validates its read.
        self.compare_and_set(id, None, patience, |read| self.decide_touch(id, read))
            .await
    }

    /// One attempt of GetState's touch on what was read.
    fn decide_touch(&self, id: &SessionId, read: Read) -> Step<SessionSnapshot> {
        let (revision, entry) = match read {
            Read::Live { revision, entry } => (revision, entry),
            Read::Absent { .. } => {
                return Step::confirm(None, Err(CoordError::SessionNotFound(id.clone())))
            }
        };
        let now = self.now();
        let mut session = Session::from_persisted(entry.persisted);
        let snapshot = session.snapshot(id);
        if session.is_terminated() || !session.touch_due(now, self.touch_interval) {
            // Someone touched it since the mirror's view; the read stands
            // only if confirmed, like any answer without a write.
            return Step::confirm(Some(revision), Ok(snapshot));
        }
        session.touch(now);
        let touched = entry::Entry {
            persisted: session.persisted(),
            events: Vec::new(),
            ..entry
        };
        Step::Write {
            expected: revision,
            entry: touched,
            cache: true,
            answer: snapshot,
        }
    }

    /// Reads (or takes `cached`, the entry this replica last wrote), has
    /// `decide` say what one attempt does with what was read, and carries
    /// that out (`Step`): a write with compare-and-set over the revision read
    /// (`write`, which knows a write whose answer was lost), or an answer
    /// that writes nothing once `confirmed`. A conflict or an unconfirmed
    /// answer goes round again from a fresh read, up to
    /// `timings::MAX_ATTEMPTS`.
    async fn compare_and_set<T>(
        &self,
        id: &SessionId,
        mut cached: Option<(u64, entry::Entry)>,
        mut patience: Patience,
        mut decide: impl FnMut(Read) -> Step<T>,
    ) -> Result<T, CoordError> {
        let key = entry::key(id);
        let (mut lost, mut unconfirmed) = (0_u32, 0_u32);
        for _ in 0..timings::MAX_ATTEMPTS {
            let read = match cached.take() {
                Some((revision, entry)) => Read::Live { revision, entry },
                None => self.read(id, &key, &mut patience).await?,
            };
            let rewritable = (unconfirmed > 0).then(|| read.rewritable()).flatten();
            match decide(read) {
                Step::Stands(answer) => return answer,
                Step::Confirm { read, answer } => match rewritable {
                    Some((revision, entry)) if read == Some(revision) => {
                        if self
                            .rewrite(id, &key, revision, entry, &mut patience)
                            .await?
                        {
                            return answer;
                        }
                        lost += 1;
                    }
                    _ => {
                        if self.confirmed(id, read, &patience).await? {
                            return answer;
                        }
                        unconfirmed += 1;
                    }
                },
                Step::Write {
                    expected,
                    entry,
                    cache,
                    answer,
                } => {
                    let value = entry.encode();
                    if let Some(revision) =
                        self.write(&key, &value, expected, &mut patience).await?
                    {
                        if cache {
                            self.cache.put(id, revision, entry);
                        } else {
                            self.cache.take(id);
                        }
                        return Ok(answer);
                    }
                    lost += 1;
                }
                Step::Purge { expected, answer } => {
                    if self.purge(&key, expected, &mut patience).await? {
                        self.cache.take(id);
                        tracing::debug!(session_id = %id, "forgot terminated session");
                        return Ok(answer);
                    }
                }
            }
        }
        tracing::debug!(session_id = %id, lost, unconfirmed, "contended: compare-and-sets lost, answers unconfirmed");
        Err(CoordError::Contended(id.clone()))
    }

    /// Confirms an answer that writes nothing by writing the entry it was
    /// decided on back unchanged (no events: as a touch), with
    /// compare-and-set over its revision: a write that lands proves that
    /// revision was the key's latest when it landed, within the call. Used
    /// once an answer went unconfirmed: on a session another replica writes
    /// every few milliseconds, a quorum point (a write, then the mirror
    /// catching up to it) nearly always comes after the next of those
    /// writes, and confirming that way went round until the call was
    /// answered "contended" (`respcoord-bench failover`, docs/cluster.md).
    /// `false` if another write came first. Two replicas rewriting one
    /// revision write the same bytes, so after a lost answer `landed` may
    /// take the other's rewrite for this one's: harmless, as the entry then
    /// stored is the one this answer was decided on, at a point within the
    /// call.
    async fn rewrite(
        &self,
        id: &SessionId,
        key: &str,
        revision: u64,
        entry: entry::Entry,
        patience: &mut Patience,
    ) -> Result<bool, CoordError> {
        let entry = entry::Entry {
            events: Vec::new(),
            ..entry
        };
        match self.write(key, &entry.encode(), revision, patience).await? {
            Some(written) => {
                self.cache.put(id, written, entry);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn count(&self, call: &Call, decision: &Decision) {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(call, decision);
    }
}
