//! Registry behaviour that needs control of time or a look inside: idle
//! expiry and tombstones on tokio's paused clock, the expirer task's wake-ups,
//! page cursors, and watcher bookkeeping.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};

use super::{expiry::EXPIRY_BATCH, *};
use crate::{
    events::{Delivery, Subscription},
    machine::{CancelReason, EventKind, FinishStatus, Source, Terminal},
};

const IDLE: Duration = Duration::from_secs(10);
const TOMBSTONE: Duration = Duration::from_secs(5);

fn registry() -> Registry {
    Registry::new(CoordConfig {
        idle_ttl: IDLE,
        tombstone_ttl: TOMBSTONE,
        shards: 4,
        ..Default::default()
    })
}

fn sid(raw: &str) -> SessionId {
    SessionId::parse(raw).unwrap()
}

async fn advance(by: Duration) {
    tokio::time::advance(by).await;
}

/// `s` is gone, and was the only session held.
fn assert_forgotten(registry: &Registry, s: &SessionId) {
    assert!(matches!(
        registry.state(s),
        Err(CoordError::SessionNotFound(_))
    ));
    assert_eq!(registry.session_count(), 0);
}

async fn events(subscription: &mut Subscription) -> Vec<EventKind> {
    match subscription.next(64).await {
        Ok(Delivery::Events { events, .. }) => events.iter().map(|e| e.kind).collect(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_expires_no_earlier_than_its_ttl() {
    let registry = registry();
    let s = sid("s");
    let started = registry.start(&s, Source::Client, None).unwrap();
    let mut all = registry.watch_all(None).unwrap();

    advance(IDLE).await;
    registry.expire_due();
    assert!(matches!(
        registry.state(&s).map(|st| st.phase),
        Ok(Phase::Active(_))
    ));
    // The GetState above was a call: the clock restarts from it.
    advance(IDLE).await;
    registry.expire_due();
    assert!(matches!(
        registry.state(&s).map(|st| st.phase),
        Ok(Phase::Active(_))
    ));
    advance(IDLE + Duration::from_millis(2)).await;
    registry.expire_due();

    let expired = events(&mut all).await;
    assert_eq!(
        expired,
        [
            EventKind::CancelRequested {
                response: started.response,
                reason: CancelReason::Expired,
                source: crate::machine::Source::Unspecified,
            },
            EventKind::Ended {
                response: started.response,
                ending: Terminal::Cancelled(CancelReason::Expired)
            },
            EventKind::Terminated {
                reason: TeardownReason::Expired
            },
        ]
    );
    assert_eq!(registry.state(&s).unwrap().phase, Phase::Terminated);
    assert!(matches!(
        registry.start(&s, Source::Client, None),
        Err(CoordError::SessionTerminated(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn every_kind_of_call_keeps_a_session_alive() {
    let registry = registry();
    let s = sid("s");
    let id = registry.start(&s, Source::Vad, None).unwrap().response;
    let step = IDLE - Duration::from_secs(1);
    advance(step).await;
    registry
        .finish(&s, ResponseId::new(1), FinishStatus::Completed)
        .unwrap(); // stale, still a call
    advance(step).await;
    registry
        .cancel(&s, ResponseId::new(1), Source::Client)
        .unwrap(); // no match, still a call
    advance(step).await;
    registry.state(&s).unwrap();
    advance(step).await;
    registry.expire_due();
    assert_eq!(
        registry.state(&s).unwrap().phase.active().map(|a| a.id),
        Some(id)
    );
}

#[tokio::test(start_paused = true)]
async fn tombstones_are_forgotten_and_the_id_can_start_again_with_larger_ids() {
    let registry = registry();
    let s = sid("s");
    let old = registry.start(&s, Source::Client, None).unwrap().response;
    registry.shutdown(&s).unwrap();
    assert_eq!(registry.session_count(), 1);
    advance(TOMBSTONE).await;
    registry.expire_due();
    assert_eq!(registry.state(&s).unwrap().phase, Phase::Terminated);
    advance(Duration::from_millis(2)).await;
    registry.expire_due();
    assert_forgotten(&registry, &s);

    let new = registry.start(&s, Source::Client, None).unwrap();
    assert!(new.response > old, "ids are never reused for a session id");
    assert_eq!(
        new.state.revision, 1,
        "a new session starts its own revisions"
    );
}

/// A session remembers its live expiry entry by the low 32 bits of its due
/// time, so a stale entry 2^32 ms (49.7 days) earlier is taken for live. That
/// may cost a refile, never an early expiry: here the stale idle entry comes
/// due first and the tombstone is still kept until its own deadline.
#[tokio::test(start_paused = true)]
async fn a_stale_expiry_entry_taken_for_live_forgets_nothing_early() {
    let collision = Duration::from_millis(1 << 32);
    let registry = Registry::new(CoordConfig {
        idle_ttl: IDLE,
        tombstone_ttl: IDLE + collision,
        shards: 1,
        ..Default::default()
    });
    let s = sid("s");
    registry.start(&s, Source::Client, None).unwrap();
    registry.shutdown(&s).unwrap();
    advance(IDLE + Duration::from_millis(5)).await;
    let next = registry.expire_due();
    assert_eq!(registry.state(&s).unwrap().phase, Phase::Terminated);
    assert!(next.is_some(), "the tombstone still has an entry");
    advance(collision - Duration::from_millis(10)).await;
    registry.expire_due();
    assert_eq!(registry.state(&s).unwrap().phase, Phase::Terminated);
    advance(Duration::from_millis(10)).await;
    registry.expire_due();
    assert_forgotten(&registry, &s);
}

#[tokio::test(start_paused = true)]
async fn the_expirer_wakes_for_earlier_deadlines_without_polling() {
    let registry = Registry::new(CoordConfig {
        idle_ttl: Duration::from_secs(3600),
        tombstone_ttl: Duration::from_secs(1),
        ..Default::default()
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let expirer = tokio::spawn({
        let registry = registry.clone();
        let stop = stop.clone();
        async move { registry.run_expiry(stop.cancelled_owned()).await }
    });
    // The expirer now sleeps until the hour-long idle deadline...
    registry.start(&sid("long"), Source::Client, None).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // ...and a tombstone due in one second must wake it early.
    registry.shutdown(&sid("short")).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(matches!(
        registry.state(&sid("short")),
        Err(CoordError::SessionNotFound(_))
    ));
    assert!(registry.state(&sid("long")).is_ok());
    // Auto-advancing paused time past the idle deadline (counted from the
    // GetState above, itself a call) expires the other.
    tokio::time::sleep(Duration::from_secs(3601)).await;
    assert_eq!(
        registry.state(&sid("long")).map(|s| s.phase),
        Ok(Phase::Terminated)
    );
    stop.cancel();
    expirer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_mass_expiry_is_processed_in_batches() {
    let registry = registry();
    for i in 0..(EXPIRY_BATCH * 3) {
        registry
            .start(&sid(&format!("s{i}")), Source::Client, None)
            .unwrap();
    }
    advance(IDLE + Duration::from_millis(2)).await;
    registry.expire_due();
    let page = registry.list(10_000, None).unwrap();
    assert_eq!(page.sessions.len(), EXPIRY_BATCH * 3);
    assert!(page.sessions.iter().all(|s| s.phase == Phase::Terminated));
}

#[test]
fn page_cursors_round_trip_and_foreign_tokens_are_refused() {
    let cursor = PageCursor {
        instance: 17,
        shard_count: 64,
        shard: 3,
        after: Some((u64::MAX, sid("tenant\u{a0}a/x:y"))),
    };
    assert_eq!(PageCursor::decode(&cursor.encode()), Ok(cursor));
    let start = PageCursor {
        instance: 17,
        shard_count: 8,
        shard: 7,
        after: None,
    };
    assert_eq!(PageCursor::decode(&start.encode()), Ok(start));
    for bad in [
        "",
        "garbage",
        "djE",
        &URL_SAFE_NO_PAD.encode("v2\x0017\x008\x009\x00\x00"),
        &URL_SAFE_NO_PAD.encode("v2\x0017\x008\x001\x00x\x00id"),
        &URL_SAFE_NO_PAD.encode("v2\x0017\x008\x001\x005"),
    ] {
        assert!(PageCursor::decode(bad).is_err(), "{bad:?}");
    }
    // A token from another instance is refused by the registry.
    let registry = registry();
    let foreign = PageCursor {
        instance: 17,
        shard_count: 4,
        shard: 0,
        after: None,
    };
    assert!(matches!(
        registry.list(10, Some(foreign)),
        Err(CoordError::InvalidArgument {
            field: "page_token",
            ..
        })
    ));
}

#[test]
fn listing_in_small_pages_visits_every_session_once() {
    let registry = registry();
    let ids: std::collections::BTreeSet<String> = (0..103).map(|i| format!("s{i}")).collect();
    for id in &ids {
        registry.start(&sid(id), Source::Client, None).unwrap();
    }
    for page_size in [1, 2, 7, 50, 103, 1000] {
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = registry.list(page_size, cursor).unwrap();
            assert!(page.sessions.len() <= page_size);
            seen.extend(page.sessions.into_iter().map(|s| s.session_id.to_string()));
            match page.next {
                Some(next) => cursor = Some(PageCursor::decode(&next.encode()).unwrap()),
                None => break,
            }
        }
        let unique: std::collections::BTreeSet<String> = seen.iter().cloned().collect();
        assert_eq!(
            unique.len(),
            seen.len(),
            "page size {page_size}: duplicates"
        );
        assert_eq!(unique, ids, "page size {page_size}");
    }
}

#[tokio::test]
async fn a_session_watch_releases_its_channel_when_the_last_watcher_leaves() {
    let registry = registry();
    let s = sid("s");
    let first = registry.watch_session(&s, None).unwrap();
    let second = registry.watch_session(&s, Some(0)).unwrap();
    let watched = |r: &Registry| r.inner.shard(&s).watchers.contains_key("s");
    assert!(watched(&registry));
    drop(first);
    assert!(watched(&registry));
    drop(second);
    assert!(!watched(&registry));
}

#[test]
fn refused_creation_leaves_no_trace() {
    let registry = Registry::new(CoordConfig {
        max_sessions: 1,
        ..Default::default()
    });
    registry.start(&sid("a"), Source::Client, None).unwrap();
    let seq = registry.published_seq();
    assert_eq!(
        registry.start(&sid("b"), Source::Client, None),
        Err(CoordError::SessionLimit { max: 1 })
    );
    assert_eq!(registry.session_count(), 1);
    assert_eq!(registry.published_seq(), seq);
    assert_eq!(registry.list(100, None).unwrap().sessions.len(), 1);
}

/// Everything `subscription` can deliver without waiting, and whether it
/// ended. Polls with a no-op waker: every event is already published when
/// this runs, so nothing here depends on timing.
fn drain_now(subscription: &mut Subscription) -> (Vec<u64>, bool) {
    use std::{
        future::Future,
        pin::pin,
        task::{Context, Poll, Waker},
    };
    let mut revisions = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let next = pin!(subscription.next(64));
        match next.poll(&mut cx) {
            Poll::Pending => return (revisions, false),
            Poll::Ready(Ok(Delivery::Events { events, last })) => {
                revisions.extend(events.iter().map(|e| e.revision));
                if last {
                    return (revisions, true);
                }
            }
            Poll::Ready(Ok(Delivery::End)) => return (revisions, true),
            Poll::Ready(Err(lagged)) => panic!("a test watcher lagged: {lagged:?}"),
        }
    }
}

/// The memory backend's session handover, at every point of a run and from
/// every resume point: a watch opened there delivers exactly the revisions
/// after the one it asked for (after the current one when live only), each
/// once, through the session's end; OUT_OF_RANGE only when some of them had
/// left the session's history.
#[test]
fn session_watches_opened_anywhere_deliver_each_revision_once() {
    const HISTORY: u64 = 8;
    let registry = Registry::new(CoordConfig {
        session_history: HISTORY as usize,
        ..Default::default()
    });
    let s = sid("s");
    let mut watches = Vec::new();
    let mut current = 0;
    for _ in 0..6 {
        for after in (0..=current + 2).map(Some).chain([None]) {
            let opened = registry.watch_session(&s, after);
            watches.push((after, current, opened));
        }
        current = registry
            .start(&s, Source::Client, None)
            .unwrap()
            .state
            .revision;
    }
    let last = registry.shutdown(&s).unwrap().state.revision;
    assert_eq!(last, 19);
    for (after, current, opened) in watches {
        let from = after.unwrap_or(current);
        match opened {
            Ok(mut watch) => {
                let (revisions, ended) = drain_now(&mut watch);
                assert_eq!(
                    revisions,
                    (from + 1..=last).collect::<Vec<_>>(),
                    "after {after:?} at revision {current}"
                );
                assert!(ended);
            }
            Err(CoordError::HistoryUnavailable {
                oldest_available, ..
            }) => {
                assert!(from < oldest_available, "after {after:?} at {current}");
                assert!(current > HISTORY, "refused within the history");
            }
            Err(other) => panic!("{other:?}"),
        }
    }
}

/// The same, with the writes racing the watch setups on another thread:
/// whatever interleaving the shard lock lets through, every watch from
/// revision 0 sees 1, 2, 3, ... with no gap and no duplicate.
#[test]
fn session_watches_opened_during_writes_deliver_each_revision_once() {
    const STARTS: u64 = 1_000;
    let registry = Registry::new(CoordConfig {
        session_history: 4 * STARTS as usize,
        session_watch_buffer: 4 * STARTS as usize,
        ..Default::default()
    });
    let s = sid("s");
    let watches = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for _ in 0..STARTS {
                registry.start(&s, Source::Client, None).unwrap();
            }
        });
        let mut watches = Vec::new();
        while (!writer.is_finished() && watches.len() < 500) || watches.is_empty() {
            watches.push(registry.watch_session(&s, Some(0)).unwrap());
            std::thread::yield_now();
        }
        writer.join().unwrap();
        watches
    });
    let last = registry.shutdown(&s).unwrap().state.revision;
    assert_eq!(last, 3 * STARTS + 1);
    for mut watch in watches {
        let (revisions, ended) = drain_now(&mut watch);
        assert_eq!(revisions, (1..=last).collect::<Vec<_>>());
        assert!(ended);
    }
}
