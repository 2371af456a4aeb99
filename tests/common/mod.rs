//! Shared harness for end-to-end tests: a real respcoord server on a loopback
//! port, a generated gRPC client, and helpers to read watches and to check
//! the contract's invariants over a recorded event stream.
#![allow(dead_code)] // each test binary uses a different subset

mod processes;

#[allow(unused_imports)] // the e2e suites spawn no processes
pub use processes::*;

use std::{collections::HashMap, net::SocketAddr, path::PathBuf, time::Duration};

use respcoord::{
    backend::Coordinator,
    grpc::WatchSettings,
    nats::{NatsCoordinator, NatsSettings},
    proto::v1::{
        self as pb, lifecycle_event::Kind, response_coordinator_client::ResponseCoordinatorClient,
    },
    registry::{CoordConfig, Registry},
    server::{self, ServerConfig},
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tonic::{transport::Channel, Code, Status, Streaming};

pub type Client = ResponseCoordinatorClient<Channel>;

/// How long a test waits for something that should happen promptly before it
/// declares failure. Generous: tests never fail on speed, only on absence.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub struct TestServer {
    pub addr: SocketAddr,
    /// The metrics port (`/metrics`, `/healthz`, `/readyz`).
    pub metrics_addr: SocketAddr,
    pub coordinator: Coordinator,
    /// The bucket, when the suite runs against the NATS backend.
    pub bucket: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), server::ServeError>>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with(CoordConfig::default(), WatchSettings::default()).await
    }

    pub async fn with(registry: CoordConfig, watch: WatchSettings) -> Self {
        Self::with_config(ServerConfig {
            registry,
            watch,
            shutdown_grace: Duration::from_secs(5),
            ..ServerConfig::default()
        })
        .await
    }

    /// A server with every knob given, and a metrics port.
    pub async fn with_config(config: ServerConfig) -> Self {
        let (coordinator, bucket) = coordinator_for_tests(config.registry).await;
        Self::serving(coordinator, bucket, config).await
    }

    /// Serves `coordinator` (a NATS replica a cluster test built, say).
    pub async fn serving(
        coordinator: Coordinator,
        bucket: Option<String>,
        config: ServerConfig,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let metrics = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let metrics_addr = metrics.local_addr().expect("local addr");
        let listener = server::Listeners {
            grpc: listener,
            metrics: Some(metrics),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(server::serve_coordinator(
            coordinator.clone(),
            config,
            listener,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            metrics_addr,
            coordinator,
            bucket,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    pub fn backend(&self) -> &'static str {
        self.coordinator.backend_name()
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.endpoint())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to test server")
    }

    pub async fn client(&self) -> Client {
        ResponseCoordinatorClient::new(self.channel().await)
    }

    /// Kills the server as a crash would: no drain, no goodbye; its
    /// in-flight calls and open watches are cut off.
    pub async fn kill(mut self) {
        self.stop.take();
        if let Some(handle) = self.handle.take() {
            handle.abort();
            let _ = handle.await;
        }
    }

    /// Triggers graceful shutdown and waits for the server to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            let result = tokio::time::timeout(PATIENCE, handle)
                .await
                .expect("server stops in time")
                .expect("server task");
            result.expect("server exits cleanly");
        }
    }
}

/// Which backend the end-to-end suites run against: `RESPCOORD_TEST_BACKEND`
/// (`memory`, the default, or `nats`); `scripts/test.sh` runs them with both.
pub fn test_backend() -> String {
    std::env::var("RESPCOORD_TEST_BACKEND").unwrap_or_else(|_| "memory".into())
}

