//! What both backends share, so neither imports the other: the tunables,
//! the clock, and the listing's page and tokens. `backend` is the only
//! module that names both backends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};

use crate::{
    ids::SessionId,
    session::{Millis, SessionSnapshot},
};

/// Tunables of a coordinator, either backend; see `config` for the flags
/// that set them.
#[derive(Clone, Copy, Debug)]
pub struct CoordConfig {
    pub shards: usize,
    pub max_sessions: usize,
    pub idle_ttl: Duration,
    pub tombstone_ttl: Duration,
    /// Events kept per session for `after_revision` resume.
    pub session_history: usize,
    /// Events kept coordinator-wide for `after_seq` resume.
    pub global_history: usize,
    /// Events a session watcher may trail by before it is ended.
    pub session_watch_buffer: usize,
    /// Events a watch-all watcher may trail by before it is ended.
    pub watch_all_buffer: usize,
}

impl Default for CoordConfig {
    fn default() -> Self {
        Self {
            // 1M sessions (the default limit) over 96 shards is 10.4k per
            // shard's table: 16,384 buckets at 64 % load. With 64 shards,
            // 15.6k each is just past what 16,384 buckets hold, so every
            // table doubles to 48 % load: 50 bytes more per session
            // (docs/performance.md).
            shards: 96,
            max_sessions: 1_000_000,
            idle_ttl: Duration::from_secs(3600),
            tombstone_ttl: Duration::from_secs(600),
            session_history: 64,
            global_history: 65_536,
            session_watch_buffer: 256,
            watch_all_buffer: 16_384,
        }
    }
}

/// The coordinator's clock: monotonic milliseconds for deadlines (tokio's
/// clock, so tests can pause and advance it) and wall time for event stamps.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: tokio::time::Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> Millis {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn instant_at(&self, at: Millis) -> tokio::time::Instant {
        self.origin + Duration::from_millis(at)
    }

    /// Wall time for event stamps (and the NATS backend's deadlines).
    pub(crate) fn unix_nanos() -> i64 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        nanos.saturating_add(faults::clock_offset_nanos())
    }
}

/// Faults a test build injects into a real process (feature
/// `fault-injection`, tests/faults.rs): a replica whose wall clock runs
/// ahead or behind, a backend whose compare-and-set guard is off, or one that
/// answers unconfirmed reads or times expiry by replica clocks (the broken
/// builds the checks must catch). Read once from the environment;
/// a build without the feature has none of it.
#[cfg(feature = "fault-injection")]
pub(crate) mod faults {
    use std::sync::OnceLock;

    /// `RESPCOORD_FAULT_CLOCK_OFFSET_MS`: added to every wall-clock reading.
    pub(crate) fn clock_offset_nanos() -> i64 {
        static OFFSET: OnceLock<i64> = OnceLock::new();
        *OFFSET.get_or_init(|| {
            std::env::var("RESPCOORD_FAULT_CLOCK_OFFSET_MS")
                .ok()
                .and_then(|ms| ms.trim().parse::<i64>().ok())
                .map_or(0, |ms| ms.saturating_mul(1_000_000))
        })
    }

    /// `RESPCOORD_FAULT_UNGUARDED_WRITES=1`: the NATS backend writes without
    /// compare-and-set (last writer wins).
    pub(crate) fn unguarded_writes() -> bool {
        static UNGUARDED: OnceLock<bool> = OnceLock::new();
        *UNGUARDED.get_or_init(|| {
            std::env::var("RESPCOORD_FAULT_UNGUARDED_WRITES").is_ok_and(|v| v == "1")
        })
    }

    /// `RESPCOORD_FAULT_UNCONFIRMED_READS=1`: the NATS backend answers what
    /// it read without a quorum point, so a deposed stream leader's stale
    /// read can be answered: a broken build the fault runs must catch.
    pub(crate) fn unconfirmed_reads() -> bool {
        static UNCONFIRMED: OnceLock<bool> = OnceLock::new();
        *UNCONFIRMED.get_or_init(|| {
            std::env::var("RESPCOORD_FAULT_UNCONFIRMED_READS").is_ok_and(|v| v == "1")
        })
    }

