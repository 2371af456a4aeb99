//! Delivers one Watch: its [`Subscription`] as the response stream,
//! batching events, sending a bookmark whenever the stream has been quiet for
//! the bookmark interval, ending cleanly at the session's `terminated` event
//! or at server shutdown, and ending with RESOURCE_EXHAUSTED when the watcher
//! fell behind.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio_stream::Stream;
use tonic::Status;

mod alarms;

use alarms::Alarm;
pub use alarms::Alarms;

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
/// built from async blocks, and its bookmark deadline and shutdown are a
/// slot in the server's [`Alarms`] rather than a timer and a future of its
/// own: a replica holds one watch per live call, and what each holds is
/// multiplied by them (docs/operations.md, "Memory"). The stream ends
/// cleanly at the session's `terminated` event or at server shutdown, and
/// with RESOURCE_EXHAUSTED when the watcher fell behind. How it ended is
/// recorded as `span`'s `outcome` when the stream is dropped ("client_left"
/// if the caller went first), and the watch's `slot` is held until then.
pub fn responses(
    subscription: Subscription,
    max_batch: usize,
    alarms: &Arc<Alarms>,
    slot: Option<WatchSlot>,
    span: tracing::Span,
) -> WatchStream {
    Box::pin(Watch {
        subscription,
        alarm: alarms.alarm(),
        max_batch: u32::try_from(max_batch).unwrap_or(u32::MAX),
        done: false,
        ending: Ending {
            outcome: Outcome::ClientLeft,
            slot,
            // Held only when recorded, boxed: 8 bytes in every open watch,
            // not a `Span`'s 40.
            span: (!span.is_disabled()).then(|| Box::new(span)),
        },
    })
}

/// The response stream a Watch answers with.
pub type WatchStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = WatchItem> + Send>>;

struct Watch {
    subscription: Subscription,
    alarm: Alarm,
    max_batch: u32,
    done: bool,
    ending: Ending,
}

/// How a watch ended, as its span records it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    ClientLeft,
    ServerShutdown,
    SessionTerminated,
    Lagged,
    Ended,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::ClientLeft => "client_left",
            Outcome::ServerShutdown => "server_shutdown",
            Outcome::SessionTerminated => "session_terminated",
            Outcome::Lagged => "lagged",
            Outcome::Ended => "ended",
        }
    }
}

/// Records how the watch ended when it is dropped, whoever drops it.
struct Ending {
    outcome: Outcome,
    slot: Option<WatchSlot>,
    span: Option<Box<tracing::Span>>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if self.outcome == Outcome::Lagged {
            if let Some(slot) = &self.slot {
                slot.count_lagged();
            }
        }
        if let Some(span) = &self.span {
            span.record("outcome", self.outcome.as_str());
        }
    }
}

impl Watch {
    fn end(&mut self, outcome: Outcome) {
        self.ending.outcome = outcome;
        self.done = true;
    }
}

impl Stream for Watch {
    type Item = WatchItem;

    /// Shutdown first, then events, then (when quiet) a bookmark.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchItem>> {
        // Every field is Unpin: the stream is polled in place.
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let max_batch = this.max_batch as usize;
        loop {
            if this.alarm.shutting_down() {
                this.end(Outcome::ServerShutdown);
                return Poll::Ready(None);
            }
            let step = if let Poll::Ready(delivery) = this.subscription.poll_next(cx, max_batch) {
                from_delivery(delivery)
            } else if this.alarm.bookmark_due() {
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
            } else if this.alarm.wait(cx.waker()) {
                // Shutdown began while the waker was being set.
                continue;
            } else {
                return Poll::Pending;
            };
            this.alarm.rearm();
            match step {
                Step::Send { message, last } => {
                    if last {
                        this.end(Outcome::SessionTerminated);
                    }
                    return Poll::Ready(Some(Ok(message)));
                }
                // Polled again: the new deadline is set when it waits.
                Step::Quiet => {}
                Step::Fail(status) => {
                    let log = || {
                        tracing::info!(
                            code = status.code() as i32,
                            message = status.message(),
                            "watch ended"
                        );
                    };
                    match &this.ending.span {
                        Some(span) => span.in_scope(log),
                        None => log(),
                    }
                    this.end(Outcome::Lagged);
                    return Poll::Ready(Some(Err(status)));
                }
                Step::Stop => {
                    this.end(Outcome::Ended);
                    return Poll::Ready(None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every open watch holds beyond the transport's share: measured by
    /// `respcoord-bench wire` (docs/operations.md, "Memory"); a regression
    /// here is a regression there, multiplied by every live call. 224 is a
    /// mimalloc size class: one byte more and the box costs 256 (it did
    /// before the span was held only when recorded, issue 43).
    #[test]
    fn an_open_watch_fits_in_224_bytes() {
        let size = std::mem::size_of::<Watch>();
        assert!(size <= 224, "a Watch stream is {size} bytes");
    }
}
