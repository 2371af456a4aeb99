//! The fuzz targets' harness: arbitrary bytes are decoded (prost) as one
//! request message and, if they decode, handed to the real
//! `CoordinatorService` (validation, registry, reply mapping) inside a
//! current-thread tokio runtime, against a registry prepared in a known
//! state. Then:
//!
//! - nothing panics (libFuzzer reports a panic as a crash);
//! - a refused call (any error status) changed nothing: the listing, the
//!   published seq and the session count are as before;
//! - INVALID_ARGUMENT comes exactly when an independent oracle written here
//!   from the contract says a field is malformed, and its message starts with
//!   that field's name; a malformed id is never NOT_FOUND;
//! - every other status and every reply is the one the contract gives for
//!   the prepared state (NOT_FOUND only for unknown sessions,
//!   FAILED_PRECONDITION only for Start on the terminated one, ...).
//!
//! Everything is deterministic: the registry's seqs start at [`BASE_SEQ`], so
//! response ids are the same on every run and a crash input replays exactly.

use prost::Message;
use respcoord::{
    auth::Authenticator,
    grpc::{CoordinatorService, WatchSettings},
    ids::{RequestId, SessionId},
    machine::{FinishStatus, Source},
    proto::v1::{self as pb, response_coordinator_server::ResponseCoordinator},
    registry::{CoordConfig, Registry},
    session::SessionSnapshot,
};
use tokio_util::sync::CancellationToken;
use tonic::{service::Interceptor, Code, Request, Response, Status};

/// Seqs (and so response ids) start just above this.
pub const BASE_SEQ: u64 = 1000;
/// Idle: its response 1001 completed.
pub const IDLE: &str = "idle";
/// Active with [`ACTIVE_RESPONSE`], started with request id [`REQUEST_ID`].
pub const ACTIVE: &str = "active";
pub const ACTIVE_RESPONSE: u64 = 1003;
pub const REQUEST_ID: &str = "r1";
/// Terminated by Shutdown while its response 1004 was live.
pub const TERMINATED: &str = "ended";
const KNOWN: [&str; 3] = [IDLE, ACTIVE, TERMINATED];

/// What a call must leave untouched when it is refused.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    sessions: Vec<SessionSnapshot>,
    published_seq: u64,
    session_count: usize,
}

/// `message` as the server's interceptor passes it on (authentication
/// off): the service refuses a call that did not go through it.
fn intercepted<T>(message: T) -> Request<T> {
    let passed = Authenticator::new(None)
        .call(Request::new(()))
        .expect("auth off lets every call in");
    let (metadata, extensions, ()) = passed.into_parts();
    Request::from_parts(metadata, extensions, message)
}

struct World {
    registry: Registry,
    service: CoordinatorService,
    runtime: tokio::runtime::Runtime,
    /// The session limit is reached: creating a session must fail.
    at_limit: bool,
    before: Observed,
}

impl World {
    /// The prepared state. `at_limit` makes the session limit equal to the
    /// number of prepared sessions.
    fn new(at_limit: bool) -> Self {
        let config = CoordConfig {
            shards: 4,
            max_sessions: KNOWN.len() + usize::from(!at_limit),
            ..CoordConfig::default()
        };
        let registry = Registry::with_base_seq(config, BASE_SEQ);
        let id = |s: &str| SessionId::parse(s).expect("valid");
        let idle = registry
            .start(&id(IDLE), Source::Client, None)
            .expect("start");
        registry
            .finish(&id(IDLE), Some(idle.response), FinishStatus::Completed)
            .expect("finish");
        let request = RequestId::parse_optional(REQUEST_ID).expect("valid");
        let active = registry
            .start(&id(ACTIVE), Source::Vad, request)
            .expect("start");
        assert_eq!(active.response.get(), ACTIVE_RESPONSE);
        registry
            .start(&id(TERMINATED), Source::Client, None)
            .expect("start");
        registry.shutdown(&id(TERMINATED)).expect("shutdown");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let service = CoordinatorService::new(
            registry.clone().into(),
            WatchSettings::default(),
            CancellationToken::new(),
        );
        let before = observe(&registry);
        Self {
            registry,
            service,
            runtime,
            at_limit,
            before,
        }
    }

