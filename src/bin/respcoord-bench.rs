//! `respcoord-bench`: measures respcoord against the ceiling of its own stack.
//!
//! - `respcoord-bench wire`: drives the real gRPC wire (C connections x M calls
//!   in flight) through four workloads, each against respcoord AND, in the
//!   same run, against an in-process "empty" tonic server for the same proto
//!   whose handlers only return a default reply (its Watch never sends). It
//!   prints throughput and p50/p99/p99.9 latency for both and the ratio
//!   respcoord/empty, which is what the targets in docs/performance.md are
//!   written against: on a shared 2-core machine absolute numbers drift,
//!   the ratio measured in one run does much less.
//! - `respcoord-bench memory`: RSS growth for N sessions that each ran one
//!   Start/Finish (bytes per session), then the CPU the whole server process
//!   uses with those sessions idle and no traffic (% of one core).
//!
//! - `respcoord-bench cluster`: the NATS backend's Start/Finish over gRPC
//!   against raw JetStream KV compare-and-set (`update` with the revision it
//!   got back, no read) on the same NATS server, same concurrency, in one run;
//!   prints both and the ratio.
//!
//! Only loopback is ever targeted: the in-process servers listen on
//! 127.0.0.1, and `--endpoint` must resolve to loopback addresses. Every run
//! is bounded by `--warmup` + `--duration` per workload and server.

/// See `mimalloc` in Cargo.toml: the binaries use mimalloc, the library
/// leaves the choice to whoever links it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use clap::{Args, Parser, Subcommand, ValueEnum};
use respcoord::{
    grpc::WatchSettings,
    ids::SessionId,
    machine::{FinishStatus, Source},
    proto::v1::{
        self as pb,
        response_coordinator_client::ResponseCoordinatorClient,
        response_coordinator_server::{ResponseCoordinator, ResponseCoordinatorServer},
    },
    registry::{Registry, RegistryConfig},
    server::{self, ServerConfig},
};
use tokio::{net::TcpListener, runtime::Runtime, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{
    transport::{server::TcpIncoming, Channel, Endpoint, Server},
    Code, Request, Response, Status,
};

type Client = ResponseCoordinatorClient<Channel>;

#[derive(Debug, Parser)]
#[command(
    name = "respcoord-bench",
    about = "Load generator and memory/idle-CPU probe for respcoord (see docs/performance.md)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Wire workloads against respcoord and an empty server for the same proto.
    Wire(WireArgs),
    /// RSS per session after one Start/Finish each, then idle CPU of the server.
    Memory(MemoryArgs),
    /// The NATS backend against raw JetStream KV compare-and-set on the same
    /// server, in one run.
    Cluster(ClusterArgs),
}

fn duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
enum Workload {
    /// Start then Finish, each worker cycling over its own share of --sessions.
    StartFinish,
    /// Start superseding on --hot-sessions shared by all workers, every
    /// --cancel-every'th call a Cancel.
    BargeIn,
    /// GetState over --sessions.
    GetState,
    /// start-finish load while --session-watchers session watches and one
    /// watch-all stream; measures event delivery latency.
    Watch,
}

#[derive(Debug, Clone, Args)]
struct WireArgs {
    /// Target an already running respcoord (loopback only) instead of starting
    /// one in-process for each workload. The empty server is always in-process.
    #[arg(long)]
    endpoint: Option<String>,
    /// Client connections (HTTP/2) for the load.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Calls in flight per connection (one task each).
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Measured time per workload and server.
    #[arg(long, default_value = "2s", value_parser = duration)]
    duration: Duration,
    /// Unmeasured load before each measurement.
    #[arg(long, default_value = "1s", value_parser = duration)]
    warmup: Duration,
    /// Repeat each workload; rounds alternate which server goes first and
    /// their samples are pooled.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Servers to measure (both are needed for the ratios; one alone is for
    /// profiling).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "empty,respcoord"
    )]
    servers: Vec<Target>,
    /// Workloads to run, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "start-finish,barge-in,get-state,watch"
    )]
    workloads: Vec<Workload>,
    /// Sessions the start-finish, get-state and watch loads spread over.
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// Sessions the barge-in load hammers.
    #[arg(long, default_value_t = 100)]
    hot_sessions: usize,
    /// In barge-in, every Nth call is a Cancel (0: never).
    #[arg(long, default_value_t = 4)]
    cancel_every: u64,
    /// Session watches opened for the watch workload (on distinct sessions
    /// spread over --sessions), plus one watch-all.
    #[arg(long, default_value_t = 1_000)]
    session_watchers: usize,
    /// Connections the watch streams share (at most 100 streams each by default).
    #[arg(long)]
    watch_connections: Option<usize>,
    /// Log filter of the in-process respcoord, installed as `respcoord serve`
    /// installs it (its RPC spans are INFO: the default `info` pays for
    /// them, as production does; `off` measures without).
    #[arg(long, default_value = "info")]
    log: String,
    /// Worker threads of the in-process servers' runtime (default: cores).
    #[arg(long)]
    server_threads: Option<usize>,
    /// Worker threads of the load generator's runtime (default: cores).
    #[arg(long)]
    client_threads: Option<usize>,
}

#[derive(Debug, Clone, Args)]
struct MemoryArgs {
    /// Sessions to create, each with one Start and one Finish.
    #[arg(long, default_value_t = 1_000_000)]
    sessions: usize,
    /// Registry shards (default: the registry's default). The per-shard hash
    /// tables' load factor, and so bytes per session, depends on it.
    #[arg(long)]
    shards: Option<usize>,
    /// How long to measure the idle server's CPU afterwards (0s: skip).
    #[arg(long, default_value = "10s", value_parser = duration)]
    idle: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    print_machine();
    match cli.command {
        Command::Wire(args) => wire(args),
        Command::Memory(args) => memory(args),
        Command::Cluster(args) => cluster(args),
    }
}

// ---------------------------------------------------------------- machine --

fn print_machine() {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("machine: {cores} cores (available_parallelism), cpu model: {model}");
    println!("load average at start: {}", loadavg());
    println!(
        "build: {}",
        if cfg!(debug_assertions) {
            "DEBUG (numbers are meaningless: use --release)"
        } else {
            "release"
        }
    );
}

