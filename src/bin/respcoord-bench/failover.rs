//! `respcoord-bench failover`: what restarting a NATS node costs callers,
//! under load, on a three-node nats-server cluster the bench runs itself
//! (loopback, file storage, a config file per node) with two respcoord
//! replicas in-process on an R3 bucket.
//!
//! Gateways loop Start (with a request id: a retry is a replay) then Finish
//! on a few hot sessions, alternately on each replica. A failed attempt is
//! sent again after a fixed 50 ms, so a gap measured is the service's, not
//! a backoff's. Each attempt carries `--attempt-deadline` as `grpc-timeout`
//! (5 s: above one NATS request timeout plus the replica's own retry, so a
//! call the replica rescues by itself is one slow success; below its 10 s
//! patience, so a call stuck behind a whole election is cut and sent again,
//! as a gateway would). After the baseline the fault hits the stream leader
//! or a follower; the run ends `--settle` after the cluster recovered (the
//! node back, its `/healthz` ok, the stream led with both followers current).

use std::{
    collections::BTreeMap,
    future::Future,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    sync::{atomic::AtomicBool, atomic::Ordering::Relaxed, Arc, Mutex},
    time::{Duration, Instant},
};

use clap::{Args, ValueEnum};
use respcoord::{
    nats::{NatsCoordinator, NatsSettings, RETRY_REASONS},
    proto::v1 as pb,
    registry::CoordConfig,
    server::{self, ServerConfig},
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::{transport::Endpoint, Code};

use crate::{cluster::bench_bucket, duration, measure::percentiles, Client};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// Each fault below in turn, each on a fresh cluster.
    All,
    /// The stream leader put in lame duck (`--signal ldm`, as the NATS Helm
    /// chart's preStop hook does); it exits by itself, then starts again.
    LameDuckLeader,
    /// The stream leader SIGTERMed (graceful), then started again.
    SigtermLeader,
    /// Each node in turn SIGTERMed and started again, the next once the
    /// stream has all replicas current; the stream leader last.
    Rolling,
    /// The stream leader SIGKILLed, started again after `--kill-pause`.
    KillLeader,
    /// A node that is not the stream leader SIGTERMed, started again.
    RestartFollower,
}

#[derive(Debug, Clone, Args)]
pub struct FailoverArgs {
    #[arg(long, value_enum, default_value = "all")]
    fault: Fault,
    /// Runs of each fault, each on a fresh cluster.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// nats-server binary; default: the pinned newest (`scripts/nats-server.sh`).
    #[arg(long)]
    nats_server: Option<PathBuf>,
    /// Gateways (closed loops), alternately on replica A and B.
    #[arg(long, default_value_t = 16)]
    gateways: usize,
    /// Hot sessions; gateway g calls session g/2: one gateway per replica.
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Load before the fault, after a 1 s warm-up: the baseline.
    #[arg(long, default_value = "5s", value_parser = duration)]
    baseline: Duration,
    /// Load after the cluster recovered.
    #[arg(long, default_value = "5s", value_parser = duration)]
    settle: Duration,
    /// One attempt's deadline, also sent as `grpc-timeout` (module docs).
    #[arg(long, default_value = "5s", value_parser = duration)]
    attempt_deadline: Duration,
    /// A call not answered by then (all attempts) counts as failed.
    #[arg(long, default_value = "30s", value_parser = duration)]
    call_deadline: Duration,
    /// nats-server `lame_duck_duration` (it refuses less than 30 s).
    #[arg(long, default_value = "30s", value_parser = duration)]
    lame_duck: Duration,
    /// nats-server `lame_duck_grace_period`: no client is closed before it.
    #[arg(long, default_value = "10s", value_parser = duration)]
    lame_duck_grace: Duration,
    /// The replicas' `NatsSettings.request_timeout` (`--nats-timeout`),
    /// which also bounds a quorum point's wait for the mirror.
    #[arg(long, default_value = "2s", value_parser = duration)]
    nats_timeout: Duration,
    /// How long a SIGKILLed node stays down.
    #[arg(long, default_value = "1s", value_parser = duration)]
    kill_pause: Duration,
    /// Keep each run's directory (configs, nats-server logs, stores).
    #[arg(long)]
    keep: bool,
}

