//! Quorum points, shared by the calls that need one at the same time (group
//! commit): a call needs a committed write that was *sent after it arrived*
//! (`Inner::quorum_point` says why), not a write of its own. Calls that
//! arrive while one is in flight wait for the next, which starts as soon as
//! the one in flight is answered and serves all of them; so however many
//! calls ask at once, at most two writes are outstanding per replica, and a
//! lone call pays exactly one.
//!
//! Rounds are numbered. A call arriving when round `r` is the last one sent
//! needs round `r + 1` (or any later one): that round is sent after the call
//! arrived, whoever sends it. Writes run on a spawned task, so a caller that
//! gives up (its deadline, a cancelled RPC) never strands the others.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, PoisonError},
};

use tokio::sync::watch;

use crate::sync::Mutex;

/// One quorum-point write: the stream sequence it committed at, or why not.
pub(super) type Write =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Send + Sync>;

/// What one finished round answered.
type Finished = (u64, Result<u64, String>);

pub(super) struct QuorumPoints {
    rounds: Mutex<Rounds>,
    finished: watch::Sender<Finished>,
    write: Write,
}

#[derive(Default)]
struct Rounds {
    /// The last round sent.
    sent: u64,
    /// The latest round a waiting call needs.
    wanted: u64,
    in_flight: bool,
}

impl QuorumPoints {
    pub(super) fn new(write: Write) -> Arc<Self> {
        Arc::new(Self {
            rounds: Mutex::default(),
            finished: watch::channel((0, Ok(0))).0,
            write,
        })
    }

    /// The stream sequence of a quorum point committed after this call.
    pub(super) async fn point(self: &Arc<Self>) -> Result<u64, String> {
        let mut finished = self.finished.subscribe();
        let (needed, send) = {
            let mut rounds = self.rounds.lock().unwrap_or_else(PoisonError::into_inner);
            let needed = rounds.sent + 1;
            rounds.wanted = rounds.wanted.max(needed);
            let send = !rounds.in_flight;
            if send {
                rounds.in_flight = true;
                rounds.sent = needed;
            }
            (needed, send)
        };
        if send {
            tokio::spawn(Arc::clone(self).send_from(needed));
        }
        let answered = finished
            .wait_for(|(round, _)| *round >= needed)
            .await
            .map_err(|_| "quorum points stopped".to_owned())?;
        answered.1.clone()
    }

    /// Sends round `round`, then every round a call is still waiting for.
    async fn send_from(self: Arc<Self>, mut round: u64) {
        loop {
            let outcome = (self.write)().await;
            let _previous = self.finished.send_replace((round, outcome));
            let mut rounds = self.rounds.lock().unwrap_or_else(PoisonError::into_inner);
            if rounds.wanted > round {
                round += 1;
                rounds.sent = round;
            } else {
                rounds.in_flight = false;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A write that takes `delay`, counting how many were sent.
    fn counting(delay: std::time::Duration) -> (Write, Arc<AtomicU64>) {
        let sent = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        let write: Write = Arc::new(move || {
            let counter = Arc::clone(&counter);
            Box::pin(async move {
                let seq = counter.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(delay).await;
                Ok(seq * 10)
            })
        });
        (write, sent)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_call_sends_one_write() {
        let (write, sent) = counting(std::time::Duration::from_millis(5));
        let points = QuorumPoints::new(write);
        assert_eq!(points.point().await, Ok(10));
        assert_eq!(points.point().await, Ok(20));
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_arriving_during_a_write_share_the_next_one() {
        let (write, sent) = counting(std::time::Duration::from_millis(5));
        let points = QuorumPoints::new(write);
        let first = tokio::spawn({
            let points = Arc::clone(&points);
            async move { points.point().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        // Round 1 is in flight, sent before these arrived: they need round 2.
        let later: Vec<_> = (0..50)
            .map(|_| {
                let points = Arc::clone(&points);
                tokio::spawn(async move { points.point().await })
            })
            .collect();
        assert_eq!(first.await.unwrap(), Ok(10));
        for call in later {
            assert_eq!(
                call.await.unwrap(),
                Ok(20),
                "the write sent after they arrived"
            );
        }
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gives_up_strands_no_one() {
        let (write, _) = counting(std::time::Duration::from_millis(5));
        let points = QuorumPoints::new(write);
        let impatient = tokio::time::timeout(std::time::Duration::from_millis(1), points.point());
        assert!(impatient.await.is_err());
        assert_eq!(points.point().await, Ok(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_fails_its_round_only() {
        let calls = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&calls);
        let write: Write = Arc::new(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if n == 0 {
                    Err("no quorum".to_owned())
                } else {
                    Ok(7)
                }
            })
        });
        let points = QuorumPoints::new(write);
        assert_eq!(points.point().await, Err("no quorum".to_owned()));
        assert_eq!(points.point().await, Ok(7));
    }
}
