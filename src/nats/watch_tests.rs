//! The NATS backend's watch handovers, with writes injected between the
//! steps of a watch's setup (a scripted store answers the watch's first
//! read only after them, `store/scripted.rs`), so each interleaving is run
//! on purpose instead of hoped for under load: whatever lands there, the
//! watch delivers every event exactly once, in order.
//!
//! Needs NATS 2.10+ with JetStream: `RESPCOORD_TEST_NATS_URL` (scripts/test.sh
//! starts a pinned nats-server and sets it), or a server on
//! 127.0.0.1:4222. Without either these tests fail, saying so
//! (`require_nats`): a test that passes without running proves nothing.

use std::{sync::Arc, time::Duration};

use super::{
    store::{scripted::Scripted, NatsStore},
    NatsCoordinator, NatsSettings,
};
use crate::{
    error::CoordError,
    events::{Delivery, SharedEvent, Subscription},
    ids::{SessionId, SessionScope},
    machine::Source,
    registry::CoordConfig,
};

/// How long a step may take before the test calls it missing. Generous:
/// these tests never fail on speed, only on absence.
const PATIENCE: Duration = Duration::from_secs(20);

/// Fails the test, saying how to fix it, unless NATS is there to test
/// against (see the module docs).
pub(super) async fn require_nats() {
    if std::env::var_os("RESPCOORD_TEST_NATS_URL").is_some() {
        return;
    }
    let reachable = tokio::net::TcpStream::connect("127.0.0.1:4222")
        .await
        .is_ok();
    assert!(
        reachable,
        "this test needs NATS: run ./scripts/test.sh, or start one with \
         `export RESPCOORD_TEST_NATS_URL=$(./scripts/nats.sh)`"
    );
}

/// A replica on a bucket no other test (or earlier run) uses, keeping
/// `history` entries per key.
pub(super) async fn coordinator(history: u8, config: CoordConfig) -> NatsCoordinator {
    coordinator_on(&fresh_bucket(), history, config).await
}

/// A bucket name no other test uses.
pub(super) fn fresh_bucket() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "w{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A replica on `bucket` (another replica of the same bucket shares it).
pub(super) async fn coordinator_on(
    bucket: &str,
    history: u8,
    config: CoordConfig,
) -> NatsCoordinator {
    NatsCoordinator::connect(&settings(bucket, history), config)
        .await
        .unwrap_or_else(|e| panic!("NATS backend for tests: {e}"))
}

/// A replica on `bucket` whose calls' requests go through a store the test
/// scripts.
pub(super) async fn scripted_on(
    bucket: &str,
    history: u8,
    config: CoordConfig,
) -> (NatsCoordinator, Arc<Scripted<NatsStore>>) {
    let mut script = None;
    let coordinator = NatsCoordinator::connect_with(&settings(bucket, history), config, |store| {
        let scripted = Arc::new(Scripted::new(store));
        script = Some(Arc::clone(&scripted));
        scripted
    })
    .await
    .unwrap_or_else(|e| panic!("NATS backend for tests: {e}"));
    (coordinator, script.expect("the store was made"))
}

fn settings(bucket: &str, history: u8) -> NatsSettings {
    NatsSettings {
        url: std::env::var("RESPCOORD_TEST_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".into()),
        bucket: bucket.to_owned(),
        replicas: 1,
        history,
        request_timeout: Duration::from_secs(5),
        memory_storage: true,
        // Test buckets empty themselves; the server is shared with later runs.
        max_age: Duration::from_secs(15 * 60),
        ..NatsSettings::default()
    }
}

/// Opens a watch of `id` whose first read of the bucket is answered only
/// after `writes` ran: writes that land between the watch's read and its
/// history fetch.
async fn watch_after_writes(
    c: &NatsCoordinator,
    script: &Scripted<NatsStore>,
    id: &SessionId,
    after_revision: Option<u64>,
    writes: impl std::future::Future<Output = ()> + Send + 'static,
) -> Subscription {
    script.after_next_read(Box::pin(writes));
    let watch = c.watch_session(id, after_revision).await.unwrap();
    assert!(script.played(), "the writes ran between the watch's steps");
    watch
}

fn sid(raw: &str) -> SessionId {
    SessionId::parse(raw).unwrap()
}

/// Starts a response on `id` (superseding any live one).
async fn start(c: &NatsCoordinator, id: &str) {
    c.start(&sid(id), Source::Client, None).await.unwrap();
}

/// Reads `watch` until `done` says the events so far are all it waits for,
/// or the watch ends.
async fn read_until(
    watch: &mut Subscription,
    done: impl Fn(&[SharedEvent]) -> bool,
) -> Vec<SharedEvent> {
    let mut events = Vec::new();
    while !done(&events) {
        let next = tokio::time::timeout(PATIENCE, watch.next(64))
            .await
            .unwrap_or_else(|_| panic!("timed out after {events:?}"));
        match next.unwrap_or_else(|lagged| panic!("lagged {lagged:?} after {events:?}")) {
            Delivery::Events { events: got, last } => {
                events.extend(got);
                if last {
                    break;
                }
            }
            Delivery::End => break,
        }
    }
    events
}

fn revisions(events: &[SharedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.revision).collect()
}

