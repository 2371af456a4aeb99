//! Delivers one Watch: its [`Subscription`] as the response stream,
//! batching events, sending a bookmark whenever the stream has been quiet for
//! the bookmark interval, ending cleanly at the session's `terminated` event
//! or at server shutdown, and ending with RESOURCE_EXHAUSTED when the watcher
//! fell behind.

use std::time::Duration;

use tokio::time::Instant;
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
    /// Most watches open at once; beyond it Watch is RESOURCE_EXHAUSTED.
    pub max_watchers: usize,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(10),
            max_batch: 256,
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

/// One Watch's responses, as the RPC's response body polls them.
///
/// The body's own HTTP/2 stream task drives the subscription: an event
/// reaches the socket with no task or channel in between (a pump task
/// feeding a channel cost each batch one more wake-up, and under load one
/// more wait in the run queue). The stream ends cleanly at the session's
/// `terminated` event or at server shutdown, and with RESOURCE_EXHAUSTED
/// when the watcher fell behind. How it ended is recorded as `span`'s
/// `outcome` when the stream is dropped ("client_left" if the caller went
/// first), and the watch's `slot` is held until then.
pub fn responses(
    subscription: Subscription,
    settings: WatchSettings,
    shutdown: CancellationToken,
    slot: Option<WatchSlot>,
    span: tracing::Span,
) -> WatchStream {
    let watch = Watch {
        subscription,
        settings,
        shutdown,
        quiet_until: Instant::now() + settings.bookmark_interval,
        ending: Ending {
            outcome: "client_left",
            slot,
            span,
        },
    };
    Box::pin(futures_util::stream::unfold(
        Some(watch),
        |watch| async move {
            let mut watch = watch?;
            let (item, more) = watch.next().await?;
            Some((item, more.then_some(watch)))
        },
    ))
}

/// The response stream a Watch answers with.
pub type WatchStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = WatchItem> + Send>>;

const LAGGED: &str = "lagged";

struct Watch {
    subscription: Subscription,
    settings: WatchSettings,
    shutdown: CancellationToken,
    quiet_until: Instant,
    ending: Ending,
}

/// Records how the watch ended when it is dropped, whoever drops it.
struct Ending {
    outcome: &'static str,
    slot: Option<WatchSlot>,
    span: tracing::Span,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if self.outcome == LAGGED {
            if let Some(slot) = &self.slot {
                slot.count_lagged();
            }
        }
        self.span.record("outcome", self.outcome);
    }
}

impl Watch {
    /// The next response and whether any may follow it; `None` when the
    /// stream ends cleanly.
    async fn next(&mut self) -> Option<(WatchItem, bool)> {
        let max_batch = self.settings.max_batch;
        loop {
            let step = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => {
                    self.ending.outcome = "server_shutdown";
                    return None;
                }
                delivery = self.subscription.next(max_batch) => from_delivery(delivery),
                () = tokio::time::sleep_until(self.quiet_until) => {
                    match self.subscription.bookmark(max_batch) {
                        Ok(Bookmark::Progress(progress_seq)) => Step::Send {
                            message: pb::WatchResponse { events: Vec::new(), progress_seq },
                            last: false,
                        },
                        Ok(Bookmark::Events(delivery)) => from_delivery(Ok(delivery)),
                        Ok(Bookmark::NotNow) => Step::Quiet,
                        Err(lagged) => Step::Fail(CoordError::WatcherLagged(lagged).into()),
                    }
                }
            };
            self.quiet_until = Instant::now() + self.settings.bookmark_interval;
            match step {
                Step::Send { message, last } => {
                    if last {
                        self.ending.outcome = "session_terminated";
                    }
                    return Some((Ok(message), !last));
                }
                Step::Quiet => {}
                Step::Fail(status) => {
                    self.ending.span.in_scope(|| {
                        tracing::info!(code = ?status.code(), message = status.message(), "watch ended");
                    });
                    self.ending.outcome = LAGGED;
                    return Some((Err(status), false));
                }
                Step::Stop => {
                    self.ending.outcome = "ended";
                    return None;
                }
            }
        }
    }
}
