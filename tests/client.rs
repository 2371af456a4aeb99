//! The gateway client library (`respcoord-client`, `clients/rust`) against
//! real servers on loopback: cancellation from another gateway
//! within a bounded time, Finish at most once (exactly once when the body
//! ends by itself) under races, retries that never supersede their own
//! response, a resumed watch after a broken connection, a coordinator
//! restart survived (re-list, in-flight responses told they are gone, no
//! Finish for them), the bearer token on every call, mutual TLS with a
//! scoped token against the real server configuration, and the measured
//! cancel-propagation latency. respcoordctl's tests are the client crate's
//! (`clients/rust/tests/respcoordctl.rs`).

mod common;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use common::{
    check_invariants, free_port, spawn_respcoord_on, unique_suffix, RespcoordProcess, TestServer,
    PATIENCE,
};
use respcoord::{
    auth::{Authenticator, Tokens},
    grpc::{CoordinatorService, WatchSettings},
    proto::v1::{self as pb, response_coordinator_server::ResponseCoordinatorServer, Source},
    registry::{CoordConfig, Registry},
    server::{Pem, ServerConfig, TlsConfig},
};
use respcoord_client::{
    Client, ConnectOptions, Finished, RetryPolicy, RunOutcome, StartOptions, StopReason, Terminal,
    TlsOptions,
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{
    service::interceptor::InterceptedService,
    transport::{server::TcpIncoming, Server},
    Code,
};

async fn connect(endpoint: &str) -> Client {
    Client::connect(ConnectOptions::new(endpoint))
        .await
        .expect("connect")
}

/// A client whose session watches linger for the scenario's `linger_ms`.
async fn connect_lingering(endpoint: &str, scenario: &str) -> Client {
    let linger = scenario_params(scenario)["linger_ms"]
        .as_u64()
        .expect("linger_ms");
    Client::connect(ConnectOptions::new(endpoint).with_watch_linger(Duration::from_millis(linger)))
        .await
        .expect("connect")
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"))
}

// ---- the shared client scenarios ----

/// The cross-language client scenarios (clients/scenarios/scenarios.json)
/// and the test of this suite that implements each. The Python and
/// TypeScript clients run the same ids against the same counting service.
const SCENARIOS: &[(&str, &str)] = &[
    (
        "superseded_by_another_gateway",
        "a_response_superseded_by_another_gateway_is_stopped_and_fenced",
    ),
    (
        "cancelled_and_shut_down_by_another_gateway",
        "cancel_and_shutdown_from_another_gateway_stop_responses",
    ),
    (
        "finish_vs_cancel_race",
        "finish_is_sent_at_most_once_and_exactly_when_the_body_ended_first",
    ),
    (
        "lost_start_reply_is_replayed",
        "a_start_retried_after_a_lost_reply_is_a_replay_not_a_supersede",
    ),
    (
        "coordinator_down_then_back",
        "a_start_sent_while_the_coordinator_is_down_retries_until_it_is_back_once",
    ),
    (
        "watch_broken_and_resumed",
        "the_watch_resumes_after_a_broken_connection_and_catches_up",
    ),
    (
        "coordinator_restart_mid_run",
        "a_coordinator_restart_mid_run_is_survived",
    ),
    (
        "bearer_token_on_every_call",
        "the_bearer_token_goes_on_every_call_including_the_watch",
    ),
    (
        "mutual_tls_with_scoped_token",
        "mutual_tls_and_a_scoped_token_work_for_the_library_and_the_cli",
    ),
    ("cancel_propagation_latency", "cancel_propagation_latency"),
    (
        "session_watch_follows_live_responses",
        "a_client_watches_a_session_only_while_it_has_a_live_response_there",
    ),
    (
        "stop_between_start_reply_and_watch",
        "a_stop_between_a_start_reply_and_its_watch_is_not_missed",
    ),
    (
        "watch_lingers_across_responses",
        "a_sessions_watch_lingers_so_the_next_start_needs_no_watch_call",
    ),
    (
        "open_watch_before_first_start",
        "a_watch_opened_ahead_covers_the_sessions_first_start",
    ),
    (
        "stop_right_after_start_reply",
        "a_stop_right_after_a_start_reply_reaches_the_fence",
    ),
    (
        "hundreds_of_sessions_on_one_client",
        "hundreds_of_sessions_on_one_client_each_get_their_stop",
    ),
];

fn shared_scenarios() -> Vec<serde_json::Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/clients/scenarios/scenarios.json"
    );
    let text = std::fs::read_to_string(path).expect("clients/scenarios/scenarios.json");
    let file: serde_json::Value = serde_json::from_str(&text).expect("scenarios.json is JSON");
    file["scenarios"]
        .as_array()
        .expect("a scenarios list")
        .clone()
}

