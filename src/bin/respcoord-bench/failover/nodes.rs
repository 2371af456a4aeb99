//! The nats-server side of a failover run: the three-node cluster it
//! stands up (`Cluster`), the stream leader as every node reports it
//! (`Probe`), and the faults injected into it (`Injector`).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{FailoverArgs, Fault};
use crate::cluster::bench_bucket;

/// Longest a node may take to exit, come back or catch up.
const RECOVERY_LIMIT: Duration = Duration::from_secs(90);

// ---- the cluster ----

struct Node {
    name: String,
    port: u16,
    monitor: u16,
    /// `-c config -m port`: to start it again on the same store and ports.
    args: [String; 4],
    child: Option<Child>,
}

/// Three nats-server processes, killed on drop; their directory is then
/// removed unless kept.
pub(super) struct Cluster {
    binary: PathBuf,
    dir: PathBuf,
    nodes: Vec<Node>,
    keep: bool,
}

impl Cluster {
    pub(super) fn start(binary: &Path, args: &FailoverArgs) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(bench_bucket("respcoord-failover"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let held = (0..9).map(|_| std::net::TcpListener::bind("127.0.0.1:0"));
        let held: Vec<_> = held.collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        let ports: Vec<u16> = held
            .iter()
            .filter_map(|l| Some(l.local_addr().ok()?.port()))
            .collect();
        drop(held);
        let (binary, keep) = (binary.to_owned(), args.keep);
        let mut cluster = Cluster {
            binary,
            dir,
            nodes: Vec::new(),
            keep,
        };
        for i in 0..3 {
            let name = format!("node{}", i + 1);
            let at = |file: &str| cluster.dir.join(file).display().to_string();
            let routes = (0..3).filter(|&j| j != i);
            let routes: Vec<_> = routes
                .map(|j| format!("\"nats://127.0.0.1:{}\"", ports[3 + j]))
                .collect();
            let config = format!(
                "server_name: {name}\nhost: 127.0.0.1\nport: {}\nlog_file: \"{}\"\n\
                 jetstream {{ store_dir: \"{}\" }}\n\
                 cluster {{ name: failover, listen: \"127.0.0.1:{}\", routes: [{}] }}\n\
                 lame_duck_duration: \"{}ms\"\nlame_duck_grace_period: \"{}ms\"\n",
                ports[i],
                at(&format!("{name}.log")),
                at(&name),
                ports[3 + i],
                routes.join(", "),
                args.lame_duck.as_millis(),
                args.lame_duck_grace.as_millis(),
            );
            let config_file = at(&format!("{name}.conf"));
            std::fs::write(&config_file, config).map_err(|e| format!("{config_file}: {e}"))?;
            let (port, monitor) = (ports[i], ports[6 + i]);
            let args = ["-c".into(), config_file, "-m".into(), monitor.to_string()];
            cluster.nodes.push(Node {
                name,
                port,
                monitor,
                args,
                child: None,
            });
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, node: usize) -> Result<(), String> {
        let mut command = Command::new(&self.binary);
        command
            .args(&self.nodes[node].args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.nodes[node].child = Some(command.spawn().map_err(|e| e.to_string())?);
        Ok(())
    }

    /// `ldm` (lame duck) or `term` through `nats-server --signal`; `kill`: SIGKILL.
    fn signal(&mut self, node: usize, what: &str) -> Result<(), String> {
        let child = self.nodes[node]
            .child
            .as_mut()
            .ok_or("the node is not running")?;
        if what == "kill" {
            return child.kill().map_err(|e| e.to_string());
        }
        let signal = format!("{what}={}", child.id());
        match Command::new(&self.binary)
            .args(["--signal", &signal])
            .status()
        {
            Ok(status) if status.success() => Ok(()),
            other => Err(format!("--signal {signal}: {other:?}")),
        }
    }

    /// Waits until the node's process has exited, and reaps it.
    async fn exited(&mut self, node: usize) -> Result<(), String> {
        let deadline = Instant::now() + RECOVERY_LIMIT;
        while let Some(child) = self.nodes[node].child.as_mut() {
            if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                self.nodes[node].child = None;
            } else if Instant::now() > deadline {
                return Err(format!("{} did not exit", self.nodes[node].name));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    pub(super) fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().filter_map(|n| n.child.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.keep {
            println!("  kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A GET on a node's monitoring port: its status and whole response.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        Some((response.split_whitespace().nth(1)?.parse().ok()?, response))
    };
    tokio::time::timeout(Duration::from_secs(1), get)
        .await
        .ok()
        .flatten()
}

/// The replicas' NATS connections on each node, by its monitoring port.
pub(super) async fn respcoord_connections(cluster: &Cluster) -> Vec<usize> {
    let mut connections = Vec::new();
    for node in &cluster.nodes {
        let body = http_get(node.monitor, "/connz?limit=1024")
            .await
            .unwrap_or_default()
            .1;
        let body: String = body.split_whitespace().collect();
        connections.push(body.matches("\"name\":\"respcoord\"").count());
    }
    connections
}

// ---- the stream leader, seen through every node ----

#[derive(Clone)]
pub(super) struct Sample {
    at: Instant,
    leader: Option<String>,
    /// Followers the leader reports current.
    current: usize,
    /// When the leader was elected (its `leader_since`), Unix nanoseconds.
    pub(super) since: Option<i128>,
}

/// The stream's info asked through each node every 100 ms (a client per
/// node, so a node that is down does not blind it); every answer is kept.
pub(super) struct Probe {
    samples: Arc<Mutex<Vec<Sample>>>,
    _stop: tokio_util::sync::DropGuard,
}

impl Probe {
    pub(super) async fn start(urls: &[String], stream: &str) -> Result<Self, String> {
        let (samples, stop): (Arc<Mutex<Vec<Sample>>>, _) =
            (Arc::default(), tokio_util::sync::CancellationToken::new());
        for url in urls {
            let options =
                async_nats::ConnectOptions::new().request_timeout(Some(Duration::from_millis(500)));
            let client = options
                .connect(url.as_str())
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let (js, stream) = (async_nats::jetstream::new(client), stream.to_owned());
            let (samples, stop) = (Arc::clone(&samples), stop.clone());
            tokio::spawn(stop.run_until_cancelled_owned(async move {
                loop {
                    let info = js.get_stream(&stream).await.ok();
                    if let Some(cluster) = info.and_then(|s| s.cached_info().cluster.clone()) {
                        let current = cluster.replicas.iter().filter(|p| p.current).count();
                        let since = cluster.leader_since.map(|t| t.unix_timestamp_nanos());
                        let (at, leader) =
                            (Instant::now(), cluster.leader.filter(|l| !l.is_empty()));
                        let mut samples = samples.lock().unwrap_or_else(|e| e.into_inner());
                        samples.push(Sample {
                            at,
                            leader,
                            current,
                            since,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        Ok(Self {
            samples,
            _stop: stop.drop_guard(),
        })
    }

    /// The first sample taken from `after` on that satisfies `ready`.
    pub(super) fn first(&self, after: Instant, ready: impl Fn(&Sample) -> bool) -> Option<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .filter(|s| s.at >= after)
            .find(|s| ready(s))
            .cloned()
    }

    /// The first sample from now on with a leader and both followers current.
    pub(super) async fn settled(&self) -> Result<Sample, String> {
        let after = Instant::now();
        loop {
            if let Some(sample) = self.first(after, |s| s.leader.is_some() && s.current == 2) {
                return Ok(sample);
            }
            if after.elapsed() > RECOVERY_LIMIT {
                return Err(format!(
                    "the stream did not settle within {RECOVERY_LIMIT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// ---- faults ----

/// Injects a fault, noting what happened when.
pub(super) struct Injector<'a> {
    pub(super) cluster: &'a mut Cluster,
    pub(super) probe: &'a Probe,
    pub(super) kill_pause: Duration,
    pub(super) marks: Vec<(String, Instant)>,
    /// When the stream leader was hit (Unix nanoseconds).
    pub(super) leader_hit: Option<i128>,
}

impl Injector<'_> {
    async fn leader(&self) -> Result<usize, String> {
        let leader = self.probe.settled().await?.leader;
        let nodes = &self.cluster.nodes;
        nodes
            .iter()
            .position(|n| Some(&n.name) == leader.as_ref())
            .ok_or(format!("leader {leader:?}?"))
    }

    fn mark(&mut self, what: String) -> Instant {
        self.marks.push((what, Instant::now()));
        Instant::now()
    }

    pub(super) async fn inject(&mut self, fault: Fault) -> Result<(), String> {
        let leader = self.leader().await?;
        match fault {
            Fault::LameDuckLeader => self.restart(leader, "ldm").await,
            Fault::SigtermLeader => self.restart(leader, "term").await,
            Fault::KillLeader => self.restart(leader, "kill").await,
            Fault::RestartFollower => self.restart((leader + 1) % 3, "term").await,
            Fault::Rolling => {
                let mut left = vec![0, 1, 2];
                while !left.is_empty() {
                    // The leader last (it may move while the others roll).
                    let leader = self.leader().await?;
                    let node = left.remove(left.iter().position(|&n| n != leader).unwrap_or(0));
                    self.restart(node, "term").await?;
                }
                Ok(())
            }
            Fault::All => Err("`all` runs fault by fault".into()),
        }
    }

    /// Stops `node` as `how` says (`ldm`, `term`, `kill`), starts it again
    /// on its store and ports, and waits until it reports healthy and the
    /// stream has a leader with both followers current.
    async fn restart(&mut self, node: usize, how: &str) -> Result<(), String> {
        let name = self.cluster.nodes[node].name.clone();
        let leader = self.leader().await? == node;
        self.mark(format!(
            "{how} {name}{}",
            if leader { " (leader)" } else { "" }
        ));
        if leader {
            self.leader_hit = Some(i128::from(crate::measure::unix_nanos()));
        }
        self.cluster.signal(node, how)?;
        self.cluster.exited(node).await?;
        self.mark(format!("{name} exited"));
        if how == "kill" {
            tokio::time::sleep(self.kill_pause).await;
        }
        self.cluster.spawn(node)?;
        let started = self.mark(format!("{name} started"));
        let monitor = self.cluster.nodes[node].monitor;
        while !matches!(http_get(monitor, "/healthz").await, Some((200, _))) {
            if started.elapsed() > RECOVERY_LIMIT {
                return Err(format!("{name} not healthy after {RECOVERY_LIMIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.mark(format!("{name} healthy"));
        let settled = self.probe.settled().await?;
        self.marks.push(("stream current".into(), settled.at));
        Ok(())
    }
}
