//! respcoordctl against a real server in this process: every command, its
//! JSON output and exit codes, the token from a file or the environment,
//! and TLS with a client certificate and a scoped token.

// The root crate's throwaway CAs (some helpers serve only its tests).
#[allow(dead_code)]
#[path = "../../../tests/common/ca.rs"]
mod ca;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
};

use ca::Ca;
use respcoord::{
    auth::Tokens,
    server::{self, Pem, ServerConfig, TlsConfig},
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};

const CTL: &str = env!("CARGO_BIN_EXE_respcoordctl");

/// A memory-backend respcoord on a loopback port, stopped by [`Served::stop`].
struct Served {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), server::ServeError>>,
}

impl Served {
    async fn start(config: ServerConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(server::serve(config, listener, async move {
            let _ = stopped.await;
        }));
        Self { addr, stop, handle }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.handle.await.expect("server task").expect("server ran");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("respcoordctl-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_and_a_scoped_token() {
    const TOKEN: &str = "gateway-token-0123456789abcdef";
    let (server_ca, client_ca) = (Ca::new("server CA").unwrap(), Ca::new("client CA").unwrap());
    let dir = TempDir::new("mtls");
    let (cert, key) = server_ca.leaf("localhost").unwrap();
    let server = Served::start(ServerConfig {
        tls: Some(TlsConfig {
            cert: Pem::certificates(&dir.file("server.pem", &cert)).unwrap(),
            key: Pem::private_key(&dir.file("server-key.pem", &key)).unwrap(),
            client_ca: Some(Pem::certificates(&dir.file("client-ca.pem", &client_ca.pem)).unwrap()),
        }),
        auth: Some(Tokens::parse(&format!("{TOKEN} tenant-a/\n")).unwrap()),
        ..Default::default()
    })
    .await;
    let (gateway_cert, gateway_key) = client_ca.leaf("gateway-1").unwrap();
    let (ca, cert, key, token) = (
        dir.file("ca.pem", &server_ca.pem),
        dir.file("gateway.pem", &gateway_cert),
        dir.file("gateway-key.pem", &gateway_key),
        dir.file("token", TOKEN),
    );
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let (ca, cert, key, token) = (path(&ca), path(&cert), path(&key), path(&token));
    let endpoint = format!("https://{}", server.addr);
    let started = ctl(
        &endpoint,
        &[
            "start",
            "tenant-a/1",
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-domain",
            "localhost",
            "--token-file",
            &token,
        ],
        &[],
    )
    .await;
    assert_eq!(started.code, 0, "{}", started.stderr);
    let flags = [
        "--tls-ca",
        ca.as_str(),
        "--tls-cert",
        cert.as_str(),
        "--tls-key",
        key.as_str(),
        "--tls-domain",
        "localhost",
        "--token-file",
        token.as_str(),
    ];
    let endpoint = format!("https://{}", server.addr);
    let got = ctl(
        &endpoint,
        &[&["get", "tenant-a/1", "-o", "json"][..], &flags[..]].concat(),
        &[],
    )
    .await;
    assert_eq!(json(&got)["phase"], "active");
    let denied = ctl(
        &endpoint,
        &[&["get", "tenant-b/1"][..], &flags[..]].concat(),
        &[],
    )
    .await;
    assert_eq!(denied.code, 7, "{}", denied.stderr);
    let no_token = ctl(
        &endpoint,
        &[&["get", "tenant-a/1"][..], &flags[..8]].concat(),
        &[],
    )
    .await;
    assert_eq!(no_token.code, 7, "{}", no_token.stderr);
    let plaintext = ctl(
        &format!("http://{}", server.addr),
        &["get", "tenant-a/1", "--timeout", "2s"],
        &[],
    )
    .await;
    assert_eq!(plaintext.code, 1, "{}", plaintext.stderr);
    server.stop().await;
}

struct Ctl {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn ctl(endpoint: &str, args: &[&str], envs: &[(&str, &str)]) -> Ctl {
    let mut command = Command::new(CTL);
    command
        .args(args)
        .env("RESPCOORDCTL_ENDPOINT", endpoint)
        .env_remove("RESPCOORDCTL_TOKEN")
        .env_remove("RESPCOORDCTL_OUTPUT")
        .stdin(Stdio::null());
    for (key, value) in envs {
        command.env(key, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output().expect("run respcoordctl"))
        .await
        .unwrap();
    Ctl {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// An id of `-o json`: a string of decimal digits, never a number.
fn id(value: &serde_json::Value) -> u64 {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("an id is a JSON string: {value}"));
    text.parse()
        .unwrap_or_else(|e| panic!("{e}: {text} is not an id"))
}

fn json(ctl: &Ctl) -> serde_json::Value {
    assert_eq!(ctl.code, 0, "stderr: {}", ctl.stderr);
    serde_json::from_str(ctl.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", ctl.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respcoordctl_commands_json_and_exit_codes() {
    let server = Served::start(ServerConfig::default()).await;
    let e = server.endpoint();
    let started = json(
        &ctl(
            &e,
            &["-o", "json", "start", "call-9", "--request-id", "t1"],
            &[],
        )
        .await,
    );
    let first = id(&started["response_id"]);
    assert!(first > 0);
    assert_eq!(started["replayed"], false);
    assert_eq!(started["state"]["phase"], "active");
    assert_eq!(started["state"]["active_source"], "client");
    let replay = json(
        &ctl(
            &e,
            &["start", "call-9", "--request-id", "t1", "-o", "json"],
            &[],
        )
        .await,
    );
    assert_eq!(id(&replay["response_id"]), first);
    assert_eq!(replay["replayed"], true);

    let barge_in = json(
        &ctl(
            &e,
            &["start", "call-9", "--source", "vad", "--output", "json"],
            &[],
        )
        .await,
    );
    let second = id(&barge_in["response_id"]);
    assert_eq!(id(&barge_in["superseded_response_id"]), first);

    let got = json(&ctl(&e, &["get", "call-9", "-o", "json"], &[]).await);
    assert_eq!(id(&got["active_response_id"]), second);
    assert_eq!(got["active_source"], "vad");
    assert_eq!(got["revision"], 4);

    let text = ctl(&e, &["get", "call-9"], &[]).await;
    assert_eq!(text.code, 0);
    assert!(text.stdout.starts_with("call-9 active "), "{}", text.stdout);

    let listed = json(&ctl(&e, &["list", "-o", "json"], &[]).await);
    assert!(id(&listed["seq"]) >= second);
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["session_id"], "call-9");

    let stale = ctl(
        &e,
        &["finish", "call-9", &first.to_string(), "-o", "json"],
        &[],
    )
    .await;
    assert_eq!(stale.code, 8, "a stale Finish exits 8: {}", stale.stderr);
    let stale: serde_json::Value = serde_json::from_str(stale.stdout.trim()).unwrap();
    assert_eq!(
        stale["applied"], false,
        "a superseded response's Finish is stale"
    );
    let finished = json(
        &ctl(
            &e,
            &[
                "finish",
                "call-9",
                &second.to_string(),
                "--status",
                "failed",
                "-o",
                "json",
            ],
            &[],
        )
        .await,
    );
    assert_eq!(finished["applied"], true);
    assert_eq!(finished["state"]["phase"], "idle");

    let nothing = json(&ctl(&e, &["cancel", "call-9", "-o", "json"], &[]).await);
    assert_eq!(nothing["cancelled_response_id"], "0");
    let third = id(&json(&ctl(&e, &["start", "call-9", "-o", "json"], &[]).await)["response_id"]);
    let cancelled = json(
        &ctl(
            &e,
            &[
                "cancel",
                "call-9",
                "--if-response-id",
                &third.to_string(),
                "-o",
                "json",
            ],
            &[],
        )
        .await,
    );
    assert_eq!(id(&cancelled["cancelled_response_id"]), third);

    let shut = json(&ctl(&e, &["shutdown", "call-9", "-o", "json"], &[]).await);
    assert_eq!(shut["state"]["phase"], "terminated");

    // The session's whole history, then the stream ends at `terminated`.
    let watched = ctl(&e, &["watch", "call-9", "--from-start", "-o", "json"], &[]).await;
    assert_eq!(watched.code, 0, "{}", watched.stderr);
    let events: Vec<serde_json::Value> = watched
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "started",
            "cancel_requested",
            "ended",
            "started",
            "ended",
            "started",
            "cancel_requested",
            "ended",
            "terminated"
        ]
    );
    assert_eq!(events[1]["reason"], "superseded");
    assert_eq!(events[1]["source"], "vad", "the superseding Start's source");
    assert_eq!(events[6]["source"], "client", "the Cancel's source");
    assert_eq!(events[6]["reason"], "requested");
    assert_eq!(events[4]["status"], "failed");
    assert_eq!(events[8]["reason"], "shutdown");
    let revisions: Vec<u64> = events
        .iter()
        .map(|e| e["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(revisions, (1..=9).collect::<Vec<_>>());

    let all = ctl(&e, &["watch", "--from-start", "--limit", "2"], &[]).await;
    assert_eq!(all.code, 0, "{}", all.stderr);
    assert_eq!(all.stdout.lines().count(), 2);
    assert!(all.stdout.contains(" started response="), "{}", all.stdout);

    // Exit codes.
    let terminated = ctl(&e, &["start", "call-9"], &[]).await;
    assert_eq!(terminated.code, 4, "{}", terminated.stderr);
    assert!(terminated.stderr.contains("FAILED_PRECONDITION"));
    assert_eq!(ctl(&e, &["get", "nobody"], &[]).await.code, 3);
    assert_eq!(ctl(&e, &["get", ""], &[]).await.code, 2, "INVALID_ARGUMENT");
    assert_eq!(ctl(&e, &["get"], &[]).await.code, 2, "usage");
    assert_eq!(ctl(&e, &["frobnicate"], &[]).await.code, 2, "usage");
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let unreachable = ctl(&nowhere, &["get", "x", "--timeout", "2s"], &[]).await;
    assert_eq!(unreachable.code, 1, "{}", unreachable.stderr);
    // Where it tried and why, once.
    assert_eq!(
        unreachable.stderr.trim(),
        format!("respcoordctl: cannot connect to {nowhere}: connection refused")
    );
    let gone = ctl(&e, &["watch", "--after-seq", "1"], &[]).await;
    assert_eq!(gone.code, 6, "OUT_OF_RANGE: {}", gone.stderr);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respcoordctl_sends_the_token_from_a_file_or_the_environment() {
    let server = Served::start(ServerConfig {
        auth: Some(Tokens::parse("t0ken-for-the-ctl-tests").unwrap()),
        ..ServerConfig::default()
    })
    .await;
    let e = server.endpoint();
    let refused = ctl(&e, &["get", "x"], &[]).await;
    assert_eq!(refused.code, 7, "{}", refused.stderr);
    // What to do about it: where respcoordctl reads a token from.
    assert!(
        refused.stderr.contains("missing credentials")
            && refused.stderr.contains("--token-file")
            && refused.stderr.contains("RESPCOORDCTL_TOKEN"),
        "{}",
        refused.stderr
    );

    let dir = TempDir::new("ctl-token");
    let file = dir.file("token", "t0ken-for-the-ctl-tests\n");
    let file = file.to_str().unwrap();
    let by_file = ctl(&e, &["start", "tok", "--token-file", file], &[]).await;
    assert_eq!(by_file.code, 0, "{}", by_file.stderr);
    let by_env = ctl(
        &e,
        &["get", "tok"],
        &[("RESPCOORDCTL_TOKEN", "t0ken-for-the-ctl-tests")],
    )
    .await;
    assert_eq!(by_env.code, 0, "{}", by_env.stderr);
    let missing = ctl(
        &e,
        &["get", "tok", "--token-file", "/nonexistent/token"],
        &[],
    )
    .await;
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(missing.stderr.contains("--token-file"));
    server.stop().await;
}

/// `timeline` against a real session: a Start, a VAD Start that supersedes
/// it, a Cancel; as JSON and as text, from a history that lost its first
/// events, and `--follow` printing a change live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respcoordctl_timeline_reads_who_stopped_each_response() {
    let mut config = ServerConfig::default();
    config.registry.session_history = 8;
    let server = Served::start(config).await;
    let e = server.endpoint();
    for args in [
        &["start", "call-t", "--source", "client"][..],
        &["start", "call-t", "--source", "vad"],
        &["cancel", "call-t", "--source", "vad"],
    ] {
        assert_eq!(ctl(&e, args, &[]).await.code, 0);
    }
    let timeline = json(&ctl(&e, &["-o", "json", "timeline", "call-t"], &[]).await);
    assert_eq!(timeline["state"]["revision"], 6);
    assert_eq!(timeline["oldest_revision"], 0);
    let responses = timeline["responses"].as_array().unwrap();
    assert_eq!(responses.len(), 2, "{timeline}");
    let (first, second) = (&responses[0], &responses[1]);
    assert_eq!(first["source"], "client");
    assert_eq!(first["status"], "cancelled");
    assert_eq!(first["reason"], "superseded");
    assert_eq!(first["superseded_by"], second["response_id"]);
    assert_eq!(first["superseded_by_source"], "vad");
    assert_eq!(second["source"], "vad");
    assert_eq!(second["reason"], "requested");
    // Who stopped each: the superseding Start's source, the Cancel's.
    assert_eq!(first["cancel_source"], "vad");
    assert_eq!(second["cancel_source"], "vad");
    assert_eq!(second["superseded_by"], serde_json::Value::Null);
    assert!(first["duration_ms"].as_f64().unwrap() >= 0.0);

    let text = ctl(&e, &["timeline", "call-t"], &[]).await;
    assert_eq!(text.code, 0, "{}", text.stderr);
    let second_id = second["response_id"].as_str().unwrap();
    assert!(
        text.stdout
            .contains(&format!("superseded by {second_id} (vad)")),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("cancelled: requested by vad"),
        "{}",
        text.stdout
    );

    // Four more responses: 8 retained events no longer reach revision 1.
    for _ in 0..4 {
        assert_eq!(ctl(&e, &["start", "call-t"], &[]).await.code, 0);
    }
    let later = json(&ctl(&e, &["-o", "json", "timeline", "call-t"], &[]).await);
    let oldest = later["oldest_revision"].as_u64().unwrap();
    let revision = later["state"]["revision"].as_u64().unwrap();
    assert_eq!(revision, 6 + 1 + 3 * 3);
    assert_eq!(oldest, revision - 8, "{later}");

    // --follow: the retained history, then a new Start as it happens, then
    // the teardown ends it.
    let mut follow = tokio::process::Command::new(CTL)
        .args(["-o", "json", "timeline", "call-t", "--follow"])
        .env("RESPCOORDCTL_ENDPOINT", &e)
        .env_remove("RESPCOORDCTL_TOKEN")
        .env_remove("RESPCOORDCTL_OUTPUT")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn respcoordctl timeline --follow");
    let stdout = follow.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    for _ in 0..8 {
        let change = next_change(&mut lines).await;
        assert!(change["event"]["revision"].as_u64().unwrap() <= revision);
    }
    let started = json(
        &ctl(
            &e,
            &["-o", "json", "start", "call-t", "--source", "vad"],
            &[],
        )
        .await,
    );
    let new_id = started["response_id"].as_str().unwrap().to_owned();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(next_change(&mut lines).await);
    }
    assert_eq!(seen[2]["event"]["kind"], "started");
    assert_eq!(seen[2]["event"]["response_id"], new_id.as_str());
    let stopped = &seen[2]["responses"][1];
    assert_eq!(stopped["superseded_by"], new_id.as_str(), "{}", seen[2]);
    assert_eq!(ctl(&e, &["shutdown", "call-t"], &[]).await.code, 0);
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), follow.wait())
        .await
        .expect("--follow ends with the session")
        .unwrap();
    assert!(status.success());
    server.stop().await;
}

/// The next line of a `--follow -o json`, as JSON.
async fn next_change<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
) -> serde_json::Value {
    let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("a line in time")
        .expect("stdout readable")
        .expect("a line before the end");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Ids past 2^53 (the memory backend's are near the boot time in
/// nanoseconds) print as JSON strings in every command, the same string
/// everywhere, and go back in as printed, with or without jq's quotes: a
/// number would come back from jq or JavaScript as another id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_strings_that_round_trip_past_2_pow_53() {
    const EXACT: u64 = 1 << 53;
    let server = Served::start(ServerConfig::default()).await;
    let e = server.endpoint();
    let first = json(&ctl(&e, &["-o", "json", "start", "jq-demo"], &[]).await);
    let first_id = first["response_id"].as_str().expect("a string").to_owned();
    assert!(id(&first["response_id"]) > EXACT, "{first}");
    assert_eq!(first["superseded_response_id"], "0");
    assert_eq!(first["state"]["active_response_id"], first_id.as_str());
    let second = json(&ctl(&e, &["-o", "json", "start", "jq-demo"], &[]).await);
    let second_id = second["response_id"].as_str().unwrap().to_owned();
    assert_eq!(second["superseded_response_id"], first_id.as_str());
    // As a double, the id would be another number: the string keeps it.
    let rounded = id(&second["response_id"]) as f64 as u64;
    assert_ne!(
        rounded.to_string(),
        second_id,
        "pick an id a double cannot hold"
    );

    let got = json(&ctl(&e, &["-o", "json", "get", "jq-demo"], &[]).await);
    assert_eq!(got["active_response_id"], second_id.as_str());
    let listed = json(&ctl(&e, &["-o", "json", "list"], &[]).await);
    assert!(id(&listed["seq"]) > EXACT, "{listed}");
    assert_eq!(
        listed["sessions"][0]["active_response_id"],
        second_id.as_str()
    );
    let events = ctl(
        &e,
        &[
            "-o",
            "json",
            "watch",
            "jq-demo",
            "--from-start",
            "--limit",
            "4",
        ],
        &[],
    )
    .await;
    assert_eq!(events.code, 0, "{}", events.stderr);
    let events: Vec<serde_json::Value> = events
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events[0]["response_id"], first_id.as_str());
    assert_eq!(events[3]["response_id"], second_id.as_str());
    for event in &events {
        assert!(id(&event["seq"]) > EXACT, "{event}");
        assert!(event["unix_nanos"].as_str().is_some(), "{event}");
        assert!(
            event["revision"].is_u64(),
            "revisions stay numbers: {event}"
        );
    }
    // Back in as printed: jq -r's bare digits, or jq's quoted string.
    let stale = ctl(&e, &["-o", "json", "finish", "jq-demo", &first_id], &[]).await;
    assert_eq!(
        stale.code, 8,
        "the superseded one is stale: {}",
        stale.stderr
    );
    let stale: serde_json::Value = serde_json::from_str(stale.stdout.trim()).unwrap();
    assert_eq!(stale["response_id"], first_id.as_str());
    let quoted = format!("\"{second_id}\"");
    let finished = json(&ctl(&e, &["-o", "json", "finish", "jq-demo", &quoted], &[]).await);
    assert_eq!(finished["applied"], true, "{finished}");
    assert_eq!(finished["response_id"], second_id.as_str());
    let third = json(&ctl(&e, &["-o", "json", "start", "jq-demo"], &[]).await);
    let third_id = third["response_id"].as_str().unwrap().to_owned();
    let quoted = format!("\"{third_id}\"");
    let cancelled = json(
        &ctl(
            &e,
            &[
                "-o",
                "json",
                "cancel",
                "jq-demo",
                "--if-response-id",
                &quoted,
            ],
            &[],
        )
        .await,
    );
    assert_eq!(cancelled["cancelled_response_id"], third_id.as_str());
    let garbage = ctl(&e, &["finish", "jq-demo", "1.796e18"], &[]).await;
    assert_eq!(garbage.code, 2, "{}", garbage.stderr);
    server.stop().await;
}

/// Every subcommand's help says what its positional arguments are, and
/// `start` what `--source` means.
#[test]
fn help_describes_every_argument() {
    let help = |command: &str| {
        let output = Command::new(CTL)
            .args([command, "-h"])
            .output()
            .expect("run respcoordctl --help");
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let start = help("start");
    assert!(start.contains("<SESSION>  The session id"), "{start}");
    assert!(start.contains("Who asks for the response"), "{start}");
    assert!(start.contains("vad"), "{start}");
    for command in ["get", "watch", "timeline", "finish", "cancel", "shutdown"] {
        let text = help(command);
        let arguments = text
            .split("Arguments:")
            .nth(1)
            .unwrap_or_else(|| panic!("{command}: no arguments section: {text}"));
        let arguments = arguments.split("Options:").next().unwrap();
        for line in arguments
            .lines()
            .filter(|l| l.trim_start().starts_with('<'))
        {
            let described = line.trim().split_once("  ").map(|(_, d)| d.trim());
            assert!(
                described.is_some_and(|d| !d.is_empty()),
                "{command}: {line:?} has no description"
            );
        }
    }
    let finish = help("finish");
    assert!(finish.contains("Exits 8"), "{finish}");
    // The long form says what each source means.
    let long = Command::new(CTL)
        .args(["start", "--help"])
        .output()
        .expect("run respcoordctl start --help");
    let long = String::from_utf8_lossy(&long.stdout);
    assert!(long.contains("vad:") && long.contains("barge-in"), "{long}");
}
