//! respcoord: the one authoritative response coordinator for realtime
//! voice/LLM gateways. Per session: at most one live response, exactly one
//! terminal per started response, nothing starts after teardown, and every
//! change is streamed to watchers.
//!
//! # Layout
//!
//! Pure core (no I/O, no async, no clock):
//! - [`machine`] — machine M3, a total transition function
//!   `(Phase, Input) -> (Phase, events, outcome)`.
//! - [`session`] — one session's record around the machine: revisions, retained
//!   events, request-id replay, idle/tombstone deadlines (time is an argument).
//! - [`ids`] — session, request and response ids, valid by construction.
//!
//! Shell:
//! - [`registry`] — the sharded map of session actors; the expiry index.
//! - [`events`] — the event log: seq numbering, retention, fan-out to watchers.
//! - [`grpc`] — proto <-> domain mapping and validation, the error-to-status
//!   mapping, the service, watch delivery.
//! - [`server`] — assembly (health, reflection, expiry task, graceful shutdown).
//! - [`config`] — flags and `RESPCOORD_*` environment variables.
//! - [`telemetry`] — logging.
//! - [`error`] — the typed errors every layer shares.
//! - [`proto`] — generated wire types.

pub mod config;
pub mod error;
pub mod events;
pub mod grpc;
pub mod ids;
pub mod machine;
pub mod proto;
pub mod registry;
pub mod server;
pub mod session;
mod sync;
pub mod telemetry;