    fn known(&self, session_id: &str) -> bool {
        KNOWN.contains(&session_id)
    }

    fn state_of(&self, session_id: &str) -> Option<&SessionSnapshot> {
        self.before
            .sessions
            .iter()
            .find(|s| s.session_id.as_str() == session_id)
    }

    /// The checks every call gets. `invalid`: the fields the oracle finds
    /// malformed; `unsure`: fields it cannot judge (a page token), which may
    /// be refused but only by name. `allowed` says which other error codes
    /// the contract gives for this request in the prepared state.
    fn judge<T>(
        &self,
        result: &Result<Response<T>, Status>,
        invalid: &[&str],
        unsure: &[&str],
        allowed: &[Code],
    ) {
        let Err(status) = result else {
            assert!(invalid.is_empty(), "malformed {invalid:?} accepted");
            return;
        };
        assert_eq!(
            observe(&self.registry),
            self.before,
            "a refused call changed state: {status:?}"
        );
        let named = |fields: &[&str]| {
            fields
                .iter()
                .any(|f| status.message().starts_with(&format!("{f}:")))
        };
        if !invalid.is_empty() {
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "malformed {invalid:?} not refused as such: {status:?}"
            );
            assert!(
                named(invalid) || named(unsure),
                "INVALID_ARGUMENT does not name the field: {status:?}"
            );
        } else if status.code() == Code::InvalidArgument {
            assert!(named(unsure), "a well-formed request refused: {status:?}");
        } else {
            assert!(
                allowed.contains(&status.code()),
                "status {status:?} is not one the contract gives here (allowed {allowed:?})"
            );
        }
    }
}

fn observe(registry: &Registry) -> Observed {
    let page = registry.list(1000, None).expect("list");
    Observed {
        sessions: page.sessions,
        published_seq: registry.published_seq(),
        session_count: registry.session_count(),
    }
}

// ---------------------------------------------------------------------------
// The oracle: the contract's validation rules, written independently

fn session_id_ok(raw: &str) -> bool {
    !raw.is_empty()
        && raw.len() <= 256
        && !raw
            .chars()
            .any(|c| matches!(u32::from(c), 0x00..=0x1f | 0x7f..=0x9f))
}

fn source_ok(raw: i32) -> bool {
    (0..=2).contains(&raw)
}

fn fields<'a>(checks: &[(&'a str, bool)]) -> Vec<&'a str> {
    checks
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| *name)
        .collect()
}

/// Whether creating `session_id` is refused for the session limit.
fn creation_refused(world: &World, session_id: &str) -> bool {
    world.at_limit && !world.known(session_id)
}

fn not_found_unless_known(world: &World, session_id: &str) -> Vec<Code> {
    if world.known(session_id) {
        vec![]
    } else {
        vec![Code::NotFound]
    }
}

// ---------------------------------------------------------------------------
// One function per RPC: decode, call, judge

pub fn start(data: &[u8]) {
    let Ok(request) = pb::StartRequest::decode(data) else {
        return;
    };
    let world = World::new(data.len() % 2 == 0);
    let invalid = fields(&[
        ("session_id", session_id_ok(&request.session_id)),
        ("source", source_ok(request.source)),
        ("request_id", request.request_id.len() <= 128),
    ]);
    let id = request.session_id.clone();
    let replay = id == ACTIVE && request.request_id == REQUEST_ID;
    let result = world
        .runtime
        .block_on(world.service.start(intercepted(request)));
    let mut allowed = vec![];
    if id == TERMINATED {
        allowed.push(Code::FailedPrecondition);
    }
    if creation_refused(&world, &id) {
        allowed.push(Code::ResourceExhausted);
    }
    world.judge(&result, &invalid, &[], &allowed);
    if let Ok(reply) = result {
        let reply = reply.into_inner();
        let state = reply.state.expect("state is always set");
        assert_eq!(state.session_id, id);
        assert_eq!(
            reply.replayed, replay,
            "replay iff the request id was applied"
        );
        if replay {
            assert_eq!(reply.response_id, ACTIVE_RESPONSE);
            assert_eq!(reply.superseded_response_id, 0);
            assert_eq!(
                observe(&world.registry),
                world.before,
                "a replay changes nothing"
            );
        } else {
            assert!(reply.response_id > world.before.published_seq, "a fresh id");
            assert_eq!(state.phase(), pb::Phase::Active);
            assert_eq!(state.active_response_id, reply.response_id);
            let superseded = if id == ACTIVE { ACTIVE_RESPONSE } else { 0 };
            assert_eq!(reply.superseded_response_id, superseded);
        }
    }
}

