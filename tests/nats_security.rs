//! Secured NATS end to end, against real nats-servers started here (one per
//! test, so they run in parallel): user and password, a token, an nkey seed
//! file, a `.creds` file in decentralized (operator) mode with JWTs signed
//! here, TLS with a private CA and mutual TLS. For each, a replica connected
//! with the right `NatsSecurity` starts and finishes a response, and one with
//! missing or wrong credentials is refused with an error that never carries
//! the secret. The real binary serves with a password file, and keeps the
//! password and token out of `serve --help` and out of its logs when NATS
//! refuses it.
//!
//! nats-server is `RESPCOORD_TEST_NATS_SERVER`, else the 2.14.6 that
//! `scripts/nats-server.sh` installs.

mod common;

#[path = "common/ca.rs"]
#[allow(dead_code)] // write_mutual_tls_files is the scenario fixture's
mod ca;

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    sync::OnceLock,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use ca::Ca;
use common::*;
use nkeys::KeyPair;
use respcoord::{
    ids::SessionId,
    machine::{FinishStatus, Source},
    nats::{NatsCoordinator, NatsError, NatsSecurity, NatsSettings, Secret},
    proto::v1 as pb,
    registry::CoordConfig,
};
use serde_json::json;

const USER: &str = "respcoord";
const PASSWORD: &str = "pw-3b8e0c71f4a9d6e2";
const WRONG_PASSWORD: &str = "pw-wrong-9d1c4e7a20b5";
const TOKEN: &str = "tok-5f2a8d9e1c7b3064";
const WRONG_TOKEN: &str = "tok-wrong-0e6b2d4f8a17";

/// What an authentication failure says, whichever way was refused.
const AUTH_REFUSED: &str = "authorization violation";

// ---- a nats-server of the test's own ----

fn nats_server_binary() -> &'static str {
    static BINARY: OnceLock<String> = OnceLock::new();
    BINARY.get_or_init(|| {
        std::env::var("RESPCOORD_TEST_NATS_SERVER").unwrap_or_else(|_| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nats-server.sh");
            let output = Command::new(script)
                .arg("2.14.6")
                .stderr(Stdio::inherit())
                .output()
                .expect("run scripts/nats-server.sh");
            assert!(output.status.success(), "scripts/nats-server.sh failed");
            String::from_utf8(output.stdout)
                .expect("a path")
                .trim()
                .to_owned()
        })
    })
}

/// A directory for one test's keys, certificates and server store; removed
/// when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("respcoord-nats-security-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).expect("create the scratch directory");
        Self(dir)
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write a scratch file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// nats-server with JetStream on a free loopback port, configured with
/// `security` (config file syntax); killed, and its scratch directory
/// removed, when dropped (fields drop in order: the process first).
struct Nats {
    child: KillOnDrop,
    port: u16,
    log: PathBuf,
    _scratch: Scratch,
}

impl Nats {
    fn start(scratch: Scratch, security: &str) -> Self {
        let port = free_port();
        let config = scratch.write(
            "nats-server.conf",
            &format!(
                "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: \"{}\" }}\n{security}\n",
                scratch.0.join("jetstream").display()
            ),
        );
        let log = scratch.0.join("nats-server.log");
        let child = Command::new(nats_server_binary())
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("create the server log"))
            .spawn()
            .expect("spawn nats-server");
        let mut nats = Self {
            child: KillOnDrop::new(child),
            port,
            log,
            _scratch: scratch,
        };
        // A bad configuration exits at once: say why, from its own log.
        let deadline = Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = nats.child.try_wait().expect("wait") {
                panic!("nats-server exited with {status}:\n{}", nats.log());
            }
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        nats
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

// ---- connecting a replica ----

async fn connect(url: String, security: NatsSecurity) -> Result<NatsCoordinator, NatsError> {
    let settings = NatsSettings {
        url,
        bucket: fresh_bucket(),
        request_timeout: Duration::from_secs(5),
        memory_storage: true,
        security,
        ..NatsSettings::default()
    };
    NatsCoordinator::connect(&settings, CoordConfig::default()).await
}

/// A replica connected with `security` starts a response and finishes it:
/// the bucket was created and written through the secured connection.
async fn assert_serves(nats: &Nats, url: String, security: NatsSecurity) {
    let coordinator = connect(url, security)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}\nnats-server log:\n{}", nats.log()));
    let id = SessionId::parse("secured").expect("a session id");
    let started = coordinator
        .start(&id, Source::Client, None)
        .await
        .expect("start");
    let finished = coordinator
        .finish(&id, Some(started.response), FinishStatus::Completed)
        .await
        .expect("finish");
    assert!(finished.result, "the started response was finished");
}