    /// `RESPCOORD_FAULT_REPLICA_CLOCK_EXPIRY=1`: the NATS backend times
    /// idleness and expiry by each replica's wall clock, not the stream's
    /// stamps, so skewed replica clocks expire sessions early: a broken
    /// build the fault runs must catch.
    pub(crate) fn replica_clock_expiry() -> bool {
        static REPLICA_CLOCK: OnceLock<bool> = OnceLock::new();
        *REPLICA_CLOCK.get_or_init(|| {
            std::env::var("RESPCOORD_FAULT_REPLICA_CLOCK_EXPIRY").is_ok_and(|v| v == "1")
        })
    }
}

#[cfg(not(feature = "fault-injection"))]
pub(crate) mod faults {
    pub(crate) const fn clock_offset_nanos() -> i64 {
        0
    }

    pub(crate) const fn unguarded_writes() -> bool {
        false
    }

    pub(crate) const fn unconfirmed_reads() -> bool {
        false
    }

    pub(crate) const fn replica_clock_expiry() -> bool {
        false
    }
}

/// One page of ListSessions, whichever backend listed it.
#[derive(Clone, Debug)]
pub struct SessionPage {
    pub sessions: Vec<SessionSnapshot>,
    pub next: Option<PageToken>,
    /// Every event with seq at or below this is reflected in `sessions`.
    pub seq: u64,
}

/// Where a listing resumes. The memory registry lists in its own hash order
/// (tokens bind to the instance); the NATS backend lists in id order, so its
/// tokens are good on every replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageToken {
    Registry(PageCursor),
    AfterId(SessionId),
}

const AFTER_ID_TAG: &str = "n1\0";

impl PageToken {
    /// The opaque `page_token` form.
    pub fn encode(&self) -> String {
        match self {
            PageToken::Registry(cursor) => cursor.encode(),
            PageToken::AfterId(id) => URL_SAFE_NO_PAD.encode(format!("{AFTER_ID_TAG}{id}")),
        }
    }

    /// Parses a `page_token`; the error is the reason it was refused.
    pub fn decode(token: &str) -> Result<Self, &'static str> {
        let after_id = URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|raw| String::from_utf8(raw).ok())
            .and_then(|raw| raw.strip_prefix(AFTER_ID_TAG).map(str::to_owned));
        match after_id {
            Some(id) => SessionId::parse(&id)
                .map(PageToken::AfterId)
                .map_err(|_| "is not a token this coordinator issued"),
            None => PageCursor::decode(token).map(PageToken::Registry),
        }
    }
}

/// Where a listing resumes. Sessions are listed shard by shard, and within a
/// shard in order of (hash of the id, id): a session never changes shard or
/// hash, so one that exists for the whole listing is listed exactly once
/// however others come and go. The hash is this process's, so a token names
/// the coordinator instance that issued it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageCursor {
    pub(crate) instance: u64,
    pub(crate) shard_count: usize,
    pub(crate) shard: usize,
    pub(crate) after: Option<(u64, SessionId)>,
}

impl PageCursor {
    /// The opaque `page_token` form.
    pub fn encode(&self) -> String {
        let (hash, id) = match &self.after {
            Some((hash, id)) => (hash.to_string(), id.as_str()),
            None => (String::new(), ""),
        };
        let raw = format!(
            "v2\0{}\0{}\0{}\0{hash}\0{id}",
            self.instance, self.shard_count, self.shard
        );
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Parses a `page_token`; the error is the reason it was refused.
    pub fn decode(token: &str) -> Result<Self, &'static str> {
        const BAD: &str = "is not a token this coordinator issued";
        let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| BAD)?;
        let raw = String::from_utf8(raw).map_err(|_| BAD)?;
        let mut parts = raw.splitn(6, '\0');
        if parts.next() != Some("v2") {
            return Err(BAD);
        }
        let mut number = || -> Result<u64, &'static str> {
            parts.next().and_then(|p| p.parse().ok()).ok_or(BAD)
        };
        let instance = number()?;
        let shard_count = usize::try_from(number()?).map_err(|_| BAD)?;
        let shard = usize::try_from(number()?).map_err(|_| BAD)?;
        let after = match (parts.next(), parts.next()) {
            (Some(""), Some("")) => None,
            (Some(hash), Some(id)) => Some((
                hash.parse().map_err(|_| BAD)?,
                SessionId::parse(id).map_err(|_| BAD)?,
            )),
            _ => return Err(BAD),
        };
        if shard >= shard_count {
            return Err(BAD);
        }
        Ok(Self {
            instance,
            shard_count,
            shard,
            after,
        })
    }
}
