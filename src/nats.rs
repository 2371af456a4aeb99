//! The NATS JetStream backend: any number of coordinator replicas share one
//! key-value bucket, which is the authority; no replica holds state another
//! needs, so any may die or roll at any time.
//!
//! A call on a session: take this replica's local lock for the session (calls
//! on one session within a replica queue here instead of fighting over
//! compare-and-set), read the session's entry from the stream leader, run the
//! pure record and machine (`session::Session::apply_stamped`, the same code
//! the memory backend runs), and write the new entry with compare-and-set on
//! the revision that was read. A conflict (another replica wrote first, or
//! the read was stale) costs one retry; nothing is written twice. The entry
//! carries the new state and the transition's events (`entry`), so the reply
//! is sent only once both are durable in the bucket.
//!
//! Watches are served from every replica's mirror of the bucket (`mirror`);
//! session watches read their backlog from the key's history in the bucket.
//! Expiry runs on the one replica holding the expirer lease (`expiry`), and is
//! decided per session by the same pure check inside the same compare-and-set
//! path, so even two expirers at once could not expire a session twice.
//!
//! See `docs/cluster.md` for the consistency each call gets and what each
//! failure does.

#[cfg(test)]
mod call_tests;
mod entry;
mod expiry;
mod mirror;
#[cfg(test)]
mod watch_tests;

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, PoisonError},
    time::Duration,
};

use async_nats::jetstream::{
    self,
    kv::{self, Operation, UpdateErrorKind},
    stream::{DiscardPolicy, StorageType},
};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::{
    decision::{self, Changed, Decision, ExpiryDecision, Presence, Reply, Room, Stamp, Started},
    error::CoordError,
    events::{EventLog, LogLimits, Scope, Subscription},
    ids::{RequestId, ResponseId, SessionId, SessionScope},
    machine::{FinishStatus, Phase, Source, TeardownReason},
    nats::mirror::Mirror,
    session::{Call, Millis, Session, SessionSnapshot, Ttls},
    shared::{Clock, PageToken, RegistryConfig, SessionPage},
    stats::CoordStats,
    sync::Mutex,
};

/// How to reach and lay out the bucket.
#[derive(Clone, Debug)]
pub struct NatsSettings {
    /// `nats://host:port`, comma-separated for several seed servers.
    pub url: String,
    pub bucket: String,
    /// JetStream replicas of the bucket's stream (1, 3 or 5).
    pub replicas: usize,
    /// Entries kept per session key: the window for Watch `after_revision`
    /// resume, in transitions (at most 64, JetStream's per-key cap).
    pub history: u8,
    /// Longest a single JetStream request may take before the call is
    /// answered UNAVAILABLE.
    pub request_timeout: Duration,
    /// Keep the bucket in memory instead of on disk (when this process
    /// creates it): faster, and lost if every NATS node restarts at once.
    pub memory_storage: bool,
    /// Drop stored messages older than this (when this process creates the
    /// bucket); zero keeps them. Reclaims the purge markers forgotten
    /// sessions leave behind. It must exceed the idle TTL plus the tombstone
    /// TTL by a margin, or a live session's entry could age out.
    pub max_age: Duration,
}

impl Default for NatsSettings {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            bucket: "respcoord".into(),
            replicas: 1,
            history: 16,
            request_timeout: Duration::from_secs(2),
            memory_storage: false,
            max_age: Duration::ZERO,
        }
    }
}

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("bucket {bucket:?}: {reason}")]
    Bucket { bucket: String, reason: String },
    #[error("reading bucket {bucket:?} at startup: {reason}")]
    Load { bucket: String, reason: String },
}

/// Compare-and-set attempts per call before it is answered ABORTED.
const MAX_ATTEMPTS: usize = 32;

/// Longest ListSessions waits for this replica's mirror to reach the
/// bucket's last write before answering UNAVAILABLE.
const LIST_CATCH_UP: Duration = Duration::from_secs(10);

