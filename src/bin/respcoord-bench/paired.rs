//! `respcoord-bench paired`: respcoord and the empty server loaded at the
//! same time, as separate processes pinned to the same CPUs, each driven by
//! its own h2load (nghttp2's load generator, replaying one pre-encoded gRPC
//! request) pinned to other CPUs; the ratio of their throughputs in each
//! round is the figure.
//!
//! Why not the in-process `wire` load: a tonic client costs about as much
//! CPU per call as the server it drives, so with the servers on one core
//! and the clients on the other, the clients are the bottleneck and both
//! servers read the same. h2load is C, costs a fraction of that per call,
//! and sends the same bytes to both servers, so the servers are the
//! bottleneck. Both run at once on the same core, so whatever else the
//! machine does in a round, both get it: the steadiest ratio on shared
//! machines. h2load counts HTTP status only, not gRPC status, so each
//! request is sent once through a real client first and must succeed, and
//! the Start run checks afterwards that every Start counted was applied.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use clap::{Args, ValueEnum};
use prost::Message;
use respcoord::proto::v1 as pb;
use tonic::transport::Endpoint;

use crate::{
    duration,
    measure::{loadavg, median, process_cpu_of},
    Client,
};

#[derive(Debug, Clone, Args)]
pub struct PairedArgs {
    /// The h2load to drive with (Debian: `apt-get install nghttp2-client`).
    #[arg(long, default_value = "h2load")]
    h2load: PathBuf,
    /// The respcoord binary to measure (default: the one beside this one).
    #[arg(long)]
    respcoord_bin: Option<PathBuf>,
    /// CPUs both servers are pinned to (a `taskset -c` list).
    #[arg(long, default_value = "0")]
    server_cpus: String,
    /// CPUs both h2loads are pinned to.
    #[arg(long, default_value = "1")]
    driver_cpus: String,
    /// Connections per server.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Calls in flight per connection.
    #[arg(long, default_value_t = 32)]
    streams: usize,
    /// Unmeasured load before each measurement.
    #[arg(long, default_value = "1s", value_parser = duration)]
    warmup: Duration,
    /// Measured time per workload and round.
    #[arg(long, default_value = "3s", value_parser = duration)]
    duration: Duration,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Workloads, comma separated; all on one hot session.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "get-state,start,cancel"
    )]
    workloads: Vec<PairedWorkload>,
    /// respcoord's log filter (`respcoord serve --log`).
    #[arg(long, default_value = "info")]
    log: String,
}

/// One call, the same bytes every time, on the hot session.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum PairedWorkload {
    GetState,
    /// Each Start supersedes the one before.
    Start,
    /// Nothing is live after the first, so each answers "nothing cancelled".
    Cancel,
}

const HOT_SESSION: &str = "paired-hot";

impl PairedWorkload {
    fn method(self) -> &'static str {
        match self {
            PairedWorkload::GetState => "GetState",
            PairedWorkload::Start => "Start",
            PairedWorkload::Cancel => "Cancel",
        }
    }

    /// The one request this workload sends, to h2load and to the check alike.
    fn request(self) -> Request {
        let session_id = HOT_SESSION.to_owned();
        match self {
            PairedWorkload::GetState => Request::GetState(pb::GetStateRequest { session_id }),
            PairedWorkload::Start => Request::Start(pb::StartRequest {
                session_id,
                source: pb::Source::Vad.into(),
                request_id: String::new(),
            }),
            PairedWorkload::Cancel => Request::Cancel(pb::CancelRequest {
                session_id,
                source: pb::Source::Client.into(),
                if_response_id: 0,
            }),
        }
    }

    /// The request as gRPC puts it on the wire: uncompressed flag, length,
    /// message.
    fn frame(self) -> Vec<u8> {
        let message = match self.request() {
            Request::GetState(request) => request.encode_to_vec(),
            Request::Start(request) => request.encode_to_vec(),
            Request::Cancel(request) => request.encode_to_vec(),
        };
        let length = u32::try_from(message.len()).unwrap_or(u32::MAX);
        let mut frame = Vec::with_capacity(5 + message.len());
        frame.push(0);
        frame.extend_from_slice(&length.to_be_bytes());
        frame.extend_from_slice(&message);
        frame
    }

    /// Sends the request once through a real client: it must succeed.
    async fn call_once(self, client: &mut Client) -> Result<(), tonic::Status> {
        match self.request() {
            Request::GetState(request) => client.get_state(request).await.map(drop),
            Request::Start(request) => client.start(request).await.map(drop),
            Request::Cancel(request) => client.cancel(request).await.map(drop),
        }
    }
}

