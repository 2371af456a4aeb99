//! Judges a fault run's history: per session, is there a sequential order of
//! the operations, consistent with real time, in which the project's own
//! decision core (`respcoord::decision::decide` on a `Session`) gives every
//! answer the clients saw? Skeleton; the search follows.

use std::fmt;

use crate::history::{Op, WatchedEvent};

/// What the linearizability check looked at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinearStats {
    pub sessions: usize,
    pub ops: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
    /// (linearized set, model state) pairs the search visited.
    pub states: usize,
}

impl fmt::Display for LinearStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "linearizable: {} sessions, {} ops ({} ok, {} failed, {} unknown), {} search states",
            self.sessions, self.ops, self.ok, self.failed, self.unknown, self.states
        )
    }
}

/// A history or recording that breaks the contract, with the smallest part
/// of it that still does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which check failed ("linearizability", "watch").
    pub check: &'static str,
    pub session: Option<String>,
    pub reason: String,
    /// The minimal failing history (linearizability) or the ops a watch
    /// check names.
    pub ops: Vec<Op>,
    /// The offending events, with the replica that delivered them.
    pub events: Vec<(usize, WatchedEvent)>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} violation", self.check)?;
        if let Some(session) = &self.session {
            write!(f, " on session {session:?}")?;
        }
        writeln!(f, ": {}", self.reason)?;
        for op in &self.ops {
            writeln!(f, "  {op:?}")?;
        }
        for (replica, event) in &self.events {
            writeln!(f, "  replica {replica}: {event:?}")?;
        }
        Ok(())
    }
}

/// Checks every session's operations for linearizability; `watched` (every
/// replica's watch recording) only supplies the ids an unknown Start may
/// have minted.
pub fn check_linearizable(
    ops: &[Op],
    watched: &[Vec<WatchedEvent>],
) -> Result<LinearStats, Violation> {
    let _ = (ops, watched);
    todo!("linearizability search (issue 15)")
}
