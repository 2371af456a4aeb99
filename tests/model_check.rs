//! Exhaustive model checking of machine M3 with stateright.
//!
//! - Model 1 (`session_model`): the spec's `Session` role, every transition
//!   carried out by the real `Session::apply` / `machine::transition`.
//! - Model 2 (`distributed`): gateways sending Start/Finish/Cancel/Shutdown
//!   to one coordinator actor (holding a real `Session`), over stateright's
//!   unordered duplicating network, and over a lossy non-duplicating one with
//!   client retries that resend the same `request_id`.
//! - Model 3 (`legacy`): the legacy dual-writer start, deliberately broken;
//!   the checker must find its double start. Likewise, coordinators with a
//!   deliberate bug must break the distributed property about that bug.
//! - Model 4 (`nats_path`): the NATS backend's call path: replicas with
//!   caches over a key-value store with compare-and-set and stale reads,
//!   answers with and without a write, retries, lost acknowledgements; and
//!   replicas with a deliberate bug in that path, each of which must break
//!   a property (among them the path before its fix for a lost
//!   acknowledgement under a later write, which the checker found).
//!
//! Every check is a full breadth-first search (single-threaded, so counts
//! are deterministic). Run with `cargo test --test model_check -- --nocapture`
//! to see the state counts and times. See `docs/verification.md`.

