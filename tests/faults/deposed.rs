//! The deposed-leader regression (issue 15's stale reads), reproduced on
//! purpose rather than by luck: replica B reaches only the stream leader L,
//! replica A only the other two nodes. L's routes are cut and held down
//! until the majority has elected a new leader (polled through a majority
//! node); then a Start is written through A and, as soon as it is
//! acknowledged, GetState and Finish of the new response go through B.
//! Served from L's stale copy, they would answer without A's write: a
//! GetState that does not show the new response, a Finish answered
//! `applied=false` for the live response. The checker must find each such
//! answer; the harness counts them itself too.

use std::time::{Duration, Instant};

use crate::{
    cluster::{ReplicaSpec, NODES},
    figures::Report,
    history::{Answer, Call, Outcome},
    netns::Host,
    run::Run,
    workload::Conn,
};

const SESSIONS: usize = 12;
/// How long the cut is held at most while waiting for the new leader.
const ELECTION: Duration = Duration::from_secs(30);
/// How long after the election the writes and stale reads go on.
const PROBING: Duration = Duration::from_secs(3);
/// The pause between probing rounds (one Start per session each).
const ROUND: Duration = Duration::from_millis(150);

/// Client ids of the two probes in the history.
const CLIENT_A: usize = 0;
const CLIENT_B: usize = 1;

struct Probe<'a> {
    run: &'a Run,
    a: Conn,
    b: Conn,
    calls: u64,
}

impl Probe<'_> {
    async fn send(&mut self, through_b: bool, session: &str, call: Call) -> Outcome {
        let (client, replica, conn) = if through_b {
            (CLIENT_B, 1, &self.b)
        } else {
            (CLIENT_A, 0, &self.a)
        };
        let pending = self
            .run
            .recorder
            .invoke(client, replica, session, call.clone());
        let outcome = conn.perform(session, &call).await;
        pending.complete(outcome.clone());
        outcome
    }

    async fn start_through_a(&mut self, session: &str) -> Option<u64> {
        self.calls += 1;
        let call = Call::Start {
            request_id: Some(format!("a-{}", self.calls)),
        };
        match self.send(false, session, call).await {
            Outcome::Ok(Answer::Started { response, .. }) => Some(response),
            _ => None,
        }
    }
}

/// What the probe chains saw through B.
#[derive(Default)]
struct Tally {
    writes: usize,
    reads: usize,
    stale_reads: usize,
    finishes: usize,
    stale_finishes: usize,
    examples: Vec<String>,
    /// How B's calls that got no answer ended.
    unanswered: std::collections::BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.writes += other.writes;
        self.reads += other.reads;
        self.stale_reads += other.stale_reads;
        self.finishes += other.finishes;
        self.stale_finishes += other.stale_finishes;
        self.examples.extend(other.examples);
        for (code, n) in other.unanswered {
            *self.unanswered.entry(code).or_default() += n;
        }
    }
}

/// One session's probing, in rounds: a Start through A, and once it is
/// acknowledged a GetState and a Finish of the new response through B, at
/// once (each its own client in the history). Nothing else touches the
/// session meanwhile, so after A's acknowledgement the only states are
/// "the new response live" and (after B's Finish) "idle": a GetState
/// showing any other response, or the Finish answered `applied=false`, is
/// stale.
struct Chain {
    recorder: crate::history::Recorder,
    a: Conn,
    b: Conn,
    session: String,
    client: usize,
}

impl Chain {
    async fn send(
        recorder: &crate::history::Recorder,
        conn: &Conn,
        (client, replica): (usize, usize),
        session: &str,
        call: Call,
    ) -> Outcome {
        let pending = recorder.invoke(client, replica, session, call.clone());
        let outcome = conn.perform(session, &call).await;
        pending.complete(outcome.clone());
        outcome
    }

