//! The real `respcoord` binary: configuration from flags and `RESPCOORD_*`
//! variables, idle expiry over the wire, SIGTERM draining (not ready and
//! health NOT_SERVING first, watches end with OK, in-flight calls may
//! finish, exit status 0), spans (and metrics) exported over OTLP with the
//! caller's trace id, secrets kept out of the logs, and exit status 2 naming the flag on bad
//! configuration.

mod common;

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::*;
use respcoord::proto::v1 as pb;
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};

fn wait_exit(process: &mut RespcoordProcess) -> std::process::ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = process.child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "respcoord did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigterm(process: &RespcoordProcess) {
    let pid = process.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());
}

async fn next_health(
    stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
) -> ServingStatus {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a health update in time")
        .expect("health stream")
        .expect("health stream still open")
        .status()
}

#[tokio::test]
async fn sigterm_ends_watches_cleanly_and_exits_zero() {
    // A long grace period: the test, not the clock, decides when the last
    // in-flight call ends.
    let (mut process, mut c) = spawn_respcoord(&[("RESPCOORD_SHUTDOWN_GRACE", "120s")]).await;
    assert_eq!(http_get(process.metrics, "/readyz").await.0, 200);
    // A health watch, as a load balancer's checker holds one; it is also the
    // in-flight call the drain waits for.
    let mut health = HealthClient::new(
        tonic::transport::Channel::from_shared(process.endpoint.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let mut health_watch = health
        .watch(HealthCheckRequest {
            service: "respcoord.v1.ResponseCoordinator".into(),
        })
        .await
        .expect("health watch")
        .into_inner();
    assert_eq!(next_health(&mut health_watch).await, ServingStatus::Serving);

    let mut session = watch_session(&mut c, "s", None).await;
    let mut all = watch_all(&mut c, Some(0)).await;
    let id = start(&mut c, "s").await.response_id;
    assert_eq!(
        evs(&next_events(&mut session, 1).await),
        [Ev::Started(id, pb::Source::Client)]
    );
    assert_eq!(next_events(&mut all, 1).await.len(), 1);

    sigterm(&process);

    // Health goes NOT_SERVING and the coordinator's watches end with OK.
    assert_eq!(
        next_health(&mut health_watch).await,
        ServingStatus::NotServing
    );
    let (events, end) = drain(&mut session).await;
    assert!(events.is_empty());
    end.expect("the session watch ends with OK at shutdown");
    let (_, end) = drain(&mut all).await;
    end.expect("watch-all ends with OK at shutdown");
    // While the health watch is still open the process drains: not ready,
    // still alive, the metrics port still answering.
    let (status, body) = http_get(process.metrics, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(http_get(process.metrics, "/healthz").await.0, 200);
    assert!(
        process.child.try_wait().expect("wait").is_none(),
        "the process waits for its in-flight calls"
    );
    // The last in-flight call ends; the process exits 0.
    drop(health_watch);
    drop(health);
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut process))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM");
}

#[tokio::test]
async fn sigterm_exits_zero_when_the_grace_period_runs_out() {
    let (mut process, _c) = spawn_respcoord(&[("RESPCOORD_SHUTDOWN_GRACE", "1s")]).await;
    let mut health = HealthClient::new(
        tonic::transport::Channel::from_shared(process.endpoint.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let mut health_watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_health(&mut health_watch).await, ServingStatus::Serving);
    sigterm(&process);
    assert_eq!(
        next_health(&mut health_watch).await,
        ServingStatus::NotServing
    );
    // The health watch is never closed by us: the grace period ends it.
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut process))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

// ---- OTLP traces ----

mod collector {
    use opentelemetry_proto::tonic::collector::{
        metrics::v1::{
            metrics_service_server::{MetricsService, MetricsServiceServer},
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        },
        trace::v1::{
            trace_service_server::{TraceService, TraceServiceServer},
            ExportTraceServiceRequest, ExportTraceServiceResponse,
        },
    };
    use tokio::sync::mpsc;

    /// A minimal OTLP/gRPC receiver: hands every trace export to the test,
    /// and the metric names of every metrics export.
    pub struct Collector(pub mpsc::UnboundedSender<ExportTraceServiceRequest>);

    pub struct MetricNames(pub mpsc::UnboundedSender<Vec<String>>);

    #[tonic::async_trait]
    impl MetricsService for MetricNames {
        async fn export(
            &self,
            request: tonic::Request<ExportMetricsServiceRequest>,
        ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
            let names = request
                .into_inner()
                .resource_metrics
                .iter()
                .flat_map(|r| &r.scope_metrics)
                .flat_map(|s| &s.metrics)
                .map(|m| m.name.clone())
                .collect();
            let _ = self.0.send(names);
            Ok(tonic::Response::new(ExportMetricsServiceResponse {
                partial_success: None,
            }))
        }
    }

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let _ = self.0.send(request.into_inner());
            Ok(tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            }))
        }
    }

    pub async fn start() -> (
        std::net::SocketAddr,
        mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
        mpsc::UnboundedReceiver<Vec<String>>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let (metrics_tx, metrics_rx) = mpsc::unbounded_channel();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Collector(tx)))
                .add_service(MetricsServiceServer::new(MetricNames(metrics_tx)))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (addr, rx, metrics_rx)
    }
}

