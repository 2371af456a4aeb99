//! The bounded fault schedules: each starts its own cluster, runs the load
//! through one kind of fault and its heal, and returns the run's report
//! (`run.rs` checks it). A few seconds of fault each, so all of them fit in
//! about two minutes.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use crate::{
    cluster::{ReplicaSpec, NODES},
    figures::Report,
    history::{Answer, Op, Outcome},
    run::{default_spec, Paused, Run},
};

/// Load before the first fault.
const WARM_UP: Duration = Duration::from_secs(2);
/// How long the cluster must take to report a leader with current followers.
const LEADER: Duration = Duration::from_secs(20);

fn replicas(n: usize) -> Vec<ReplicaSpec> {
    vec![ReplicaSpec::default(); n]
}

async fn leader(run: &Run, via: usize) -> usize {
    run.cluster
        .settled_leader(via, LEADER)
        .await
        .unwrap_or_else(|| panic!("[{}] no stream leader with current followers", run.name))
}

async fn sleep(duration: Duration) {
    tokio::time::sleep(duration).await;
}

/// One replica loses every NATS node for 5 s; its clients can still reach it.
pub async fn replica_cut_from_nats(nats: &str) -> Report {
    let mut run = Run::prepare("replica-cut", nats, replicas(3)).await;
    run.load(None).await;
    sleep(WARM_UP).await;
    run.cluster.cut_replica_from_nats(1);
    run.fault("r1 cut from n0, n1, n2 (its gRPC link stays up)");
    sleep(Duration::from_secs(5)).await;
    run.cluster.heal();
    run.fault("healed");
    sleep(Duration::from_secs(2)).await;
    run.finish().await
}

/// A NATS follower loses its routes to the other two for 6 s; the replicas
/// connected to it (replica 0 at least) still reach it.
pub async fn nats_minority_node_cut(nats: &str) -> Report {
    let mut run = Run::prepare("nats-minority", nats, replicas(3)).await;
    let leader = leader(&run, 0).await;
    let follower = (leader + 1) % NODES;
    // Replica 0 dials only that follower, so some replica stays on the
    // minority node whichever connections the others made.
    let on_follower = ReplicaSpec {
        nodes: vec![follower],
        ..ReplicaSpec::default()
    };
    run.cluster
        .respawn_replica(0, on_follower)
        .await
        .expect("replica 0 on the follower");
    run.load(None).await;
    sleep(WARM_UP).await;
    run.cluster.cut_node_routes(follower);
    run.fault(format!(
        "n{follower} (a follower; stream leader n{leader}; r0 dials only n{follower}) cut from \
         the other nodes"
    ));
    sleep(Duration::from_secs(6)).await;
    run.cluster.heal();
    run.fault("healed");
    sleep(Duration::from_secs(2)).await;
    run.finish().await
}

/// A clean split for 8 s: the stream leader and replica 0 on the minority
/// side, the other two nodes and replicas on the majority side.
pub async fn majority_minority_split(nats: &str) -> Report {
    let mut run = Run::prepare("split", nats, replicas(3)).await;
    let leader = leader(&run, 0).await;
    run.load(None).await;
    sleep(WARM_UP).await;
    run.cluster.split(leader, 0);
    run.fault(format!(
        "split: {{n{leader} (stream leader), r0}} | the other nodes and replicas"
    ));
    let majority = (leader + 1) % NODES;
    sleep(Duration::from_secs(8)).await;
    let view = run.cluster.stream_view(majority).await;
    run.note(format!(
        "before the heal the majority (via n{majority}) saw stream (leader, current followers) {view:?}"
    ));
    run.cluster.heal();
    run.fault("healed");
    sleep(Duration::from_secs(2)).await;
    run.finish().await
}

/// A replica frozen mid-load for 5 s, then resumed with whatever it had in
/// flight.
pub async fn replica_paused(nats: &str) -> Report {
    let mut run = Run::prepare("replica-sigstop", nats, replicas(3)).await;
    run.load(None).await;
    sleep(WARM_UP).await;
    run.pause(Paused::Replica(0));
    run.fault("r0 SIGSTOP");
    sleep(Duration::from_secs(5)).await;
    run.resume(Paused::Replica(0));
    run.fault("r0 SIGCONT");
    sleep(Duration::from_secs(2)).await;
    run.finish().await
}