/// The `params` of shared scenario `id`.
fn scenario_params(id: &str) -> serde_json::Value {
    shared_scenarios()
        .into_iter()
        .find(|scenario| scenario["id"] == id)
        .unwrap_or_else(|| panic!("scenario {id} is not in scenarios.json"))["params"]
        .clone()
}

#[test]
fn every_shared_scenario_is_implemented() {
    let listed: std::collections::BTreeSet<String> = shared_scenarios()
        .iter()
        .map(|scenario| scenario["id"].as_str().expect("an id").to_owned())
        .collect();
    let implemented: std::collections::BTreeSet<String> =
        SCENARIOS.iter().map(|(id, _)| (*id).to_owned()).collect();
    assert_eq!(
        listed, implemented,
        "scenarios.json and this suite disagree"
    );
    let source = include_str!("client.rs");
    for (id, test) in SCENARIOS {
        assert!(
            source.contains(&format!("async fn {test}()")),
            "scenario {id}: no test named {test}"
        );
    }
}

// ---- a coordinator that counts what reaches it ----

#[path = "common/ca.rs"]
#[allow(dead_code)] // write_mutual_tls_files is the fixture's
mod ca;
#[path = "common/counting.rs"]
mod counting;
#[path = "common/proxy.rs"]
mod proxy;

use ca::Ca;
use counting::Counting;
use proxy::Proxy;

struct Coordinator {
    addr: SocketAddr,
    counting: Counting,
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Coordinator {
    /// Serves on `addr` (a fresh port if None); `token` makes every call
    /// require `authorization: Bearer <token>`.
    async fn serve(addr: Option<SocketAddr>, token: Option<&str>) -> Self {
        let listener = TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()))
            .await
            .expect("bind");
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let registry = Registry::new(CoordConfig::default());
        let counting = Counting::new(CoordinatorService::new(
            registry.into(),
            WatchSettings::default(),
            stop.clone(),
        ));
        // The real interceptor: with no token it records the every-session
        // scope, as the server does.
        let tokens = token.map(|token| Tokens::parse(token).expect("a valid test token"));
        let service = InterceptedService::new(
            ResponseCoordinatorServer::new(counting.clone()),
            Authenticator::new(tokens),
        );
        let shutdown = stop.clone();
        let handle = tokio::spawn(async move {
            Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown.cancelled_owned(),
                )
                .await
                .expect("serve");
        });
        Self {
            addr,
            counting,
            stop,
            handle,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn finishes_of(&self, id: u64) -> usize {
        self.counting.finishes_of(id)
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(PATIENCE, self.handle).await;
    }
}

// ---- cancellation from another gateway ----

#[tokio::test]
async fn a_response_superseded_by_another_gateway_is_stopped_and_fenced() {
    let server = TestServer::start().await;
    let a = connect(&server.endpoint()).await;
    let b = connect(&server.endpoint()).await;
    let (a_session, b_session) = (a.session("call-1").unwrap(), b.session("call-1").unwrap());

    let (started_tx, started_rx) = oneshot::channel();
    let reader = tokio::spawn(async move {
        a_session
            .run(Source::Client, |ctx| async move {
                let fence = ctx.fence().clone();
                let _ = started_tx.send(fence);
                // Speaks until told to stop.
                std::future::pending::<Result<(), ()>>().await
            })
            .await
    });
    let fence = within("A's response starts", started_rx).await.unwrap();
    assert!(fence.is_current());

    let barge_in = b_session.start(Source::Vad).await.unwrap();
    assert_eq!(barge_in.superseded(), Some(fence.id()));
    let outcome = within("A sees the supersede", reader)
        .await
        .unwrap()
        .unwrap();
    match outcome {
        RunOutcome::Stopped {
            response_id,
            reason,
        } => {
            assert_eq!(response_id, fence.id());
            assert_eq!(reason, StopReason::Superseded);
        }
        other => panic!("expected Stopped, got {other:?}"),
    }
    assert!(!fence.is_current(), "late output of A is dropped");
    assert_eq!(fence.stop_reason(), Some(StopReason::Superseded));
    assert!(barge_in.is_current(), "B's own response lives on");

    // A cancels B's response from its side: B's handle stops too.
    let a_again = a.session("call-1").unwrap();
    assert_eq!(
        a_again.cancel(Source::Client, None).await.unwrap(),
        Some(barge_in.id())
    );
    assert_eq!(
        within("B sees the cancel", barge_in.stopped()).await,
        StopReason::Cancelled
    );
    assert!(!barge_in.is_current());
    server.stop().await;
}

