//! The system under test: three nats-server 2.10 nodes forming a JetStream
//! cluster and two or three `respcoord serve --backend nats` replicas on one
//! R3 bucket, each process in its own namespace of [`Net`], and the faults
//! a run injects into them: links cut and healed, processes paused
//! (SIGSTOP/SIGCONT), killed and restarted, clocks skewed and the
//! compare-and-set guard turned off (environment read by the binary's
//! `fault-injection` build).
//!
//! Every process is SIGKILLed on drop, before the namespaces go; the run's
//! directory (node configs and stores, every process's log) is removed
//! unless the run panicked or `RESPCOORD_TEST_KEEP_NATS` is set.

use std::{
    fs,
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use respcoord::proto::v1 as pb;
use tonic::{transport::Channel, Code};

use crate::netns::{Host, Net};

pub const NODES: usize = 3;
pub const CLIENT_PORT: u16 = 4222;
const ROUTE_PORT: u16 = 6222;
/// nats-server's monitoring port (`/connz`: which replica dials which node).
pub const MONITOR_PORT: u16 = 8222;
pub const GRPC_PORT: u16 = 50051;
/// The cluster must have formed and a replica created the bucket within it.
const READY: Duration = Duration::from_secs(40);

pub type RawClient = pb::response_coordinator_client::ResponseCoordinatorClient<Channel>;

/// A child process SIGKILLed and reaped on drop.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).expect("a pid fits i32")
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child, which is not yet reaped.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a replica is started: which nodes it dials and which faults its
/// environment injects.
#[derive(Clone, Debug, Default)]
pub struct ReplicaSpec {
    /// Indices of the NATS nodes in its `--nats-url` (all when empty).
    pub nodes: Vec<usize>,
    /// `RESPCOORD_FAULT_CLOCK_OFFSET_MS`.
    pub clock_offset_ms: i64,
    /// `RESPCOORD_FAULT_UNGUARDED_WRITES=1`.
    pub unguarded_writes: bool,
    /// `RESPCOORD_FAULT_UNCONFIRMED_READS=1`.
    pub unconfirmed_reads: bool,
    /// `RESPCOORD_FAULT_REPLICA_CLOCK_EXPIRY=1`.
    pub replica_clock_expiry: bool,
    /// `--session-idle-ttl` (the server's default, an hour, when `None`).
    pub idle_ttl: Option<Duration>,
}

struct Replica {
    spec: ReplicaSpec,
    proc: Option<Proc>,
    starts: usize,
}

struct Node {
    config: PathBuf,
    proc: Option<Proc>,
    starts: usize,
}

/// Three NATS nodes and the replicas, in their namespaces.
pub struct Cluster {
    // Field order is drop order: processes before the namespaces.
    replicas: Vec<Replica>,
    nodes: Vec<Node>,
    pub net: Net,
    pub dir: PathBuf,
    pub bucket: String,
    nats_server: String,
    /// Keep the run's directory (logs, stores) when it is dropped: the run
    /// found something.
    pub keep: bool,
}

/// The nats-server for the cluster: `RESPCOORD_TEST_CLUSTER_NATS_SERVER`
/// (scripts/test.sh sets it once per release line it runs), else the
/// newest pinned release (scripts/nats-server.sh), else none.
pub fn nats_server_binary() -> Option<String> {
    if let Ok(binary) = std::env::var("RESPCOORD_TEST_CLUSTER_NATS_SERVER") {
        return Some(binary);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/nats-server.sh");
    let output = std::process::Command::new(script).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// `nats-server --version` as (major, minor, patch).
pub fn nats_server_version(binary: &str) -> Option<(u64, u64, u64)> {
    let output = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.trim().rsplit('v').next()?;
    let mut parts = version.split('.').map(|p| p.trim().parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

impl Cluster {
    /// Builds the network, starts the NATS nodes, and has replica 0 create
    /// the bucket (retrying until JetStream has formed); the other replicas
    /// start once it serves. `Err` when the cluster never formed.
    pub async fn start(nats_server: &str, replicas: Vec<ReplicaSpec>) -> Result<Self, String> {
        let net = Net::build(NODES, replicas.len())?;
        let dir = std::env::temp_dir().join(format!("respcoord-faults-{}", net.prefix()));
        fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let bucket = format!("faults_{}", net.prefix());
        let mut cluster = Cluster {
            replicas: replicas
                .into_iter()
                .map(|spec| Replica {
                    spec,
                    proc: None,
                    starts: 0,
                })
                .collect(),
            nodes: Vec::new(),
            net,
            dir,
            bucket,
            nats_server: nats_server.to_owned(),
            keep: false,
        };
        for i in 0..NODES {
            let config = cluster.write_node_config(i)?;
            cluster.nodes.push(Node {
                config,
                proc: None,
                starts: 0,
            });
            cluster.start_node(i);
        }
        let deadline = Instant::now() + READY;
        cluster.start_replica_until_serving(0, deadline).await?;
        for r in 1..cluster.replicas.len() {
            cluster.start_replica_until_serving(r, deadline).await?;
        }
        Ok(cluster)
    }

    fn write_node_config(&self, i: usize) -> Result<PathBuf, String> {
        let store = self.dir.join(format!("n{i}"));
        fs::create_dir_all(&store).map_err(|e| format!("create {}: {e}", store.display()))?;
        let routes: Vec<String> = (0..NODES)
            .filter(|&j| j != i)
            .map(|j| {
                let addr = self.net.addr(Host::Nats(i), Host::Nats(j));
                format!("\"nats://{addr}:{ROUTE_PORT}\"")
            })
            .collect();
        // no_advertise: clients (the replicas) dial only the nodes they are
        // given, so a replica's reach is exactly what the schedule says.
        let config = format!(
            "server_name: n{i}\n\
             listen: \"0.0.0.0:{CLIENT_PORT}\"\n\
             http: \"0.0.0.0:{MONITOR_PORT}\"\n\
             log_file: \"{log}\"\n\
             jetstream {{ store_dir: \"{store}\" }}\n\
             cluster {{\n  name: faults\n  listen: \"0.0.0.0:{ROUTE_PORT}\"\n  \
             no_advertise: true\n  routes: [{routes}]\n}}\n",
            log = self.dir.join(format!("n{i}.log")).display(),
            store = store.display(),
            routes = routes.join(", "),
        );
        let path = self.dir.join(format!("n{i}.conf"));
        fs::write(&path, config).map_err(|e| format!("write {}: {e}", path.display()))?;
        Ok(path)
    }

    fn start_node(&mut self, i: usize) {
        let child = self
            .net
            .command(Host::Nats(i), &self.nats_server)
            .arg("-c")
            .arg(&self.nodes[i].config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn nats-server n{i}: {e}"));
        self.nodes[i].proc = Some(Proc(child));
        self.nodes[i].starts += 1;
    }

    /// The URL `from` dials to reach NATS node `i`.
    pub fn nats_url(&self, from: Host, i: usize) -> String {
        format!(
            "nats://{}:{CLIENT_PORT}",
            self.net.addr(from, Host::Nats(i))
        )
    }

    fn spawn_replica(&mut self, r: usize) {
        let spec = self.replicas[r].spec.clone();
        let nodes: Vec<usize> = if spec.nodes.is_empty() {
            (0..NODES).collect()
        } else {
            spec.nodes.clone()
        };
        let urls: Vec<String> = nodes
            .iter()
            .map(|&i| self.nats_url(Host::Replica(r), i))
            .collect();
        let starts = self.replicas[r].starts;
        let log = fs::File::create(self.dir.join(format!("r{r}.{starts}.log")))
            .expect("create a replica log");
        let mut command = self.net.command(Host::Replica(r), crate::RESPCOORD_BIN);
        command
            .args(["serve", "--backend", "nats"])
            .args(["--listen", &format!("0.0.0.0:{GRPC_PORT}")])
            .args(["--nats-url", &urls.join(",")])
            .args(["--nats-bucket", &self.bucket])
            .args(["--nats-replicas", "3", "--nats-history", "64"])
            .args(["--shutdown-grace", "1s", "--log", "respcoord=info"])
            .env_remove("RESPCOORD_FAULT_CLOCK_OFFSET_MS")
            .env_remove("RESPCOORD_FAULT_UNGUARDED_WRITES")
            .env_remove("RESPCOORD_FAULT_UNCONFIRMED_READS")
            .env_remove("RESPCOORD_FAULT_REPLICA_CLOCK_EXPIRY")
            .env_remove("RESPCOORD_SESSION_IDLE_TTL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if spec.clock_offset_ms != 0 {
            command.env(
                "RESPCOORD_FAULT_CLOCK_OFFSET_MS",
                spec.clock_offset_ms.to_string(),
            );
        }
        if spec.unguarded_writes {
            command.env("RESPCOORD_FAULT_UNGUARDED_WRITES", "1");
        }
        if spec.unconfirmed_reads {
            command.env("RESPCOORD_FAULT_UNCONFIRMED_READS", "1");
        }
        if spec.replica_clock_expiry {
            command.env("RESPCOORD_FAULT_REPLICA_CLOCK_EXPIRY", "1");
        }
        if let Some(ttl) = spec.idle_ttl {
            command.args(["--session-idle-ttl", &format!("{}ms", ttl.as_millis())]);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn respcoord r{r}: {e}"));
        self.replicas[r].proc = Some(Proc(child));
        self.replicas[r].starts += 1;
    }

    /// Starts replica `r` and waits until it answers calls; a replica that
    /// exits first (NATS not ready: no JetStream meta leader yet, the R3
    /// bucket cannot be placed) is started again until `deadline`.
    async fn start_replica_until_serving(
        &mut self,
        r: usize,
        deadline: Instant,
    ) -> Result<(), String> {
        loop {
            self.spawn_replica(r);
            match self.wait_serving(r, deadline).await {
                Ok(()) => return Ok(()),
                Err(exited) if exited && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(_) => {
                    self.keep = true;
                    return Err(format!(
                        "replica r{r} did not serve within {READY:?} (logs in {})",
                        self.dir.display()
                    ));
                }
            }
        }
    }

    /// `Err(true)`: the process exited; `Err(false)`: the deadline passed.
    async fn wait_serving(&mut self, r: usize, deadline: Instant) -> Result<(), bool> {
        let endpoint = self.endpoint(r);
        loop {
            if let Some(proc) = self.replicas[r].proc.as_mut() {
                if proc.0.try_wait().ok().flatten().is_some() {
                    self.replicas[r].proc = None;
                    return Err(true);
                }
            }
            if Instant::now() >= deadline {
                return Err(false);
            }
            if probe(&endpoint).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn replicas(&self) -> usize {
        self.replicas.len()
    }

    /// Replica `r`'s gRPC endpoint as the test dials it.
    pub fn endpoint(&self, r: usize) -> String {
        format!(
            "http://{}:{GRPC_PORT}",
            self.net.addr(Host::Test, Host::Replica(r))
        )
    }

    // ---- faults: processes ----

    pub fn pause_replica(&self, r: usize) {
        self.replica_proc(r).signal(libc::SIGSTOP);
    }

    pub fn resume_replica(&self, r: usize) {
        self.replica_proc(r).signal(libc::SIGCONT);
    }

    pub fn pause_node(&self, i: usize) {
        self.node_proc(i).signal(libc::SIGSTOP);
    }

    pub fn resume_node(&self, i: usize) {
        self.node_proc(i).signal(libc::SIGCONT);
    }

    /// SIGKILL: a crash, no goodbye to the cluster.
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].proc = None;
    }

    /// Starts a killed node again on its store.
    pub fn restart_node(&mut self, i: usize) {
        assert!(self.nodes[i].proc.is_none(), "n{i} is still running");
        self.start_node(i);
    }

    pub fn kill_replica(&mut self, r: usize) {
        self.replicas[r].proc = None;
    }

    /// Starts a killed replica again and waits until it serves.
    pub async fn restart_replica(&mut self, r: usize) -> Result<(), String> {
        assert!(self.replicas[r].proc.is_none(), "r{r} is still running");
        self.start_replica_until_serving(r, Instant::now() + READY)
            .await
    }

    /// Replica `r` started afresh with `spec` (which nodes it dials, what
    /// faults it runs with), once it serves.
    pub async fn respawn_replica(&mut self, r: usize, spec: ReplicaSpec) -> Result<(), String> {
        self.replicas[r].proc = None;
        self.replicas[r].spec = spec;
        self.start_replica_until_serving(r, Instant::now() + READY)
            .await
    }

    fn replica_proc(&self, r: usize) -> &Proc {
        self.replicas[r]
            .proc
            .as_ref()
            .unwrap_or_else(|| panic!("r{r} is not running"))
    }

    fn node_proc(&self, i: usize) -> &Proc {
        self.nodes[i]
            .proc
            .as_ref()
            .unwrap_or_else(|| panic!("n{i} is not running"))
    }

    // ---- faults: links ----

    /// Cuts replica `r` from every NATS node (its gRPC link to the test stays).
    pub fn cut_replica_from_nats(&mut self, r: usize) {
        for i in 0..NODES {
            self.net.set(Host::Replica(r), Host::Nats(i), false);
        }
    }

    /// Cuts node `i`'s routes to the other nodes (replicas still reach it).
    pub fn cut_node_routes(&mut self, i: usize) {
        for j in (0..NODES).filter(|&j| j != i) {
            self.net.set(Host::Nats(i), Host::Nats(j), false);
        }
    }

    /// A clean split: node `i` and replica `r` on the minority side, every
    /// other node and replica on the majority side (the test reaches both).
    pub fn split(&mut self, i: usize, r: usize) {
        self.cut_node_routes(i);
        for j in (0..NODES).filter(|&j| j != i) {
            self.net.set(Host::Replica(r), Host::Nats(j), false);
        }
        for other in (0..self.replicas.len()).filter(|&o| o != r) {
            self.net.set(Host::Replica(other), Host::Nats(i), false);
        }
    }

    pub fn heal(&mut self) {
        self.net.heal();
    }

    pub fn starts(&self) -> (Vec<usize>, Vec<usize>) {
        (
            self.nodes.iter().map(|n| n.starts).collect(),
            self.replicas.iter().map(|r| r.starts).collect(),
        )
    }
}

/// Whether a replica answers: a GetState of a session nobody made is
/// NOT_FOUND once the backend is up.
pub async fn probe(endpoint: &str) -> bool {
    let call = async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .ok()?;
        let mut client = RawClient::new(channel);
        let request = pb::GetStateRequest {
            session_id: "probe".into(),
        };
        match client.get_state(request).await {
            Ok(_) => Some(()),
            Err(status) if status.code() == Code::NotFound => Some(()),
            Err(_) => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .ok()
        .flatten()
        .is_some()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for replica in &mut self.replicas {
            replica.proc = None;
        }
        for node in &mut self.nodes {
            node.proc = None;
        }
        if self.keep
            || std::thread::panicking()
            || std::env::var_os("RESPCOORD_TEST_KEEP_NATS").is_some()
        {
            eprintln!("logs and stores of this run kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
