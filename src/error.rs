//! The coordinator's typed errors. The gRPC layer maps each variant to one
//! status code in one place (`grpc::status`); nothing else picks codes.

use crate::ids::SessionId;

/// A watch ended because its watcher fell behind the live stream. Defined
/// here, with the error that carries it, so `error` imports nothing but ids;
/// the event log (`events`) re-exports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged {
    /// How many events it missed.
    pub missed: u64,
    /// The last event it was given (resume after this), if any.
    pub last_revision: Option<u64>,
    pub last_seq: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordError {
    /// Bad input, refused before anything changed. `field` is the request
    /// field's wire name.
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },

    #[error("session {0:?} not found")]
    SessionNotFound(SessionId),

    #[error("session {0:?} is terminated: no response starts after teardown")]
    SessionTerminated(SessionId),

    #[error("session limit of {max} reached: cannot create another session")]
    SessionLimit { max: usize },

    #[error(
        "{field}={requested} is no longer retained (resume from {oldest_available} or later); \
         re-read the state and watch from its revision"
    )]
    HistoryUnavailable {
        field: &'static str,
        requested: u64,
        oldest_available: u64,
    },

    #[error(
        "watcher fell behind by {} events and was ended; resume after revision {} / seq {}",
        .0.missed,
        .0.last_revision.unwrap_or(0),
        .0.last_seq.unwrap_or(0)
    )]
    WatcherLagged(Lagged),

    #[error("watcher limit of {max} reached: end another watch or raise --max-watchers")]
    WatcherLimit { max: usize },

    /// The backend's store did not answer in time (a NATS node down, a
    /// partition). A write may still have landed: retries are safe because
    /// Start carries a request_id and Finish/Cancel/Shutdown are fenced.
    #[error("coordinator store unavailable: {0}; retry with backoff")]
    Unavailable(String),

    /// The session's stored record cannot be read by this version (damaged,
    /// or written in a format it does not know). Not retried: no attempt
    /// can succeed until an operator repairs or removes it.
    #[error(
        "the stored record of session {session:?} is unreadable ({reason}); it needs an operator"
    )]
    Unreadable { session: SessionId, reason: String },

    /// Other replicas kept changing the session between this call's read and
    /// its write; nothing was changed; retry.
    #[error("session {0:?} is contended by other replicas; retry")]
    Contended(SessionId),
}

impl CoordError {
    pub fn invalid(field: &'static str, reason: impl ToString) -> Self {
        CoordError::InvalidArgument {
            field,
            reason: reason.to_string(),
        }
    }
}
