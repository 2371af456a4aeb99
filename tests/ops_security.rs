//! Security over the wire: TLS and mutual TLS with certificates made here,
//! bearer tokens (UNAUTHENTICATED without a known one), and session scopes
//! (PERMISSION_DENIED outside the token's prefix, listings and watch-all
//! filtered to it), with health open to probes.

mod common;

use std::path::PathBuf;

use common::*;
use respcoord::{
    auth::Tokens,
    proto::v1::{self as pb, response_coordinator_client::ResponseCoordinatorClient},
    server::{Pem, ServerConfig, TlsConfig},
};
use tonic::{
    metadata::MetadataValue,
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
    Code, Request, Status,
};

// ---- certificates ----

#[path = "common/ca.rs"]
#[allow(dead_code)] // write_mutual_tls_files is the scenario fixture's
mod ca;

use ca::Ca;

/// A scratch file of this test process's.
fn temp_file(name: &str, contents: &str) -> PathBuf {
    scratch_file("respcoord-security", name, contents)
}

fn tls_config(ca: &Ca, client_ca: Option<&Ca>, tag: &str) -> TlsConfig {
    let (cert, key) = ca.leaf("localhost").unwrap();
    TlsConfig {
        cert: Pem::certificates(&temp_file(&format!("{tag}-cert.pem"), &cert)).unwrap(),
        key: Pem::private_key(&temp_file(&format!("{tag}-key.pem"), &key)).unwrap(),
        client_ca: client_ca.map(|ca| {
            Pem::certificates(&temp_file(&format!("{tag}-client-ca.pem"), &ca.pem)).unwrap()
        }),
    }
}