/// Connecting with `security` fails at the connection (not later, at the
/// bucket), saying `why`, and neither the message nor its debug form holds
/// any of `secrets`.
async fn assert_refused(url: String, security: NatsSecurity, why: &str, secrets: &[&str]) {
    let error = match connect(url, security).await {
        Ok(_) => panic!("connected without the right credentials"),
        Err(error) => error,
    };
    assert!(
        matches!(error, NatsError::Connect { .. }),
        "refused at the connection: {error:?}"
    );
    let (text, debug) = (error.to_string(), format!("{error:?}"));
    assert!(text.to_lowercase().contains(why), "says {why:?}: {text}");
    for secret in secrets {
        assert!(
            !text.contains(secret) && !debug.contains(secret),
            "a secret in the error: {text} / {debug}"
        );
    }
}

fn password(user: &str, password: &str) -> NatsSecurity {
    NatsSecurity {
        user: Some(user.into()),
        password: Some(Secret::new(password)),
        ..NatsSecurity::default()
    }
}

fn password_server() -> Nats {
    Nats::start(
        Scratch::new(),
        &format!("authorization {{ user: \"{USER}\", password: \"{PASSWORD}\", timeout: 10 }}"),
    )
}

// ---- user and password, token, nkey ----

#[tokio::test]
async fn user_and_password_authenticate_and_a_missing_or_wrong_password_is_refused() {
    let nats = password_server();
    assert_serves(&nats, nats.url("nats"), password(USER, PASSWORD)).await;
    let secrets = [PASSWORD, WRONG_PASSWORD];
    let url = || nats.url("nats");
    assert_refused(url(), NatsSecurity::default(), AUTH_REFUSED, &secrets).await;
    assert_refused(
        url(),
        password(USER, WRONG_PASSWORD),
        AUTH_REFUSED,
        &secrets,
    )
    .await;
}

#[tokio::test]
async fn a_token_authenticates_and_a_missing_or_wrong_token_is_refused() {
    let nats = Nats::start(
        Scratch::new(),
        &format!("authorization {{ token: \"{TOKEN}\", timeout: 10 }}"),
    );
    let token = |token: &str| NatsSecurity {
        token: Some(Secret::new(token)),
        ..NatsSecurity::default()
    };
    assert_serves(&nats, nats.url("nats"), token(TOKEN)).await;
    let secrets = [TOKEN, WRONG_TOKEN];
    let url = || nats.url("nats");
    assert_refused(url(), NatsSecurity::default(), AUTH_REFUSED, &secrets).await;
    assert_refused(url(), token(WRONG_TOKEN), AUTH_REFUSED, &secrets).await;
}

fn seed(key: &KeyPair) -> String {
    key.seed().expect("a generated key has a seed")
}

