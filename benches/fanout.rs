//! Event append plus fan-out: a Start/Finish pair on one session (two
//! events) while 1, 100 or 1,000 watchers drain it, either session watchers
//! of that session (`Registry::watch_session`) or watch-all subscribers
//! (`Registry::watch_all`).
//!
//! `cargo bench --bench fanout`
//!
//! Measured in process CPU time by default (see `support`), which includes
//! the runtime workers delivering to watchers: the figure is the CPU the
//! whole process spends per call, delivery included.
//!
//! The calls run as a task on a two-worker tokio runtime, as in the server
//! (a handler's wake-ups land on its worker's queue); each watcher is a task
//! looping on `Subscription::next`, as `grpc::watch::responses` does (without the
//! proto encoding). Every 64 calls the calling task yields, so the watchers
//! it woke run; the time per iteration therefore includes delivering the
//! events to every watcher, not just the sends. One iteration = one Start or
//! one Finish call (one event). Watchers that fell behind anyway are counted
//! and printed after each benchmark (they resume; nothing is lost silently).

use std::{
    hint::black_box,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use respcoord::{
    events::{Delivery, Subscription},
    ids::SessionId,
    machine::{FinishStatus, Source},
    registry::{CoordConfig, Registry},
};
use tokio::runtime::Runtime;

mod support;

use support::{BenchClock, Clock};

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    lagged: AtomicU64,
}

fn spawn_drainer(runtime: &Runtime, mut subscription: Subscription, counters: Arc<Counters>) {
    runtime.spawn(async move {
        loop {
            match subscription.next(256).await {
                Ok(Delivery::Events { events, last }) => {
                    counters
                        .delivered
                        .fetch_add(events.len() as u64, Ordering::Relaxed);
                    black_box(events);
                    if last {
                        return;
                    }
                }
                Ok(Delivery::End) => return,
                // The receiver skips to the oldest retained event; keep going.
                Err(_) => {
                    counters.lagged.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
}

/// `calls` alternating Start/Finish calls on `id`, yielding every 64 calls.
async fn drive(clock: Clock, registry: Registry, id: SessionId, calls: u64) -> Duration {
    let start = clock.now();
    let mut live = None;
    for call in 0..calls {
        live = match live.take() {
            None => registry
                .start(&id, Source::Client, None)
                .ok()
                .map(|s| s.response),
            Some(response) => {
                let _ = black_box(registry.finish(&id, Some(response), FinishStatus::Completed));
                None
            }
        };
        if call % 64 == 63 {
            tokio::task::yield_now().await;
        }
    }
    // Let the watchers finish with the last batch before reading the clock.
    tokio::task::yield_now().await;
    clock.now().saturating_sub(start)
}

#[derive(Clone, Copy)]
enum Kind {
    Session,
    All,
}

fn fanout(c: &mut Criterion<BenchClock>) {
    let clock = Clock::from_env();
    let mut group = c.benchmark_group("fanout");
    group.throughput(Throughput::Elements(1));
    for kind in [Kind::Session, Kind::All] {
        for watchers in [1usize, 100, 1_000] {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let registry = Registry::new(CoordConfig::default());
            let id = SessionId::parse("fanout-session").expect("id");
            let counters = Arc::new(Counters::default());
            for _ in 0..watchers {
                let subscription = match kind {
                    Kind::Session => registry.watch_session(&id, None),
                    Kind::All => registry.watch_all(None),
                }
                .expect("subscribe");
                spawn_drainer(&runtime, subscription, Arc::clone(&counters));
            }
            let name = match kind {
                Kind::Session => "session_watchers",
                Kind::All => "watch_all",
            };
            group.bench_function(BenchmarkId::new(name, watchers), |b| {
                b.iter_custom(|iters| {
                    let task = runtime.spawn(drive(clock, registry.clone(), id.clone(), iters));
                    runtime.block_on(task).expect("drive task")
                })
            });
            eprintln!(
                "fanout/{name}/{watchers}: {} events delivered, {} lag reports",
                counters.delivered.load(Ordering::Relaxed),
                counters.lagged.load(Ordering::Relaxed)
            );
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(BenchClock::from_env())
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = fanout
}
criterion_main!(benches);
