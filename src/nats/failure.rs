//! What a failed JetStream request means for the call that made it, decided
//! in this one place for every store request a call or expiry makes (its
//! reads, compare-and-set writes, purges and quorum points, and the stream
//! reads of `landed`); and how long a call rides out the failures that
//! pass. The expirer's lease, a watch's history and the follower's reads
//! do not come here: the lease is tried again at the next sweep, a watch
//! is answered UNAVAILABLE, and the follower restarts its consumer.
//!
//! nats-server tells a lost compare-and-set apart from other failures only
//! by its JetStream error code, and the code moved: 2.10 answers 10071
//! ("wrong last sequence"), 2.11 and newer answer 10164 (the same words, a
//! new code) on a replicated stream and sometimes on a single-writer key
//! too, and a stream leader that was just elected and has not applied its
//! log yet answers 10163 ("expected last sequence per subject temporarily
//! not ready"). async-nats 0.51 and 0.52 map only 10071 to
//! `WrongLastRevision`; the others arrive as `Other` with the JetStream
//! error as their source, so the source chain is read here rather than the
//! client's kind.
//!
//! During a stream leader move a request can find no responder ("no stream
//! found for given subject", 503), time out, or be answered "JetStream
//! cluster not available" (10008): nothing about the session is wrong, and
//! the call is tried again until its patience is spent (`Patience`).

use std::{error::Error as StdError, time::Duration};

use async_nats::jetstream::{
    context::{PublishError, PublishErrorKind, RequestError, RequestErrorKind},
    kv::{EntryError, EntryErrorKind, UpdateError, UpdateErrorKind},
    ErrorCode,
};
use tokio::time::Instant;

use super::{
    observed::{NatsStats, RetryReason, StoreOp},
    timings::{FIRST_PAUSE, LONGEST_PAUSE, SETTLING, SETTLING_PAUSE, SLOW_REQUEST},
    turnover::Turnovers,
};
use crate::error::CoordError;

/// JetStream's error codes that mean "the compare-and-set lost": the key is
/// past the revision the write expected.
const CONFLICT_CODES: [ErrorCode; 2] = [
    ErrorCode::STREAM_WRONG_LAST_SEQUENCE, // 10071, up to 2.10
    ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT, // 10164, 2.11 and newer
];

/// JetStream's error codes that mean "not now": nothing was written, and
/// the same request can succeed once the stream has a settled leader.
const NOT_READY_CODES: [ErrorCode; 2] = [
    ErrorCode::STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_NOT_READY, // 10163
    ErrorCode::CLUSTER_NOT_AVAILABLE,                          // 10008
];

/// A failed store request, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StoreFailure {
    /// A compare-and-set (update or purge) found the key past the revision
    /// it expected: decide again from a fresh read.
    Conflict,
    /// The stream is between leaders, or the request got no answer in
    /// time: try again within the call's patience. A write that failed this
    /// way may still land (`Inner::write` recognises its own write, through
    /// `landed`).
    Transient(RetryReason, String),
    /// Anything else: the call is answered UNAVAILABLE now.
    Unavailable(String),
}

