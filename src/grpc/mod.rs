//! The gRPC edge: proto <-> domain mapping with validation (`convert`), the
//! one error-to-status mapping (`status`), the service implementation
//! (`service`), watch stream delivery (`watch`) and the per-RPC observation
//! layer (`observe`: span, trace context, call metrics). Nothing here decides a
//! transition: every call is validated, handed to the backend
//! (`backend::Coordinator`: the memory registry or NATS), and its answer
//! translated back.

pub mod convert;
pub mod observe;
pub mod service;
pub mod status;
pub mod watch;

pub use service::{CoordinatorService, WatchSettings};
