//! The load of one workload on one server: connections and in-flight
//! workers calling back to back, the watch streams of the watch workload,
//! and what they record inside the measured window.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use respcoord::proto::v1 as pb;
use tokio_util::sync::CancellationToken;
use tonic::{
    transport::{Channel, Endpoint},
    Code, Status,
};

use super::{WireArgs, Workload};
use crate::{
    measure::{cpu_by_role, rss_of, unix_nanos},
    Client,
};

/// One measured run: completed calls in the window and their latencies.
#[derive(Default)]
pub struct Sample {
    pub calls: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub window: Duration,
    pub latencies: Vec<u64>,
    /// On-CPU time of the in-process server's and the load generator's
    /// threads during the window (zero for a server out of process).
    pub server_cpu: Duration,
    pub client_cpu: Duration,
}

impl Sample {
    pub fn merge(&mut self, other: Sample) {
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

    pub fn cpu_per_call(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / self.calls.max(1) as f64
    }

    pub fn throughput(&self) -> f64 {
        self.calls as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

/// Delivery of watch events to the watch streams.
#[derive(Default)]
pub struct Delivery {
    pub session_latencies: Vec<u64>,
    pub all_latencies: Vec<u64>,
    pub session_events: u64,
    pub all_events: u64,
    pub ended_lagged: u64,
    pub ended_other: u64,
    pub ended_ok: u64,
    pub opened: u64,
    pub first_end: Option<String>,
    /// What opening the watches cost in memory, where it could be read.
    pub memory: Option<WatchMemory>,
}

/// RSS of the measured process before the watches opened and once they
/// all were open (before the load), and how many there were.
#[derive(Debug, Clone, Copy)]
pub struct WatchMemory {
    pub watches: u64,
    pub before: u64,
    pub after: u64,
    /// False: an in-process server, measured with the load generator.
    pub server_only: bool,
}

impl Delivery {
    pub fn merge(&mut self, other: Delivery) {
        self.session_latencies.extend(other.session_latencies);
        self.all_latencies.extend(other.all_latencies);
        self.session_events += other.session_events;
        self.all_events += other.all_events;
        self.ended_lagged += other.ended_lagged;
        self.ended_other += other.ended_other;
        self.ended_ok += other.ended_ok;
        self.opened += other.opened;
        if self.memory.is_none() {
            self.memory = other.memory;
        }
        if self.first_end.is_none() {
            self.first_end = other.first_end;
        }
    }
}

pub struct Plan {
    pub workload: Workload,
    pub sessions: Arc<Vec<String>>,
    pub hot: Arc<Vec<String>>,
    pub cancel_every: u64,
    pub warmup: Duration,
    pub duration: Duration,
}

pub struct RunResult {
    pub load: Sample,
    pub delivery: Option<Delivery>,
}

pub async fn run(url: String, plan: Arc<Plan>, args: WireArgs) -> Result<RunResult, String> {
    let channels = connect(&url, args.connections).await?;
    let clients: Vec<Client> = channels.iter().cloned().map(Client::new).collect();
    prepare(&clients, &plan).await?;

    // Watches first, so every event of the measured window has its watchers.
    let (streams, memory) = if plan.workload == Workload::Watch {
        open_watches(&url, &plan, &args).await?
    } else {
        (Vec::new(), None)
    };

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
        Some(collect_delivery(watch_tasks, &stop_watches, memory).await?)
    };
    Ok(RunResult { load, delivery })
}

/// Watch streams (`bool`: a watch-all), the watchers' share of the
/// sessions and one watch-all, and what they cost the measured process's
/// memory.
async fn open_watches(url: &str, plan: &Plan, args: &WireArgs) -> Result<WatchStreams, String> {
    let mut streams = Vec::new();
    let mut memory = None;
    let measured = match (&args.endpoint, args.server_pid) {
        (None, _) => Some(("self".to_owned(), false)),
        (Some(_), Some(pid)) => Some((pid.to_string(), true)),
        (Some(_), None) => None,
    };
    let before = measured.as_ref().and_then(|(pid, _)| rss_of(pid));
    let watchers = args.session_watchers;
    let connections = args
        .watch_connections
        .unwrap_or_else(|| watchers.div_ceil(100).max(1));
    let watch_clients: Vec<Client> = connect(url, connections)
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
    // Settled: every open answered, nothing else running yet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let (Some((pid, server_only)), Some(before)) = (&measured, before) {
        memory = rss_of(pid).map(|after| WatchMemory {
            watches: streams.len() as u64,
            before,
            after,
            server_only: *server_only,
        });
    }
    Ok((streams, memory))
}

/// What the watchers saw, once in-flight deliveries landed.
async fn collect_delivery(
    watch_tasks: Vec<tokio::task::JoinHandle<Delivery>>,
    stop_watches: &CancellationToken,
    memory: Option<WatchMemory>,
) -> Result<Delivery, String> {
    // Let in-flight deliveries land, then close the streams.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_watches.cancel();
    let mut delivery = Delivery {
        memory,
        ..Delivery::default()
    };
    for task in watch_tasks {
        delivery.merge(task.await.map_err(|e| e.to_string())?);
    }
    Ok(delivery)
}

/// Open watch streams (`true`: a watch-all) and the memory they cost.
type WatchStreams = (
    Vec<(tonic::Streaming<pb::WatchResponse>, bool)>,
    Option<WatchMemory>,
);

pub async fn connect(url: &str, count: usize) -> Result<Vec<Channel>, String> {
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

/// Creates the sessions a workload reads (untimed), so the measured window
/// is steady state rather than session creation.
pub async fn prepare(clients: &[Client], plan: &Plan) -> Result<(), String> {
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

/// One in-flight slot: calls back to back until the window closes.
pub async fn worker(
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
    let mut rng = Rng::seeded(index);
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

/// Records one call if it completed inside the measured window.
pub struct Recorder {
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

/// Reads one watch stream until `stop`, recording delivery latency of events
/// stamped inside the measured window.
pub async fn read_watch(
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

pub struct Rng(u64);

impl Rng {
    /// Worker `index`'s own sequence.
    pub fn seeded(index: usize) -> Self {
        Rng(0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9))
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

pub fn start_request(session: &str, source: pb::Source) -> pb::StartRequest {
    pb::StartRequest {
        session_id: session.to_owned(),
        source: source.into(),
        request_id: String::new(),
    }
}

pub fn finish_request(session: &str, response_id: u64) -> pb::FinishRequest {
    pb::FinishRequest {
        session_id: session.to_owned(),
        response_id,
        status: pb::TerminalStatus::Completed.into(),
    }
}

pub fn session_names(prefix: &str, kind: &str, count: usize) -> Arc<Vec<String>> {
    Arc::new(
        (0..count)
            .map(|i| format!("{prefix}-{kind}-{i:06}"))
            .collect(),
    )
}