#[tokio::test]
async fn cancel_and_shutdown_from_another_gateway_stop_responses() {
    let server = TestServer::start().await;
    let a = connect(&server.endpoint()).await;
    let b = connect(&server.endpoint()).await;
    let a_session = a.session("call-2").unwrap();
    let b_session = b.session("call-2").unwrap();

    let first = a_session.start(Source::Client).await.unwrap();
    let token = first.token();
    assert_eq!(
        b_session.cancel(Source::Vad, None).await.unwrap(),
        Some(first.id())
    );
    within("the token fires", token.cancelled()).await;
    assert_eq!(first.stop_reason(), Some(StopReason::Cancelled));
    // Its Finish is not sent: the coordinator already ended it.
    assert_eq!(
        first.finish(Terminal::Completed).await.unwrap(),
        Finished::NotSent(StopReason::Cancelled)
    );

    let second = a_session.start(Source::Client).await.unwrap();
    assert_eq!(
        b_session.shutdown(Source::Client).await.unwrap(),
        Some(second.id())
    );
    assert_eq!(
        within("shutdown reaches A", second.stopped()).await,
        StopReason::Shutdown
    );
    let refused = a_session.start(Source::Client).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");

    // A response that finishes by itself is applied exactly once.
    let other = a.session("call-3").unwrap();
    let outcome = other
        .run(Source::Client, |ctx| async move {
            assert!(ctx.is_current());
            Ok::<_, ()>(ctx.response_id())
        })
        .await
        .unwrap();
    let RunOutcome::Completed {
        value, finished, ..
    } = outcome
    else {
        panic!("expected Completed, got {outcome:?}");
    };
    let Finished::Applied(state) = finished.unwrap() else {
        panic!("Finish not applied");
    };
    assert_eq!(state.phase(), pb::Phase::Idle);
    assert_eq!(state.revision, 2, "started, ended");
    assert!(value > 0);
    server.stop().await;
}

