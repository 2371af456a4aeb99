//! The fault runs' network: every NATS node and every respcoord replica in
//! its own network namespace, joined by one veth pair per pair of hosts
//! that may talk, so any one path can be cut (link down) while the others
//! stay up. Routes between NATS nodes, replicas' client connections to each
//! node, and the test process's own links (in the root namespace: gRPC to
//! each replica, JetStream API to each node) are all separate links.
//!
//! Each link is its own /24 (`10.<net>.<link>.0`), and no namespace has a
//! default route, so a host reaches another only over their shared link: a
//! link set down is a partition of exactly that pair. Taking an interface
//! down removes its connected route, so established TCP connections over it
//! neither reset nor deliver (their segments wait for retransmission, as in
//! a real partition) and new connections fail fast; bringing it up restores
//! the route and the waiting connections resume.
//!
//! Names carry the test process's pid (namespaces `rcfault-<pid>-<run>-<host>`,
//! interfaces `rf<pid base 36><run><link><end>`), so concurrent runs do not
//! collide and a later run deletes what a crashed one left behind.

use std::{
    collections::HashMap,
    fmt,
    io::Write,
    net::Ipv4Addr,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

const NETNS_PREFIX: &str = "rcfault-";
const IFACE_PREFIX: &str = "rf";

/// A host of the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// The test process (the root namespace).
    Test,
    Nats(usize),
    Replica(usize),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Test => write!(f, "test"),
            Host::Nats(i) => write!(f, "n{i}"),
            Host::Replica(i) => write!(f, "r{i}"),
        }
    }
}

/// One veth pair: `a`'s end and `b`'s end, each with its address.
struct Link {
    a: Host,
    b: Host,
    if_a: String,
    if_b: String,
    addr_a: Ipv4Addr,
    addr_b: Ipv4Addr,
    up: bool,
}

/// The namespaces and links of one run; all removed on drop.
pub struct Net {
    prefix: String,
    namespaces: HashMap<Host, String>,
    links: Vec<Link>,
}

fn ip(args: &[&str]) -> Result<String, String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `ip [-n ns] -batch -` with `commands`, one a line.
fn ip_batch(netns: Option<&str>, commands: &[String]) -> Result<(), String> {
    let mut command = Command::new("ip");
    if let Some(ns) = netns {
        command.args(["-n", ns]);
    }
    let mut child = command
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("ip's stdin")?
        .write_all(commands.join("\n").as_bytes())
        .map_err(|e| format!("writing to `ip -batch`: {e}"))?;
    let output = child
        .wait_with_output()
        .map_err(|e| format!("`ip -batch`: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip -batch` in {}: {}",
            netns.unwrap_or("the root namespace"),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn base36(mut n: u32, width: usize) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = digits[(n % 36) as usize];
        n /= 36;
    }
    String::from_utf8(out).expect("ascii digits")
}

fn pid_alive_as_ours(pid: u32) -> bool {
    // The pid may have been reused by an unrelated process: only a live
    // fault-test binary counts as the owner.
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.starts_with("faults"))
}

/// Deletes namespaces and root-namespace interfaces that an earlier run of
/// this test (a process no longer alive) left behind, after killing the
/// processes still running inside those namespaces (its NATS nodes and
/// replicas: nothing else runs in a namespace of ours).
pub fn delete_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(NETNS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid_alive_as_ours(pid) {
            continue;
        }
        if let Ok(pids) = ip(&["netns", "pids", name]) {
            for stale in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: kill(2) with a pid that `ip netns pids` listed.
                unsafe {
                    libc::kill(stale, libc::SIGKILL);
                }
            }
        }
        let _ = ip(&["netns", "delete", name]);
        eprintln!("deleted stale network namespace {name} (pid {pid} is gone)");
    }
    let Ok(links) = ip(&["-o", "link", "show"]) else {
        return;
    };
    for line in links.lines() {
        // "7: rfabcde1a0a@if6: <...>"
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        if name.len() != 11 || !name.starts_with(IFACE_PREFIX) {
            continue;
        }
        let Ok(pid) = u32::from_str_radix(&name[2..7], 36) else {
            continue;
        };
        if !pid_alive_as_ours(pid) {
            let _ = ip(&["link", "delete", name]);
        }
    }
}

/// Whether this machine can build the topology: root, and `ip netns` works.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the fault runs need root (network namespaces)".into());
    }
    static PROBE: AtomicU32 = AtomicU32::new(0);
    let probe = format!(
        "{NETNS_PREFIX}{}-probe{}",
        std::process::id(),
        PROBE.fetch_add(1, Ordering::Relaxed)
    );
    if let Err(error) = ip(&["netns", "add", &probe]) {
        return Some(format!("`ip netns add` does not work here: {error}"));
    }
    let _ = ip(&["netns", "delete", &probe]);
    None
}

/// A second octet for this run's 10.x.0.0/16 that no root-namespace address
/// uses yet (only the root namespace's ends can collide across runs).
fn free_net(seed: u32) -> Result<u8, String> {
    let used = ip(&["-4", "-o", "addr", "show"])?;
    (0..150u32)
        .map(|i| (100 + (seed.wrapping_add(i)) % 150) as u8)
        .find(|b| !used.contains(&format!(" 10.{b}.")))
        .ok_or_else(|| "no free 10.x.0.0/16 for the fault network".to_owned())
}