/// The stream leader's nats-server frozen for 6 s.
pub async fn stream_leader_paused(nats: &str) -> Report {
    let mut run = Run::prepare("leader-sigstop", nats, replicas(3)).await;
    let leader = leader(&run, 0).await;
    run.load(None).await;
    sleep(WARM_UP).await;
    run.pause(Paused::Node(leader));
    run.fault(format!("n{leader} (stream leader) SIGSTOP"));
    sleep(Duration::from_secs(6)).await;
    run.resume(Paused::Node(leader));
    run.fault(format!("n{leader} SIGCONT"));
    sleep(Duration::from_secs(2)).await;
    run.finish().await
}

/// The stream leader's nats-server killed, restarted on its store 5 s later.
pub async fn stream_leader_killed(nats: &str) -> Report {
    let mut run = Run::prepare("leader-sigkill", nats, replicas(3)).await;
    let leader = leader(&run, 0).await;
    run.load(None).await;
    sleep(WARM_UP).await;
    run.cluster.kill_node(leader);
    run.fault(format!("n{leader} (stream leader) SIGKILL"));
    sleep(Duration::from_secs(5)).await;
    let via = (leader + 1) % NODES;
    let view = run.cluster.stream_view(via).await;
    run.note(format!(
        "5 s after the kill n{via} saw stream (leader, current followers) {view:?}"
    ));
    run.cluster.restart_node(leader);
    run.fault(format!("n{leader} restarted on its store"));
    sleep(Duration::from_secs(3)).await;
    run.finish().await
}

/// Replica 0's clock 4 s ahead, replica 1's 4 s behind, replica 2's right,
/// all on the same hot sessions: response ids must still rise per session.
pub async fn clock_skew(nats: &str) -> Report {
    let skewed = vec![
        ReplicaSpec {
            clock_offset_ms: 4_000,
            ..ReplicaSpec::default()
        },
        ReplicaSpec {
            clock_offset_ms: -4_000,
            ..ReplicaSpec::default()
        },
        ReplicaSpec::default(),
    ];
    let mut run = Run::prepare("clock-skew", nats, skewed).await;
    run.fault("clocks: r0 +4 s, r1 -4 s, r2 +0 (from the start)");
    run.load(None).await;
    sleep(Duration::from_secs(7)).await;
    let minted = minted_after_last(&run.recorder.ops(), run.cluster.replicas());
    run.note(format!(
        "Starts per replica whose id is the session's previous id + 1 (its clock was behind \
         the session's last id): {minted:?}"
    ));
    run.finish().await
}

/// Per replica: acknowledged, fresh Starts whose response id is exactly
/// one above another acknowledged id of the session, i.e. minted as
/// `last + 1` rather than from the replica's own clock.
fn minted_after_last(ops: &[Op], replicas: usize) -> Vec<usize> {
    let mut ids: HashMap<&str, HashSet<u64>> = HashMap::new();
    for op in ops {
        if let Outcome::Ok(Answer::Started { response, .. }) = &op.outcome {
            ids.entry(&op.session).or_default().insert(*response);
        }
    }
    let mut minted = vec![0; replicas];
    for op in ops {
        if let Outcome::Ok(Answer::Started {
            response,
            replayed: false,
            ..
        }) = &op.outcome
        {
            if ids[op.session.as_str()].contains(&(response - 1)) {
                minted[op.replica] += 1;
            }
        }
    }
    minted
}

/// The broken build: compare-and-set off on every replica, a short
/// contended run. The checks must reject it.
pub async fn broken_build(nats: &str) -> Report {
    let unguarded = vec![
        ReplicaSpec {
            unguarded_writes: true,
            ..ReplicaSpec::default()
        };
        3
    ];
    let mut run = Run::prepare("broken-build", nats, unguarded).await;
    run.fault("RESPCOORD_FAULT_UNGUARDED_WRITES=1 on every replica (from the start)");
    let mut spec = default_spec("broken-build", 3, 7);
    spec.slots = 2;
    spec.think_ms = (1, 5);
    run.load(Some(spec)).await;
    sleep(Duration::from_secs(5)).await;
    run.finish().await
}
