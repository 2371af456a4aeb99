//! Expiry under clock skew and a paused lease holder: two replicas, one's
//! wall clock 3 s ahead and the other's 3 s behind, a 6 s idle TTL. Each
//! phase leaves sessions idle through both replicas, then pauses one replica
//! for longer than the TTL, so the other must take the expirer lease (if it
//! does not hold it already) and expire them while the paused one holds
//! whatever it believed; then the paused one resumes, possibly mid-sweep on
//! its stale lease. Phase one pauses the replica behind, so the one ahead
//! expires sessions the one behind last wrote: with idleness timed by
//! replica clocks that is 6 s early.
//!
//! Checked per session, on the test's clock: expired at all, and within a
//! bound; never before the TTL from the invocation of its last write (a
//! Terminated event's first receipt on any replica comes after the expiry,
//! which comes after the write, so the check can only fail when expiry was
//! early); never twice on any replica.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use respcoord::proto::v1::{self as pb, lifecycle_event::Kind};
use tokio::time::sleep;

use crate::{
    cluster::ReplicaSpec,
    figures::Report,
    history::{Answer, Call, Outcome},
    run::{Paused, Run},
    workload::{raw_client, Conn},
};

const IDLE_TTL: Duration = Duration::from_secs(6);

/// How late an expiry may come after the session's last acknowledged
/// write: the touch interval the server adds (TTL / 8), a lapsed lease
/// (three sweeps of TTL / 10) and a sweep, and two seconds for delivery on a
/// loaded machine.
const LATEST: Duration = Duration::from_millis(6_000 + 750 + 1_800 + 600 + 2_000);

/// How long a phase holds its replica paused: past the TTL and the bound.
const PAUSED_FOR: Duration = Duration::from_millis(6_000 + 750 + 1_800 + 600 + 2_500);

/// Sessions each phase leaves idle through each replica: one with its
/// response still live, one finished.
const PER_REPLICA: usize = 2;

/// A session left idle: when its last write was invoked and acknowledged.
struct Left {
    session: String,
    through: usize,
    invoked: Instant,
    acked: Instant,
}

/// Terminated events as each replica's watch-all delivered them, with when.
#[derive(Default)]
struct Terminations {
    per_replica: Vec<HashMap<String, Vec<Instant>>>,
}

