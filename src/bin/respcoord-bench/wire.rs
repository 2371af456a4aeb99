//! `respcoord-bench wire`: the workloads over the real gRPC wire, against
//! respcoord and the empty server (and, for barge-in, a Redis + Lua
//! baseline) in the same run, rounds alternating which goes first; the load
//! itself is in `load`, the baseline in `redis`, the printed report in
//! `report`.

pub mod load;
mod redis;
mod report;

use std::{collections::HashMap, net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use clap::{Args, ValueEnum};
use respcoord::registry::{CoordConfig, Registry};

use self::{
    load::{run, session_names, Delivery, Plan, Sample},
    report::{describe, print_delivery, print_summary, workload_title},
};
use crate::{
    duration,
    measure::{loadavg, median, Percentiles, CLIENT_THREADS, SERVER_THREADS},
    servers::{start_empty, start_respcoord},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Workload {
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
pub struct WireArgs {
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
    /// The --endpoint server's process id, for the watch workload's memory
    /// report (its RSS before and after the watches open). An in-process
    /// server is measured as this whole process, load generator included.
    #[arg(long)]
    server_pid: Option<u32>,
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
    /// The Redis the `redis` target (barge-in only: M3 Start as a Lua
    /// script) calls; skipped, saying so, where none answers.
    #[arg(long, default_value = "127.0.0.1:6379")]
    redis: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, ValueEnum)]
pub enum Target {
    Empty,
    Respcoord,
    /// The do-it-yourself baseline: Redis + Lua (`redis`), barge-in only.
    Redis,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Empty => "empty",
            Target::Respcoord => "respcoord",
            Target::Redis => "redis",
        }
    }
}

/// One target's load of a round, on whatever it speaks.
async fn run_target(
    target: Target,
    url: String,
    plan: Arc<Plan>,
    args: WireArgs,
) -> Result<load::RunResult, String> {
    match target {
        Target::Redis => {
            let workers = args.connections.max(1) * args.in_flight.max(1);
            let load = redis::run(url, plan, workers).await?;
            Ok(load::RunResult {
                load,
                delivery: None,
            })
        }
        Target::Empty | Target::Respcoord => run(url, plan, args).await,
    }
}

/// One workload's result on both servers.
pub struct Outcome {
    /// Median over rounds of the paired ratios (each round runs both
    /// servers back to back), robust to a burst of other work on the machine.
    throughput_ratio: f64,
    p99_ratio: f64,
    /// Pooled over all rounds.
    pooled_throughput_ratio: f64,
    pooled_p99_ratio: f64,
    /// Server CPU per call, respcoord/empty (in-process runs only).
    server_cpu_ratio: Option<f64>,
    /// The empty server's own call p99 under the same load, pooled: what the
    /// stack's queueing alone gives one hop through it.
    empty_p99: Option<u64>,
    delivery: Option<Delivery>,
}

/// The subscriber `respcoord serve` installs (human log lines on stderr,
/// no OTLP export), so the in-process server pays what production pays.
pub fn install_telemetry(filter: &str) -> Result<(), String> {
    respcoord::telemetry::init(
        respcoord::telemetry::LogFormat::Human,
        filter,
        respcoord::telemetry::OtlpSignals::default(),
    )
    .map(|_telemetry| ())
    .map_err(|e| format!("--log {filter}: {e}"))
}

