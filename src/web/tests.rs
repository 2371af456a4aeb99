use super::*;
use crate::error::CoordError;
use crate::proto::timeline::resume_point;

#[test]
fn the_resume_point_reads_back_from_the_out_of_range_message() {
    let error = CoordError::HistoryUnavailable {
        field: "after_revision",
        requested: 3,
        oldest_available: 1180,
    };
    let status = Status::from(error);
    assert_eq!(status.code(), Code::OutOfRange);
    assert_eq!(resume_point(status.message()), Some(1180));
}

#[test]
fn service_codes_map_to_http_statuses() {
    for (code, http) in [
        (Code::InvalidArgument, StatusCode::BAD_REQUEST),
        (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
        (Code::PermissionDenied, StatusCode::FORBIDDEN),
        (Code::NotFound, StatusCode::NOT_FOUND),
        (Code::ResourceExhausted, StatusCode::SERVICE_UNAVAILABLE),
        (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
        (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        assert_eq!(
            ApiError::status(Status::new(code, "x")).status,
            http,
            "{code:?}"
        );
    }
}