#[tokio::test]
async fn an_nkey_seed_file_authenticates_and_another_users_or_an_account_seed_is_refused() {
    let (user, stranger) = (KeyPair::new_user(), KeyPair::new_user());
    let scratch = Scratch::new();
    let seed_file = scratch.write("user.nk", &format!("{}\n", seed(&user)));
    let stranger_file = scratch.write("stranger.nk", &seed(&stranger));
    let account_seed = seed(&KeyPair::new_account());
    let account_file = scratch.write("account.nk", &account_seed);
    let nats = Nats::start(
        scratch,
        &format!(
            "authorization {{ users: [ {{ nkey: \"{}\" }} ], timeout: 10 }}",
            user.public_key()
        ),
    );
    let nkey = |path: &Path| NatsSecurity {
        nkey_seed_file: Some(path.to_owned()),
        ..NatsSecurity::default()
    };
    assert_serves(&nats, nats.url("nats"), nkey(&seed_file)).await;
    let secrets = [seed(&user), seed(&stranger)];
    let secrets = secrets.each_ref().map(String::as_str);
    let url = || nats.url("nats");
    assert_refused(url(), NatsSecurity::default(), AUTH_REFUSED, &secrets).await;
    assert_refused(url(), nkey(&stranger_file), AUTH_REFUSED, &secrets).await;
    // Only user nkeys authenticate clients: another kind of seed is named
    // at start rather than left to the server's opaque refusal.
    match connect(url(), nkey(&account_file)).await {
        Err(NatsError::Security(why)) => assert!(
            why.contains("account.nk") && !why.contains(&account_seed),
            "names the file, not the seed: {why}"
        ),
        Err(other) => panic!("refused at start, not by the server: {other}"),
        Ok(_) => panic!("connected with an account seed"),
    }
}

// ---- decentralized auth: operator, account and user JWTs ----

/// A NATS JWT (v2) issued by `issuer` for `subject`, as nats-io/jwt encodes
/// one: base64url without padding, signed over `header.claims`. The `jti` is
/// only an identifier to the server (the library makes it a hash of the
/// claims; nothing checks that), so a unique string does.
fn jwt(issuer: &KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
    let issued_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let claims = json!({
        "jti": unique_suffix(),
        "iat": issued_at,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let signed = format!(
        "{}.{}",
        b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#),
        b64(claims.to_string().as_bytes())
    );
    let signature = issuer.sign(signed.as_bytes()).expect("sign the JWT");
    format!("{signed}.{}", b64(&signature))
}

/// A `.creds` file as `nsc generate creds` writes it.
fn creds(user_jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

#[tokio::test]
async fn a_creds_file_authenticates_in_operator_mode_and_a_stolen_jwt_is_refused() {
    let (operator, account) = (KeyPair::new_operator(), KeyPair::new_account());
    let (user, thief) = (KeyPair::new_user(), KeyPair::new_user());
    // JetStream will not start in operator mode without a system account.
    let system = KeyPair::new_account();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "test-operator",
        json!({ "system_account": system.public_key(), "type": "operator", "version": 2 }),
    );
    let account_jwt = |key: &KeyPair, name: &str, jetstream: i64| {
        // JetStream limits sit beside the others in `limits` (nats-io/jwt
        // embeds JetStreamLimits in OperatorLimits); zero storage leaves
        // JetStream off for the account, as the system account needs.
        let limits = json!({
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": jetstream, "disk_storage": jetstream,
            "streams": jetstream, "consumer": jetstream,
        });
        let claims = json!({ "limits": limits, "type": "account", "version": 2 });
        jwt(&operator, &key.public_key(), name, claims)
    };
    let preload = format!(
        "{}: \"{}\", {}: \"{}\"",
        account.public_key(),
        account_jwt(&account, "respcoord", -1),
        system.public_key(),
        account_jwt(&system, "SYS", 0)
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "respcoord",
        json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2,
        }),
    );
    let scratch = Scratch::new();
    let operator_file = scratch.write("operator.jwt", &operator_jwt);
    let creds_file = scratch.write("user.creds", &creds(&user_jwt, &seed(&user)));
    // The user's JWT is public; without the user's seed it must not do.
    let stolen_file = scratch.write("stolen.creds", &creds(&user_jwt, &seed(&thief)));
    let nats = Nats::start(
        scratch,
        &format!(
            "operator: \"{}\"\nresolver: MEMORY\nresolver_preload: {{ {preload} }}",
            operator_file.display()
        ),
    );
    let with_creds = |path: &Path| NatsSecurity {
        creds_file: Some(path.to_owned()),
        ..NatsSecurity::default()
    };
    assert_serves(&nats, nats.url("nats"), with_creds(&creds_file)).await;
    let secrets = [seed(&user), seed(&thief)];
    let secrets = secrets.each_ref().map(String::as_str);
    let url = || nats.url("nats");
    assert_refused(url(), NatsSecurity::default(), AUTH_REFUSED, &secrets).await;
    assert_refused(url(), with_creds(&stolen_file), AUTH_REFUSED, &secrets).await;
}

