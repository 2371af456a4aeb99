//! The rules written once for every client (clients/scenarios/rules.json):
//! this client's id validation, retry classification and stop reasons must
//! say what the file says. The Python and TypeScript clients have the same
//! test; a rule changed in one place fails until all three agree.

use std::{collections::BTreeSet, time::Duration};

use respcoord_client::{
    pb::CancelReason, Client, ClientError, ConnectOptions, RetryPolicy, Source, StartOptions,
    StopReason,
};
use respcoord_proto::ids::{MAX_REQUEST_ID_BYTES, MAX_SESSION_ID_BYTES};
use serde_json::Value;
use tonic::{Code, Status};

fn rules() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/rules.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn case_value(case: &Value) -> String {
    match (case.get("value"), case.get("repeat")) {
        (Some(value), _) => value.as_str().expect("value is a string").to_owned(),
        (None, Some(repeat)) => repeat
            .as_str()
            .expect("repeat is a string")
            .repeat(case["times"].as_u64().expect("times") as usize),
        _ => panic!("a case needs value or repeat: {case}"),
    }
}

/// A client whose calls can only fail in transport: what it refuses before
/// sending is what the rules say it must refuse.
fn offline_client() -> Client {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a loopback port");
    let retry = RetryPolicy {
        deadline: Duration::from_millis(500),
        ..RetryPolicy::default()
    }
    .single_attempt();
    Client::connect_lazy(ConnectOptions::new(format!("http://{closed}")).with_retry(retry))
        .expect("a lazy client")
}

#[tokio::test]
async fn ids_are_accepted_and_refused_as_the_rules_say() {
    let rules = rules();
    assert_eq!(
        rules["ids"]["session_id"]["max_bytes"].as_u64(),
        Some(MAX_SESSION_ID_BYTES as u64)
    );
    assert_eq!(
        rules["ids"]["request_id"]["max_bytes"].as_u64(),
        Some(MAX_REQUEST_ID_BYTES as u64)
    );
    let client = offline_client();
    let cases = rules["ids"]["cases"].as_array().expect("cases");
    assert!(cases.len() > 10);
    for case in cases {
        let value = case_value(case);
        let valid = case["valid"].as_bool().expect("valid");
        let refusal = match case["field"].as_str().expect("field") {
            "session_id" => client.session(&value).err(),
            "request_id" => {
                let session = client.session("rules").expect("a valid session id");
                let options = StartOptions {
                    request_id: Some(value.clone()),
                };
                match session.start_with(Source::Client, options).await {
                    Err(error @ ClientError::InvalidArgument { .. }) => Some(error),
                    // Sent: it failed in transport, which is not a refusal.
                    _ => None,
                }
            }
            other => panic!("unknown field {other}"),
        };
        match refusal {
            None => assert!(valid, "{case}: accepted, the rules refuse it"),
            Some(ClientError::InvalidArgument { field, .. }) => {
                assert!(!valid, "{case}: refused, the rules accept it");
                assert_eq!(field, case["field"].as_str().unwrap(), "{case}");
            }
            Some(other) => panic!("{case}: {other}"),
        }
    }
}

const CODES: [(&str, Code); 16] = [
    ("CANCELLED", Code::Cancelled),
    ("UNKNOWN", Code::Unknown),
    ("INVALID_ARGUMENT", Code::InvalidArgument),
    ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
    ("NOT_FOUND", Code::NotFound),
    ("ALREADY_EXISTS", Code::AlreadyExists),
    ("PERMISSION_DENIED", Code::PermissionDenied),
    ("RESOURCE_EXHAUSTED", Code::ResourceExhausted),
    ("FAILED_PRECONDITION", Code::FailedPrecondition),
    ("ABORTED", Code::Aborted),
    ("OUT_OF_RANGE", Code::OutOfRange),
    ("UNIMPLEMENTED", Code::Unimplemented),
    ("INTERNAL", Code::Internal),
    ("UNAVAILABLE", Code::Unavailable),
    ("DATA_LOSS", Code::DataLoss),
    ("UNAUTHENTICATED", Code::Unauthenticated),
];

#[test]
fn every_status_code_is_retried_or_final_as_the_rules_say() {
    let rules = rules();
    let names = |key: &str| -> BTreeSet<String> {
        rules["retry"][key]
            .as_array()
            .expect(key)
            .iter()
            .map(|v| v.as_str().expect("a code name").to_owned())
            .collect()
    };
    let (retryable, final_) = (names("retryable"), names("final"));
    assert!(retryable.is_disjoint(&final_));
    let all: BTreeSet<String> = CODES.iter().map(|(name, _)| (*name).to_owned()).collect();
    assert_eq!(
        &retryable | &final_,
        all,
        "the rules must classify every code"
    );
    for (name, code) in CODES {
        // As the server sends it: a status with this code and no transport
        // error behind it. (An INTERNAL the transport made from a reset
        // stream is retried: src/retry.rs tests it against a real reset.)
        let sent = Status::new(code, "from the server");
        assert_eq!(
            RetryPolicy::retryable(&sent),
            retryable.contains(name),
            "{name}"
        );
    }
}

fn stop_reason_name(reason: StopReason) -> &'static str {
    // Exhaustive: a new stop reason does not compile until it is named here
    // and in the rules.
    match reason {
        StopReason::Superseded => "superseded",
        StopReason::Cancelled => "cancelled",
        StopReason::Shutdown => "shutdown",
        StopReason::Expired => "expired",
        StopReason::Ended => "ended",
        StopReason::Gone => "gone",
        StopReason::Finished => "finished",
        StopReason::Released => "released",
    }
}

#[test]
fn stop_reasons_and_their_mapping_are_the_rules() {
    let rules = rules();
    let listed: BTreeSet<&str> = rules["stop_reasons"]["names"]
        .as_array()
        .expect("names")
        .iter()
        .map(|v| v.as_str().expect("a name"))
        .collect();
    let ours: BTreeSet<&str> = [
        StopReason::Superseded,
        StopReason::Cancelled,
        StopReason::Shutdown,
        StopReason::Expired,
        StopReason::Ended,
        StopReason::Gone,
        StopReason::Finished,
        StopReason::Released,
    ]
    .into_iter()
    .map(stop_reason_name)
    .collect();
    assert_eq!(ours, listed);
    let mapping = rules["stop_reasons"]["from_cancel_reason"]
        .as_object()
        .expect("from_cancel_reason");
    let reasons = [
        CancelReason::Unspecified,
        CancelReason::Superseded,
        CancelReason::Requested,
        CancelReason::Shutdown,
        CancelReason::Expired,
    ];
    assert_eq!(mapping.len(), reasons.len());
    for reason in reasons {
        let expected = mapping[reason.as_str_name()].as_str().expect("a name");
        assert_eq!(
            stop_reason_name(StopReason::from(reason)),
            expected,
            "{}",
            reason.as_str_name()
        );
    }
}
