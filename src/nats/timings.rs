//! Every retry count, pause, timeout and bound of the NATS backend, in one
//! place: the code that uses one names it from here, and a default a flag
//! overrides is written here only (`config` shows it in `--help` from here).
//!
//! | item | what it bounds | value | why that value | set by |
//! |---|---|---|---|---|
//! | [`MAX_ATTEMPTS`] | compare-and-set attempts of one call (each a decision on a read, then a write or a confirmation) before ABORTED "contended" | 32 | far above what contention costs in practice (`respcoord-bench failover`: about 1 call in 10,000 of two replicas taking turns on one session reaches it); bounds a call that keeps losing | — |
//! | [`REQUEST_TIMEOUT`] | one JetStream request before it counts as failed and is tried again | 2 s | a healthy request answers in milliseconds; a turnover resends earlier | `--nats-timeout` |
//! | [`CONNECT_TIMEOUT_FLOOR`] | the shortest connection timeout (the request timeout, if longer) | 1 s | not measured: connecting is several round trips (TCP, TLS, the server's INFO), more than one request | — |
//! | [`PATIENCE`] | how long a call retries transient store failures and waits for its quorum point before UNAVAILABLE | 10 s | above nats-server's Raft election after a crash (4 to 9 s) | `--nats-patience` |
//! | [`FIRST_PAUSE`] | the pause after a call's first transient failure (then doubled) | 20 ms | not measured: short, so a failure that has already passed costs little | — |
//! | [`LONGEST_PAUSE`] | the pause between tries, once doubled | 250 ms | waiting calls do not storm a cluster in a long election | — |
//! | [`SETTLING`] | how long after a turnover the cluster counts as settling | 2 s | a node restarted by SIGTERM has its routes and JetStream back within a few hundred ms | — |
//! | [`SETTLING_PAUSE`] | the longest pause while settling | 40 ms | a pause grown to 250 ms added that much to every call after a SIGTERM restart (docs/cluster.md, "Failover, measured") | — |
//! | [`SLOW_REQUEST`] | a store request this slow is logged (debug) | 200 ms | not measured: far above a healthy request (milliseconds) | — |
//! | [`LIST_CATCH_UP`] | how long ListSessions waits for the mirror to reach its quorum point | 10 s | not measured: the default patience, as a listing has no call's patience of its own | — |
//! | [`NUDGE_AFTER`] | how long a call waits for the mirror to reach its quorum point before it nudges the follower (and between nudges) | 100 ms | a live consumer delivers within a millisecond; this long means it is being recreated or dead | — |
//! | [`NUDGED_READ_BUDGET`] | how long a nudged follower reads by sequence before it goes back to its consumer | 250 ms | reads one message a request cannot keep up with a busy bucket; the next nudge resumes them | — |
//! | [`FIRST_RESTART_DELAY`] | the follower's pause before its first consumer restart (then doubled; reset by a delivered message) | 50 ms | not measured: short, as a consumer can usually be created again at once | — |
//! | [`MAX_RESTART_DELAY`] | the longest pause between follower restarts | 250 ms | while the follower is down this replica's watchers see nothing, and a hot session outruns the per-key history | — |
//! | [`STALL_CHECK`] | how long the follower waits for a message before it asks whether the stream is quiet (a second look after half of it) | 1 s | the ordered consumer notices a dead server only after two missed heartbeats (10 s); this finds a dead consumer within about 2 s | — |
//! | [`STALL_INFO_TIMEOUT`] | how long the stall check waits for the stream's info | 500 ms | a stream leader that cannot answer this fast is a reason to start over | — |
//! | [`ENTRY_CACHE_CAPACITY`] | entries this replica remembers having written | 65,536 | not measured: the sessions a busy replica serves fit; beyond it an entry is dropped, which costs one read | — |
//! | [`TOUCHES_PER_IDLE_TTL`], [`LONGEST_TOUCH_INTERVAL`] | the touch interval (idle TTL / 8, at most a minute, at least 1 ms): how stale a stored last-call time may be before a call that writes nothing writes a touch | 8, 60 s | expiry adds the interval to the idle TTL, so a session expires at most one interval (an eighth of its TTL, a minute at most) plus one sweep late, and a session only read writes at most 8 touches a TTL | `--session-idle-ttl` |
//! | [`SWEEPS_PER_TTL`], [`SHORTEST_SWEEP`], [`LONGEST_SWEEP`] | the expirer's sweep interval (the shorter of the idle and tombstone TTLs / 10, within 50 ms to 5 s) | 10, 50 ms, 5 s | expiry at most a tenth of the shorter TTL late; the bounds are not measured: no sweep loop busier than 20 a second, none rarer than every 5 s | `--session-idle-ttl`, `--tombstone-ttl` |
//! | [`LEASE_SWEEPS`] | the expirer lease's term, in sweep intervals | 3 | a holder renews it every sweep; a dead one is replaced within three | — |
//! | [`SWEEP_BATCH`] | sessions expired per sweep before the lease is renewed again | 4,096 | not measured: a batch ends well within the lease's term | — |
//! | [`HISTORY`] | entries the bucket keeps per session key (when this process creates it): Watch `after_revision` resume and the lost-answer check (`landed`) | 16 | a session written a few times a second through a several-second outage | `--nats-history` |
//! | [`MAX_HISTORY`] | the most `--nats-history` may ask for | 64 | JetStream's per-key cap | — |
//!
//! "Not measured" marks a value chosen by judgement, with no run behind
//! it. docs/cluster.md ("Timings") has the same table for operators.

use std::{sync::OnceLock, time::Duration};

use crate::session::Millis;