/// One watch-all per replica that notes when each Terminated arrived.
struct TimedWatches {
    seen: Arc<Mutex<Terminations>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl TimedWatches {
    async fn open(endpoints: &[String]) -> Self {
        let seen = Arc::new(Mutex::new(Terminations {
            per_replica: vec![HashMap::new(); endpoints.len()],
        }));
        let mut tasks = Vec::new();
        for (r, endpoint) in endpoints.iter().enumerate() {
            let mut stream = raw_client(endpoint)
                .watch(pb::WatchRequest::default())
                .await
                .unwrap_or_else(|e| panic!("timed watch-all on r{r}: {e}"))
                .into_inner();
            let seen = Arc::clone(&seen);
            tasks.push(tokio::spawn(async move {
                while let Ok(Some(message)) = stream.message().await {
                    let at = Instant::now();
                    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    for event in &message.events {
                        if let Some(Kind::Terminated(_)) = event.kind {
                            seen.per_replica[r]
                                .entry(event.session_id.clone())
                                .or_default()
                                .push(at);
                        }
                    }
                }
            }));
        }
        TimedWatches { seen, tasks }
    }

    /// The first receipt of the session's Terminated on any replica, and
    /// the most times one replica delivered it.
    fn terminated(&self, session: &str) -> (Option<Instant>, usize) {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut first: Option<Instant> = None;
        let mut most = 0;
        for replica in &seen.per_replica {
            if let Some(times) = replica.get(session) {
                most = most.max(times.len());
                first = times.iter().copied().chain(first).min();
            }
        }
        (first, most)
    }
}

impl Drop for TimedWatches {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Sends `call` through `conn` until acknowledged; the invocation of its
/// first attempt (any attempt may be the one that wrote) and the ack.
async fn until_acked(conn: &Conn, session: &str, call: Call) -> (Instant, Instant, Answer) {
    let invoked = Instant::now();
    for _ in 0..50 {
        match conn.perform(session, &call).await {
            Outcome::Ok(answer) => return (invoked, Instant::now(), answer),
            _ => sleep(Duration::from_millis(200)).await,
        }
    }
    panic!("{session}: {call:?} was never acknowledged");
}

/// Leaves `PER_REPLICA` sessions idle through each replica.
async fn leave_idle(run: &Run, phase: usize) -> Vec<Left> {
    let mut left = Vec::new();
    for through in 0..run.cluster.replicas() {
        let conn = Conn::new(1, &run.cluster.endpoint(through));
        for k in 0..PER_REPLICA {
            let session = format!("{}-p{phase}-r{through}-{k}", run.name);
            let start = Call::Start {
                request_id: Some(format!("{session}-start")),
            };
            let (mut invoked, mut acked, answer) = until_acked(&conn, &session, start).await;
            if k % 2 == 1 {
                let Answer::Started { response, .. } = answer else {
                    panic!("{session}: a Start answered {answer:?}");
                };
                let finish = Call::Finish {
                    response: Some(response),
                };
                (invoked, acked, _) = until_acked(&conn, &session, finish).await;
            }
            left.push(Left {
                session,
                through,
                invoked,
                acked,
            });
        }
    }
    left
}

/// How often each replica's log says it took the expirer lease.
fn lease_takes(run: &Run) -> Vec<usize> {
    (0..run.cluster.replicas())
        .map(|r| {
            let prefix = format!("r{r}.");
            std::fs::read_dir(&run.cluster.dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|file| file.file_name().to_string_lossy().starts_with(&prefix))
                .filter_map(|file| std::fs::read_to_string(file.path()).ok())
                .map(|log| {
                    log.lines()
                        .map(without_colours)
                        .filter(|line| {
                            line.contains("expirer lease") && line.contains("holding=true")
                        })
                        .count()
                })
                .sum()
        })
        .collect()
}

/// A log line without its terminal colour codes (`ESC [ ... m`).
fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The schedule; `replica_clocks` runs the build that times expiry by
/// replica clocks (`RESPCOORD_FAULT_REPLICA_CLOCK_EXPIRY`), which the check
/// must reject.
pub async fn skewed_and_paused(nats: &str, replica_clocks: bool) -> Report {
    let specs: Vec<ReplicaSpec> = [3_000, -3_000]
        .into_iter()
        .map(|clock_offset_ms| ReplicaSpec {
            clock_offset_ms,
            idle_ttl: Some(IDLE_TTL),
            replica_clock_expiry: replica_clocks,
            ..ReplicaSpec::default()
        })
        .collect();
    let name = if replica_clocks {
        "expiry-by-replica-clocks"
    } else {
        "expiry-skewed-paused"
    };
    let mut run = Run::prepare(name, nats, specs).await;
    run.fault(format!(
        "clocks: r0 +3 s, r1 -3 s; idle TTL {IDLE_TTL:?}{} (from the start)",
        if replica_clocks {
            "; RESPCOORD_FAULT_REPLICA_CLOCK_EXPIRY=1"
        } else {
            ""
        }
    ));
    run.record().await;
    let endpoints: Vec<String> = (0..run.cluster.replicas())
        .map(|r| run.cluster.endpoint(r))
        .collect();
    let watches = TimedWatches::open(&endpoints).await;
    let mut left = Vec::new();
    // The replica behind first: the one ahead then expires what it wrote.
    for (phase, paused) in [1, 0].into_iter().enumerate() {
        let idle = leave_idle(&run, phase).await;
        run.pause(Paused::Replica(paused));
        run.fault(format!(
            "phase {phase}: {} sessions left idle; r{paused} SIGSTOP for {PAUSED_FOR:?}",
            idle.len()
        ));
        sleep(PAUSED_FOR).await;
        run.resume(Paused::Replica(paused));
        run.fault(format!("r{paused} SIGCONT"));
        left.extend(idle);
    }
    // A paused replica's watch delivers late; give both a moment.
    sleep(Duration::from_secs(1)).await;
    let mut margins = Vec::new();
    for session in &left {
        let (first, most) = watches.terminated(&session.session);
        let Some(first) = first else {
            run.finding(format!(
                "expiry: {} (last written through r{}) was never expired",
                session.session, session.through
            ));
            continue;
        };
        if most > 1 {
            run.finding(format!(
                "expiry: {} was expired {most} times on one replica's watch",
                session.session
            ));
        }
        let idle_for = first.saturating_duration_since(session.invoked);
        if idle_for < IDLE_TTL {
            run.finding(format!(
                "expiry: {} (last written through r{}) expired {:.2} s after its last write was \
                 invoked, before its {IDLE_TTL:?} TTL",
                session.session,
                session.through,
                idle_for.as_secs_f64()
            ));
        }
        let late = first.saturating_duration_since(session.acked);
        if late > LATEST {
            run.finding(format!(
                "expiry: {} (last written through r{}) expired {:.2} s after its last write was \
                 acknowledged, later than {LATEST:?}",
                session.session,
                session.through,
                late.as_secs_f64()
            ));
        }
        margins.push(idle_for.as_secs_f64());
    }
    drop(watches);
    let takes = lease_takes(&run);
    run.note(format!(
        "expirer lease taken per replica (their logs): {takes:?}"
    ));
    for (r, &taken) in takes.iter().enumerate() {
        if taken == 0 {
            run.finding(format!(
                "expiry: r{r} never took the expirer lease, so the schedule did not hand it over \
                 from a paused holder"
            ));
        }
    }
    margins.sort_by(f64::total_cmp);
    run.note(format!(
        "expiry: {} of {} sessions expired; idle for {:.2} to {:.2} s (TTL {IDLE_TTL:?}) \
         before the first replica delivered the expiry",
        margins.len(),
        left.len(),
        margins.first().copied().unwrap_or(0.0),
        margins.last().copied().unwrap_or(0.0)
    ));
    run.finish().await
}
