//! What the NATS backend counts for the metrics (`crate::metrics`): its
//! store requests (round trips, transient failures retried, lost
//! compare-and-sets), its connection (state, reconnects, lame-duck
//! notices), its follower (restarts, how far it trails the stream) and the
//! expiry lease. Atomics only, so counting takes no lock on the call path;
//! the metrics read them when a reader collects ([`NatsCoordinator::nats_stats`]).
//!
//! Every store request of a call or of expiry goes through
//! `Patience::retry` (`failure`), which reports each round trip, retry and
//! conflict here (the lease, a watch's history and the follower's reads
//! are not counted as store requests); the connection reports
//! through async-nats' event callback (`setup`), the follower and the
//! expirer where they restart and renew.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        OnceLock,
    },
    time::Duration,
};

use opentelemetry::{metrics::Histogram, KeyValue};

use super::NatsCoordinator;

/// A kind of store request: the `op` label of the store latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StoreOp {
    /// A session's entry read from the stream leader.
    Read,
    /// A compare-and-set write of a session's entry.
    Write,
    /// A compare-and-set purge of a forgotten session.
    Purge,
    /// A quorum point (`Inner::quorum_point`).
    QuorumPoint,
}

impl StoreOp {
    fn as_str(self) -> &'static str {
        match self {
            StoreOp::Read => "read",
            StoreOp::Write => "write",
            StoreOp::Purge => "purge",
            StoreOp::QuorumPoint => "quorum_point",
        }
    }
}

/// Why a store request was tried again: the `reason` label of the retries,
/// indexed like [`RETRY_REASONS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RetryReason {
    /// A stream leader still applying its log (10163), or JetStream without
    /// a settled cluster (10008).
    NotReady,
    /// No stream leader answered (a publish reports it as "no stream found").
    NoResponders,
    /// The request got no answer within `--nats-timeout`.
    Timeout,
    /// Any other transient failure (a broken connection).
    Other,
    /// A turnover (`turnover`) while the request was in flight: the stream
    /// leader moved or the connection broke, so its answer may never come.
    Moved,
}

/// Retry reasons as the metrics name them.
pub const RETRY_REASONS: [&str; 5] = ["not_ready", "no_responders", "timeout", "other", "moved"];

impl RetryReason {
    fn index(self) -> usize {
        self as usize
    }
}

/// The counters, shared by a replica's call path, connection, follower and
/// expirer.
#[derive(Debug, Default)]
pub(super) struct NatsStats {
    conflicts: AtomicU64,
    retries: [AtomicU64; 5],
    connected: AtomicBool,
    /// Connections made, the first one included.
    connects: AtomicU64,
    lame_duck: AtomicU64,
    follower_restarts: AtomicU64,
    lease_held: AtomicBool,
    /// The highest stream sequence this replica knows the stream to have
    /// reached: the follower's deliveries (a message's sequence plus the
    /// messages still pending behind it) and the quorum points.
    stream_seq_seen: AtomicU64,
    /// Where store round trips are recorded, once a metrics pipeline exists.
    latency: OnceLock<Histogram<f64>>,
}

/// A reading of the NATS backend's counters, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatsCounts {
    /// Compare-and-set writes and purges that found the key moved on.
    pub cas_conflicts: u64,
    /// Store requests tried again after a transient failure, indexed like
    /// [`RETRY_REASONS`].
    pub store_retries: [u64; 5],
    pub connected: bool,
    /// Connections made after the first.
    pub reconnects: u64,
    /// Lame-duck notices: a server about to shut down told us to move.
    pub lame_duck_events: u64,
    pub follower_restarts: u64,
    /// Stream sequences between the last this replica knows the stream
    /// reached and the last its mirror applied.
    pub follower_lag: u64,
    pub expiry_lease_held: bool,
}

impl NatsStats {
    /// One store request answered (or failed) after `elapsed`.
    pub(super) fn round_trip(&self, op: StoreOp, elapsed: Duration) {
        if let Some(histogram) = self.latency.get() {
            histogram.record(elapsed.as_secs_f64(), &[KeyValue::new("op", op.as_str())]);
        }
    }

    pub(super) fn retried(&self, reason: RetryReason) {
        self.retries[reason.index()].fetch_add(1, Relaxed);
    }

    pub(super) fn conflict(&self) {
        self.conflicts.fetch_add(1, Relaxed);
    }

