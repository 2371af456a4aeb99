//! The bucket's clock, as far as this replica can bound it: idle time,
//! expiry and the expirer lease are measured on the timestamps the JetStream
//! stream leader stamps on every message it stores, never on replicas' wall
//! clocks.
//!
//! Why: expiry compares a session's last activity with "now" on the
//! expirer. Were both wall-clock readings of replicas, a writer whose clock
//! runs behind and an expirer whose clock runs ahead would expire a session
//! early by the sum of their skews (the fault runs' expiry schedule shows
//! it: tests/faults/expiry.rs). Instead a session's last activity is its
//! entry's stamp, and "now" is the newest stamp this replica has received
//! plus its own monotonic time since. A stamp is older than its receipt, so
//! that "now" is never ahead of the stream's clock: a session is never
//! expired before its TTL on the stream's clock, whatever the replicas'
//! clocks say. It lags by the shortest delivery delay seen, which only
//! makes expiry later by that much. What remains assumed is that the NATS
//! nodes' own clocks agree, as JetStream's age limits already assume.

use std::time::{Duration, Instant};

use crate::{session::Millis, sync::Mutex};

/// A time on the stream's clock: Unix milliseconds, as JetStream stamps
/// the messages it stores (and, before any stamp arrived, this replica's
/// wall clock: `super::unix_millis`). Not the memory backend's monotonic
/// milliseconds; it becomes the session record's `session::Millis`
/// (`UnixMillis::millis`) only where the record is decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnixMillis(u64);

impl UnixMillis {
    pub const fn new(unix_millis: u64) -> Self {
        Self(unix_millis)
    }

    /// As the session record counts time.
    pub const fn millis(self) -> Millis {
        self.0
    }

    /// `self` plus `duration`, saturating.
    pub fn saturating_add(self, duration: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
        )
    }
}

/// The newest lower bound of the stream's clock this replica has seen.
#[derive(Default)]
pub struct StreamClock {
    latest: Mutex<Option<Reading>>,
}

#[derive(Clone, Copy)]
struct Reading {
    stamp: UnixMillis,
    received: Instant,
}

impl Reading {
    fn now_at(self, at: Instant) -> UnixMillis {
        self.stamp
            .saturating_add(at.saturating_duration_since(self.received))
    }
}

impl StreamClock {
    /// A stamp (Unix ms) of a message just received from the stream.
    pub fn observe(&self, stamp: UnixMillis) {
        self.observe_at(stamp, Instant::now());
    }

    /// The stream's clock now, at most: `None` before any stamp arrived.
    pub fn now(&self) -> Option<UnixMillis> {
        if crate::shared::faults::replica_clock_expiry() {
            return Some(super::unix_millis());
        }
        self.now_at(Instant::now())
    }

    fn observe_at(&self, stamp: UnixMillis, at: Instant) {
        let mut latest = self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Both are lower bounds of the stream's clock at `at`; keep the
        // higher, so a backlog delivered late (after a pause) sets nothing
        // back.
        if latest.is_none_or(|reading| stamp > reading.now_at(at)) {
            *latest = Some(Reading {
                stamp,
                received: at,
            });
        }
    }

    fn now_at(&self, at: Instant) -> Option<UnixMillis> {
        self.latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map(|reading| reading.now_at(at))
    }
}

/// A stream timestamp (Unix nanoseconds) in Unix milliseconds.
pub fn stamp_millis(unix_nanos: i128) -> UnixMillis {
    let millis = unix_nanos.div_euclid(1_000_000);
    // Out of range either way: before the epoch reads as the epoch, beyond
    // u64 as never (an entry that never expires, rather than one at once).
    UnixMillis(u64::try_from(millis).unwrap_or(if millis < 0 { 0 } else { u64::MAX }))
}

/// The last activity of a session whose entry the stream stamped at
/// `stamp`: every write of a session entry is a call's (or the expirer's)
/// activity, and the stamp is taken after the writer decided, so it is never
/// earlier than the activity it records.
pub fn last_activity(written: Millis, stamp: UnixMillis) -> Millis {
    if crate::shared::faults::replica_clock_expiry() {
        return written;
    }
    stamp.millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_known_before_the_first_stamp() {
        assert_eq!(StreamClock::default().now_at(Instant::now()), None);
    }

    #[test]
    fn now_runs_on_from_the_stamp_by_local_monotonic_time() {
        let clock = StreamClock::default();
        let t0 = Instant::now();
        clock.observe_at(UnixMillis(1_000_000), t0);
        assert_eq!(clock.now_at(t0), Some(UnixMillis(1_000_000)));
        assert_eq!(
            clock.now_at(t0 + Duration::from_millis(750)),
            Some(UnixMillis(1_000_750))
        );
    }

    #[test]
    fn a_stale_stamp_delivered_late_sets_nothing_back() {
        let clock = StreamClock::default();
        let t0 = Instant::now();
        clock.observe_at(UnixMillis(1_000_000), t0);
        // A backlog after a 5 s pause: stamped long before its receipt.
        let resumed = t0 + Duration::from_secs(5);
        clock.observe_at(UnixMillis(1_000_100), resumed);
        assert_eq!(clock.now_at(resumed), Some(UnixMillis(1_005_000)));
    }

    #[test]
    fn a_fresher_stamp_moves_the_clock_forward() {
        let clock = StreamClock::default();
        let t0 = Instant::now();
        // The first stamp arrived late (a slow delivery): the next, quicker
        // one is the tighter bound.
        clock.observe_at(UnixMillis(1_000_000), t0);
        let t1 = t0 + Duration::from_millis(100);
        clock.observe_at(UnixMillis(1_000_400), t1);
        assert_eq!(clock.now_at(t1), Some(UnixMillis(1_000_400)));
        assert_eq!(
            clock.now_at(t1 + Duration::from_millis(10)),
            Some(UnixMillis(1_000_410))
        );
    }

    #[test]
    fn stamps_convert_to_milliseconds_without_wrapping() {
        assert_eq!(
            stamp_millis(1_700_000_000_123_456_789),
            UnixMillis(1_700_000_000_123)
        );
        assert_eq!(stamp_millis(-5), UnixMillis(0));
        assert_eq!(stamp_millis(i128::MAX), UnixMillis(u64::MAX));
    }
}
