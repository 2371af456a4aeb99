//! Turnovers: the moments a store request already in flight may have been
//! lost, and the follower's consumer with it.
//!
//! A JetStream request is answered by the stream leader over this replica's
//! connection. When the leader moves (an election after a crash, a planned
//! step-down at lame duck or SIGTERM) or the connection breaks, a request
//! sent before is never answered and would wait out its whole
//! `--nats-timeout`; a request that met no leader would wait out its
//! backoff. Each turnover is a signal that the same request is worth sending
//! again now (`Patience`), and that the follower should resume from where
//! its mirror is rather than wait for its consumer's heartbeat (`follow`).
//!
//! Turnovers come from the connection (disconnected, reconnected, the
//! server entering lame duck, which also makes this replica move to another
//! server at once) and from the stream's own leader-elected advisory, which
//! nats-server publishes in the bucket's account the moment a new stream
//! leader takes over. A client whose NATS permissions do not allow
//! subscribing to that advisory still fails over, waiting on timeouts.

use std::{sync::Arc, time::Duration};

use tokio::{sync::watch, time::Instant};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

/// Announces turnovers, with when the last one was; every store request
/// and the follower watch it.
#[derive(Debug)]
pub(super) struct Turnover {
    last: watch::Sender<Option<Instant>>,
}

impl Turnover {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            last: watch::channel(None).0,
        })
    }

    pub(super) fn happened(&self, what: &'static str) {
        self.last.send_modify(|last| *last = Some(Instant::now()));
        tracing::debug!(what, "NATS turnover: requests in flight are sent again");
    }

    pub(super) fn subscribe(&self) -> Turnovers {
        Turnovers(self.last.subscribe())
    }

    /// What the connection's `event` means for requests in flight.
    pub(super) fn on_connection(&self, event: &async_nats::Event) {
        match event {
            async_nats::Event::Disconnected => self.happened("disconnected"),
            async_nats::Event::Connected => self.happened("connected"),
            async_nats::Event::LameDuckMode => self.happened("server in lame duck"),
            _ => {}
        }
    }
}

/// One watcher's view of the turnovers.
#[derive(Debug, Clone)]
pub(super) struct Turnovers(watch::Receiver<Option<Instant>>);

impl Turnovers {
    /// Whether the last turnover came less than `window` ago: the cluster
    /// or the connection is settling (a restarted node taking requests, a
    /// new leader catching up) and a failing request may succeed any moment.
    pub(super) fn settling(&self, window: Duration) -> bool {
        self.0.borrow().is_some_and(|at| at.elapsed() < window)
    }

    /// Forgets the turnovers so far: `next` waits for a later one.
    pub(super) fn mark_seen(&mut self) {
        self.0.borrow_and_update();
    }

    /// The next turnover not yet seen. Never returns once the sender is gone
    /// (the coordinator is shutting down), so a request is never cut short
    /// by that.
    pub(super) async fn next(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The subject nats-server announces a new leader of `stream` on.
fn leader_elected_subject(stream: &str) -> String {
    format!("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}")
}

/// Counts the bucket stream's leader elections as turnovers until `stop`.
/// Subscribed before the first call, so no election after startup is
/// missed; a refused subscription (permissions) is logged once and leaves
/// failover to the timeouts.
pub(super) async fn follow_leader_elections(
    client: async_nats::Client,
    stream: String,
    turnover: Arc<Turnover>,
    stop: CancellationToken,
) {
    let subject = leader_elected_subject(&stream);
    let mut advisories = match client.subscribe(subject.clone()).await {
        Ok(advisories) => advisories,
        Err(error) => {
            tracing::warn!(%subject, %error, "cannot follow the stream's leader elections; failover waits for request timeouts");
            return;
        }
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            advisory = advisories.next() => match advisory {
                Some(_) => turnover.happened("stream leader elected"),
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_watcher_wakes_for_turnovers_after_it_marked_the_earlier_ones_seen() {
        let turnover = Turnover::new();
        let mut turnovers = turnover.subscribe();
        turnover.happened("first");
        turnovers.mark_seen();
        let quiet = tokio::time::timeout(Duration::from_millis(20), turnovers.next()).await;
        assert!(quiet.is_err(), "an already seen turnover woke the watcher");
        turnover.on_connection(&async_nats::Event::Disconnected);
        tokio::time::timeout(Duration::from_secs(1), turnovers.next())
            .await
            .expect("a new turnover wakes the watcher");
        turnover.on_connection(&async_nats::Event::SlowConsumer(1));
        let quiet = tokio::time::timeout(Duration::from_millis(20), turnovers.next()).await;
        assert!(quiet.is_err(), "a slow consumer is not a turnover");
    }

    #[tokio::test]
    async fn a_watcher_is_never_woken_by_the_coordinator_going_away() {
        let turnover = Turnover::new();
        let mut turnovers = turnover.subscribe();
        drop(turnover);
        let quiet = tokio::time::timeout(Duration::from_millis(20), turnovers.next()).await;
        assert!(quiet.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_cluster_is_settling_for_a_while_after_each_turnover() {
        let turnover = Turnover::new();
        let turnovers = turnover.subscribe();
        let window = Duration::from_secs(2);
        assert!(!turnovers.settling(window), "no turnover yet");
        turnover.happened("test");
        assert!(turnovers.settling(window));
        tokio::time::advance(Duration::from_millis(1_900)).await;
        assert!(turnovers.settling(window));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(!turnovers.settling(window));
    }

    #[test]
    fn the_advisory_subject_names_the_bucket_stream() {
        assert_eq!(
            leader_elected_subject("KV_respcoord"),
            "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.KV_respcoord"
        );
    }
}