impl Net {
    /// Namespaces for `nodes` NATS nodes and `replicas` replicas, with a
    /// link between every pair of NATS nodes, from every replica to every
    /// node, and from the test to every host. Every link starts up.
    pub fn build(nodes: usize, replicas: usize) -> Result<Self, String> {
        static RUN: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let run = RUN.fetch_add(1, Ordering::Relaxed) % 36;
        let prefix = format!("{IFACE_PREFIX}{}{}", base36(pid, 5), base36(run, 1));
        let net = free_net(pid.wrapping_mul(7).wrapping_add(run))?;
        let mut hosts: Vec<Host> = (0..nodes).map(Host::Nats).collect();
        hosts.extend((0..replicas).map(Host::Replica));
        let mut namespaces = HashMap::new();
        for &host in &hosts {
            namespaces.insert(host, format!("{NETNS_PREFIX}{pid}-{run}-{host}"));
        }
        let mut pairs = Vec::new();
        for i in 0..nodes {
            for j in i + 1..nodes {
                pairs.push((Host::Nats(i), Host::Nats(j)));
            }
        }
        for r in 0..replicas {
            for i in 0..nodes {
                pairs.push((Host::Replica(r), Host::Nats(i)));
            }
        }
        for &host in &hosts {
            pairs.push((Host::Test, host));
        }
        let links = pairs
            .into_iter()
            .enumerate()
            .map(|(k, (a, b))| {
                let k8 = u8::try_from(k).expect("fewer than 256 links");
                let tag = base36(k as u32, 2);
                Link {
                    a,
                    b,
                    if_a: format!("{prefix}{tag}a"),
                    if_b: format!("{prefix}{tag}b"),
                    addr_a: Ipv4Addr::new(10, net, k8, 1),
                    addr_b: Ipv4Addr::new(10, net, k8, 2),
                    up: true,
                }
            })
            .collect();
        let mut this = Net {
            prefix,
            namespaces,
            links,
        };
        // Created here, so a failure below still deletes what exists.
        this.create()?;
        Ok(this)
    }

    fn create(&mut self) -> Result<(), String> {
        let mut root: Vec<String> = self
            .namespaces
            .values()
            .map(|ns| format!("netns add {ns}"))
            .collect();
        let mut per_ns: HashMap<Host, Vec<String>> = HashMap::new();
        for link in &self.links {
            let place = |host: Host| match self.namespaces.get(&host) {
                Some(ns) => format!(" netns {ns}"),
                None => String::new(),
            };
            root.push(format!(
                "link add name {}{} type veth peer name {}{}",
                link.if_a,
                place(link.a),
                link.if_b,
                place(link.b)
            ));
            for (host, iface, addr) in [
                (link.a, &link.if_a, link.addr_a),
                (link.b, &link.if_b, link.addr_b),
            ] {
                per_ns.entry(host).or_default().extend([
                    format!("addr add {addr}/24 dev {iface}"),
                    format!("link set dev {iface} up"),
                ]);
            }
        }
        ip_batch(None, &root)?;
        for (host, mut commands) in per_ns {
            let ns = self.namespaces.get(&host).map(String::as_str);
            if ns.is_some() {
                commands.insert(0, "link set dev lo up".into());
            }
            ip_batch(ns, &commands)?;
        }
        Ok(())
    }

    /// The namespace `host` runs in (`None` for the test).
    pub fn namespace(&self, host: Host) -> Option<&str> {
        self.namespaces.get(&host).map(String::as_str)
    }

    /// A command run inside `host`'s namespace.
    pub fn command(&self, host: Host, program: &str) -> Command {
        match self.namespace(host) {
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns, program]);
                command
            }
            None => Command::new(program),
        }
    }

    fn link(&self, x: Host, y: Host) -> &Link {
        self.links
            .iter()
            .find(|l| (l.a == x && l.b == y) || (l.a == y && l.b == x))
            .unwrap_or_else(|| panic!("no link between {x} and {y}"))
    }

    /// The address `to` has on its link with `from`: what `from` dials.
    pub fn addr(&self, from: Host, to: Host) -> Ipv4Addr {
        let link = self.link(from, to);
        if link.a == to {
            link.addr_a
        } else {
            link.addr_b
        }
    }

    /// Cuts (`up == false`) or heals the link between `x` and `y`, both ends.
    pub fn set(&mut self, x: Host, y: Host, up: bool) {
        let index = self
            .links
            .iter()
            .position(|l| (l.a == x && l.b == y) || (l.a == y && l.b == x))
            .unwrap_or_else(|| panic!("no link between {x} and {y}"));
        if self.links[index].up == up {
            return;
        }
        let state = if up { "up" } else { "down" };
        let link = &self.links[index];
        for (host, iface) in [(link.a, &link.if_a), (link.b, &link.if_b)] {
            let mut args = Vec::new();
            if let Some(ns) = self.namespace(host) {
                args.extend(["-n", ns]);
            }
            args.extend(["link", "set", "dev", iface, state]);
            ip(&args).unwrap_or_else(|e| panic!("setting {x}-{y} {state}: {e}"));
        }
        self.links[index].up = up;
    }

    /// Every link up again.
    pub fn heal(&mut self) {
        let down: Vec<(Host, Host)> = self
            .links
            .iter()
            .filter(|l| !l.up)
            .map(|l| (l.a, l.b))
            .collect();
        for (a, b) in down {
            self.set(a, b, true);
        }
    }

    /// The links currently cut, as `a-b` names.
    pub fn cut(&self) -> Vec<String> {
        self.links
            .iter()
            .filter(|l| !l.up)
            .map(|l| format!("{}-{}", l.a, l.b))
            .collect()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace destroys its veth ends and so their peers;
        // the root namespace's ends go with them.
        for ns in self.namespaces.values() {
            let _ = ip(&["netns", "delete", ns]);
        }
        for link in &self.links {
            if link.a == Host::Test {
                let _ = Command::new("ip")
                    .args(["link", "delete", &link.if_a])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}