    async fn run(self) -> Tally {
        let mut tally = Tally::default();
        let began = Instant::now();
        let mut round = 0;
        let session = self.session.as_str();
        while began.elapsed() < PROBING {
            round += 1;
            let start = Call::Start {
                request_id: Some(format!("{session}-probe-{round}")),
            };
            let started =
                Self::send(&self.recorder, &self.a, (self.client, 0), session, start).await;
            let Outcome::Ok(Answer::Started { response, .. }) = started else {
                tokio::time::sleep(ROUND).await;
                continue;
            };
            tally.writes += 1;
            let finish = Call::Finish {
                response: Some(response),
            };
            let (state, finished) = tokio::join!(
                Self::send(
                    &self.recorder,
                    &self.b,
                    (self.client + 1, 1),
                    session,
                    Call::GetState
                ),
                Self::send(
                    &self.recorder,
                    &self.b,
                    (self.client + 2, 1),
                    session,
                    finish
                ),
            );
            for outcome in [&state, &finished] {
                if let Outcome::Unknown(code) | Outcome::Failed(code) = outcome {
                    *tally.unanswered.entry(format!("{code:?}")).or_default() += 1;
                }
            }
            if let Outcome::Ok(Answer::State {
                active, revision, ..
            }) = state
            {
                tally.reads += 1;
                if active.is_some_and(|id| id != response) {
                    tally.stale_reads += 1;
                    tally.examples.push(format!(
                        "{session}: B's GetState showed active {active:?} at revision {revision} \
                         after A's Start of {response} was acknowledged"
                    ));
                }
            }
            if let Outcome::Ok(Answer::Finished { applied }) = finished {
                tally.finishes += 1;
                if !applied {
                    tally.stale_finishes += 1;
                    tally.examples.push(format!(
                        "{session}: B answered Finish({response}) applied=false; A's Start of it \
                         was acknowledged before"
                    ));
                }
            }
            // Few enough writes per session that A's follower, which may be
            // stalled while JetStream re-elects, does not outrun the per-key
            // history (64) and end its watches.
            tokio::time::sleep(ROUND).await;
        }
        tally
    }
}