use std::{
    collections::BTreeSet,
    fmt::Debug,
    hash::Hash,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use stateright::{Checker, CheckerVisitor, Expectation, HasDiscoveries, Model, Path};

#[path = "model_check/distributed.rs"]
mod distributed;
#[path = "model_check/ledger.rs"]
mod ledger;
#[path = "model_check/legacy.rs"]
mod legacy;
#[path = "model_check/nats_path.rs"]
mod nats_path;
#[path = "model_check/session_model.rs"]
mod session_model;

use distributed::{GatewaySpec, Mutation, Net, Role};

/// Runs a full BFS, prints what it explored, and checks every property:
/// no counterexample for an `always`, an example for every `sometimes`.
fn check_exhaustively<M>(label: &str, model: M) -> usize
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let properties: Vec<(Expectation, &'static str)> = model
        .properties()
        .iter()
        .map(|p| (p.expectation.clone(), p.name))
        .collect();
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    let elapsed = started.elapsed();
    let unique = checker.unique_state_count();
    println!(
        "model_check: {label}: {unique} unique states ({} generated, max depth {}) in {elapsed:.2?}",
        checker.state_count(),
        checker.max_depth(),
    );
    assert!(checker.is_done(), "{label}: the search did not finish");
    let mut always = 0;
    let mut sometimes = 0;
    for (expectation, name) in &properties {
        match expectation {
            Expectation::Always => {
                always += 1;
                if let Some(path) = checker.discovery(name) {
                    panic!("{label}: counterexample to \"{name}\":\n{path}");
                }
            }
            Expectation::Sometimes => {
                sometimes += 1;
                assert!(
                    checker.discovery(name).is_some(),
                    "{label}: \"{name}\" is never reached (the check would be vacuous)"
                );
            }
            Expectation::Eventually => unreachable!("no liveness properties here"),
        }
    }
    // The same verdicts through stateright's own helper.
    checker.assert_properties();
    println!(
        "model_check: {label}: {always} always-properties hold, {sometimes} sometimes-properties reached"
    );
    assert!(always > 0 && sometimes > 0);
    unique
}

/// The first state the BFS reaches that breaks `property` (so a shortest
/// trace), recorded by a visitor: stateright's own discovery for an
/// `always` property is the last violating state it saw, not the first.
struct FirstViolation<M: Model> {
    condition: fn(&M, &M::State) -> bool,
    found: Slot<M>,
}

type Slot<M> = Arc<Mutex<Option<Path<<M as Model>::State, <M as Model>::Action>>>>;

impl<M: Model> CheckerVisitor<M> for FirstViolation<M> {
    fn visit(&self, model: &M, path: Path<M::State, M::Action>) {
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        if found.is_none() && !(self.condition)(model, path.last_state()) {
            *found = Some(path);
        }
    }
}

/// Runs a BFS until `property` (an `always`) is broken and returns a
/// shortest counterexample, after printing it.
fn shortest_counterexample<M>(
    label: &str,
    model: M,
    property: &'static str,
) -> Path<M::State, M::Action>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug + Send + Sync + 'static,
{
    let found: Slot<M> = Arc::new(Mutex::new(None));
    let visitor = FirstViolation {
        condition: model.property(property).condition,
        found: Arc::clone(&found),
    };
    let started = Instant::now();
    let checker = model
        .checker()
        .visitor(visitor)
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    assert!(
        checker.discovery(property).is_some(),
        "{label}: no counterexample to \"{property}\""
    );
    let path = found
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .expect("the visitor saw the violating state");
    let actions = path.clone().into_actions();
    println!(
        "model_check: {label}: counterexample to \"{property}\" in {} steps \
         ({} unique states explored, {elapsed:.2?}):",
        actions.len(),
        checker.unique_state_count(),
    );
    for (step, action) in actions.iter().enumerate() {
        println!("  {}. {action:?}", step + 1);
    }
    path
}

#[test]
fn session_role_with_the_real_transition_function() {
    let unique = check_exhaustively(
        &format!(
            "session role (MAX_RESPONSES = {})",
            session_model::MAX_RESPONSES
        ),
        session_model::SessionModel::new(),
    );
    assert!(unique > 1);
}

/// The client read loop: Start, Finish of its response, fenced Cancel.
fn client(ops: u8, starts: u8, retries: u8) -> GatewaySpec {
    GatewaySpec {
        role: Role::ClientReadLoop,
        ops,
        starts,
        cancel_any: false,
        shutdown: false,
        retries,
    }
}

/// The VAD path: the same, and it may also shut the session down.
fn vad(ops: u8, starts: u8, retries: u8) -> GatewaySpec {
    GatewaySpec {
        role: Role::Vad,
        ops,
        starts,
        cancel_any: false,
        shutdown: true,
        retries,
    }
}

/// The session's owner: one Shutdown.
fn supervisor(retries: u8) -> GatewaySpec {
    GatewaySpec {
        role: Role::Supervisor,
        ops: 1,
        starts: 0,
        cancel_any: false,
        shutdown: true,
        retries,
    }
}

#[test]
fn two_gateways_over_a_duplicating_network() {
    let gateways = [client(2, 2, 0), vad(2, 1, 0)];
    check_exhaustively(
        "distributed: client(2 requests, up to 2 Starts) + VAD(2 requests), duplicating network",
        distributed::system(&gateways, Net::Duplicating, Mutation::None),
    );
}

#[test]
fn two_gateways_over_a_lossy_network_with_retries() {
    let gateways = [client(2, 1, 1), vad(1, 1, 1)];
    check_exhaustively(
        "distributed: client(2 requests) + VAD(1 request), lossy network, 1 retry each",
        distributed::system(&gateways, Net::LossyWithRetries, Mutation::None),
    );
}

#[test]
fn three_gateways_with_a_supervisor_over_a_duplicating_network() {
    let gateways = [client(2, 1, 0), vad(1, 1, 0), supervisor(0)];
    check_exhaustively(
        "distributed: client(2) + VAD(1) + supervisor Shutdown(1), duplicating network",
        distributed::system(&gateways, Net::Duplicating, Mutation::None),
    );
}

/// Each distributed property, against a coordinator with the bug it is
/// about: the checker must find a counterexample.
#[test]
fn distributed_properties_catch_their_bugs() {
    let cases = [
        (
            Mutation::NoReplay,
            Net::LossyWithRetries,
            "a retried Start never supersedes its own response",
        ),
        (
            Mutation::NoReplay,
            Net::Duplicating,
            "a request id is applied at most once and replays answer the original",
        ),
        (
            Mutation::FinishIgnoresId,
            Net::Duplicating,
            "a Finish for X only ever ends X",
        ),
        (
            Mutation::CancelIgnoresFence,
            Net::Duplicating,
            "a Cancel with if_response_id X only ever cancels X",
        ),
    ];
    for (mutation, net, property) in cases {
        let retries = u8::from(net == Net::LossyWithRetries);
        let gateways = [client(2, 1, retries), vad(2, 1, retries)];
        shortest_counterexample(
            &format!("mutant {mutation:?} over {net:?}"),
            distributed::system(&gateways, net, mutation),
            property,
        );
    }
}

#[test]
fn legacy_dual_writer_race_is_found() {
    use legacy::{Caller, LegacyAction::*};
    let path = shortest_counterexample(
        "legacy serial start",
        legacy::LegacyModel,
        "at most one live response",
    );
    let last = path.last_state().clone();
    let actions = path.into_actions();
    println!("  => live responses: {}", last.ledger.live);
    assert_eq!(last.ledger.live, 2, "two responses live at once");
    // The race itself: both callers cancel (nothing is registered yet), then
    // both spawn and register.
    assert_eq!(actions.len(), 4);
    assert!(actions[..2].contains(&CancelRegistered(Caller::ClientReadLoop)));
    assert!(actions[..2].contains(&CancelRegistered(Caller::Vad)));
    assert!(actions[2..].contains(&SpawnAndRegister(Caller::ClientReadLoop)));
    assert!(actions[2..].contains(&SpawnAndRegister(Caller::Vad)));

    // The same split start also leaks a response (never ended, not even by
    // teardown) and can start one after teardown; the shared properties catch
    // those too.
    for property in [
        "every started response gets exactly one terminal",
        "nothing starts after terminated",
    ] {
        shortest_counterexample("legacy serial start", legacy::LegacyModel, property);
    }
}

#[test]
fn nats_path_two_starts_and_a_fenced_cancel() {
    check_exhaustively(
        "nats path: replica 0 Start + Cancel(if 1), replica 1 Start",
        nats_path::supersede_and_fenced_cancel(nats_path::Mutation::None),
    );
}

#[test]
fn nats_path_finish_and_shutdown() {
    check_exhaustively(
        "nats path: replica 0 Start + Finish(1), replica 1 Shutdown",
        nats_path::finish_and_shutdown(nats_path::Mutation::None),
    );
}

#[test]
fn nats_path_a_start_retried_on_the_other_replica() {
    check_exhaustively(
        "nats path: replica 0 Start(req 1) + Finish(1), replica 1 Start(req 1) + Cancel",
        nats_path::retried_start(nats_path::Mutation::None),
    );
}

#[test]
fn nats_path_three_replicas() {
    check_exhaustively(
        "nats path: replica 0 Start + Cancel(if 1), replica 1 Start + Finish(2), replica 2 Shutdown",
        nats_path::three_replicas(nats_path::Mutation::None),
    );
}

#[test]
fn nats_path_lost_acknowledgements_reread_first() {
    check_exhaustively(
        "nats path: replica 0 Start + Cancel, replica 1 Start + Finish(2), acks lost (re-read before others write)",
        nats_path::lost_acks(nats_path::Acks::LostRereadFirst, nats_path::Mutation::None),
    );
}

/// The NATS call path with its driver or store broken (a write decided on
/// the cache sent as a plain put; a store that ignores the expected
/// revision): the checker must find a counterexample to each property
/// listed against it. The attempt machine's own safeguards are taken out
/// in its source instead, by `scripts/mutants.sh` (docs/verification.md).
#[test]
fn nats_path_mutations_are_caught() {
    use nats_path::Mutation::{CasOff, TrustCache};
    type Scenario = fn(nats_path::Mutation) -> nats_path::NatsPath;
    let supersede: (&str, Scenario) = (
        "Start + Cancel(if 1) / Start",
        nats_path::supersede_and_fenced_cancel,
    );
    let shutdown: (&str, Scenario) = (
        "Start + Finish(1) / Shutdown",
        nats_path::finish_and_shutdown,
    );
    let cases = [
        (TrustCache, supersede, "nothing acknowledged is lost"),
        (TrustCache, supersede, "every answer is linearizable"),
        (
            TrustCache,
            supersede,
            "every started response gets exactly one terminal",
        ),
        (TrustCache, shutdown, "at most one live response"),
        (CasOff, supersede, "nothing acknowledged is lost"),
        (CasOff, supersede, "every answer is linearizable"),
        (CasOff, supersede, "at most one live response"),
        (CasOff, shutdown, "nothing starts after terminated"),
    ];
    for (mutation, (scenario, model), property) in cases {
        shortest_counterexample(
            &format!("nats path mutant {mutation:?} ({scenario})"),
            model(mutation),
            property,
        );
    }
}

/// Lost acknowledgements with other replicas writing before the call tries
/// again: the case the model found wrong in the call path, which then
/// recognised its own unacknowledged write only while it was still the
/// key's latest entry. The attempt machine asks for the successor of the
/// revision the write expected (`Request::Successor`), and the model
/// passes; with that taken out (the mutant `successor_skipped` of
/// `scripts/mutants.sh`) an unfenced Cancel cancels a second response and
/// "a call takes effect at most once" fails.
#[test]
fn nats_path_a_lost_acknowledgement_under_a_later_write_is_not_applied_again() {
    check_exhaustively(
        "nats path: replica 0 Start + Cancel, replica 1 Start + Finish(2), acks lost (others write before the retry)",
        nats_path::lost_acks(nats_path::Acks::Lost, nats_path::Mutation::None),
    );
}
