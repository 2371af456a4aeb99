//! Delivers one Watch: its [`Subscription`] as the response stream,
//! batching events, sending a bookmark whenever the stream has been quiet for
//! the bookmark interval, ending cleanly at the session's `terminated` event
//! or at server shutdown, and ending with RESOURCE_EXHAUSTED when the watcher
//! fell behind.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
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
            max_watchers: 150_000,
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
/// The body's own HTTP/2 stream task polls the subscription: an event
/// reaches the socket with no task or channel in between (a pump task
/// feeding a channel cost each batch one more wake-up, and under load one
/// more wait in the run queue). The stream is polled by hand rather than
/// built from async blocks: a replica holds one per live call, and the
/// futures an `unfold` + `select!` keep between polls doubled what an idle
/// watch cost (docs/operations.md, "Memory"). The stream ends cleanly at
/// the session's `terminated` event or at server shutdown, and with
/// RESOURCE_EXHAUSTED when the watcher fell behind. How it ended is recorded
/// as `span`'s `outcome` when the stream is dropped ("client_left" if the
/// caller went first), and the watch's `slot` is held until then.
pub fn responses(
    subscription: Subscription,
    settings: WatchSettings,
    shutdown: CancellationToken,
    slot: Option<WatchSlot>,
    span: tracing::Span,
) -> WatchStream {
    Box::pin(Watch {
        subscription,
        settings,
        shutdown: shutdown.cancelled_owned(),
        quiet: tokio::time::sleep(settings.bookmark_interval),
        done: false,
        ending: Ending {
            outcome: "client_left",
            slot,
            span,
        },
    })
}

/// The response stream a Watch answers with.
pub type WatchStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = WatchItem> + Send>>;

const LAGGED: &str = "lagged";

pin_project_lite::pin_project! {
    struct Watch {
        subscription: Subscription,
        settings: WatchSettings,
        #[pin]
        shutdown: WaitForCancellationFutureOwned,
        // Fires when the stream has been quiet for the bookmark interval.
        #[pin]
        quiet: Sleep,
        done: bool,
        ending: Ending,
    }
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

impl Stream for Watch {
    type Item = WatchItem;

    /// Shutdown first, then events, then (when quiet) a bookmark.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchItem>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        let max_batch = this.settings.max_batch;
        loop {
            if this.shutdown.as_mut().poll(cx).is_ready() {
                this.ending.outcome = "server_shutdown";
                *this.done = true;
                return Poll::Ready(None);
            }
            let step = if let Poll::Ready(delivery) = this.subscription.poll_next(cx, max_batch) {
                from_delivery(delivery)
            } else if this.quiet.as_mut().poll(cx).is_ready() {
                match this.subscription.bookmark(max_batch) {
                    Ok(Bookmark::Progress(progress_seq)) => Step::Send {
                        message: pb::WatchResponse {
                            events: Vec::new(),
                            progress_seq,
                        },
                        last: false,
                    },
                    Ok(Bookmark::Events(delivery)) => from_delivery(Ok(delivery)),
                    Ok(Bookmark::NotNow) => Step::Quiet,
                    Err(lagged) => Step::Fail(CoordError::WatcherLagged(lagged).into()),
                }
            } else {
                return Poll::Pending;
            };
            this.quiet
                .as_mut()
                .reset(Instant::now() + this.settings.bookmark_interval);
            match step {
                Step::Send { message, last } => {
                    if last {
                        this.ending.outcome = "session_terminated";
                        *this.done = true;
                    }
                    return Poll::Ready(Some(Ok(message)));
                }
                // Polled again: the reset timer must register its wake-up.
                Step::Quiet => {}
                Step::Fail(status) => {
                    this.ending.span.in_scope(|| {
                        tracing::info!(
                            code = status.code() as i32,
                            message = status.message(),
                            "watch ended"
                        );
                    });
                    this.ending.outcome = LAGGED;
                    *this.done = true;
                    return Poll::Ready(Some(Err(status)));
                }
                Step::Stop => {
                    this.ending.outcome = "ended";
                    *this.done = true;
                    return Poll::Ready(None);
                }
            }
        }
    }
}