/// Refuses anything but loopback: load is only ever sent to this machine.
pub async fn check_loopback(url: &str) -> Result<(), String> {
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

pub fn wire(args: WireArgs) -> ExitCode {
    if let Err(error) = install_telemetry(&args.log) {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server_runtime =
        runtime(args.server_threads.unwrap_or(cores), SERVER_THREADS).expect("server runtime");
    let client_runtime =
        runtime(args.client_threads.unwrap_or(cores), CLIENT_THREADS).expect("client runtime");
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
    let servers = servers_to_run(&args, &client_runtime);
    let empty = start_empty(&server_runtime);
    let runs = Runs {
        args: &args,
        servers,
        server_runtime: &server_runtime,
        client_runtime: &client_runtime,
        empty_url: empty.url.clone(),
        prefix: format!("bench-{}", std::process::id()),
        in_process: args.endpoint.is_none(),
    };
    let mut outcomes: HashMap<Workload, Outcome> = HashMap::new();
    let mut failed = false;
    for &workload in &args.workloads {
        let (outcome, workload_failed) = runs.workload(workload);
        failed |= workload_failed;
        if let Some(outcome) = outcome {
            outcomes.insert(workload, outcome);
        }
    }
    empty.shut(&server_runtime);
    print_summary(&outcomes);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn runtime(threads: usize, name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(name)
        .enable_all()
        .build()
}

/// The servers asked for, without the redis baseline when it is not there.
fn servers_to_run(args: &WireArgs, client_runtime: &tokio::runtime::Runtime) -> Vec<Target> {
    let mut servers = args.servers.clone();
    if servers.contains(&Target::Redis) {
        if let Err(why) = client_runtime.block_on(redis::available(&args.redis)) {
            println!("redis + lua baseline: skipped: {why}");
            servers.retain(|&target| target != Target::Redis);
        } else if !args.workloads.contains(&Workload::BargeIn) {
            println!("redis + lua baseline: runs in barge-in only (M3 Start as a script)");
        }
    }
    servers
}

/// What every workload's runs share.
struct Runs<'a> {
    args: &'a WireArgs,
    servers: Vec<Target>,
    server_runtime: &'a tokio::runtime::Runtime,
    client_runtime: &'a tokio::runtime::Runtime,
    empty_url: String,
    prefix: String,
    in_process: bool,
}

/// Each round's figures: throughput (calls/s) and p99 per target.
type RoundFigures = HashMap<Target, (f64, Option<u64>)>;

/// The per-round ratios over a workload's rounds.
#[derive(Default)]
struct RoundRatios {
    throughput: Vec<f64>,
    p99: Vec<f64>,
    /// respcoord's and the empty server's throughput over redis's.
    redis: Vec<(f64, f64)>,
}

impl Runs<'_> {
    /// Every round of `workload` on every server, and what they compare to:
    /// the outcome (when both servers ran), and whether a run failed.
    fn workload(&self, workload: Workload) -> (Option<Outcome>, bool) {
        println!();
        println!("== {}", workload_title(workload, self.args));
        let mut pooled: HashMap<Target, (Sample, Delivery)> = HashMap::new();
        let mut ratios = RoundRatios::default();
        let mut failed = false;
        for round in 0..self.args.rounds.max(1) {
            let this_round = self.round(workload, round, &mut pooled, &mut failed);
            ratios.record(round, &this_round);
        }
        println!("  load average now: {}", loadavg());
        ratios.print_redis_median();
        (self.pooled_outcome(workload, pooled, ratios), failed)
    }

    /// One round: each server in turn (in reverse every other round), its
    /// samples pooled.
    fn round(
        &self,
        workload: Workload,
        round: usize,
        pooled: &mut HashMap<Target, (Sample, Delivery)>,
        failed: &mut bool,
    ) -> RoundFigures {
        let mut order = vec![Target::Empty, Target::Respcoord, Target::Redis];
        if round % 2 == 1 {
            order.reverse();
        }
        order.retain(|target| self.servers.contains(target));
        if workload != Workload::BargeIn {
            order.retain(|&target| target != Target::Redis);
        }
        let in_process = self.in_process;
        let mut this_round: RoundFigures = HashMap::new();
        for target in order {
            match self.run_once(workload, round, target) {
                Ok(mut result) => {
                    // Redis runs in its own process.
                    let server_in_process =
                        target == Target::Empty || (target == Target::Respcoord && in_process);
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
                    *failed = true;
                }
            }
        }
        this_round
    }

    /// One server's load of one round; a fresh in-process respcoord is up
    /// only while its own load runs.
    fn run_once(
        &self,
        workload: Workload,
        round: usize,
        target: Target,
    ) -> Result<load::RunResult, String> {
        let args = self.args;
        let tag = format!("{}-r{round}-{}", self.prefix, target.name());
        let plan = Arc::new(Plan {
            workload,
            sessions: session_names(&tag, "s", args.sessions.max(1)),
            hot: session_names(&tag, "hot", args.hot_sessions.max(1)),
            cancel_every: args.cancel_every,
            warmup: args.warmup,
            duration: args.duration,
        });
        let local = match (target, &args.endpoint) {
            (Target::Respcoord, None) => Some(start_respcoord(
                self.server_runtime,
                Registry::new(CoordConfig::default()),
                // Room for every watch the run opens.
                args.session_watchers + 1,
            )),
            _ => None,
        };
        let url = match (target, &local, &args.endpoint) {
            (Target::Empty, _, _) => self.empty_url.clone(),
            (Target::Redis, _, _) => args.redis.clone(),
            (_, Some(local), _) => local.url.clone(),
            (_, None, Some(endpoint)) => endpoint.clone(),
            (_, None, None) => unreachable!("respcoord is local or an endpoint"),
        };
        let result = self
            .client_runtime
            .block_on(run_target(target, url, plan, args.clone()));
        if let Some(local) = local {
            local.shut(self.server_runtime);
        }
        result
    }

    /// The pooled figures of both servers over every round, and the
    /// workload's outcome; `None` unless both ran.
    fn pooled_outcome(
        &self,
        workload: Workload,
        mut pooled: HashMap<Target, (Sample, Delivery)>,
        ratios: RoundRatios,
    ) -> Option<Outcome> {
        let in_process = self.in_process;
        let RoundRatios {
            throughput: mut round_throughput_ratios,
            p99: mut round_p99_ratios,
            ..
        } = ratios;
        let (Some((mut empty_sample, _)), Some((mut coord_sample, delivery))) = (
            pooled.remove(&Target::Empty),
            pooled.remove(&Target::Respcoord),
        ) else {
            return None;
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
        Some(Outcome {
            throughput_ratio,
            p99_ratio,
            pooled_throughput_ratio,
            pooled_p99_ratio,
            server_cpu_ratio,
            empty_p99: empty_p.as_ref().map(|p| p.p99),
            delivery,
        })
    }
}

impl RoundRatios {
    /// Prints and keeps one round's ratios.
    fn record(&mut self, round: usize, this_round: &RoundFigures) {
        let (round_redis_ratios, round_throughput_ratios, round_p99_ratios) =
            (&mut self.redis, &mut self.throughput, &mut self.p99);
        if let Some((redis, _)) = this_round.get(&Target::Redis) {
            let over = |target: Target| this_round.get(&target).map(|(t, _)| t / redis.max(1e-9));
            if let (Some(coord), Some(empty)) = (over(Target::Respcoord), over(Target::Empty)) {
                round_redis_ratios.push((coord, empty));
                println!(
                        "  round {round}  throughput over redis: respcoord {coord:.3}x, empty {empty:.3}x (the protocol's bound)"
                    );
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

    /// The median of the rounds' ratios over redis, when it ran.
    fn print_redis_median(&self) {
        let round_redis_ratios = &self.redis;
        if !round_redis_ratios.is_empty() {
            let mut coord: Vec<f64> = round_redis_ratios.iter().map(|r| r.0).collect();
            let mut empty: Vec<f64> = round_redis_ratios.iter().map(|r| r.1).collect();
            println!(
                "  MEDIAN over {} rounds, throughput over redis + lua: respcoord {:.3}x, empty server {:.3}x (the protocol's bound)",
                round_redis_ratios.len(),
                median(&mut coord),
                median(&mut empty)
            );
        }
    }
}
