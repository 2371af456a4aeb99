//! The handover from a watch's backlog to its live stream: the rule itself
//! (`Scope::after_backlog`), a property over every way a backlog read after
//! the live subscription can overlap the live stream (what the NATS backend
//! does), and the memory event log's watch-all opened at arbitrary points of
//! a run.

use std::{
    future::Future,
    pin::pin,
    task::{Context, Poll, Waker},
};

use proptest::{prelude::*, test_runner::FileFailurePersistence};

use super::*;
use crate::{
    ids::SessionId,
    machine::{EventKind, Source},
};

fn sid() -> SessionId {
    SessionId::parse("s").unwrap()
}

/// The event a session emits at `revision`, with seq `seq`.
fn event(revision: u64, seq: u64) -> SharedEvent {
    Arc::new(LifecycleEvent {
        session_id: sid(),
        revision,
        seq,
        unix_nanos: 0,
        kind: EventKind::Started {
            response: crate::ids::ResponseId::MIN,
            source: Source::Client,
        },
    })
}

fn log() -> Arc<EventLog> {
    Arc::new(EventLog::new(
        0,
        LogLimits {
            retained_events: 1024,
            watch_all_buffer: 1024,
        },
    ))
}

/// Everything `subscription` can deliver without waiting, and whether it
/// ended. Polls with a no-op waker: every event is already published when
/// this runs, so nothing here depends on timing.
fn drain_now(subscription: &mut Subscription) -> (Vec<SharedEvent>, bool) {
    let mut out = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let next = pin!(subscription.next(7));
        match next.poll(&mut cx) {
            Poll::Pending => return (out, false),
            Poll::Ready(Ok(Delivery::Events { events, last })) => {
                out.extend(events);
                if last {
                    return (out, true);
                }
            }
            Poll::Ready(Ok(Delivery::End)) => return (out, true),
            Poll::Ready(Err(lagged)) => panic!("a test watcher lagged: {lagged:?}"),
        }
    }
}

fn revisions(events: &[SharedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.revision).collect()
}

#[test]
fn after_backlog_raises_the_threshold_to_what_the_backlog_holds() {
    let backlog: VecDeque<_> = [event(3, 30), event(4, 41), event(5, 57)].into();
    assert_eq!(
        Scope::session(Some(2), 3).after_backlog(&backlog),
        Scope::Session {
            skip_through_revision: 5
        }
    );
    assert_eq!(
        Scope::All {
            skip_through_seq: 12
        }
        .after_backlog(&backlog),
        Scope::All {
            skip_through_seq: 57
        }
    );
    // Never lowered: a backlog below the threshold changes nothing.
    assert_eq!(
        Scope::session(Some(9), 3).after_backlog(&backlog),
        Scope::session(Some(9), 3)
    );
    let far = Scope::All {
        skip_through_seq: 99,
    };
    assert_eq!(far.after_backlog(&backlog), far);
    // An empty backlog: what the watch asked for, or live from `current`.
    let empty = VecDeque::new();
    assert_eq!(
        Scope::session(Some(2), 7).after_backlog(&empty),
        Scope::Session {
            skip_through_revision: 2
        }
    );
    assert_eq!(
        Scope::session(None, 7).after_backlog(&empty),
        Scope::Session {
            skip_through_revision: 7
        }
    );
}

/// The interleaving, by hand: a session at revision 1 is watched
/// from 0; its backlog, read later, holds 1..=4, and the live stream
/// (subscribed first) carries 1..=6. Revisions come once.
#[test]
fn a_backlog_read_after_later_writes_is_not_repeated_live() {
    let feed = Feed::new(64);
    let live = feed.subscribe();
    for revision in 1..=6 {
        feed.send(&[event(revision, 10 * revision)]);
    }
    let backlog = (1..=4).map(|r| event(r, 10 * r)).collect();
    let mut watch = Subscription::new(Scope::session(Some(0), 1), backlog, live, log(), None);
    let (events, ended) = drain_now(&mut watch);
    assert!(!ended);
    assert_eq!(revisions(&events), [1, 2, 3, 4, 5, 6]);
}

