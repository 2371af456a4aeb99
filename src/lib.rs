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
//!   bucket for watches, and share one expirer by lease; `nats/setup.rs`
//!   the connection and bucket, `nats/entry.rs` the stored form,
//!   `nats/locks.rs` and `nats/cache.rs` the per-session locks and written
//!   entries, `nats/mirror.rs` each replica's view and fan-out,
//!   `nats/follow.rs` the stream reader that feeds it, `nats/watch.rs` the
//!   watches, `nats/expiry.rs` the lease-holding expirer, `nats/failure.rs`
//!   what a failed store request means, `nats/observed.rs` its counters.
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
//!   `metrics/process.rs` the process series from procfs.
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
//! (src/bin/respcoord-bench/: `main.rs`, one file per command, `servers.rs`
//! for the in-process empty and respcoord servers, `measure.rs` for the CPU
//! and RSS probes and the statistics; docs/performance.md).

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
