//! Every gRPC status code the server answers with, decided here and nowhere
//! else: domain errors, authentication, and the server's own limits.

use tonic::{Code, Status};

use crate::{auth::AuthError, error::CoordError};

pub fn code(error: &CoordError) -> Code {
    match error {
        CoordError::InvalidArgument { .. } => Code::InvalidArgument,
        CoordError::SessionNotFound(_) => Code::NotFound,
        CoordError::SessionTerminated(_) => Code::FailedPrecondition,
        CoordError::SessionLimit { .. }
        | CoordError::WatcherLagged(_)
        | CoordError::WatcherLimit { .. } => Code::ResourceExhausted,
        CoordError::HistoryUnavailable { .. } => Code::OutOfRange,
        CoordError::Unavailable(_) => Code::Unavailable,
        CoordError::Unreadable { .. } => Code::DataLoss,
        CoordError::Contended(_) => Code::Aborted,
    }
}

impl From<CoordError> for Status {
    fn from(error: CoordError) -> Self {
        Status::new(code(&error), error.to_string())
    }
}

/// Missing or unknown credentials are UNAUTHENTICATED (who are you?); a
/// known caller acting outside its scope is PERMISSION_DENIED. A call that
/// never passed the authenticator is UNAUTHENTICATED too: nobody established
/// who is calling, and PERMISSION_DENIED would claim a known caller.
pub fn auth_code(error: &AuthError) -> Code {
    match error {
        AuthError::Missing
        | AuthError::Malformed
        | AuthError::Unknown
        | AuthError::NotAuthenticated => Code::Unauthenticated,
        AuthError::OutOfScope { .. } => Code::PermissionDenied,
    }
}

impl From<AuthError> for Status {
    fn from(error: AuthError) -> Self {
        Status::new(auth_code(&error), error.to_string())
    }
}

/// An error raised by the server's tower layers rather than by a handler.
/// Load shedding answers UNAVAILABLE at once (retry with backoff, ideally on
/// another replica) instead of queueing the call.
pub fn from_layer_error(error: tower::BoxError, max_in_flight: usize) -> Status {
    if error.is::<tower::load_shed::error::Overloaded>() {
        return Status::unavailable(format!(
            "overloaded: {max_in_flight} calls already in flight; retry with backoff"
        ));
    }
    match error.downcast::<Status>() {
        Ok(status) => *status,
        Err(error) => Status::from_error(error),
    }
}

/// Whether a server span for a call ending with `code` is an error (the
/// OpenTelemetry gRPC conventions: the server's own failures, not the
/// caller's mistakes).
pub fn is_server_error(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// The status code's canonical name (`OK`, `INVALID_ARGUMENT`, ...), as
/// metrics and spans label it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SessionId;

    #[test]
    fn an_unreadable_record_is_data_loss_not_a_retryable_unavailable() {
        let error = CoordError::Unreadable {
            session: SessionId::parse("damaged").unwrap(),
            reason: "not a stored session".into(),
        };
        assert_eq!(code(&error), Code::DataLoss);
        let status = Status::from(error);
        assert!(status.message().contains("\"damaged\""), "{status:?}");
        assert_eq!(
            code(&CoordError::Unavailable("nats down".into())),
            Code::Unavailable
        );
    }
}