pub fn finish(data: &[u8]) {
    let Ok(request) = pb::FinishRequest::decode(data) else {
        return;
    };
    let world = World::new(data.len() % 2 == 0);
    let invalid = fields(&[
        ("session_id", session_id_ok(&request.session_id)),
        ("status", matches!(request.status, 0 | 1 | 3)),
    ]);
    let id = request.session_id.clone();
    let applies = id == ACTIVE && request.response_id == ACTIVE_RESPONSE;
    let result = world
        .runtime
        .block_on(world.service.finish(intercepted(request)));
    world.judge(&result, &invalid, &[], &not_found_unless_known(&world, &id));
    if let Ok(reply) = result {
        let reply = reply.into_inner();
        assert_eq!(reply.applied, applies, "only the active response finishes");
        let state = reply.state.expect("state is always set");
        if !applies {
            assert_eq!(
                observe(&world.registry),
                world.before,
                "a stale finish changes nothing"
            );
        } else {
            assert_eq!(state.phase(), pb::Phase::Idle);
        }
    }
}

pub fn cancel(data: &[u8]) {
    let Ok(request) = pb::CancelRequest::decode(data) else {
        return;
    };
    let world = World::new(data.len() % 2 == 0);
    let invalid = fields(&[
        ("session_id", session_id_ok(&request.session_id)),
        ("source", source_ok(request.source)),
    ]);
    let id = request.session_id.clone();
    let cancels = id == ACTIVE && matches!(request.if_response_id, 0 | ACTIVE_RESPONSE);
    let result = world
        .runtime
        .block_on(world.service.cancel(intercepted(request)));
    world.judge(&result, &invalid, &[], &not_found_unless_known(&world, &id));
    if let Ok(reply) = result {
        let reply = reply.into_inner();
        let expected = if cancels { ACTIVE_RESPONSE } else { 0 };
        assert_eq!(reply.cancelled_response_id, expected);
        if !cancels {
            assert_eq!(
                observe(&world.registry),
                world.before,
                "a no-op cancel changes nothing"
            );
        }
    }
}

pub fn shutdown(data: &[u8]) {
    let Ok(request) = pb::ShutdownRequest::decode(data) else {
        return;
    };
    let world = World::new(data.len() % 2 == 0);
    let invalid = fields(&[
        ("session_id", session_id_ok(&request.session_id)),
        ("source", source_ok(request.source)),
    ]);
    let id = request.session_id.clone();
    let result = world
        .runtime
        .block_on(world.service.shutdown(intercepted(request)));
    let allowed = if creation_refused(&world, &id) {
        vec![Code::ResourceExhausted]
    } else {
        vec![]
    };
    world.judge(&result, &invalid, &[], &allowed);
    if let Ok(reply) = result {
        let reply = reply.into_inner();
        let state = reply.state.expect("state is always set");
        assert_eq!(state.phase(), pb::Phase::Terminated);
        let expected = if id == ACTIVE { ACTIVE_RESPONSE } else { 0 };
        assert_eq!(reply.cancelled_response_id, expected);
        if id == TERMINATED {
            assert_eq!(
                observe(&world.registry),
                world.before,
                "shutdown is idempotent"
            );
        }
    }
}

