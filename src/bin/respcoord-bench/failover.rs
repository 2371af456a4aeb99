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

mod gateways;
mod nodes;
mod report;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    sync::{atomic::AtomicBool, atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant},
};

use clap::{Args, ValueEnum};
use respcoord::{
    nats::{NatsCoordinator, NatsSettings, RETRY_REASONS},
    registry::CoordConfig,
    server::{self, ServerConfig},
};

use self::{
    gateways::{gateway, Attempt},
    nodes::{respcoord_connections, Cluster, Injector, Probe},
    report::Report,
};
use crate::{cluster::bench_bucket, duration};

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
const HEADER: &str = "fault              calls ok  failed  gap A          gap B          \
                      base p99  after p50/p99/max  added   new leader  progress  target  failed attempts";

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