/// Compare-and-set attempts per call before it is answered ABORTED.
pub(super) const MAX_ATTEMPTS: u32 = 32;

/// Default of `--nats-timeout`: longest one JetStream request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest connection timeout, whatever `--nats-timeout` says.
pub(super) const CONNECT_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);

/// Default of `--nats-patience`: how long a call rides out transient store
/// failures (`failure::Patience`).
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The first pause between tries of a store request.
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// The longest pause between tries of a store request, once doubled.
pub(super) const LONGEST_PAUSE: Duration = Duration::from_millis(250);

/// How long after a turnover the cluster counts as settling.
pub(super) const SETTLING: Duration = Duration::from_secs(2);

/// The longest pause between tries while the cluster is settling.
pub(super) const SETTLING_PAUSE: Duration = Duration::from_millis(40);

/// A store request that takes this long is logged.
pub(super) const SLOW_REQUEST: Duration = Duration::from_millis(200);

/// Longest ListSessions waits for this replica's mirror to reach its quorum
/// point before answering UNAVAILABLE.
pub(super) const LIST_CATCH_UP: Duration = Duration::from_secs(10);

/// How long a call waits for the mirror to reach its quorum point before it
/// nudges the follower, and again between nudges.
pub(super) const NUDGE_AFTER: Duration = Duration::from_millis(100);

/// Longest a nudged follower reads by sequence before it goes back to its
/// consumer.
pub(super) const NUDGED_READ_BUDGET: Duration = Duration::from_millis(250);

/// The follower's first pause before starting a new consumer.
pub(super) const FIRST_RESTART_DELAY: Duration = Duration::from_millis(50);

/// The longest pause between follower restarts.
pub(super) const MAX_RESTART_DELAY: Duration = Duration::from_millis(250);

/// How long the follower waits for a message before it checks for a stall.
pub(super) const STALL_CHECK: Duration = Duration::from_secs(1);

/// Longest the stall check waits for the stream's info.
pub(super) const STALL_INFO_TIMEOUT: Duration = Duration::from_millis(500);

/// Entries this replica remembers having written (`cache::EntryCache`).
pub(super) const ENTRY_CACHE_CAPACITY: usize = 65_536;

/// Touch intervals per idle TTL.
pub(super) const TOUCHES_PER_IDLE_TTL: u64 = 8;

/// The longest touch interval.
pub(super) const LONGEST_TOUCH_INTERVAL: Duration = Duration::from_secs(60);

/// Sweeps per the shorter of the idle and tombstone TTLs.
pub(super) const SWEEPS_PER_TTL: u32 = 10;

/// The shortest sweep interval.
pub(super) const SHORTEST_SWEEP: Duration = Duration::from_millis(50);

/// The longest sweep interval.
pub(super) const LONGEST_SWEEP: Duration = Duration::from_secs(5);

/// The expirer lease's term, in sweep intervals.
pub(super) const LEASE_SWEEPS: u32 = 3;

/// Sessions handled per sweep before the lease is renewed again.
pub(super) const SWEEP_BATCH: usize = 4096;

/// Default of `--nats-history`: entries kept per session key.
pub const HISTORY: u8 = 16;

/// The most entries JetStream keeps per key.
pub const MAX_HISTORY: u8 = 64;

/// A duration in milliseconds, saturating.
pub(super) fn millis(duration: Duration) -> Millis {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How stale a stored last-call time may be before a call that writes
/// nothing writes a touch: the idle TTL / [`TOUCHES_PER_IDLE_TTL`], at
/// least 1 ms and at most [`LONGEST_TOUCH_INTERVAL`].
pub(super) fn touch_interval(idle_ttl: Duration) -> Millis {
    (millis(idle_ttl) / TOUCHES_PER_IDLE_TTL).clamp(1, millis(LONGEST_TOUCH_INTERVAL))
}

/// The expirer's sweep interval: the shorter TTL / [`SWEEPS_PER_TTL`],
/// within [`SHORTEST_SWEEP`] and [`LONGEST_SWEEP`].
pub(super) fn sweep_interval(idle_ttl: Duration, tombstone_ttl: Duration) -> Duration {
    (idle_ttl.min(tombstone_ttl) / SWEEPS_PER_TTL).clamp(SHORTEST_SWEEP, LONGEST_SWEEP)
}

/// A flag's default as `--help` shows it and clap parses it ("2s").
pub fn flag_text(default: Duration, text: &'static OnceLock<String>) -> &'static str {
    text.get_or_init(|| humantime::format_duration(default).to_string())
}

/// `--nats-timeout`'s default as text.
pub fn request_timeout_text() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    flag_text(REQUEST_TIMEOUT, &TEXT)
}

/// `--nats-patience`'s default as text.
pub fn patience_text() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    flag_text(PATIENCE, &TEXT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_defaults_read_as_their_durations() {
        assert_eq!(request_timeout_text(), "2s");
        assert_eq!(patience_text(), "10s");
    }

    #[test]
    fn touch_and_sweep_intervals_are_bounded() {
        assert_eq!(touch_interval(Duration::from_secs(3600)), 60_000);
        assert_eq!(touch_interval(Duration::from_secs(8)), 1_000);
        assert_eq!(touch_interval(Duration::ZERO), 1);
        let (hour, ten_min) = (Duration::from_secs(3600), Duration::from_secs(600));
        assert_eq!(sweep_interval(hour, ten_min), LONGEST_SWEEP);
        assert_eq!(
            sweep_interval(Duration::from_secs(2), ten_min),
            Duration::from_millis(200)
        );
        assert_eq!(
            sweep_interval(Duration::from_millis(100), hour),
            SHORTEST_SWEEP
        );
    }
}