/// How one session watch's setup saw a session that emits revisions
/// `1..=total`: it subscribed to the live stream at `subscribed_at` (the
/// stream carries revisions after it), read revision `current` (at or after
/// subscribing), and read its backlog when the session was at `backlog_to`
/// (at or after the read), as the NATS backend's steps do in that order.
#[derive(Debug, Clone)]
struct Setup {
    total: u64,
    subscribed_at: u64,
    current: u64,
    backlog_to: u64,
    after_revision: Option<u64>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        0u64..40,
        0u64..40,
        0u64..40,
        0u64..40,
        any::<bool>(),
        0u64..45,
    )
        .prop_map(|(total, a, b, c, resume, after)| {
            let mut points = [a % (total + 1), b % (total + 1), c % (total + 1)];
            points.sort_unstable();
            Setup {
                total,
                subscribed_at: points[0],
                current: points[1],
                backlog_to: points[2],
                after_revision: resume.then_some(after),
            }
        })
}

/// The proptest settings of the event log's tests (`feed` uses them too).
pub(super) fn case() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        // A failing case is saved beside the test file and retried first.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(case())]

    /// Backlog then live, however they overlap: exactly the revisions after
    /// `after_revision` (or after the one read, for a live-only watch), in
    /// order, each once.
    #[test]
    fn a_session_handover_never_repeats_or_skips(setup in setup()) {
        let Setup { total, subscribed_at, current, backlog_to, after_revision } = setup;
        let feed = Feed::new(64);
        let live = feed.subscribe();
        for revision in subscribed_at + 1..=total {
            feed.send(&[event(revision, 100 + revision)]);
        }
        // What a backend fetches: the history after the resume point, as the
        // session stood at `backlog_to`, when it is behind what was read.
        let backlog: VecDeque<_> = match after_revision {
            Some(after) if after < current => {
                (after + 1..=backlog_to).map(|r| event(r, 100 + r)).collect()
            }
            _ => VecDeque::new(),
        };
        let mut watch = Subscription::new(
            Scope::session(after_revision, current),
            backlog,
            live,
            log(),
            None,
        );
        let (events, ended) = drain_now(&mut watch);
        prop_assert!(!ended);
        let from = after_revision.unwrap_or(current);
        prop_assert_eq!(revisions(&events), (from + 1..=total).collect::<Vec<_>>());
    }

    /// The memory event log: watch-alls opened between arbitrary appends,
    /// from arbitrary seqs, each deliver exactly the events after their
    /// resume point (OUT_OF_RANGE once those left the window) and every
    /// later one, in seq order, each once.
    #[test]
    fn watch_all_opened_anywhere_delivers_each_event_once(
        batches in proptest::collection::vec(1usize..=4, 0..30),
        opens in proptest::collection::vec((0usize..30, proptest::option::of(0u64..90)), 0..8),
        retained in 1usize..64,
    ) {
        let base = 1_000;
        let log = Arc::new(EventLog::new(
            base,
            LogLimits { retained_events: retained, watch_all_buffer: 1024 },
        ));
        let mut watches = Vec::new();
        let mut revision = 0;
        for step in 0..=batches.len() {
            for &(at, after) in &opens {
                if at == step {
                    let after_seq = after.map(|a| if a == 0 { 0 } else { base + a });
                    let published = log.published_seq();
                    watches.push((after_seq, published, log.subscribe_all(after_seq)));
                }
            }
            let Some(&n) = batches.get(step) else { break };
            let mut append = log.begin_append();
            let first_seq = append.next_seq();
            let events: Vec<_> = (0..n as u64)
                .map(|i| {
                    revision += 1;
                    event(revision, first_seq + i)
                })
                .collect();
            append.publish(None, &events);
        }
        let last = log.published_seq();
        for (after_seq, published, opened) in watches {
            let from = match after_seq {
                Some(0) => base,
                Some(after) => after,
                None => published,
            };
            match opened {
                Ok(mut watch) => {
                    let (events, ended) = drain_now(&mut watch);
                    prop_assert!(!ended);
                    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
                    prop_assert_eq!(seqs, (from + 1..=last).collect::<Vec<_>>());
                }
                Err(CoordError::HistoryUnavailable { oldest_available, .. }) => {
                    // Refused only when some event after `from` was evicted.
                    prop_assert!(from < oldest_available);
                    prop_assert!(published.saturating_sub(base) > retained as u64);
                }
                Err(other) => prop_assert!(false, "{other:?}"),
            }
        }
    }
}
