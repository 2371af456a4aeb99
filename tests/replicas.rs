//! Several respcoord replicas on one NATS JetStream bucket, over real gRPC on
//! loopback: every replica serves every session with the same contract, a
//! watcher on any replica sees every replica's events, and killing a replica
//! mid-load loses nothing that was acknowledged.
//!
//! Needs NATS with JetStream: `RESPCOORD_TEST_NATS_URL` (scripts/test.sh sets
//! it and starts a server if none runs). Without that variable and without a
//! server on 127.0.0.1:4222 these tests say so and pass vacuously, so a bare
//! `cargo test` on a laptop still works; the test command never skips them.

mod common;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use common::*;
use respcoord::{
    grpc::WatchSettings,
    nats::NatsCoordinator,
    proto::v1::{self as pb, lifecycle_event::Kind},
    registry::CoordConfig,
    server::ServerConfig,
};
use respcoord_client::RetryPolicy;
use tonic::Code;

/// `n` replicas serving one fresh bucket.
async fn replicas(n: usize, registry: CoordConfig) -> Vec<TestServer> {
    let bucket = fresh_bucket();
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        let nats = NatsCoordinator::connect(&test_nats_settings(&bucket, &registry), registry)
            .await
            .expect("NATS replica");
        let config = ServerConfig {
            registry,
            watch: WatchSettings {
                bookmark_interval: Duration::from_millis(200),
                ..WatchSettings::default()
            },
            shutdown_grace: Duration::from_secs(5),
            ..ServerConfig::default()
        };
        servers.push(TestServer::serving(nats.into(), Some(bucket.clone()), config).await);
    }
    servers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_sees_every_replicas_events_with_the_same_revisions_and_seqs() {
    if !nats_available() {
        return;
    }
    let servers = replicas(2, CoordConfig::default()).await;
    let (mut a, mut b) = (servers[0].client().await, servers[1].client().await);
    let mut on_a = watch_session(&mut a, "s", None).await;
    let mut all_on_b = watch_all(&mut b, None).await;

    let started = start(&mut b, "s").await;
    assert_eq!(started.state.as_ref().map(|s| s.revision), Some(1));
    let finished = finish(
        &mut a,
        "s",
        started.response_id,
        pb::TerminalStatus::Completed,
    )
    .await;
    assert!(finished.applied, "a replica finishes what another started");

    let seen_on_a = next_events(&mut on_a, 2).await;
    let seen_on_b = next_events(&mut all_on_b, 2).await;
    assert_eq!(
        seen_on_a, seen_on_b,
        "both replicas deliver identical events"
    );
    assert_eq!(revisions(&seen_on_a), [1, 2]);
    assert!(seen_on_a[0].seq < seen_on_a[1].seq);
    assert!(matches!(
        seen_on_a[1].kind,
        Some(Kind::Ended(ref e)) if e.response_id == started.response_id
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_replay_and_fencing_hold_across_replicas() {
    if !nats_available() {
        return;
    }
    let servers = replicas(2, CoordConfig::default()).await;
    let (mut a, mut b) = (servers[0].client().await, servers[1].client().await);
    let request = start_req("r", pb::Source::Client, "req-1");
    let first = a.start(request.clone()).await.expect("start").into_inner();
    let retry = b.start(request).await.expect("retry").into_inner();
    assert!(retry.replayed, "the retry on another replica is a replay");
    assert_eq!(retry.response_id, first.response_id);

    let newer = start(&mut b, "r").await;
    assert!(newer.response_id > first.response_id);
    let stale = finish(
        &mut a,
        "r",
        first.response_id,
        pb::TerminalStatus::Completed,
    )
    .await;
    assert!(
        !stale.applied,
        "the superseded response is fenced on every replica"
    );

    shutdown(&mut a, "r").await;
    let refused = b.start(start_req("r", pb::Source::Vad, "")).await;
    assert_code(refused, Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_continue_on_any_replica_and_see_own_writes() {
    if !nats_available() {
        return;
    }
    let servers = replicas(2, CoordConfig::default()).await;
    let (mut a, mut b) = (servers[0].client().await, servers[1].client().await);
    let ids: Vec<String> = (0..5).map(|i| format!("list-{i}")).collect();
    for id in &ids {
        start(&mut a, id).await;
    }
    // Written through A, listed at once through B, page by page across both.
    let mut listed = Vec::new();
    let mut token = String::new();
    for page in 0.. {
        let client = if page % 2 == 0 { &mut b } else { &mut a };
        let reply = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                page_token: token.clone(),
            })
            .await
            .expect("list")
            .into_inner();
        assert!(reply.sessions.len() <= 2);
        listed.extend(reply.sessions.into_iter().map(|s| s.session_id));
        token = reply.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(listed, ids, "every session once, in id order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_happens_once_across_replicas_then_the_tombstone_is_forgotten() {
    if !nats_available() {
        return;
    }
    let registry = CoordConfig {
        idle_ttl: Duration::from_millis(400),
        tombstone_ttl: Duration::from_millis(400),
        ..CoordConfig::default()
    };
    let servers = replicas(3, registry).await;
    let mut a = servers[0].client().await;
    let mut c = servers[2].client().await;
    let mut watch = watch_session(&mut c, "idle", None).await;
    let begun = Instant::now();
    let started = start(&mut a, "idle").await;
    let (events, end) = drain(&mut watch).await;
    end.expect("the watch ends with OK after terminated");
    assert!(
        begun.elapsed() >= Duration::from_millis(400),
        "expired before its TTL"
    );
    assert_eq!(
        evs(&events),
        [
            Ev::Started(started.response_id, pb::Source::Client),
            Ev::CancelRequested(started.response_id, pb::CancelReason::Expired),
            Ev::Ended(
                started.response_id,
                pb::TerminalStatus::Cancelled,
                pb::CancelReason::Expired
            ),
            Ev::Terminated(pb::CancelReason::Expired),
        ],
        "three replicas, one expiry"
    );
    // Forgotten after the tombstone TTL: a new session with higher ids.
    let deadline = Instant::now() + PATIENCE;
    loop {
        match get_state(&mut a, "idle").await {
            Err(status) if status.code() == Code::NotFound => break,
            Ok(state) => assert_eq!(state.phase, pb::Phase::Terminated as i32),
            Err(status) => panic!("unexpected {status:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the tombstone was never forgotten"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = start(&mut c, "idle").await;
    assert!(again.response_id > started.response_id);
    assert_eq!(again.state.map(|s| s.revision), Some(1));
}

/// What one gateway was told.
#[derive(Default)]
struct Acknowledged {
    started: Vec<(String, u64)>,
    finished: Vec<(String, u64)>,
    cancelled: Vec<(String, u64)>,
}

/// A gateway that talks to `endpoints[0]` and fails over to the next
/// endpoint when a call fails with a transport-level error.
async fn gateway(endpoints: Vec<String>, seed: u64, calls: usize) -> Acknowledged {
    let mut acknowledged = Acknowledged::default();
    let mut which = 0;
    let connect = |endpoint: String| async move {
        pb::response_coordinator_client::ResponseCoordinatorClient::connect(endpoint).await
    };
    let mut client = connect(endpoints[which].clone()).await.expect("connect");
    let mut mine: HashMap<String, u64> = HashMap::new();
    let mut rng = Rng(seed);
    let mut next = move |n: u64| rng.below(n);
    for call in 0..calls {
        let session = format!("k{}", next(6));
        let choice = next(10);
        let result = loop {
            let attempt = match choice {
                0..=4 => {
                    let request = start_req(&session, pb::Source::Vad, &format!("g{seed}-{call}"));
                    client.start(request).await.map(|r| {
                        let r = r.into_inner();
                        (1, r.response_id)
                    })
                }
                5..=7 => {
                    let id = mine.get(&session).copied().unwrap_or(0);
                    client
                        .finish(pb::FinishRequest {
                            session_id: session.clone(),
                            response_id: id,
                            status: pb::TerminalStatus::Completed.into(),
                        })
                        .await
                        .map(|r| (2, if r.into_inner().applied { id } else { 0 }))
                }
                _ => client
                    .cancel(pb::CancelRequest {
                        session_id: session.clone(),
                        source: 1,
                        if_response_id: 0,
                    })
                    .await
                    .map(|r| (3, r.into_inner().cancelled_response_id)),
            };
            match attempt {
                Err(status) if RetryPolicy::retryable(&status) => {
                    which = (which + 1) % endpoints.len();
                    if let Ok(fresh) = connect(endpoints[which].clone()).await {
                        client = fresh;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other,
            }
        };
        match result {
            Ok((1, id)) => {
                mine.insert(session.clone(), id);
                acknowledged.started.push((session, id));
            }
            Ok((2, id)) if id != 0 => acknowledged.finished.push((session, id)),
            Ok((3, id)) if id != 0 => acknowledged.cancelled.push((session, id)),
            Ok(_) => {}
            Err(status) => assert_eq!(status.code(), Code::NotFound, "{status:?}"),
        }
    }
    acknowledged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_replica_mid_load_loses_nothing_acknowledged() {
    if !nats_available() {
        return;
    }
    let mut servers = replicas(3, CoordConfig::default()).await;
    let endpoints: Vec<String> = servers.iter().map(TestServer::endpoint).collect();
    let mut observer = servers[2].client().await;
    let mut recording = watch_all(&mut observer, Some(0)).await;

    // Six gateways, two starting on each replica.
    let mut gateways = Vec::new();
    for g in 0..6u64 {
        let mut mine = endpoints.clone();
        mine.rotate_left((g % 3) as usize);
        gateways.push(tokio::spawn(gateway(mine, 0x9E37_79B9 + g, 150)));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = servers.remove(0);
    victim.kill().await;

    let mut acknowledged = Acknowledged::default();
    for gateway in gateways {
        let seen = gateway.await.expect("gateway");
        acknowledged.started.extend(seen.started);
        acknowledged.finished.extend(seen.finished);
        acknowledged.cancelled.extend(seen.cancelled);
    }

    // A marker written last tells when the recording has everything.
    let mut survivor = servers[0].client().await;
    let marker = start(&mut survivor, "zz-marker").await.response_id;
    let mut events: Vec<pb::LifecycleEvent> = Vec::new();
    while !events
        .iter()
        .any(|e| matches!(e.kind, Some(Kind::Started(ref s)) if s.response_id == marker))
    {
        let message = tokio::time::timeout(PATIENCE, recording.message())
            .await
            .expect("the recording reaches the marker in time")
            .expect("the recording watch on a surviving replica stays up")
            .expect("the recording watch does not end");
        events.extend(message.events);
    }
    let report = check_invariants(&events);
    assert!(report.started > 0, "the load started responses: {report:?}");

    let started: HashSet<u64> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Started(s)) => Some(s.response_id),
            _ => None,
        })
        .collect();
    let ended: HashMap<u64, i32> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Ended(x)) => Some((x.response_id, x.status)),
            _ => None,
        })
        .collect();
    for (session, id) in &acknowledged.started {
        assert!(
            started.contains(id),
            "acknowledged start {id} on {session} missing"
        );
    }
    for (session, id) in &acknowledged.finished {
        assert_eq!(
            ended.get(id),
            Some(&(pb::TerminalStatus::Completed as i32)),
            "acknowledged finish of {id} on {session} missing"
        );
    }
    for (session, id) in &acknowledged.cancelled {
        assert_eq!(
            ended.get(id),
            Some(&(pb::TerminalStatus::Cancelled as i32)),
            "acknowledged cancel of {id} on {session} missing"
        );
    }
    eprintln!(
        "replica kill: {} events, {report:?}, {} starts / {} finishes / {} cancels acknowledged",
        events.len(),
        acknowledged.started.len(),
        acknowledged.finished.len(),
        acknowledged.cancelled.len()
    );
}
