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

/// The counters live in `watchers` (read by `metrics` too); named here as
/// well, where the service takes them from.
pub use crate::watchers::{WatchKind, WatchSlot, WatchStats};

/// How watches are delivered.
#[derive(Clone, Copy, Debug)]
pub struct WatchSettings {
    /// A quiet stream gets a bookmark at least this often.
    pub bookmark_interval: Duration,
    /// Most events in one WatchResponse.
    pub max_batch: usize,
    /// WatchResponses buffered per stream before the watcher counts as slow.
    pub stream_buffer: usize,
    /// Most watches open at once; beyond it Watch is RESOURCE_EXHAUSTED.
    pub max_watchers: usize,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(10),
            max_batch: 256,
            stream_buffer: 16,
            max_watchers: 10_000,
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
/// with OK unless an error status was sent first. Records how it ended as
/// the current (RPC) span's `outcome`.
pub async fn pump(
    subscription: Subscription,
    tx: mpsc::Sender<WatchItem>,
    settings: WatchSettings,
    shutdown: CancellationToken,
) {
    let ended = deliver(subscription, &tx, settings, &shutdown).await;
    tracing::Span::current().record("outcome", ended);
}

/// As [`pump`], holding the watch's slot (the open-watch count) until the
/// watch ends and counting a lag ending.
pub async fn pump_counted(
    subscription: Subscription,
    tx: mpsc::Sender<WatchItem>,
    settings: WatchSettings,
    shutdown: CancellationToken,
    slot: WatchSlot,
) {
    let ended = deliver(subscription, &tx, settings, &shutdown).await;
    if ended == LAGGED {
        slot.count_lagged();
    }
    tracing::Span::current().record("outcome", ended);
    drop(slot);
}

const LAGGED: &str = "lagged";

/// The delivery loop; returns how the watch ended.
async fn deliver(
    mut subscription: Subscription,
    tx: &mpsc::Sender<WatchItem>,
    settings: WatchSettings,
    shutdown: &CancellationToken,
) -> &'static str {
    let mut quiet_until = Instant::now() + settings.bookmark_interval;
    loop {
        let step = tokio::select! {
            biased;
            () = shutdown.cancelled() => return "server_shutdown",
            () = tx.closed() => return "client_left",
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
                    () = shutdown.cancelled() => return "server_shutdown",
                    sent = tx.send(Ok(message)) => sent.is_ok(),
                };
                if !sent {
                    return "client_left";
                }
                if last {
                    return "session_terminated";
                }
                quiet_until = Instant::now() + settings.bookmark_interval;
            }
            Step::Quiet => quiet_until = Instant::now() + settings.bookmark_interval,
            Step::Fail(status) => {
                tracing::info!(code = ?status.code(), message = status.message(), "watch ended");
                let _ = tx.send(Err(status)).await;
                return LAGGED;
            }
            Step::Stop => return "ended",
        }
    }
}
