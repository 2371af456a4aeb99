//! Why a session's history is not linearizable, told with as few calls as
//! possible.
//!
//! Deleting calls one at a time while the rest stays non-linearizable, as
//! delta debugging does, gives false witnesses here: delete the Start that
//! made a response live and the Finish that found it live becomes
//! inexplicable on its own, so the search would shrink any violation to one
//! call answered against a session that, without its history, does not
//! exist. Instead every step keeps the verdict sound:
//!
//! 1. Cut: the first answered call (by completion) such that the calls
//!    invoked up to its completion, with answers that came later dropped
//!    (unknown), are already not linearizable. That call is the culprit.
//!    Dropping answers only adds orders, so the cut history failing means
//!    the whole one fails.
//! 2. Summarize: the calls settled before the culprit's invocation become
//!    the set of states (with the straddling calls they may include) that
//!    every order of them leaves the session in.
//! 3. Shrink what is left, greedily, one call at a time: a call goes if from
//!    every one of those states the rest is still not linearizable, and
//!    without the culprit it still is (so the culprit remains the reason,
//!    not a new contradiction that the removal made).

use std::collections::HashSet;

use crate::{
    history::{Answer, Op},
    linearizability::{Problem, Violation},
    wgl::{self, Action, Config, Expect, Found, Model, SpecOp},
};

/// Most states one search of the shrinking may visit.
const BUDGET: usize = 1_000_000;

/// Most states listed in a report.
const STATES_SHOWN: usize = 8;

/// Explains a session whose history the search found not linearizable.
pub fn explain(problem: &Problem) -> Violation {
    let subject = &problem.subject;
    let fails = |ops: &[SpecOp]| {
        matches!(
            wgl::search(subject, ops, &Model::absent(), BUDGET),
            Found::Not { .. }
        )
    };
    let mut ranked: Vec<usize> = (0..problem.ops.len())
        .filter(|&i| problem.ops[i].is_ok())
        .collect();
    ranked.sort_by_key(|&i| (problem.ops[i].completed, problem.ops[i].invoked, i));
    let mut rank = vec![usize::MAX; problem.ops.len()];
    for (position, &op) in ranked.iter().enumerate() {
        rank[op] = position;
    }
    let cut = |k: usize| -> (Vec<SpecOp>, SpecOp) {
        let culprit = problem.ops[ranked[k]].clone();
        let ops = problem
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.invoked <= culprit.completed)
            .map(|(i, op)| match rank[i] {
                r if r != usize::MAX && r > k => problem.weaken(op),
                _ => op.clone(),
            })
            .collect();
        (ops, culprit)
    };
    let Some(last) = ranked.len().checked_sub(1).filter(|&k| fails(&cut(k).0)) else {
        return unexplained(problem, "the search could not localize it");
    };
    let (mut lo, mut hi) = (0, last);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fails(&cut(mid).0) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let (history, culprit) = cut(hi);
    summarize_and_shrink(problem, &history, &culprit)
}

