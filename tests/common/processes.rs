//! Tests that run real binaries: free loopback ports, a child process that
//! cannot outlive its test, the `respcoord` binary started and waited for,
//! and `nats-server` command lines (for the tests that kill and restart
//! their own NATS).

use std::{
    net::{SocketAddr, TcpListener},
    ops::{Deref, DerefMut},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use respcoord::proto::v1 as pb;

use super::{Client, PATIENCE};

/// The server binary Cargo built for this test run.
pub const RESPCOORD_BIN: &str = env!("CARGO_BIN_EXE_respcoord");

/// A free loopback port: bound, read and released, for a child process to
/// bind next.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `n` free loopback ports: bound all at once so they differ, then released.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind loopback"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

/// A child process that is SIGKILLed and reaped when dropped, so a test that
/// panics midway leaves no server running (or holding its port) behind.
pub struct KillOnDrop(Child);

impl KillOnDrop {
    pub fn new(child: Child) -> Self {
        Self(child)
    }

    /// SIGKILL now: a crash, no goodbye (what dropping it does, said aloud).
    pub fn kill(self) {
        drop(self);
    }
}

impl Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `addr` accepts connections; panics, naming `what`, if `child`
/// exits first or it takes longer than [`PATIENCE`].
pub fn wait_listening(child: &mut Child, addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("{what} exited with {status} before listening");
        }
        assert!(Instant::now() < deadline, "{what} did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The real `respcoord` binary serving on loopback; killed on drop.
pub struct RespcoordProcess {
    pub child: KillOnDrop,
    /// The gRPC endpoint, `http://127.0.0.1:port`.
    pub endpoint: String,
    /// The metrics port: `/metrics`, `/healthz`, `/readyz`.
    pub metrics: SocketAddr,
}

/// Starts `respcoord serve` on gRPC `port` with a fresh metrics port, `args`
/// and `envs`, and waits until it listens. A fixed `port` lets a test
/// restart the server where its clients expect it.
pub fn spawn_respcoord_on(
    port: u16,
    args: &[&str],
    envs: &[(&str, &str)],
    stderr: Stdio,
) -> RespcoordProcess {
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("a loopback address");
    let mut command = Command::new(RESPCOORD_BIN);
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &metrics.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    for (key, value) in envs {
        command.env(key, value);
    }
    let mut child = KillOnDrop::new(command.spawn().expect("spawn respcoord"));
    // Both ports are bound before either serves.
    wait_listening(&mut child, metrics, "respcoord");
    RespcoordProcess {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
        metrics,
    }
}

/// [`spawn_respcoord_on`] a free port.
pub fn spawn_respcoord_with(
    args: &[&str],
    envs: &[(&str, &str)],
    stderr: Stdio,
) -> RespcoordProcess {
    spawn_respcoord_on(free_port(), args, envs, stderr)
}

/// `respcoord serve` with `envs` on a free port, and a client connected to it.
pub async fn spawn_respcoord(envs: &[(&str, &str)]) -> (RespcoordProcess, Client) {
    let process = spawn_respcoord_with(&[], envs, Stdio::null());
    let client = client_for(&process).await;
    (process, client)
}

/// A client of `process`, once it listens.
pub async fn client_for(process: &RespcoordProcess) -> Client {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match pb::response_coordinator_client::ResponseCoordinatorClient::connect(
            process.endpoint.clone(),
        )
        .await
        {
            Ok(client) => return client,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => panic!("respcoord did not start listening: {error}"),
        }
    }
}

/// The nats-server binary a test that runs its own uses: the one `var`
/// names, else the newest pinned release (`scripts/nats-server.sh`, which
/// installs it under target/ on first use).
pub fn nats_server_binary(var: &str) -> String {
    if let Ok(binary) = std::env::var(var) {
        return binary;
    }
    pinned_nats_server()
        .unwrap_or_else(|why| panic!("set {var} to a nats-server 2.10 or newer: {why}"))
}

/// The path `scripts/nats-server.sh` prints (the newest pinned release).
pub fn pinned_nats_server() -> Result<String, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/nats-server.sh");
    let output = Command::new(script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{script}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{script} failed: {}", output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// `binary` on loopback `port` with JetStream storing under `store`, its
/// output discarded; the caller adds any further flags (a cluster's) and
/// spawns it.
pub fn nats_server_command(binary: &str, port: u16, store: &Path) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}
