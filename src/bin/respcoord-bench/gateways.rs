//! `respcoord-bench gateways`: what an idle gateway pays for the rest of
//! the deployment's traffic, and what the coordinator pays per gateway.
//!
//! G gateway processes (any client language: `--gateway-cmd`) each hold one
//! live response on a session of their own and do nothing else, while this
//! command drives Start/Finish pairs on `--other-sessions` other sessions at
//! each of `--rates` events per second (a pair is two events: `started`,
//! `ended`). Per rate it prints the events per second achieved, each
//! gateway's CPU (median and max, % of one core) and, with `--server-pid`,
//! the coordinator's. A gateway whose cost follows its own sessions stays
//! flat across the rates; one that watches every session grows with them.
//!
//! The gateway command is run through `sh -c 'exec ...'` with `{endpoint}`
//! and `{session}` replaced; it must print a line `ready` once its response
//! is live, and exit when its standard input closes. The clients' probes:
//! `cargo run --release -p respcoord-client --example idle_gateway`,
//! `clients/python/examples/idle_gateway.py`,
//! `clients/typescript/examples/idle-gateway.mjs`.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, ExitCode, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use clap::Args;

use crate::{
    measure::{median, threads_cpu_of},
    wire::load::{connect, finish_request, start_request},
    Client,
};
use respcoord::proto::v1 as pb;

#[derive(Debug, Args)]
pub struct GatewaysArgs {
    /// The coordinator (http://127.0.0.1:PORT): loopback only.
    #[arg(long)]
    endpoint: String,
    /// Its pid, to report its CPU too.
    #[arg(long)]
    server_pid: Option<u32>,
    /// The gateway process, with {endpoint} and {session} placeholders.
    #[arg(long)]
    gateway_cmd: String,
    /// Gateway processes, each holding one live response.
    #[arg(long, default_value_t = 1)]
    gateways: usize,
    /// Events per second of the other sessions' traffic, one window each.
    #[arg(long, value_delimiter = ',', default_value = "0,800,8000")]
    rates: Vec<u64>,
    /// Sessions the traffic runs on (none of them a gateway's).
    #[arg(long, default_value_t = 1000)]
    other_sessions: usize,
    /// Connections the traffic is driven over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Untimed traffic before each window.
    #[arg(long, default_value = "2s", value_parser = crate::duration)]
    warmup: Duration,
    /// Each measured window.
    #[arg(long, default_value = "10s", value_parser = crate::duration)]
    window: Duration,
}