/// NATS for the suites: `RESPCOORD_TEST_NATS_URL`, default loopback.
pub fn test_nats_url() -> String {
    std::env::var("RESPCOORD_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// Whether the shared NATS is there to test against: `RESPCOORD_TEST_NATS_URL`
/// set (the test command starts a pinned nats-server and sets it), or
/// something listening on 127.0.0.1:4222 (which must be 2.10 or newer). Says so when it is not, so that a
/// bare `cargo test` on a laptop passes such tests vacuously but visibly.
pub fn nats_available() -> bool {
    if std::env::var_os("RESPCOORD_TEST_NATS_URL").is_some() {
        return true;
    }
    let reachable = std::net::TcpStream::connect("127.0.0.1:4222").is_ok();
    if !reachable {
        eprintln!("no NATS on 127.0.0.1:4222 and RESPCOORD_TEST_NATS_URL unset: skipped");
    }
    reachable
}

/// Letters no other call in this process, nor another test process (or an
/// earlier run), gets: the process id, the time and a counter. For bucket
/// and scratch directory names.
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A bucket name no other test (or earlier run) uses.
pub fn fresh_bucket() -> String {
    format!("t{}", unique_suffix())
}

/// Writes `contents` to `name` in this test process's scratch directory
/// (`$TMPDIR/{prefix}-{pid}`) and returns its path: certificates, keys and
/// tokens that a server or CLI under test reads from a file.
pub fn scratch_file(prefix: &str, name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write a scratch file");
    path
}

/// NATS settings for a test bucket (in NATS memory: nothing left on disk),
/// replicated as `RESPCOORD_TEST_NATS_REPLICAS` says (1 by default; the
/// test command runs the end-to-end suite once more on a three-node
/// cluster with 3).
pub fn test_nats_settings(bucket: &str, config: &CoordConfig) -> NatsSettings {
    let replicas = std::env::var("RESPCOORD_TEST_NATS_REPLICAS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    NatsSettings {
        url: test_nats_url(),
        bucket: bucket.to_owned(),
        replicas,
        history: u8::try_from(config.session_history.clamp(1, 64)).unwrap_or(64),
        request_timeout: Duration::from_secs(5),
        memory_storage: true,
        // Test buckets empty themselves; the server is shared with later runs.
        max_age: Duration::from_secs(15 * 60),
        ..NatsSettings::default()
    }
}

async fn coordinator_for_tests(config: CoordConfig) -> (Coordinator, Option<String>) {
    match test_backend().as_str() {
        "nats" => {
            let bucket = fresh_bucket();
            let nats = NatsCoordinator::connect(&test_nats_settings(&bucket, &config), config)
                .await
                .unwrap_or_else(|e| panic!("NATS backend for tests: {e}"));
            (nats.into(), Some(bucket))
        }
        _ => (Registry::new(config).into(), None),
    }
}

/// A plain HTTP/1.1 GET (the metrics port, nats-server's monitoring port):
/// status code and body. Panics if there is no HTTP answer in time.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    try_http_get(addr, path)
        .await
        .unwrap_or_else(|error| panic!("GET {path} from {addr}: {error}"))
}

/// [`http_get`] for a caller that retries until the port answers: the error
/// says why there was no HTTP answer (nothing listening yet, say).
pub async fn try_http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Error, ErrorKind};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let late = |what: &str| Error::new(ErrorKind::TimedOut, format!("no {what} in {PATIENCE:?}"));
    let mut stream = tokio::time::timeout(PATIENCE, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| late("connection"))??;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
        .await
        .map_err(|_| late("response"))??;
    let response =
        String::from_utf8(response).map_err(|e| Error::new(ErrorKind::InvalidData, e))?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidData,
                format!("not an HTTP response: {response:?}"),
            )
        })?;
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned());
    Ok((status, body))
}

