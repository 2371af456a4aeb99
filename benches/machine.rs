//! The pure transition, `respcoord::machine::transition`, for each kind of
//! call. This is the floor under every registry call: the rest of a call's
//! cost is locking, map lookup, event allocation and fan-out.
//!
//! `cargo bench --bench machine` (CPU time; see `support` for
//! `RESPCOORD_BENCH_CLOCK=wall`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use respcoord::{
    ids::ResponseId,
    machine::{transition, ActiveResponse, FinishStatus, Input, Phase, Source, TeardownReason},
};
use support::BenchClock;

mod support;

fn id(raw: u64) -> ResponseId {
    ResponseId::new(raw).expect("nonzero")
}

fn machine(c: &mut Criterion<BenchClock>) {
    let active = Phase::Active(ActiveResponse {
        id: id(7),
        source: Source::Client,
    });
    let start = Input::Start {
        new_response: id(8),
        source: Source::Vad,
    };
    let cases: [(&str, Phase, Input); 6] = [
        ("start_idle", Phase::Idle, start),
        ("start_supersede", active, start),
        (
            "finish_applied",
            active,
            Input::Finish {
                response: Some(id(7)),
                status: FinishStatus::Completed,
            },
        ),
        (
            "finish_stale",
            active,
            Input::Finish {
                response: Some(id(6)),
                status: FinishStatus::Completed,
            },
        ),
        ("cancel", active, Input::Cancel { only_if: None }),
        (
            "teardown_active",
            active,
            Input::Teardown {
                reason: TeardownReason::Shutdown,
            },
        ),
    ];
    let mut group = c.benchmark_group("machine");
    group.throughput(Throughput::Elements(1));
    for (name, phase, input) in cases {
        group.bench_function(name, |b| {
            b.iter(|| transition(black_box(phase), black_box(input)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(BenchClock::from_env())
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = machine
}
criterion_main!(benches);
