//! Fault runs of the NATS backend: a three-node JetStream cluster and
//! respcoord replicas in their own network namespaces, with partitions,
//! pauses, crashes and clock skew injected while clients on a few hot
//! sessions record every operation; each history is checked for
//! linearizability against the sequential M3 specification and every
//! replica's watch recording against the contract's invariants.
#![allow(dead_code)] // filled in by the harness and the checker

#[path = "faults/cluster.rs"]
mod cluster;
#[path = "faults/history.rs"]
mod history;
#[path = "faults/linearizability.rs"]
mod linearizability;
#[path = "faults/netns.rs"]
mod netns;
#[path = "faults/watch_check.rs"]
mod watch_check;

/// The server binary Cargo built for this test run (with `fault-injection`).
pub const RESPCOORD_BIN: &str = env!("CARGO_BIN_EXE_respcoord");

/// The nats-server to run, or why the fault runs cannot run here (printed
/// as "skipped: ..."; the test then passes vacuously).
fn environment() -> Result<String, String> {
    if let Some(reason) = netns::unavailable() {
        return Err(reason);
    }
    let Some(binary) = cluster::nats_server_binary() else {
        return Err(
            "no nats-server 2.10 (set RESPCOORD_TEST_CLUSTER_NATS_SERVER, \
                    e.g. to the path scripts/nats-cluster-server.sh prints)"
                .into(),
        );
    };
    match cluster::nats_server_version(&binary) {
        None => Err(format!("{binary} does not run")),
        Some(version) if version < (2, 10, 0) => Err(format!(
            "{binary} is {version:?}; the fault runs need nats-server 2.10"
        )),
        Some(_) => Ok(binary),
    }
}

#[test]
fn topology_smoke() {
    let binary = match environment() {
        Ok(binary) => binary,
        Err(reason) => {
            eprintln!("skipped: {reason}");
            return;
        }
    };
    netns::delete_stale();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let began = std::time::Instant::now();
        let mut c = cluster::Cluster::start(&binary, vec![Default::default(); 3])
            .await
            .expect("cluster");
        eprintln!("serving after {:?}", began.elapsed());
        let leader = c
            .settled_leader(0, std::time::Duration::from_secs(20))
            .await;
        eprintln!("leader {leader:?} after {:?}", began.elapsed());
        c.cut_replica_from_nats(1);
        eprintln!("cut: {:?}", c.net.cut());
        c.heal();
    });
}
