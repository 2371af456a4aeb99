//! One fault run from start to verdict: the cluster up, a watch-all
//! recorder on every replica, the load, whatever faults the schedule
//! injects, then heal, wait until quiet, a marker write every recorder must
//! deliver, and the checks: the checker's (linearizability per session, the
//! watch recordings) and the harness's own (acknowledged transitions
//! present in every complete recording, response ids rising per session).

use std::time::{Duration, Instant};

use crate::{
    cluster::{Cluster, ReplicaSpec},
    figures::{self, Report},
    history::{Answer, Call, EventKind, Outcome, Recorder},
    linearizability::check_linearizable,
    watch_check::{check_watches, Recording},
    watching::WatchRecorder,
    workload::{Conn, Load, Spec},
};

/// After the heal: every replica must answer again within this, and every
/// recorder deliver the marker.
const QUIET: Duration = Duration::from_secs(60);

/// Tries at starting a schedule's cluster before the run fails.
const CLUSTER_START_ATTEMPTS: u64 = 3;

/// A run in progress.
pub struct Run {
    pub name: String,
    pub cluster: Cluster,
    pub recorder: Recorder,
    pub began: Instant,
    watchers: Vec<WatchRecorder>,
    load: Option<Load>,
    spec: Spec,
    faults: Vec<String>,
    notes: Vec<String>,
    /// Findings of the schedule's own checks, reported with the run's.
    findings: Vec<String>,
    /// Faults the run injected that its end must undo (a paused process).
    paused: Vec<Paused>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    Replica(usize),
    Node(usize),
}

/// The default load: two clients per replica (one on the library, one raw)
/// on eight hot sessions.
pub fn default_spec(name: &str, replicas: usize, seed: u64) -> Spec {
    Spec {
        clients: 2 * replicas,
        slots: 8,
        prefix: name.to_owned(),
        replicas: (0..replicas).collect(),
        think_ms: (30, 70),
        seed,
    }
}

impl Run {
    /// The cluster with `replicas`; no recorders or load yet.
    pub async fn prepare(name: &str, nats_server: &str, replicas: Vec<ReplicaSpec>) -> Self {
        let began = Instant::now();
        // A start that times out on a loaded two-core machine is not what
        // the run tests: more tries on fresh namespaces, then fail. Seen
        // here: a fresh nats-server 2.10 cluster, started while another
        // schedule's cluster ran, refused the bucket ("no suitable peers for
        // placement") for the whole wait, twice in a row.
        let mut attempt = 1;
        let cluster = loop {
            match Cluster::start(nats_server, replicas.clone()).await {
                Ok(cluster) => break cluster,
                Err(e) if attempt >= CLUSTER_START_ATTEMPTS => {
                    panic!("{name}: the cluster did not start in {attempt} tries: {e}")
                }
                Err(e) => {
                    eprintln!("[{name}] the cluster did not start ({e}); trying again");
                    crate::netns::delete_stale();
                    tokio::time::sleep(Duration::from_secs(2 * attempt)).await;
                    attempt += 1;
                }
            }
        };
        let spec = default_spec(name, cluster.replicas(), 1);
        let run = Run {
            name: name.to_owned(),
            cluster,
            recorder: Recorder::new(),
            began,
            watchers: Vec::new(),
            load: None,
            spec,
            faults: Vec::new(),
            notes: Vec::new(),
            findings: Vec::new(),
            paused: Vec::new(),
        };
        eprintln!(
            "[{name}] cluster serving after {:.1} s",
            began.elapsed().as_secs_f64()
        );
        run
    }

    /// Opens a watch-all recorder on every replica (once).
    pub async fn record(&mut self) {
        if !self.watchers.is_empty() {
            return;
        }
        for r in 0..self.cluster.replicas() {
            let endpoint = self.cluster.endpoint(r);
            let watcher = WatchRecorder::open(r, &endpoint)
                .await
                .unwrap_or_else(|e| panic!("watch-all on r{r}: {e}"));
            self.watchers.push(watcher);
        }
    }