// ---- TLS ----

/// The CA's certificate and a server certificate it signed for 127.0.0.1
/// (an IP SAN: the URLs name the address) in `scratch`, and the server's
/// `tls` block, with `extra` settings.
fn tls_block(scratch: &Scratch, ca: &Ca, extra: &str) -> String {
    let (cert, key) = ca.leaf("127.0.0.1").expect("server certificate");
    // A generous handshake timeout: two cores may be busy building.
    format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", timeout: 10 {extra} }}",
        scratch.write("server.pem", &cert).display(),
        scratch.write("server-key.pem", &key).display()
    )
}

fn trusting(ca: &Path) -> NatsSecurity {
    NatsSecurity {
        tls_ca: Some(ca.to_owned()),
        ..NatsSecurity::default()
    }
}

#[tokio::test]
async fn tls_with_a_private_ca_serves_and_a_server_from_another_ca_is_refused() {
    let (ca, stranger) = (Ca::new("NATS CA").unwrap(), Ca::new("another CA").unwrap());
    let scratch = Scratch::new();
    let ca_file = scratch.write("ca.pem", &ca.pem);
    let stranger_file = scratch.write("stranger-ca.pem", &stranger.pem);
    let tls = tls_block(&scratch, &ca, "");
    let nats = Nats::start(scratch, &tls);
    // `tls://` asks for TLS by itself; `nats://` with a CA does too.
    assert_serves(&nats, nats.url("tls"), trusting(&ca_file)).await;
    assert_serves(&nats, nats.url("nats"), trusting(&ca_file)).await;
    let refused = "invalid peer certificate";
    assert_refused(nats.url("tls"), trusting(&stranger_file), refused, &[]).await;
    // Without a CA of its own the platform's roots are used, which do not
    // know this server either (or cannot be loaded: refused all the same).
    assert_refused(nats.url("nats"), NatsSecurity::default(), "", &[]).await;
}

#[tokio::test]
async fn mutual_tls_serves_and_a_missing_or_foreign_client_certificate_is_refused() {
    let [server_ca, client_ca, stranger] =
        ["NATS CA", "client CA", "another CA"].map(|name| Ca::new(name).unwrap());
    let scratch = Scratch::new();
    let server_ca_file = scratch.write("ca.pem", &server_ca.pem);
    let client_ca_file = scratch.write("client-ca.pem", &client_ca.pem);
    let identity = |ca: &Ca, tag: &str| {
        let (cert, key) = ca.leaf("respcoord").expect("client certificate");
        let cert_file = scratch.write(&format!("{tag}.pem"), &cert);
        (
            cert_file,
            scratch.write(&format!("{tag}-key.pem"), &key),
            key,
        )
    };
    let (cert, key, key_pem) = identity(&client_ca, "client");
    let (foreign_cert, foreign_key, foreign_key_pem) = identity(&stranger, "foreign");
    let tls = tls_block(
        &scratch,
        &server_ca,
        &format!(", ca_file: \"{}\", verify: true", client_ca_file.display()),
    );
    let nats = Nats::start(scratch, &tls);
    let presenting = |cert: &Path, key: &Path| NatsSecurity {
        tls_cert: Some(cert.to_owned()),
        tls_key: Some(key.to_owned()),
        ..trusting(&server_ca_file)
    };
    assert_serves(&nats, nats.url("nats"), presenting(&cert, &key)).await;
    // Where the refusal surfaces (the handshake, or the first read after
    // it under TLS 1.3) is the server's timing, so no wording is required.
    let key_bodies = [&key_pem, &foreign_key_pem].map(|pem| pem.lines().nth(1).unwrap());
    let url = || nats.url("nats");
    assert_refused(url(), trusting(&server_ca_file), "", &key_bodies).await;
    let foreign = presenting(&foreign_cert, &foreign_key);
    assert_refused(url(), foreign, "", &key_bodies).await;
}