const WARM_UP: Duration = Duration::from_secs(1);
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Longest a node may take to exit, come back or catch up.
const RECOVERY_LIMIT: Duration = Duration::from_secs(90);
const HEADER: &str = "fault              calls ok  failed  gap A          gap B          \
                      base p99  after p50/p99/max  added   new leader  progress  target  failed attempts";
/// What a fault may add to the slowest call (beyond the election, for a crash).
const TARGET: Duration = Duration::from_secs(1);

pub fn failover(args: FailoverArgs) -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let Some(runtime) = crate::runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return ExitCode::FAILURE;
    };
    let binary = match args.nats_server.clone().map_or_else(pinned_nats_server, Ok) {
        Ok(binary) => binary,
        Err(error) => {
            eprintln!("failover bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let version = Command::new(&binary).arg("--version").output();
    let version = version.map_or_else(|e| e.to_string(), |o| text(&o.stdout));
    println!("failover: {version} ({}); {args:?}", binary.display());
    let faults = match args.fault {
        Fault::All => Fault::value_variants()[1..].to_vec(),
        fault => vec![fault],
    };
    let mut rows = Vec::new();
    for _ in 0..args.rounds.max(1) {
        for &fault in &faults {
            let row = runtime.block_on(run(&args, &binary, fault));
            let row = row.unwrap_or_else(|error| format!("{:<18} failed: {error}", name(fault)));
            println!("{HEADER}\n{row}\n");
            rows.push(row);
        }
    }
    println!("{HEADER}\n{}", rows.join("\n"));
    ExitCode::SUCCESS
}

fn name(fault: Fault) -> String {
    fault
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().into())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

fn pinned_nats_server() -> Result<PathBuf, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/nats-server.sh");
    let output = Command::new(script).stderr(Stdio::inherit()).output();
    match output.map_err(|e| format!("{script}: {e}"))? {
        out if out.status.success() => Ok(text(&out.stdout).into()),
        out => Err(format!("{script} failed: {}", out.status)),
    }
}

// ---- the cluster ----

struct Node {
    name: String,
    port: u16,
    monitor: u16,
    /// `-c config -m port`: to start it again on the same store and ports.
    args: [String; 4],
    child: Option<Child>,
}

/// Three nats-server processes, killed on drop; their directory is then
/// removed unless kept.
struct Cluster {
    binary: PathBuf,
    dir: PathBuf,
    nodes: Vec<Node>,
    keep: bool,
}

impl Cluster {
    fn start(binary: &Path, args: &FailoverArgs) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(bench_bucket("respcoord-failover"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let held = (0..9).map(|_| std::net::TcpListener::bind("127.0.0.1:0"));
        let held: Vec<_> = held.collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        let ports: Vec<u16> = held
            .iter()
            .filter_map(|l| Some(l.local_addr().ok()?.port()))
            .collect();
        drop(held);
        let (binary, keep) = (binary.to_owned(), args.keep);
        let mut cluster = Cluster {
            binary,
            dir,
            nodes: Vec::new(),
            keep,
        };
        for i in 0..3 {
            let name = format!("node{}", i + 1);
            let at = |file: &str| cluster.dir.join(file).display().to_string();
            let routes = (0..3).filter(|&j| j != i);
            let routes: Vec<_> = routes
                .map(|j| format!("\"nats://127.0.0.1:{}\"", ports[3 + j]))
                .collect();
            let config = format!(
                "server_name: {name}\nhost: 127.0.0.1\nport: {}\nlog_file: \"{}\"\n\
                 jetstream {{ store_dir: \"{}\" }}\n\
                 cluster {{ name: failover, listen: \"127.0.0.1:{}\", routes: [{}] }}\n\
                 lame_duck_duration: \"{}ms\"\nlame_duck_grace_period: \"{}ms\"\n",
                ports[i],
                at(&format!("{name}.log")),
                at(&name),
                ports[3 + i],
                routes.join(", "),
                args.lame_duck.as_millis(),
                args.lame_duck_grace.as_millis(),
            );
            let config_file = at(&format!("{name}.conf"));
            std::fs::write(&config_file, config).map_err(|e| format!("{config_file}: {e}"))?;
            let (port, monitor) = (ports[i], ports[6 + i]);
            let args = ["-c".into(), config_file, "-m".into(), monitor.to_string()];
            cluster.nodes.push(Node {
                name,
                port,
                monitor,
                args,
                child: None,
            });
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, node: usize) -> Result<(), String> {
        let mut command = Command::new(&self.binary);
        command
            .args(&self.nodes[node].args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.nodes[node].child = Some(command.spawn().map_err(|e| e.to_string())?);
        Ok(())
    }

    /// `ldm` (lame duck) or `term` through `nats-server --signal`; `kill`: SIGKILL.
    fn signal(&mut self, node: usize, what: &str) -> Result<(), String> {
        let child = self.nodes[node]
            .child
            .as_mut()
            .ok_or("the node is not running")?;
        if what == "kill" {
            return child.kill().map_err(|e| e.to_string());
        }
        let signal = format!("{what}={}", child.id());
        match Command::new(&self.binary)
            .args(["--signal", &signal])
            .status()
        {
            Ok(status) if status.success() => Ok(()),
            other => Err(format!("--signal {signal}: {other:?}")),
        }
    }

    /// Waits until the node's process has exited, and reaps it.
    async fn exited(&mut self, node: usize) -> Result<(), String> {
        let deadline = Instant::now() + RECOVERY_LIMIT;
        while let Some(child) = self.nodes[node].child.as_mut() {
            if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                self.nodes[node].child = None;
            } else if Instant::now() > deadline {
                return Err(format!("{} did not exit", self.nodes[node].name));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().filter_map(|n| n.child.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.keep {
            println!("  kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A GET on a node's monitoring port: its status and whole response.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        Some((response.split_whitespace().nth(1)?.parse().ok()?, response))
    };
    tokio::time::timeout(Duration::from_secs(1), get)
        .await
        .ok()
        .flatten()
}

// ---- the stream leader, seen through every node ----

#[derive(Clone)]
struct Sample {
    at: Instant,
    leader: Option<String>,
    /// Followers the leader reports current.
    current: usize,
    /// When the leader was elected (its `leader_since`), Unix nanoseconds.
    since: Option<i128>,
}

/// The stream's info asked through each node every 100 ms (a client per
/// node, so a node that is down does not blind it); every answer is kept.
struct Probe {
    samples: Arc<Mutex<Vec<Sample>>>,
    _stop: tokio_util::sync::DropGuard,
}

impl Probe {
    async fn start(urls: &[String], stream: &str) -> Result<Self, String> {
        let (samples, stop): (Arc<Mutex<Vec<Sample>>>, _) =
            (Arc::default(), tokio_util::sync::CancellationToken::new());
        for url in urls {
            let options =
                async_nats::ConnectOptions::new().request_timeout(Some(Duration::from_millis(500)));
            let client = options
                .connect(url.as_str())
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let (js, stream) = (async_nats::jetstream::new(client), stream.to_owned());
            let (samples, stop) = (Arc::clone(&samples), stop.clone());
            tokio::spawn(stop.run_until_cancelled_owned(async move {
                loop {
                    let info = js.get_stream(&stream).await.ok();
                    if let Some(cluster) = info.and_then(|s| s.cached_info().cluster.clone()) {
                        let current = cluster.replicas.iter().filter(|p| p.current).count();
                        let since = cluster.leader_since.map(|t| t.unix_timestamp_nanos());
                        let (at, leader) =
                            (Instant::now(), cluster.leader.filter(|l| !l.is_empty()));
                        let mut samples = samples.lock().unwrap_or_else(|e| e.into_inner());
                        samples.push(Sample {
                            at,
                            leader,
                            current,
                            since,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        Ok(Self {
            samples,
            _stop: stop.drop_guard(),
        })
    }

    /// The first sample taken from `after` on that satisfies `ready`.
    fn first(&self, after: Instant, ready: impl Fn(&Sample) -> bool) -> Option<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .filter(|s| s.at >= after)
            .find(|s| ready(s))
            .cloned()
    }

    /// The first sample from now on with a leader and both followers current.
    async fn settled(&self) -> Result<Sample, String> {
        let after = Instant::now();
        loop {
            if let Some(sample) = self.first(after, |s| s.leader.is_some() && s.current == 2) {
                return Ok(sample);
            }
            if after.elapsed() > RECOVERY_LIMIT {
                return Err(format!(
                    "the stream did not settle within {RECOVERY_LIMIT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// ---- faults ----

/// Injects a fault, noting what happened when.
struct Injector<'a> {
    cluster: &'a mut Cluster,
    probe: &'a Probe,
    kill_pause: Duration,
    marks: Vec<(String, Instant)>,
    /// When the stream leader was hit (Unix nanoseconds).
    leader_hit: Option<i128>,
}

impl Injector<'_> {
    async fn leader(&self) -> Result<usize, String> {
        let leader = self.probe.settled().await?.leader;
        let nodes = &self.cluster.nodes;
        nodes
            .iter()
            .position(|n| Some(&n.name) == leader.as_ref())
            .ok_or(format!("leader {leader:?}?"))
    }

    fn mark(&mut self, what: String) -> Instant {
        self.marks.push((what, Instant::now()));
        Instant::now()
    }

    async fn inject(&mut self, fault: Fault) -> Result<(), String> {
        let leader = self.leader().await?;
        match fault {
            Fault::LameDuckLeader => self.restart(leader, "ldm").await,
            Fault::SigtermLeader => self.restart(leader, "term").await,
            Fault::KillLeader => self.restart(leader, "kill").await,
            Fault::RestartFollower => self.restart((leader + 1) % 3, "term").await,
            Fault::Rolling => {
                let mut left = vec![0, 1, 2];
                while !left.is_empty() {
                    // The leader last (it may move while the others roll).
                    let leader = self.leader().await?;
                    let node = left.remove(left.iter().position(|&n| n != leader).unwrap_or(0));
                    self.restart(node, "term").await?;
                }
                Ok(())
            }
            Fault::All => Err("`all` runs fault by fault".into()),
        }
    }

    /// Stops `node` as `how` says (`ldm`, `term`, `kill`), starts it again
    /// on its store and ports, and waits until it reports healthy and the
    /// stream has a leader with both followers current.
    async fn restart(&mut self, node: usize, how: &str) -> Result<(), String> {
        let name = self.cluster.nodes[node].name.clone();
        let leader = self.leader().await? == node;
        self.mark(format!(
            "{how} {name}{}",
            if leader { " (leader)" } else { "" }
        ));
        if leader {
            self.leader_hit = Some(i128::from(crate::measure::unix_nanos()));
        }
        self.cluster.signal(node, how)?;
        self.cluster.exited(node).await?;
        self.mark(format!("{name} exited"));
        if how == "kill" {
            tokio::time::sleep(self.kill_pause).await;
        }
        self.cluster.spawn(node)?;
        let started = self.mark(format!("{name} started"));
        let monitor = self.cluster.nodes[node].monitor;
        while !matches!(http_get(monitor, "/healthz").await, Some((200, _))) {
            if started.elapsed() > RECOVERY_LIMIT {
                return Err(format!("{name} not healthy after {RECOVERY_LIMIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.mark(format!("{name} healthy"));
        let settled = self.probe.settled().await?;
        self.marks.push(("stream current".into(), settled.at));
        Ok(())
    }
}

// ---- gateways ----

/// One attempt of a call; the call's last attempt stands for the call.
struct Attempt {
    gateway: usize,
    what: &'static str,
    call_began: Instant,
    sent: Instant,
    answered: Instant,
    /// A failed attempt's gRPC code and message, or `deadline` (the
    /// client's own).
    failed: Option<String>,
    last: bool,
}

impl Attempt {
    fn replica(&self) -> usize {
        self.gateway % 2
    }
}

/// Sends one call until answered, refused for good, or `call_deadline`
/// has passed, recording every attempt.
async fn call<T, F, Fut>(
    log: &mut Vec<Attempt>,
    gateway: usize,
    what: &'static str,
    args: &FailoverArgs,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut(tonic::Request<()>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let call_began = Instant::now();
    loop {
        let sent = Instant::now();
        let mut deadline = tonic::Request::new(());
        deadline.set_timeout(args.attempt_deadline);
        let limit = args.attempt_deadline + Duration::from_millis(250);
        let (reply, failed, retry) = match tokio::time::timeout(limit, attempt(deadline)).await {
            Ok(Ok(reply)) => (Some(reply.into_inner()), None, false),
            Ok(Err(status)) => {
                use Code::*;
                let retry = matches!(
                    status.code(),
                    Unavailable | DeadlineExceeded | Aborted | Cancelled | Unknown | Internal
                );
                (
                    None,
                    Some(format!("{:?}: {}", status.code(), status.message())),
                    retry,
                )
            }
            Err(_) => (None, Some("deadline".to_owned()), true),
        };
        let last = !retry || call_began.elapsed() >= args.call_deadline;
        let answered = Instant::now();
        log.push(Attempt {
            gateway,
            what,
            call_began,
            sent,
            answered,
            failed,
            last,
        });
        if last {
            return reply;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// `message` with the deadline `template` carries.
fn with_deadline<T>(template: tonic::Request<()>, message: T) -> tonic::Request<T> {
    let (metadata, extensions, ()) = template.into_parts();
    tonic::Request::from_parts(metadata, extensions, message)
}

async fn gateway(
    g: usize,
    endpoint: String,
    session_id: String,
    stop: Arc<AtomicBool>,
    args: FailoverArgs,
) -> Result<Vec<Attempt>, String> {
    let endpoint = Endpoint::from_shared(endpoint).map_err(|e| e.to_string())?;
    let client = Client::new(endpoint.connect().await.map_err(|e| e.to_string())?);
    let mut log = Vec::new();
    for n in 0.. {
        if stop.load(Relaxed) {
            break;
        }
        let (source, request_id) = (pb::Source::Client.into(), format!("g{g}-{n}"));
        let start = pb::StartRequest {
            session_id: session_id.clone(),
            source,
            request_id,
        };
        let started = call(&mut log, g, "Start", &args, |deadline| {
            let (mut client, request) = (client.clone(), with_deadline(deadline, start.clone()));
            async move { client.start(request).await }
        });
        let Some(started) = started.await else {
            continue;
        };
        let (response_id, status) = (started.response_id, pb::TerminalStatus::Completed.into());
        let finish = pb::FinishRequest {
            session_id: session_id.clone(),
            response_id,
            status,
        };
        let finished = call(&mut log, g, "Finish", &args, |deadline| {
            let (mut client, request) = (client.clone(), with_deadline(deadline, finish.clone()));
            async move { client.finish(request).await }
        });
        finished.await;
    }
    Ok(log)
}

// ---- one run ----

async fn run(args: &FailoverArgs, binary: &Path, fault: Fault) -> Result<String, String> {
    let mut cluster = Cluster::start(binary, args)?;
    let (bucket, url) = (bench_bucket("failover"), cluster.urls().join(","));
    let settings = NatsSettings {
        url,
        bucket: bucket.clone(),
        replicas: 3,
        request_timeout: args.nats_timeout,
        ..Default::default()
    };
    let replicas = connect_replicas(&settings).await?;
    let probe = Probe::start(&cluster.urls(), &format!("KV_{bucket}")).await?;
    probe.settled().await?;
    let serving = tokio_util::sync::CancellationToken::new();
    let endpoints = serve_replicas(&replicas, &serving).await?;
    let connections = respcoord_connections(&cluster).await;

    let stop = Arc::new(AtomicBool::new(false));
    let loops = spawn_gateways(args, &endpoints, &stop);
    let measured_from = Instant::now() + WARM_UP;
    tokio::time::sleep(WARM_UP + args.baseline).await;
    let before: Vec<_> = replicas.iter().map(NatsCoordinator::nats_stats).collect();
    let (fault_at, fault_unix) = (Instant::now(), crate::measure::unix_nanos());
    let (cluster, probe) = (&mut cluster, &probe);
    let mut injector = Injector {
        cluster,
        probe,
        kill_pause: args.kill_pause,
        marks: Vec::new(),
        leader_hit: None,
    };
    let injected = injector.inject(fault).await;
    let (marks, leader_hit) = (injector.marks, injector.leader_hit);
    if injected.is_ok() {
        tokio::time::sleep(args.settle).await;
    }
    stop.store(true, Relaxed);
    let mut attempts = Vec::new();
    for task in loops {
        attempts.extend(task.await.map_err(|e| e.to_string())??);
    }
    let ended = Instant::now();
    serving.cancel();
    injected?;

    // The first leader elected after the hit (it may be the same node,
    // restarted), by the time nats-server says it was elected.
    let new_leader = leader_hit.and_then(|hit| {
        let elected = probe.first(fault_at, |s| s.since.is_some_and(|since| since > hit));
        let nanos = elected?.since? - hit;
        Some(Duration::from_nanos(u64::try_from(nanos).ok()?))
    });
    let recovered = marks.last().map_or(ended, |(_, at)| *at);
    let report = Report {
        attempts,
        measured_from,
        fault_at,
        recovered,
        ended,
    };
    let day_ms = (fault_unix / 1_000_000) % 86_400_000;
    let (h, m, s) = (day_ms / 3_600_000, day_ms / 60_000 % 60, day_ms % 60_000);
    let marks: Vec<_> = marks
        .iter()
        .map(|(what, t)| format!("{:+.2} {what}", report.after(*t)))
        .collect();
    println!(
        "  {}, fault at {h:02}:{m:02}:{:06.3} UTC: {}",
        name(fault),
        s as f64 / 1e3,
        marks.join(", ")
    );
    println!("  the replicas' NATS connections per node before the fault: {connections:?}");
    print_replica_counters(&replicas, &before);
    println!("  {}", report.details());
    Ok(report.row(fault, new_leader, args.gateways))
}

/// The gateways, each calling one replica on its hot session until `stop`.
fn spawn_gateways(
    args: &FailoverArgs,
    endpoints: &[String],
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Result<Vec<Attempt>, String>>> {
    (0..args.gateways)
        .map(|g| {
            let (endpoint, session) = (
                endpoints[g % 2].clone(),
                format!("hot-{}", (g / 2) % args.sessions.max(1)),
            );
            tokio::spawn(gateway(
                g,
                endpoint,
                session,
                Arc::clone(stop),
                args.clone(),
            ))
        })
        .collect()
}

/// The two replicas the gateways call, once the cluster takes them (30 s
/// at most).
async fn connect_replicas(settings: &NatsSettings) -> Result<Vec<NatsCoordinator>, String> {
    let (mut replicas, ready_by) = (Vec::new(), Instant::now() + Duration::from_secs(30));
    while replicas.len() < 2 {
        match NatsCoordinator::connect(settings, CoordConfig::default()).await {
            Ok(replica) => replicas.push(replica),
            Err(error) if Instant::now() > ready_by => return Err(format!("no cluster: {error}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    Ok(replicas)
}

/// Serves each replica on a port of its own until `serving` is cancelled:
/// their endpoints.
async fn serve_replicas(
    replicas: &[NatsCoordinator],
    serving: &tokio_util::sync::CancellationToken,
) -> Result<Vec<String>, String> {
    let mut endpoints = Vec::new();
    for replica in replicas {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        endpoints.push(format!(
            "http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        ));
        let config = ServerConfig {
            shutdown_grace: Duration::from_secs(1),
            ..Default::default()
        };
        let stop = serving.clone().cancelled_owned();
        tokio::spawn(server::serve_coordinator(
            replica.clone().into(),
            config,
            listener,
            stop,
        ));
    }
    Ok(endpoints)
}

/// The replicas' NATS connections on each node, by its monitoring port.
async fn respcoord_connections(cluster: &Cluster) -> Vec<usize> {
    let mut connections = Vec::new();
    for node in &cluster.nodes {
        let body = http_get(node.monitor, "/connz?limit=1024")
            .await
            .unwrap_or_default()
            .1;
        let body: String = body.split_whitespace().collect();
        connections.push(body.matches("\"name\":\"respcoord\"").count());
    }
    connections
}

/// What each replica's NATS counters moved by since `before`.
fn print_replica_counters(replicas: &[NatsCoordinator], before: &[respcoord::nats::NatsCounts]) {
    for (i, replica) in replicas.iter().enumerate() {
        let (b, a) = (&before[i], replica.nats_stats());
        let retries = (0..RETRY_REASONS.len()).map(|r| {
            format!(
                "{} {}",
                RETRY_REASONS[r],
                a.store_retries[r] - b.store_retries[r]
            )
        });
        println!(
            "  replica {}: store retries [{}], reconnects {}, lame duck notices {}, follower restarts {}",
            ["A", "B"][i],
            retries.collect::<Vec<_>>().join(", "),
            a.reconnects - b.reconnects,
            a.lame_duck_events - b.lame_duck_events,
            a.follower_restarts - b.follower_restarts,
        );
    }
}

// ---- the report ----

/// The gRPC code of a failed attempt's `code: message`.
fn code(failed: &str) -> &str {
    failed.split(':').next().unwrap_or(failed)
}

struct Report {
    attempts: Vec<Attempt>,
    /// The end of the warm-up.
    measured_from: Instant,
    /// The fault's first signal.
    fault_at: Instant,
    /// When the cluster had recovered from the fault's last step.
    recovered: Instant,
    ended: Instant,
}

impl Report {
    /// Seconds from the fault's first signal to `at`, signed.
    fn after(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.fault_at) {
            Some(after) => after.as_secs_f64(),
            None => -(self.fault_at - at).as_secs_f64(),
        }
    }

    /// The longest time `replica` answered no attempt, from the warm-up's
    /// end to the run's, and when it began.
    fn gap(&self, replica: usize) -> String {
        let ok = self
            .attempts
            .iter()
            .filter(|a| a.replica() == replica && a.failed.is_none());
        let mut times: Vec<Instant> = ok
            .map(|a| a.answered)
            .filter(|&t| t >= self.measured_from)
            .collect();
        times.extend([self.measured_from, self.ended]);
        times.sort_unstable();
        let gaps = times.windows(2).map(|w| (w[1] - w[0], w[0]));
        let (gap, from) = gaps.max().unwrap_or((Duration::ZERO, self.fault_at));
        format!("{:.2} s @{:+.1}", gap.as_secs_f64(), self.after(from))
    }

    /// Calls answered, with their latency (first attempt sent to answer).
    fn answered(&self, keep: impl Fn(&Attempt) -> bool) -> Vec<u64> {
        let calls = self
            .attempts
            .iter()
            .filter(|a| a.last && a.failed.is_none() && keep(a));
        calls
            .map(|a| u64::try_from((a.answered - a.call_began).as_nanos()).unwrap_or(u64::MAX))
            .collect()
    }

    /// Failed attempts by the second after the fault they were sent in, and
    /// the slowest call of each kind answered after the fault.
    fn details(&self) -> String {
        let (mut by, mut messages) = (BTreeMap::new(), BTreeMap::<_, usize>::new());
        for a in &self.attempts {
            if let Some(failed) = &a.failed {
                *by.entry((self.after(a.sent).floor() as i64, a.what, code(failed)))
                    .or_insert(0usize) += 1;
                // Session ids (quoted) left out, so alike failures count together.
                let parts = failed.split('"').enumerate();
                let message: String = parts
                    .map(|(i, p)| if i % 2 == 1 { "…" } else { p })
                    .collect();
                *messages.entry(message).or_insert(0) += 1;
            }
        }
        let messages = messages.iter().map(|(m, n)| format!("{n} x {m:?}"));
        let failed = by
            .iter()
            .map(|((s, what, code), n)| format!("{s:+} {what} {code} {n}"));
        let slowest = ["Start", "Finish"].map(|what| {
            let after = self.answered(|a| a.what == what && a.answered >= self.fault_at);
            format!("{what} {} ms", after.iter().max().unwrap_or(&0) / 1_000_000)
        });
        let failed: Vec<_> = failed.collect();
        format!(
            "failed attempts by second sent: [{}]; slowest after the fault: {}; why: [{}]; \
             the slowest call's attempts: {}",
            failed.join(", "),
            slowest.join(", "),
            messages.collect::<Vec<_>>().join(", "),
            self.slowest_call(),
        )
    }

    /// The slowest call answered after the fault, attempt by attempt: which
    /// replica, when it was sent (seconds from the fault), how long it took
    /// and how it failed; what a gap or an `added` is made of.
    fn slowest_call(&self) -> String {
        let answered = self
            .attempts
            .iter()
            .filter(|a| a.last && a.failed.is_none() && a.answered >= self.fault_at);
        let Some(slowest) = answered.max_by_key(|a| a.answered - a.call_began) else {
            return "none".into();
        };
        let of_call = self
            .attempts
            .iter()
            .filter(|a| a.gateway == slowest.gateway && a.call_began == slowest.call_began);
        let attempts: Vec<_> = of_call
            .map(|a| {
                format!(
                    "{} {} {:+.3} s, {} ms{}",
                    ["A", "B"][a.replica()],
                    a.what,
                    self.after(a.sent),
                    (a.answered - a.sent).as_millis(),
                    a.failed
                        .as_deref()
                        .map_or_else(String::new, |f| format!(", {}", code(f))),
                )
            })
            .collect();
        format!("gateway {}: [{}]", slowest.gateway, attempts.join("; "))
    }

    /// The table's row. `base p99`: calls begun after the warm-up and
    /// answered before the fault; `after`: calls answered from the fault
    /// on; `added`: the slowest of those minus the baseline p99; `progress`:
    /// gateways with a call begun after the cluster recovered and answered;
    /// `target`: the (see `met`); `failed attempts`: sent from the
    /// fault on, by code, and how many failed in the baseline.
    fn row(&self, fault: Fault, new_leader: Option<Duration>, gateways: usize) -> String {
        let calls = self.attempts.iter().filter(|a| a.last);
        let (ok, failed) = calls.fold((0, 0), |(ok, failed), a| match a.failed {
            None => (ok + 1, failed),
            Some(_) => (ok, failed + 1),
        });
        let mut base =
            self.answered(|a| a.call_began >= self.measured_from && a.answered < self.fault_at);
        let mut after = self.answered(|a| a.answered >= self.fault_at);
        let base_p99 = percentiles(&mut base).map_or(0, |p| p.p99);
        let (p50, p99, max) = percentiles(&mut after).map_or((0, 0, 0), |p| (p.p50, p.p99, p.max));
        let progressed = (0..gateways).filter(|&g| {
            let mut calls = self.attempts.iter().filter(|a| a.gateway == g && a.last);
            calls.any(|a| a.failed.is_none() && a.call_began >= self.recovered)
        });
        let mut codes: BTreeMap<&str, usize> = BTreeMap::new();
        for a in self.attempts.iter().filter(|a| a.sent >= self.fault_at) {
            if let Some(failed) = &a.failed {
                *codes.entry(code(failed)).or_default() += 1;
            }
        }
        let mut listed: Vec<_> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
        let baseline = self.attempts.iter().filter(|a| {
            a.failed.is_some() && a.sent >= self.measured_from && a.sent < self.fault_at
        });
        listed.push(format!("baseline {}", baseline.count()));
        let ms = |nanos: u64| nanos / 1_000_000;
        let added = Duration::from_nanos(max.saturating_sub(base_p99));
        // A planned restart: no call failed, at most 1 s added; a crash: at
        // most the new leader's election plus 1 s added.
        let met = match (fault, new_leader) {
            (Fault::KillLeader, elected) => elected.is_some_and(|e| added <= e + TARGET),
            _ => failed == 0 && added <= TARGET,
        };
        format!(
            "{:<18} {ok:>8}  {failed:>6}  {:<13}  {:<13}  {:>5} ms  {:>5}/{}/{} ms  {:>5.2} s  {:>10}  {:>5}/{:<3} {:<6}  {} ({})",
            name(fault),
            self.gap(0),
            self.gap(1),
            ms(base_p99),
            ms(p50),
            ms(p99),
            ms(max),
            added.as_secs_f64(),
            new_leader.map_or_else(|| "-".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            progressed.count(),
            gateways,
            crate::measure::verdict(met),
            codes.values().sum::<usize>(),
            listed.join(", "),
        )
    }
}