pub fn get_state(data: &[u8]) {
    let Ok(request) = pb::GetStateRequest::decode(data) else {
        return;
    };
    let world = World::new(data.len() % 2 == 0);
    let invalid = fields(&[("session_id", session_id_ok(&request.session_id))]);
    let id = request.session_id.clone();
    let result = world
        .runtime
        .block_on(world.service.get_state(intercepted(request)));
    world.judge(&result, &invalid, &[], &not_found_unless_known(&world, &id));
    if let Ok(reply) = result {
        let state = reply.into_inner().state.expect("state is always set");
        let known = world
            .state_of(&id)
            .expect("only known sessions have a state");
        assert_eq!(state.revision, known.revision);
        assert_eq!(state.responses_started, known.responses_started);
        assert_eq!(
            observe(&world.registry),
            world.before,
            "GetState changes nothing"
        );
    }
}

pub fn list_sessions(data: &[u8]) {
    let Ok(request) = pb::ListSessionsRequest::decode(data) else {
        return;
    };
    let world = World::new(data.len() % 2 == 0);
    // Page tokens are opaque: the oracle cannot tell a good one from a bad
    // one, only that a refusal must name it.
    let unsure: &[&str] = if request.page_token.is_empty() {
        &[]
    } else {
        &["page_token"]
    };
    let page_size = match request.page_size {
        0 => 100,
        n => n.min(1000) as usize,
    };
    let first_page = request.page_token.is_empty();
    let result = world
        .runtime
        .block_on(world.service.list_sessions(intercepted(request)));
    world.judge(&result, &[], unsure, &[]);
    if let Ok(reply) = result {
        let reply = reply.into_inner();
        assert!(reply.sessions.len() <= page_size, "page size honoured");
        assert_eq!(reply.seq, world.before.published_seq);
        if first_page {
            assert_eq!(reply.sessions.len(), KNOWN.len().min(page_size));
            if page_size < KNOWN.len() {
                assert!(!reply.next_page_token.is_empty(), "more to list");
            }
            if page_size > KNOWN.len() {
                assert!(reply.next_page_token.is_empty(), "nothing more to list");
            }
        }
        assert_eq!(
            observe(&world.registry),
            world.before,
            "listing changes nothing"
        );
    }
}

pub fn watch(data: &[u8]) {
    let Ok(request) = pb::WatchRequest::decode(data) else {
        return;
    };
    let world = World::new(data.len() % 2 == 0);
    let all = request.session_id.is_empty();
    let invalid = if all {
        fields(&[("after_revision", request.after_revision.is_none())])
    } else {
        fields(&[
            ("session_id", session_id_ok(&request.session_id)),
            ("after_seq", request.after_seq.is_none()),
        ])
    };
    // Resuming a watch-all from before this coordinator's first event (but
    // not 0, which means "from the first") is OUT_OF_RANGE; nothing else here.
    let allowed = match request.after_seq {
        Some(after) if all && after != 0 && after < BASE_SEQ => vec![Code::OutOfRange],
        _ => vec![],
    };
    let result = world
        .runtime
        .block_on(world.service.watch(intercepted(request)));
    world.judge(&result, &invalid, &[], &allowed);
    if result.is_ok() {
        assert_eq!(
            observe(&world.registry),
            world.before,
            "watching changes nothing"
        );
    }
    // Dropping the runtime drops the watch's delivery task with it.
}

// ---------------------------------------------------------------------------
// Seeds