// ---- Finish exactly once under races ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_is_sent_at_most_once_and_exactly_when_the_body_ended_first() {
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect(&coordinator.endpoint()).await;
    let b = connect(&coordinator.endpoint()).await;
    let mut raw = b.raw();
    let mut recording = raw
        .watch(pb::WatchRequest {
            session_id: String::new(),
            after_revision: None,
            after_seq: Some(0),
        })
        .await
        .unwrap()
        .into_inner();

    let params = scenario_params("finish_vs_cancel_race");
    let rounds = |key: &str| params[key].as_u64().expect("a number");
    let (round_count, max_delay) = (rounds("rounds") as usize, rounds("max_delay_micros"));
    let (mut completed, mut stopped, mut not_sent) = (0, 0, 0);
    for round in 0..round_count {
        let name = format!("race-{round}");
        let a_session = a.session(&name).unwrap();
        let b_session = b.session(&name).unwrap();
        let body_delay = Duration::from_micros(fastrand::u64(..max_delay));
        let cancel_delay = Duration::from_micros(fastrand::u64(..max_delay));
        let (started_tx, started_rx) = oneshot::channel();
        let run = tokio::spawn(async move {
            a_session
                .run(Source::Client, move |ctx| async move {
                    let _ = started_tx.send(ctx.response_id());
                    tokio::time::sleep(body_delay).await;
                    Ok::<_, ()>(())
                })
                .await
                .unwrap()
        });
        let id = within("A starts", started_rx).await.unwrap();
        tokio::time::sleep(cancel_delay).await;
        let _ = b_session.cancel(Source::Vad, Some(id)).await.unwrap();
        let outcome = within("A's run ends", run).await.unwrap();
        assert_eq!(outcome.response_id(), id);
        let sent = coordinator.finishes_of(id);
        match outcome {
            RunOutcome::Completed { finished, .. } => match finished.unwrap() {
                Finished::Applied(_) | Finished::Stale(_) => {
                    assert_eq!(sent, 1, "round {round}: the body ended: exactly one Finish");
                    completed += 1;
                }
                Finished::NotSent(_) => {
                    assert_eq!(sent, 0, "round {round}: stopped before Finish: none");
                    not_sent += 1;
                }
            },
            RunOutcome::Stopped { .. } => {
                assert_eq!(sent, 0, "round {round}: stopped: no Finish");
                stopped += 1;
            }
            RunOutcome::Failed { .. } => unreachable!("the body never fails"),
        }
    }
    // Every started response has exactly one terminal on the coordinator.
    let mut events = Vec::new();
    let mut ended = 0;
    while ended < round_count {
        let message = within("the recording", recording.message())
            .await
            .unwrap()
            .unwrap();
        ended += message
            .events
            .iter()
            .filter(|e| matches!(e.kind, Some(pb::lifecycle_event::Kind::Ended(_))))
            .count();
        events.extend(message.events);
    }
    let report = check_invariants(&events);
    assert_eq!((report.started, report.ended), (round_count, round_count));
    println!(
        "finish races over {round_count} rounds: body first {completed}, stopped first {stopped}, \
         stopped between body and Finish {not_sent}"
    );
    coordinator.stop().await;
}

// ---- retries ----

#[tokio::test]
async fn a_start_retried_after_a_lost_reply_is_a_replay_not_a_supersede() {
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect(&coordinator.endpoint()).await;
    let session = a.session("retry-1").unwrap();

    coordinator.counting.lose_next_start_reply();
    let response = session.start(Source::Client).await.unwrap();
    assert_eq!(coordinator.counting.starts(), 2);
    assert!(
        response.replayed(),
        "the second attempt is answered as a replay"
    );
    assert!(response.is_current(), "it did not supersede itself");
    let state = session.state().await.unwrap();
    assert_eq!(state.responses_started, 1, "one response, not two");
    assert_eq!(state.active_response_id, response.id());

    // An explicit request id makes a repeat of the whole call safe too.
    let options = StartOptions {
        request_id: Some("turn-7".into()),
    };
    let first = session
        .start_with(Source::Client, options.clone())
        .await
        .unwrap();
    assert_eq!(first.superseded(), Some(response.id()));
    let again = session.start_with(Source::Client, options).await.unwrap();
    assert!(again.replayed());
    assert_eq!(again.id(), first.id());
    assert!(first.is_current() && again.is_current());
    assert!(matches!(
        first.finish(Terminal::Completed).await.unwrap(),
        Finished::Applied(_)
    ));
    coordinator.stop().await;
}

