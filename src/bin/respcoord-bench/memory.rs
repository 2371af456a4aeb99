//! `respcoord-bench memory`: resident memory per session after one
//! Start/Finish each, then the CPU the idle server uses with them held.

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::Args;
use respcoord::{
    ids::SessionId,
    machine::{FinishStatus, Source},
    registry::{CoordConfig, Registry},
};

use crate::{
    duration,
    measure::{process_cpu, rss_bytes, threads_cpu, verdict},
    servers::start_respcoord,
};

#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// Sessions to create, each with one Start and one Finish.
    #[arg(long, default_value_t = 1_000_000)]
    sessions: usize,
    /// Registry shards (default: the registry's default). The per-shard hash
    /// tables' load factor, and so bytes per session, depends on it.
    #[arg(long)]
    shards: Option<usize>,
    /// How long to measure the idle server's CPU afterwards (0s: skip).
    #[arg(long, default_value = "10s", value_parser = duration)]
    idle: Duration,
}

pub fn memory(args: MemoryArgs) -> ExitCode {
    let sessions = args.sessions.max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = CoordConfig {
        max_sessions: sessions.max(CoordConfig::default().max_sessions),
        shards: args.shards.unwrap_or(CoordConfig::default().shards),
        ..CoordConfig::default()
    };
    let registry = {
        let _entered = runtime.enter();
        Registry::new(config)
    };
    println!(
        "memory: {sessions} sessions, ids 36-byte UUID text, one Start + one Finish each \
         (2 events retained per session); registry config: default (shards {}, session history {}, global history {})",
        config.shards, config.session_history, config.global_history
    );
    println!(
        "  type sizes: Session {} B, LifecycleEvent {} B (+16 B Arc header each)",
        std::mem::size_of::<respcoord::session::Session>(),
        std::mem::size_of::<respcoord::events::LifecycleEvent>(),
    );
    let before = rss_bytes();
    let began = Instant::now();
    if let Err(code) = populate(&registry, sessions) {
        return code;
    }
    let elapsed = began.elapsed();
    let after = rss_bytes();
    let grown = after.saturating_sub(before);
    let per_session = grown as f64 / sessions as f64;
    println!(
        "  populated in {:.2?} ({:.0} ns per Start+Finish pair, one thread)",
        elapsed,
        elapsed.as_nanos() as f64 / sessions as f64
    );
    println!(
        "  VmRSS before {:.1} MiB, after {:.1} MiB, growth {:.1} MiB",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        grown as f64 / 1048576.0
    );
    println!("  RSS per session: {per_session:.0} bytes");
    println!("  sessions held: {}", registry.session_count());

    let idle_line = (!args.idle.is_zero()).then(|| measure_idle(&runtime, &registry, args.idle));

    println!();
    println!("| target | goal | measured | verdict |");
    println!("|---|---|---|---|");
    println!(
        "| {sessions} sessions after one Start/Finish each, RSS per session | <= 300 B | {per_session:.0} B | {} |",
        verdict(per_session <= 300.0)
    );
    if let Some(percent) = idle_line {
        println!(
            "| {sessions} idle sessions, no traffic, CPU | < 2% of one core | {percent:.3}% | {} |",
            verdict(percent < 2.0)
        );
    }
    ExitCode::SUCCESS
}

/// One Start and one Finish on each of `sessions` sessions.
fn populate(registry: &Registry, sessions: usize) -> Result<(), ExitCode> {
    for i in 0..sessions {
        let id = SessionId::parse(&uuid_like(i)).expect("valid id");
        let started = match registry.start(&id, Source::Client, None) {
            Ok(started) => started,
            Err(error) => {
                eprintln!("error: start #{i}: {error}");
                return Err(ExitCode::FAILURE);
            }
        };
        if let Err(error) = registry.finish(&id, Some(started.response), FinishStatus::Completed) {
            eprintln!("error: finish #{i}: {error}");
            return Err(ExitCode::FAILURE);
        }
    }
    Ok(())
}

/// The CPU a server over `registry` takes with no traffic, over `idle`: the
/// larger of the process's and the per-thread figure, in % of one core.
fn measure_idle(runtime: &tokio::runtime::Runtime, registry: &Registry, idle: Duration) -> f64 {
    let running = start_respcoord(runtime, registry.clone(), 0);
    // Let the server and the expirer settle before measuring.
    std::thread::sleep(Duration::from_secs(1));
    let cpu0 = process_cpu();
    let fine0 = threads_cpu();
    let wall0 = Instant::now();
    std::thread::sleep(idle);
    let wall = wall0.elapsed();
    let cpu = process_cpu().saturating_sub(cpu0);
    let fine = threads_cpu().saturating_sub(fine0);
    let percent = 100.0 * cpu.as_secs_f64() / wall.as_secs_f64();
    let fine_percent = 100.0 * fine.as_secs_f64() / wall.as_secs_f64();
    println!(
        "  idle: server on {} with {} sessions, no traffic, {:.1?}: process CPU {:?} = {percent:.3}% of one core \
         (per-thread schedstat: {:?} = {fine_percent:.3}%)",
        running.url,
        registry.session_count(),
        wall,
        cpu,
        fine
    );
    running.shut(runtime);
    percent.max(fine_percent)
}

pub fn uuid_like(i: usize) -> String {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        (i as u64).wrapping_mul(2_654_435_761) & 0xffff_ffff,
        i
    )
}