enum Request {
    GetState(pb::GetStateRequest),
    Start(pb::StartRequest),
    Cancel(pb::CancelRequest),
}

/// A server process, killed when dropped.
struct Server {
    name: &'static str,
    child: Child,
    port: u16,
}

impl Server {
    fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one h2load run reported.
#[derive(Debug, Default, Clone, Copy)]
struct Driven {
    per_second: f64,
    succeeded: u64,
    failed: u64,
}

pub fn paired(args: PairedArgs) -> ExitCode {
    let Some(runtime) = crate::runtime(tokio::runtime::Builder::new_current_thread()) else {
        return ExitCode::FAILURE;
    };
    match run(&args, &runtime) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("paired: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &PairedArgs, runtime: &tokio::runtime::Runtime) -> Result<(), String> {
    let version = Command::new(&args.h2load)
        .arg("--version")
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} ({e}); on Debian: apt-get install nghttp2-client",
                args.h2load.display()
            )
        })?;
    let own = std::env::current_exe().map_err(|e| e.to_string())?;
    let respcoord_bin = match &args.respcoord_bin {
        Some(path) => path.clone(),
        None => own.with_file_name("respcoord"),
    };
    if !respcoord_bin.is_file() {
        return Err(format!(
            "no respcoord at {} (cargo build --release --bin respcoord, or --respcoord-bin)",
            respcoord_bin.display()
        ));
    }
    println!(
        "paired: {} against respcoord ({}) and the empty server, both pinned to CPUs {}, drivers on {}; {} connections x {} streams each, {:?} warm-up + {:?} per round",
        String::from_utf8_lossy(&version.stdout).trim(),
        respcoord_bin.display(),
        args.server_cpus,
        args.driver_cpus,
        args.connections,
        args.streams,
        args.warmup,
        args.duration,
    );
    let respcoord = spawn_pinned("respcoord", &args.server_cpus, &respcoord_bin, |listen| {
        vec![
            "serve".into(),
            "--listen".into(),
            listen,
            "--log".into(),
            args.log.clone(),
        ]
    })?;
    let empty = spawn_pinned("empty", &args.server_cpus, &own, |listen| {
        vec!["empty-server".into(), "--listen".into(), listen]
    })?;
    let mut clients = Vec::new();
    for server in [&respcoord, &empty] {
        clients.push(runtime.block_on(connect(server))?);
    }
    // The hot session exists before any workload (GetState and Cancel need it).
    runtime
        .block_on(PairedWorkload::Start.call_once(&mut clients[0]))
        .map_err(|status| format!("respcoord: first Start: {status}"))?;
    let scratch =
        std::env::temp_dir().join(format!("respcoord-bench-paired-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let result = workloads(args, runtime, &respcoord, &empty, &mut clients, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn workloads(
    args: &PairedArgs,
    runtime: &tokio::runtime::Runtime,
    respcoord: &Server,
    empty: &Server,
    clients: &mut [Client],
    scratch: &Path,
) -> Result<(), String> {
    let mut summary = Vec::new();
    for &workload in &args.workloads {
        for (server, client) in [respcoord, empty].into_iter().zip(clients.iter_mut()) {
            runtime
                .block_on(workload.call_once(client))
                .map_err(|status| format!("{}: {}: {status}", server.name, workload.method()))?;
        }
        let data = scratch.join(format!("{}.bin", workload.method()));
        std::fs::write(&data, workload.frame()).map_err(|e| format!("{}: {e}", data.display()))?;
        println!("\n{} on one hot session", workload.method());
        let (mut ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
        for round in 0..args.rounds.max(1) {
            let started_before = runtime.block_on(responses_started(&mut clients[0]))?;
            let began = Instant::now();
            let drivers =
                [respcoord, empty].map(|server| drive(args, server.port, workload, &data));
            let drivers: Vec<Child> = drivers.into_iter().collect::<Result<_, _>>()?;
            // CPU from the end of the warm-up, as h2load counts.
            std::thread::sleep(args.warmup);
            let cpu_before = [
                process_cpu_of(&respcoord.pid()),
                process_cpu_of(&empty.pid()),
            ];
            let mut outputs = Vec::new();
            for driver in drivers {
                let output = driver.wait_with_output().map_err(|e| e.to_string())?;
                outputs.push(parse(&String::from_utf8_lossy(&output.stdout))?);
            }
            let cpu_after = [
                process_cpu_of(&respcoord.pid()),
                process_cpu_of(&empty.pid()),
            ];
            let (coord, base) = (outputs[0], outputs[1]);
            let applied = match workload {
                PairedWorkload::Start => Some(
                    runtime
                        .block_on(responses_started(&mut clients[0]))?
                        .saturating_sub(started_before),
                ),
                _ => None,
            };
            check_round(round, applied, coord, base)?;
            let cpu_per_call = |index: usize, driven: Driven| {
                let cpu = cpu_after[index].saturating_sub(cpu_before[index]);
                cpu.as_secs_f64() * 1e6 / driven.succeeded.max(1) as f64
            };
            let (coord_cpu, base_cpu) = (cpu_per_call(0, coord), cpu_per_call(1, base));
            let ratio = coord.per_second / base.per_second.max(1e-9);
            ratios.push(ratio);
            cpu_ratios.push(coord_cpu / base_cpu.max(1e-9));
            println!(
                "  round {round}  respcoord {:>8.0}/s ({coord_cpu:.1} us CPU/call)  empty {:>8.0}/s ({base_cpu:.1} us)  ratio {ratio:.3}x  ({:.1} s, load {})",
                coord.per_second,
                base.per_second,
                began.elapsed().as_secs_f64(),
                loadavg()
            );
        }
        let ratio = median(&mut ratios);
        let cpu = median(&mut cpu_ratios);
        println!(
            "  MEDIAN over {} rounds: throughput respcoord/empty {ratio:.3}x, server CPU per call {cpu:.3}x",
            ratios.len()
        );
        summary.push((workload, ratio, cpu));
    }
    println!("\nworkload     throughput ratio  server CPU/call ratio");
    for (workload, ratio, cpu) in summary {
        println!("{:<12} {ratio:>15.3}x  {cpu:>20.3}x", workload.method());
    }
    Ok(())
}

/// Refuses a round whose figures cannot be trusted: fewer Starts applied
/// (`applied`, for the Start workload) than h2load counted as succeeded, or
/// failed requests.
fn check_round(
    round: impl std::fmt::Display,
    applied: Option<u64>,
    coord: Driven,
    base: Driven,
) -> Result<(), String> {
    // h2load counted only the measured part; the warm-up's Starts come on
    // top.
    if let Some(applied) = applied.filter(|&applied| applied < coord.succeeded) {
        return Err(format!(
            "h2load counted {} Starts as succeeded, respcoord applied {applied}",
            coord.succeeded,
        ));
    }
    if coord.failed > 0 || base.failed > 0 {
        return Err(format!(
            "round {round}: failed requests: respcoord {}, empty {}",
            coord.failed, base.failed
        ));
    }
    Ok(())
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| e.to_string())
}

/// Starts `bin` pinned to `cpus` on a free loopback port; `args` gets the
/// address to listen on.
fn spawn_pinned(
    name: &'static str,
    cpus: &str,
    bin: &Path,
    args: impl FnOnce(String) -> Vec<String>,
) -> Result<Server, String> {
    let port = free_port()?;
    let child = Command::new("taskset")
        .args(["-c", cpus])
        .arg(bin)
        .args(args(format!("127.0.0.1:{port}")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{name}: {e} (is taskset, from util-linux, installed?)"))?;
    Ok(Server { name, child, port })
}

async fn connect(server: &Server) -> Result<Client, String> {
    let url = format!("http://127.0.0.1:{}", server.port);
    let endpoint = Endpoint::from_shared(url.clone()).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match endpoint.connect().await {
            Ok(channel) => return Ok(Client::new(channel)),
            Err(error) if Instant::now() > deadline => {
                return Err(format!("{} at {url} did not serve: {error}", server.name))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn responses_started(client: &mut Client) -> Result<u64, String> {
    let reply = client
        .get_state(pb::GetStateRequest {
            session_id: HOT_SESSION.to_owned(),
        })
        .await
        .map_err(|status| format!("respcoord: GetState: {status}"))?;
    Ok(reply
        .into_inner()
        .state
        .map_or(0, |state| state.responses_started))
}

fn drive(
    args: &PairedArgs,
    port: u16,
    workload: PairedWorkload,
    data: &Path,
) -> Result<Child, String> {
    let millis = |d: Duration| format!("{}ms", d.as_millis().max(1));
    Command::new("taskset")
        .args(["-c", &args.driver_cpus])
        .arg(&args.h2load)
        .args(["-c", &args.connections.max(1).to_string()])
        .args(["-m", &args.streams.max(1).to_string()])
        .args(["-D", &millis(args.duration)])
        .args(["--warm-up-time", &millis(args.warmup)])
        .arg("-d")
        .arg(data)
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg(format!(
            "http://127.0.0.1:{port}/respcoord.v1.ResponseCoordinator/{}",
            workload.method()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("h2load: {e}"))
}

/// Reads h2load's summary: "finished in 3.00s, 29512.33 req/s, ..." and
/// "requests: N total, N started, N done, N succeeded, N failed, ...".
fn parse(report: &str) -> Result<Driven, String> {
    let mut driven = Driven::default();
    let mut seen = (false, false);
    for line in report.lines() {
        if let Some(rest) = line.strip_prefix("finished in ") {
            let rate = rest
                .split(", ")
                .find_map(|part| part.strip_suffix(" req/s"))
                .and_then(|rate| rate.parse().ok());
            driven.per_second = rate.ok_or_else(|| format!("h2load printed {line:?}"))?;
            seen.0 = true;
        } else if let Some(rest) = line.strip_prefix("requests: ") {
            for part in rest.split(", ") {
                let (count, what) = part.split_once(' ').unwrap_or((part, ""));
                let count: u64 = count
                    .parse()
                    .map_err(|_| format!("h2load printed {line:?}"))?;
                match what {
                    "succeeded" => driven.succeeded = count,
                    "failed" | "errored" | "timeout" => driven.failed += count,
                    _ => {}
                }
            }
            seen.1 = true;
        }
    }
    match seen {
        (true, true) => Ok(driven),
        _ => Err(format!("h2load's report lacks its summary:\n{report}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2load_summary_is_read() {
        let report = "\
finished in 3.00s, 29512.33 req/s, 2.06MB/s
requests: 88537 total, 88569 started, 88537 done, 88530 succeeded, 7 failed, 0 errored, 0 timeout
status codes: 88530 2xx, 0 3xx, 0 4xx, 7 5xx
";
        let driven = parse(report).expect("parsed");
        assert_eq!(driven.succeeded, 88_530);
        assert_eq!(driven.failed, 7);
        assert!((driven.per_second - 29_512.33).abs() < 1e-6);
        assert!(parse("finished in 3.00s, 1 req/s\n").is_err());
    }

    #[test]
    fn a_frame_is_flag_length_message() {
        let frame = PairedWorkload::GetState.frame();
        let message = pb::GetStateRequest {
            session_id: HOT_SESSION.to_owned(),
        }
        .encode_to_vec();
        assert_eq!(frame[0], 0);
        assert_eq!(&frame[1..5], &(message.len() as u32).to_be_bytes());
        assert_eq!(&frame[5..], &message[..]);
    }
}
