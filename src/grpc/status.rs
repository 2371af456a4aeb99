//! Every domain error's gRPC status code, decided here and nowhere else.

use tonic::{Code, Status};

use crate::error::CoordError;

pub fn code(error: &CoordError) -> Code {
    match error {
        CoordError::InvalidArgument { .. } => Code::InvalidArgument,
        CoordError::SessionNotFound(_) => Code::NotFound,
        CoordError::SessionTerminated(_) => Code::FailedPrecondition,
        CoordError::SessionLimit { .. } | CoordError::WatcherLagged(_) => Code::ResourceExhausted,
        CoordError::HistoryUnavailable { .. } => Code::OutOfRange,
    }
}

impl From<CoordError> for Status {
    fn from(error: CoordError) -> Self {
        Status::new(code(&error), error.to_string())
    }
}
