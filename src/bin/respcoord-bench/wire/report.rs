//! What `wire` prints: one line per run, the watch delivery, and the summary
//! table against the targets in docs/performance.md.

use std::collections::HashMap;

use super::{load::Delivery, load::Sample, Outcome, Target, WireArgs, Workload};
use crate::measure::{ms, percentiles, verdict, Percentiles};

pub fn describe(
    target: Target,
    sample: &mut Sample,
    in_process: bool,
) -> (String, Option<Percentiles>) {
    let throughput = sample.throughput();
    let errors = match &sample.first_error {
        Some(first) => format!("  errors {} (first: {first})", sample.errors),
        None => format!("  errors {}", sample.errors),
    };
    let cpu = if in_process {
        format!(
            "  cpu/call: server {:.1} us, load generator {:.1} us",
            sample.cpu_per_call(sample.server_cpu),
            sample.cpu_per_call(sample.client_cpu)
        )
    } else {
        format!(
            "  cpu/call: load generator {:.1} us",
            sample.cpu_per_call(sample.client_cpu)
        )
    };
    let p = percentiles(&mut sample.latencies);
    let line = match &p {
        Some(p) => format!(
            "{:<9}  {:>9.0} calls/s  p50 {}  p99 {}  p99.9 {}  max {}{cpu}{errors}",
            target.name(),
            throughput,
            ms(p.p50),
            ms(p.p99),
            ms(p.p999),
            ms(p.max),
        ),
        None => format!("{:<9}  no completed calls{errors}", target.name()),
    };
    (line, p)
}

pub fn workload_title(workload: Workload, args: &WireArgs) -> String {
    match workload {
        Workload::StartFinish => format!(
            "start-finish: Start then Finish, {} sessions, each worker on its own share",
            args.sessions
        ),
        Workload::BargeIn => format!(
            "barge-in: Start superseding on {} hot sessions shared by all workers, every {}th call a Cancel",
            args.hot_sessions, args.cancel_every
        ),
        Workload::GetState => format!("get-state: GetState over {} sessions", args.sessions),
        Workload::Watch => format!(
            "watch: start-finish load over {} sessions while {} session watchers (one per watched session) + 1 watch-all read",
            args.sessions, args.session_watchers
        ),
    }
}

pub fn print_delivery(indent: &str, delivery: &mut Delivery) {
    let mut all: Vec<u64> = delivery
        .session_latencies
        .iter()
        .chain(&delivery.all_latencies)
        .copied()
        .collect();
    let line = |values: &mut Vec<u64>| match percentiles(values) {
        Some(p) => format!(
            "p50 {}  p99 {}  p99.9 {}  max {}",
            ms(p.p50),
            ms(p.p99),
            ms(p.p999),
            ms(p.max)
        ),
        None => "no events in the window".into(),
    };
    println!(
        "{indent}delivery (event unix_nanos -> client receipt), all watchers: {}",
        line(&mut all)
    );
    println!(
        "{indent}  session watchers: {}  ({} events received)",
        line(&mut delivery.session_latencies),
        delivery.session_events
    );
    println!(
        "{indent}  watch-all:        {}  ({} events received)",
        line(&mut delivery.all_latencies),
        delivery.all_events
    );
    if let Some(memory) = delivery.memory {
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let per_watch =
            memory.after.saturating_sub(memory.before) as f64 / memory.watches.max(1) as f64;
        println!(
            "{indent}  memory, {}: RSS {:.1} MiB before the watches, {:.1} MiB with {} open: {:.0} bytes per open watch",
            if memory.server_only {
                "server process"
            } else {
                "this process (in-process server and load generator)"
            },
            mib(memory.before),
            mib(memory.after),
            memory.watches,
            per_watch,
        );
    }
    println!(
        "{indent}  streams opened {}, ended for lag (RESOURCE_EXHAUSTED) {}, ended otherwise {} (+{} OK){}",
        delivery.opened,
        delivery.ended_lagged,
        delivery.ended_other,
        delivery.ended_ok,
        delivery
            .first_end
            .as_deref()
            .map(|s| format!(", first end: {s}"))
            .unwrap_or_default()
    );
}

pub fn print_summary(outcomes: &HashMap<Workload, Outcome>) {
    let cpu = |o: &Outcome| {
        o.server_cpu_ratio
            .map(|r| format!("; server CPU/call {r:.2}x"))
            .unwrap_or_default()
    };
    println!();
    println!("Summary: median of per-round ratios (pooled over all rounds in parentheses).");
    println!("| target | goal | measured | verdict |");
    println!("|---|---|---|---|");
    if let Some(o) = outcomes.get(&Workload::StartFinish) {
        println!(
            "| Start/Finish over 10k sessions, throughput vs empty | >= 0.90x | {:.3}x (pooled {:.3}x{}) | {} |",
            o.throughput_ratio,
            o.pooled_throughput_ratio,
            cpu(o),
            verdict(o.throughput_ratio >= 0.90)
        );
        println!(
            "| Start/Finish over 10k sessions, p99 latency vs empty | <= 1.3x | {:.3}x (pooled {:.3}x) | {} |",
            o.p99_ratio,
            o.pooled_p99_ratio,
            verdict(o.p99_ratio <= 1.3)
        );
    }
    if let Some(o) = outcomes.get(&Workload::BargeIn) {
        println!(
            "| barge-in on 100 hot sessions, throughput vs empty | >= 0.85x | {:.3}x (pooled {:.3}x{}) | {} |",
            o.throughput_ratio,
            o.pooled_throughput_ratio,
            cpu(o),
            verdict(o.throughput_ratio >= 0.85)
        );
    }
    if let Some(o) = outcomes.get(&Workload::GetState) {
        println!(
            "| (no target) GetState over 10k sessions, throughput / p99 vs empty | - | {:.3}x / {:.3}x (pooled {:.3}x / {:.3}x{}) | - |",
            o.throughput_ratio,
            o.p99_ratio,
            o.pooled_throughput_ratio,
            o.pooled_p99_ratio,
            cpu(o)
        );
    }
    if let Some(
        o @ Outcome {
            delivery: Some(delivery),
            ..
        },
    ) = outcomes.get(&Workload::Watch)
    {
        let mut all: Vec<u64> = delivery
            .session_latencies
            .iter()
            .chain(&delivery.all_latencies)
            .copied()
            .collect();
        let p99 = percentiles(&mut all).map(|p| p.p99);
        let ok = p99.is_some_and(|p| p <= 2_000_000) && delivery.ended_lagged == 0;
        println!(
            "| Watch: session watchers + 1 watch-all under load, p99 delivery / ended for lag | <= 2 ms / 0 | {} / {} (the empty server's own call p99 under this load {}; load throughput {:.3}x empty{}) | {} |",
            p99.map_or("n/a".into(), ms),
            delivery.ended_lagged,
            o.empty_p99.map_or("n/a".into(), ms),
            o.throughput_ratio,
            cpu(o),
            verdict(ok)
        );
    }
}