/// A gateway process, killed when dropped.
struct Gateway {
    child: Child,
    pid: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_gateway(template: &str, endpoint: &str, session: &str) -> Result<Gateway, String> {
    let command = template
        .replace("{endpoint}", endpoint)
        .replace("{session}", session);
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("exec {command}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{command}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("{command}: {e}"))?;
    if line.trim() != "ready" {
        return Err(format!("{command}: printed {line:?}, not `ready`"));
    }
    let pid = child.id().to_string();
    Ok(Gateway { child, pid })
}

pub fn gateways(args: GatewaysArgs) -> ExitCode {
    let Some(runtime) = crate::runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return ExitCode::FAILURE;
    };
    if let Err(error) = runtime.block_on(crate::wire::check_loopback(&args.endpoint)) {
        eprintln!("{error}");
        return ExitCode::from(2);
    }
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gateways: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: GatewaysArgs) -> Result<(), String> {
    let tag = format!("{:x}", crate::measure::unix_nanos());
    let mut gateways = Vec::with_capacity(args.gateways);
    for g in 0..args.gateways {
        let session = format!("bench-gw-{tag}-{g}");
        gateways.push(spawn_gateway(&args.gateway_cmd, &args.endpoint, &session)?);
    }
    let clients: Vec<Client> = connect(&args.endpoint, args.connections)
        .await?
        .into_iter()
        .map(Client::new)
        .collect();
    println!(
        "gateways: {} x `{}`, each holding one live response; traffic on {} other sessions",
        args.gateways, args.gateway_cmd, args.other_sessions
    );
    println!("| other sessions' events/s (asked) | achieved | gateway CPU, median | max | coordinator CPU |");
    println!("|---|---|---|---|---|");
    let sessions: Arc<Vec<String>> = Arc::new(
        (0..args.other_sessions)
            .map(|i| format!("bench-traffic-{tag}-{i}"))
            .collect(),
    );
    for &rate in &args.rates {
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(AtomicU64::new(0));
        let traffic = drive(&clients, &sessions, rate, &stop, &events);
        tokio::time::sleep(args.warmup).await;
        let cpu = |pid: &str| threads_cpu_of(pid);
        let before: Vec<Duration> = gateways.iter().map(|g| cpu(&g.pid)).collect();
        let server = args.server_pid.map(|pid| pid.to_string());
        let server_before = server.as_deref().map(cpu);
        let counted = events.load(Ordering::Acquire);
        let began = Instant::now();
        tokio::time::sleep(args.window).await;
        let elapsed = began.elapsed().as_secs_f64();
        let achieved = (events.load(Ordering::Acquire) - counted) as f64 / elapsed;
        let mut shares: Vec<f64> = gateways
            .iter()
            .zip(&before)
            .map(|(g, b)| percent(cpu(&g.pid).saturating_sub(*b), elapsed))
            .collect();
        let server_share = server
            .as_deref()
            .zip(server_before)
            .map(|(pid, b)| format!("{:.1} %", percent(cpu(pid).saturating_sub(b), elapsed)));
        stop.store(true, Ordering::Release);
        for task in traffic {
            task.await.map_err(|e| e.to_string())??;
        }
        let max = shares.iter().copied().fold(0.0, f64::max);
        println!(
            "| {rate} | {achieved:.0} | {:.2} % | {max:.2} % | {} |",
            median(&mut shares),
            server_share.unwrap_or_else(|| "-".into())
        );
        for gateway in &mut gateways {
            if let Ok(Some(status)) = gateway.child.try_wait() {
                return Err(format!("a gateway exited during the run: {status}"));
            }
        }
    }
    Ok(())
}

fn percent(cpu: Duration, seconds: f64) -> f64 {
    cpu.as_secs_f64() / seconds * 100.0
}

type Traffic = tokio::task::JoinHandle<Result<(), String>>;

/// Start/Finish pairs round-robin over `sessions`, paced to `rate` events
/// per second (two per pair) across one lane per client.
fn drive(
    clients: &[Client],
    sessions: &Arc<Vec<String>>,
    rate: u64,
    stop: &Arc<AtomicBool>,
    events: &Arc<AtomicU64>,
) -> Vec<Traffic> {
    if rate == 0 {
        return Vec::new();
    }
    let lanes = clients.len().max(1);
    let pairs_per_lane = (rate as f64 / 2.0 / lanes as f64).max(0.001);
    let gap = Duration::from_secs_f64(1.0 / pairs_per_lane);
    clients
        .iter()
        .enumerate()
        .map(|(lane, client)| {
            let (mut client, sessions) = (client.clone(), Arc::clone(sessions));
            let (stop, events) = (Arc::clone(stop), Arc::clone(events));
            tokio::spawn(async move {
                let mut next = tokio::time::Instant::now();
                let mut i = lane;
                while !stop.load(Ordering::Acquire) {
                    next += gap;
                    tokio::time::sleep_until(next).await;
                    let session = &sessions[i % sessions.len()];
                    i += lanes;
                    let started = client
                        .start(start_request(session, pb::Source::Client))
                        .await
                        .map_err(|s| format!("start {session}: {s}"))?
                        .into_inner();
                    client
                        .finish(finish_request(session, started.response_id))
                        .await
                        .map_err(|s| format!("finish {session}: {s}"))?;
                    events.fetch_add(2, Ordering::AcqRel);
                }
                Ok(())
            })
        })
        .collect()
}
