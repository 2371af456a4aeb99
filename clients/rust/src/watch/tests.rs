use std::collections::VecDeque;

use super::*;
use crate::{
    fencing::Liveness,
    test_events::{self, cancel_requested, started},
    StopReason,
};

/// How a scripted stream goes on once its messages are delivered.
enum Then {
    /// Stays open, silent.
    Hang,
    /// Fails with this status.
    Fail(Status),
}

struct Scripted {
    messages: VecDeque<pb::WatchResponse>,
    then: Option<Then>,
}

impl Messages for Scripted {
    fn next(&mut self) -> impl Future<Output = Result<Option<pb::WatchResponse>, Status>> + Send {
        let next = match self.messages.pop_front() {
            Some(message) => Some(Ok(Some(message))),
            None => match self.then.take() {
                Some(Then::Fail(status)) => Some(Err(status)),
                Some(Then::Hang) | None => None,
            },
        };
        async move {
            match next {
                Some(next) => next,
                None => std::future::pending().await,
            }
        }
    }
}

/// What the next Watch call does: open and deliver, then go on so; or fail.
type Opened = Result<(Vec<pb::WatchResponse>, Then), Status>;

/// A scripted server: each Watch takes the next stream, each GetState
/// the next answer (a call past the script waits forever); every call
/// is recorded.
#[derive(Default)]
struct Script {
    watches: Mutex<VecDeque<Opened>>,
    states: Mutex<VecDeque<Result<pb::SessionState, Status>>>,
    calls: Mutex<Vec<String>>,
}

impl Script {
    /// The next Watch opens and delivers `messages`, then `then`.
    fn stream(&self, messages: Vec<pb::WatchResponse>, then: Then) {
        self.watches.lock().unwrap().push_back(Ok((messages, then)));
    }

