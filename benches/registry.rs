//! One registry call (`Registry::start`/`finish`/`state`) on a registry that
//! already holds 1, 1k or 1M sessions, from one thread and from two.
//!
//! `cargo bench --bench registry` (or `-- registry/1M/` for one size).
//!
//! Every criterion iteration is ONE registry call, so `time` is per call:
//! - `start_finish`: Start then Finish (of the id Start returned) on a
//!   session picked at random, alternating; each call appends one event.
//! - `start_supersede`: Start on a random session that already has a live
//!   response (three events: cancel_requested, ended, started).
//! - `get_state`: GetState of a random session.
//! - `start_finish_hot10k`, `get_state_hot10k` (1M only): the same on 10k of
//!   the 1M sessions, as when the calls in progress are a small part of the
//!   sessions held: map size without the cache misses of a 1M working set.
//! - `registry/id_parse`: the baseline included in every call above: pick an
//!   index, write its id, `SessionId::parse` it (and drop it), no registry.
//!
//! Each call names its session with a freshly parsed `SessionId`, written
//! from the index into a stack buffer, as the gRPC layer parses one from
//! every request: the id's bytes are hot, and the registry's copy of them
//! (its map key), the map's buckets and the session record are wherever the
//! registry left them. Sessions are picked uniformly at random, so at 1M
//! those miss the CPU caches as they would in production. Ids are 36-byte
//! UUID-shaped strings.
//!
//! `/1t` runs on the bench thread. `/2t` splits the same number of calls over
//! two threads (`std::thread::scope`, both on the registry at once) and
//! divides by all calls. Measured in process CPU time by default (see
//! `support`): `/2t` is then the CPU both threads spent per call, so equal to
//! `/1t` is perfect scaling and anything above it is contention (cache-line
//! transfers, lock spinning). With `RESPCOORD_BENCH_CLOCK=wall` on an idle
//! machine `/2t` is the inverse of aggregate throughput: perfect scaling
//! halves it.
//!
//! Each size's registry is built once (every session after one
//! Start/Finish, as a long-running coordinator holds them) and shared by all
//! of that size's benchmarks.

use std::{
    hint::black_box,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use respcoord::{
    ids::{ResponseId, SessionId},
    machine::{FinishStatus, Source},
    registry::{CoordConfig, Registry},
};

mod support;

use support::{BenchClock, Clock};

/// xorshift64*: a few cycles per pick, so the pick does not dominate.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        static SEED: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
        Self(SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
    }
}

/// Session `i`'s id, `xxxxxxxx-0000-4000-8000-iiiiiiiiiiii` (36 bytes),
/// written without allocating and parsed as the gRPC layer would.
fn session_id(i: usize) -> SessionId {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = *b"00000000-0000-4000-8000-000000000000";
    let spread = (i as u64).wrapping_mul(2_654_435_761) & 0xffff_ffff;
    for (k, slot) in buf[..8].iter_mut().enumerate() {
        *slot = HEX[((spread >> (28 - 4 * k)) & 0xf) as usize];
    }
    for (k, slot) in buf[24..].iter_mut().enumerate() {
        *slot = HEX[((i as u64 >> (44 - 4 * k)) & 0xf) as usize];
    }
    let raw = std::str::from_utf8(&buf).expect("ascii");
    SessionId::parse(raw).expect("valid id")
}

struct Fixture {
    registry: Registry,
    sessions: usize,
}

impl Fixture {
    fn build(sessions: usize) -> Self {
        let registry = Registry::new(CoordConfig {
            max_sessions: sessions * 2 + 16,
            ..CoordConfig::default()
        });
        for i in 0..sessions {
            let id = session_id(i);
            let started = registry
                .start(&id, Source::Client, None)
                .expect("populate: start");
            registry
                .finish(&id, Some(started.response), FinishStatus::Completed)
                .expect("populate: finish");
        }
        Self { registry, sessions }
    }

    /// Leaves every session with a live response, for the supersede bench.
    fn activate_all(&self) {
        for i in 0..self.sessions {
            self.registry
                .start(&session_id(i), Source::Client, None)
                .expect("activate");
        }
    }
}

#[derive(Clone, Copy)]
enum Op {
    StartFinish,
    StartSupersede,
    GetState,
    /// Baseline: the id work every other op includes.
    IdParse,
}

