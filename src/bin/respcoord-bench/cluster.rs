//! `respcoord-bench cluster`: the NATS backend's Start/Finish over gRPC
//! against raw JetStream KV compare-and-set on the same server, same
//! concurrency, in one run: alone, with a follower reading every write, and
//! behind the same gRPC transport (`floor`); then GetState (a linearizable
//! read: one shared quorum point, docs/cluster.md) against a raw KV read of
//! the stream leader (which a deposed leader can serve stale).

mod floor;

use std::{
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Args;
use respcoord::{
    proto::v1 as pb,
    registry::CoordConfig,
    server::{self, ServerConfig},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use crate::{
    duration,
    measure::{ms, percentiles, unix_nanos},
    Client,
};

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
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
    /// JetStream replicas of both buckets (3 on a three-node cluster, as in
    /// production; `--nats-url` then lists the nodes).
    #[arg(long, default_value_t = 1)]
    nats_replicas: usize,
}

pub fn cluster(args: ClusterArgs) -> ExitCode {
    let Some(runtime) = crate::runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(cluster_run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cluster bench: {error}");
            ExitCode::FAILURE
        }
    }
}

pub async fn cluster_run(args: ClusterArgs) -> Result<(), String> {
    use async_nats::jetstream;
    use respcoord::nats::NatsSettings;

    println!(
        "cluster: {} callers x {} sessions each, {} replica(s), {:?} per side, {} storage, R{}",
        args.concurrency,
        args.sessions_per_caller,
        args.replicas,
        args.duration,
        if args.memory_storage {
            "memory"
        } else {
            "file"
        },
        args.nats_replicas,
    );
    // Baseline: raw KV compare-and-set, each caller cycling over its keys
    // with the revision the previous write returned.
    let seeds: Vec<&str> = args.nats_url.split(',').map(str::trim).collect();
    let client = async_nats::connect(seeds)
        .await
        .map_err(|e| format!("connect {}: {e}", args.nats_url))?;
    let js = jetstream::new(client);
    let mut baselines = raw_sides(&js, &args).await?;

    // respcoord on a bucket of its own: Start, then Finish, per session.
    let bucket = bench_bucket("coord");
    let settings = NatsSettings {
        url: args.nats_url.clone(),
        bucket: bucket.clone(),
        memory_storage: args.memory_storage,
        replicas: args.nats_replicas,
        ..NatsSettings::default()
    };
    let (urls, stops) = serve_replicas(&settings, args.replicas).await?;
    let clients = connect_clients(&urls, args.concurrency).await?;
    let (reading, per) = (Arc::clone(&clients), args.sessions_per_caller);
    let mut coordinated = start_finish(&args, clients).await;
    let mut states = drive(args.concurrency, args.duration, move |lane, n| {
        let mut client = reading[lane].clone();
        async move {
            let slot = lane * per + (n as usize % per);
            let request = pb::GetStateRequest {
                session_id: format!("bench-{slot}"),
            };
            client.get_state(request).await.is_ok()
        }
    })
    .await;
    for stop in stops {
        stop.cancel();
    }
    let _ = js.delete_key_value(&bucket).await;

    print_ratios(&mut baselines, &mut coordinated, &mut states);
    Ok(())
}

/// The baselines, measured on a bucket of their own.
struct Baselines {
    /// Raw compare-and-set.
    raw: Side,
    /// The same with a follower reading every write, and the writes it
    /// was delivered.
    followed: (Side, u64),
    /// The same again behind the gRPC transport (`floor`), called as
    /// respcoord is, and the writes its follower was delivered.
    floor: (Side, u64),
    /// Raw reads.
    reads: Side,
}

