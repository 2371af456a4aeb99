//! Retries: exponential backoff with jitter, inside an overall deadline.

use std::{future::Future, time::Duration};

use tokio::time::Instant;
use tonic::{Code, Status};

/// How calls are retried. Only calls that are safe to repeat are retried at
/// all: Start (it always carries a request id, so a repeat is a replay),
/// Finish (its id fences it), Cancel with `if_response_id`, Shutdown,
/// GetState and ListSessions.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// One attempt may take this long (sent to the server as `grpc-timeout`).
    pub attempt_timeout: Duration,
    /// All attempts of one call, backoff included, end by this much after
    /// the call began; the last error is returned then.
    pub deadline: Duration,
    /// The first backoff; it doubles per attempt up to `max_backoff`. Each
    /// sleep is drawn uniformly from [backoff/2, backoff] (jitter), so
    /// gateways that lost the coordinator together do not return in step.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// At most this many attempts (at least 1).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(2),
            deadline: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(25),
            max_backoff: Duration::from_secs(1),
            max_attempts: u32::MAX,
        }
    }
}

impl RetryPolicy {
    /// The same deadlines, one attempt.
    pub fn single_attempt(mut self) -> Self {
        self.max_attempts = 1;
        self
    }

    /// Whether a failed attempt may be tried again: the transport failed or
    /// the attempt ran out of time. Answers about the request itself
    /// (NOT_FOUND, FAILED_PRECONDITION, INVALID_ARGUMENT, ...) are final, and
    /// so is an INTERNAL the server sent. An INTERNAL that tonic made from a
    /// lost connection is not an answer: a replica killed or restarted
    /// mid-call ends its HTTP/2 connection with a GOAWAY or a reset, which
    /// tonic reports as INTERNAL with the transport error as its source.
    pub fn retryable(status: &Status) -> bool {
        let transport_lost = status.code() == Code::Internal
            && std::error::Error::source(status)
                .is_some_and(|source| source.is::<tonic::transport::Error>());
        transport_lost
            || matches!(
                status.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::Unknown
                    | Code::Cancelled
            )
    }

    /// Backoff before attempt `attempt + 1` (attempts count from 1), jittered.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(20);
        let ceiling = self
            .initial_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(nanos / 2..=nanos))
    }
}

/// Runs `attempt(timeout)` until it succeeds, fails for good, or the policy
/// runs out. Returns the value and how many attempts it took.
pub(crate) async fn run<T, F, Fut>(policy: &RetryPolicy, mut attempt: F) -> Result<(T, u32), Status>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + policy.deadline;
    let mut attempts = 0;
    let mut last_failure: Option<Status> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // A backoff's sleep can overrun the deadline by a timer tick; an
        // attempt with no time left could only fail with a made-up
        // DEADLINE_EXCEEDED that hides the real failure before it.
        if attempts > 0 && left.is_zero() {
            return Err(last_failure
                .take()
                .unwrap_or_else(|| Status::deadline_exceeded("retry deadline passed")));
        }
        attempts += 1;
        let timeout = policy.attempt_timeout.min(left);
        let result = match tokio::time::timeout(timeout, attempt(timeout)).await {
            Ok(result) => result,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer within {timeout:?}"
            ))),
        };
        let status = match result {
            Ok(value) => return Ok((value, attempts)),
            Err(status) => status,
        };
        if !RetryPolicy::retryable(&status) || attempts >= policy.max_attempts.max(1) {
            return Err(status);
        }
        let pause = policy.backoff(attempts);
        if Instant::now() + pause >= deadline {
            return Err(status);
        }
        tracing::debug!(code = ?status.code(), message = status.message(), ?pause, attempts, "retrying");
        last_failure = Some(status);
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(800),
            ..RetryPolicy::default()
        };
        for _ in 0..100 {
            let first = policy.backoff(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = policy.backoff(3);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            let late = policy.backoff(30);
            assert!(late >= Duration::from_millis(400) && late <= Duration::from_millis(800));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transport_failures_until_success() {
        let calls = AtomicU32::new(0);
        let (value, attempts) = run(&RetryPolicy::default(), |_| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 3 {
                    Err(Status::unavailable("down"))
                } else {
                    Ok(n)
                }
            }
        })
        .await
        .unwrap();
        assert_eq!((value, attempts), (3, 4));
    }

    #[tokio::test(start_paused = true)]
    async fn final_answers_are_not_retried() {
        let calls = AtomicU32::new(0);
        let status = run(&RetryPolicy::default(), |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(Status::not_found("no")) }
        })
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_internal_the_server_sent_is_final() {
        assert!(!RetryPolicy::retryable(&Status::internal("a server bug")));
    }

    /// A server that resets every stream the way a dying replica's HTTP/2
    /// connection ends them (RST_STREAM INTERNAL_ERROR, no gRPC status).
    async fn resetting_server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut connection) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((_, mut respond))) = connection.accept().await {
                        respond.send_reset(h2::Reason::INTERNAL_ERROR);
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn an_internal_made_from_a_reset_stream_is_retried() {
        use respcoord_proto::v1::{
            response_coordinator_client::ResponseCoordinatorClient, GetStateRequest,
        };
        let addr = resetting_server().await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let status = ResponseCoordinatorClient::new(channel)
            .get_state(GetStateRequest {
                session_id: "s".to_owned(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert!(RetryPolicy::retryable(&status), "{status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_bounds_all_attempts() {
        let policy = RetryPolicy {
            deadline: Duration::from_secs(3),
            ..RetryPolicy::default()
        };
        let began = Instant::now();
        let status = run(&policy, |timeout| async move {
            // Hangs: every attempt times out.
            tokio::time::sleep(timeout * 2).await;
            Ok::<(), Status>(())
        })
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            began.elapsed() <= Duration::from_secs(3),
            "{:?}",
            began.elapsed()
        );
    }

    /// The timer runs in whole milliseconds, so a backoff that fits before
    /// the deadline can wake after it. The caller then hears the failure
    /// that was retried, not a DEADLINE_EXCEEDED from an attempt that was
    /// given no time.
    #[tokio::test(start_paused = true)]
    async fn a_backoff_that_overruns_the_deadline_returns_the_last_real_failure() {
        let policy = RetryPolicy {
            deadline: Duration::from_micros(500),
            initial_backoff: Duration::from_micros(2),
            max_backoff: Duration::from_micros(2),
            ..RetryPolicy::default()
        };
        let calls = AtomicU32::new(0);
        let status = run(&policy, |timeout| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if !first {
                    tokio::time::sleep(timeout * 2).await;
                }
                Err::<(), _>(Status::unavailable("handshake refused"))
            }
        })
        .await
        .unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unavailable, "handshake refused")
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn single_attempt_means_one() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy::default().single_attempt();
        let _ = run(&policy, |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(Status::unavailable("down")) }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
