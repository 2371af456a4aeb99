//! respcoord: the one authoritative response coordinator for realtime
//! voice/LLM gateways. Per session: at most one live response, exactly one
//! terminal per started response, nothing starts after teardown, and every
//! change is streamed to watchers.
//!
//! # Layout
//!
//! Pure core (no I/O, no async, no clock):
//! - [`machine`] — machine M3, a total transition function
//!   `(Phase, Call) -> (Phase, events, outcome)`; the call and the outcome
//!   are the backends' call and reply.
//! - [`session`] — one session's record around the machine: revisions, retained
//!   events, request-id replay, idle/tombstone deadlines (time is an argument).
//! - [`decision`] — the whole of a call, decided once for both backends and
//!   in two phases: `decide` (and `decide_expiry`) says from the record, the
//!   call and the time what the call answers without a change (not found,
//!   session limit, replay, no change) or hands back a change ready to apply;
//!   the backend takes its own locks, makes the stamp (seqs, time, minted
//!   id) and applies it. The core never calls back into the backend. The
//!   replies (`Started`, `Changed`) are read off the decision.
//! - [`event`] — the lifecycle event and the one place events are built
//!   (`Change::events`, from a decision or a stored entry).
//! - [`ids`] — session, request and response ids, valid by construction;
//!   a caller's session scope (all sessions, or an id prefix). They live in
//!   the `respcoord-proto` crate (`proto/`) with the wire types, so the
//!   Rust client enforces the same rules without building the server.
//!
//! Shell:
//! - [`backend`] — the seam the gRPC layer calls: the memory registry or the
//!   NATS-backed cluster; the only module that names both.
//! - [`shared`] — what both backends share so neither imports the other: the
//!   tunables, the clock, the listing's page and tokens.
//! - [`registry`] — the sharded map of session actors, applying decisions
//!   under the shard lock (the embedded in-memory backend);
//!   `registry/expiry.rs` the expiry index and task, `registry/listing.rs`
//!   ListSessions, `registry/watch.rs` its watches.
//! - [`nats`] — the NATS JetStream backend: a key-value bucket is the
//!   authority, replicas apply decisions with compare-and-set, follow the
//!   bucket for watches, and share one expirer by lease;
//!   `nats/attempts.rs` a call's attempts as a pure machine (the whole
//!   per-call policy: what to ask the store next, when an answer stands),
//!   `nats/call.rs` the decisions and the loop that drives the machine,
//!   `nats/store.rs` the bucket requests a call makes behind one interface
//!   (async-nats, or a wrapper that injects a fault),
//!   `nats/requests.rs` the store requests each makes (read,
//!   compare-and-set write, purge, quorum point), `nats/setup.rs` the
//!   connection and bucket, `nats/entry.rs` the stored form,
//!   `nats/locks.rs` and `nats/cache.rs` the per-session locks and written
//!   entries, `nats/mirror.rs` each replica's view and fan-out,
//!   `nats/follow.rs` the stream reader that feeds it, `nats/watch.rs` the
//!   watches, `nats/expiry.rs` the lease-holding expirer, `nats/failure.rs`
//!   what a failed store request means, `nats/observed.rs` its counters,
//!   `nats/timings.rs` every retry count, pause, timeout and bound in one
//!   table.
//! - [`events`] — the event log: seq numbering, retention, fan-out to
//!   watchers, and the one backlog-to-live handover rule.
//! - [`stats`] — counters of what a backend did (per shard, summed on read),
//!   counted from decisions in one place.
//! - [`grpc`] — proto <-> domain mapping and validation, the error-to-status
//!   mapping, the service, watch delivery, the per-RPC observation layer
//!   (span, W3C trace context, call metrics, debug log).
//! - [`server`] — assembly (health, reflection, expiry task, graceful
//!   shutdown, limits: deadlines, message size, HTTP/2); `server/tls.rs`
//!   reads and checks the PEM files, `server/guard.rs` is the load-shedding
//!   middleware over the shared concurrency limit.
//! - [`auth`] — bearer tokens from a file, each with a session scope; the
//!   interceptor that authenticates calls.
//! - [`watchers`] — open-watch counters: the watcher limit, and what the
//!   metrics report about watches.
//! - [`metrics`] — OpenTelemetry instruments, Prometheus `/metrics` with
//!   `/healthz` and `/readyz` on the metrics port, OTLP metric export;
//!   `metrics/process.rs` the process series from procfs; `metrics/calls.rs`
//!   the call durations, counted in a table of atomics read at scrape time.
//! - [`web`] — the read-only web view (`--web-ui`): the sessions and one
//!   session's timeline in a browser, over the service's own calls;
//!   `web/feed.rs` relays watches as server-sent events.
//! - [`config`] — flags and `RESPCOORD_*` environment variables.
//! - [`telemetry`] — logging; OTLP trace export and W3C trace context.
//! - [`error`] — the typed errors every layer shares.
//! - [`proto`] — the generated wire types (the `respcoord-proto` crate).
//!
//! The gateway client library and `respcoordctl` are a crate of their own,
//! `respcoord-client` (`clients/rust`); this crate never depends on it.
//!
//! Binaries: `respcoord` (src/main.rs); `respcoord-bench`
//! (src/bin/respcoord-bench/: `main.rs`, one file per command, a larger
//! command's parts in a directory of its own, such as `failover/`'s
//! nats-server cluster, gateways and report; `servers.rs` for the
//! in-process empty and respcoord servers, `measure.rs` for the CPU and RSS
//! probes and the statistics; docs/performance.md).
//!
//! # Life of a Start
//!
//! One Start, hop by hop. Each hop names a file, then items in it, in code
//! spans; `tests/layout.rs` checks that every item is defined in the file
//! named before it, so a rename that leaves this text behind fails there.
//!
//! Both backends, in:
//! 1. `grpc/service.rs` `CoordinatorService::start`: the RPC. The request
//!    becomes domain types in `grpc/convert.rs` `start` (a bad field is
//!    INVALID_ARGUMENT naming it); the caller's scope is checked.
//! 2. `backend.rs` `Coordinator::start`: the one seam that names both
//!    backends.
//!
//! Memory backend:
//! 3. `registry.rs` `Registry::start`, then `Inner::call`: the session's
//!    shard locked; the session found, or a fresh one if there is room.
//! 4. `decision.rs` `decide`: pure. A replay, or a call that changes
//!    nothing, is answered here; anything else comes back as a
//!    `ReadyChange`.
//! 5. `registry.rs` `Inner::settle`: the event log's lock taken (in
//!    `events.rs` `EventLog::begin_append`), the stamp made from its next
//!    seq (`registry.rs` `Inner::stamp`), and the change applied:
//!    `decision.rs` `ReadyChange::apply` runs `session.rs` `Session::apply`,
//!    which runs `machine.rs` `transition`.
//! 6. `registry.rs` `Inner::carry_out`: the events built (`event.rs`
//!    `Change::events`) and published (`events.rs` `Append::publish`) to
//!    the watch-all feed and the session's feed (`events/feed.rs`
//!    `Feed::send`); the decision counted (`stats.rs` `CoordStats::record`);
//!    both locks released.
//!
//! NATS backend:
//! 3. `nats.rs` `NatsCoordinator::start`, then `nats/call.rs` `Inner::call`:
//!    the replica's per-session lock (`nats/locks.rs` `KeyedLocks`), then
//!    the call's attempts: `nats/call.rs` `Inner::compare_and_set` drives
//!    the pure machine `nats/attempts.rs` `CallAttempts`, which says what
//!    to do next. The first attempt decides on the entry this replica last
//!    wrote (`nats/cache.rs` `EntryCache`), later ones on a read of the key
//!    (`nats/requests.rs` `Inner::read`).
//! 4. `decision.rs` `decide`, as above, settled at once with the replica's
//!    own stamp (`Decided::settle`), in `nats/call.rs` `Inner::decide_call`.
//! 5. `nats/entry.rs` `Entry`: the record and its events' kinds, encoded.
//!    `nats/requests.rs` `Inner::write` writes it with compare-and-set over
//!    the revision read, retried through `nats/failure.rs` `Patience`; a
//!    conflict decides again; for a write whose answer was lost the
//!    machine asks for the key's next message (`nats/landed.rs`
//!    `Inner::successor`). An answer that writes nothing stands only once
//!    confirmed at a quorum point (`nats/requests.rs` `Inner::confirmed`,
//!    `nats/quorum.rs` `QuorumPoints`), or, after one went unconfirmed, by
//!    writing its entry back (`nats/attempts.rs` `CallAttempts::decided`).
//!    How many attempts, and how long each wait, is in one table
//!    (`nats/timings.rs`).
//! 6. Every replica's follower (`nats/follow.rs` `Follower`) reads the
//!    write from the stream; `nats/mirror.rs` `Mirror::apply` updates the
//!    replica's view and publishes the events (`events.rs`
//!    `EventLog::publish`) to the same feeds.
//!
//! Both backends, out:
//! 7. `decision.rs` `Decision::started` reads the reply off the decision;
//!    a refusal, an `error.rs` `CoordError`, is mapped to its status code in
//!    one place (`grpc/status.rs`).
//! 8. A watcher's response stream (`grpc/watch.rs` `Watch`) is woken by the
//!    feed and sends the events it reads (`events.rs`
//!    `Subscription::poll_next`).

pub mod auth;
pub mod backend;
pub mod config;
pub mod decision;
pub mod error;
pub mod event;
pub mod events;
pub mod grpc;
pub use respcoord_proto::ids;
pub mod machine;
pub mod metrics;
pub mod nats;
pub use respcoord_proto as proto;
pub mod registry;
pub mod server;
pub mod session;
pub mod shared;
pub mod stats;
mod sync;
pub mod telemetry;
pub mod watchers;
pub mod web;
