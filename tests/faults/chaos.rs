//! The soak: one cluster under load for N minutes while a randomized
//! schedule of every fault the bounded schedules use (partitions, pauses,
//! kills and restarts, skewed clocks) plays out, then one verdict over the
//! whole history. The schedule derives from the seed alone, so a seed
//! reproduces it (`scripts/chaos.sh --minutes N --seed S`); which node is
//! the stream leader when a step aims at "the leader" is the cluster's
//! doing, and is printed as it happens.
//!
//! Replica 2 is the only one ever killed, so replicas 0 and 1 keep complete
//! watch recordings for the every-acknowledged-transition check.

use std::time::{Duration, Instant};

use crate::{
    cluster::{ReplicaSpec, NODES},
    figures::Report,
    run::{default_spec, Paused, Run},
    workload::Rng,
};

const REPLICAS: usize = 3;
/// The replica a step may kill.
const KILLABLE: usize = 2;

#[derive(Clone, Copy, Debug)]
enum Target {
    Leader,
    Node(usize),
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    ReplicaCut(usize),
    NodeRoutesCut(Target),
    Split(Target, usize),
    ReplicaPause(usize),
    NodePause(Target),
    NodeKill(Target),
    ReplicaKill,
}

#[derive(Clone, Copy, Debug)]
struct Step {
    fault: Fault,
    hold: Duration,
    /// Load after the heal before the next step.
    settle: Duration,
}

/// The replicas' clock offsets (ms) and the steps, from the seed.
fn plan(seed: u64, minutes: u64) -> (Vec<i64>, Vec<Step>) {
    let mut rng = Rng::new(seed);
    let offsets = (0..REPLICAS)
        .map(|_| rng.below(6001) as i64 - 3000)
        .collect();
    let mut steps = Vec::new();
    let mut total = Duration::ZERO;
    let budget = Duration::from_secs(minutes * 60);
    while total < budget {
        let target = if rng.below(2) == 0 {
            Target::Leader
        } else {
            Target::Node(rng.below(NODES as u64) as usize)
        };
        let replica = rng.below(REPLICAS as u64) as usize;
        let fault = match rng.below(7) {
            0 => Fault::ReplicaCut(replica),
            1 => Fault::NodeRoutesCut(target),
            2 => Fault::Split(target, replica),
            3 => Fault::ReplicaPause(replica),
            4 => Fault::NodePause(target),
            5 => Fault::NodeKill(target),
            _ => Fault::ReplicaKill,
        };
        let step = Step {
            fault,
            hold: rng.millis(3_000, 8_000),
            settle: rng.millis(3_000, 6_000),
        };
        // A step takes its hold, its settle and about a second and a half
        // of leader lookups and recovery (measured: 21 steps in 236 s).
        total += step.hold + step.settle + Duration::from_millis(1_500);
        steps.push(step);
    }
    (offsets, steps)
}

async fn resolve(run: &Run, target: Target) -> usize {
    match target {
        Target::Node(i) => i,
        Target::Leader => match run.cluster.settled_leader(0, Duration::from_secs(10)).await {
            Some(leader) => leader,
            None => run
                .cluster
                .stream_view(0)
                .await
                .and_then(|(leader, _)| leader)
                .unwrap_or(0),
        },
    }
}

fn describe(target: Target, node: usize) -> String {
    match target {
        Target::Leader => format!("n{node} (stream leader)"),
        Target::Node(_) => format!("n{node}"),
    }
}

pub async fn soak(nats: &str, minutes: u64, seed: u64) -> Report {
    let (offsets, steps) = plan(seed, minutes);
    eprintln!(
        "chaos: seed {seed}, {minutes} min, {} steps; clock offsets (ms) {offsets:?}",
        steps.len()
    );
    for (i, step) in steps.iter().enumerate() {
        eprintln!(
            "  step {i:3}: {:?} for {:.1} s, then {:.1} s of load",
            step.fault,
            step.hold.as_secs_f64(),
            step.settle.as_secs_f64()
        );
    }
    let specs = offsets
        .iter()
        .map(|&clock_offset_ms| ReplicaSpec {
            clock_offset_ms,
            ..ReplicaSpec::default()
        })
        .collect();
    let mut run = Run::prepare("chaos", nats, specs).await;
    run.fault(format!("clock offsets (ms) {offsets:?} (from the start)"));
    run.load(Some(default_spec("chaos", REPLICAS, seed))).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let began = Instant::now();
    for (i, step) in steps.iter().enumerate() {
        inject(&mut run, i, step).await;
        // Every replica answers again before the next step (bounded: a
        // replica that never does is the verdict's to report).
        let deadline = Instant::now() + Duration::from_secs(30);
        for r in 0..REPLICAS {
            while !crate::cluster::probe(&run.cluster.endpoint(r)).await
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tokio::time::sleep(step.settle).await;
        eprintln!(
            "chaos: step {i} done after {:.0} s; {} operations so far",
            began.elapsed().as_secs_f64(),
            run.recorder.ops().len()
        );
    }
    let mut report = run.finish().await;
    report.notes.push(format!(
        "chaos seed {seed}, {minutes} min, {} steps",
        steps.len()
    ));
    report
}

async fn inject(run: &mut Run, i: usize, step: &Step) {
    let hold = step.hold;
    let secs = hold.as_secs_f64();
    match step.fault {
        Fault::ReplicaCut(r) => {
            run.cluster.cut_replica_from_nats(r);
            run.fault(format!(
                "step {i}: r{r} cut from every NATS node for {secs:.1} s"
            ));
            tokio::time::sleep(hold).await;
            run.cluster.heal();
        }
        Fault::NodeRoutesCut(target) => {
            let node = resolve(run, target).await;
            run.cluster.cut_node_routes(node);
            run.fault(format!(
                "step {i}: {} cut from the other nodes for {secs:.1} s",
                describe(target, node)
            ));
            tokio::time::sleep(hold).await;
            run.cluster.heal();
        }
        Fault::Split(target, r) => {
            let node = resolve(run, target).await;
            run.cluster.split(node, r);
            run.fault(format!(
                "step {i}: split {{{}, r{r}}} | the rest for {secs:.1} s",
                describe(target, node)
            ));
            tokio::time::sleep(hold).await;
            run.cluster.heal();
        }
        Fault::ReplicaPause(r) => {
            run.pause(Paused::Replica(r));
            run.fault(format!("step {i}: r{r} SIGSTOP for {secs:.1} s"));
            tokio::time::sleep(hold).await;
            run.resume(Paused::Replica(r));
        }
        Fault::NodePause(target) => {
            let node = resolve(run, target).await;
            run.pause(Paused::Node(node));
            run.fault(format!(
                "step {i}: {} SIGSTOP for {secs:.1} s",
                describe(target, node)
            ));
            tokio::time::sleep(hold).await;
            run.resume(Paused::Node(node));
        }
        Fault::NodeKill(target) => {
            let node = resolve(run, target).await;
            run.cluster.kill_node(node);
            run.fault(format!(
                "step {i}: {} SIGKILL, restarted {secs:.1} s later",
                describe(target, node)
            ));
            tokio::time::sleep(hold).await;
            run.cluster.restart_node(node);
        }
        Fault::ReplicaKill => {
            run.cluster.kill_replica(KILLABLE);
            run.fault(format!(
                "step {i}: r{KILLABLE} SIGKILL, restarted {secs:.1} s later"
            ));
            tokio::time::sleep(hold).await;
            if let Err(error) = run.cluster.restart_replica(KILLABLE).await {
                run.note(format!("step {i}: r{KILLABLE} did not come back: {error}"));
            }
        }
    }
}