/// A few valid, encoded requests per target: the committed seed corpus
/// (`cargo run --example seed_corpus` writes them).
pub fn seeds() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    fn enc(message: impl Message) -> Vec<u8> {
        message.encode_to_vec()
    }
    let start = |session: &str, source: i32, request: &str| {
        enc(pb::StartRequest {
            session_id: session.into(),
            source,
            request_id: request.into(),
        })
    };
    let finish = |session: &str, response_id: u64, status: i32| {
        enc(pb::FinishRequest {
            session_id: session.into(),
            response_id,
            status,
        })
    };
    let cancel = |session: &str, source: i32, if_response_id: u64| {
        enc(pb::CancelRequest {
            session_id: session.into(),
            source,
            if_response_id,
        })
    };
    let shutdown = |session: &str, source: i32| {
        enc(pb::ShutdownRequest {
            session_id: session.into(),
            source,
        })
    };
    let get_state = |session: &str| {
        enc(pb::GetStateRequest {
            session_id: session.into(),
        })
    };
    let list = |page_size: u32, page_token: &str| {
        enc(pb::ListSessionsRequest {
            page_size,
            page_token: page_token.into(),
        })
    };
    let watch = |session: &str, after_revision: Option<u64>, after_seq: Option<u64>| {
        enc(pb::WatchRequest {
            session_id: session.into(),
            after_revision,
            after_seq,
        })
    };
    let token = {
        let registry = Registry::with_base_seq(
            CoordConfig {
                shards: 4,
                ..CoordConfig::default()
            },
            BASE_SEQ,
        );
        for s in ["a", "b", "c", "d", "e", "f"] {
            registry
                .shutdown(&SessionId::parse(s).expect("valid"))
                .expect("shutdown");
        }
        let page = registry.list(1, None).expect("list");
        page.next.expect("a second page").encode()
    };
    vec![
        (
            "start",
            vec![
                start(IDLE, 1, ""),
                start(ACTIVE, 2, "r2"),
                start(ACTIVE, 1, REQUEST_ID),
                start(TERMINATED, 1, ""),
                start("new-session", 0, "req"),
            ],
        ),
        (
            "finish",
            vec![
                finish(ACTIVE, ACTIVE_RESPONSE, 1),
                finish(ACTIVE, ACTIVE_RESPONSE, 3),
                finish(IDLE, 1001, 0),
                finish("missing", 5, 1),
            ],
        ),
        (
            "cancel",
            vec![
                cancel(ACTIVE, 1, 0),
                cancel(ACTIVE, 2, ACTIVE_RESPONSE),
                cancel(ACTIVE, 0, 1001),
                cancel(TERMINATED, 0, 0),
            ],
        ),
        (
            "shutdown",
            vec![
                shutdown(ACTIVE, 2),
                shutdown(IDLE, 1),
                shutdown(TERMINATED, 0),
                shutdown("new-session", 0),
            ],
        ),
        (
            "get_state",
            vec![
                get_state(ACTIVE),
                get_state(TERMINATED),
                get_state("missing"),
            ],
        ),
        (
            "list_sessions",
            vec![list(0, ""), list(1, ""), list(2, &token)],
        ),
        (
            "watch",
            vec![
                watch(ACTIVE, Some(0), None),
                watch(TERMINATED, Some(1), None),
                watch(IDLE, None, None),
                watch("", None, Some(0)),
                watch("", None, Some(BASE_SEQ + 2)),
                watch("", None, None),
            ],
        ),
    ]
}

#[cfg(test)]
mod tests {
    /// The input the smoke run found once `ShutdownRequest.source` existed:
    /// source 16, which the service refuses as INVALID_ARGUMENT naming
    /// `source`, and which the target must expect.
    #[test]
    fn a_shutdown_with_an_out_of_range_source_is_refused_by_name() {
        super::shutdown(&[
            0x10, 0x10, 0x30, 0x23, 0x0a, 0x05, b'e', b'n', b'd', b'e', b'd',
        ]);
    }

    /// Every seed runs through its target cleanly (no fuzzer needed).
    #[test]
    fn seeds_pass_their_targets() {
        for (target, inputs) in super::seeds() {
            let run: fn(&[u8]) = match target {
                "start" => super::start,
                "finish" => super::finish,
                "cancel" => super::cancel,
                "shutdown" => super::shutdown,
                "get_state" => super::get_state,
                "list_sessions" => super::list_sessions,
                "watch" => super::watch,
                other => panic!("unknown target {other}"),
            };
            for input in inputs {
                run(&input);
                // And with the other parity (session limit reached or not).
                // (An unknown field 7 = 0, its varint padded to 2 bytes.)
                let mut longer = input.clone();
                longer.extend_from_slice(&[0x38, 0x80, 0x00]);
                run(&longer);
            }
        }
    }
}
