//! Bad input over real gRPC: every malformed field is INVALID_ARGUMENT naming
//! that field, on every RPC it can reach, and changes nothing (the session's
//! state and the event stream are untouched). Validation comes before lookup:
//! a malformed id is never NOT_FOUND.

mod common;

use std::time::Duration;

use common::*;
use respcoord::proto::v1 as pb;
use tonic::{Code, Status};

/// Session ids the contract refuses, with why.
fn bad_session_ids() -> Vec<(String, &'static str)> {
    vec![
        (String::new(), "empty"),
        ("x".repeat(257), "257 bytes"),
        ("é".repeat(129), "258 bytes of two-byte characters"),
        ("a\u{0}b".into(), "NUL"),
        ("tab\there".into(), "U+0009"),
        ("new\nline".into(), "U+000A"),
        ("del\u{7f}".into(), "U+007F"),
        ("c1\u{85}".into(), "U+0085"),
        ("c1\u{9f}".into(), "U+009F"),
    ]
}

fn assert_invalid(result: Result<impl std::fmt::Debug, Status>, field: &str, why: &str) {
    let status = assert_code(result, Code::InvalidArgument);
    assert!(
        status.message().starts_with(&format!("{field}:")),
        "{why}: message must name `{field}`: {:?}",
        status.message()
    );
}

/// Calls every RPC that takes a session id with `id`.
async fn every_rpc(c: &mut Client, id: &str, why: &str) {
    let session_id = id.to_owned();
    assert_invalid(
        c.start(start_req(id, pb::Source::Client, "")).await,
        "session_id",
        why,
    );
    assert_invalid(
        c.finish(pb::FinishRequest {
            session_id: session_id.clone(),
            response_id: 1,
            status: 0,
        })
        .await,
        "session_id",
        why,
    );
    assert_invalid(
        c.cancel(pb::CancelRequest {
            session_id: session_id.clone(),
            source: 0,
            if_response_id: 0,
        })
        .await,
        "session_id",
        why,
    );
    assert_invalid(
        c.shutdown(pb::ShutdownRequest {
            session_id: session_id.clone(),
            source: pb::Source::Unspecified.into(),
        })
        .await,
        "session_id",
        why,
    );
    assert_invalid(
        c.get_state(pb::GetStateRequest {
            session_id: session_id.clone(),
        })
        .await,
        "session_id",
        why,
    );
    if !id.is_empty() {
        // An empty session id on Watch means "every session", which is valid.
        assert_invalid(
            c.watch(pb::WatchRequest {
                session_id,
                after_revision: None,
                after_seq: None,
            })
            .await,
            "session_id",
            why,
        );
    }
}

#[tokio::test]
async fn malformed_session_ids_are_invalid_on_every_rpc_and_change_nothing() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let mut all = watch_all(&mut c, None).await;
    for (id, why) in bad_session_ids() {
        every_rpc(&mut c, &id, why).await;
    }
    assert_eq!(server.coordinator.session_count(), 0);
    assert_no_events(&mut all, Duration::from_millis(200)).await;
    // The boundaries themselves are accepted.
    start(&mut c, &"x".repeat(256)).await;
    start(&mut c, "tenant-a/ünïcode \u{a0}\u{200b} ok").await;
    server.stop().await;
}

#[tokio::test]
async fn malformed_fields_of_an_existing_session_change_nothing() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let active = start(&mut c, "s").await;
    let before = active.state.clone().unwrap();
    let mut all = watch_all(&mut c, None).await;

    // Start: request_id too long, source out of range.
    assert_invalid(
        c.start(start_req("s", pb::Source::Client, &"r".repeat(129)))
            .await,
        "request_id",
        "129 bytes",
    );
    for source in [3, -1, 99] {
        let request = pb::StartRequest {
            session_id: "s".into(),
            source,
            request_id: String::new(),
        };
        assert_invalid(c.start(request).await, "source", "out of range");
    }
    // Finish: CANCELLED and out-of-range statuses.
    for status in [pb::TerminalStatus::Cancelled as i32, 4, -2] {
        let request = pb::FinishRequest {
            session_id: "s".into(),
            response_id: active.response_id,
            status,
        };
        assert_invalid(c.finish(request).await, "status", "bad status");
    }
    // Cancel: source out of range, even with a matching if_response_id.
    let request = pb::CancelRequest {
        session_id: "s".into(),
        source: 7,
        if_response_id: active.response_id,
    };
    assert_invalid(c.cancel(request).await, "source", "out of range");
    // ListSessions: a token we never issued.
    for token in ["garbage", "djE", "!!!"] {
        let request = pb::ListSessionsRequest {
            page_size: 10,
            page_token: token.into(),
        };
        assert_invalid(c.list_sessions(request).await, "page_token", token);
    }
    // Watch: resume fields that do not fit the watch's kind.
    let request = pb::WatchRequest {
        session_id: "s".into(),
        after_revision: None,
        after_seq: Some(1),
    };
    assert_invalid(c.watch(request).await, "after_seq", "session watch");
    let request = pb::WatchRequest {
        session_id: String::new(),
        after_revision: Some(1),
        after_seq: None,
    };
    assert_invalid(c.watch(request).await, "after_revision", "watch-all");

    assert_eq!(get_state(&mut c, "s").await.unwrap(), before);
    assert_no_events(&mut all, Duration::from_millis(200)).await;
    // A request id of exactly 128 bytes is fine.
    let ok = c
        .start(start_req("s", pb::Source::Client, &"r".repeat(128)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.superseded_response_id, active.response_id);
    server.stop().await;
}

#[tokio::test]
async fn health_serves_both_names_and_reflection_lists_the_service() {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let server = TestServer::start().await;
    let mut health = HealthClient::new(server.channel().await);
    for service in ["", "respcoord.v1.ResponseCoordinator"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.status(),
            ServingStatus::Serving,
            "health of {service:?}"
        );
    }

    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut reflection = ServerReflectionClient::new(server.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reflection reply {reply:?}");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"respcoord.v1.ResponseCoordinator".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_turns_health_not_serving_and_ends_watches_cleanly() {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let mut health = HealthClient::new(server.channel().await);
    let mut health_updates = health
        .watch(HealthCheckRequest {
            service: "respcoord.v1.ResponseCoordinator".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = health_updates.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    let mut session = watch_session(&mut c, "s", None).await;
    let mut all = watch_all(&mut c, None).await;
    start(&mut c, "s").await;
    let _ = next_events(&mut session, 1).await;

    let stopping = tokio::spawn(server.stop());
    let update = tokio::time::timeout(PATIENCE, health_updates.message())
        .await
        .unwrap();
    if let Ok(Some(update)) = update {
        assert_eq!(update.status(), ServingStatus::NotServing);
    }
    // Both watches end with OK, not an error.
    let (_, end) = drain(&mut session).await;
    end.expect("session watch ends cleanly at shutdown");
    let (events, end) = drain(&mut all).await;
    end.expect("watch-all ends cleanly at shutdown");
    assert_eq!(events.len(), 1);
    drop(health_updates);
    stopping.await.unwrap();
}
