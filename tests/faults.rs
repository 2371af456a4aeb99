//! Fault runs of the NATS backend: a three-node JetStream cluster and
//! respcoord replicas in their own network namespaces, with partitions,
//! pauses, crashes and clock skew injected while clients on a few hot
//! sessions record every operation; each history is checked for
//! linearizability against the sequential M3 specification and every
//! replica's watch recording against the contract's invariants.
//!
//! `cargo test --features fault-injection --test faults` (as root:
//! network namespaces). Layout: `netns.rs` the namespaces and links,
//! `cluster.rs` the NATS nodes and replicas in them and the faults,
//! `observe.rs` what the test asks NATS about itself, `workload.rs` the
//! recorded clients, `watching.rs` the watch-all recorders, `run.rs` one run
//! from start to verdict, `figures.rs` its figures, `schedules.rs`,
//! `deposed.rs` and `expiry.rs` the bounded schedules, `chaos.rs` the soak;
//! the checker is `linearizability.rs` (with `wgl.rs`, `shrink.rs`),
//! `watch_check.rs` and `report.rs`.
//!
//! Environment: `RESPCOORD_TEST_CLUSTER_NATS_SERVER` the nats-server
//! binary, 2.10 or newer (else the newest pinned one, scripts/nats-server.sh); without root, `ip netns` or that binary each test prints
//! "skipped: ..." and passes, unless `RESPCOORD_FAULTS_REQUIRED` is set;
//! `RESPCOORD_TEST_KEEP_NATS` keeps every run's logs and stores (a run that
//! found something keeps them anyway); `RESPCOORD_CHAOS_MINUTES` and
//! `RESPCOORD_CHAOS_SEED` drive the ignored `chaos_soak` (scripts/chaos.sh).
#![allow(dead_code)] // filled in by the harness and the checker

#[path = "faults/chaos.rs"]
mod chaos;
#[path = "faults/checker_tests.rs"]
mod checker_tests;
#[path = "faults/cluster.rs"]
mod cluster;
#[path = "faults/deposed.rs"]
mod deposed;
#[path = "faults/expiry.rs"]
mod expiry;
#[path = "faults/figures.rs"]
mod figures;
#[path = "faults/history.rs"]
mod history;
#[path = "faults/linearizability.rs"]
mod linearizability;
#[path = "faults/netns.rs"]
mod netns;
#[path = "faults/observe.rs"]
mod observe;
#[path = "faults/report.rs"]
mod report;
#[path = "faults/run.rs"]
mod run;
#[path = "faults/schedules.rs"]
mod schedules;
#[path = "faults/shrink.rs"]
mod shrink;
#[path = "faults/watch_check.rs"]
mod watch_check;
#[path = "faults/watching.rs"]
mod watching;
#[path = "faults/wgl.rs"]
mod wgl;
#[path = "faults/workload.rs"]
mod workload;

use std::{future::Future, sync::Mutex};

/// The server binary Cargo built for this test run (with `fault-injection`).
pub const RESPCOORD_BIN: &str = env!("CARGO_BIN_EXE_respcoord");

/// The nats-server to run, or why the fault runs cannot run here (printed
/// as "skipped: ..."; the test then passes vacuously, unless
/// `RESPCOORD_FAULTS_REQUIRED` is set, as CI sets it: .ci/run).
fn environment() -> Result<String, String> {
    if let Some(reason) = netns::unavailable() {
        return Err(reason);
    }
    let Some(binary) = cluster::nats_server_binary() else {
        return Err("no nats-server (set RESPCOORD_TEST_CLUSTER_NATS_SERVER, \
                    e.g. to the path scripts/nats-server.sh prints)"
            .into());
    };
    match cluster::nats_server_version(&binary) {
        None => Err(format!("{binary} does not run")),
        Some(version) if version < (2, 10, 0) => Err(format!(
            "{binary} is {version:?}; the fault runs need nats-server 2.10 or newer"
        )),
        Some(_) => Ok(binary),
    }
}

/// One run at a time: each starts three NATS nodes and up to three
/// replicas on a two-core machine, and their timing is what is under test.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `schedule` on its own runtime, or prints why it cannot run here.
fn run<F, Fut>(schedule: F) -> Option<figures::Report>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = figures::Report>,
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let binary = match environment() {
        Ok(binary) => binary,
        Err(reason) if std::env::var_os("RESPCOORD_FAULTS_REQUIRED").is_some() => {
            panic!("RESPCOORD_FAULTS_REQUIRED is set, but: {reason}")
        }
        Err(reason) => {
            eprintln!("skipped: {reason}");
            return None;
        }
    };
    netns::delete_stale();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    Some(runtime.block_on(schedule(binary)))
}