/// The value of the Prometheus sample `name{labels..}` whose labels include
/// every `(label, value)` given; `None` if no such sample.
pub fn sample(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (label_text, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        labels
            .iter()
            .all(|(label, value)| label_text.contains(&format!("{label}=\"{value}\"")))
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// A small deterministic generator (xorshift) for load tests, so a failure
/// replays exactly from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---- requests ----

pub fn start_req(session: &str, source: pb::Source, request_id: &str) -> pb::StartRequest {
    pb::StartRequest {
        session_id: session.into(),
        source: source.into(),
        request_id: request_id.into(),
    }
}

pub async fn start(client: &mut Client, session: &str) -> pb::StartResponse {
    client
        .start(start_req(session, pb::Source::Client, ""))
        .await
        .expect("start")
        .into_inner()
}

/// Starts `a` on `session`, then `b` superseding it; returns both ids.
pub async fn superseded_pair(client: &mut Client, session: &str) -> (u64, u64) {
    let a = start(client, session).await.response_id;
    let b = client
        .start(start_req(session, pb::Source::Vad, ""))
        .await
        .expect("superseding start")
        .into_inner();
    assert_eq!(b.superseded_response_id, a);
    (a, b.response_id)
}

pub async fn finish(
    client: &mut Client,
    session: &str,
    id: u64,
    status: pb::TerminalStatus,
) -> pb::FinishResponse {
    client
        .finish(pb::FinishRequest {
            session_id: session.into(),
            response_id: id,
            status: status.into(),
        })
        .await
        .expect("finish")
        .into_inner()
}

pub async fn cancel(client: &mut Client, session: &str, if_id: u64) -> pb::CancelResponse {
    client
        .cancel(pb::CancelRequest {
            session_id: session.into(),
            source: pb::Source::Vad.into(),
            if_response_id: if_id,
        })
        .await
        .expect("cancel")
        .into_inner()
}

pub async fn shutdown(client: &mut Client, session: &str) -> pb::ShutdownResponse {
    client
        .shutdown(pb::ShutdownRequest {
            session_id: session.into(),
            source: pb::Source::Unspecified.into(),
        })
        .await
        .expect("shutdown")
        .into_inner()
}

pub async fn get_state(client: &mut Client, session: &str) -> Result<pb::SessionState, Status> {
    client
        .get_state(pb::GetStateRequest {
            session_id: session.into(),
        })
        .await
        .map(|r| r.into_inner().state.expect("state is always set"))
}

pub async fn watch_session(
    client: &mut Client,
    session: &str,
    after_revision: Option<u64>,
) -> Streaming<pb::WatchResponse> {
    client
        .watch(pb::WatchRequest {
            session_id: session.into(),
            after_revision,
            after_seq: None,
        })
        .await
        .expect("watch")
        .into_inner()
}

pub async fn watch_all(
    client: &mut Client,
    after_seq: Option<u64>,
) -> Streaming<pb::WatchResponse> {
    client
        .watch(pb::WatchRequest {
            session_id: String::new(),
            after_revision: None,
            after_seq,
        })
        .await
        .expect("watch all")
        .into_inner()
}

// ---- reading watches ----

/// Reads until `n` events arrived (bookmarks skipped). Panics on timeout.
pub async fn next_events(
    stream: &mut Streaming<pb::WatchResponse>,
    n: usize,
) -> Vec<pb::LifecycleEvent> {
    let mut events = Vec::new();
    while events.len() < n {
        let message = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .unwrap_or_else(|_| panic!("timed out with {} of {n} events: {events:?}", events.len()))
            .expect("watch stream error")
            .unwrap_or_else(|| {
                panic!(
                    "stream ended with {} of {n} events: {events:?}",
                    events.len()
                )
            });
        if message.events.is_empty() {
            assert_ne!(
                message.progress_seq, 0,
                "an empty WatchResponse must be a bookmark"
            );
        } else {
            assert_eq!(
                message.progress_seq, 0,
                "progress_seq is 0 on responses that carry events"
            );
        }
        events.extend(message.events);
    }
    assert_eq!(events.len(), n, "more events than expected: {events:?}");
    events
}

/// Reads to the end of the stream (bookmarks skipped); returns the events and
/// the final status (Ok for a clean end).
pub async fn drain(
    stream: &mut Streaming<pb::WatchResponse>,
) -> (Vec<pb::LifecycleEvent>, Result<(), Status>) {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("stream ends in time")
        {
            Ok(Some(message)) => events.extend(message.events),
            Ok(None) => return (events, Ok(())),
            Err(status) => return (events, Err(status)),
        }
    }
}

/// Asserts nothing arrives for `quiet` (bookmarks would be allowed, events not).
pub async fn assert_no_events(stream: &mut Streaming<pb::WatchResponse>, quiet: Duration) {
    let deadline = tokio::time::Instant::now() + quiet;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => return,
            Ok(Ok(Some(message))) => assert!(
                message.events.is_empty(),
                "unexpected events: {:?}",
                message.events
            ),
            Ok(other) => panic!("stream ended unexpectedly: {other:?}"),
        }
    }
}

