//! The real `respcoord` binary: configuration from flags and `RESPCOORD_*`
//! variables, idle expiry over the wire, SIGTERM draining (watches end with
//! OK, exit status 0), and exit status 2 naming the flag on bad configuration.

mod common;

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::*;
use respcoord::proto::v1 as pb;

const BIN: &str = env!("CARGO_BIN_EXE_respcoord");

struct Process {
    child: Child,
    endpoint: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

async fn spawn(envs: &[(&str, &str)]) -> (Process, Client) {
    let port = free_port();
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (key, value) in envs {
        command.env(key, value);
    }
    let child = command.spawn().expect("spawn respcoord");
    let process = Process {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + PATIENCE;
    loop {
        match pb::response_coordinator_client::ResponseCoordinatorClient::connect(
            process.endpoint.clone(),
        )
        .await
        {
            Ok(client) => return (process, client),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => panic!("respcoord did not start listening: {error}"),
        }
    }
}

fn wait_exit(process: &mut Process) -> std::process::ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = process.child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "respcoord did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn sigterm_ends_watches_cleanly_and_exits_zero() {
    let (mut process, mut c) = spawn(&[]).await;
    let mut session = watch_session(&mut c, "s", None).await;
    let mut all = watch_all(&mut c, Some(0)).await;
    let id = start(&mut c, "s").await.response_id;
    assert_eq!(
        evs(&next_events(&mut session, 1).await),
        [Ev::Started(id, pb::Source::Client)]
    );
    assert_eq!(next_events(&mut all, 1).await.len(), 1);

    let pid = process.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());

    let (events, end) = drain(&mut session).await;
    assert!(events.is_empty());
    end.expect("the session watch ends with OK at shutdown");
    let (_, end) = drain(&mut all).await;
    end.expect("watch-all ends with OK at shutdown");
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut process))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM");
}

#[tokio::test]
async fn idle_sessions_expire_over_the_wire_with_ttls_from_the_environment() {
    let (_process, mut c) = spawn(&[
        ("RESPCOORD_SESSION_IDLE_TTL", "1s"),
        ("RESPCOORD_TOMBSTONE_TTL", "1s"),
    ])
    .await;
    let mut w = watch_session(&mut c, "s", None).await;
    let sent = Instant::now();
    let id = start(&mut c, "s").await.response_id;
    let (events, end) = drain(&mut w).await;
    let expired_after = sent.elapsed();
    end.unwrap();
    use pb::{CancelReason as R, TerminalStatus as T};
    assert_eq!(
        evs(&events),
        [
            Ev::Started(id, pb::Source::Client),
            Ev::CancelRequested(id, R::Expired),
            Ev::Ended(id, T::Cancelled, R::Expired),
            Ev::Terminated(R::Expired),
        ]
    );
    assert!(
        expired_after >= Duration::from_secs(1),
        "expired after {expired_after:?}, before the TTL"
    );
    // The tombstone is forgotten after its TTL; the id then starts afresh.
    let deadline = Instant::now() + PATIENCE;
    while get_state(&mut c, "s").await.is_ok() {
        assert!(Instant::now() < deadline, "tombstone never forgotten");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = start(&mut c, "s").await;
    assert!(again.response_id > id);
    assert_eq!(again.state.unwrap().revision, 1);
}

#[test]
fn bad_configuration_exits_2_naming_the_flag() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        (&["--session-idle-ttl", "0s"], &[], "--session-idle-ttl"),
        (&["--tombstone-ttl", "soon"], &[], "--tombstone-ttl"),
        (&["--max-sessions", "0"], &[], "--max-sessions"),
        (&[], &[("RESPCOORD_MAX_SESSIONS", "lots")], "--max-sessions"),
        (&["--listen", "not-an-address"], &[], "--listen"),
    ];
    for (args, envs, flag) in cases {
        let mut command = Command::new(BIN);
        command.arg("serve").args(args);
        for (key, value) in envs {
            command.env(key, value);
        }
        let output = command.output().expect("run respcoord");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?} {envs:?}: {stderr}");
        assert!(
            stderr.contains(flag),
            "{args:?} {envs:?}: message must name {flag}: {stderr}"
        );
    }
}
