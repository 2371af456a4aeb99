//! Delivers one Watch: drains its [`Subscription`] into the response stream,
//! batching events, sending a bookmark whenever the stream has been quiet for
//! the bookmark interval, ending cleanly at the session's `terminated` event
//! or at server shutdown, and ending with RESOURCE_EXHAUSTED when the watcher
//! fell behind.

use std::time::Duration;

use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::{
    error::CoordError,
    events::{Bookmark, Delivery, SharedEvent, Subscription},
    grpc::convert,
    proto::v1 as pb,
};

/// How watches are delivered.
#[derive(Clone, Copy, Debug)]
pub struct WatchSettings {
    /// A quiet stream gets a bookmark at least this often.
    pub bookmark_interval: Duration,
    /// Most events in one WatchResponse.
    pub max_batch: usize,
    /// WatchResponses buffered per stream before the watcher counts as slow.
    pub stream_buffer: usize,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(10),
            max_batch: 256,
            stream_buffer: 16,
        }
    }
}

pub type WatchItem = Result<pb::WatchResponse, Status>;

fn events_message(events: &[SharedEvent]) -> pb::WatchResponse {
    pb::WatchResponse {
        events: events.iter().map(|e| convert::event(e)).collect(),
        progress_seq: 0,
    }
}

enum Step {
    Send {
        message: pb::WatchResponse,
        last: bool,
    },
    Fail(Status),
    Quiet,
    Stop,
}

fn from_delivery(delivery: Result<Delivery, crate::events::Lagged>) -> Step {
    match delivery {
        Ok(Delivery::Events { events, last }) => Step::Send {
            message: events_message(&events),
            last,
        },
        Ok(Delivery::End) => Step::Stop,
        Err(lagged) => Step::Fail(CoordError::WatcherLagged(lagged).into()),
    }
}

/// Runs until the watch ends; dropping `tx` at the end closes the stream
/// with OK unless an error status was sent first.
pub async fn pump(
    mut subscription: Subscription,
    tx: mpsc::Sender<WatchItem>,
    settings: WatchSettings,
    shutdown: CancellationToken,
) {
    let mut quiet_until = Instant::now() + settings.bookmark_interval;
    loop {
        let step = tokio::select! {
            biased;
            () = shutdown.cancelled() => Step::Stop,
            () = tx.closed() => Step::Stop,
            delivery = subscription.next(settings.max_batch) => from_delivery(delivery),
            () = tokio::time::sleep_until(quiet_until) => match subscription.bookmark(settings.max_batch) {
                Ok(Bookmark::Progress(progress_seq)) => Step::Send {
                    message: pb::WatchResponse { events: Vec::new(), progress_seq },
                    last: false,
                },
                Ok(Bookmark::Events(delivery)) => from_delivery(Ok(delivery)),
                Ok(Bookmark::NotNow) => Step::Quiet,
                Err(lagged) => Step::Fail(CoordError::WatcherLagged(lagged).into()),
            },
        };
        match step {
            Step::Send { message, last } => {
                let sent = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => false,
                    sent = tx.send(Ok(message)) => sent.is_ok(),
                };
                if !sent || last {
                    return;
                }
                quiet_until = Instant::now() + settings.bookmark_interval;
            }
            Step::Quiet => quiet_until = Instant::now() + settings.bookmark_interval,
            Step::Fail(status) => {
                tracing::info!(code = ?status.code(), message = status.message(), "watch ended");
                let _ = tx.send(Err(status)).await;
                return;
            }
            Step::Stop => return,
        }
    }
}
