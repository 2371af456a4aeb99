//! What a fault run records: every operation a client made, as the client
//! saw it (invoked, then answered, failed or unknown), and every event each
//! replica's watch delivered. The checker (`linearizability.rs`) judges
//! these; the harness (`cluster.rs`, `schedules.rs`) fills them.
//!
//! Times are nanoseconds since the run's start on the test process's
//! monotonic clock, so invocations and completions of different clients
//! order correctly.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use tonic::Code;

/// A call as a client sent it. Response ids are the wire's (`0` on the wire
/// is `None` here).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Start { request_id: Option<String> },
    Finish { response: Option<u64> },
    Cancel { only_if: Option<u64> },
    Shutdown,
    GetState,
}

/// What an answered call said.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    Started {
        response: u64,
        superseded: Option<u64>,
        replayed: bool,
    },
    Finished {
        applied: bool,
    },
    Cancelled {
        cancelled: Option<u64>,
    },
    ShutDown {
        cancelled: Option<u64>,
    },
    /// GetState's snapshot.
    State {
        active: Option<u64>,
        terminated: bool,
        revision: u64,
        responses_started: u64,
    },
    /// FAILED_PRECONDITION: a Start on a terminated session.
    StartRefused,
    /// NOT_FOUND: the session does not exist (no Start created it yet).
    NotFound,
}

/// How a call ended for the client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok(Answer),
    /// Refused before it could apply (INVALID_ARGUMENT, ABORTED after the
    /// compare-and-set attempts, RESOURCE_EXHAUSTED, auth): it did not happen.
    Failed(Code),
    /// Timed out, UNAVAILABLE, CANCELLED, connection lost, or never
    /// answered: it may or may not have applied.
    Unknown(Code),
}

impl Outcome {
    /// A gRPC error as an outcome: a definite failure only where the server
    /// is known to have changed nothing; otherwise unknown.
    pub fn from_status(status: &tonic::Status) -> Self {
        match status.code() {
            Code::NotFound => Outcome::Ok(Answer::NotFound),
            Code::FailedPrecondition => Outcome::Ok(Answer::StartRefused),
            code @ (Code::InvalidArgument
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Unauthenticated
            | Code::PermissionDenied) => Outcome::Failed(code),
            code => Outcome::Unknown(code),
        }
    }
}

/// One operation: who made it, on which session, when, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: usize,
    /// Which replica the client sent it to (index into the run's replicas).
    pub replica: usize,
    pub session: String,
    pub call: Call,
    pub invoked: u64,
    /// `None`: the run ended with the call still in flight (unknown).
    pub completed: Option<u64>,
    pub outcome: Outcome,
}

/// One lifecycle event as a replica's watch delivered it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WatchedEvent {
    pub session: String,
    pub revision: u64,
    pub seq: u64,
    pub kind: EventKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Started { response: u64 },
    CancelRequested { response: u64 },
    Ended { response: u64 },
    Terminated,
}

/// Collects a run's operations from many client tasks.
#[derive(Clone)]
pub struct Recorder {
    epoch: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            ops: Arc::default(),
        }
    }

    /// Nanoseconds since the run began.
    pub fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Marks a call as invoked; complete the returned pending op when it
    /// ends. A pending op dropped without completing is recorded unknown
    /// (in flight at the end of the run).
    pub fn invoke(&self, client: usize, replica: usize, session: &str, call: Call) -> Pending {
        Pending {
            recorder: self.clone(),
            op: Some(Op {
                client,
                replica,
                session: session.to_owned(),
                call,
                invoked: self.now(),
                completed: None,
                outcome: Outcome::Unknown(Code::Unknown),
            }),
        }
    }

    /// Every operation recorded so far, in completion order.
    pub fn ops(&self) -> Vec<Op> {
        self.ops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn push(&self, op: Op) {
        self.ops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(op);
    }
}

/// A call in flight.
pub struct Pending {
    recorder: Recorder,
    op: Option<Op>,
}

impl Pending {
    pub fn complete(mut self, outcome: Outcome) {
        if let Some(mut op) = self.op.take() {
            op.completed = Some(self.recorder.now());
            op.outcome = outcome;
            self.recorder.push(op);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            self.recorder.push(op);
        }
    }
}