#[tokio::test]
async fn spans_reach_an_otlp_collector_with_the_callers_trace_id() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let (collector, mut exports, mut metric_exports) = collector::start().await;
    let endpoint = format!("http://{collector}");
    let (mut process, mut c) = spawn_respcoord(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ("OTEL_SERVICE_NAME", "respcoord-under-test"),
    ])
    .await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let mut request = tonic::Request::new(start_req("traced", pb::Source::Client, ""));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent}-01").parse().unwrap(),
    );
    let started = c.start(request).await.unwrap().into_inner();

    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let (span, service_name) = loop {
        let export = tokio::time::timeout_at(deadline, exports.recv())
            .await
            .expect("a span reaches the collector in time")
            .expect("collector running");
        let found = export.resource_spans.iter().find_map(|resource| {
            let service = resource.resource.as_ref().and_then(|r| {
                r.attributes
                    .iter()
                    .find(|a| a.key == "service.name")
                    .and_then(|a| a.value.clone())
            });
            resource
                .scope_spans
                .iter()
                .flat_map(|scope| &scope.spans)
                .find(|span| hex(&span.trace_id) == trace_id)
                .map(|span| (span.clone(), service))
        });
        if let Some(found) = found {
            break found;
        }
    };
    assert_eq!(span.name, "respcoord.v1.ResponseCoordinator/Start");
    assert_eq!(
        hex(&span.parent_span_id),
        parent,
        "parented on the caller's span"
    );
    assert_eq!(span.kind, 2, "SPAN_KIND_SERVER");
    let attribute = |key: &str| {
        span.attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.as_ref())
            .and_then(|v| v.value.clone())
            .unwrap_or_else(|| panic!("span attribute {key}: {:?}", span.attributes))
    };
    assert_eq!(attribute("session_id"), Value::StringValue("traced".into()));
    // A u64 travels as an int or (tracing-opentelemetry) as its decimal text.
    match attribute("response_id") {
        Value::IntValue(id) => assert_eq!(u64::try_from(id).ok(), Some(started.response_id)),
        Value::StringValue(id) => assert_eq!(id, started.response_id.to_string()),
        other => panic!("response_id: {other:?}"),
    }
    assert_eq!(attribute("outcome"), Value::StringValue("started".into()));
    assert_eq!(
        attribute("rpc.system.name"),
        Value::StringValue("grpc".into())
    );
    assert_eq!(
        attribute("rpc.response.status_code"),
        Value::StringValue("OK".into())
    );
    assert_eq!(
        service_name.and_then(|v| v.value),
        Some(Value::StringValue("respcoord-under-test".into()))
    );
    // The same instruments are pushed over OTLP too.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let names = tokio::time::timeout_at(deadline, metric_exports.recv())
            .await
            .expect("metrics reach the collector in time")
            .expect("collector running");
        if names.iter().any(|n| n == "rpc.server.call.duration") {
            assert!(
                names.iter().any(|n| n == "respcoord.transitions"),
                "{names:?}"
            );
            break;
        }
    }
    sigterm(&process);
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut process))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

