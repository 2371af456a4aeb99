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
    machine::{transition, ActiveResponse, Call, FinishStatus, Phase, Source, TeardownReason},
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
    let start = Call::Start {
        source: Source::Vad,
        request_id: None,
    };
    let cases: [(&str, Phase, Call); 6] = [
        ("start_idle", Phase::Idle, start.clone()),
        ("start_supersede", active, start),
        (
            "finish_applied",
            active,
            Call::Finish {
                response: Some(id(7)),
                status: FinishStatus::Completed,
            },
        ),
        (
            "finish_stale",
            active,
            Call::Finish {
                response: Some(id(6)),
                status: FinishStatus::Completed,
            },
        ),
        (
            "cancel",
            active,
            Call::Cancel {
                only_if: None,
                source: Source::Client,
            },
        ),
        (
            "teardown_active",
            active,
            Call::Teardown {
                reason: TeardownReason::Shutdown,
                source: respcoord::machine::Source::Unspecified,
            },
        ),
    ];
    let mut group = c.benchmark_group("machine");
    group.throughput(Throughput::Elements(1));
    // A Start's response gets id 8.
    let new_response = id(8);
    for (name, phase, call) in cases {
        group.bench_function(name, |b| {
            b.iter(|| transition(black_box(phase), black_box(&call), black_box(new_response)))
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
