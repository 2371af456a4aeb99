//! Fault runs of the NATS backend: a three-node JetStream cluster and
//! respcoord replicas in their own network namespaces, with partitions,
//! pauses, crashes and clock skew injected while clients on a few hot
//! sessions record every operation; each history is checked for
//! linearizability against the sequential M3 specification and every
//! replica's watch recording against the contract's invariants.
#![allow(dead_code)] // filled in by the harness and the checker

#[path = "faults/history.rs"]
mod history;
#[path = "faults/linearizability.rs"]
mod linearizability;
#[path = "faults/report.rs"]
mod report;
#[path = "faults/shrink.rs"]
mod shrink;
#[path = "faults/watch_check.rs"]
mod watch_check;
#[path = "faults/wgl.rs"]
mod wgl;