// ---- secrets ----

/// A scratch file of this test process's.
fn scratch(name: &str, contents: &str) -> PathBuf {
    scratch_file("respcoord-process", name, contents)
}

/// A self-signed certificate for `localhost`: (cert PEM, key PEM).
fn self_signed() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// SIGTERMs `process`, expects exit status 0, and returns the log it wrote.
async fn stop_and_read(mut process: RespcoordProcess, log: &std::path::Path) -> String {
    sigterm(&process);
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut process))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    std::fs::read_to_string(log).unwrap()
}

#[tokio::test]
async fn tokens_and_private_keys_never_reach_the_logs() {
    const TOKEN: &str = "very-secret-token-4f1d2a9c";
    let (cert, key) = self_signed();
    let tokens = scratch("log-tokens", &format!("{TOKEN} tenant-a/\n"));
    let cert_file = scratch("log-cert.pem", &cert);
    let key_file = scratch("log-key.pem", &key);
    let log = scratch("log-stderr", "");
    let process = spawn_respcoord_with(
        &[
            "--auth-tokens",
            tokens.to_str().unwrap(),
            "--tls-cert",
            cert_file.to_str().unwrap(),
            "--tls-key",
            key_file.to_str().unwrap(),
        ],
        // Everything at trace level, our crate and its dependencies alike.
        &[("RESPCOORD_LOG", "trace")],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let channel =
        tonic::transport::Endpoint::from_shared(process.endpoint.replace("http://", "https://"))
            .unwrap()
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(&cert))
                    .domain_name("localhost"),
            )
            .unwrap()
            .connect()
            .await
            .expect("TLS connect");
    let mut c = pb::response_coordinator_client::ResponseCoordinatorClient::new(channel);
    for (session, token) in [
        ("tenant-a/1", TOKEN),
        ("tenant-b/1", TOKEN),
        ("tenant-a/2", "wrong-token-but-long-enough"),
    ] {
        let mut request = tonic::Request::new(start_req(session, pb::Source::Client, ""));
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let _ = c.start(request).await;
    }
    let logged = stop_and_read(process, &log).await;
    assert!(
        logged.contains("respcoord.v1.ResponseCoordinator/Start"),
        "the calls were logged: {logged}"
    );
    assert!(!logged.contains(TOKEN), "a token was logged");
    assert!(
        !logged.contains("wrong-token-but-long-enough"),
        "a presented token was logged"
    );
    let key_body = key.lines().nth(1).expect("a PEM body line");
    assert!(!logged.contains(key_body), "the private key was logged");
}