    /// The next Watch fails to open.
    fn refuse(&self, status: Status) {
        self.watches.lock().unwrap().push_back(Err(status));
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Transport for Arc<Script> {
    type Messages = Scripted;

    fn watch(
        &self,
        _session: &str,
        after_revision: u64,
    ) -> impl Future<Output = Result<Scripted, Status>> + Send {
        self.calls
            .lock()
            .unwrap()
            .push(format!("watch {after_revision}"));
        let next = self.watches.lock().unwrap().pop_front();
        async move {
            match next {
                Some(Ok((messages, then))) => Ok(Scripted {
                    messages: messages.into(),
                    then: Some(then),
                }),
                Some(Err(status)) => Err(status),
                None => std::future::pending().await,
            }
        }
    }

    fn get_state(
        &self,
        _session: &str,
        _timeout: Duration,
    ) -> impl Future<Output = Result<pb::SessionState, Status>> + Send {
        self.calls.lock().unwrap().push("get_state".into());
        let next = self.states.lock().unwrap().pop_front();
        async move {
            match next {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        }
    }
}

fn message(events: Vec<pb::LifecycleEvent>) -> pb::WatchResponse {
    pb::WatchResponse {
        events,
        progress_seq: 0,
    }
}

fn event(revision: u64, kind: Kind) -> pb::LifecycleEvent {
    test_events::event("s", revision, kind)
}

fn active(id: u64, revision: u64) -> pb::SessionState {
    test_events::state("s", pb::Phase::Active, id, revision)
}

/// Response 10, whose Start reply carried revision 5, and its session's
/// watch running against `script`.
struct Running {
    response: Arc<Liveness>,
    stop: CancellationToken,
    cells: Arc<Cells>,
    _guard: crate::fencing::TrackGuard,
}

fn run(script: &Arc<Script>) -> Running {
    run_lingering(script, Duration::ZERO)
}

fn run_lingering(script: &Arc<Script>, linger: Duration) -> Running {
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let response = Liveness::new(10);
    let order = tracks
        .register(&guard, &response, 5, true)
        .expect("the first response opens the watch");
    let stop = order.stop.clone();
    let cells = spawn(script, &tracks, order, linger);
    Running {
        response,
        stop,
        cells,
        _guard: guard,
    }
}

/// Runs `order`'s watch against `script`.
fn spawn(
    script: &Arc<Script>,
    tracks: &Arc<Tracks>,
    order: WatchOrder,
    linger: Duration,
) -> Arc<Cells> {
    let cells = Arc::new(Cells::default());
    let watch = SessionWatch {
        transport: Arc::clone(script),
        linger: Linger::new(Arc::clone(tracks), linger),
        tracks: Arc::clone(tracks),
        retry: RetryPolicy::default(),
        cells: Arc::clone(&cells),
        session: "s".into(),
        position: order.after_revision.unwrap_or(0),
        read_first: order.after_revision.is_none(),
        expect_started: order.expect_started,
    };
    tokio::spawn(watch.run(order.stop));
    cells
}

async fn stopped(response: &Liveness) -> StopReason {
    tokio::time::timeout(Duration::from_secs(600), response.token().cancelled())
        .await
        .expect("stopped");
    response.reason().expect("a reason")
}

#[tokio::test(start_paused = true)]
async fn a_stop_replayed_after_the_proof_of_the_start_stops_the_response() {
    let script = Arc::new(Script::default());
    script.stream(
        vec![
            message(vec![event(5, started(10))]),
            message(vec![
                event(6, cancel_requested(10, pb::CancelReason::Superseded)),
                event(8, started(11)),
            ]),
        ],
        Then::Hang,
    );
    let running = run(&script);
    assert_eq!(stopped(&running.response).await, StopReason::Superseded);
    assert!(
        running.stop.is_cancelled(),
        "nothing live: the watch closed"
    );
    assert_eq!(
        script.calls(),
        ["watch 4"],
        "replayed from just below the reply"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_event_that_is_not_the_start_means_a_recreated_session() {
    let script = Arc::new(Script::default());
    script.stream(vec![message(vec![event(5, started(3))])], Then::Hang);
    // Revision 2: below the watch's position, a new session of that id.
    script.states.lock().unwrap().push_back(Ok(active(12, 2)));
    let running = run(&script);
    assert_eq!(stopped(&running.response).await, StopReason::Gone);
    assert_eq!(script.calls(), ["watch 4", "get_state"]);
}

#[tokio::test(start_paused = true)]
async fn a_session_not_found_after_a_break_is_gone() {
    let script = Arc::new(Script::default());
    script.stream(
        vec![message(vec![event(5, started(10))])],
        Then::Fail(Status::unavailable("connection reset")),
    );
    script
        .states
        .lock()
        .unwrap()
        .push_back(Err(Status::not_found("no session s")));
    let running = run(&script);
    assert_eq!(stopped(&running.response).await, StopReason::Gone);
    assert_eq!(script.calls(), ["watch 4", "get_state"]);
}

#[tokio::test(start_paused = true)]
async fn a_broken_stream_resumes_from_the_state_it_read() {
    let script = Arc::new(Script::default());
    script.stream(
        vec![message(vec![event(5, started(10))])],
        Then::Fail(Status::unavailable("connection reset")),
    );
    script.stream(
        vec![message(vec![event(
            7,
            cancel_requested(10, pb::CancelReason::Requested),
        )])],
        Then::Hang,
    );
    script.states.lock().unwrap().push_back(Ok(active(10, 6)));
    let running = run(&script);
    assert_eq!(stopped(&running.response).await, StopReason::Cancelled);
    assert_eq!(script.calls(), ["watch 4", "get_state", "watch 6"]);
    let load = |cell: &AtomicU64| cell.load(Ordering::Acquire);
    let cells = &running.cells;
    assert_eq!(
        (
            load(&cells.opened),
            load(&cells.reconnects),
            load(&cells.rereads)
        ),
        (2, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn no_proof_within_the_attempt_timeout_is_checked_by_a_state_read() {
    let script = Arc::new(Script::default());
    script.stream(vec![], Then::Hang);
    script.stream(vec![], Then::Hang);
    script.states.lock().unwrap().push_back(Ok(active(10, 5)));
    let running = run(&script);
    tokio::time::timeout(Duration::from_secs(600), async {
        while script.calls().len() < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a state read and a new stream");
    assert_eq!(script.calls(), ["watch 4", "get_state", "watch 5"]);
    assert!(running.response.is_current(), "the state shows it active");
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_failed_to_open_resumes_from_the_state_without_waiting_for_a_proof() {
    let script = Arc::new(Script::default());
    script.refuse(Status::unavailable("no connection yet"));
    script.states.lock().unwrap().push_back(Ok(active(10, 7)));
    script.stream(
        vec![message(vec![event(
            8,
            cancel_requested(10, pb::CancelReason::Requested),
        )])],
        Then::Hang,
    );
    let running = run(&script);
    assert_eq!(stopped(&running.response).await, StopReason::Cancelled);
    // One read: the stream from the state's revision is not held to the
    // Start's proof (it starts past the Start).
    assert_eq!(script.calls(), ["watch 4", "get_state", "watch 7"]);
}

#[tokio::test(start_paused = true)]
async fn a_stopped_response_leaves_its_watch_open_for_the_linger() {
    let script = Arc::new(Script::default());
    script.stream(
        vec![
            message(vec![event(5, started(10))]),
            message(vec![event(
                6,
                cancel_requested(10, pb::CancelReason::Requested),
            )]),
        ],
        Then::Hang,
    );
    let running = run_lingering(&script, Duration::from_secs(30));
    assert_eq!(stopped(&running.response).await, StopReason::Cancelled);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(!running.stop.is_cancelled(), "still lingering");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(running.stop.is_cancelled(), "closed after the linger");
    assert_eq!(script.calls(), ["watch 4"]);
}

#[tokio::test(start_paused = true)]
async fn a_watch_opened_ahead_of_a_new_session_reads_then_watches_from_its_first_event() {
    let script = Arc::new(Script::default());
    script
        .states
        .lock()
        .unwrap()
        .push_back(Err(Status::not_found("no session s")));
    script.stream(
        vec![message(vec![
            event(1, started(10)),
            event(2, cancel_requested(10, pb::CancelReason::Requested)),
        ])],
        Then::Hang,
    );
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let effects = tracks.open_ahead(&guard);
    let order = effects.open.expect("a watch");
    let cells = spawn(&script, &tracks, order, Duration::from_secs(30));
    while script.calls().len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The session's first Start: the watch opened ahead carries it, no
    // second Watch.
    let response = Liveness::new(10);
    assert!(tracks.register(&guard, &response, 1, true).is_none());
    assert_eq!(stopped(&response).await, StopReason::Cancelled);
    assert_eq!(script.calls(), ["get_state", "watch 0"]);
    assert_eq!(cells.opened.load(Ordering::Acquire), 1);
}

#[tokio::test(start_paused = true)]
async fn a_watch_opened_ahead_of_an_active_session_watches_from_the_state_it_read() {
    let script = Arc::new(Script::default());
    script.states.lock().unwrap().push_back(Ok(active(7, 5)));
    script.stream(
        vec![
            message(vec![event(6, started(10))]),
            message(vec![event(
                7,
                cancel_requested(10, pb::CancelReason::Superseded),
            )]),
        ],
        Then::Hang,
    );
    let tracks = Arc::new(Tracks::default());
    let guard = tracks.track("s");
    let order = tracks.open_ahead(&guard).open.expect("a watch");
    spawn(&script, &tracks, order, Duration::from_secs(30));
    while script.calls().len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let response = Liveness::new(10);
    assert!(tracks.register(&guard, &response, 6, true).is_none());
    assert_eq!(stopped(&response).await, StopReason::Superseded);
    assert_eq!(script.calls(), ["get_state", "watch 5"]);
}
