//! The load of a fault run: gateway-like clients racing on a few hot
//! sessions through every replica, each call recorded as the client saw it
//! (`history::Recorder`), and one watch-all per replica recording every
//! event it delivers.
//!
//! Half the clients use the Rust client library (`respcoord-client`, one
//! attempt per call, so every attempt is its own recorded operation), half
//! the raw generated stubs. Calls: Start with a request id (sometimes sent
//! again with the same id, always after an unknown outcome), Finish of the
//! id the client got or of an older one, Cancel with and without
//! `if_response_id`, GetState, and rarely Shutdown, after which the slot
//! moves on to a fresh session. Every call has a deadline (a timeout is an
//! unknown outcome); a client backs off after a call that did not succeed,
//! as a gateway would.
//!
//! The watch-all recorders are in `watching.rs`.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use respcoord::proto::v1 as pb;
use respcoord_client::{self as client, ClientError, ConnectOptions, RetryPolicy};
use tonic::{transport::Endpoint, Code, Request, Status};

use crate::{
    cluster::RawClient,
    history::{Answer, Call, Outcome, Recorder},
};

/// One attempt of one call may take this long; past it the outcome is unknown.
pub const CALL_DEADLINE: Duration = Duration::from_millis(1500);

/// A small deterministic generator (xorshift64*), so a seed reproduces a
/// run's choices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// What load to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub clients: usize,
    /// Hot sessions at any time.
    pub slots: usize,
    /// Session names are `<prefix>-<slot>-<generation>`.
    pub prefix: String,
    /// Client `c` calls replica `replicas[c % replicas.len()]`.
    pub replicas: Vec<usize>,
    /// Pause between a client's calls (drawn from this range, ms).
    pub think_ms: (u64, u64),
    pub seed: u64,
}

/// The sessions the clients share: a Shutdown moves its slot on.
#[derive(Default)]
struct Slots(Mutex<Vec<(String, u32)>>);

impl Slots {
    fn new(prefix: &str, n: usize) -> Self {
        Self(Mutex::new(
            (0..n).map(|k| (format!("{prefix}-{k}-0"), 0)).collect(),
        ))
    }

    fn get(&self, slot: usize) -> String {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)[slot]
            .0
            .clone()
    }

    /// After a Shutdown of `session`: the slot's next session.
    fn retire(&self, slot: usize, session: &str, prefix: &str) {
        let mut slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (name, generation) = &mut slots[slot];
        if name == session {
            *generation += 1;
            *name = format!("{prefix}-{slot}-{generation}");
        }
    }
}