/// Entries this replica remembers having written (see `EntryCache`).
const ENTRY_CACHE_CAPACITY: usize = 65_536;

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
    config: RegistryConfig,
    /// TTLs as the pure expiry check applies them: the idle TTL plus the
    /// touch interval (see `touch_interval`), so a session whose last touch
    /// was not written never expires early.
    ttls: Ttls,
    touch_interval: Millis,
    /// Transitions this replica applied, for the metrics.
    stats: Mutex<CoordStats>,
    /// Names this replica in the expirer lease.
    replica: String,
    follower: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.follower.cancel();
    }
}

fn seed_servers(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|seed| !seed.is_empty())
        .collect()
}

/// Wall-clock milliseconds: the NATS backend's session deadlines must mean
/// the same on every replica, so they are wall time, not a process's
/// monotonic clock.
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

fn millis(duration: Duration) -> Millis {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
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

impl NatsCoordinator {
    /// Connects, creates the bucket if it does not exist, loads the mirror
    /// and starts following the bucket.
    pub async fn connect(
        settings: &NatsSettings,
        config: RegistryConfig,
    ) -> Result<Self, NatsError> {
        let client = async_nats::ConnectOptions::new()
            .name("respcoord")
            .connection_timeout(settings.request_timeout.max(Duration::from_secs(1)))
            .request_timeout(Some(settings.request_timeout))
            // A comma-separated list of seeds: the client fails over among
            // them (and learns the rest of the cluster from the servers).
            .connect(seed_servers(&settings.url))
            .await
            .map_err(|e| NatsError::Connect {
                url: settings.url.clone(),
                reason: e.to_string(),
            })?;
        let server_version = client.server_info().version;
        let mut js = jetstream::new(client);
        js.set_timeout(settings.request_timeout);
        let bucket_error = |reason: String| NatsError::Bucket {
            bucket: settings.bucket.clone(),
            reason,
        };
        check_replication(settings.replicas, &server_version).map_err(bucket_error)?;
        let stream = ensure_bucket(&js, settings).await.map_err(bucket_error)?;
        check_replication(stream.cached_info().config.num_replicas, &server_version)
            .map_err(bucket_error)?;
        let kv = js
            .get_key_value(settings.bucket.as_str())
            .await
            .map_err(|e| bucket_error(e.to_string()))?;
        let subject_prefix = format!("$KV.{}.", settings.bucket);
        let state = mirror::load(&stream, &subject_prefix)
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
        tokio::spawn(mirror::follow(
            stream.clone(),
            Arc::clone(&mirror),
            subject_prefix,
            follower.clone(),
        ));
        let touch_interval = (millis(config.idle_ttl) / 8).clamp(1, 60_000);
        Ok(Self {
            inner: Arc::new(Inner {
                kv,
                stream,
                mirror,
                locks: KeyedLocks::new(config.shards),
                cache: EntryCache::new(config.shards, ENTRY_CACHE_CAPACITY),
                ttls: Ttls {
                    idle: millis(config.idle_ttl).saturating_add(touch_interval),
                    tombstone: millis(config.tombstone_ttl),
                },
                touch_interval,
                config,
                stats: Mutex::default(),
                replica: format!(
                    "{:016x}",
                    Clock::unix_nanos() as u64 ^ u64::from(std::process::id())
                ),
                follower,
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
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        let call = Call::Cancel { only_if };
        Ok(self.inner.call(id, &call).await?.cancelled())
    }

    pub async fn shutdown(
        &self,
        id: &SessionId,
    ) -> Result<Changed<Option<ResponseId>>, CoordError> {
        let call = Call::Teardown {
            reason: TeardownReason::Shutdown,
        };
        Ok(self.inner.call(id, &call).await?.cancelled())
    }

    /// GetState: read from the stream leader, so it sees every acknowledged
    /// write. Counts as a call for idle expiry (a touch is written when the
    /// stored one is older than the touch interval).
    pub async fn state(&self, id: &SessionId) -> Result<SessionSnapshot, CoordError> {
        self.inner.touch(id).await
    }

    /// ListSessions from this replica's mirror, after it has caught up with
    /// everything the bucket held when the call arrived (so a client sees
    /// its own acknowledged writes), in session id order.
    pub async fn list(
        &self,
        scope: &SessionScope,
        page_size: usize,
        after: Option<SessionId>,
    ) -> Result<SessionPage, CoordError> {
        let info = self.inner.stream.get_info().await.map_err(unavailable)?;
        let target = info.state.last_sequence;
        tokio::time::timeout(LIST_CATCH_UP, self.inner.mirror.caught_up_to(target))
            .await
            .map_err(|_| unavailable("this replica's view of the bucket is behind; retry"))?;
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
        self.watch_session_stepwise(id, after_revision, std::future::ready(()))
            .await
    }

    /// [`NatsCoordinator::watch_session`], awaiting `between` after the
    /// entry is read and before the key's history is fetched. Writes that
    /// land there are in the backlog and arrive live as well; the tests
    /// (`nats/watch_tests.rs`) write there to prove they come once.
    async fn watch_session_stepwise(
        &self,
        id: &SessionId,
        after_revision: Option<u64>,
        between: impl std::future::Future<Output = ()>,
    ) -> Result<Subscription, CoordError> {
        // Opening a watch is a call naming the session (idle expiry counts
        // it, as the memory backend does); keeping it open is not.
        match self.inner.touch(id).await {
            Ok(_) | Err(CoordError::SessionNotFound(_)) => {}
            Err(error) => return Err(error),
        }
        let (live, release) = self.inner.mirror.subscribe_session(id);
        let key = entry::key(id);
        let read = self.inner.read(id, &key).await?;
        let (current, terminated) = match &read {
            Read::Live { entry, .. } => (
                entry.persisted.revision,
                entry.persisted.phase == Phase::Terminated,
            ),
            Read::Absent { .. } => (0, false),
        };
        between.await;
        // Fetched after the read, so it may hold revisions above `current`
        // that also arrive live: the subscription skips live events through
        // the backlog's last revision, not through `current`.
        let backlog = match after_revision {
            Some(after) if after < current => self.inner.history_after(id, &key, after).await?,
            _ => VecDeque::new(),
        };
        Ok(self.inner.mirror.session_subscription(
            backlog,
            live,
            release,
            Scope::session(after_revision, current),
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
        self.watch_all_stepwise(scope, after_seq, std::future::ready(()))
            .await
    }

    /// [`NatsCoordinator::watch_all`], awaiting `between` after the bucket's
    /// last sequence is read and before the watch subscribes to the mirror:
    /// the tests (`nats/watch_tests.rs`) write there.
    async fn watch_all_stepwise(
        &self,
        scope: &SessionScope,
        after_seq: Option<u64>,
        between: impl std::future::Future<Output = ()>,
    ) -> Result<Subscription, CoordError> {
        let from = match after_seq {
            Some(after) => after,
            None => {
                let info = self.inner.stream.get_info().await.map_err(unavailable)?;
                entry::last_seq_of_write(info.state.last_sequence)
            }
        };
        between.await;
        // The mirror's backlog and live stream are taken under the event
        // log's lock, so this handover cannot repeat an event (and it uses
        // the same rule as every other watch, `Scope::after_backlog`).
        self.inner.mirror.watch_all(scope, Some(from))
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

/// The first nats-server that serializes compare-and-set
/// (`Nats-Expected-Last-Subject-Sequence`) across a clustered stream: before
/// it, two writes computed from the same revision could both be accepted on
/// a replicated bucket (nats-io/nats-server#4320, fixed in 2.9.21), which
/// would let two replicas apply the same transition.
const REPLICATED_CAS_SINCE: (u64, u64, u64) = (2, 9, 21);

/// Refuses a replicated bucket on a server whose compare-and-set is not
/// serializable there. A single-replica bucket is safe on any 2.9.
fn check_replication(replicas: usize, server_version: &str) -> Result<(), String> {
    if replicas <= 1 {
        return Ok(());
    }
    let mut parts = server_version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let version = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    if version >= REPLICATED_CAS_SINCE {
        return Ok(());
    }
    let (major, minor, patch) = REPLICATED_CAS_SINCE;
    Err(format!(
        "a replicated bucket (R{replicas}) needs nats-server {major}.{minor}.{patch} or newer: \
         {server_version} does not serialize compare-and-set on a clustered stream \
         (nats-io/nats-server#4320), so two writes of one session could both land; \
         upgrade NATS or use --nats-replicas 1"
    ))
}

/// Creates the bucket's stream if it does not exist, with direct gets off so
/// every read goes to the stream leader (a follower may lag, and a stale read
/// would show a caller a state older than its own acknowledged write).
async fn ensure_bucket(
    js: &jetstream::Context,
    settings: &NatsSettings,
) -> Result<jetstream::stream::Stream, String> {
    let name = format!("KV_{}", settings.bucket);
    if let Ok(stream) = js.get_stream(&name).await {
        if stream.cached_info().config.allow_direct {
            tracing::warn!(bucket = %settings.bucket, "bucket allows direct gets: GetState may be served by a lagging replica");
        }
        return Ok(stream);
    }
    let config = jetstream::stream::Config {
        name,
        description: Some("respcoord sessions (one entry per session)".into()),
        subjects: vec![format!("$KV.{}.>", settings.bucket)],
        max_messages_per_subject: i64::from(settings.history.clamp(1, 64)),
        storage: if settings.memory_storage {
            StorageType::Memory
        } else {
            StorageType::File
        },
        num_replicas: settings.replicas.max(1),
        discard: DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: false,
        max_age: settings.max_age,
        ..Default::default()
    };
    match js.create_stream(config).await {
        Ok(stream) => Ok(stream),
        // Another replica created it first.
        Err(error) => js
            .get_stream(format!("KV_{}", settings.bucket))
            .await
            .map_err(|_| error.to_string()),
    }
}

impl Inner {
    async fn read(&self, id: &SessionId, key: &str) -> Result<Read, CoordError> {
        match self.kv.entry(key).await.map_err(unavailable)? {
            None => Ok(Read::Absent { revision: 0 }),
            Some(stored) if stored.operation != Operation::Put => Ok(Read::Absent {
                revision: stored.revision,
            }),
            Some(stored) => match entry::decode(&stored.value) {
                Ok(entry) => Ok(Read::Live {
                    revision: stored.revision,
                    entry,
                }),
                Err(error) => Err(CoordError::Unreadable {
                    session: id.clone(),
                    reason: error.to_string(),
                }),
            },
        }
    }

    /// Writes `value` if the key is still at `expected`: the new revision,
    /// or `None` on a conflict.
    async fn write(
        &self,
        key: &str,
        value: bytes::Bytes,
        expected: u64,
    ) -> Result<Option<u64>, CoordError> {
        match self.kv.update(key, value, expected).await {
            Ok(revision) => Ok(Some(revision)),
            Err(error) if error.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(error) => Err(unavailable(error)),
        }
    }

    /// The one path every call that may change a session takes: the shared
    /// decision (`decision::decide`) under this replica's per-session lock,
    /// written with compare-and-set against the revision it was decided on.
    async fn call(&self, id: &SessionId, call: &Call) -> Result<Decision, CoordError> {
        let _serialized = self.locks.lock(id).await;
        let key = entry::key(id);
        // The entry this replica last wrote saves the read: a write against
        // it that succeeds proves it was current. An answer that writes
        // nothing proves nothing, so it is always recomputed from a fresh read.
        let mut cached = self.cache.take(id);
        for _ in 0..MAX_ATTEMPTS {
            let now = unix_millis();
            let from_cache = cached.is_some();
            let read = match cached.take() {
                Some((revision, entry)) => Read::Live { revision, entry },
                None => self.read(id, &key).await?,
            };
            let (expected, mut session, last_response, stored_since, presence) = match read {
                Read::Live { revision, entry } => {
                    let since = entry.persisted.since;
                    let session = Session::from_persisted(entry.persisted);
                    let presence = Presence::Stored;
                    (
                        revision,
                        session,
                        entry.last_response,
                        Some(since),
                        presence,
                    )
                }
                Read::Absent { revision } => {
                    let max = self.config.max_sessions;
                    let room = if self.mirror.session_count() >= max {
                        Room::Full { max }
                    } else {
                        Room::Available
                    };
                    let presence = Presence::Absent { room };
                    (revision, Session::new(now), 0, None, presence)
                }
            };
            let nanos = Clock::unix_nanos();
            let stamp = || Stamp {
                first_seq: 0,
                unix_nanos: nanos,
                new_response: mint(last_response, nanos),
            };
            let decision = decision::decide(&mut session, presence, id, call, now, stamp, 0)?;
            let last_response = match decision.reply {
                Reply::Started {
                    response,
                    replayed: false,
                    ..
                } => response.get(),
                _ => last_response,
            };
            let touch_due =
                stored_since.is_some_and(|since| now.saturating_sub(since) >= self.touch_interval);
            if !decision.changed() && !touch_due {
                if from_cache {
                    continue;
                }
                self.count(call, &decision);
                return Ok(decision);
            }
            let persisted = session.persisted();
            let kinds = decision.change.kinds.to_vec();
            let value = entry::encode(&persisted, last_response, &kinds, nanos);
            if let Some(revision) = self.write(&key, value, expected).await? {
                let written = entry::Entry {
                    persisted,
                    last_response,
                    events: kinds,
                    unix_nanos: nanos,
                };
                self.cache.put(id, revision, written);
                self.count(call, &decision);
                return Ok(decision);
            }
        }
        Err(CoordError::Contended(id.clone()))
    }

    /// GetState's read, with the touch it counts as.
    async fn touch(&self, id: &SessionId) -> Result<SessionSnapshot, CoordError> {
        let _serialized = self.locks.lock(id).await;
        let key = entry::key(id);
        for _ in 0..MAX_ATTEMPTS {
            let (revision, entry) = match self.read(id, &key).await? {
                Read::Live { revision, entry } => (revision, entry),
                Read::Absent { .. } => return Err(CoordError::SessionNotFound(id.clone())),
            };
            let now = unix_millis();
            let touch_due = entry.persisted.phase != Phase::Terminated
                && now.saturating_sub(entry.persisted.since) >= self.touch_interval;
            let mut session = Session::from_persisted(entry.persisted);
            let snapshot = session.snapshot(id);
            if !touch_due {
                return Ok(snapshot);
            }
            session.touch(now);
            let persisted = session.persisted();
            let value = entry::encode(&persisted, entry.last_response, &[], entry.unix_nanos);
            if let Some(revision) = self.write(&key, value, revision).await? {
                let touched = entry::Entry {
                    persisted,
                    last_response: entry.last_response,
                    events: Vec::new(),
                    unix_nanos: entry.unix_nanos,
                };
                self.cache.put(id, revision, touched);
                return Ok(snapshot);
            }
        }
        Err(CoordError::Contended(id.clone()))
    }

    /// Expires or forgets `id` if, read fresh from the bucket, it is due
    /// (the shared expiry decision, `decision::decide_expiry`).
    async fn expire(&self, id: &SessionId) -> Result<(), CoordError> {
        let _serialized = self.locks.lock(id).await;
        let key = entry::key(id);
        for _ in 0..MAX_ATTEMPTS {
            let (revision, entry) = match self.read(id, &key).await? {
                Read::Live { revision, entry } => (revision, entry),
                Read::Absent { .. } => return Ok(()),
            };
            let now = unix_millis();
            let nanos = Clock::unix_nanos();
            let stamp = || Stamp {
                first_seq: 0,
                unix_nanos: nanos,
                // A teardown starts nothing.
                new_response: ResponseId::MIN,
            };
            let mut session = Session::from_persisted(entry.persisted);
            match decision::decide_expiry(&mut session, id, now, self.ttls, stamp, 0) {
                ExpiryDecision::NotDue { .. } => return Ok(()),
                ExpiryDecision::Forget => {
                    match self.kv.purge_expect_revision(&key, Some(revision)).await {
                        Ok(()) => {
                            self.cache.take(id);
                            tracing::debug!(session_id = %id, "forgot terminated session");
                            return Ok(());
                        }
                        Err(error) if error.kind() == UpdateErrorKind::WrongLastRevision => {
                            continue
                        }
                        Err(error) => return Err(unavailable(error)),
                    }
                }
                ExpiryDecision::Expired { decision, .. } => {
                    let value = entry::encode(
                        &session.persisted(),
                        entry.last_response,
                        &decision.change.kinds,
                        nanos,
                    );
                    if self.write(&key, value, revision).await?.is_some() {
                        self.cache.take(id);
                        self.count(&decision::EXPIRY, &decision);
                        return Ok(());
                    }
                }
            }
        }
        Err(CoordError::Contended(id.clone()))
    }

    /// The session's events with revision above `after` from the key's
    /// history in the bucket, or OUT_OF_RANGE when they are no longer there.
    async fn history_after(
        &self,
        id: &SessionId,
        key: &str,
        after: u64,
    ) -> Result<VecDeque<crate::events::SharedEvent>, CoordError> {
        let mut history = self.kv.history(key).await.map_err(unavailable)?;
        let mut events: Vec<crate::events::SharedEvent> = Vec::new();
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

    fn count(&self, call: &Call, decision: &Decision) {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(call, decision);
    }
}

type LockShard = HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>;

/// Per-session async locks, so calls on one session within this replica run
/// one at a time (they would only fight over compare-and-set otherwise).
/// An entry exists only while some call holds or waits for it.
struct KeyedLocks {
    shards: Box<[Mutex<LockShard>]>,
}

struct KeyedGuard<'a> {
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
    fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, id: &SessionId) -> crate::sync::MutexGuard<'_, LockShard> {
        self.shards[shard_of(id, self.shards.len())]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn lock(&self, id: &SessionId) -> KeyedGuard<'_> {
        let lock = Arc::clone(self.shard(id).entry(id.clone()).or_default());
        let guard = lock.lock_owned().await;
        KeyedGuard {
            locks: self,
            id: id.clone(),
            guard: Some(guard),
        }
    }
}

/// The entries this replica wrote last, by session: a call that finds its
/// session here writes against the cached revision without reading first
/// (one round trip instead of two); if another replica wrote meanwhile the
/// compare-and-set fails and the call reads fresh. Bounded: beyond capacity
/// an arbitrary entry is dropped, which costs only a read later.
/// Session -> (revision, entry) this replica wrote.
type CacheShard = HashMap<SessionId, (u64, entry::Entry)>;

struct EntryCache {
    shards: Box<[Mutex<CacheShard>]>,
    per_shard: usize,
}

impl EntryCache {
    fn new(shards: usize, capacity: usize) -> Self {
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

    fn take(&self, id: &SessionId) -> Option<(u64, entry::Entry)> {
        self.shard(id).remove(id)
    }

    fn put(&self, id: &SessionId, revision: u64, entry: entry::Entry) {
        let mut shard = self.shard(id);
        if shard.len() >= self.per_shard {
            if let Some(evicted) = shard.keys().next().cloned() {
                shard.remove(&evicted);
            }
        }
        shard.insert(id.clone(), (revision, entry));
    }
}

/// The shard of the per-session locks and the entry cache. Fixed-seeded:
/// both tables must agree for the process's life, and they are bounded by
/// calls in flight and the cache capacity, not by client choice of ids.
fn shard_of(id: &SessionId, shards: usize) -> usize {
    use std::hash::BuildHasher;
    let hash = foldhash::fast::FixedState::default().hash_one(id.as_str());
    (hash % shards as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::check_replication;

    #[test]
    fn replicated_buckets_need_a_server_with_serializable_compare_and_set() {
        assert!(check_replication(1, "2.9.10").is_ok());
        assert!(check_replication(3, "2.9.21").is_ok());
        assert!(check_replication(3, "2.10.26").is_ok());
        assert!(check_replication(5, "2.11.0-beta.1").is_ok());
        let refused = check_replication(3, "2.9.10").unwrap_err();
        assert!(
            refused.contains("4320") && refused.contains("2.9.21"),
            "{refused}"
        );
        assert!(check_replication(3, "garbage").is_err());
    }
}
