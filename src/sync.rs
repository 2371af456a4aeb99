//! The locks and atomics the registry and the event log are built on: std's,
//! or, under the test-only `shuttle` feature, shuttle's drop-in replacements,
//! so `tests/shuttle_registry.rs` can explore thread interleavings of the real
//! registry code. Nothing else differs between the two builds.

#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::{atomic, Mutex, MutexGuard};

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::{atomic, Mutex, MutexGuard};