async fn tls_channel(
    server: &TestServer,
    ca: &Ca,
    identity: Option<(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{}", server.addr))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

async fn can_call(channel: Result<Channel, tonic::transport::Error>) -> Result<(), String> {
    let channel = channel.map_err(|e| format!("connect: {e:?}"))?;
    let mut client = ResponseCoordinatorClient::new(channel);
    client
        .start(start_req("tls", pb::Source::Client, ""))
        .await
        .map(|_| ())
        .map_err(|status| format!("{status:?}"))
}

#[tokio::test]
async fn tls_serves_encrypted_and_refuses_plaintext() {
    let ca = Ca::new("test CA").unwrap();
    let server = TestServer::with_config(ServerConfig {
        tls: Some(tls_config(&ca, None, "tls")),
        ..Default::default()
    })
    .await;
    can_call(tls_channel(&server, &ca, None).await)
        .await
        .expect("a TLS client that trusts the CA gets through");
    // A client that does not trust the server's CA cannot connect.
    let stranger = Ca::new("another CA").unwrap();
    assert!(can_call(tls_channel(&server, &stranger, None).await)
        .await
        .is_err());
    // Plaintext HTTP/2 to a TLS port fails.
    let plaintext = Endpoint::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await;
    assert!(can_call(plaintext).await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_client_ca() {
    let server_ca = Ca::new("server CA").unwrap();
    let client_ca = Ca::new("client CA").unwrap();
    let server = TestServer::with_config(ServerConfig {
        tls: Some(tls_config(&server_ca, Some(&client_ca), "mtls")),
        ..Default::default()
    })
    .await;
    can_call(
        tls_channel(
            &server,
            &server_ca,
            Some(client_ca.leaf("gateway-1").unwrap()),
        )
        .await,
    )
    .await
    .expect("a client with a certificate from the client CA gets through");
    assert!(
        can_call(tls_channel(&server, &server_ca, None).await)
            .await
            .is_err(),
        "no client certificate"
    );
    let rogue = Ca::new("rogue CA").unwrap();
    assert!(
        can_call(tls_channel(&server, &server_ca, Some(rogue.leaf("gateway-1").unwrap())).await)
            .await
            .is_err(),
        "a client certificate from another CA"
    );
    server.stop().await;
}

// ---- tokens and scopes ----

const TENANT_A: &str = "tenant-a-token-0123456789";
const TENANT_B: &str = "tenant-b-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";

/// Sends `authorization` metadata as given.
#[derive(Clone)]
struct Authorization(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Authorization {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

type AuthedClient = ResponseCoordinatorClient<InterceptedService<Channel, Authorization>>;

async fn client_with(server: &TestServer, authorization: Option<String>) -> AuthedClient {
    let value = authorization.map(|v| v.parse().unwrap());
    ResponseCoordinatorClient::with_interceptor(server.channel().await, Authorization(value))
}

/// Every session id the client may list, paging two at a time.
async fn list_all(client: &mut AuthedClient) -> Vec<String> {
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        ids.extend(page.sessions.into_iter().map(|s| s.session_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    ids.sort();
    ids
}

async fn token_client(server: &TestServer, token: &str) -> AuthedClient {
    client_with(server, Some(format!("Bearer {token}"))).await
}

async fn token_server() -> TestServer {
    let tokens = Tokens::parse(&format!(
        "# tenants and the operator\n{TENANT_A} tenant-a/\n{TENANT_B} tenant-b/\n{OPERATOR} *\n"
    ))
    .unwrap();
    TestServer::with_config(ServerConfig {
        auth: Some(tokens),
        ..Default::default()
    })
    .await
}

fn start_in(session: &str) -> pb::StartRequest {
    start_req(session, pb::Source::Client, "")
}

#[tokio::test]
async fn calls_without_a_known_token_are_unauthenticated_and_health_stays_open() {
    let server = token_server().await;
    for authorization in [
        None,
        Some("Bearer not-a-token-we-know-of".to_owned()),
        Some(format!("Basic {TENANT_A}")),
        Some(TENANT_A.to_owned()),
    ] {
        let mut client = client_with(&server, authorization.clone()).await;
        let status = assert_code(
            client.start(start_in("tenant-a/1")).await,
            Code::Unauthenticated,
        );
        assert!(
            !status.message().contains(TENANT_A),
            "a refusal never echoes the token: {status:?}"
        );
        assert_code(
            client
                .list_sessions(pb::ListSessionsRequest::default())
                .await,
            Code::Unauthenticated,
        );
        assert_code(
            client.watch(pb::WatchRequest::default()).await,
            Code::Unauthenticated,
        );
    }
    // Nothing was created by the refused calls.
    let mut operator = token_client(&server, OPERATOR).await;
    let listed = operator
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty());
    // Probes need no token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let check = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health is open")
        .into_inner();
    assert_eq!(
        check.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    server.stop().await;
}

#[tokio::test]
async fn a_scoped_token_can_neither_touch_nor_watch_sessions_outside_its_prefix() {
    let server = token_server().await;
    let mut a = token_client(&server, TENANT_A).await;
    let mut operator = token_client(&server, OPERATOR).await;

    // Inside its scope everything works.
    let started = a
        .start(start_in("tenant-a/call-1"))
        .await
        .unwrap()
        .into_inner();
    a.finish(pb::FinishRequest {
        session_id: "tenant-a/call-1".into(),
        response_id: started.response_id,
        status: pb::TerminalStatus::Completed.into(),
    })
    .await
    .unwrap();
    // Another tenant's session exists (made by the operator).
    let other = operator
        .start(start_in("tenant-b/call-1"))
        .await
        .unwrap()
        .into_inner();

    // Outside it: PERMISSION_DENIED on every RPC naming a session, and
    // nothing changes.
    let denied = |result: Result<_, Status>| {
        let status = assert_code(result, Code::PermissionDenied);
        assert!(
            status.message().starts_with("session_id: "),
            "names the field: {status:?}"
        );
    };
    denied(a.start(start_in("tenant-b/call-1")).await.map(|_| ()));
    denied(a.start(start_in("tenant-b/new")).await.map(|_| ()));
    denied(
        a.finish(pb::FinishRequest {
            session_id: "tenant-b/call-1".into(),
            response_id: other.response_id,
            status: 0,
        })
        .await
        .map(|_| ()),
    );
    denied(
        a.cancel(pb::CancelRequest {
            session_id: "tenant-b/call-1".into(),
            source: 0,
            if_response_id: 0,
        })
        .await
        .map(|_| ()),
    );
    denied(
        a.shutdown(pb::ShutdownRequest {
            session_id: "tenant-b/call-1".into(),
            source: pb::Source::Unspecified.into(),
        })
        .await
        .map(|_| ()),
    );
    denied(
        a.get_state(pb::GetStateRequest {
            session_id: "tenant-b/call-1".into(),
        })
        .await
        .map(|_| ()),
    );
    denied(
        a.watch(pb::WatchRequest {
            session_id: "tenant-b/call-1".into(),
            after_revision: Some(0),
            after_seq: None,
        })
        .await
        .map(|_| ()),
    );
    // A prefix of the scope is not the scope.
    denied(a.start(start_in("tenant-a")).await.map(|_| ()));
    // Validation still comes first.
    assert_code(a.start(start_in("")).await, Code::InvalidArgument);

    let state = operator
        .get_state(pb::GetStateRequest {
            session_id: "tenant-b/call-1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .state
        .unwrap();
    assert_eq!(state.phase(), pb::Phase::Active);
    assert_eq!(state.active_response_id, other.response_id);
    assert_eq!(state.revision, 1);
    assert_code(
        operator
            .get_state(pb::GetStateRequest {
                session_id: "tenant-b/new".into(),
            })
            .await,
        Code::NotFound,
    );
    server.stop().await;
}

#[tokio::test]
async fn listings_and_watch_all_are_filtered_to_the_scope() {
    let server = token_server().await;
    let mut a = token_client(&server, TENANT_A).await;
    let mut b = token_client(&server, TENANT_B).await;
    let mut operator = token_client(&server, OPERATOR).await;

    let mut a_all = a
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut operator_all = operator
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    for i in 0..5 {
        a.start(start_in(&format!("tenant-a/{i}"))).await.unwrap();
        b.start(start_in(&format!("tenant-b/{i}"))).await.unwrap();
        operator.start(start_in(&format!("ops/{i}"))).await.unwrap();
    }

    // Listings, paged small so the filter has to work across pages.
    let expected = |prefix: &str| (0..5).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>();
    assert_eq!(list_all(&mut a).await, expected("tenant-a/"));
    assert_eq!(list_all(&mut b).await, expected("tenant-b/"));
    assert_eq!(list_all(&mut operator).await.len(), 15);

    // Watch-all: tenant A sees its five `started` events and nothing else;
    // the operator sees all fifteen.
    let seen = next_events(&mut a_all, 5).await;
    assert!(
        seen.iter().all(|e| e.session_id.starts_with("tenant-a/")),
        "{seen:?}"
    );
    assert_eq!(next_events(&mut operator_all, 15).await.len(), 15);
    // A resumed watch-all is filtered too.
    let mut resumed = a
        .watch(pb::WatchRequest {
            session_id: String::new(),
            after_revision: None,
            after_seq: Some(0),
        })
        .await
        .unwrap()
        .into_inner();
    let replayed = next_events(&mut resumed, 5).await;
    assert_eq!(
        replayed.iter().map(|e| &e.session_id).collect::<Vec<_>>(),
        seen.iter().map(|e| &e.session_id).collect::<Vec<_>>()
    );
    // Later events of other tenants never show up on A's streams.
    b.shutdown(pb::ShutdownRequest {
        session_id: "tenant-b/0".into(),
        source: pb::Source::Unspecified.into(),
    })
    .await
    .unwrap();
    a.shutdown(pb::ShutdownRequest {
        session_id: "tenant-a/0".into(),
        source: pb::Source::Unspecified.into(),
    })
    .await
    .unwrap();
    // (tenant-a/0 was active: cancel_requested, ended, terminated.)
    let next = next_events(&mut a_all, 3).await;
    assert!(
        next.iter().all(|e| e.session_id == "tenant-a/0"),
        "{next:?}"
    );
    server.stop().await;
}