// ---- the binary ----

#[test]
fn serve_help_shows_neither_the_nats_password_nor_the_token_from_the_environment() {
    let output = Command::new(RESPCOORD_BIN)
        .args(["serve", "--help"])
        .env("RESPCOORD_NATS_PASSWORD", PASSWORD)
        .env("RESPCOORD_NATS_TOKEN", TOKEN)
        .output()
        .expect("run respcoord serve --help");
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(printed.contains("--nats-password-file"), "{printed}");
    assert!(!printed.contains(PASSWORD), "the password in --help");
    assert!(!printed.contains(TOKEN), "the token in --help");
}

fn wait_exit(child: &mut KillOnDrop) -> ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "respcoord did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn the_binary_exits_on_a_wrong_nats_password_without_logging_it() {
    let nats = password_server();
    let scratch = Scratch::new();
    let log = scratch.0.join("respcoord.log");
    let log_to = || Stdio::from(File::create(&log).expect("create the log"));
    let mut command = Command::new(RESPCOORD_BIN);
    command
        .args([
            "serve",
            "--backend",
            "nats",
            "--nats-url",
            &nats.url("nats"),
        ])
        .args(["--listen", "127.0.0.1:0", "--nats-user", USER])
        .env("RESPCOORD_NATS_PASSWORD", WRONG_PASSWORD)
        // Everything at trace level, our crate and async-nats alike.
        .env("RESPCOORD_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(log_to())
        .stderr(log_to());
    let mut child = KillOnDrop::new(command.spawn().expect("spawn respcoord"));
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut child))
        .await
        .unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "exits non-zero: {status}\n{logged}");
    assert!(
        logged.contains("cannot start the NATS backend") && logged.contains(AUTH_REFUSED),
        "says why: {logged}"
    );
    assert!(!logged.contains(WRONG_PASSWORD), "the password was logged");
}

#[tokio::test]
async fn the_binary_serves_with_a_nats_password_file() {
    let nats = password_server();
    let scratch = Scratch::new();
    let password_file = scratch.write("nats-password", &format!("{PASSWORD}\n"));
    let log = scratch.0.join("respcoord.log");
    let bucket = fresh_bucket();
    let process = spawn_respcoord_with(
        &[
            "--backend",
            "nats",
            "--nats-url",
            &nats.url("nats"),
            "--nats-user",
            USER,
            "--nats-password-file",
            password_file.to_str().unwrap(),
            "--nats-bucket",
            &bucket,
            "--nats-memory-storage",
        ],
        &[],
        Stdio::from(File::create(&log).expect("create the log")),
    );
    // Both ports are bound before NATS is reached, so a call that is
    // answered proves the connection; a refused one ends the process.
    let answered = tokio::time::timeout(PATIENCE, async {
        let mut client = Client::connect(process.endpoint.clone())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = start_req("over-secured-nats", pb::Source::Client, "");
        client.start(request).await.map_err(|s| format!("{s:?}"))
    })
    .await;
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(matches!(answered, Ok(Ok(_))), "{answered:?}\n{}", logged());
    assert!(!logged().contains(PASSWORD), "the password was logged");
}

// ---- least privilege ----