/// /proc/loadavg's first three fields: other work on the machine skews
/// absolute numbers (the ratios less so).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

// ----------------------------------------------------------- empty server --

/// The ceiling: the same proto and transport, handlers that do nothing.
struct Empty;

#[tonic::async_trait]
impl ResponseCoordinator for Empty {
    async fn start(
        &self,
        _: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn finish(
        &self,
        _: Request<pb::FinishRequest>,
    ) -> Result<Response<pb::FinishResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn cancel(
        &self,
        _: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn shutdown(
        &self,
        _: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn get_state(
        &self,
        _: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::GetStateResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn list_sessions(
        &self,
        _: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    type WatchStream = tokio_stream::Pending<Result<pb::WatchResponse, Status>>;

    async fn watch(
        &self,
        _: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Ok(Response::new(tokio_stream::pending()))
    }
}

/// A server on 127.0.0.1 that stops when `stop` is cancelled.
struct Running {
    url: String,
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Running {
    fn shut(self, runtime: &Runtime) {
        self.stop.cancel();
        let handle = self.handle;
        let _ = runtime
            .block_on(async move { tokio::time::timeout(Duration::from_secs(10), handle).await });
    }
}

fn bind(runtime: &Runtime) -> (TcpListener, SocketAddr) {
    let listener = runtime
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    (listener, addr)
}

fn start_empty(runtime: &Runtime) -> Running {
    let (listener, addr) = bind(runtime);
    let stop = CancellationToken::new();
    let handle = runtime.spawn({
        let stop = stop.clone();
        async move {
            let served = Server::builder()
                .add_service(ResponseCoordinatorServer::new(Empty))
                .serve_with_incoming_shutdown(
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    stop.cancelled_owned(),
                )
                .await;
            if let Err(error) = served {
                eprintln!("empty server: {error}");
            }
        }
    });
    Running {
        url: format!("http://{addr}"),
        stop,
        handle,
    }
}

fn start_respcoord(runtime: &Runtime, registry: Registry) -> Running {
    let (listener, addr) = bind(runtime);
    let stop = CancellationToken::new();
    let config = ServerConfig {
        registry: *registry.config(),
        watch: WatchSettings::default(),
        shutdown_grace: Duration::from_secs(2),
        ..ServerConfig::default()
    };
    let handle = runtime.spawn({
        let stop = stop.clone();
        async move {
            if let Err(error) =
                server::serve_coordinator(registry.into(), config, listener, stop.cancelled_owned())
                    .await
            {
                eprintln!("respcoord server: {error}");
            }
        }
    });
    Running {
        url: format!("http://{addr}"),
        stop,
        handle,
    }
}

/// Refuses anything but loopback: load is only ever sent to this machine.
async fn check_loopback(url: &str) -> Result<(), String> {
    let uri: tonic::codegen::http::Uri =
        url.parse().map_err(|e| format!("--endpoint {url}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "--endpoint {url}: only http:// (plaintext loopback)"
        ));
    }
    let host = uri
        .host()
        .ok_or_else(|| format!("--endpoint {url}: no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("--endpoint {url}: {e}"))?
        .collect();
    if addrs.is_empty() || addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "--endpoint {url} resolves to {addrs:?}: only loopback addresses may be targeted"
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------ stats --

/// One measured run: completed calls in the window and their latencies.
#[derive(Default)]
struct Sample {
    calls: u64,
    errors: u64,
    first_error: Option<String>,
    window: Duration,
    latencies: Vec<u64>,
    /// On-CPU time of the in-process server's and the load generator's
    /// threads during the window (zero for a server out of process).
    server_cpu: Duration,
    client_cpu: Duration,
}

impl Sample {
    fn merge(&mut self, other: Sample) {
        self.calls += other.calls;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.window += other.window;
        self.latencies.extend(other.latencies);
        self.server_cpu += other.server_cpu;
        self.client_cpu += other.client_cpu;
    }

    fn cpu_per_call(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / self.calls.max(1) as f64
    }

    fn throughput(&self) -> f64 {
        self.calls as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

/// Nearest-rank percentiles over a sorted copy.
struct Percentiles {
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
}

fn percentiles(values: &mut [u64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let at = |p: f64| {
        let rank = (p * values.len() as f64).ceil() as usize;
        values[rank.clamp(1, values.len()) - 1]
    };
    Some(Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        max: values[values.len() - 1],
    })
}

fn ms(nanos: u64) -> String {
    format!("{:.3} ms", nanos as f64 / 1e6)
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

const SERVER_THREADS: &str = "bench-server";
const CLIENT_THREADS: &str = "bench-client";

/// On-CPU time so far of this process's threads named `SERVER_THREADS` and
/// `CLIENT_THREADS` (per-thread schedstat, nanoseconds). CPU per call is far
/// steadier than throughput on a machine shared with other work.
fn cpu_by_role() -> (Duration, Duration) {
    let (mut server, mut client) = (0u64, 0u64);
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.filter_map(Result::ok) {
            let path = task.path();
            let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
                continue;
            };
            let Some(nanos) = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            else {
                continue;
            };
            match name.trim() {
                SERVER_THREADS => server += nanos,
                CLIENT_THREADS => client += nanos,
                _ => {}
            }
        }
    }
    (Duration::from_nanos(server), Duration::from_nanos(client))
}

/// Delivery of watch events to the watch streams.
#[derive(Default)]
struct Delivery {
    session_latencies: Vec<u64>,
    all_latencies: Vec<u64>,
    session_events: u64,
    all_events: u64,
    ended_lagged: u64,
    ended_other: u64,
    ended_ok: u64,
    opened: u64,
    first_end: Option<String>,
}

impl Delivery {
    fn merge(&mut self, other: Delivery) {
        self.session_latencies.extend(other.session_latencies);
        self.all_latencies.extend(other.all_latencies);
        self.session_events += other.session_events;
        self.all_events += other.all_events;
        self.ended_lagged += other.ended_lagged;
        self.ended_other += other.ended_other;
        self.ended_ok += other.ended_ok;
        self.opened += other.opened;
        if self.first_end.is_none() {
            self.first_end = other.first_end;
        }
    }
}

// ------------------------------------------------------------------- load --

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, ValueEnum)]
enum Target {
    Empty,
    Respcoord,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Empty => "empty",
            Target::Respcoord => "respcoord",
        }
    }
}

struct Plan {
    workload: Workload,
    sessions: Arc<Vec<String>>,
    hot: Arc<Vec<String>>,
    cancel_every: u64,
    warmup: Duration,
    duration: Duration,
}

async fn connect(url: &str, count: usize) -> Result<Vec<Channel>, String> {
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let channel = Endpoint::from_shared(url.to_owned())
            .map_err(|e| format!("{url}: {e}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("connect {url}: {e}"))?;
        channels.push(channel);
    }
    Ok(channels)
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

fn start_request(session: &str, source: pb::Source) -> pb::StartRequest {
    pb::StartRequest {
        session_id: session.to_owned(),
        source: source.into(),
        request_id: String::new(),
    }
}

fn finish_request(session: &str, response_id: u64) -> pb::FinishRequest {
    pb::FinishRequest {
        session_id: session.to_owned(),
        response_id,
        status: pb::TerminalStatus::Completed.into(),
    }
}

/// Records one call if it completed inside the measured window.
struct Recorder {
    measure_from: Instant,
    until: Instant,
    sample: Sample,
}

impl Recorder {
    fn record<T>(&mut self, began: Instant, result: Result<T, Status>) -> Option<T> {
        let done = Instant::now();
        let counted = began >= self.measure_from && done <= self.until;
        match result {
            Ok(value) => {
                if counted {
                    self.sample.calls += 1;
                    let nanos = u64::try_from((done - began).as_nanos()).unwrap_or(u64::MAX);
                    self.sample.latencies.push(nanos);
                }
                Some(value)
            }
            Err(status) => {
                if counted {
                    self.sample.errors += 1;
                }
                if self.sample.first_error.is_none() {
                    self.sample.first_error =
                        Some(format!("{:?}: {}", status.code(), status.message()));
                }
                None
            }
        }
    }
}

/// One in-flight slot: calls back to back until the window closes.
async fn worker(
    mut client: Client,
    plan: Arc<Plan>,
    index: usize,
    workers: usize,
    measure_from: Instant,
    until: Instant,
) -> Sample {
    let mut rec = Recorder {
        measure_from,
        until,
        sample: Sample::default(),
    };
    let mut rng =
        Rng(0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let mut round = 0usize;
    let mut calls = 0u64;
    while Instant::now() < until {
        match plan.workload {
            Workload::StartFinish | Workload::Watch => {
                // This worker's own share (sessions index, index + workers,
                // ...): no two workers touch one session, so every Finish
                // applies. With more workers than sessions they share.
                let len = plan.sessions.len();
                let share = len.saturating_sub(index % len).div_ceil(workers).max(1);
                let slot = (index % len) + workers * (round % share);
                round += 1;
                let Some(session) = plan.sessions.get(slot % len) else {
                    break;
                };
                let began = Instant::now();
                let started = client
                    .start(start_request(session, pb::Source::Client))
                    .await;
                let Some(started) = rec.record(began, started.map(|r| r.into_inner())) else {
                    continue;
                };
                let began = Instant::now();
                let finished = client
                    .finish(finish_request(session, started.response_id))
                    .await;
                rec.record(began, finished);
            }
            Workload::BargeIn => {
                let session = &plan.hot[rng.below(plan.hot.len())];
                calls += 1;
                let began = Instant::now();
                if plan.cancel_every > 0 && calls.is_multiple_of(plan.cancel_every) {
                    let cancelled = client
                        .cancel(pb::CancelRequest {
                            session_id: session.clone(),
                            source: pb::Source::Client.into(),
                            if_response_id: 0,
                        })
                        .await;
                    rec.record(began, cancelled);
                } else {
                    let started = client.start(start_request(session, pb::Source::Vad)).await;
                    rec.record(began, started);
                }
            }
            Workload::GetState => {
                let session = &plan.sessions[rng.below(plan.sessions.len())];
                let began = Instant::now();
                let state = client
                    .get_state(pb::GetStateRequest {
                        session_id: session.clone(),
                    })
                    .await;
                rec.record(began, state);
            }
        }
    }
    rec.sample
}

/// Creates the sessions a workload reads (untimed), so the measured window
/// is steady state rather than session creation.
async fn prepare(clients: &[Client], plan: &Plan) -> Result<(), String> {
    let sessions: Vec<String> = match plan.workload {
        Workload::BargeIn => plan.hot.to_vec(),
        _ => plan.sessions.to_vec(),
    };
    let lanes = clients.len().max(1);
    let mut tasks = Vec::new();
    for (lane, client) in clients.iter().enumerate() {
        let mut client = client.clone();
        let mine: Vec<String> = sessions.iter().skip(lane).step_by(lanes).cloned().collect();
        tasks.push(tokio::spawn(async move {
            for session in mine {
                let started = client
                    .start(start_request(&session, pb::Source::Client))
                    .await
                    .map_err(|s| format!("prepare start {session}: {s}"))?
                    .into_inner();
                client
                    .finish(finish_request(&session, started.response_id))
                    .await
                    .map_err(|s| format!("prepare finish {session}: {s}"))?;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Reads one watch stream until `stop`, recording delivery latency of events
/// stamped inside the measured window.
async fn read_watch(
    mut stream: tonic::Streaming<pb::WatchResponse>,
    watch_all: bool,
    window: (i64, i64),
    stop: CancellationToken,
) -> Delivery {
    let mut delivery = Delivery {
        opened: 1,
        ..Delivery::default()
    };
    loop {
        let message = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            message = stream.message() => message,
        };
        match message {
            Ok(Some(message)) => {
                let received = unix_nanos();
                for event in &message.events {
                    if watch_all {
                        delivery.all_events += 1;
                    } else {
                        delivery.session_events += 1;
                    }
                    if event.unix_nanos >= window.0 && event.unix_nanos < window.1 {
                        let latency = u64::try_from(received - event.unix_nanos).unwrap_or(0);
                        if watch_all {
                            delivery.all_latencies.push(latency);
                        } else {
                            delivery.session_latencies.push(latency);
                        }
                    }
                }
            }
            Ok(None) => {
                delivery.ended_ok += 1;
                delivery.first_end = Some("ended OK".into());
                break;
            }
            Err(status) => {
                if status.code() == Code::ResourceExhausted {
                    delivery.ended_lagged += 1;
                } else {
                    delivery.ended_other += 1;
                }
                delivery.first_end = Some(format!("{:?}: {}", status.code(), status.message()));
                break;
            }
        }
    }
    delivery
}

struct RunResult {
    load: Sample,
    delivery: Option<Delivery>,
}

async fn run(url: String, plan: Arc<Plan>, args: WireArgs) -> Result<RunResult, String> {
    let channels = connect(&url, args.connections).await?;
    let clients: Vec<Client> = channels.iter().cloned().map(Client::new).collect();
    prepare(&clients, &plan).await?;

    // Watches first, so every event of the measured window has its watchers.
    let mut streams = Vec::new();
    if plan.workload == Workload::Watch {
        let watchers = args.session_watchers;
        let connections = args
            .watch_connections
            .unwrap_or_else(|| watchers.div_ceil(100).max(1));
        let watch_clients: Vec<Client> = connect(&url, connections)
            .await?
            .into_iter()
            .map(Client::new)
            .collect();
        let mut requests: Vec<(pb::WatchRequest, bool)> = (0..watchers)
            .map(|i| {
                let session = &plan.sessions[i * plan.sessions.len() / watchers.max(1)];
                let request = pb::WatchRequest {
                    session_id: session.clone(),
                    after_revision: None,
                    after_seq: None,
                };
                (request, false)
            })
            .collect();
        requests.push((pb::WatchRequest::default(), true));
        for (i, (request, watch_all)) in requests.into_iter().enumerate() {
            let mut client = watch_clients[i % watch_clients.len()].clone();
            let stream = client
                .watch(request)
                .await
                .map_err(|s| format!("open watch: {s}"))?
                .into_inner();
            streams.push((stream, watch_all));
        }
    }

    let measure_from = Instant::now() + plan.warmup;
    let until = measure_from + plan.duration;
    let window_unix = {
        let from = unix_nanos() + i64::try_from(plan.warmup.as_nanos()).unwrap_or(0);
        (
            from,
            from + i64::try_from(plan.duration.as_nanos()).unwrap_or(0),
        )
    };
    let stop_watches = CancellationToken::new();
    let watch_tasks: Vec<_> = streams
        .into_iter()
        .map(|(stream, watch_all)| {
            tokio::spawn(read_watch(
                stream,
                watch_all,
                window_unix,
                stop_watches.clone(),
            ))
        })
        .collect();
    let meter = tokio::task::spawn_blocking(move || {
        std::thread::sleep(measure_from.saturating_duration_since(Instant::now()));
        let (server0, client0) = cpu_by_role();
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let (server1, client1) = cpu_by_role();
        (
            server1.saturating_sub(server0),
            client1.saturating_sub(client0),
        )
    });
    let workers = args.connections.max(1) * args.in_flight.max(1);
    let tasks: Vec<_> = (0..workers)
        .map(|index| {
            tokio::spawn(worker(
                clients[index % clients.len()].clone(),
                Arc::clone(&plan),
                index,
                workers,
                measure_from,
                until,
            ))
        })
        .collect();
    let mut load = Sample {
        window: plan.duration,
        ..Sample::default()
    };
    for task in tasks {
        let sample = task.await.map_err(|e| e.to_string())?;
        load.merge(Sample {
            window: Duration::ZERO,
            ..sample
        });
    }
    (load.server_cpu, load.client_cpu) = meter.await.map_err(|e| e.to_string())?;

    let delivery = if watch_tasks.is_empty() {
        None
    } else {
        // Let in-flight deliveries land, then close the streams.
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop_watches.cancel();
        let mut delivery = Delivery::default();
        for task in watch_tasks {
            delivery.merge(task.await.map_err(|e| e.to_string())?);
        }
        Some(delivery)
    };
    Ok(RunResult { load, delivery })
}

fn session_names(prefix: &str, kind: &str, count: usize) -> Arc<Vec<String>> {
    Arc::new(
        (0..count)
            .map(|i| format!("{prefix}-{kind}-{i:06}"))
            .collect(),
    )
}

fn describe(
    target: Target,
    sample: &mut Sample,
    in_process: bool,
) -> (String, Option<Percentiles>) {
    let throughput = sample.throughput();
    let errors = match &sample.first_error {
        Some(first) => format!("  errors {} (first: {first})", sample.errors),
        None => format!("  errors {}", sample.errors),
    };
    let cpu = if in_process {
        format!(
            "  cpu/call: server {:.1} us, load generator {:.1} us",
            sample.cpu_per_call(sample.server_cpu),
            sample.cpu_per_call(sample.client_cpu)
        )
    } else {
        format!(
            "  cpu/call: load generator {:.1} us",
            sample.cpu_per_call(sample.client_cpu)
        )
    };
    let p = percentiles(&mut sample.latencies);
    let line = match &p {
        Some(p) => format!(
            "{:<9}  {:>9.0} calls/s  p50 {}  p99 {}  p99.9 {}  max {}{cpu}{errors}",
            target.name(),
            throughput,
            ms(p.p50),
            ms(p.p99),
            ms(p.p999),
            ms(p.max),
        ),
        None => format!("{:<9}  no completed calls{errors}", target.name()),
    };
    (line, p)
}

/// One workload's result on both servers.
struct Outcome {
    /// Median over rounds of the paired ratios (each round runs both
    /// servers back to back), robust to a burst of other work on the machine.
    throughput_ratio: f64,
    p99_ratio: f64,
    /// Pooled over all rounds.
    pooled_throughput_ratio: f64,
    pooled_p99_ratio: f64,
    /// Server CPU per call, respcoord/empty (in-process runs only).
    server_cpu_ratio: Option<f64>,
    delivery: Option<Delivery>,
}

/// The subscriber `respcoord serve` installs (human log lines on stderr,
/// no OTLP export), so the in-process server pays what production pays.
fn install_telemetry(filter: &str) -> Result<(), String> {
    respcoord::telemetry::init(
        respcoord::config::LogFormat::Human,
        filter,
        respcoord::telemetry::OtlpSignals::default(),
    )
    .map(|_telemetry| ())
    .map_err(|e| format!("--log {filter}: {e}"))
}

fn wire(args: WireArgs) -> ExitCode {
    if let Err(error) = install_telemetry(&args.log) {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.server_threads.unwrap_or(cores).max(1))
        .thread_name("bench-server")
        .enable_all()
        .build()
        .expect("server runtime");
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.unwrap_or(cores).max(1))
        .thread_name("bench-client")
        .enable_all()
        .build()
        .expect("client runtime");
    if let Some(endpoint) = &args.endpoint {
        if let Err(error) = client_runtime.block_on(check_loopback(endpoint)) {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    }
    println!(
        "wire: {} connections x {} in flight, warmup {:?} + {:?} per workload and server, {} round(s); \
         server runtime {} threads, client runtime {} threads; log filter {:?}; respcoord {}",
        args.connections,
        args.in_flight,
        args.warmup,
        args.duration,
        args.rounds,
        args.server_threads.unwrap_or(cores),
        args.client_threads.unwrap_or(cores),
        args.log,
        args.endpoint
            .as_deref()
            .map_or("in-process (fresh registry, default config, per workload and round)".to_owned(), |e| format!("at {e}")),
    );
    let empty = start_empty(&server_runtime);
    let prefix = format!("bench-{}", std::process::id());
    let mut outcomes: HashMap<Workload, Outcome> = HashMap::new();
    let mut failed = false;
    let in_process = args.endpoint.is_none();
    for &workload in &args.workloads {
        println!();
        println!("== {}", workload_title(workload, &args));
        let mut pooled: HashMap<Target, (Sample, Delivery)> = HashMap::new();
        let mut round_throughput_ratios = Vec::new();
        let mut round_p99_ratios = Vec::new();
        for round in 0..args.rounds.max(1) {
            let order = if round % 2 == 0 {
                [Target::Empty, Target::Respcoord]
            } else {
                [Target::Respcoord, Target::Empty]
            };
            let mut this_round: HashMap<Target, (f64, Option<u64>)> = HashMap::new();
            for target in order {
                if !args.servers.contains(&target) {
                    continue;
                }
                let tag = format!("{prefix}-r{round}-{}", target.name());
                let plan = Arc::new(Plan {
                    workload,
                    sessions: session_names(&tag, "s", args.sessions.max(1)),
                    hot: session_names(&tag, "hot", args.hot_sessions.max(1)),
                    cancel_every: args.cancel_every,
                    warmup: args.warmup,
                    duration: args.duration,
                });
                let local = match (target, &args.endpoint) {
                    (Target::Empty, _) | (Target::Respcoord, Some(_)) => None,
                    (Target::Respcoord, None) => Some(start_respcoord(
                        &server_runtime,
                        Registry::new(RegistryConfig::default()),
                    )),
                };
                let url = match (target, &local, &args.endpoint) {
                    (Target::Empty, _, _) => empty.url.clone(),
                    (_, Some(local), _) => local.url.clone(),
                    (_, None, Some(endpoint)) => endpoint.clone(),
                    (_, None, None) => unreachable!("respcoord is local or an endpoint"),
                };
                let result = client_runtime.block_on(run(url, Arc::clone(&plan), args.clone()));
                if let Some(local) = local {
                    local.shut(&server_runtime);
                }
                match result {
                    Ok(mut result) => {
                        let server_in_process = target == Target::Empty || in_process;
                        let (line, p) = describe(target, &mut result.load, server_in_process);
                        println!("  round {round}  {line}");
                        this_round.insert(target, (result.load.throughput(), p.map(|p| p.p99)));
                        if let Some(delivery) = &mut result.delivery {
                            if target == Target::Respcoord {
                                print_delivery("           ", delivery);
                            }
                        }
                        let entry = pooled.entry(target).or_default();
                        entry.0.merge(result.load);
                        if let Some(delivery) = result.delivery {
                            entry.1.merge(delivery);
                        }
                    }
                    Err(error) => {
                        eprintln!("  round {round}  {}: FAILED: {error}", target.name());
                        failed = true;
                    }
                }
            }
            if let (Some((e, e99)), Some((c, c99))) = (
                this_round.get(&Target::Empty),
                this_round.get(&Target::Respcoord),
            ) {
                let throughput = c / e.max(1e-9);
                round_throughput_ratios.push(throughput);
                let p99 = match (e99, c99) {
                    (Some(e), Some(c)) => *c as f64 / (*e).max(1) as f64,
                    _ => f64::NAN,
                };
                round_p99_ratios.push(p99);
                println!("  round {round}  ratio respcoord/empty: throughput {throughput:.3}x, p99 {p99:.3}x");
            }
        }
        println!("  load average now: {}", loadavg());
        let (Some((mut empty_sample, _)), Some((mut coord_sample, delivery))) = (
            pooled.remove(&Target::Empty),
            pooled.remove(&Target::Respcoord),
        ) else {
            continue;
        };
        let (line, empty_p) = describe(Target::Empty, &mut empty_sample, true);
        println!("  pooled   {line}");
        let (line, coord_p) = describe(Target::Respcoord, &mut coord_sample, in_process);
        println!("  pooled   {line}");
        let ratio = |pick: fn(&Percentiles) -> u64| match (&empty_p, &coord_p) {
            (Some(e), Some(c)) => pick(c) as f64 / pick(e).max(1) as f64,
            _ => f64::NAN,
        };
        let pooled_throughput_ratio =
            coord_sample.throughput() / empty_sample.throughput().max(1e-9);
        let pooled_p99_ratio = ratio(|p| p.p99);
        println!(
            "  pooled ratio respcoord/empty: throughput {pooled_throughput_ratio:.3}x, p50 {:.3}x, p99 {pooled_p99_ratio:.3}x, p99.9 {:.3}x",
            ratio(|p| p.p50),
            ratio(|p| p.p999),
        );
        let server_cpu_ratio = in_process.then(|| {
            coord_sample.cpu_per_call(coord_sample.server_cpu)
                / empty_sample.cpu_per_call(empty_sample.server_cpu).max(1e-9)
        });
        if let Some(cpu) = server_cpu_ratio {
            let total = |s: &Sample| s.cpu_per_call(s.server_cpu + s.client_cpu);
            println!(
                "  cpu/call ratio respcoord/empty: server {cpu:.3}x; server+load generator {:.3}x \
                 (its inverse, {:.3}x, is the throughput ratio a CPU-bound run would show)",
                total(&coord_sample) / total(&empty_sample).max(1e-9),
                total(&empty_sample) / total(&coord_sample).max(1e-9),
            );
        }
        let throughput_ratio = median(&mut round_throughput_ratios);
        let p99_ratio = median(&mut round_p99_ratios);
        println!(
            "  MEDIAN over {} rounds, ratio respcoord/empty: throughput {throughput_ratio:.3}x, p99 {p99_ratio:.3}x",
            round_throughput_ratios.len()
        );
        let mut delivery = (workload == Workload::Watch).then_some(delivery);
        if let Some(delivery) = &mut delivery {
            print_delivery("  pooled ", delivery);
        }
        outcomes.insert(
            workload,
            Outcome {
                throughput_ratio,
                p99_ratio,
                pooled_throughput_ratio,
                pooled_p99_ratio,
                server_cpu_ratio,
                delivery,
            },
        );
    }
    empty.shut(&server_runtime);
    print_summary(&outcomes);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn workload_title(workload: Workload, args: &WireArgs) -> String {
    match workload {
        Workload::StartFinish => format!(
            "start-finish: Start then Finish, {} sessions, each worker on its own share",
            args.sessions
        ),
        Workload::BargeIn => format!(
            "barge-in: Start superseding on {} hot sessions shared by all workers, every {}th call a Cancel",
            args.hot_sessions, args.cancel_every
        ),
        Workload::GetState => format!("get-state: GetState over {} sessions", args.sessions),
        Workload::Watch => format!(
            "watch: start-finish load over {} sessions while {} session watchers (one per watched session) + 1 watch-all read",
            args.sessions, args.session_watchers
        ),
    }
}

fn print_delivery(indent: &str, delivery: &mut Delivery) {
    let mut all: Vec<u64> = delivery
        .session_latencies
        .iter()
        .chain(&delivery.all_latencies)
        .copied()
        .collect();
    let line = |values: &mut Vec<u64>| match percentiles(values) {
        Some(p) => format!(
            "p50 {}  p99 {}  p99.9 {}  max {}",
            ms(p.p50),
            ms(p.p99),
            ms(p.p999),
            ms(p.max)
        ),
        None => "no events in the window".into(),
    };
    println!(
        "{indent}delivery (event unix_nanos -> client receipt), all watchers: {}",
        line(&mut all)
    );
    println!(
        "{indent}  session watchers: {}  ({} events received)",
        line(&mut delivery.session_latencies),
        delivery.session_events
    );
    println!(
        "{indent}  watch-all:        {}  ({} events received)",
        line(&mut delivery.all_latencies),
        delivery.all_events
    );
    println!(
        "{indent}  streams opened {}, ended for lag (RESOURCE_EXHAUSTED) {}, ended otherwise {} (+{} OK){}",
        delivery.opened,
        delivery.ended_lagged,
        delivery.ended_other,
        delivery.ended_ok,
        delivery
            .first_end
            .as_deref()
            .map(|s| format!(", first end: {s}"))
            .unwrap_or_default()
    );
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn print_summary(outcomes: &HashMap<Workload, Outcome>) {
    let cpu = |o: &Outcome| {
        o.server_cpu_ratio
            .map(|r| format!("; server CPU/call {r:.2}x"))
            .unwrap_or_default()
    };
    println!();
    println!("Summary: median of per-round ratios (pooled over all rounds in parentheses).");
    println!("| target | goal | measured | verdict |");
    println!("|---|---|---|---|");
    if let Some(o) = outcomes.get(&Workload::StartFinish) {
        println!(
            "| Start/Finish over 10k sessions, throughput vs empty | >= 0.90x | {:.3}x (pooled {:.3}x{}) | {} |",
            o.throughput_ratio,
            o.pooled_throughput_ratio,
            cpu(o),
            verdict(o.throughput_ratio >= 0.90)
        );
        println!(
            "| Start/Finish over 10k sessions, p99 latency vs empty | <= 1.3x | {:.3}x (pooled {:.3}x) | {} |",
            o.p99_ratio,
            o.pooled_p99_ratio,
            verdict(o.p99_ratio <= 1.3)
        );
    }
    if let Some(o) = outcomes.get(&Workload::BargeIn) {
        println!(
            "| barge-in on 100 hot sessions, throughput vs empty | >= 0.85x | {:.3}x (pooled {:.3}x{}) | {} |",
            o.throughput_ratio,
            o.pooled_throughput_ratio,
            cpu(o),
            verdict(o.throughput_ratio >= 0.85)
        );
    }
    if let Some(o) = outcomes.get(&Workload::GetState) {
        println!(
            "| (no target) GetState over 10k sessions, throughput / p99 vs empty | - | {:.3}x / {:.3}x (pooled {:.3}x / {:.3}x{}) | - |",
            o.throughput_ratio,
            o.p99_ratio,
            o.pooled_throughput_ratio,
            o.pooled_p99_ratio,
            cpu(o)
        );
    }
    if let Some(
        o @ Outcome {
            delivery: Some(delivery),
            ..
        },
    ) = outcomes.get(&Workload::Watch)
    {
        let mut all: Vec<u64> = delivery
            .session_latencies
            .iter()
            .chain(&delivery.all_latencies)
            .copied()
            .collect();
        let p99 = percentiles(&mut all).map(|p| p.p99);
        let ok = p99.is_some_and(|p| p <= 5_000_000) && delivery.ended_lagged == 0;
        println!(
            "| Watch: session watchers + 1 watch-all under load, p99 delivery / ended for lag | <= 5 ms / 0 | {} / {} (load throughput {:.3}x empty{}) | {} |",
            p99.map_or("n/a".into(), ms),
            delivery.ended_lagged,
            o.throughput_ratio,
            cpu(o),
            verdict(ok)
        );
    }
}

// ----------------------------------------------------------------- memory --

/// Resident set size of this process, bytes (VmRSS).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kb = line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?;
                kb.trim().parse::<u64>().ok()
            })
        })
        .map_or(0, |kb| kb * 1024)
}

/// CPU time (user + system) of the whole process so far, from
/// /proc/self/stat (clock ticks of 1/100 s, Linux's USER_HZ).
fn process_cpu() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // Fields after the parenthesised command name; utime and stime
            // are fields 14 and 15 of the whole line.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Sum of every thread's on-CPU time in nanoseconds (schedstat), finer than
/// clock ticks; threads that exit between two reads drop out.
fn threads_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let nanos: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

fn uuid_like(i: usize) -> String {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        (i as u64).wrapping_mul(2_654_435_761) & 0xffff_ffff,
        i
    )
}

fn memory(args: MemoryArgs) -> ExitCode {
    let sessions = args.sessions.max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = RegistryConfig {
        max_sessions: sessions.max(RegistryConfig::default().max_sessions),
        shards: args.shards.unwrap_or(RegistryConfig::default().shards),
        ..RegistryConfig::default()
    };
    let registry = {
        let _entered = runtime.enter();
        Registry::new(config)
    };
    println!(
        "memory: {sessions} sessions, ids 36-byte UUID text, one Start + one Finish each \
         (2 events retained per session); registry config: default (shards {}, session history {}, global history {})",
        config.shards, config.session_history, config.global_history
    );
    println!(
        "  type sizes: Session {} B, LifecycleEvent {} B (+16 B Arc header each)",
        std::mem::size_of::<respcoord::session::Session>(),
        std::mem::size_of::<respcoord::events::LifecycleEvent>(),
    );
    let before = rss_bytes();
    let began = Instant::now();
    for i in 0..sessions {
        let id = SessionId::parse(&uuid_like(i)).expect("valid id");
        let started = match registry.start(&id, Source::Client, None) {
            Ok(started) => started,
            Err(error) => {
                eprintln!("error: start #{i}: {error}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(error) = registry.finish(&id, Some(started.response), FinishStatus::Completed) {
            eprintln!("error: finish #{i}: {error}");
            return ExitCode::FAILURE;
        }
    }
    let elapsed = began.elapsed();
    let after = rss_bytes();
    let grown = after.saturating_sub(before);
    let per_session = grown as f64 / sessions as f64;
    println!(
        "  populated in {:.2?} ({:.0} ns per Start+Finish pair, one thread)",
        elapsed,
        elapsed.as_nanos() as f64 / sessions as f64
    );
    println!(
        "  VmRSS before {:.1} MiB, after {:.1} MiB, growth {:.1} MiB",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        grown as f64 / 1048576.0
    );
    println!("  RSS per session: {per_session:.0} bytes");
    println!("  sessions held: {}", registry.session_count());

    let mut idle_line = None;
    if !args.idle.is_zero() {
        let running = start_respcoord(&runtime, registry.clone());
        // Let the server and the expirer settle before measuring.
        std::thread::sleep(Duration::from_secs(1));
        let cpu0 = process_cpu();
        let fine0 = threads_cpu();
        let wall0 = Instant::now();
        std::thread::sleep(args.idle);
        let wall = wall0.elapsed();
        let cpu = process_cpu().saturating_sub(cpu0);
        let fine = threads_cpu().saturating_sub(fine0);
        let percent = 100.0 * cpu.as_secs_f64() / wall.as_secs_f64();
        let fine_percent = 100.0 * fine.as_secs_f64() / wall.as_secs_f64();
        println!(
            "  idle: server on {} with {} sessions, no traffic, {:.1?}: process CPU {:?} = {percent:.3}% of one core \
             (per-thread schedstat: {:?} = {fine_percent:.3}%)",
            running.url,
            registry.session_count(),
            wall,
            cpu,
            fine
        );
        idle_line = Some(percent.max(fine_percent));
        running.shut(&runtime);
    }

    println!();
    println!("| target | goal | measured | verdict |");
    println!("|---|---|---|---|");
    println!(
        "| {sessions} sessions after one Start/Finish each, RSS per session | <= 350 B | {per_session:.0} B | {} |",
        verdict(per_session <= 350.0)
    );
    if let Some(percent) = idle_line {
        println!(
            "| {sessions} idle sessions, no traffic, CPU | < 2% of one core | {percent:.3}% | {} |",
            verdict(percent < 2.0)
        );
    }
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------- cluster --

#[derive(Debug, Clone, Args)]
struct ClusterArgs {
    /// NATS with JetStream (loopback).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Concurrent callers (tasks), each on its own sessions/keys.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Sessions (keys) per caller.
    #[arg(long, default_value_t = 8)]
    sessions_per_caller: usize,
    /// respcoord replicas serving the bucket (callers spread over them).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Measured time per side.
    #[arg(long, default_value = "3s", value_parser = duration)]
    duration: Duration,
    /// Buckets in NATS memory instead of on disk.
    #[arg(long)]
    memory_storage: bool,
}

/// Calls per second and latency samples of one side.
struct Side {
    calls: u64,
    window: Duration,
    latencies: Vec<u64>,
    errors: u64,
}

impl Side {
    fn print(&mut self, name: &str) -> (f64, u64) {
        let rate = self.calls as f64 / self.window.as_secs_f64().max(1e-9);
        let p = percentiles(&mut self.latencies);
        let (p50, p99) = p.as_ref().map_or((0, 0), |p| (p.p50, p.p99));
        println!(
            "{name:<22} {rate:>9.0} ops/s  p50 {}  p99 {}  errors {}",
            ms(p50),
            ms(p99),
            self.errors
        );
        (rate, p99)
    }
}

fn bench_bucket(label: &str) -> String {
    format!("bench_{label}_{}", unix_nanos() % 1_000_000_000_000)
}

/// Runs `op` in `concurrency` tasks for `duration`, timing each call.
async fn drive<F, Fut>(concurrency: usize, duration: Duration, op: F) -> Side
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let began = Instant::now();
    let deadline = began + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|lane| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0;
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let at = Instant::now();
                    if op(lane, n).await {
                        latencies.push(u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX));
                    } else {
                        errors += 1;
                    }
                    n += 1;
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut side = Side {
        calls: 0,
        window: Duration::ZERO,
        latencies: Vec::new(),
        errors: 0,
    };
    for task in tasks {
        if let Ok((latencies, errors)) = task.await {
            side.calls += latencies.len() as u64;
            side.latencies.extend(latencies);
            side.errors += errors;
        }
    }
    side.window = began.elapsed();
    side
}

fn cluster(args: ClusterArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cluster_run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cluster bench: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn cluster_run(args: ClusterArgs) -> Result<(), String> {
    use async_nats::jetstream::{self, stream::StorageType};
    use respcoord::nats::{NatsCoordinator, NatsSettings};

    println!(
        "cluster: {} callers x {} sessions each, {} replica(s), {:?} per side, {} storage",
        args.concurrency,
        args.sessions_per_caller,
        args.replicas,
        args.duration,
        if args.memory_storage {
            "memory"
        } else {
            "file"
        }
    );
    // Baseline: raw KV compare-and-set, each caller cycling over its keys
    // with the revision the previous write returned.
    let client = async_nats::connect(args.nats_url.as_str())
        .await
        .map_err(|e| format!("connect {}: {e}", args.nats_url))?;
    let js = jetstream::new(client);
    let raw_bucket = bench_bucket("raw");
    // The same stream layout the backend creates (src/nats.rs).
    js.create_stream(jetstream::stream::Config {
        name: format!("KV_{raw_bucket}"),
        subjects: vec![format!("$KV.{raw_bucket}.>")],
        max_messages_per_subject: 16,
        storage: if args.memory_storage {
            StorageType::Memory
        } else {
            StorageType::File
        },
        discard: jetstream::stream::DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("raw bucket: {e}"))?;
    let kv = js
        .get_key_value(raw_bucket.as_str())
        .await
        .map_err(|e| format!("raw bucket: {e}"))?;
    let value = bytes::Bytes::from(vec![7u8; 96]);
    let keys = args.concurrency * args.sessions_per_caller;
    let revisions: Arc<Vec<std::sync::atomic::AtomicU64>> = Arc::new(
        (0..keys)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect(),
    );
    let per = args.sessions_per_caller;
    let mut raw = {
        let kv = kv.clone();
        let revisions = Arc::clone(&revisions);
        drive(args.concurrency, args.duration, move |lane, n| {
            let kv = kv.clone();
            let value = value.clone();
            let revisions = Arc::clone(&revisions);
            async move {
                let slot = lane * per + (n as usize % per);
                let expected = revisions[slot].load(std::sync::atomic::Ordering::Relaxed);
                match kv.update(format!("k{slot}"), value, expected).await {
                    Ok(revision) => {
                        revisions[slot].store(revision, std::sync::atomic::Ordering::Relaxed);
                        true
                    }
                    Err(_) => false,
                }
            }
        })
        .await
    };
    let _ = js.delete_key_value(&raw_bucket).await;

    // respcoord on a bucket of its own: Start, then Finish, per session.
    let bucket = bench_bucket("coord");
    let settings = NatsSettings {
        url: args.nats_url.clone(),
        bucket: bucket.clone(),
        memory_storage: args.memory_storage,
        ..NatsSettings::default()
    };
    let mut urls = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..args.replicas.max(1) {
        let nats = NatsCoordinator::connect(&settings, RegistryConfig::default())
            .await
            .map_err(|e| e.to_string())?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let stop = CancellationToken::new();
        let config = ServerConfig {
            shutdown_grace: Duration::from_secs(2),
            ..ServerConfig::default()
        };
        tokio::spawn(server::serve_coordinator(
            nats.into(),
            config,
            listener,
            stop.clone().cancelled_owned(),
        ));
        urls.push(format!("http://{addr}"));
        stops.push(stop);
    }
    let mut clients = Vec::new();
    for lane in 0..args.concurrency {
        let url = &urls[lane % urls.len()];
        let channel = Endpoint::from_shared(url.clone())
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        clients.push(Client::new(channel));
    }
    let clients = Arc::new(clients);
    let active: Arc<Vec<std::sync::atomic::AtomicU64>> = Arc::new(
        (0..keys)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect(),
    );
    let mut coordinated = drive(args.concurrency, args.duration, move |lane, n| {
        let mut client = clients[lane].clone();
        let active = Arc::clone(&active);
        async move {
            let slot = lane * per + ((n / 2) as usize % per);
            let session_id = format!("bench-{slot}");
            let live = active[slot].load(std::sync::atomic::Ordering::Relaxed);
            if live == 0 {
                let request = pb::StartRequest {
                    session_id,
                    source: pb::Source::Client.into(),
                    request_id: String::new(),
                };
                match client.start(request).await {
                    Ok(reply) => {
                        let id = reply.into_inner().response_id;
                        active[slot].store(id, std::sync::atomic::Ordering::Relaxed);
                        true
                    }
                    Err(_) => false,
                }
            } else {
                active[slot].store(0, std::sync::atomic::Ordering::Relaxed);
                let request = pb::FinishRequest {
                    session_id,
                    response_id: live,
                    status: pb::TerminalStatus::Completed.into(),
                };
                client.finish(request).await.is_ok()
            }
        }
    })
    .await;
    for stop in stops {
        stop.cancel();
    }
    let _ = js.delete_key_value(&bucket).await;

    let (raw_rate, raw_p99) = raw.print("raw KV CAS");
    let (rate, p99) = coordinated.print("respcoord (nats) calls");
    println!(
        "ratio respcoord/raw: throughput {:.2}x, p99 {:.2}x",
        rate / raw_rate.max(1e-9),
        p99 as f64 / (raw_p99.max(1)) as f64
    );
    Ok(())
}
