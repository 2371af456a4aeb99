//! A watch's source of live events, costing what it holds: one per watched
//! session (a replica holds one per live call when gateways fence through
//! session watches) and one for watch-all.
//!
//! A `tokio::sync::broadcast` channel preallocates its whole bound
//! (`--session-watch-buffer` slots, about 10 KB at 256) for a session that
//! emits a handful of events per response. A feed allocates only for events
//! some receiver has not read yet, each held once however many receivers
//! share it, and frees them as the last one reads them; an idle receiver is
//! a cursor and, while its watch waits, the watch task's waker. Receivers are
//! polled, not awaited, so a watch's response stream holds no future of its
//! own (`grpc::watch`).
//!
//! The semantics are broadcast's: a receiver sees every event sent after it
//! subscribed, in order; one that falls more than the bound behind gets
//! `Lagged` (the watch is then ended, never left with a silent gap); a
//! closed feed reports `Closed` once drained.

use std::{
    collections::VecDeque,
    sync::{Arc, PoisonError},
    task::{Context, Poll, Waker},
};

use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::sync::{Mutex, MutexGuard};

use super::SharedEvent;

/// Capacity kept by an emptied queue; beyond it the allocation is returned,
/// so a burst (a resume, a slow reader) does not stay paid for.
const KEPT_WHEN_EMPTY: usize = 8;

/// A feed, shared by its receivers and the code that publishes its events.
pub(crate) struct Feed {
    state: Mutex<FeedState>,
}

struct FeedState {
    /// Events some receiver has yet to read, oldest first; `pending[i]` is
    /// at position `front + i`.
    pending: VecDeque<Pending>,
    front: u64,
    receivers: usize,
    /// Events a receiver may trail the newest by before it has lagged.
    bound: usize,
    closed: bool,
    /// Receivers waiting for the next send (by receiver id), woken by it.
    waiting: Vec<(u64, Waker)>,
    next_receiver_id: u64,
}

struct Pending {
    event: SharedEvent,
    /// Receivers subscribed when it was sent that have not read it.
    unread: usize,
}

impl Feed {
    pub(crate) fn new(bound: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(FeedState {
                pending: VecDeque::new(),
                front: 0,
                receivers: 0,
                bound: bound.max(1),
                closed: false,
                waiting: Vec::new(),
                next_receiver_id: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, FeedState> {
        // Every update leaves the state consistent between statements that
        // cannot panic, so a poisoned lock holds nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A receiver of every event sent from now on.
    pub(crate) fn subscribe(self: &Arc<Self>) -> FeedReceiver {
        let mut state = self.lock();
        state.receivers += 1;
        state.next_receiver_id += 1;
        let id = state.next_receiver_id;
        let next = state.end();
        drop(state);
        FeedReceiver {
            feed: Arc::clone(self),
            next,
            id,
        }
    }

    pub(crate) fn receiver_count(&self) -> usize {
        self.lock().receivers
    }

    /// Hands `events` to every receiver, in order; never waits. With nobody
    /// subscribed they are dropped, as broadcast drops them.
    pub(crate) fn send(&self, events: &[SharedEvent]) {
        let mut state = self.lock();
        if state.receivers == 0 || events.is_empty() {
            return;
        }
        let unread = state.receivers;
        if state.pending.capacity() == 0 {
            // A session's feed usually holds one transition's events at a
            // time; past that, growth doubles (exact growth on every send
            // would copy a lagging watch-all's queue each time).
            state.pending.reserve_exact(events.len());
        }
        for event in events {
            if state.pending.len() == state.bound {
                // The oldest goes; whoever had not read it has lagged.
                state.pending.pop_front();
                state.front += 1;
            }
            state.pending.push_back(Pending {
                event: SharedEvent::clone(event),
                unread,
            });
        }
        state.wake_all();
    }

    /// No more events will be sent: receivers get `Closed` once drained.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.wake_all();
    }
}

impl FeedState {
    /// The position the next sent event takes.
    fn end(&self) -> u64 {
        self.front + self.pending.len() as u64
    }

    /// Wakes every waiting receiver (each rechecks when polled). The list
    /// keeps its allocation: the same watches wait again after each send.
    fn wake_all(&mut self) {
        for (_, waker) in self.waiting.drain(..) {
            waker.wake();
        }
    }

    /// Drops the events every receiver has read.
    fn trim(&mut self) {
        while self.pending.front().is_some_and(|p| p.unread == 0) {
            self.pending.pop_front();
            self.front += 1;
        }
        if self.pending.is_empty() && self.pending.capacity() > KEPT_WHEN_EMPTY {
            self.pending = VecDeque::new();
        }
    }
}

/// One watcher's place in a [`Feed`].
pub(crate) struct FeedReceiver {
    feed: Arc<Feed>,
    /// Position of the next event this receiver reads.
    next: u64,
    /// Names this receiver's entry in the feed's waiting list.
    id: u64,
}

impl FeedReceiver {
    /// The next event if one is ready, as `broadcast::Receiver::try_recv`.
    pub(crate) fn try_recv(&mut self) -> Result<SharedEvent, TryRecvError> {
        take(&mut self.feed.lock(), &mut self.next)
    }

    /// The next event, or `Pending` with `cx`'s waker kept until the next
    /// send or close: `broadcast::Receiver::recv` as a poll. Checked and
    /// registered under one lock, so no send falls between the two.
    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SharedEvent, RecvError>> {
        let mut state = self.feed.lock();
        match take(&mut state, &mut self.next) {
            Ok(event) => Poll::Ready(Ok(event)),
            Err(TryRecvError::Lagged(missed)) => Poll::Ready(Err(RecvError::Lagged(missed))),
            Err(TryRecvError::Closed) => Poll::Ready(Err(RecvError::Closed)),
            Err(TryRecvError::Empty) => {
                let id = self.id;
                match state.waiting.iter_mut().find(|(waiting, _)| *waiting == id) {
                    Some((_, waker)) => waker.clone_from(cx.waker()),
                    None => {
                        if state.waiting.capacity() == 0 {
                            // Most feeds have one watcher: room for one, not
                            // the four a first push reserves.
                            state.waiting.reserve_exact(1);
                        }
                        state.waiting.push((id, cx.waker().clone()));
                    }
                }
                Poll::Pending
            }
        }
    }
}

/// Reads the event at `next`, moving `next` past it.
fn take(state: &mut FeedState, next: &mut u64) -> Result<SharedEvent, TryRecvError> {
    if *next < state.front {
        let missed = state.front - *next;
        // Past the gap, as broadcast does; the watch ends here anyway.
        *next = state.front;
        return Err(TryRecvError::Lagged(missed));
    }
    let index = usize::try_from(*next - state.front).unwrap_or(usize::MAX);
    let Some(pending) = state.pending.get_mut(index) else {
        return Err(if state.closed {
            TryRecvError::Closed
        } else {
            TryRecvError::Empty
        });
    };
    pending.unread -= 1;
    let event = SharedEvent::clone(&pending.event);
    *next += 1;
    state.trim();
    Ok(event)
}

impl Drop for FeedReceiver {
    fn drop(&mut self) {
        let mut state = self.feed.lock();
        state.receivers -= 1;
        let id = self.id;
        state.waiting.retain(|(waiting, _)| *waiting != id);
        // Release what this receiver would still have read.
        let from = usize::try_from(self.next.saturating_sub(state.front)).unwrap_or(usize::MAX);
        for pending in state.pending.iter_mut().skip(from) {
            pending.unread -= 1;
        }
        state.trim();
    }
}

#[cfg(test)]
mod tests;