    /// Starts the recorders and the load (`spec`, or the default two
    /// clients per replica).
    pub async fn load(&mut self, spec: Option<Spec>) {
        self.record().await;
        if let Some(spec) = spec {
            self.spec = spec;
        }
        let endpoints: Vec<String> = (0..self.cluster.replicas())
            .map(|r| self.cluster.endpoint(r))
            .collect();
        self.load = Some(Load::start(&self.spec, &endpoints, &self.recorder));
        self.note_connections("at the start").await;
    }

    /// Notes which NATS node each replica's connection is on.
    pub async fn note_connections(&mut self, when: &str) {
        let on = self.cluster.connections().await;
        let text: Vec<String> = on
            .iter()
            .enumerate()
            .map(|(r, nodes)| {
                let nodes: Vec<String> = nodes.iter().map(|i| format!("n{i}")).collect();
                format!(
                    "r{r}->{}",
                    if nodes.is_empty() {
                        "none".into()
                    } else {
                        nodes.join("+")
                    }
                )
            })
            .collect();
        self.note(format!("NATS connections {when}: {}", text.join(", ")));
    }

    /// Notes a fault (or heal) with its time in the run.
    pub fn fault(&mut self, what: impl Into<String>) {
        let what = what.into();
        let at = self.recorder.now() as f64 / 1e9;
        eprintln!("[{}] t={at:.1} s: {what}", self.name);
        self.faults.push(format!("t={at:.1} s: {what}"));
    }

    /// A violation the schedule's own check found.
    pub fn finding(&mut self, what: impl Into<String>) {
        self.findings.push(what.into());
    }

    pub fn note(&mut self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("[{}] {what}", self.name);
        self.notes.push(what);
    }

    pub fn pause(&mut self, what: Paused) {
        match what {
            Paused::Replica(r) => self.cluster.pause_replica(r),
            Paused::Node(i) => self.cluster.pause_node(i),
        }
        self.paused.push(what);
    }

    pub fn resume(&mut self, what: Paused) {
        match what {
            Paused::Replica(r) => self.cluster.resume_replica(r),
            Paused::Node(i) => self.cluster.resume_node(i),
        }
        self.paused.retain(|p| *p != what);
    }