/// The working set of the `_hot10k` variants.
const HOT: usize = 10_000;

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::StartFinish => "start_finish",
            Op::StartSupersede => "start_supersede",
            Op::GetState => "get_state",
            Op::IdParse => "id_parse",
        }
    }
}

/// `calls` registry calls of kind `op` on random sessions among the first
/// `working_set`.
fn work(fixture: &Fixture, working_set: usize, op: Op, calls: u64) {
    let registry = &fixture.registry;
    let n = working_set.clamp(1, fixture.sessions);
    let mut rng = Rng::seeded();
    match op {
        Op::StartFinish => {
            let mut pending: Option<(usize, ResponseId)> = None;
            for _ in 0..calls {
                match pending.take() {
                    None => {
                        let index = rng.below(n);
                        if let Ok(started) =
                            registry.start(&session_id(index), Source::Client, None)
                        {
                            pending = Some((index, started.response));
                        }
                    }
                    Some((index, response)) => {
                        let _ = black_box(registry.finish(
                            &session_id(index),
                            Some(response),
                            FinishStatus::Completed,
                        ));
                    }
                }
            }
        }
        Op::StartSupersede => {
            for _ in 0..calls {
                let id = session_id(rng.below(n));
                let _ = black_box(registry.start(&id, Source::Vad, None));
            }
        }
        Op::GetState => {
            for _ in 0..calls {
                let _ = black_box(registry.state(&session_id(rng.below(n))));
            }
        }
        Op::IdParse => {
            for _ in 0..calls {
                black_box(session_id(rng.below(n)));
            }
        }
    }
}

struct Run<'a> {
    clock: Clock,
    fixture: &'a Fixture,
    working_set: usize,
    op: Op,
    threads: u64,
}

fn timed(run: &Run<'_>, iters: u64) -> Duration {
    let Run {
        clock,
        fixture,
        working_set,
        op,
        threads,
    } = *run;
    if threads == 1 {
        return clock.measure(|| work(fixture, working_set, op, iters));
    }
    let per_thread = iters.div_ceil(threads);
    clock.measure(|| {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| work(fixture, working_set, op, per_thread));
            }
        })
    })
}

fn registry(c: &mut Criterion<BenchClock>) {
    let clock = Clock::from_env();
    {
        let fixture = Fixture::build(1);
        let mut group = c.benchmark_group("registry");
        group.throughput(Throughput::Elements(1));
        let run = Run {
            clock,
            fixture: &fixture,
            working_set: 1,
            op: Op::IdParse,
            threads: 1,
        };
        group.bench_function("id_parse", |b| b.iter_custom(|iters| timed(&run, iters)));
        group.finish();
    }
    // Run as a test (`cargo test --all-targets`), a debug build would spend
    // most of a minute building the 1M fixture: keep the names, shrink it.
    let big = if support::smoke_test() {
        2 * HOT
    } else {
        1_000_000
    };
    for (label, sessions) in [("1", 1usize), ("1k", 1_000), ("1M", big)] {
        let built = Instant::now();
        let fixture = Fixture::build(sessions);
        eprintln!(
            "registry/{label}: {sessions} sessions built in {:.1?}",
            built.elapsed()
        );
        let mut group = c.benchmark_group(format!("registry/{label}"));
        group.throughput(Throughput::Elements(1));
        let mut bench = |name: String, working_set: usize, op: Op, threads: u64| {
            let run = Run {
                clock,
                fixture: &fixture,
                working_set,
                op,
                threads,
            };
            group.bench_function(BenchmarkId::new(name, format!("{threads}t")), |b| {
                b.iter_custom(|iters| timed(&run, iters))
            });
        };
        for op in [Op::StartFinish, Op::GetState] {
            for threads in [1, 2] {
                bench(op.name().to_owned(), sessions, op, threads);
            }
        }
        if sessions > HOT {
            for op in [Op::StartFinish, Op::GetState] {
                bench(format!("{}_hot10k", op.name()), HOT, op, 1);
            }
        }
        fixture.activate_all();
        for threads in [1, 2] {
            bench(
                "start_supersede".to_owned(),
                sessions,
                Op::StartSupersede,
                threads,
            );
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(BenchClock::from_env())
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = registry
}
criterion_main!(benches);
