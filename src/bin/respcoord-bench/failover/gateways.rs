//! The load of a failover run: gateways that loop Start then Finish on a
//! hot session, each call sent until answered, every attempt recorded.

use std::{
    future::Future,
    sync::{atomic::AtomicBool, atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant},
};

use respcoord::proto::v1 as pb;
use tonic::{transport::Endpoint, Code};

use super::FailoverArgs;
use crate::Client;

/// The pause before a failed attempt is sent again (module docs of
/// `failover`: fixed, so a gap measured is the service's).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// One attempt of a call; the call's last attempt stands for the call.
pub(super) struct Attempt {
    pub(super) gateway: usize,
    pub(super) what: &'static str,
    pub(super) call_began: Instant,
    pub(super) sent: Instant,
    pub(super) answered: Instant,
    /// A failed attempt's gRPC code and message, or `deadline` (the
    /// client's own).
    pub(super) failed: Option<String>,
    pub(super) last: bool,
}

impl Attempt {
    pub(super) fn replica(&self) -> usize {
        self.gateway % 2
    }
}

/// Sends one call until answered, refused for good, or `call_deadline`
/// has passed, recording every attempt.
async fn call<T, F, Fut>(
    log: &mut Vec<Attempt>,
    gateway: usize,
    what: &'static str,
    args: &FailoverArgs,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut(tonic::Request<()>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let call_began = Instant::now();
    loop {
        let sent = Instant::now();
        let mut deadline = tonic::Request::new(());
        deadline.set_timeout(args.attempt_deadline);
        let limit = args.attempt_deadline + Duration::from_millis(250);
        let (reply, failed, retry) = match tokio::time::timeout(limit, attempt(deadline)).await {
            Ok(Ok(reply)) => (Some(reply.into_inner()), None, false),
            Ok(Err(status)) => {
                use Code::*;
                let retry = matches!(
                    status.code(),
                    Unavailable | DeadlineExceeded | Aborted | Cancelled | Unknown | Internal
                );
                (
                    None,
                    Some(format!("{:?}: {}", status.code(), status.message())),
                    retry,
                )
            }
            Err(_) => (None, Some("deadline".to_owned()), true),
        };
        let last = !retry || call_began.elapsed() >= args.call_deadline;
        let answered = Instant::now();
        log.push(Attempt {
            gateway,
            what,
            call_began,
            sent,
            answered,
            failed,
            last,
        });
        if last {
            return reply;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// `message` with the deadline `template` carries.
fn with_deadline<T>(template: tonic::Request<()>, message: T) -> tonic::Request<T> {
    let (metadata, extensions, ()) = template.into_parts();
    tonic::Request::from_parts(metadata, extensions, message)
}

pub(super) async fn gateway(
    g: usize,
    endpoint: String,
    session_id: String,
    stop: Arc<AtomicBool>,
    args: FailoverArgs,
) -> Result<Vec<Attempt>, String> {
    let endpoint = Endpoint::from_shared(endpoint).map_err(|e| e.to_string())?;
    let client = Client::new(endpoint.connect().await.map_err(|e| e.to_string())?);
    let mut log = Vec::new();
    for n in 0.. {
        if stop.load(Relaxed) {
            break;
        }
        let (source, request_id) = (pb::Source::Client.into(), format!("g{g}-{n}"));
        let start = pb::StartRequest {
            session_id: session_id.clone(),
            source,
            request_id,
        };
        let started = call(&mut log, g, "Start", &args, |deadline| {
            let (mut client, request) = (client.clone(), with_deadline(deadline, start.clone()));
            async move { client.start(request).await }
        });
        let Some(started) = started.await else {
            continue;
        };
        let (response_id, status) = (started.response_id, pb::TerminalStatus::Completed.into());
        let finish = pb::FinishRequest {
            session_id: session_id.clone(),
            response_id,
            status,
        };
        let finished = call(&mut log, g, "Finish", &args, |deadline| {
            let (mut client, request) = (client.clone(), with_deadline(deadline, finish.clone()));
            async move { client.finish(request).await }
        });
        finished.await;
    }
    Ok(log)
}
