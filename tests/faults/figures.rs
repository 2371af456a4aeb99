//! The figures a fault run prints, computed from what it recorded: the
//! operations by outcome, the longest unavailability a client saw, the
//! acknowledged transitions a complete watch recording lacks, and response
//! ids that do not rise within a session.
//!
//! These are the harness's own checks, independent of the checker
//! (`linearizability.rs`, `watch_check.rs`), so a run's figures do not rest
//! on the code they judge.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    time::Duration,
};

use crate::{
    history::{Answer, Call, EventKind, Op, Outcome},
    watch_check::Recording,
};

/// Operations by how they ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
}

pub fn counts(ops: &[Op]) -> Counts {
    let mut counts = Counts::default();
    for op in ops {
        match op.outcome {
            Outcome::Ok(_) => counts.ok += 1,
            Outcome::Failed(_) => counts.failed += 1,
            Outcome::Unknown(_) => counts.unknown += 1,
        }
    }
    counts
}

/// The longest window in which every call of one client failed or timed
/// out: from the first such call's invocation to the completion of the
/// client's next successful call (or its last call, if none followed).
#[derive(Clone, Copy, Debug, Default)]
pub struct Outage {
    pub length: Duration,
    pub client: usize,
    pub replica: usize,
    /// When it began, since the run's start.
    pub from: Duration,
}

pub fn longest_outage(ops: &[Op]) -> Outage {
    let mut by_client: HashMap<usize, Vec<&Op>> = HashMap::new();
    for op in ops {
        by_client.entry(op.client).or_default().push(op);
    }
    let mut longest = Outage::default();
    for (client, mut mine) in by_client {
        mine.sort_by_key(|op| op.invoked);
        let mut since: Option<&Op> = None;
        let mut consider = |first: &Op, end: u64| {
            let length = Duration::from_nanos(end.saturating_sub(first.invoked));
            if length > longest.length {
                longest = Outage {
                    length,
                    client,
                    replica: first.replica,
                    from: Duration::from_nanos(first.invoked),
                };
            }
        };
        let mut last_end = 0;
        for op in &mine {
            let end = op.completed.unwrap_or(op.invoked);
            last_end = last_end.max(end);
            match (&op.outcome, since) {
                (Outcome::Ok(_), Some(first)) => {
                    consider(first, end);
                    since = None;
                }
                (Outcome::Ok(_), None) => {}
                (_, None) => since = Some(op),
                (_, Some(_)) => {}
            }
        }
        if let Some(first) = since {
            consider(first, last_end);
        }
    }
    longest
}

/// The longest outage of any client of each replica.
pub fn outage_per_replica(ops: &[Op], replicas: usize) -> Vec<Duration> {
    (0..replicas)
        .map(|r| {
            let mine: Vec<Op> = ops.iter().filter(|op| op.replica == r).cloned().collect();
            longest_outage(&mine).length
        })
        .collect()
}

/// A transition some client was told happened.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Acked {
    Started(String, u64),
    Ended(String, u64),
    Terminated(String),
}

impl fmt::Display for Acked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Acked::Started(s, id) => write!(f, "{s}: started {id}"),
            Acked::Ended(s, id) => write!(f, "{s}: ended {id}"),
            Acked::Terminated(s) => write!(f, "{s}: terminated"),
        }
    }
}

fn acknowledged(ops: &[Op]) -> HashSet<Acked> {
    let mut acked = HashSet::new();
    for op in ops {
        let Outcome::Ok(answer) = &op.outcome else {
            continue;
        };
        let session = || op.session.clone();
        match (&op.call, answer) {
            (
                Call::Start { .. },
                Answer::Started {
                    response,
                    superseded,
                    ..
                },
            ) => {
                acked.insert(Acked::Started(session(), *response));
                if let Some(old) = superseded {
                    acked.insert(Acked::Ended(session(), *old));
                }
            }
            (Call::Finish { response: Some(id) }, Answer::Finished { applied: true }) => {
                acked.insert(Acked::Ended(session(), *id));
            }
            (
                Call::Cancel { .. },
                Answer::Cancelled {
                    cancelled: Some(id),
                },
            ) => {
                acked.insert(Acked::Ended(session(), *id));
            }
            (Call::Shutdown, Answer::ShutDown { cancelled }) => {
                acked.insert(Acked::Terminated(session()));
                if let Some(id) = cancelled {
                    acked.insert(Acked::Ended(session(), *id));
                }
            }
            _ => {}
        }
    }
    acked
}