async fn raw_sides(
    js: &async_nats::jetstream::Context,
    args: &ClusterArgs,
) -> Result<Baselines, String> {
    let (raw_bucket, kv) = raw_bucket(js, args).await?;
    let keys = args.concurrency * args.sessions_per_caller;
    let raw_writes = RawWrites {
        kv: kv.clone(),
        value: bytes::Bytes::from(vec![7u8; 96]),
        revisions: Arc::new(
            (0..keys)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        ),
        per_caller: args.sessions_per_caller,
    };
    let per = args.sessions_per_caller;
    let raw = {
        let writes = raw_writes.clone();
        drive(args.concurrency, args.duration, move |lane, n| {
            writes.clone().write(lane, n)
        })
        .await
    };
    // The same compare-and-set while one ordered consumer reads every write,
    // as each respcoord replica's follower does to serve watches and keep its
    // mirror: the bound of a design where every replica sees every write.
    let stream = js
        .get_stream(format!("KV_{raw_bucket}"))
        .await
        .map_err(|e| format!("raw stream: {e}"))?;
    let followed = followed_by(&stream, async {
        let writes = raw_writes.clone();
        Ok(drive(args.concurrency, args.duration, move |lane, n| {
            writes.clone().write(lane, n)
        })
        .await)
    })
    .await?;
    // Behind gRPC: the same callers and client as respcoord's side.
    let floor = followed_by(&stream, async {
        let stop = CancellationToken::new();
        let url = floor::serve(raw_writes.clone(), stop.clone()).await?;
        let clients = connect_clients(&[url], args.concurrency).await?;
        let side = start_finish(args, clients).await;
        stop.cancel();
        Ok(side)
    })
    .await?;
    let raw_reads = {
        let kv = kv.clone();
        drive(args.concurrency, args.duration, move |lane, n| {
            let kv = kv.clone();
            async move {
                let slot = lane * per + (n as usize % per);
                kv.entry(format!("k{slot}")).await.is_ok()
            }
        })
        .await
    };
    let _ = js.delete_key_value(&raw_bucket).await;
    Ok(Baselines {
        raw,
        followed,
        floor,
        reads: raw_reads,
    })
}

/// Runs `side` while one ordered consumer reads every new message of
/// `stream`, as each respcoord replica's follower does to serve watches
/// and keep its mirror: the side, and how many writes the follower read.
async fn followed_by(
    stream: &async_nats::jetstream::stream::Stream,
    side: impl std::future::Future<Output = Result<Side, String>>,
) -> Result<(Side, u64), String> {
    let stop = CancellationToken::new();
    let follower = tokio::spawn(follow_all(stream.clone(), stop.clone()));
    let side = side.await;
    stop.cancel();
    let delivered = follower
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("follower: {e}"))?;
    Ok((side?, delivered))
}

/// The baseline's bucket, laid out as the backend lays out its own
/// (src/nats.rs): its name and the key-value store.
async fn raw_bucket(
    js: &async_nats::jetstream::Context,
    args: &ClusterArgs,
) -> Result<(String, async_nats::jetstream::kv::Store), String> {
    use async_nats::jetstream::{self, stream::StorageType};

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
        num_replicas: args.nats_replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("raw bucket: {e}"))?;
    let kv = js
        .get_key_value(raw_bucket.as_str())
        .await
        .map_err(|e| format!("raw bucket: {e}"))?;
    Ok((raw_bucket, kv))
}