fn summarize_and_shrink(problem: &Problem, history: &[SpecOp], culprit: &SpecOp) -> Violation {
    let id = &problem.subject.id;
    let start = culprit.invoked;
    // Settled: answered before the culprit was invoked. Straddling: invoked
    // before it and answered after it (or never).
    let settled = |op: &SpecOp| op.invoked < start && op.is_ok() && op.completed < start;
    let prefix: Vec<SpecOp> = history
        .iter()
        .filter(|op| op.invoked < start)
        .map(|op| match settled(op) {
            true => op.clone(),
            false if op.is_ok() => problem.weaken(op),
            false => op.clone(),
        })
        .collect();
    let mut window: Vec<SpecOp> = history.iter().filter(|op| !settled(op)).cloned().collect();
    window.sort_by_key(|op| (op.invoked, op.source));
    let settled_count = history.len() - window.len();
    let mut violation = Violation::new(
        "linearizability",
        Some(id.as_str()),
        format!(
            "no order of these calls, after the {settled_count} settled before them, \
             gives every answer; the culprit (marked) is the first answer that cannot be explained"
        ),
    );
    violation.culprit = Some(problem.recorded[culprit.source].clone());
    violation.context = context(problem, &prefix);
    let Some(configs) = wgl::configurations(&problem.subject, &prefix, &Model::absent(), BUDGET)
    else {
        violation.states = vec!["(too many to list: the calls before are not summarized)".into()];
        violation.ops = recorded(problem, &window);
        return violation;
    };
    let configs = distinct(configs, &prefix);
    let mut models: Vec<String> = Vec::new();
    for (_, model) in &configs {
        let line = model.describe(id);
        if !models.contains(&line) {
            models.push(line);
        }
    }
    if models.len() > STATES_SHOWN {
        let more = models.len() - STATES_SHOWN;
        models.truncate(STATES_SHOWN);
        models.push(format!("... and {more} more"));
    }
    violation.states = models;
    let holds = |ops: &[SpecOp]| {
        let without: Vec<SpecOp> = ops
            .iter()
            .filter(|op| op.source != culprit.source)
            .cloned()
            .collect();
        configs.iter().any(|config| {
            matches!(
                residual(problem, &without, config),
                Found::Linearizable { .. }
            )
        }) && configs
            .iter()
            .all(|config| matches!(residual(problem, ops, config), Found::Not { .. }))
    };
    if holds(&window) {
        loop {
            let mut changed = false;
            for i in (0..window.len()).rev() {
                if window[i].source == culprit.source {
                    continue;
                }
                let mut trial = window.clone();
                trial.remove(i);
                if holds(&trial) {
                    window = trial;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }
    violation.ops = recorded(problem, &window);
    violation
}

/// The configurations, keeping only which straddling calls they include
/// (every settled call is in all of them), without repeats.
fn distinct(configs: Vec<Config>, prefix: &[SpecOp]) -> Vec<(Vec<usize>, Model)> {
    let mut seen = HashSet::new();
    configs
        .into_iter()
        .filter_map(|(linearized, model)| {
            let mut straddling: Vec<usize> = linearized
                .iter()
                .filter(|&&i| !prefix[i].is_ok())
                .map(|&i| prefix[i].source)
                .collect();
            straddling.sort_unstable();
            seen.insert((straddling.clone(), model.clone()))
                .then_some((straddling, model))
        })
        .collect()
}

/// The window's calls not in `config`, searched from its state.
fn residual(problem: &Problem, ops: &[SpecOp], config: &(Vec<usize>, Model)) -> Found {
    let (done, model) = config;
    let rest: Vec<SpecOp> = ops
        .iter()
        .filter(|op| !done.contains(&op.source))
        .cloned()
        .collect();
    wgl::search(&problem.subject, &rest, model, BUDGET)
}

/// The last few settled calls that changed the session, oldest first.
fn context(problem: &Problem, prefix: &[SpecOp]) -> Vec<Op> {
    let mut changes: Vec<&SpecOp> = prefix
        .iter()
        .filter(|op| {
            matches!(op.action, Action::Call(_))
                && matches!(
                    &op.expect,
                    Expect::Answer(
                        Answer::Started {
                            replayed: false,
                            ..
                        } | Answer::Finished { applied: true }
                            | Answer::Cancelled { cancelled: Some(_) }
                            | Answer::ShutDown { .. }
                    )
                )
        })
        .collect();
    changes.sort_by_key(|op| op.completed);
    let skip = changes.len().saturating_sub(3);
    changes[skip..]
        .iter()
        .map(|op| problem.recorded[op.source].clone())
        .collect()
}

fn recorded(problem: &Problem, ops: &[SpecOp]) -> Vec<Op> {
    ops.iter()
        .map(|op| problem.recorded[op.source].clone())
        .collect()
}

fn unexplained(problem: &Problem, why: &str) -> Violation {
    let mut violation = Violation::new(
        "linearizability",
        Some(problem.subject.id.as_str()),
        format!("the session's history is not linearizable; {why}, so all of it follows"),
    );
    violation.ops = problem.recorded.iter().map(|op| (*op).clone()).collect();
    violation
}