#[tokio::test]
async fn idle_sessions_expire_over_the_wire_with_ttls_from_the_environment() {
    let (_process, mut c) = spawn_respcoord(&[
        ("RESPCOORD_SESSION_IDLE_TTL", "1s"),
        ("RESPCOORD_TOMBSTONE_TTL", "1s"),
    ])
    .await;
    let mut w = watch_session(&mut c, "s", None).await;
    let sent = Instant::now();
    let id = start(&mut c, "s").await.response_id;
    let (events, end) = drain(&mut w).await;
    let expired_after = sent.elapsed();
    end.unwrap();
    use pb::{CancelReason as R, TerminalStatus as T};
    assert_eq!(
        evs(&events),
        [
            Ev::Started(id, pb::Source::Client),
            Ev::CancelRequested(id, R::Expired),
            Ev::Ended(id, T::Cancelled, R::Expired),
            Ev::Terminated(R::Expired),
        ]
    );
    assert!(
        expired_after >= Duration::from_secs(1),
        "expired after {expired_after:?}, before the TTL"
    );
    // The tombstone is forgotten after its TTL; the id then starts afresh.
    let deadline = Instant::now() + PATIENCE;
    while get_state(&mut c, "s").await.is_ok() {
        assert!(Instant::now() < deadline, "tombstone never forgotten");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = start(&mut c, "s").await;
    assert!(again.response_id > id);
    assert_eq!(again.state.unwrap().revision, 1);
}

#[test]
fn bad_configuration_exits_2_naming_the_flag() {
    let (cert, key) = self_signed();
    let (_, other_key) = self_signed();
    let cert = scratch("bad-cert.pem", &cert);
    let key = scratch("bad-key.pem", &key);
    let other_key = scratch("bad-other-key.pem", &other_key);
    let not_pem = scratch("bad-not-pem", "hello\n");
    let short_token = scratch(
        "bad-tokens",
        "# a token that is too short\nshort-token tenant-a/\n",
    );
    let missing = "/nonexistent/respcoord/file";
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    /// Flags, environment, the flag the message must name.
    type Case<'a> = (Vec<String>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--session-idle-ttl".into(), "0s".into()],
            vec![],
            "--session-idle-ttl",
        ),
        (
            vec!["--tombstone-ttl".into(), "soon".into()],
            vec![],
            "--tombstone-ttl",
        ),
        (
            vec!["--max-sessions".into(), "0".into()],
            vec![],
            "--max-sessions",
        ),
        (
            vec![],
            vec![("RESPCOORD_MAX_SESSIONS", "lots")],
            "--max-sessions",
        ),
        // From the environment, the variable is named as well as the flag.
        (
            vec![],
            vec![("RESPCOORD_METRICS_LISTEN", "nowhere")],
            "--metrics-listen <METRICS_LISTEN>' (from RESPCOORD_METRICS_LISTEN)",
        ),
        (
            vec![],
            vec![("RESPCOORD_SESSION_IDLE_TTL", "0s")],
            "(from RESPCOORD_SESSION_IDLE_TTL)",
        ),
        (
            vec!["--listen".into(), "not-an-address".into()],
            vec![],
            "--listen",
        ),
        // The flags of this issue.
        (
            vec!["--metrics-listen".into(), "nowhere".into()],
            vec![],
            "--metrics-listen",
        ),
        (
            vec!["--request-timeout".into(), "0s".into()],
            vec![],
            "--request-timeout",
        ),
        (
            vec!["--max-concurrent-calls".into(), "0".into()],
            vec![],
            "--max-concurrent-calls",
        ),
        (
            vec!["--max-message-size".into(), "10".into()],
            vec![],
            "--max-message-size",
        ),
        (
            vec![],
            vec![("RESPCOORD_MAX_WATCHERS", "lots")],
            "--max-watchers",
        ),
        (
            vec!["--max-concurrent-streams".into(), "0".into()],
            vec![],
            "--max-concurrent-streams",
        ),
        (
            vec!["--http2-keepalive-interval".into(), "never".into()],
            vec![],
            "--http2-keepalive-interval",
        ),
        (vec!["--backend".into(), "etcd".into()], vec![], "--backend"),
        (
            vec![],
            vec![("RESPCOORD_NATS_BUCKET", "has.dots")],
            "--nats-bucket",
        ),
        (
            vec!["--nats-replicas".into(), "7".into()],
            vec![],
            "--nats-replicas",
        ),
        (
            vec!["--nats-history".into(), "65".into()],
            vec![],
            "--nats-history",
        ),
        (
            // Shorter than idle TTL + tombstone TTL: live sessions could age out.
            vec!["--nats-max-age".into(), "30m".into()],
            vec![],
            "--nats-max-age",
        ),
        (
            vec!["--auth-tokens".into(), missing.into()],
            vec![],
            "--auth-tokens",
        ),
        (
            vec!["--auth-tokens".into(), path(&short_token)],
            vec![],
            "--auth-tokens",
        ),
        (
            vec![],
            vec![("RESPCOORD_AUTH_TOKENS", missing)],
            "--auth-tokens",
        ),
        (vec!["--tls-cert".into(), path(&cert)], vec![], "--tls-key"),
        (vec!["--tls-key".into(), path(&key)], vec![], "--tls-cert"),
        (
            vec![
                "--tls-cert".into(),
                missing.into(),
                "--tls-key".into(),
                path(&key),
            ],
            vec![],
            "--tls-cert",
        ),
        (
            vec![
                "--tls-cert".into(),
                path(&not_pem),
                "--tls-key".into(),
                path(&key),
            ],
            vec![],
            "--tls-cert",
        ),
        (
            vec![
                "--tls-cert".into(),
                path(&cert),
                "--tls-key".into(),
                path(&not_pem),
            ],
            vec![],
            "--tls-key",
        ),
        (
            vec![
                "--tls-cert".into(),
                path(&cert),
                "--tls-key".into(),
                path(&other_key),
            ],
            vec![],
            "--tls-key",
        ),
        (
            vec!["--tls-client-ca".into(), path(&cert)],
            vec![],
            "--tls-cert",
        ),
        (
            vec![
                "--tls-cert".into(),
                path(&cert),
                "--tls-key".into(),
                path(&key),
                "--tls-client-ca".into(),
                path(&not_pem),
            ],
            vec![],
            "--tls-client-ca",
        ),
    ];
    for (args, envs, flag) in cases {
        let mut command = Command::new(RESPCOORD_BIN);
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, value) in &envs {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("run respcoord");
        let deadline = Instant::now() + PATIENCE;
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{args:?} {envs:?}: respcoord started instead of refusing");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?} {envs:?}: {stderr}");
        assert!(
            stderr.contains(flag),
            "{args:?} {envs:?}: message must name {flag}: {stderr}"
        );
        assert!(
            !stderr.contains("short-token"),
            "a token was printed: {stderr}"
        );
    }
}

