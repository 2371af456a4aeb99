//! Many gateways race on a few sessions over real gRPC while a watch-all
//! stream records everything. Replaying the recording proves the contract's
//! invariants held throughout: at most one live response per session, exactly
//! one `ended` per `started`, nothing after `terminated`, gap-free revisions,
//! strictly increasing seq. The replies are cross-checked against the stream.

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use respcoord::proto::v1 as pb;
use tonic::Code;

const CLIENTS: usize = 8;
const CALLS_PER_CLIENT: usize = 250;
const SESSIONS: usize = 4;

#[derive(Default)]
struct Seen {
    started: Vec<(String, u64)>,
    applied_finishes: Vec<(String, u64)>,
    cancelled: Vec<(String, u64)>,
}

async fn gateway(server_addr: String, seed: u64) -> Seen {
    let mut c = pb::response_coordinator_client::ResponseCoordinatorClient::connect(server_addr)
        .await
        .unwrap();
    let mut rng = Rng(seed);
    let mut seen = Seen::default();
    let mut mine: HashMap<String, u64> = HashMap::new();
    for call in 0..CALLS_PER_CLIENT {
        let session = format!("s{}", rng.below(SESSIONS as u64));
        match rng.below(1000) {
            0..=449 => {
                let request_id = if rng.below(4) == 0 {
                    format!("g{seed}-{call}")
                } else {
                    String::new()
                };
                let source = if rng.below(2) == 0 {
                    pb::Source::Client
                } else {
                    pb::Source::Vad
                };
                let request = start_req(&session, source, &request_id);
                match c.start(request.clone()).await {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        seen.started.push((session.clone(), reply.response_id));
                        mine.insert(session.clone(), reply.response_id);
                        if !request_id.is_empty() {
                            // A retry is a replay: same id, nothing new started.
                            let retry = c.start(request).await.unwrap().into_inner();
                            assert!(retry.replayed);
                            assert_eq!(retry.response_id, reply.response_id);
                        }
                    }
                    Err(status) => assert_eq!(status.code(), Code::FailedPrecondition),
                }
            }
            450..=799 => {
                let id = mine.get(&session).copied().unwrap_or(0);
                let status = if rng.below(5) == 0 {
                    pb::TerminalStatus::Failed
                } else {
                    pb::TerminalStatus::Completed
                };
                let request = pb::FinishRequest {
                    session_id: session.clone(),
                    response_id: id,
                    status: status.into(),
                };
                match c.finish(request).await {
                    Ok(reply) if reply.get_ref().applied => {
                        seen.applied_finishes.push((session, id))
                    }
                    Ok(_) => {}
                    Err(status) => assert_eq!(status.code(), Code::NotFound),
                }
            }
            800..=997 => {
                let if_id = if rng.below(2) == 0 {
                    mine.get(&session).copied().unwrap_or(0)
                } else {
                    0
                };
                let request = pb::CancelRequest {
                    session_id: session.clone(),
                    source: 2,
                    if_response_id: if_id,
                };
                match c.cancel(request).await {
                    Ok(reply) => {
                        let cancelled = reply.into_inner().cancelled_response_id;
                        if cancelled != 0 {
                            if if_id != 0 {
                                assert_eq!(
                                    cancelled, if_id,
                                    "a conditional cancel only cancels its target"
                                );
                            }
                            seen.cancelled.push((session, cancelled));
                        }
                    }
                    Err(status) => assert_eq!(status.code(), Code::NotFound),
                }
            }
            _ => {
                // Rare, so the race mostly happens on live sessions.
                c.shutdown(pb::ShutdownRequest {
                    session_id: session,
                    source: pb::Source::Unspecified.into(),
                })
                .await
                .unwrap();
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_gateways_never_break_the_invariants() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let mut all = watch_all(&mut c, None).await;

    let endpoint = server.endpoint();
    let gateways: Vec<_> = (0..CLIENTS as u64)
        .map(|i| tokio::spawn(gateway(endpoint.clone(), 0x9E37_79B9_7F4A_7C15 ^ (i + 1))))
        .collect();
    let mut seen = Seen::default();
    for gateway in gateways {
        let s = gateway.await.unwrap();
        seen.started.extend(s.started);
        seen.applied_finishes.extend(s.applied_finishes);
        seen.cancelled.extend(s.cancelled);
    }
    // Everything that happened is now in the log; end every session so every
    // started response must have its terminal, then read the whole stream.
    for i in 0..SESSIONS {
        shutdown(&mut c, &format!("s{i}")).await;
    }
    let mut final_states = HashMap::new();
    for i in 0..SESSIONS {
        let state = get_state(&mut c, &format!("s{i}")).await.unwrap();
        final_states.insert(state.session_id.clone(), state);
    }
    let total: u64 = final_states.values().map(|s| s.revision).sum();
    let events = next_events(&mut all, usize::try_from(total).unwrap()).await;

    let report = check_invariants(&events);
    println!("replayed {} events: {report:?}", events.len());
    assert_eq!(report.still_live, 0);
    assert_eq!(
        report.started, report.ended,
        "exactly one terminal per started response"
    );
    assert_eq!(report.terminated, SESSIONS);
    assert!(
        report.started > 100,
        "the race must actually start responses: {report:?}"
    );

    // Replies agree with the stream: every acknowledged start, applied finish
    // and cancel is in it.
    let started: HashSet<(String, u64)> = events
        .iter()
        .filter_map(|e| match ev(e) {
            Ev::Started(id, _) => Some((e.session_id.clone(), id)),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), report.started);
    for acked in &seen.started {
        assert!(
            started.contains(acked),
            "acknowledged start {acked:?} missing from the stream"
        );
    }
    let ended: HashMap<(String, u64), Ev> = events
        .iter()
        .filter_map(|e| match ev(e) {
            Ev::Ended(id, ..) => Some(((e.session_id.clone(), id), ev(e))),
            _ => None,
        })
        .collect();
    for finished in &seen.applied_finishes {
        assert!(
            matches!(ended.get(finished), Some(Ev::Ended(_, status, _)) if *status != pb::TerminalStatus::Cancelled),
            "applied finish {finished:?} must be its response's terminal"
        );
    }
    for cancelled in &seen.cancelled {
        assert!(
            matches!(
                ended.get(cancelled),
                Some(Ev::Ended(
                    _,
                    pb::TerminalStatus::Cancelled,
                    pb::CancelReason::Requested
                ))
            ),
            "cancel {cancelled:?} must be its response's terminal"
        );
    }
    // Final states agree with a replay of each session's events.
    for (session, state) in final_states {
        let last = events
            .iter()
            .filter(|e| e.session_id == session)
            .map(|e| e.revision)
            .max();
        assert_eq!(last, Some(state.revision));
        let starts = events
            .iter()
            .filter(|e| e.session_id == session && matches!(ev(e), Ev::Started(..)))
            .count() as u64;
        assert_eq!(
            starts, state.responses_started,
            "responses_started of {session}"
        );
    }
    server.stop().await;
}