    /// Heals, waits until quiet, checks; the report says what was found.
    pub async fn finish(mut self) -> Report {
        for paused in std::mem::take(&mut self.paused) {
            self.resume(paused);
        }
        if !self.cluster.net.cut().is_empty() {
            self.cluster.heal();
            self.fault("healed every link");
        }
        let mut violations = std::mem::take(&mut self.findings);
        // Every replica answers again: the load keeps running meanwhile,
        // so the outage figures include the recovery.
        let deadline = Instant::now() + QUIET;
        for r in 0..self.cluster.replicas() {
            while !crate::cluster::probe(&self.cluster.endpoint(r)).await {
                if Instant::now() >= deadline {
                    violations.push(format!(
                        "replica r{r} did not answer within {QUIET:?} of the heal"
                    ));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.note_connections("after the heal").await;
        if let Some(load) = self.load.take() {
            load.stop().await;
        }
        let healed_at = self.recorder.now() as f64 / 1e9;
        // A marker through replica 0: once a recorder has its `ended`, it
        // has everything written before it.
        let marker = format!("{}-marker", self.name);
        match self.marker(&marker, deadline).await {
            Err(why) => violations.push(why),
            Ok(response) => {
                for watcher in &self.watchers {
                    while !watcher.saw(&marker, EventKind::Ended { response }) {
                        if Instant::now() >= deadline {
                            violations.push(format!(
                                "a watch-all recorder did not deliver the marker within {QUIET:?}"
                            ));
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        let mut recordings: Vec<Recording> = Vec::new();
        let mut reopened = Vec::new();
        let mut events_per_replica = Vec::new();
        for watcher in std::mem::take(&mut self.watchers) {
            let replica = watcher.replica();
            let (segments, why) = watcher.stop().await;
            if !why.is_empty() {
                let more = why.len().saturating_sub(3);
                let mut text = format!(
                    "r{replica} {}x: {}",
                    why.len(),
                    why[..why.len().min(3)].join("; ")
                );
                if more > 0 {
                    text += &format!("; and {more} more");
                }
                reopened.push(text);
            }
            events_per_replica.push(segments.iter().map(|r| r.events.len()).sum());
            recordings.extend(segments);
        }
        let ops = self.recorder.ops();
        let watched: Vec<_> = recordings.iter().map(|r| r.events.clone()).collect();
        let checked = Instant::now();
        match catch(|| check_linearizable(&ops, &watched).map_err(|v| v.to_string())) {
            Ok(Ok(stats)) => self.notes.push(format!("{stats}")),
            Ok(Err(violation)) => violations.push(violation),
            Err(panic) => violations.push(format!("the linearizability checker panicked: {panic}")),
        }
        match catch(|| check_watches(&ops, &recordings).map_err(|v| v.to_string())) {
            Ok(Ok(stats)) => self.notes.push(format!("{stats}")),
            Ok(Err(violation)) => violations.push(violation),
            Err(panic) => violations.push(format!("the watch checker panicked: {panic}")),
        }
        let falling = figures::falling_ids(&recordings);
        if !falling.is_empty() {
            violations.push(format!(
                "response ids do not rise within a session ({}), e.g.:\n{}",
                falling.len(),
                falling[..falling.len().min(5)].join("\n")
            ));
        }
        self.notes.push(format!(
            "checks took {:.1} s; load stopped at t={healed_at:.1} s",
            checked.elapsed().as_secs_f64()
        ));
        if !reopened.is_empty() {
            self.notes
                .push(format!("watch-all reopened: {}", reopened.join(" | ")));
        }
        let (node_starts, replica_starts) = self.cluster.starts();
        self.notes.push(format!(
            "process starts: nats {node_starts:?}, replicas {replica_starts:?}"
        ));
        self.cluster.keep = !violations.is_empty();
        let report = Report {
            schedule: self.name.clone(),
            ops: ops.len(),
            counts: figures::counts(&ops),
            faults: std::mem::take(&mut self.faults),
            violations,
            lost: figures::lost_transitions(&ops, &recordings),
            outage: figures::longest_outage(&ops),
            outages: figures::outage_per_replica(&ops, self.cluster.replicas()),
            events: events_per_replica,
            wall: self.began.elapsed(),
            notes: std::mem::take(&mut self.notes),
        };
        eprintln!("{report}");
        report
    }

    /// Starts and finishes a response on `session` through replica 0,
    /// recorded like any call, until it is acknowledged.
    async fn marker(&self, session: &str, deadline: Instant) -> Result<u64, String> {
        let conn = Conn::new(1, &self.cluster.endpoint(0));
        let client = self.spec.clients;
        let send = |call: Call| {
            let conn = conn.clone();
            async move {
                let pending = self.recorder.invoke(client, 0, session, call.clone());
                let outcome = conn.perform(session, &call).await;
                pending.complete(outcome.clone());
                outcome
            }
        };
        let start = Call::Start {
            request_id: Some(format!("{session}-start")),
        };
        let response = loop {
            match send(start.clone()).await {
                Outcome::Ok(Answer::Started { response, .. }) => break response,
                other if Instant::now() >= deadline => {
                    return Err(format!(
                        "the marker Start was never acknowledged: {other:?}"
                    ))
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let finish = Call::Finish {
            response: Some(response),
        };
        loop {
            match send(finish.clone()).await {
                Outcome::Ok(Answer::Finished { .. }) => return Ok(response),
                other if Instant::now() >= deadline => {
                    return Err(format!(
                        "the marker Finish was never acknowledged: {other:?}"
                    ))
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// Runs a checker, turning a panic into its message.
fn catch<T>(check: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "(no message)".to_owned())
    })
}