/// Steps the stream leader down until the stream and meta leaders are one
/// node (a few tries; each new stream leader is one of two followers).
async fn align_with_meta_leader(run: &mut Run, mut leader: usize) -> usize {
    for _ in 0..8 {
        let Some(meta) = run.cluster.meta_leader(leader).await else {
            break;
        };
        if meta == leader {
            run.note(format!(
                "n{leader} leads both the stream and the JetStream meta group"
            ));
            return leader;
        }
        if let Err(error) = run.cluster.stream_leader_stepdown(meta).await {
            run.note(format!("stream leader stepdown refused: {error}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        match run
            .cluster
            .settled_leader(meta, Duration::from_secs(20))
            .await
        {
            Some(next) => leader = next,
            None => break,
        }
    }
    let meta = run.cluster.meta_leader(leader).await;
    run.note(format!(
        "could not put the stream leader on the meta leader: stream n{leader}, meta {meta:?}"
    ));
    leader
}

/// `unconfirmed_reads` runs replica B as the build before the fix (answers
/// without a quorum point): the schedule must then find stale answers.
pub async fn deposed_leader(nats: &str, unconfirmed_reads: bool) -> Report {
    let name = if unconfirmed_reads {
        "deposed-leader-unconfirmed"
    } else {
        "deposed-leader"
    };
    let mut run = Run::prepare(name, nats, vec![ReplicaSpec::default(); 2]).await;
    let first = run
        .cluster
        .settled_leader(0, Duration::from_secs(20))
        .await
        .expect("a stream leader with current followers");
    // The widest window, every run: the stream leader is also the meta
    // leader, so once cut off it neither hears that it was deposed nor
    // finds itself without a meta leader (a node that does answers reads
    // "JetStream system temporarily unavailable" soon after the cut).
    let leader = align_with_meta_leader(&mut run, first).await;
    let majority: Vec<usize> = (0..NODES).filter(|&i| i != leader).collect();
    // A dials the majority only, B the leader only; the links they are not
    // to use are cut as well, so neither can wander.
    let a = ReplicaSpec {
        nodes: majority.clone(),
        ..ReplicaSpec::default()
    };
    let b = ReplicaSpec {
        nodes: vec![leader],
        unconfirmed_reads,
        ..ReplicaSpec::default()
    };
    run.cluster
        .net
        .set(Host::Replica(0), Host::Nats(leader), false);
    for &i in &majority {
        run.cluster.net.set(Host::Replica(1), Host::Nats(i), false);
    }
    run.cluster.respawn_replica(0, a).await.expect("replica A");
    run.cluster.respawn_replica(1, b).await.expect("replica B");
    run.fault(format!(
        "replica A (r0) on n{} and n{} only; replica B (r1) on n{leader} (stream leader) only",
        majority[0], majority[1]
    ));
    run.record().await;
    let mut probe = Probe {
        run: &run,
        a: Conn::new(0, &run.cluster.endpoint(0)),
        b: Conn::new(1, &run.cluster.endpoint(1)),
        calls: 0,
    };
    let sessions: Vec<String> = (0..SESSIONS).map(|k| format!("deposed-{k}")).collect();
    for session in &sessions {
        let response = probe.start_through_a(session).await;
        assert!(
            response.is_some(),
            "a Start through A before the cut failed"
        );
        // B agrees while the cluster is whole.
        probe.send(true, session, Call::GetState).await;
    }
    drop(probe);

    run.cluster.cut_node_routes(leader);
    run.fault(format!(
        "n{leader} (stream leader) cut from n{} and n{}",
        majority[0], majority[1]
    ));
    let cut_at = Instant::now();
    let elected = loop {
        if let Some((Some(new), _)) = run.cluster.stream_view(majority[0]).await {
            if new != leader {
                break Some(new);
            }
        }
        if cut_at.elapsed() > ELECTION {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let Some(new_leader) = elected else {
        run.note(format!(
            "no new leader within {ELECTION:?} of the cut: nothing probed"
        ));
        return run.finish().await;
    };
    let election = cut_at.elapsed();
    let old_view = run.cluster.stream_view(leader).await.and_then(|(l, _)| l);
    run.fault(format!(
        "n{new_leader} elected after {:.1} s; n{leader} itself then reported leader {old_view:?}",
        election.as_secs_f64()
    ));

    let a = Conn::new(0, &run.cluster.endpoint(0));
    let b = Conn::new(1, &run.cluster.endpoint(1));
    let chains: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(k, session)| {
            let chain = Chain {
                recorder: run.recorder.clone(),
                a: a.clone(),
                b: b.clone(),
                session: session.clone(),
                client: 10 * (k + 1),
            };
            tokio::spawn(chain.run())
        })
        .collect();
    let probing = Instant::now();
    let mut tally = Tally::default();
    for chain in chains {
        tally.add(chain.await.expect("a probe chain"));
    }
    let Tally {
        writes,
        reads,
        stale_reads,
        finishes,
        stale_finishes,
        examples,
        unanswered,
    } = tally;
    let old_view_after = run.cluster.stream_view(leader).await.and_then(|(l, _)| l);
    run.note(format!(
        "probed {:.1} s after the election: {writes} Starts through A; through B {reads} GetStates \
         answered ({stale_reads} stale), {finishes} Finishes answered ({stale_finishes} stale), unanswered {unanswered:?}; \
         n{leader} then reported leader {old_view_after:?}",
        probing.elapsed().as_secs_f64()
    ));
    for example in examples.iter().take(6) {
        run.note(format!("  stale: {example}"));
    }
    if stale_reads + stale_finishes > 0 {
        run.finding(format!(
            "the harness's own count: {stale_reads} GetStates and {stale_finishes} Finishes \
             through B answered without a write A had acknowledged before they were sent"
        ));
    }
    run.cluster.heal();
    run.fault("healed");
    run.finish().await
}