/// `replicas` respcoord replicas on the bucket of `settings`, each serving
/// on a port of its own: their URLs, and what stops each.
async fn serve_replicas(
    settings: &respcoord::nats::NatsSettings,
    replicas: usize,
) -> Result<(Vec<String>, Vec<CancellationToken>), String> {
    use respcoord::nats::NatsCoordinator;

    let mut urls = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..replicas.max(1) {
        let nats = NatsCoordinator::connect(settings, CoordConfig::default())
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
    Ok((urls, stops))
}

/// One client per caller, the callers spread over the replicas.
async fn connect_clients(urls: &[String], concurrency: usize) -> Result<Arc<Vec<Client>>, String> {
    let mut clients = Vec::new();
    for lane in 0..concurrency {
        let url = &urls[lane % urls.len()];
        let channel = Endpoint::from_shared(url.clone())
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        clients.push(Client::new(channel));
    }
    Ok(Arc::new(clients))
}

/// Each caller's sessions in turn: a Start, then a Finish of what it
/// started.
async fn start_finish(args: &ClusterArgs, clients: Arc<Vec<Client>>) -> Side {
    let (keys, per) = (
        args.concurrency * args.sessions_per_caller,
        args.sessions_per_caller,
    );
    let active: Arc<Vec<std::sync::atomic::AtomicU64>> = Arc::new(
        (0..keys)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect(),
    );
    drive(args.concurrency, args.duration, move |lane, n| {
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
    .await
}

/// The figures, and respcoord's against the baselines'.
fn print_ratios(baselines: &mut Baselines, coordinated: &mut Side, states: &mut Side) {
    let (raw_rate, raw_p99) = baselines.raw.print("raw KV CAS");
    let (rate, p99) = coordinated.print("respcoord (nats) calls");
    println!(
        "ratio respcoord/raw: throughput {:.2}x, p99 {:.2}x",
        rate / raw_rate.max(1e-9),
        p99 as f64 / (raw_p99.max(1)) as f64
    );
    let (followed, delivered) = &mut baselines.followed;
    let (followed_rate, followed_p99) = followed.print("raw CAS + a follower");
    println!(
        "ratio respcoord/raw CAS with a follower ({delivered} writes delivered to it): throughput {:.2}x, p99 {:.2}x",
        rate / followed_rate.max(1e-9),
        p99 as f64 / (followed_p99.max(1)) as f64
    );
    let (floor, delivered) = &mut baselines.floor;
    let (floor_rate, floor_p99) = floor.print("gRPC + CAS + follower");
    println!(
        "ratio respcoord/gRPC floor (Start and Finish each one raw CAS behind tonic, a follower beside, \
         {delivered} writes delivered): throughput {:.2}x, p99 {:.2}x",
        rate / floor_rate.max(1e-9),
        p99 as f64 / (floor_p99.max(1)) as f64
    );
    let (read_rate, read_p99) = baselines.reads.print("raw KV read");
    let (state_rate, state_p99) = states.print("respcoord GetState");
    println!(
        "ratio GetState/raw read: throughput {:.2}x, p99 {:.2}x; GetState/raw CAS: throughput {:.2}x",
        state_rate / read_rate.max(1e-9),
        state_p99 as f64 / (read_p99.max(1)) as f64,
        state_rate / raw_rate.max(1e-9)
    );
}

/// The baseline's compare-and-set: each caller cycles over its keys with
/// the revision the previous write returned.
#[derive(Clone)]
struct RawWrites {
    kv: async_nats::jetstream::kv::Store,
    value: bytes::Bytes,
    revisions: Arc<Vec<std::sync::atomic::AtomicU64>>,
    per_caller: usize,
}

impl RawWrites {
    async fn write(self, lane: usize, n: u64) -> bool {
        let slot = lane * self.per_caller + (n as usize % self.per_caller);
        self.write_slot(slot).await
    }

    async fn write_slot(self, slot: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let expected = self.revisions[slot].load(Relaxed);
        match self
            .kv
            .update(format!("k{slot}"), self.value, expected)
            .await
        {
            Ok(revision) => {
                self.revisions[slot].store(revision, Relaxed);
                true
            }
            Err(_) => false,
        }
    }
}

/// Reads every new message of `stream` with one ordered consumer until
/// `stop`; how many it read.
async fn follow_all(
    stream: async_nats::jetstream::stream::Stream,
    stop: CancellationToken,
) -> Result<u64, String> {
    use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
    use tokio_stream::StreamExt as _;

    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let mut delivered = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(delivered),
            message = messages.next() => match message {
                Some(Ok(_)) => delivered += 1,
                Some(Err(error)) => return Err(error.to_string()),
                None => return Ok(delivered),
            },
        }
    }
}

/// Calls per second and latency samples of one side.
pub struct Side {
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

pub fn bench_bucket(label: &str) -> String {
    format!("bench_{label}_{}", unix_nanos() % 1_000_000_000_000)
}

/// Runs `op` in `concurrency` tasks for `duration`, timing each call.
pub async fn drive<F, Fut>(concurrency: usize, duration: Duration, op: F) -> Side
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