fn seqs(events: &[SharedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

/// The race, made deterministic: writes land after the watch read
/// the entry (revision 1) and before it fetched the key's history, so they
/// are both in the backlog and on the live stream. Each comes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_between_the_entry_read_and_the_history_fetch_come_once() {
    require_nats().await;
    let (c, script) = scripted_on(&fresh_bucket(), 16, CoordConfig::default()).await;
    start(&c, "s").await; // revision 1
    let writer = c.clone();
    let mut watch = watch_after_writes(&c, &script, &sid("s"), Some(0), async move {
        for _ in 0..3 {
            start(&writer, "s").await; // 3 superseding events each: 2..=10
        }
    })
    .await;
    // After the watch opened: live only (11, 12, 13), then it ends.
    c.shutdown(&sid("s")).await.unwrap();
    let events = read_until(&mut watch, |_| false).await;
    assert_eq!(revisions(&events), (1..=13).collect::<Vec<_>>());
    assert!(events.last().is_some_and(|e| e.is_terminated()));
}

/// As above, for a resume point inside the history, and for a live-only
/// watch (after_revision unset), which must not replay what it skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_and_live_only_watches_with_writes_between_their_steps_come_once() {
    require_nats().await;
    let (c, script) = scripted_on(&fresh_bucket(), 16, CoordConfig::default()).await;
    for _ in 0..3 {
        start(&c, "s").await; // 1..=7
    }
    let writer = c.clone();
    let mut resumed = watch_after_writes(&c, &script, &sid("s"), Some(4), async move {
        start(&writer, "s").await; // 8..=10
    })
    .await;
    let writer = c.clone();
    let mut live = watch_after_writes(&c, &script, &sid("s"), None, async move {
        start(&writer, "s").await; // 11..=13
    })
    .await;
    c.shutdown(&sid("s")).await.unwrap(); // 14..=16
    let events = read_until(&mut resumed, |_| false).await;
    assert_eq!(revisions(&events), (5..=16).collect::<Vec<_>>());
    // Live only from the revision it read (10): what landed after the read
    // is live, exactly once.
    let events = read_until(&mut live, |_| false).await;
    assert_eq!(revisions(&events), (11..=16).collect::<Vec<_>>());
}

/// The watch-all handover: writes between the bucket's last sequence read
/// (or an explicit after_seq) and the subscription to the mirror are
/// delivered exactly once and in seq order, none missing, compared with a
/// watch that was open all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_all_with_writes_between_its_steps_delivers_each_event_once() {
    require_nats().await;
    let (c, script) = scripted_on(&fresh_bucket(), 16, CoordConfig::default()).await;
    let all = SessionScope::All;
    let mut reference = c.watch_all(&all, None).await.unwrap();
    start(&c, "a").await; // acknowledged before the watches open: excluded
    let first = read_until(&mut reference, |e| !e.is_empty()).await;
    let writer = c.clone();
    script.after_next_read(Box::pin(async move {
        start(&writer, "a").await;
        start(&writer, "b").await;
    }));
    let mut from_now = c.watch_all(&all, None).await.unwrap();
    assert!(script.played(), "the writes ran between the watch's steps");
    // With an explicit after_seq the watch reads nothing before it
    // subscribes to the mirror: writes just before the call are the writes
    // between its steps.
    start(&c, "c").await;
    let mut after_seq = c.watch_all(&all, Some(first[0].seq)).await.unwrap();
    for s in ["a", "b", "c"] {
        c.shutdown(&sid(s)).await.unwrap();
    }
    let terminated = |e: &[SharedEvent]| e.iter().filter(|e| e.is_terminated()).count() == 3;
    let mut expected = first;
    expected.extend(read_until(&mut reference, |e| terminated(e)).await);
    assert_eq!(expected[0].revision, 1);
    let got = read_until(&mut from_now, |e| terminated(e)).await;
    assert_eq!(seqs(&got), seqs(&expected[1..]));
    assert_eq!(got, expected[1..].to_vec());
    let got = read_until(&mut after_seq, |e| terminated(e)).await;
    assert_eq!(got, expected[1..].to_vec());
}

/// A key whose history holds only touches (GetState calls that carried no
/// event) no longer holds the events a resume asks for: OUT_OF_RANGE naming
/// the earliest resume point, never an empty backlog that skips them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_of_only_touches_is_out_of_range_not_a_silent_gap() {
    require_nats().await;
    // An 8 ms idle TTL writes a touch for a call 1 ms after the last one
    // (nothing expires: no expirer runs here). Two entries per key.
    let config = CoordConfig {
        idle_ttl: Duration::from_millis(8),
        ..CoordConfig::default()
    };
    let c = coordinator(2, config).await;
    start(&c, "s").await; // revision 1
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        c.state(&sid("s")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    match c.watch_session(&sid("s"), Some(0)).await {
        Err(CoordError::HistoryUnavailable {
            field: "after_revision",
            requested: 0,
            oldest_available: 1,
        }) => {}
        Err(other) => panic!("{other:?}"),
        Ok(mut watch) => {
            c.shutdown(&sid("s")).await.unwrap();
            let events = read_until(&mut watch, |_| false).await;
            panic!(
                "resumed after a lost event: got revisions {:?}",
                revisions(&events)
            );
        }
    }
    // From the earliest resume point it works: live from there.
    let mut watch = c.watch_session(&sid("s"), Some(1)).await.unwrap();
    c.shutdown(&sid("s")).await.unwrap();
    let events = read_until(&mut watch, |_| false).await;
    assert_eq!(revisions(&events), [2, 3, 4]);
}