// ---- compact event form for exact comparisons ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    Started(u64, pb::Source),
    CancelRequested(u64, pb::CancelReason),
    Ended(u64, pb::TerminalStatus, pb::CancelReason),
    Terminated(pb::CancelReason),
}

pub fn ev(event: &pb::LifecycleEvent) -> Ev {
    match event.kind.as_ref().expect("every event has a kind") {
        Kind::Started(s) => Ev::Started(s.response_id, s.source()),
        Kind::CancelRequested(c) => Ev::CancelRequested(c.response_id, c.reason()),
        Kind::Ended(e) => Ev::Ended(e.response_id, e.status(), e.reason()),
        Kind::Terminated(t) => Ev::Terminated(t.reason()),
    }
}

pub fn evs(events: &[pb::LifecycleEvent]) -> Vec<Ev> {
    events.iter().map(ev).collect()
}

pub fn revisions(events: &[pb::LifecycleEvent]) -> Vec<u64> {
    events.iter().map(|e| e.revision).collect()
}

pub fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code) -> Status {
    match result {
        Ok(value) => panic!("expected {code:?}, got Ok({value:?})"),
        Err(status) => {
            assert_eq!(status.code(), code, "{status:?}");
            status
        }
    }
}

// ---- invariants over a recorded stream ----

/// Replays a watch-all recording and checks the contract's invariants: seq
/// strictly increasing, per-session revisions 1,2,3.. with no gap, at most
/// one live response per session at every point, exactly one `ended` per
/// `started` (once the session is terminated, none left live), nothing after
/// `terminated`, and response ids strictly increasing per session.
pub fn check_invariants(events: &[pb::LifecycleEvent]) -> InvariantReport {
    #[derive(Default)]
    struct S {
        revision: u64,
        live: Option<u64>,
        ended: std::collections::HashSet<u64>,
        started: std::collections::HashSet<u64>,
        last_started: u64,
        terminated: bool,
        cancel_requested: Option<u64>,
    }
    let mut sessions: HashMap<String, S> = HashMap::new();
    let mut last_seq = 0;
    let mut report = InvariantReport::default();
    for event in events {
        assert!(event.seq > last_seq, "seq not increasing at {event:?}");
        last_seq = event.seq;
        let s = sessions.entry(event.session_id.clone()).or_default();
        assert_eq!(event.revision, s.revision + 1, "revision gap at {event:?}");
        s.revision = event.revision;
        assert!(!s.terminated, "event after terminated: {event:?}");
        match ev(event) {
            Ev::Started(id, _) => {
                assert!(
                    s.live.is_none(),
                    "two live responses in {}: {:?} and {id}",
                    event.session_id,
                    s.live
                );
                assert!(
                    id > s.last_started,
                    "response id not increasing: {id} after {}",
                    s.last_started
                );
                assert!(s.started.insert(id));
                s.last_started = id;
                s.live = Some(id);
                report.started += 1;
            }
            Ev::CancelRequested(id, _) => {
                assert_eq!(
                    s.live,
                    Some(id),
                    "cancel_requested for a response that is not live: {event:?}"
                );
                s.cancel_requested = Some(id);
            }
            Ev::Ended(id, status, _) => {
                assert_eq!(
                    s.live,
                    Some(id),
                    "ended for a response that is not live: {event:?}"
                );
                assert!(
                    s.started.contains(&id) && s.ended.insert(id),
                    "second terminal for {id}"
                );
                if status == pb::TerminalStatus::Cancelled {
                    assert_eq!(
                        s.cancel_requested,
                        Some(id),
                        "cancelled without cancel_requested first"
                    );
                }
                s.live = None;
                report.ended += 1;
            }
            Ev::Terminated(_) => {
                assert!(
                    s.live.is_none(),
                    "terminated with a live response: {event:?}"
                );
                s.terminated = true;
                report.terminated += 1;
            }
        }
    }
    report.sessions = sessions.len();
    report.still_live = sessions.values().filter(|s| s.live.is_some()).count();
    report
}

#[derive(Debug, Default, Clone, Copy)]
pub struct InvariantReport {
    pub sessions: usize,
    pub started: usize,
    pub ended: usize,
    pub terminated: usize,
    pub still_live: usize,
}
