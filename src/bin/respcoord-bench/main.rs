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
//!   got back, no read) on the same NATS server, same concurrency, in one run:
//!   alone, with a follower reading every write, and behind the same gRPC
//!   transport (the floor: a tonic server whose Start and Finish are each one
//!   such compare-and-set); prints each and the ratios.
//!
//! - `respcoord-bench failover`: a three-node nats-server cluster of its own
//!   under load through two replicas, one node restarted (lame duck,
//!   SIGTERM, rolling, SIGKILL); failed attempts, gaps, added latency and
//!   the time to a new stream leader (docs/cluster.md).
//!
//! - `respcoord-bench gateways`: idle gateway processes of any client
//!   language, each holding one live response, while other sessions carry
//!   traffic at several rates: the gateways' CPU and the coordinator's.
//!
//! - `respcoord-bench paired`: respcoord and the empty server as processes
//!   pinned to the same CPUs, loaded at the same time by h2load replaying
//!   one pre-encoded request each; the ratio of their throughputs.
//!
//! Only loopback is ever targeted: the in-process servers listen on
//! 127.0.0.1, and `--endpoint` must resolve to loopback addresses. Every run
//! is bounded by `--warmup` + `--duration` per workload and server.
//!
//! One file per command (`wire`, `memory`, `cluster`, `failover`,
//! `gateways`, `paired`; a larger one has a directory of its own parts:
//! `failover/` holds the nats-server cluster and its faults, the gateways'
//! load and the report; `cluster/` the floor's server), `servers` for the in-process servers (the empty
//! ceiling and respcoord), `measure` for the machine and process probes
//! (CPU, RSS, load) and the statistics.

mod cluster;
mod failover;
mod gateways;
mod measure;
mod memory;
mod paired;
mod servers;
mod wire;

/// See `mimalloc` in Cargo.toml: the binaries use mimalloc, the library
/// leaves the choice to whoever links it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::{process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use respcoord::proto::v1::response_coordinator_client::ResponseCoordinatorClient;
use tonic::transport::Channel;

use crate::{
    cluster::ClusterArgs, failover::FailoverArgs, gateways::GatewaysArgs, memory::MemoryArgs,
    paired::PairedArgs, wire::WireArgs,
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
    /// A NATS node's restart (lame duck, SIGTERM, rolling, SIGKILL) under
    /// load on a three-node cluster the bench runs: what callers lose.
    Failover(FailoverArgs),
    /// respcoord and the empty server pinned to the same CPUs, loaded at
    /// once by h2load (nghttp2-client), in one run.
    Paired(PairedArgs),
    /// Idle gateway processes (any client language) against the rest of the
    /// deployment's traffic: their CPU and the coordinator's.
    Gateways(GatewaysArgs),
    /// The empty server alone, for `paired` (which starts it).
    #[command(hide = true)]
    EmptyServer {
        #[arg(long)]
        listen: std::net::SocketAddr,
    },
}

fn duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    measure::print_machine();
    match cli.command {
        Command::Wire(args) => wire::wire(args),
        Command::Memory(args) => memory::memory(args),
        Command::Cluster(args) => cluster::cluster(args),
        Command::Failover(args) => failover::failover(args),
        Command::Paired(args) => paired::paired(args),
        Command::Gateways(args) => gateways::gateways(args),
        Command::EmptyServer { listen } => empty_server(listen),
    }
}

/// Serves the empty server at `listen` until killed; its runtime has as
/// many workers as the CPUs it may run on (`paired` pins it).
fn empty_server(listen: std::net::SocketAddr) -> ExitCode {
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(async {
        match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => {
                servers::serve_empty(listener, std::future::pending()).await;
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("empty server: {listen}: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

/// A command's runtime, or `None` having said why there is none.
fn runtime(mut builder: tokio::runtime::Builder) -> Option<tokio::runtime::Runtime> {
    builder
        .enable_all()
        .build()
        .map_err(|error| eprintln!("runtime: {error}"))
        .ok()
}