/// The NATS permissions a replica needs on bucket `bucket`, as
/// docs/cluster.md ("NATS permissions") lists them, in config file syntax.
fn least_privilege(bucket: &str) -> String {
    let stream = format!("KV_{bucket}");
    let publish = [
        format!("$JS.API.STREAM.INFO.{stream}"),
        format!("$JS.API.STREAM.CREATE.{stream}"),
        format!("$JS.API.STREAM.MSG.GET.{stream}"),
        // The key history's consumer is created without a name (the
        // stream's subject alone), the follower's with one.
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"),
        // Flow control of the key history's consumer: answered once a
        // history outgrows the consumer's window, not in this test.
        format!("$JS.FC.{stream}.>"),
        format!("$KV.{bucket}.>"),
    ];
    let subscribe = [
        "_INBOX.>".to_owned(),
        format!("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}"),
    ];
    let quoted = |subjects: &[String]| {
        subjects
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "authorization {{ users: [ {{ user: \"{USER}\", password: \"{PASSWORD}\", \
         permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [{}] }} }} }} ] }}",
        quoted(&publish),
        quoted(&subscribe)
    )
}

/// A replica whose NATS user may do only what docs/cluster.md lists creates
/// its bucket and serves every kind of call and watch, and nats-server
/// reports no permissions violation: the list is complete. Without the
/// bucket's subjects the same user is refused.
#[tokio::test]
async fn a_replica_serves_with_only_the_documented_nats_permissions() {
    let bucket = fresh_bucket();
    let nats = Nats::start(Scratch::new(), &least_privilege(&bucket));
    let settings = NatsSettings {
        url: nats.url("nats"),
        bucket: bucket.clone(),
        request_timeout: Duration::from_secs(5),
        memory_storage: true,
        security: password(USER, PASSWORD),
        ..NatsSettings::default()
    };
    let coordinator = NatsCoordinator::connect(&settings, CoordConfig::default())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}\nnats-server log:\n{}", nats.log()));
    let id = SessionId::parse("least-privilege").expect("a session id");
    let mut watch = coordinator
        .watch_session(&id, None)
        .await
        .expect("watch the session");
    let mut watch_all = coordinator
        .watch_all(&respcoord::ids::SessionScope::All, None)
        .await
        .expect("watch every session");
    let first = coordinator
        .start(&id, Source::Client, None)
        .await
        .expect("start");
    let second = coordinator
        .start(&id, Source::Vad, None)
        .await
        .expect("supersede");
    assert!(second.response > first.response);
    let stale = coordinator
        .finish(&id, Some(first.response), FinishStatus::Completed)
        .await
        .expect("a stale finish (a quorum point)");
    assert!(
        !stale.result,
        "the superseded response is not finished again"
    );
    coordinator
        .cancel(&id, None, Source::Vad)
        .await
        .expect("cancel");
    coordinator.state(&id).await.expect("get state");
    coordinator
        .list(&respcoord::ids::SessionScope::All, 10, None)
        .await
        .expect("list");
    let replayed = coordinator
        .watch_session(&id, Some(0))
        .await
        .unwrap_or_else(|e| panic!("a session watch from its history: {e}\n{}", nats.log()));
    drop(replayed);
    coordinator.shutdown(&id).await.expect("shutdown");
    for (name, subscription) in [("session", &mut watch), ("every session", &mut watch_all)] {
        let delivery = tokio::time::timeout(PATIENCE, subscription.next(16))
            .await
            .unwrap_or_else(|_| panic!("the {name} watch received nothing"))
            .expect("events");
        assert!(
            matches!(delivery, respcoord::events::Delivery::Events { ref events, .. } if !events.is_empty()),
            "the {name} watch received events: {delivery:?}"
        );
    }
    let log = nats.log();
    assert!(
        !log.contains("Violation"),
        "nats-server reported a permissions violation: a permission docs/cluster.md \
         does not list is needed:\n{log}"
    );

    // The same user on another bucket has none of its subjects.
    let elsewhere = NatsSettings {
        bucket: fresh_bucket(),
        request_timeout: Duration::from_secs(2),
        ..settings
    };
    assert!(
        NatsCoordinator::connect(&elsewhere, CoordConfig::default())
            .await
            .is_err(),
        "a bucket the user has no permissions on was opened"
    );
}