/// Two real binaries on one NATS bucket (RESPCOORD_* configuration): either
/// serves a session the other created, and one draining leaves the other
/// serving. A NATS it cannot reach is a start-up failure, not a silent
/// in-memory fallback.
#[tokio::test]
async fn two_binaries_on_one_nats_bucket_serve_the_same_sessions() {
    if !nats_available() {
        return;
    }
    let url = test_nats_url();
    let bucket = fresh_bucket();
    let envs = [
        ("RESPCOORD_BACKEND", "nats"),
        ("RESPCOORD_NATS_URL", url.as_str()),
        ("RESPCOORD_NATS_BUCKET", bucket.as_str()),
        ("RESPCOORD_NATS_MEMORY_STORAGE", "true"),
    ];
    let (mut first, mut a) = spawn_respcoord(&envs).await;
    let (_second, mut b) = spawn_respcoord(&envs).await;
    let started = start(&mut a, "proc").await;
    let finished = finish(
        &mut b,
        "proc",
        started.response_id,
        pb::TerminalStatus::Failed,
    )
    .await;
    assert!(
        finished.applied,
        "the second binary finishes what the first started"
    );
    sigterm(&first);
    assert!(wait_exit(&mut first).success());
    let state = get_state(&mut b, "proc").await.expect("still served");
    assert_eq!(state.revision, 2);

    // No NATS there: exit 1 with the reason, never serve.
    let refused = Command::new(RESPCOORD_BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--backend",
            "nats",
            "--nats-url",
            &format!("nats://127.0.0.1:{}", free_port()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .expect("run respcoord");
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("cannot connect to NATS"), "{stderr}");
}

/// Issue 27: logs an operator can search. In JSON, a response id is a
/// string (a 64-bit id as a JSON number reads back wrong in JavaScript and
/// most log stores); no field carries Rust's `Debug` text (`None`,
/// `Some(..)`, `Start { .. }`); and a log written to a file, not a
/// terminal, holds no colour escapes in either format.
#[tokio::test]
async fn logs_in_a_file_have_ids_as_text_no_debug_formatting_and_no_colour() {
    for format in ["json", "human"] {
        let log = scratch(&format!("searchable-{format}"), "");
        let process = spawn_respcoord_with(
            &[],
            &[
                ("RESPCOORD_LOG_FORMAT", format),
                // The RPC spans and every transition's debug event.
                ("RESPCOORD_LOG", "debug"),
            ],
            Stdio::from(std::fs::File::create(&log).unwrap()),
        );
        let mut c = client_for(&process).await;
        let first = start(&mut c, "searchable").await.response_id;
        let second = c
            .start(start_req("searchable", pb::Source::Vad, "r-1"))
            .await
            .expect("superseding start")
            .into_inner()
            .response_id;
        assert!(
            finish(&mut c, "searchable", second, pb::TerminalStatus::Completed)
                .await
                .applied
        );
        let logged = stop_and_read(process, &log).await;
        assert!(
            !logged.contains('\u{1b}'),
            "{format}: colour escapes in a file: {logged}"
        );
        for debug_text in ["None", "Some(", "Start {", "Started {", "Unspecified"] {
            assert!(
                !logged.contains(debug_text),
                "{format}: Debug text {debug_text:?} in the logs: {logged}"
            );
        }
        if format == "json" {
            let lines: Vec<serde_json::Value> = logged
                .lines()
                .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
                .collect();
            let ids: Vec<&serde_json::Value> = lines
                .iter()
                .flat_map(|line| {
                    let span = line.get("span").and_then(|s| s.get("response_id"));
                    [line.get("response_id"), span].into_iter().flatten()
                })
                .collect();
            for id in [first, second] {
                assert!(
                    ids.contains(&&serde_json::Value::String(id.to_string())),
                    "response {id} logged as text: {ids:?}"
                );
            }
            assert!(
                ids.iter().all(|id| id.is_string()),
                "every response_id is a string: {ids:?}"
            );
        }
    }
}

/// Issue 27: secure by default. Without `--listen` the server is reachable
/// from this machine only; served on every interface without tokens, it
/// says so at start, and on loopback it does not.
#[tokio::test]
async fn serving_without_tokens_beyond_loopback_is_warned_about() {
    let log = scratch("open-to-the-network", "");
    let port = free_port();
    let mut open = KillOnDrop::new(
        Command::new(RESPCOORD_BIN)
            .args(["serve", "--listen", &format!("0.0.0.0:{port}")])
            .env("RESPCOORD_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spawn respcoord"),
    );
    let deadline = Instant::now() + PATIENCE;
    let logged = loop {
        let logged = std::fs::read_to_string(&log).unwrap();
        if logged.contains("respcoord serving") {
            break logged;
        }
        assert!(
            open.try_wait().expect("wait").is_none(),
            "respcoord exited: {logged}"
        );
        assert!(Instant::now() < deadline, "never served: {logged}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let warning = logged
        .lines()
        .find(|line| line.contains("without authentication"))
        .unwrap_or_else(|| panic!("no warning on 0.0.0.0 without tokens: {logged}"));
    assert!(warning.contains(r#""level":"WARN""#), "{warning}");
    assert!(warning.contains(&format!("0.0.0.0:{port}")), "{warning}");
    open.kill();

    let log = scratch("loopback-only", "");
    let process = spawn_respcoord_with(&[], &[], Stdio::from(std::fs::File::create(&log).unwrap()));
    client_for(&process).await;
    let logged = stop_and_read(process, &log).await;
    assert!(!logged.contains("without authentication"), "{logged}");
}
