//! The web view's API (docs/web-ui.md) against a real server, on the
//! backend the run selects: the snapshot, the live feeds, resume after a
//! reconnect, a resume point no longer retained, authentication and token
//! scopes, a reader too slow for its session ended without slowing calls,
//! and the view off by default.

mod common;

use std::{net::SocketAddr, time::Duration};

use common::{http_get, sample, TestServer, PATIENCE};
use respcoord::{
    auth::Tokens,
    proto::v1::{self as pb},
    registry::CoordConfig,
    server::ServerConfig,
};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

const TENANT_A: &str = "token-for-tenant-a-0001";
const ADMIN: &str = "token-for-the-operator-01";

async fn web_server(registry: CoordConfig, auth: Option<Tokens>) -> TestServer {
    TestServer::with_config(ServerConfig {
        registry,
        auth,
        web_ui: true,
        shutdown_grace: Duration::from_secs(5),
        ..ServerConfig::default()
    })
    .await
}

fn unique(tag: &str) -> String {
    format!("{tag}-{}", fastrand::u64(..))
}

/// A GET with an optional bearer token: status and body.
async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let (status, _, body) = get_with_head(addr, path, token).await;
    (status, body)
}

/// A GET: status, head (status line and headers, lower-cased) and body.
async fn get_with_head(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(request(addr, path, token).as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut response))
        .await
        .expect("a response in time")
        .unwrap();
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, head.to_ascii_lowercase(), body)
}