#[tokio::test]
async fn a_start_sent_while_the_coordinator_is_down_retries_until_it_is_back_once() {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let options = ConnectOptions::new(format!("http://{addr}")).with_retry(RetryPolicy {
        deadline: PATIENCE,
        ..RetryPolicy::default()
    });
    let a = Client::connect_lazy(options).unwrap();
    let session = a.session("late").unwrap();
    let start = tokio::spawn(async move {
        let response = session.start(Source::Client).await;
        (session, response)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let coordinator = Coordinator::serve(Some(addr), None).await;
    let (session, response) = within("the start gets through", start).await.unwrap();
    let response = response.unwrap();
    assert!(response.is_current());
    assert_eq!(session.state().await.unwrap().responses_started, 1);
    coordinator.stop().await;
}

// ---- session watches: resume, restart ----

#[tokio::test]
async fn the_watch_resumes_after_a_broken_connection_and_catches_up() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await.expect("proxy");
    let a = connect_lingering(
        &format!("http://{}", proxy.addr),
        "watch_broken_and_resumed",
    )
    .await;
    let b = connect(&server.endpoint()).await;
    let session = a.session("resume-1").unwrap();
    let response = session.start(Source::Client).await.unwrap();
    within_until("A's session watch is open", || a.watch_status().opened == 1).await;
    let before = a.watch_status();
    assert_eq!(before.open, 1, "one session watch: {before:?}");

    // Cut A off; once its watch noticed (a state read is under way or done),
    // supersede its response.
    proxy.cut();
    within("A's watch notices the cut", async {
        while a.watch_status().rereads == before.rereads {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let barge_in = b
        .session("resume-1")
        .unwrap()
        .start(Source::Vad)
        .await
        .unwrap();
    assert_eq!(barge_in.superseded(), Some(response.id()));
    assert_eq!(
        within("A learns after resuming", response.stopped()).await,
        StopReason::Superseded
    );
    within_until("the watch closes after the linger", || {
        a.watch_status().open == 0
    })
    .await;
    server.stop().await;
}

/// Polls `done` until it holds, or fails after the patience bound.
async fn within_until(what: &str, done: impl Fn() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_client_watches_a_session_only_while_it_has_a_live_response_there() {
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect_lingering(
        &coordinator.endpoint(),
        "session_watch_follows_live_responses",
    )
    .await;
    let b = connect(&coordinator.endpoint()).await;
    let (x, y) = (
        a.session("follow-x").unwrap(),
        a.session("follow-y").unwrap(),
    );
    let status = a.watch_status();
    assert_eq!(
        (status.open, status.opened),
        (0, 0),
        "handles alone: {status:?}"
    );

    let on_x = x.start(Source::Client).await.unwrap();
    assert_eq!(a.watch_status().open, 1);
    let on_y = y.start(Source::Client).await.unwrap();
    assert_eq!(a.watch_status().open, 2);
    within_until("both watches are open", || a.watch_status().opened == 2).await;

    assert!(matches!(
        on_x.finish(Terminal::Completed).await.unwrap(),
        Finished::Applied(_)
    ));
    // Traffic on a session A has nothing live in reaches A not at all.
    let z = b.session("follow-z").unwrap();
    for _ in 0..5 {
        z.start(Source::Vad).await.unwrap();
    }
    b.session("follow-y")
        .unwrap()
        .start(Source::Vad)
        .await
        .unwrap();
    assert_eq!(
        within("Y's response is superseded", on_y.stopped()).await,
        StopReason::Superseded
    );
    let status = a.watch_status();
    assert_eq!(
        (status.open, status.opened),
        (2, 2),
        "both watches linger, no watch of Z: {status:?}"
    );
    within_until("no watch once the linger is over", || {
        a.watch_status().open == 0
    })
    .await;
    assert_eq!(a.watch_status().opened, 2, "nor of everything");
    coordinator.stop().await;
}

#[tokio::test]
async fn a_sessions_watch_lingers_so_the_next_start_needs_no_watch_call() {
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect_lingering(&coordinator.endpoint(), "watch_lingers_across_responses").await;
    let b = connect(&coordinator.endpoint()).await;
    let session = a.session("linger-l").unwrap();
    let first = session.start(Source::Client).await.unwrap();
    within_until("the watch is open", || a.watch_status().opened == 1).await;
    assert!(matches!(
        first.finish(Terminal::Completed).await.unwrap(),
        Finished::Applied(_)
    ));
    let status = a.watch_status();
    assert_eq!((status.open, status.opened), (1, 1), "{status:?}");
    let second = session.start(Source::Client).await.unwrap();
    let status = a.watch_status();
    assert_eq!(
        (status.open, status.opened),
        (1, 1),
        "no Watch call: {status:?}"
    );
    b.session("linger-l")
        .unwrap()
        .start(Source::Vad)
        .await
        .unwrap();
    assert_eq!(
        within("the second response is superseded", second.stopped()).await,
        StopReason::Superseded
    );
    let status = a.watch_status();
    assert_eq!(
        (status.opened, status.rereads),
        (1, 0),
        "one stream carried both: {status:?}"
    );
    coordinator.stop().await;
}

#[tokio::test]
async fn a_watch_opened_ahead_covers_the_sessions_first_start() {
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect_lingering(&coordinator.endpoint(), "open_watch_before_first_start").await;
    let b = connect(&coordinator.endpoint()).await;
    let name = format!("ahead-{}", unique_suffix());
    let session = a.session(&name).unwrap();
    session.open_watch();
    assert_eq!(a.watch_status().open, 1);
    within_until("the stream is open", || a.watch_status().opened == 1).await;
    let response = session.start(Source::Client).await.unwrap();
    assert_eq!(a.watch_status().opened, 1, "the Start needed no Watch call");
    b.session(&name).unwrap().start(Source::Vad).await.unwrap();
    assert_eq!(
        within("superseded", response.stopped()).await,
        StopReason::Superseded
    );
    coordinator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_right_after_a_start_reply_reaches_the_fence() {
    let rounds = scenario_params("stop_right_after_start_reply")["rounds"]
        .as_u64()
        .expect("rounds");
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect(&coordinator.endpoint()).await;
    let b = connect(&coordinator.endpoint()).await;
    let run = unique_suffix();
    let (mut ahead, mut not_ahead) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let name = format!("quick-{run}-{round}");
        let session = a.session(&name).unwrap();
        let opened_ahead = round % 2 == 0;
        if opened_ahead {
            let before = a.watch_status().opened;
            session.open_watch();
            within_until("the watch opened ahead is open", || {
                a.watch_status().opened > before
            })
            .await;
        }
        let response = session.start(Source::Client).await.unwrap();
        let called = Instant::now();
        b.session(&name)
            .unwrap()
            .cancel(Source::Vad, Some(response.id()))
            .await
            .unwrap();
        assert_eq!(
            within("A's response is stopped", response.stopped()).await,
            StopReason::Cancelled
        );
        let took = called.elapsed();
        if opened_ahead {
            ahead.push(took);
        } else {
            not_ahead.push(took);
        }
    }
    println!(
        "stop after start, B's cancel sent as A's Start returns to A's fence, {rounds} rounds: \
         watch opened ahead {}; not ahead {}",
        latency_summary(&ahead),
        latency_summary(&not_ahead)
    );
    coordinator.stop().await;
}

#[tokio::test]
async fn a_stop_between_a_start_reply_and_its_watch_is_not_missed() {
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect(&coordinator.endpoint()).await;
    let b = connect(&coordinator.endpoint()).await;
    coordinator.counting.hold_next_watch();
    let response = a
        .session("between")
        .unwrap()
        .start(Source::Client)
        .await
        .unwrap();
    within_until("A's session watch reaches the hold", || {
        coordinator.counting.held_watches() == 1
    })
    .await;
    b.session("between")
        .unwrap()
        .start(Source::Vad)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(response.is_current(), "nothing has told A yet");
    coordinator.counting.release_watches();
    assert_eq!(
        within("the watch replays the supersede", response.stopped()).await,
        StopReason::Superseded
    );
    assert_eq!(
        a.watch_status().rereads,
        0,
        "replayed from the Start reply's revision, no state read"
    );
    coordinator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_sessions_on_one_client_each_get_their_stop() {
    let sessions = scenario_params("hundreds_of_sessions_on_one_client")["sessions"]
        .as_u64()
        .expect("sessions") as usize;
    let coordinator = Coordinator::serve(None, None).await;
    let a = connect_lingering(
        &coordinator.endpoint(),
        "hundreds_of_sessions_on_one_client",
    )
    .await;
    let b = connect(&coordinator.endpoint()).await;
    let mut responses = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let session = a.session(&format!("many-{i}")).unwrap();
        responses.push(session.start(Source::Client).await.unwrap());
    }
    assert_eq!(a.watch_status().open, sessions as u64);
    for i in 0..sessions {
        b.session(&format!("many-{i}"))
            .unwrap()
            .start(Source::Vad)
            .await
            .unwrap();
    }
    for response in &responses {
        assert_eq!(
            within("every response is superseded", response.stopped()).await,
            StopReason::Superseded
        );
    }
    within_until("no watch once the linger is over", || {
        a.watch_status().open == 0
    })
    .await;
    coordinator.stop().await;
}

/// The real binary on `port`, once it answers.
fn spawn_server(port: u16) -> RespcoordProcess {
    spawn_respcoord_on(port, &[], &[], Stdio::null())
}

/// "Survived" for the in-memory backend, which loses its sessions when it
/// restarts: the session watch breaks, the state read before reopening it
/// answers NOT_FOUND, and the in-flight response is reported gone (stopped,
/// no Finish: there is nothing to finish); the client keeps working,
/// including its watches, and never starts twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_restart_mid_run_is_survived() {
    let port = free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let server = spawn_server(port);
    let a = connect(&endpoint).await;
    let session = a.session("restart-1").unwrap();
    let (started_tx, started_rx) = oneshot::channel();
    let run = tokio::spawn({
        let session = session.clone();
        async move {
            session
                .run(Source::Client, |ctx| async move {
                    let _ = started_tx.send(ctx.fence().clone());
                    std::future::pending::<Result<(), ()>>().await
                })
                .await
        }
    });
    let fence = within("A starts", started_rx).await.unwrap();

    drop(server); // SIGKILL: connections reset, every session lost
    let server = spawn_server(port);
    let outcome = within("A is told its response is gone", run)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            outcome,
            RunOutcome::Stopped {
                reason: StopReason::Gone,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(!fence.is_current());
    let status = a.watch_status();
    assert!(status.rereads >= 1, "{status:?}");

    // The client goes on: a new response (ids keep growing across the
    // restart), exactly one start, and the resumed watch still delivers.
    let b = connect(&endpoint).await;
    let next = session.start(Source::Client).await.unwrap();
    assert!(next.id() > fence.id());
    let state = session.state().await.unwrap();
    assert_eq!(state.responses_started, 1, "nothing was started twice");
    b.session("restart-1")
        .unwrap()
        .start(Source::Vad)
        .await
        .unwrap();
    assert_eq!(
        within("a new watch works after the restart", next.stopped()).await,
        StopReason::Superseded
    );
    drop(server);
}

// ---- token ----

#[tokio::test]
async fn the_bearer_token_goes_on_every_call_including_the_watch() {
    let params = scenario_params("bearer_token_on_every_call");
    let scenario_token = params["token"].as_str().expect("token");
    let coordinator = Coordinator::serve(None, Some(scenario_token)).await;
    let anonymous = connect(&coordinator.endpoint()).await;
    let refused = anonymous.get_state("x").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);

    let options = ConnectOptions::new(coordinator.endpoint()).with_token(scenario_token);
    let a = Client::connect(options.clone()).await.unwrap();
    let b = Client::connect(options).await.unwrap();
    let response = a
        .session("auth-1")
        .unwrap()
        .start(Source::Client)
        .await
        .unwrap();
    b.session("auth-1")
        .unwrap()
        .start(Source::Vad)
        .await
        .unwrap();
    assert_eq!(
        within("the authorized watch delivers", response.stopped()).await,
        StopReason::Superseded
    );
    coordinator.stop().await;
}

// ---- TLS, mutual TLS and a scoped token against the real server ----

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("respcoord-client-{tag}-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_and_a_scoped_token_work_for_the_library_and_the_cli() {
    const TOKEN: &str = "gateway-token-0123456789abcdef";
    let (server_ca, client_ca) = (Ca::new("server CA").unwrap(), Ca::new("client CA").unwrap());
    let dir = TempDir::new("mtls");
    let (cert, key) = server_ca.leaf("localhost").unwrap();
    let server = TestServer::with_config(ServerConfig {
        tls: Some(TlsConfig {
            cert: Pem::certificates(&dir.file("server.pem", &cert)).unwrap(),
            key: Pem::private_key(&dir.file("server-key.pem", &key)).unwrap(),
            client_ca: Some(Pem::certificates(&dir.file("client-ca.pem", &client_ca.pem)).unwrap()),
        }),
        auth: Some(Tokens::parse(&format!("{TOKEN} tenant-a/\n")).unwrap()),
        ..Default::default()
    })
    .await;
    let (gateway_cert, gateway_key) = client_ca.leaf("gateway-1").unwrap();
    let tls = TlsOptions {
        ca: Some(dir.file("ca.pem", &server_ca.pem)),
        cert: Some(dir.file("gateway.pem", &gateway_cert)),
        key: Some(dir.file("gateway-key.pem", &gateway_key)),
        domain: Some("localhost".into()),
    };
    // host:port with TLS options means https.
    let options = ConnectOptions::new(server.addr.to_string())
        .with_tls(tls.clone())
        .with_token(TOKEN);
    let a = Client::connect(options.clone()).await.unwrap();
    let b = Client::connect(options.clone()).await.unwrap();
    let response = a
        .session("tenant-a/1")
        .unwrap()
        .start(Source::Client)
        .await
        .unwrap();
    b.session("tenant-a/1")
        .unwrap()
        .start(Source::Vad)
        .await
        .unwrap();
    assert_eq!(
        within("the watch over mutual TLS delivers", response.stopped()).await,
        StopReason::Superseded
    );
    // Outside the token's scope.
    let denied = a.get_state("tenant-b/1").await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    // No client certificate: the handshake fails.
    let anonymous = ConnectOptions::new(server.addr.to_string())
        .with_tls(TlsOptions {
            cert: None,
            key: None,
            ..tls.clone()
        })
        .with_token(TOKEN)
        .with_retry(RetryPolicy {
            deadline: Duration::from_secs(2),
            ..RetryPolicy::default()
        });
    // (With TLS 1.3 the refusal may come after the handshake, on the first call.)
    let refused = match Client::connect(anonymous).await {
        Ok(client) => client.get_state("tenant-a/1").await.unwrap_err(),
        Err(error) => error,
    };
    assert!(
        matches!(
            refused.code(),
            Code::Unavailable | Code::Cancelled | Code::Unknown
        ),
        "a transport failure, not an answer: {refused}"
    );

    server.stop().await;
}

// ---- latency ----

/// From B's call to A's `run` returning (its body dropped), over loopback.
/// Printed, never asserted: tests do not fail on timing. Run with
/// `cargo test --release --test client cancel_propagation -- --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_propagation_latency() {
    let server = TestServer::start().await;
    let a = connect(&server.endpoint()).await;
    let b = connect(&server.endpoint()).await;
    let params = scenario_params("cancel_propagation_latency");
    let number = |key: &str| params[key].as_u64().expect("a number") as usize;
    let (round_count, warmup, sessions) = (
        number("rounds"),
        number("warmup_rounds"),
        number("sessions"),
    );
    // As a gateway serving these sessions does: every round then finds its
    // session's watch open (opened ahead, or lingering since the last).
    for session in 0..sessions {
        a.session(&format!("latency-{session}"))
            .unwrap()
            .open_watch();
    }
    let mut latencies = Vec::with_capacity(warmup + round_count);
    for round in 0..warmup + round_count {
        let name = format!("latency-{}", round % sessions);
        let a_session = a.session(&name).unwrap();
        let b_session = b.session(&name).unwrap();
        let (started_tx, started_rx) = oneshot::channel();
        let run = tokio::spawn(async move {
            let outcome = a_session
                .run(Source::Client, |ctx| async move {
                    let _ = started_tx.send(ctx.response_id());
                    std::future::pending::<Result<(), ()>>().await
                })
                .await;
            (outcome, Instant::now())
        });
        let id = within("A starts", started_rx).await.unwrap();
        let called = Instant::now();
        if round % 2 == 0 {
            b_session.cancel(Source::Vad, Some(id)).await.unwrap();
        } else {
            let barge_in = b_session.start(Source::Vad).await.unwrap();
            assert_eq!(barge_in.superseded(), Some(id));
            drop(barge_in);
        }
        let (outcome, seen) = within("A sees it", run).await.unwrap();
        assert!(matches!(outcome, Ok(RunOutcome::Stopped { .. })));
        latencies.push(seen - called);
    }
    assert_eq!(
        a.watch_status().opened,
        sessions as u64,
        "every round reused its session's watch"
    );
    println!(
        "cancel propagation (rust, B's call to A's body stopped, over loopback): \
         first {round_count} rounds {}; last {round_count} of {} {}",
        latency_summary(&latencies[..round_count]),
        warmup + round_count,
        latency_summary(&latencies[latencies.len() - round_count..]),
    );
    server.stop().await;
}

/// p50, p99 and max of `samples`, as the latency scenarios print them.
fn latency_summary(samples: &[Duration]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() as f64 - 1.0) * q).round() as usize];
    format!(
        "p50 {:?}, p99 {:?}, max {:?}",
        at(0.50),
        at(0.99),
        sorted[sorted.len() - 1]
    )
}