    /// What async-nats reports about the connection. Events arrive in order
    /// from one task, so the last one sets the state.
    pub(super) fn connection(&self, event: &async_nats::Event) {
        match event {
            async_nats::Event::Connected => {
                self.connects.fetch_add(1, Relaxed);
                self.connected.store(true, Relaxed);
            }
            async_nats::Event::Disconnected | async_nats::Event::Closed => {
                self.connected.store(false, Relaxed);
            }
            async_nats::Event::LameDuckMode => {
                self.lame_duck.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }

    pub(super) fn follower_restarted(&self) {
        self.follower_restarts.fetch_add(1, Relaxed);
    }

    /// The stream is known to have reached `seq`.
    pub(super) fn saw_stream_seq(&self, seq: u64) {
        self.stream_seq_seen.fetch_max(seq, Relaxed);
    }

    /// The follower received `message`: the stream ended, when the server
    /// sent it, at its sequence plus the messages still pending behind it.
    /// The follower was delivered `stream_seq`, with `pending` more behind it.
    pub(super) fn delivered(&self, stream_seq: u64, pending: u64) {
        self.saw_stream_seq(stream_seq.saturating_add(pending));
    }

    pub(super) fn lease(&self, held: bool) {
        self.lease_held.store(held, Relaxed);
    }

    /// The counters now, with the follower's lag behind `applied` (the last
    /// stream sequence the mirror applied).
    pub(super) fn counts(&self, applied: u64) -> NatsCounts {
        let connects = self.connects.load(Relaxed);
        NatsCounts {
            cas_conflicts: self.conflicts.load(Relaxed),
            store_retries: std::array::from_fn(|i| self.retries[i].load(Relaxed)),
            connected: self.connected.load(Relaxed),
            reconnects: connects.saturating_sub(1),
            lame_duck_events: self.lame_duck.load(Relaxed),
            follower_restarts: self.follower_restarts.load(Relaxed),
            follower_lag: self.stream_seq_seen.load(Relaxed).saturating_sub(applied),
            expiry_lease_held: self.lease_held.load(Relaxed),
        }
    }
}

impl NatsCoordinator {
    /// The backend's own counters for the metrics. The follower's lag is in
    /// stream sequences, so messages the stream has since dropped (purged
    /// sessions, the per-key history) count too: an upper bound on the
    /// messages still to apply, and 0 once the mirror has caught up.
    pub fn nats_stats(&self) -> NatsCounts {
        self.inner
            .observed
            .counts(self.inner.view.mirror.stream_seq())
    }

    /// Records every store request's round trip into `histogram` (seconds,
    /// by `op`). A replica is served by one server: the first histogram
    /// given is kept, so a second metrics pipeline over the same replica
    /// gets none.
    pub fn record_store_latency(&self, histogram: Histogram<f64>) {
        if self.inner.observed.latency.set(histogram).is_err() {
            tracing::debug!("store latency already recorded by another metrics pipeline");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_leave_out_the_first_connection_and_the_last_event_sets_the_state() {
        let stats = NatsStats::default();
        assert_eq!(stats.counts(0), NatsCounts::default());
        stats.connection(&async_nats::Event::Connected);
        assert_eq!(
            (stats.counts(0).connected, stats.counts(0).reconnects),
            (true, 0)
        );
        stats.connection(&async_nats::Event::LameDuckMode);
        stats.connection(&async_nats::Event::Disconnected);
        assert!(!stats.counts(0).connected);
        stats.connection(&async_nats::Event::Connected);
        let counts = stats.counts(0);
        assert_eq!(
            (counts.connected, counts.reconnects, counts.lame_duck_events),
            (true, 1, 1)
        );
        stats.connection(&async_nats::Event::Closed);
        assert!(!stats.counts(0).connected);
    }

    #[test]
    fn lag_is_what_the_stream_is_known_to_hold_beyond_the_mirror() {
        let stats = NatsStats::default();
        stats.saw_stream_seq(40);
        stats.saw_stream_seq(25);
        assert_eq!(stats.counts(30).follower_lag, 10);
        assert_eq!(stats.counts(40).follower_lag, 0);
        // The mirror may apply what the counters have not heard of yet.
        assert_eq!(stats.counts(45).follower_lag, 0);
    }

    #[test]
    fn retries_are_counted_by_reason() {
        let stats = NatsStats::default();
        stats.retried(RetryReason::Timeout);
        stats.retried(RetryReason::Timeout);
        stats.retried(RetryReason::NotReady);
        stats.conflict();
        let counts = stats.counts(0);
        assert_eq!(counts.store_retries, [1, 0, 2, 0, 0]);
        assert_eq!(RETRY_REASONS[RetryReason::Timeout.index()], "timeout");
        assert_eq!(counts.cas_conflicts, 1);
    }
}