/// The running clients.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts `spec.clients` clients against `endpoints` (one per replica).
    pub fn start(spec: &Spec, endpoints: &[String], recorder: &Recorder) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let slots = Arc::new(Slots::new(&spec.prefix, spec.slots));
        let tasks = (0..spec.clients)
            .map(|c| {
                let replica = spec.replicas[c % spec.replicas.len()];
                let conn = Conn::new(c, &endpoints[replica]);
                let worker = Worker {
                    id: c,
                    replica,
                    conn,
                    recorder: recorder.clone(),
                    slots: Arc::clone(&slots),
                    spec: spec.clone(),
                    rng: Rng::new(spec.seed.wrapping_mul(31).wrapping_add(c as u64)),
                    got: HashMap::new(),
                    calls: 0,
                };
                tokio::spawn(worker.run(Arc::clone(&stop)))
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops every client after its call in flight (each ends within a
    /// call deadline plus a pause).
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// A client's connection: the library or the raw stubs.
#[derive(Clone)]
pub enum Conn {
    Library(client::Client),
    Raw(RawClient),
}

impl Conn {
    /// Even clients use the library, odd ones the raw stubs.
    pub fn new(client: usize, endpoint: &str) -> Self {
        if client.is_multiple_of(2) {
            let mut options = ConnectOptions::new(endpoint).with_retry(RetryPolicy {
                attempt_timeout: CALL_DEADLINE,
                deadline: CALL_DEADLINE,
                max_attempts: 1,
                ..RetryPolicy::default()
            });
            options.connect_timeout = Duration::from_secs(1);
            Conn::Library(client::Client::connect_lazy(options).expect("a client endpoint"))
        } else {
            Conn::Raw(raw_client(endpoint))
        }
    }

    /// Sends `call` once and says how it ended.
    pub async fn perform(&self, session: &str, call: &Call) -> Outcome {
        let attempt = async {
            match self {
                Conn::Library(c) => library_call(c, session, call).await,
                Conn::Raw(c) => raw_call(c.clone(), session, call).await,
            }
        };
        match tokio::time::timeout(CALL_DEADLINE + Duration::from_millis(500), attempt).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Unknown(Code::DeadlineExceeded),
        }
    }
}

pub fn raw_client(endpoint: &str) -> RawClient {
    let channel = Endpoint::from_shared(endpoint.to_owned())
        .expect("a replica endpoint")
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .connect_lazy();
    RawClient::new(channel)
}

fn nonzero(id: u64) -> Option<u64> {
    (id != 0).then_some(id)
}

fn state_answer(state: Option<pb::SessionState>) -> Answer {
    let state = state.unwrap_or_default();
    Answer::State {
        active: nonzero(state.active_response_id),
        terminated: state.phase() == pb::Phase::Terminated,
        revision: state.revision,
        responses_started: state.responses_started,
    }
}

fn library_outcome<T>(result: Result<T, ClientError>, answer: impl FnOnce(T) -> Answer) -> Outcome {
    match result {
        Ok(reply) => Outcome::Ok(answer(reply)),
        Err(ClientError::Status(status)) => Outcome::from_status(&status),
        Err(ClientError::InvalidArgument { .. } | ClientError::Config(_)) => {
            Outcome::Failed(Code::InvalidArgument)
        }
        // The channel never connected: the call may not have been sent,
        // but an earlier connection's request could still be in flight.
        Err(ClientError::Connect(_)) => Outcome::Unknown(Code::Unavailable),
    }
}

async fn library_call(c: &client::Client, session: &str, call: &Call) -> Outcome {
    match call {
        Call::Start { request_id } => {
            // The library always sends a request id; a Start without one is
            // the raw clients' to make.
            let id = request_id.as_deref();
            library_outcome(c.start_call(session, pb::Source::Client, id).await, |r| {
                Answer::Started {
                    response: r.response_id,
                    superseded: nonzero(r.superseded_response_id),
                    replayed: r.replayed,
                }
            })
        }
        Call::Finish { response } => library_outcome(
            c.finish_call(
                session,
                response.unwrap_or(0),
                pb::TerminalStatus::Completed,
            )
            .await,
            |(r, _)| Answer::Finished { applied: r.applied },
        ),
        Call::Cancel { only_if } => library_outcome(
            c.cancel_call(session, pb::Source::Vad, *only_if).await,
            |r| Answer::Cancelled {
                cancelled: nonzero(r.cancelled_response_id),
            },
        ),
        Call::Shutdown => library_outcome(
            c.shutdown_call(session, respcoord_client::Source::Unspecified)
                .await,
            |r| Answer::ShutDown {
                cancelled: nonzero(r.cancelled_response_id),
            },
        ),
        Call::GetState => library_outcome(c.get_state(session).await, |s| state_answer(Some(s))),
    }
}

fn with_deadline<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(CALL_DEADLINE);
    request
}

fn raw_outcome<T>(
    result: Result<tonic::Response<T>, Status>,
    answer: impl FnOnce(T) -> Answer,
) -> Outcome {
    match result {
        Ok(reply) => Outcome::Ok(answer(reply.into_inner())),
        Err(status) => Outcome::from_status(&status),
    }
}

async fn raw_call(mut c: RawClient, session: &str, call: &Call) -> Outcome {
    let session_id = session.to_owned();
    match call {
        Call::Start { request_id } => raw_outcome(
            c.start(with_deadline(pb::StartRequest {
                session_id,
                source: pb::Source::Client.into(),
                request_id: request_id.clone().unwrap_or_default(),
            }))
            .await,
            |r| Answer::Started {
                response: r.response_id,
                superseded: nonzero(r.superseded_response_id),
                replayed: r.replayed,
            },
        ),
        Call::Finish { response } => raw_outcome(
            c.finish(with_deadline(pb::FinishRequest {
                session_id,
                response_id: response.unwrap_or(0),
                status: pb::TerminalStatus::Failed.into(),
            }))
            .await,
            |r| Answer::Finished { applied: r.applied },
        ),
        Call::Cancel { only_if } => raw_outcome(
            c.cancel(with_deadline(pb::CancelRequest {
                session_id,
                source: pb::Source::Client.into(),
                if_response_id: only_if.unwrap_or(0),
            }))
            .await,
            |r| Answer::Cancelled {
                cancelled: nonzero(r.cancelled_response_id),
            },
        ),
        Call::Shutdown => raw_outcome(
            c.shutdown(with_deadline(pb::ShutdownRequest {
                session_id,
                source: pb::Source::Unspecified.into(),
            }))
            .await,
            |r| Answer::ShutDown {
                cancelled: nonzero(r.cancelled_response_id),
            },
        ),
        Call::GetState => raw_outcome(
            c.get_state(with_deadline(pb::GetStateRequest { session_id }))
                .await,
            |r| state_answer(r.state),
        ),
    }
}

/// One client's loop.
struct Worker {
    id: usize,
    replica: usize,
    conn: Conn,
    recorder: Recorder,
    slots: Arc<Slots>,
    spec: Spec,
    rng: Rng,
    /// Response ids this client was given, per session, newest last.
    got: HashMap<String, Vec<u64>>,
    calls: u64,
}

impl Worker {
    async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            let slot = self.rng.below(self.spec.slots as u64) as usize;
            let session = self.slots.get(slot);
            let call = self.choose(&session);
            let outcome = self.send(&session, &call).await;
            let succeeded = matches!(outcome, Outcome::Ok(_));
            match (&call, &outcome) {
                (Call::Start { request_id }, Outcome::Unknown(_)) => {
                    // A gateway that lost the reply asks again, same id.
                    self.pause(false).await;
                    let again = Call::Start {
                        request_id: request_id.clone(),
                    };
                    self.send(&session, &again).await;
                }
                (Call::Start { request_id }, Outcome::Ok(_)) if self.rng.below(5) == 0 => {
                    let again = Call::Start {
                        request_id: request_id.clone(),
                    };
                    self.send(&session, &again).await;
                }
                (Call::Shutdown, outcome) if !matches!(outcome, Outcome::Failed(_)) => {
                    self.slots.retire(slot, &session, &self.spec.prefix);
                }
                _ => {}
            }
            self.pause(succeeded).await;
        }
    }

    async fn pause(&mut self, succeeded: bool) {
        let pause = if succeeded {
            let (lo, hi) = self.spec.think_ms;
            self.rng.millis(lo, hi)
        } else {
            self.rng.millis(100, 250)
        };
        tokio::time::sleep(pause).await;
    }

    fn choose(&mut self, session: &str) -> Call {
        let mine = self.got.get(session).map(Vec::as_slice).unwrap_or(&[]);
        let last = mine.last().copied();
        match self.rng.below(1000) {
            0..=399 => {
                self.calls += 1;
                let without_id = matches!(self.conn, Conn::Raw(_)) && self.rng.below(10) == 0;
                Call::Start {
                    request_id: (!without_id).then(|| format!("c{}-{}", self.id, self.calls)),
                }
            }
            400..=699 => {
                let response = if mine.len() > 1 && self.rng.below(4) == 0 {
                    // A stale one: an earlier response of this session.
                    Some(mine[self.rng.below(mine.len() as u64 - 1) as usize])
                } else {
                    last
                };
                Call::Finish { response }
            }
            700..=849 => Call::Cancel {
                only_if: if self.rng.below(2) == 0 { last } else { None },
            },
            850..=995 => Call::GetState,
            _ => Call::Shutdown,
        }
    }

    async fn send(&mut self, session: &str, call: &Call) -> Outcome {
        let pending = self
            .recorder
            .invoke(self.id, self.replica, session, call.clone());
        let outcome = self.conn.perform(session, call).await;
        if let Outcome::Ok(Answer::Started { response, .. }) = &outcome {
            let mine = self.got.entry(session.to_owned()).or_default();
            if mine.last() != Some(response) {
                mine.push(*response);
                if mine.len() > 8 {
                    mine.remove(0);
                }
            }
        }
        pending.complete(outcome.clone());
        outcome
    }
}