impl StoreFailure {
    /// Classifies any error async-nats returned, by its kind and the
    /// JetStream error code anywhere in its source chain.
    pub(super) fn of(error: &(dyn StdError + 'static)) -> Self {
        let text = error.to_string();
        let mut level: Option<&(dyn StdError + 'static)> = Some(error);
        while let Some(current) = level {
            if let Some(kind) = Kind::of(current) {
                return match kind {
                    Kind::Conflict => StoreFailure::Conflict,
                    Kind::Transient(why) => StoreFailure::Transient(why, text),
                };
            }
            level = current.source();
        }
        StoreFailure::Unavailable(text)
    }

    /// This failure as the call's answer (once retrying is over).
    pub(super) fn into_error(self) -> CoordError {
        match self {
            StoreFailure::Conflict => {
                CoordError::Unavailable("compare-and-set conflict not resolved".into())
            }
            StoreFailure::Transient(_, reason) | StoreFailure::Unavailable(reason) => {
                CoordError::Unavailable(reason)
            }
        }
    }
}

/// What one level of an error chain says, where it says anything.
enum Kind {
    Conflict,
    Transient(RetryReason),
}

impl Kind {
    fn of(error: &(dyn StdError + 'static)) -> Option<Self> {
        if let Some(jetstream) = error.downcast_ref::<async_nats::jetstream::Error>() {
            let code = jetstream.error_code();
            if CONFLICT_CODES.contains(&code) {
                return Some(Kind::Conflict);
            }
            if NOT_READY_CODES.contains(&code) {
                return Some(Kind::Transient(RetryReason::NotReady));
            }
            return None;
        }
        if let Some(update) = error.downcast_ref::<UpdateError>() {
            return match update.kind() {
                UpdateErrorKind::WrongLastRevision => Some(Kind::Conflict),
                UpdateErrorKind::TimedOut => Some(Kind::Transient(RetryReason::Timeout)),
                UpdateErrorKind::InvalidKey | UpdateErrorKind::Other => None,
            };
        }
        if let Some(publish) = error.downcast_ref::<PublishError>() {
            return match publish.kind() {
                PublishErrorKind::WrongLastSequence => Some(Kind::Conflict),
                // "No stream found" is how a publish that met no responder
                // (no stream leader right now) is reported.
                PublishErrorKind::StreamNotFound => {
                    Some(Kind::Transient(RetryReason::NoResponders))
                }
                PublishErrorKind::TimedOut => Some(Kind::Transient(RetryReason::Timeout)),
                PublishErrorKind::BrokenPipe => Some(Kind::Transient(RetryReason::Other)),
                _ => None,
            };
        }
        if let Some(entry) = error.downcast_ref::<EntryError>() {
            return match entry.kind() {
                EntryErrorKind::TimedOut => Some(Kind::Transient(RetryReason::Timeout)),
                EntryErrorKind::InvalidKey | EntryErrorKind::Other => None,
            };
        }
        if let Some(request) = error.downcast_ref::<RequestError>() {
            return match request.kind() {
                RequestErrorKind::NoResponders => Some(Kind::Transient(RetryReason::NoResponders)),
                RequestErrorKind::TimedOut => Some(Kind::Transient(RetryReason::Timeout)),
                RequestErrorKind::InvalidSubject | RequestErrorKind::Other => None,
            };
        }
        if let Some(request) = error.downcast_ref::<async_nats::RequestError>() {
            return match request.kind() {
                async_nats::RequestErrorKind::NoResponders => {
                    Some(Kind::Transient(RetryReason::NoResponders))
                }
                async_nats::RequestErrorKind::TimedOut => {
                    Some(Kind::Transient(RetryReason::Timeout))
                }
                _ => None,
            };
        }
        None
    }
}

/// How long one call keeps trying through transient store failures, and
/// the pause between tries (doubling from [`FIRST_PAUSE`] to
/// [`LONGEST_PAUSE`]): long enough to ride out a stream leader election
/// (nats-server's Raft elects in 4 to 9 s), bounded so no call waits
/// forever. A client whose own deadline is
/// shorter ends the call sooner.
///
/// A turnover (`turnover`: the stream's leader moved, the connection broke
/// or came back) cuts both waits short: a request in flight is abandoned
/// and sent again at once, and so is a request waiting out its pause. An
/// abandoned write may still land; `Inner::write` recognises its own write
/// (`landed`). For [`SETTLING`] after a turnover the pause stays at most
/// [`SETTLING_PAUSE`]: a replica that reconnected to a node just restarted
/// by SIGTERM meets "no responders" until that node has its routes and
/// JetStream back, a few hundred milliseconds, and a pause grown to
/// [`LONGEST_PAUSE`] added that much again to every call (`respcoord-bench failover`,
/// docs/cluster.md). Outside that window a long outage (an election after
/// a crash) keeps the longer pause, so waiting calls do not storm it.
pub(super) struct Patience {
    deadline: Instant,
    pause: Duration,
    turnovers: Turnovers,
}

impl Patience {
    pub(super) fn new(patience: Duration, turnovers: Turnovers) -> Self {
        Self {
            deadline: Instant::now() + patience,
            pause: FIRST_PAUSE,
            turnovers,
        }
    }

    /// What is left of the patience.
    pub(super) fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Waits before the next try after a transient failure, less if a
    /// turnover comes first; the failure as UNAVAILABLE once the patience is
    /// spent.
    pub(super) async fn wait(&mut self, reason: String) -> Result<(), CoordError> {
        let now = Instant::now();
        if now >= self.deadline {
            return Err(CoordError::Unavailable(reason));
        }
        let longest = if self.turnovers.settling(SETTLING) {
            SETTLING_PAUSE
        } else {
            LONGEST_PAUSE
        };
        let pause = self.pause.min(longest);
        tokio::select! {
            () = tokio::time::sleep(pause.min(self.deadline - now)) => {
                self.pause = (pause * 2).min(longest);
            }
            // Whatever was failing has just changed: try at once, and
            // from the shortest pause again.
            () = self.turnovers.next() => self.pause = FIRST_PAUSE,
        }
        Ok(())
    }

    /// Runs `request` (an `op`) until it succeeds, retrying transient
    /// failures within the patience; a conflict or any other failure is
    /// returned at once. Every store request of a call or of expiry passes
    /// here (the module doc says which do not), so here `stats` hears of
    /// each of their round trips, retries and conflicts.
    pub(super) async fn retry<T, F, Fut>(
        &mut self,
        stats: &NatsStats,
        op: StoreOp,
        mut request: F,
    ) -> Result<T, StoreFailure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreFailure>>,
    {
        loop {
            let sent = Instant::now();
            self.turnovers.mark_seen();
            let answer = tokio::select! {
                answer = request() => answer,
                () = self.turnovers.next() => Err(StoreFailure::Transient(
                    RetryReason::Moved,
                    "the stream leader or the NATS connection moved while the request was in flight"
                        .into(),
                )),
            };
            let took = sent.elapsed();
            stats.round_trip(op, took);
            if took > SLOW_REQUEST {
                tracing::debug!(?op, ?took, ok = answer.is_ok(), "slow store request");
            }
            match answer {
                Err(StoreFailure::Transient(RetryReason::Moved, reason)) => {
                    if Instant::now() >= self.deadline {
                        return Err(StoreFailure::Unavailable(reason));
                    }
                    stats.retried(RetryReason::Moved);
                }
                Err(StoreFailure::Transient(why, reason)) => {
                    tracing::debug!(?op, %reason, "store request failed; trying again");
                    if self.wait(reason.clone()).await.is_err() {
                        return Err(StoreFailure::Unavailable(reason));
                    }
                    stats.retried(why);
                }
                Err(StoreFailure::Conflict) => {
                    stats.conflict();
                    return Err(StoreFailure::Conflict);
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The error a JetStream API answer carries, as the server sends it.
    fn jetstream_error(err_code: u64, description: &str) -> async_nats::jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": 400,
            "err_code": err_code,
            "description": description,
        }))
        .expect("a JetStream error decodes")
    }

    /// A compare-and-set lost as async-nats 0.51 reports it from each server
    /// line: 10071 mapped to `WrongLastRevision` (2.10), 10164 left as
    /// `Other` wrapping "publish failed" wrapping the server's error (2.11+).
    #[test]
    fn a_lost_compare_and_set_is_a_conflict_on_every_server_line() {
        let on_2_10 = UpdateError::with_source(
            UpdateErrorKind::WrongLastRevision,
            PublishError::with_source(
                PublishErrorKind::WrongLastSequence,
                jetstream_error(10071, "wrong last sequence: 7"),
            ),
        );
        assert_eq!(StoreFailure::of(&on_2_10), StoreFailure::Conflict);
        let on_2_14 = UpdateError::with_source(
            UpdateErrorKind::Other,
            PublishError::with_source(
                PublishErrorKind::Other,
                jetstream_error(10164, "wrong last sequence"),
            ),
        );
        assert_eq!(
            on_2_14.to_string(),
            "failed getting entry: publish failed: wrong last sequence (code 400, error code 10164)",
            "the message the issue saw"
        );
        assert_eq!(StoreFailure::of(&on_2_14), StoreFailure::Conflict);
    }

    #[test]
    fn a_leader_between_terms_is_transient_and_anything_else_unavailable() {
        let not_ready = UpdateError::with_source(
            UpdateErrorKind::Other,
            PublishError::with_source(
                PublishErrorKind::Other,
                jetstream_error(
                    10163,
                    "expected last sequence per subject temporarily not ready",
                ),
            ),
        );
        assert!(matches!(
            StoreFailure::of(&not_ready),
            StoreFailure::Transient(RetryReason::NotReady, _)
        ));
        let no_stream = UpdateError::with_source(
            UpdateErrorKind::Other,
            PublishError::new(PublishErrorKind::StreamNotFound),
        );
        assert!(matches!(
            StoreFailure::of(&no_stream),
            StoreFailure::Transient(RetryReason::NoResponders, _)
        ));
        let no_responders = EntryError::with_source(
            EntryErrorKind::Other,
            RequestError::new(RequestErrorKind::NoResponders),
        );
        assert!(matches!(
            StoreFailure::of(&no_responders),
            StoreFailure::Transient(RetryReason::NoResponders, _)
        ));
        let cluster_down = EntryError::with_source(
            EntryErrorKind::Other,
            jetstream_error(10008, "JetStream system temporarily unavailable"),
        );
        assert!(matches!(
            StoreFailure::of(&cluster_down),
            StoreFailure::Transient(RetryReason::NotReady, _)
        ));
        let full = UpdateError::with_source(
            UpdateErrorKind::Other,
            PublishError::with_source(
                PublishErrorKind::Other,
                jetstream_error(10077, "maximum messages exceeded"),
            ),
        );
        assert!(matches!(
            StoreFailure::of(&full),
            StoreFailure::Unavailable(reason) if reason.contains("10077")
        ));
    }

    fn quiet() -> Turnovers {
        super::super::turnover::Turnover::new().subscribe()
    }

    #[tokio::test(start_paused = true)]
    async fn patience_retries_transients_until_spent_and_nothing_else() {
        let stats = NatsStats::default();
        let mut patience = Patience::new(Duration::from_secs(1), quiet());
        let mut tries = 0;
        let answer: Result<(), StoreFailure> = patience
            .retry(&stats, StoreOp::Read, || {
                tries += 1;
                async {
                    Err(StoreFailure::Transient(
                        RetryReason::NoResponders,
                        "no responders".into(),
                    ))
                }
            })
            .await;
        assert_eq!(
            answer,
            Err(StoreFailure::Unavailable("no responders".into()))
        );
        // 20 + 40 + 80 + 160 + 250 + 250 + 200 ms of pauses: eight tries.
        assert_eq!(tries, 8);
        // The last try is given up, not retried.
        assert_eq!(stats.counts(0).store_retries, [0, 7, 0, 0, 0]);
        let mut patience = Patience::new(Duration::from_secs(1), quiet());
        let mut tries = 0;
        let answer: Result<(), StoreFailure> = patience
            .retry(&stats, StoreOp::Write, || {
                tries += 1;
                async { Err(StoreFailure::Conflict) }
            })
            .await;
        assert_eq!((answer, tries), (Err(StoreFailure::Conflict), 1));
        assert_eq!(stats.counts(0).cas_conflicts, 1);
    }

    /// A request whose answer was lost with the old leader or connection is
    /// sent again at the turnover, not after its timeout; a pause after a
    /// "no leader" answer ends at the turnover too.
    #[tokio::test(start_paused = true)]
    async fn a_turnover_resends_at_once_what_is_in_flight_or_pausing() {
        let stats = NatsStats::default();
        let turnover = super::super::turnover::Turnover::new();
        let mut patience = Patience::new(Duration::from_secs(10), turnover.subscribe());
        let started = Instant::now();
        let mut tries = 0;
        let announcer = Arc::clone(&turnover);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            announcer.happened("stream leader elected");
        });
        let answer: Result<u32, StoreFailure> = patience
            .retry(&stats, StoreOp::Write, || {
                tries += 1;
                let attempt = tries;
                async move {
                    if attempt == 1 {
                        // Lost: only the request timeout (2 s) would end it.
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        return Err(StoreFailure::Transient(
                            RetryReason::Timeout,
                            "timed out".into(),
                        ));
                    }
                    Ok(attempt)
                }
            })
            .await;
        assert_eq!(answer, Ok(2));
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(stats.counts(0).store_retries, [0, 0, 0, 0, 1]);

        // Past the settling after that turnover, pauses grow again.
        tokio::time::advance(SETTLING).await;
        let mut patience = Patience::new(Duration::from_secs(10), turnover.subscribe());
        let started = Instant::now();
        let mut tries = 0;
        let announcer = Arc::clone(&turnover);
        tokio::spawn(async move {
            // Inside the 20 + 40 + 80 + 160 ms of pauses after four "no
            // leader" answers, 250 ms before the fifth try was due.
            tokio::time::sleep(Duration::from_millis(200)).await;
            announcer.happened("stream leader elected");
        });
        let answer: Result<u32, StoreFailure> = patience
            .retry(&stats, StoreOp::Read, || {
                tries += 1;
                let attempt = tries;
                async move {
                    if Instant::now() < started + Duration::from_millis(200) {
                        return Err(StoreFailure::Transient(
                            RetryReason::NoResponders,
                            "no responders".into(),
                        ));
                    }
                    Ok(attempt)
                }
            })
            .await;
        assert_eq!(answer, Ok(5));
        assert_eq!(started.elapsed(), Duration::from_millis(200));
    }

    /// A replica that reconnected to a restarted node meets "no responders"
    /// until the node is ready: for `SETTLING` after the turnover it asks
    /// again every `SETTLING_PAUSE` at most, so the call goes through within
    /// that of the node being ready; later, pauses grow to `LONGEST_PAUSE`.
    #[tokio::test(start_paused = true)]
    async fn after_a_turnover_a_failing_request_is_tried_again_often_until_the_cluster_settles() {
        let stats = NatsStats::default();
        let turnover = super::super::turnover::Turnover::new();
        turnover.happened("connected");
        let started = Instant::now();
        let ready_at = started + Duration::from_millis(700);
        let mut patience = Patience::new(Duration::from_secs(10), turnover.subscribe());
        let answer: Result<Instant, StoreFailure> = patience
            .retry(&stats, StoreOp::Write, || async move {
                if Instant::now() < ready_at {
                    return Err(StoreFailure::Transient(
                        RetryReason::NoResponders,
                        "no responders".into(),
                    ));
                }
                Ok(Instant::now())
            })
            .await;
        let through = answer.expect("the node became ready");
        assert!(
            through - ready_at <= SETTLING_PAUSE,
            "{:?}",
            through - ready_at
        );

        // Long after the turnover the pauses grow as before.
        tokio::time::advance(SETTLING).await;
        let mut patience = Patience::new(Duration::from_secs(10), turnover.subscribe());
        let mut pauses = Vec::new();
        let mut last = Instant::now();
        let _: Result<(), StoreFailure> = patience
            .retry(&stats, StoreOp::Write, || {
                let now = Instant::now();
                pauses.push(now - last);
                last = now;
                async move {
                    if pauses_done(now, started) {
                        return Ok(());
                    }
                    Err(StoreFailure::Transient(
                        RetryReason::NoResponders,
                        "no responders".into(),
                    ))
                }
            })
            .await;
        assert_eq!(
            pauses[1..6],
            [20, 40, 80, 160, 250].map(Duration::from_millis),
            "{pauses:?}"
        );
    }

    fn pauses_done(now: Instant, started: Instant) -> bool {
        now - started > Duration::from_secs(4)
    }
}