fn request(addr: SocketAddr, path: &str, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// A server-sent event stream, read message by message.
struct Feed {
    lines: tokio::io::Lines<BufReader<TcpStream>>,
}

/// One server-sent event: its name, id and JSON data.
#[derive(Debug)]
struct Message {
    event: String,
    id: Option<String>,
    data: Value,
}

impl Feed {
    async fn open(addr: SocketAddr, path: &str, token: Option<&str>) -> Self {
        Self::open_on(
            TcpStream::connect(addr).await.expect("connect"),
            addr,
            path,
            token,
        )
        .await
    }

    async fn open_on(
        mut stream: TcpStream,
        addr: SocketAddr,
        path: &str,
        token: Option<&str>,
    ) -> Self {
        stream
            .write_all(request(addr, path, token).as_bytes())
            .await
            .unwrap();
        let mut lines = BufReader::new(stream).lines();
        let status = lines.next_line().await.unwrap().unwrap();
        assert!(status.contains(" 200 "), "GET {path}: {status}");
        while !lines.next_line().await.unwrap().unwrap().is_empty() {}
        Self { lines }
    }

    /// The next event (bookmarks and keep-alive comments skipped); `None`
    /// when the stream ended.
    async fn next(&mut self) -> Option<Message> {
        let (mut event, mut id, mut data) = (String::new(), None, String::new());
        loop {
            let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
                .await
                .expect("a feed line in time")
                .ok()??;
            // Chunk sizes of the chunked body: hex digits alone on a line.
            if !line.is_empty() && line.chars().all(|c| c.is_ascii_hexdigit()) {
                continue;
            }
            if let Some(value) = line.strip_prefix("event: ") {
                event = value.to_owned();
            } else if let Some(value) = line.strip_prefix("id: ") {
                id = Some(value.to_owned());
            } else if let Some(value) = line.strip_prefix("data: ") {
                data.push_str(value);
            } else if line.is_empty() && !event.is_empty() {
                return Some(Message {
                    event,
                    id,
                    data: json(&data),
                });
            }
        }
    }

    /// Events until one of `kind` about lifecycle event kind `kind`.
    async fn until(&mut self, kind: &str) -> Vec<Message> {
        let mut seen = Vec::new();
        loop {
            let message = self.next().await.expect("the feed ended early");
            let done = message.data["event"]["kind"] == kind;
            seen.push(message);
            if done {
                return seen;
            }
        }
    }
}

async fn start(client: &mut common::Client, session: &str, source: pb::Source) -> u64 {
    client
        .start(pb::StartRequest {
            session_id: session.to_owned(),
            source: source.into(),
            request_id: String::new(),
        })
        .await
        .expect("start")
        .into_inner()
        .response_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_page_gets_its_snapshot_then_each_change_live() {
    let server = web_server(CoordConfig::default(), None).await;
    let web = server.metrics_addr;
    let mut client = server.client().await;
    let session = unique("call");
    let first = start(&mut client, &session, pb::Source::Client).await;
    let second = start(&mut client, &session, pb::Source::Vad).await;

    let (status, body) = get(web, &format!("/api/v1/session?id={session}"), None).await;
    assert_eq!(status, 200, "{body}");
    let snapshot = json(&body);
    assert_eq!(snapshot["state"]["phase"], "active");
    assert_eq!(snapshot["state"]["active_response_id"], second.to_string());
    assert_eq!(snapshot["events"].as_array().unwrap().len(), 4);
    let rows = snapshot["responses"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["response_id"], first.to_string());
    assert_eq!(rows[0]["reason"], "superseded");
    assert_eq!(rows[0]["superseded_by"], second.to_string());
    assert_eq!(rows[0]["superseded_by_source"], "vad");
    // Who stopped it: the superseding Start's source, on its cancel.
    assert_eq!(rows[0]["cancel_source"], "vad");
    assert_eq!(rows[1]["status"], Value::Null);
    assert_eq!(rows[1]["cancel_source"], Value::Null);

    let mut feed = Feed::open(web, &format!("/api/v1/session/feed?id={session}"), None).await;
    let opening = feed.next().await.unwrap();
    assert_eq!(opening.event, "snapshot");
    assert_eq!(opening.id.as_deref(), Some("4"));
    assert_eq!(opening.data["responses"], snapshot["responses"]);
    assert_eq!(opening.data["events"].as_array().unwrap().len(), 4);

    client
        .cancel(pb::CancelRequest {
            session_id: session.clone(),
            source: pb::Source::Vad.into(),
            if_response_id: 0,
        })
        .await
        .unwrap();
    let live = feed.until("ended").await;
    assert_eq!(live.len(), 2);
    assert_eq!(live[0].data["event"]["kind"], "cancel_requested");
    assert_eq!(live[0].data["event"]["source"], "vad", "who cancelled");
    let ended = &live[1];
    assert_eq!(
        (ended.event.as_str(), ended.id.as_deref()),
        ("event", Some("6"))
    );
    assert_eq!(
        ended.data["responses"][0]["response_id"],
        second.to_string()
    );
    assert_eq!(ended.data["responses"][0]["reason"], "requested");
    assert_eq!(ended.data["responses"][0]["cancel_source"], "vad");
    assert_eq!(ended.data["session"]["phase"], "idle");

    // A supersede's `started` carries both rows it changed.
    let third = start(&mut client, &session, pb::Source::Vad).await;
    let fourth = start(&mut client, &session, pb::Source::Client).await;
    let started = feed.until("started").await;
    assert_eq!(
        started.last().unwrap().data["event"]["response_id"],
        third.to_string()
    );
    let supersede = feed.until("started").await;
    let rows = &supersede.last().unwrap().data["responses"];
    assert_eq!(rows[0]["response_id"], fourth.to_string());
    assert_eq!(rows[1]["response_id"], third.to_string());
    assert_eq!(rows[1]["superseded_by"], fourth.to_string());
    assert_eq!(rows[1]["superseded_by_source"], "client");

    // Torn down: the feed says so and ends.
    client
        .shutdown(pb::ShutdownRequest {
            session_id: session.clone(),
            source: pb::Source::Unspecified.into(),
        })
        .await
        .unwrap();
    let end = feed.until("terminated").await;
    assert_eq!(end.last().unwrap().data["terminated"]["reason"], "shutdown");
    assert!(
        feed.next().await.is_none(),
        "the feed ends with its session"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_resumes_after_the_last_revision_it_saw() {
    let registry = CoordConfig {
        session_history: 6,
        ..CoordConfig::default()
    };
    let server = web_server(registry, None).await;
    let web = server.metrics_addr;
    let mut client = server.client().await;
    let session = unique("call");
    for _ in 0..2 {
        start(&mut client, &session, pb::Source::Client).await;
    }
    // Revisions 1 to 4 are retained: resuming after 2 replays 3 and 4.
    let path = format!("/api/v1/session/feed?id={session}&after_revision=2");
    let mut feed = Feed::open(web, &path, None).await;
    let replayed = feed.until("started").await;
    let ids: Vec<_> = replayed.iter().map(|m| m.id.clone().unwrap()).collect();
    assert_eq!(ids, ["3", "4"]);
    assert!(replayed.iter().all(|m| m.event == "event"));
    drop(feed);

    // More supersedes than the history holds (6 events on the memory
    // backend, 6 transitions on NATS): the snapshot starts where the
    // retained history does, and resuming before that is refused.
    for _ in 0..8 {
        start(&mut client, &session, pb::Source::Client).await;
    }
    let (status, body) = get(web, &format!("/api/v1/session?id={session}"), None).await;
    assert_eq!(status, 200);
    let snapshot = json(&body);
    let oldest = snapshot["oldest_revision"].as_u64().unwrap();
    let revision = snapshot["state"]["revision"].as_u64().unwrap();
    assert_eq!(revision, 4 + 8 * 3);
    assert!(oldest > 0, "{snapshot}");
    let events = snapshot["events"].as_array().unwrap();
    assert_eq!(events.len() as u64, revision - oldest);
    assert_eq!(events[0]["revision"], oldest + 1);
    let path = format!(
        "/api/v1/session/feed?id={session}&after_revision={}",
        oldest - 1
    );
    let mut feed = Feed::open(web, &path, None).await;
    let error = feed.next().await.unwrap();
    assert_eq!(error.event, "error");
    assert_eq!(error.data["code"], "out_of_range");
    assert!(feed.next().await.is_none());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_page_lists_by_prefix_and_follows_changes() {
    let server = web_server(CoordConfig::default(), None).await;
    let web = server.metrics_addr;
    let mut client = server.client().await;
    let prefix = unique("tenant");
    let listed = format!("{prefix}/a");
    start(&mut client, &listed, pb::Source::Client).await;
    start(&mut client, &unique("other"), pb::Source::Client).await;

    let (status, body) = get(web, &format!("/api/v1/sessions?prefix={prefix}/"), None).await;
    assert_eq!(status, 200);
    let listing = json(&body);
    let sessions = listing["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{listing}");
    assert_eq!(sessions[0]["session_id"], listed.as_str());
    assert_eq!(listing["truncated"], false);
    // The last change is in the listing, so the page shows it at once.
    let changed = sessions[0]["changed_ms"].as_f64().expect("changed_ms");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    assert!(
        (now_ms - 60_000.0..=now_ms + 1_000.0).contains(&changed),
        "{changed} vs now {now_ms}"
    );

    let mut feed = Feed::open(
        web,
        &format!("/api/v1/sessions/feed?prefix={prefix}/"),
        None,
    )
    .await;
    let snapshot = feed.next().await.unwrap();
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["sessions"], listing["sessions"]);
    // Other sessions' changes are not sent; this prefix's are.
    start(&mut client, &unique("other"), pb::Source::Vad).await;
    let later = format!("{prefix}/b");
    let id = start(&mut client, &later, pb::Source::Vad).await;
    let change = feed.next().await.unwrap();
    assert_eq!(change.event, "change");
    assert_eq!(change.data["session"]["session_id"], later.as_str());
    assert_eq!(change.data["session"]["phase"], "active");
    assert_eq!(change.data["session"]["active_response_id"], id.to_string());
    assert_eq!(change.data["session"]["active_source"], "vad");
    let seq = change.id.clone().unwrap();
    drop(feed);

    // Resume after that seq: no snapshot, the next change only.
    let path = format!("/api/v1/sessions/feed?prefix={prefix}/&after_seq={seq}");
    let mut feed = Feed::open(web, &path, None).await;
    start(&mut client, &listed, pb::Source::Vad).await;
    let messages = feed.until("started").await;
    assert!(messages.iter().all(|m| m.event == "change"));
    assert_eq!(messages[0].data["event"]["session_id"], listed.as_str());

    drop(feed);

    // A resume point the coordinator no longer holds (seqs of a restarted
    // replica start afresh): an error event, so the page reloads.
    let mut feed = Feed::open(web, "/api/v1/sessions/feed?after_seq=1", None).await;
    let error = feed.next().await.unwrap();
    assert_eq!(
        (error.event.as_str(), &error.data["code"]),
        ("error", &Value::from("out_of_range"))
    );
    assert!(feed.next().await.is_none());

    let (status, body) = get(web, "/api/v1/sessions?limit=0", None).await;
    assert_eq!(status, 400);
    assert!(json(&body)["error"].as_str().unwrap().contains("limit=0"));
    server.stop().await;
}

/// A query the API cannot read is the documented 400 with `{"error"}`
/// naming the parameter, on every route (not axum's `text/plain`); and `/`
/// sends a browser to the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_query_is_a_json_400_and_the_root_leads_to_the_page() {
    let server = web_server(CoordConfig::default(), None).await;
    let web = server.metrics_addr;
    for path in [
        "/api/v1/sessions?limit=abc",
        "/api/v1/sessions/feed?after_seq=-1",
        "/api/v1/session?id=x&after_revision=soon",
        "/api/v1/session",
        "/api/v1/session/feed?id=x&after_revision=1.5",
    ] {
        let (status, head, body) = get_with_head(web, path, None).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            head.contains("content-type: application/json"),
            "{path}: {head}"
        );
        let error = json(&body)["error"].as_str().unwrap().to_owned();
        assert!(error.starts_with("query: "), "{path}: {error}");
    }
    let (_, _, body) = get_with_head(web, "/api/v1/sessions?limit=abc", None).await;
    let error = json(&body)["error"].as_str().unwrap().to_owned();
    assert!(error.contains("limit"), "{error}");

    let (status, head, _) = get_with_head(web, "/", None).await;
    assert!((300..400).contains(&status), "{status} {head}");
    assert!(head.contains("location: /ui/"), "{head}");
    assert_eq!(http_get(web, "/ui/").await.0, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_their_scopes_hold_on_the_web_view_too() {
    let tokens = Tokens::parse(&format!("{TENANT_A} tenant-a/\n{ADMIN} *\n")).unwrap();
    let server = web_server(CoordConfig::default(), Some(tokens)).await;
    let web = server.metrics_addr;
    let channel = server.channel().await;
    let admin: tonic::metadata::MetadataValue<_> = format!("Bearer {ADMIN}").parse().unwrap();
    let mut client = pb::response_coordinator_client::ResponseCoordinatorClient::with_interceptor(
        channel,
        move |mut request: tonic::Request<()>| {
            request
                .metadata_mut()
                .insert("authorization", admin.clone());
            Ok(request)
        },
    );
    let ours = unique("tenant-a/call");
    let theirs = unique("tenant-b/call");
    for session in [&ours, &theirs] {
        client
            .start(pb::StartRequest {
                session_id: session.clone(),
                source: pb::Source::Client.into(),
                request_id: String::new(),
            })
            .await
            .unwrap();
    }

    // The page's assets hold no data and need no token; the API fails closed.
    assert_eq!(http_get(web, "/ui/").await.0, 200);
    assert_eq!(get(web, "/api/v1/sessions", None).await.0, 401);
    assert_eq!(
        get(web, "/api/v1/sessions", Some("not-a-token-at-all"))
            .await
            .0,
        401
    );
    assert_eq!(get(web, "/api/v1/sessions/feed", None).await.0, 401);
    let (status, body) = get(web, &format!("/api/v1/session?id={theirs}"), Some(TENANT_A)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        get(
            web,
            &format!("/api/v1/session/feed?id={theirs}"),
            Some(TENANT_A)
        )
        .await
        .0,
        403
    );
    assert_eq!(
        get(web, &format!("/api/v1/session?id={ours}"), Some(TENANT_A))
            .await
            .0,
        200
    );

    let (status, body) = get(web, "/api/v1/sessions", Some(TENANT_A)).await;
    assert_eq!(status, 200);
    let listed: Vec<_> = json(&body)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, std::slice::from_ref(&ours));
    let (_, body) = get(web, "/api/v1/sessions", Some(ADMIN)).await;
    assert_eq!(json(&body)["sessions"].as_array().unwrap().len(), 2);

    // The tenant's feed of every session sees only its own sessions.
    let mut feed = Feed::open(web, "/api/v1/sessions/feed", Some(TENANT_A)).await;
    assert_eq!(feed.next().await.unwrap().event, "snapshot");
    for session in [&theirs, &ours] {
        client
            .cancel(pb::CancelRequest {
                session_id: session.clone(),
                source: pb::Source::Vad.into(),
                if_response_id: 0,
            })
            .await
            .unwrap();
    }
    for message in feed.until("ended").await {
        assert_eq!(message.data["event"]["session_id"], ours.as_str());
    }
    server.stop().await;
}

/// A page that stops reading is ended like a slow watcher: the calls that
/// make its session's events go on, and the feed's last word is the
/// RESOURCE_EXHAUSTED of the watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_too_slow_for_its_session_is_dropped_without_slowing_calls() {
    let registry = CoordConfig {
        session_watch_buffer: 8,
        ..CoordConfig::default()
    };
    let server = web_server(registry, None).await;
    let web = server.metrics_addr;
    let mut client = server.client().await;
    let session = unique("call");
    start(&mut client, &session, pb::Source::Client).await;
    // A small receive window, so the server's writes back up soon.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(web).await.unwrap();
    let path = format!("/api/v1/session/feed?id={session}");
    let mut feed = Feed::open_on(stream, web, &path, None).await;

    // Rounds of calls while the page reads nothing, each followed by
    // reading what the socket holds: the server's buffers (hyper's, the
    // kernel's) take some megabytes before its writes back up, so the round
    // that outgrows them is the one whose feed ends.
    let mut round = 5_000;
    let last = 'rounds: loop {
        let began = std::time::Instant::now();
        for _ in 0..round {
            start(&mut client, &session, pb::Source::Vad).await;
        }
        eprintln!(
            "{round} calls in {:?} while the page read nothing",
            began.elapsed()
        );
        loop {
            match tokio::time::timeout(Duration::from_secs(2), feed.next()).await {
                Ok(Some(message)) if message.event == "error" => break 'rounds message,
                Ok(Some(_)) => {}
                Ok(None) => panic!("the feed ended without an error"),
                // Read everything: this round fit in the buffers.
                Err(_) => break,
            }
        }
        assert!(round < 80_000, "no round outgrew the buffers");
        round *= 2;
    };
    assert_eq!(last.data["code"], "resource_exhausted");
    assert!(last.data["message"]
        .as_str()
        .unwrap()
        .contains("fell behind"));
    assert!(feed.next().await.is_none());
    let (_, scrape) = http_get(web, "/metrics").await;
    let lagged = sample(
        &scrape,
        "respcoord_watchers_lagged_total",
        &[("scope", "session")],
    );
    assert_eq!(lagged, Some(1.0));
    server.stop().await;
}

#[tokio::test]
async fn the_web_view_is_off_unless_asked_for() {
    let server = TestServer::start().await;
    assert_eq!(http_get(server.metrics_addr, "/ui/").await.0, 404);
    assert_eq!(http_get(server.metrics_addr, "/").await.0, 404);
    assert_eq!(
        http_get(server.metrics_addr, "/api/v1/sessions").await.0,
        404
    );
    assert_eq!(http_get(server.metrics_addr, "/metrics").await.0, 200);
    server.stop().await;
}
