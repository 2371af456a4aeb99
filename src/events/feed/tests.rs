//! The feed against `tokio::sync::broadcast` as the independent model: any
//! sequence of sends, subscribes, reads, drops and a close gives every
//! receiver what a broadcast receiver of the same bound would get; and what
//! the feed holds is only what some receiver has yet to read.

use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use tokio::sync::broadcast;

use super::*;
use crate::events::tests::case;
use crate::{
    event::LifecycleEvent,
    ids::{ResponseId, SessionId},
    machine::{EventKind, Source},
};

fn event(seq: u64) -> SharedEvent {
    Arc::new(LifecycleEvent {
        session_id: SessionId::parse("s").unwrap(),
        revision: seq,
        seq,
        unix_nanos: 0,
        kind: EventKind::Started {
            response: ResponseId::MIN,
            source: Source::Client,
        },
    })
}

fn held(feed: &Feed) -> usize {
    feed.lock().pending.len()
}

/// What a read returned, comparable across the two implementations.
fn seen(result: Result<SharedEvent, TryRecvError>) -> Result<u64, String> {
    result.map(|e| e.seq).map_err(|e| format!("{e:?}"))
}

#[derive(Debug, Clone)]
enum Op {
    Send,
    Subscribe,
    Read(usize),
    Drop(usize),
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Send),
        1 => Just(Op::Subscribe),
        4 => (0usize..6).prop_map(Op::Read),
        1 => (0usize..6).prop_map(Op::Drop),
    ]
}

proptest! {
    #![proptest_config(case())]

    #[test]
    fn a_feed_delivers_what_a_broadcast_channel_of_its_bound_delivers(
        // broadcast rounds its capacity up to a power of two.
        bound_log2 in 0u32..4,
        ops in proptest::collection::vec(op(), 0..120),
        // At most once, as in service: a mirror that lost events closes its feeds.
        close_at in proptest::option::of(0usize..120),
    ) {
        let bound = 1usize << bound_log2;
        let feed = Feed::new(bound);
        let (model, _) = broadcast::channel::<SharedEvent>(bound);
        let mut model = Some(model);
        let mut pairs: Vec<(FeedReceiver, broadcast::Receiver<SharedEvent>)> = Vec::new();
        let mut next_seq = 1;
        let ops = ops.into_iter().enumerate().flat_map(|(i, op)| {
            (Some(i) == close_at).then_some(Op::Close).into_iter().chain([op])
        });
        for op in ops {
            match op {
                Op::Send => {
                    let event = event(next_seq);
                    next_seq += 1;
                    if let Some(model) = &model {
                        feed.send(std::slice::from_ref(&event));
                        let _ = model.send(event);
                    }
                }
                Op::Subscribe => {
                    if let Some(model) = &model {
                        pairs.push((feed.subscribe(), model.subscribe()));
                    }
                }
                Op::Read(i) if !pairs.is_empty() => {
                    let len = pairs.len();
                    let (ours, theirs) = &mut pairs[i % len];
                    prop_assert_eq!(seen(ours.try_recv()), seen(theirs.try_recv()));
                }
                Op::Drop(i) if !pairs.is_empty() => {
                    pairs.swap_remove(i % pairs.len());
                }
                Op::Read(_) | Op::Drop(_) => {}
                Op::Close => {
                    feed.close();
                    model = None;
                }
            }
            prop_assert_eq!(feed.receiver_count(), pairs.len());
            // Held: exactly the events some receiver has not read (or, for
            // one that lagged, not yet been told it missed), at most the bound.
            let unread = pairs.iter().map(|(ours, _)| {
                let state = feed.lock();
                state.end() - ours.next.max(state.front)
            }).max().unwrap_or(0);
            prop_assert_eq!(held(&feed) as u64, unread);
            prop_assert!(held(&feed) <= bound);
        }
        // Everyone drains to the same end.
        for (ours, theirs) in &mut pairs {
            loop {
                let (a, b) = (seen(ours.try_recv()), seen(theirs.try_recv()));
                prop_assert_eq!(&a, &b);
                if a.is_err() && !a.as_ref().is_err_and(|e| e.starts_with("Lagged")) {
                    break;
                }
            }
        }
        drop(pairs);
        prop_assert_eq!(held(&feed), 0);
    }
}

#[test]
fn an_emptied_feed_returns_a_burst_s_allocation() {
    let feed = Feed::new(256);
    let mut receiver = feed.subscribe();
    for seq in 1..=200 {
        feed.send(&[event(seq)]);
    }
    assert!(feed.lock().pending.capacity() >= 200);
    while receiver.try_recv().is_ok() {}
    assert_eq!(held(&feed), 0);
    assert!(feed.lock().pending.capacity() <= KEPT_WHEN_EMPTY);
}

/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn wakes() -> (Arc<Wakes>, Waker) {
    let wakes = Arc::new(Wakes(0.into()));
    (Arc::clone(&wakes), Waker::from(wakes))
}

fn woken(wakes: &Wakes) -> usize {
    wakes.0.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn a_waiting_receiver_is_woken_once_by_a_send_and_by_a_close() {
    let feed = Feed::new(4);
    let mut receiver = feed.subscribe();
    let (count, waker) = wakes();
    let mut context = Context::from_waker(&waker);
    assert!(receiver.poll_recv(&mut context).is_pending());
    // Polled again before anything came: still one registration.
    assert!(receiver.poll_recv(&mut context).is_pending());
    assert_eq!(feed.lock().waiting.len(), 1);
    feed.send(&[event(7)]);
    assert_eq!(woken(&count), 1);
    assert!(matches!(
        receiver.poll_recv(&mut context),
        Poll::Ready(Ok(event)) if event.seq == 7
    ));
    assert!(receiver.poll_recv(&mut context).is_pending());
    feed.close();
    assert_eq!(woken(&count), 2);
    assert!(matches!(
        receiver.poll_recv(&mut context),
        Poll::Ready(Err(RecvError::Closed))
    ));
}

/// A receiver that stops waiting (its watch ended) leaves nothing behind.
#[test]
fn a_dropped_receiver_leaves_no_waker_and_no_unread_event() {
    let feed = Feed::new(4);
    let mut staying = feed.subscribe();
    let mut leaving = feed.subscribe();
    let mut context = Context::from_waker(Waker::noop());
    assert!(leaving.poll_recv(&mut context).is_pending());
    feed.send(&[event(1), event(2)]);
    assert_eq!(held(&feed), 2);
    drop(leaving);
    assert!(feed.lock().waiting.is_empty());
    assert_eq!(feed.receiver_count(), 1);
    assert_eq!(staying.try_recv().map(|e| e.seq), Ok(1));
    assert_eq!(held(&feed), 1);
    assert_eq!(staying.try_recv().map(|e| e.seq), Ok(2));
    assert_eq!(held(&feed), 0);
}
