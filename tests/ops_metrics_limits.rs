//! Operations over the wire: the metrics port (every documented series after
//! traffic, health and readiness; the process series; the NATS backend's
//! own series, on that backend only), and the server's limits (load shedding
//! answers at once, grpc-timeout frees a stuck call, the watcher limit, the
//! message size limit).

mod common;

use std::time::{Duration, Instant};

use common::*;
use respcoord::{
    grpc::WatchSettings,
    ids::SessionId,
    machine::{FinishStatus, Source},
    nats::NatsCoordinator,
    proto::v1 as pb,
    registry::{CoordConfig, Registry},
    server::{Limits, ServerConfig},
};
use tonic::{codegen::Bytes, Code};

const COORDINATOR: &str = "respcoord.v1.ResponseCoordinator";

fn method(name: &str) -> String {
    format!("{COORDINATOR}/{name}")
}

async fn scrape(server: &TestServer) -> String {
    let (status, body) = http_get(server.metrics_addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

fn value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(scrape, name, labels)
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in the scrape:\n{scrape}"))
}

#[tokio::test]
async fn metrics_scrape_has_every_series_after_traffic() {
    let server = TestServer::with_config(ServerConfig {
        registry: CoordConfig {
            idle_ttl: Duration::from_millis(200),
            watch_all_buffer: 8,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let mut c = server.client().await;

    // Health and readiness on the metrics port.
    assert_eq!(http_get(server.metrics_addr, "/healthz").await.0, 200);
    assert_eq!(http_get(server.metrics_addr, "/readyz").await.0, 200);

    // Every kind of transition, a replay, a refusal.
    let first = c
        .start(start_req("m", pb::Source::Client, "turn-1"))
        .await
        .unwrap()
        .into_inner();
    let replay = c
        .start(start_req("m", pb::Source::Client, "turn-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed);
    let second = start(&mut c, "m").await;
    assert_eq!(second.superseded_response_id, first.response_id);
    finish(
        &mut c,
        "m",
        second.response_id,
        pb::TerminalStatus::Completed,
    )
    .await;
    start(&mut c, "m").await;
    cancel(&mut c, "m", 0).await;
    shutdown(&mut c, "m").await;
    assert_code(get_state(&mut c, "unknown").await, Code::NotFound);

    // One session that expires (idle TTL 200 ms), watched to its end.
    let mut expiring = watch_session(&mut c, "e", None).await;
    start(&mut c, "e").await;
    let (events, end) = drain(&mut expiring).await;
    end.expect("the expired session's watch ends with OK");
    assert_eq!(events.len(), 4, "started, then the three EXPIRED events");

    // One watch-all that falls behind: it reads nothing while the registry
    // publishes far more than its buffers hold.
    let mut lagging = watch_all(&mut c, None).await;
    let busy = SessionId::parse("busy").unwrap();
    for _ in 0..30_000 {
        let started = server
            .coordinator
            .start(&busy, Source::Vad, None)
            .await
            .unwrap();
        server
            .coordinator
            .finish(&busy, Some(started.response), FinishStatus::Completed)
            .await
            .unwrap();
    }
    let (_, end) = drain(&mut lagging).await;
    assert_eq!(end.unwrap_err().code(), Code::ResourceExhausted);

    // And one watch open while we scrape.
    let _open = watch_session(&mut c, "open", None).await;

    let text = scrape(&server).await;
    let ok = [("rpc_response_status_code", "OK")];
    let start_ok = [
        ("rpc_system_name", "grpc"),
        ("rpc_method", &method("Start") as &str),
        ok[0],
    ];
    assert!(value(&text, "rpc_server_call_duration_seconds_count", &start_ok) >= 4.0);
    assert!(value(&text, "rpc_server_call_duration_seconds_sum", &start_ok) > 0.0);
    assert!(text.contains("rpc_server_call_duration_seconds_bucket{"));
    assert_eq!(
        value(
            &text,
            "rpc_server_call_duration_seconds_count",
            &[
                ("rpc_method", &method("GetState")),
                ("rpc_response_status_code", "NOT_FOUND")
            ]
        ),
        1.0
    );
    for name in ["Finish", "Cancel", "Shutdown"] {
        assert_eq!(
            value(
                &text,
                "rpc_server_call_duration_seconds_count",
                &[("rpc_method", &method(name)), ok[0]]
            ),
            1.0,
            "{name}"
        );
    }
    // The ended watches were measured too (a whole stream per sample).
    assert!(
        value(
            &text,
            "rpc_server_call_duration_seconds_count",
            &[
                ("rpc_method", &method("Watch")),
                ("rpc_response_status_code", "RESOURCE_EXHAUSTED")
            ]
        ) >= 1.0
    );

    let transitions = |kind| value(&text, "respcoord_transitions_total", &[("kind", kind)]);
    assert_eq!(transitions("supersede"), 1.0);
    assert_eq!(transitions("cancel"), 1.0);
    assert_eq!(transitions("shutdown"), 1.0);
    assert_eq!(transitions("expire"), 1.0);
    assert_eq!(transitions("start"), 30_003.0);
    assert_eq!(transitions("finish"), 30_001.0);
    let events = |kind| value(&text, "respcoord_events_total", &[("kind", kind)]);
    assert_eq!(events("terminated"), 2.0);
    assert_eq!(events("started"), 30_004.0);
    // Supersede, Cancel and the expiry of "e" (active); "m" was idle at Shutdown.
    assert_eq!(events("cancel_requested"), 3.0);
    assert_eq!(events("ended"), 30_004.0);
    // "m" and "e" are tombstones; "busy" is idle.
    let sessions = |phase| value(&text, "respcoord_sessions", &[("phase", phase)]);
    assert_eq!(sessions("terminated"), 2.0);
    assert_eq!(sessions("active"), 0.0);
    assert_eq!(sessions("idle"), 1.0);
    assert_eq!(value(&text, "respcoord_sessions_expired_total", &[]), 1.0);
    // How the responses ended, and who stopped the stopped ones: the
    // client's Start superseded one, the VAD's Cancel one, expiry one.
    let ended = |outcome| {
        value(
            &text,
            "respcoord_responses_ended_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(ended("completed"), 30_001.0);
    assert_eq!(ended("superseded"), 1.0);
    assert_eq!(ended("requested"), 1.0);
    assert_eq!(ended("expired"), 1.0);
    assert_eq!(ended("shutdown") + ended("failed"), 0.0);
    let ran = |outcome| {
        value(
            &text,
            "respcoord_responses_duration_seconds_total",
            &[("outcome", outcome)],
        )
    };
    // The expired response ran at least the idle TTL.
    assert!(ran("expired") >= 0.2, "{}", ran("expired"));
    assert!(ran("completed") > 0.0 && ran("superseded") > 0.0);
    let stopped = |reason, source| {
        value(
            &text,
            "respcoord_responses_stopped_total",
            &[("reason", reason), ("source", source)],
        )
    };
    assert_eq!(stopped("superseded", "client"), 1.0);
    assert_eq!(stopped("requested", "vad"), 1.0);
    assert_eq!(stopped("expired", "none"), 1.0);
    assert_eq!(
        stopped("superseded", "vad") + stopped("requested", "client"),
        0.0
    );
    assert_eq!(value(&text, "respcoord_request_id_replays_total", &[]), 1.0);
    assert_eq!(
        value(
            &text,
            "respcoord_watchers_lagged_total",
            &[("scope", "all")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "respcoord_watchers_lagged_total",
            &[("scope", "session")]
        ),
        0.0
    );
    assert_eq!(
        value(&text, "respcoord_watchers", &[("scope", "session")]),
        1.0
    );
    assert_eq!(value(&text, "respcoord_watchers", &[("scope", "all")]), 0.0);
    server.stop().await;
}

/// Scrapes until `ready` holds of the scrape (something a background task
/// reports: the connection's first event, the expirer's lease).
async fn scrape_until(server: &TestServer, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = scrape(server).await;
        if ready(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}, in the scrape:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The standard process series, from procfs (Linux only).
fn assert_process_series(text: &str) {
    if !cfg!(target_os = "linux") {
        assert!(!text.contains("process_"), "no procfs, no process series");
        return;
    }
    assert!(value(text, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(value(text, "process_virtual_memory_bytes", &[]) > 0.0);
    assert!(value(text, "process_cpu_seconds_total", &[]) >= 0.0);
    let open = value(text, "process_open_fds", &[]);
    assert!(open > 0.0 && open <= value(text, "process_max_fds", &[]));
    // Some time after 2001.
    assert!(value(text, "process_start_time_seconds", &[]) > 1e9);
    assert!(text.contains("# TYPE process_cpu_seconds_total counter"));
}

#[tokio::test]
async fn the_memory_backend_has_the_process_series_and_no_nats_series() {
    let config = ServerConfig::default();
    let server = TestServer::serving(Registry::new(config.registry).into(), None, config).await;
    let mut c = server.client().await;
    start(&mut c, "mem").await;
    let text = scrape(&server).await;
    assert_process_series(&text);
    assert!(
        !text.contains("respcoord_nats_"),
        "a NATS series on the memory backend:\n{text}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_nats_backend_counts_conflicts_store_requests_connection_and_lease() {
    if !nats_available() {
        return;
    }
    // A short tombstone TTL, so the expirer soon forgets a shut-down
    // session (a purge) and holds the lease meanwhile.
    let registry = CoordConfig {
        tombstone_ttl: Duration::from_millis(300),
        ..Default::default()
    };
    let bucket = fresh_bucket();
    let settings = test_nats_settings(&bucket, &registry);
    let connect = || async {
        NatsCoordinator::connect(&settings, registry)
            .await
            .unwrap_or_else(|e| panic!("NATS backend for tests: {e}"))
    };
    // Two replicas of one bucket; only `a` is served (and runs the expirer).
    let (a, b) = (connect().await, connect().await);
    let config = ServerConfig {
        registry,
        ..Default::default()
    };
    let server = TestServer::serving(a.clone().into(), Some(bucket), config).await;

    // Twice, so that `a` remembers the revision it wrote last whether or
    // not it knew the stream's clock the first time.
    let id = SessionId::parse("raced").unwrap();
    a.start(&id, Source::Client, None).await.unwrap();
    a.start(&id, Source::Client, None).await.unwrap();
    let before = scrape(&server).await;
    assert_eq!(
        value(&before, "respcoord_nats_cas_conflicts_total", &[]),
        0.0
    );
    // `b` moves the session on; `a` writes against the revision it
    // remembers, loses the compare-and-set, and decides again from a read.
    let by_b = b.start(&id, Source::Vad, None).await.unwrap();
    let by_a = a.start(&id, Source::Client, None).await.unwrap();
    assert_eq!(by_a.superseded, Some(by_b.response), "decided on b's write");
    assert_eq!(b.nats_stats().cas_conflicts, 0);

    // A quorum point (GetState), and a session for the expirer to forget.
    a.state(&id).await.unwrap();
    let gone = SessionId::parse("gone").unwrap();
    a.start(&gone, Source::Client, None).await.unwrap();
    a.shutdown(&gone).await.unwrap();

    let ops = |text: &str, op| {
        sample(
            text,
            "respcoord_nats_store_duration_seconds_count",
            &[("op", op)],
        )
    };
    let text = scrape_until(&server, "connected, lease held, a purge", |text| {
        sample(text, "respcoord_nats_connected", &[]) == Some(1.0)
            && sample(text, "respcoord_nats_expiry_lease_held", &[]) == Some(1.0)
            && ops(text, "purge").is_some_and(|n| n >= 1.0)
    })
    .await;
    assert_eq!(value(&text, "respcoord_nats_cas_conflicts_total", &[]), 1.0);
    for op in ["read", "write", "quorum_point"] {
        assert!(ops(&text, op).is_some_and(|n| n >= 1.0), "{op}:\n{text}");
    }
    assert!(text.contains("respcoord_nats_store_duration_seconds_bucket{"));
    for reason in ["not_ready", "no_responders", "timeout", "other", "moved"] {
        value(
            &text,
            "respcoord_nats_store_retries_total",
            &[("reason", reason)],
        );
    }
    assert_eq!(value(&text, "respcoord_nats_reconnects_total", &[]), 0.0);
    assert_eq!(
        value(&text, "respcoord_nats_lame_duck_events_total", &[]),
        0.0
    );
    value(&text, "respcoord_nats_follower_restarts_total", &[]);
    value(&text, "respcoord_nats_follower_lag_messages", &[]);
    assert_process_series(&text);
    server.stop().await;
}

/// A raw HTTP/2 call whose request body never ends: it holds its place in
/// the in-flight limit until the server gives up on it (or we finish it).
struct StuckCall {
    response: h2::client::ResponseFuture,
    body: h2::SendStream<Bytes>,
    _connection: tokio::task::JoinHandle<()>,
}

/// One length-prefixed gRPC message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

async fn stuck_call(server: &TestServer, grpc_timeout: Option<&str>) -> StuckCall {
    raw_call(server, "GetState", grpc_timeout).await
}

async fn raw_call(server: &TestServer, name: &str, grpc_timeout: Option<&str>) -> StuckCall {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/{}", server.addr, method(name)))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(timeout) = grpc_timeout {
        request = request.header("grpc-timeout", timeout);
    }
    let (response, body) = client
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    StuckCall {
        response,
        body,
        _connection: connection,
    }
}

/// The gRPC status of a raw call's response (headers or trailers).
async fn raw_status(call: StuckCall) -> Code {
    let response = tokio::time::timeout(PATIENCE, call.response)
        .await
        .expect("the stuck call is answered in time")
        .unwrap();
    if let Some(code) = response.headers().get("grpc-status") {
        return Code::from_bytes(code.as_bytes());
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.unwrap();
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    Code::from_bytes(trailers.get("grpc-status").expect("grpc-status").as_bytes())
}

fn limited(max_concurrent_calls: usize) -> ServerConfig {
    ServerConfig {
        limits: Limits {
            max_concurrent_calls,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn load_shedding_answers_unavailable_at_once_and_health_stays_open() {
    let server = TestServer::with_config(limited(1)).await;
    let mut c = server.client().await;
    start(&mut c, "s").await;

    // The only slot is taken by a call whose request never ends.
    let mut stuck = stuck_call(&server, None).await;
    // Overflow calls are refused at once, not queued behind it.
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let sent = Instant::now();
        let refused = tokio::time::timeout(PATIENCE, get_state(&mut c, "s"))
            .await
            .expect("an overloaded server answers instead of queueing");
        latencies.push(sent.elapsed());
        let status = assert_code(refused, Code::Unavailable);
        assert!(status.message().contains("overloaded"), "{status:?}");
    }
    latencies.sort();
    println!(
        "load shedding: 20 refused calls, median {:?}, max {:?}",
        latencies[10], latencies[19]
    );
    // Probes are never shed.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let check = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "respcoord.v1.ResponseCoordinator".into(),
        })
        .await
        .expect("health is answered under overload")
        .into_inner();
    assert_eq!(
        check.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );

    // Finishing the stuck call frees the slot.
    let message = prost::Message::encode_to_vec(&pb::GetStateRequest {
        session_id: "s".into(),
    });
    stuck.body.send_data(grpc_frame(&message), true).unwrap();
    assert_eq!(raw_status(stuck).await, Code::Ok);
    let deadline = Instant::now() + PATIENCE;
    while get_state(&mut c, "s").await.is_err() {
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn grpc_timeout_ends_a_stuck_call_and_frees_its_slot() {
    let server = TestServer::with_config(limited(1)).await;
    let mut c = server.client().await;
    start(&mut c, "s").await;
    let stuck = stuck_call(&server, Some("200m")).await;
    // The caller's deadline (200 ms) ends the call long before the server's
    // default; the status is not OK and the slot is free again.
    assert_ne!(raw_status(stuck).await, Code::Ok);
    let deadline = Instant::now() + PATIENCE;
    while get_state(&mut c, "s").await.is_err() {
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn the_watcher_limit_is_resource_exhausted() {
    let server = TestServer::with(
        CoordConfig::default(),
        WatchSettings {
            max_watchers: 2,
            ..Default::default()
        },
    )
    .await;
    let mut c = server.client().await;
    let first = watch_session(&mut c, "a", None).await;
    let _second = watch_all(&mut c, None).await;
    let refused = c
        .watch(pb::WatchRequest {
            session_id: "b".into(),
            after_revision: None,
            after_seq: None,
        })
        .await;
    let status = assert_code(refused, Code::ResourceExhausted);
    assert!(
        status.message().contains("watcher limit of 2"),
        "{status:?}"
    );
    // A watch that ends gives its place back.
    drop(first);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let again = c
            .watch(pb::WatchRequest {
                session_id: "b".into(),
                after_revision: None,
                after_seq: None,
            })
            .await;
        match again {
            Ok(_) => break,
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted),
        }
        assert!(Instant::now() < deadline, "the watch slot was never freed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn messages_beyond_the_size_limit_are_refused() {
    let server = TestServer::with_config(ServerConfig {
        limits: Limits {
            max_message_bytes: 2048,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let mut c = server.client().await;
    // Requests: a StartRequest padded with an unknown field past the limit.
    let mut padded = prost::Message::encode_to_vec(&start_req("s", pb::Source::Client, ""));
    // Field 99, length-delimited, 4000 bytes: valid protobuf, 4 KiB long.
    padded.extend_from_slice(&[0x9a, 0x06, 0xa0, 0x1f]);
    padded.extend(std::iter::repeat_n(b'x', 4000));
    let decoded: pb::StartRequest = prost::Message::decode(&padded[..]).unwrap();
    assert_eq!(decoded.session_id, "s");
    let mut call = raw_call(&server, "Start", None).await;
    call.body.send_data(grpc_frame(&padded), true).unwrap();
    assert_eq!(raw_status(call).await, Code::OutOfRange);
    assert!(get_state(&mut c, "s").await.is_err(), "nothing was created");
    // Responses: a listing larger than the limit is refused, a small one works.
    for i in 0..100 {
        start(&mut c, &format!("a-session-with-a-long-enough-name-{i:03}")).await;
    }
    let listed = c
        .list_sessions(pb::ListSessionsRequest {
            page_size: 1000,
            page_token: String::new(),
        })
        .await;
    assert!(listed.is_err(), "a 100-session page is over 2 KiB");
    let small = c
        .list_sessions(pb::ListSessionsRequest {
            page_size: 2,
            page_token: String::new(),
        })
        .await
        .expect("a small page fits");
    assert_eq!(small.into_inner().sessions.len(), 2);
    server.stop().await;
}