/// Acknowledged transitions missing from at least one complete recording,
/// each named with the replicas whose recording lacks it.
pub fn lost_transitions(ops: &[Op], recordings: &[Recording]) -> Vec<String> {
    let acked = acknowledged(ops);
    let mut lost: HashMap<Acked, Vec<usize>> = HashMap::new();
    for recording in recordings.iter().filter(|r| r.complete) {
        let present: HashSet<Acked> = recording
            .events
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Started { response } => {
                    Some(Acked::Started(e.session.clone(), response))
                }
                EventKind::Ended { response } => Some(Acked::Ended(e.session.clone(), response)),
                EventKind::Terminated => Some(Acked::Terminated(e.session.clone())),
                EventKind::CancelRequested { .. } => None,
            })
            .collect();
        for missing in acked.difference(&present) {
            lost.entry(missing.clone())
                .or_default()
                .push(recording.replica);
        }
    }
    let mut lost: Vec<String> = lost
        .into_iter()
        .map(|(acked, replicas)| format!("{acked} (absent from replica {replicas:?})"))
        .collect();
    lost.sort();
    lost
}

/// Sessions whose response ids, in revision order, do not strictly rise
/// (the response-id rule across replicas whose clocks disagree).
pub fn falling_ids(recordings: &[Recording]) -> Vec<String> {
    let mut found = Vec::new();
    for recording in recordings {
        let mut last: HashMap<&str, (u64, u64)> = HashMap::new();
        let mut events: Vec<_> = recording.events.iter().collect();
        events.sort_by_key(|e| e.seq);
        for event in events {
            let EventKind::Started { response } = event.kind else {
                continue;
            };
            if let Some(&(previous, revision)) = last.get(event.session.as_str()) {
                if response <= previous {
                    found.push(format!(
                        "replica {}: {} started {response} at revision {} after {previous} \
                         at revision {revision}",
                        recording.replica, event.session, event.revision
                    ));
                }
            }
            last.insert(&event.session, (response, event.revision));
        }
    }
    found
}

/// What one schedule saw, printed at its end.
#[derive(Debug, Default)]
pub struct Report {
    pub schedule: String,
    pub ops: usize,
    pub counts: Counts,
    pub faults: Vec<String>,
    pub violations: Vec<String>,
    pub lost: Vec<String>,
    pub outage: Outage,
    /// The longest outage per replica.
    pub outages: Vec<Duration>,
    pub events: Vec<usize>,
    pub wall: Duration,
    /// Anything else the schedule wants said (its own measurements).
    pub notes: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "== schedule {} ({:.1} s)",
            self.schedule,
            self.wall.as_secs_f64()
        )?;
        writeln!(
            f,
            "   operations: {} ({} ok, {} failed, {} unknown); watch events per replica {:?}",
            self.ops, self.counts.ok, self.counts.failed, self.counts.unknown, self.events
        )?;
        writeln!(f, "   faults injected: {}", self.faults.len())?;
        for fault in &self.faults {
            writeln!(f, "     {fault}")?;
        }
        writeln!(f, "   violations: {}", self.violations.len())?;
        for violation in &self.violations {
            for line in violation.lines().take(40) {
                writeln!(f, "     {line}")?;
            }
        }
        writeln!(f, "   acknowledged transitions lost: {}", self.lost.len())?;
        for lost in self.lost.iter().take(10) {
            writeln!(f, "     {lost}")?;
        }
        writeln!(
            f,
            "   longest unavailability: {:.2} s (client {} on replica {}, from t={:.1} s)",
            self.outage.length.as_secs_f64(),
            self.outage.client,
            self.outage.replica,
            self.outage.from.as_secs_f64()
        )?;
        let per_replica: Vec<String> = self
            .outages
            .iter()
            .enumerate()
            .map(|(r, d)| format!("r{r} {:.2} s", d.as_secs_f64()))
            .collect();
        writeln!(
            f,
            "   longest unavailability per replica: {}",
            per_replica.join(", ")
        )?;
        for note in &self.notes {
            writeln!(f, "   {note}")?;
        }
        Ok(())
    }
}