/// A schedule's run must show no violation and lose nothing acknowledged.
fn clean<F, Fut>(schedule: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = figures::Report>,
{
    let Some(report) = run(schedule) else {
        return;
    };
    assert!(
        report.violations.is_empty() && report.lost.is_empty(),
        "schedule {}: {} violation(s), {} acknowledged transition(s) lost (report above)",
        report.schedule,
        report.violations.len(),
        report.lost.len()
    );
}

#[test]
fn a_replica_cut_from_every_nats_node() {
    clean(|nats| async move { schedules::replica_cut_from_nats(&nats).await });
}

#[test]
fn a_nats_minority_node_cut_from_its_peers() {
    clean(|nats| async move { schedules::nats_minority_node_cut(&nats).await });
}

#[test]
fn a_clean_majority_minority_split() {
    clean(|nats| async move { schedules::majority_minority_split(&nats).await });
}

#[test]
fn a_replica_paused_mid_load() {
    clean(|nats| async move { schedules::replica_paused(&nats).await });
}

#[test]
fn the_stream_leader_paused() {
    clean(|nats| async move { schedules::stream_leader_paused(&nats).await });
}

#[test]
fn the_stream_leader_killed_and_restarted() {
    clean(|nats| async move { schedules::stream_leader_killed(&nats).await });
}

#[test]
fn replica_clocks_skewed_both_ways() {
    clean(|nats| async move { schedules::clock_skew(&nats).await });
}

#[test]
fn expiry_with_skewed_clocks_and_a_paused_lease_holder() {
    clean(|nats| async move { expiry::skewed_and_paused(&nats, false).await });
}

/// The same schedule on the build that times expiry by replica clocks: it
/// must expire early, or the schedule above proves nothing.
#[test]
fn the_expiry_check_rejects_a_build_that_times_expiry_by_replica_clocks() {
    let Some(report) = run(|nats| async move { expiry::skewed_and_paused(&nats, true).await })
    else {
        return;
    };
    let found = report
        .violations
        .iter()
        .find(|v| v.starts_with("expiry:") && v.contains("before its"))
        .unwrap_or_else(|| {
            panic!(
                "with expiry timed by replica clocks, no session expired early: the schedule \
                 no longer skews the writer against the expirer (report above)"
            )
        });
    eprintln!("as it must, the expiry check rejected the build timed by replica clocks: {found}");
}

#[test]
fn a_deposed_stream_leader_serves_no_stale_answer() {
    clean(|nats| async move { deposed::deposed_leader(&nats, false).await });
}

/// The same schedule against replica B built as before the fix: it must
/// find the stale answers, or the schedule above proves nothing.
#[test]
fn the_checker_rejects_a_build_that_answers_unconfirmed_reads() {
    let Some(report) = run(|nats| async move { deposed::deposed_leader(&nats, true).await }) else {
        return;
    };
    let found = checker_verdict(&report, "linearizability violation").unwrap_or_else(|| {
        panic!(
            "with reads unconfirmed, the linearizability checker found no stale answer: the \
             schedule no longer opens the window it is there to test (report above)"
        )
    });
    eprintln!("as it must, the checker rejected the build with unconfirmed reads: {found}");
}

#[test]
fn the_checker_rejects_a_build_without_compare_and_set() {
    let Some(report) = run(|nats| async move { schedules::broken_build(&nats).await }) else {
        return;
    };
    let found = checker_verdict(&report, "linearizability violation").unwrap_or_else(|| {
        panic!(
            "with compare-and-set off, a contended run passed the linearizability checker: it \
             cannot catch a lost update (report above)"
        )
    });
    eprintln!("as it must, the checker rejected the build without compare-and-set: {found}");
}

/// The first line of the checker's own violation of that kind (not the
/// harness's counts, which a broken checker would not silence).
fn checker_verdict(report: &figures::Report, kind: &str) -> Option<String> {
    report
        .violations
        .iter()
        .find(|v| v.starts_with(kind))
        .and_then(|v| v.lines().next())
        .map(str::to_owned)
}

/// The soak (`scripts/chaos.sh --minutes N --seed S`): a randomized
/// schedule of every fault above for `RESPCOORD_CHAOS_MINUTES` (default 1)
/// from `RESPCOORD_CHAOS_SEED` (default: the clock, printed), one verdict.
#[test]
#[ignore = "a long soak: scripts/chaos.sh runs it"]
fn chaos_soak() {
    let minutes = std::env::var("RESPCOORD_CHAOS_MINUTES")
        .ok()
        .and_then(|m| m.parse::<u64>().ok())
        .unwrap_or(1);
    let seed = std::env::var("RESPCOORD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        });
    eprintln!("chaos soak: {minutes} min, seed {seed} (RESPCOORD_CHAOS_SEED={seed} reproduces it)");
    clean(|nats| async move { chaos::soak(&nats, minutes, seed).await });
}
