//! Judges every replica's watch-all recording against the contract's
//! invariants and the acknowledged answers. Skeleton; the checks follow.

use std::fmt;

use crate::{
    history::{Op, WatchedEvent},
    linearizability::Violation,
};

/// One replica's watch-all recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recording {
    pub replica: usize,
    pub events: Vec<WatchedEvent>,
    /// The watch ran for the whole run; `false` when the replica was killed,
    /// so the recording may miss events at its ends.
    pub complete: bool,
}

/// What the watch check looked at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    pub recordings: usize,
    pub events: usize,
    pub sessions: usize,
    /// Acknowledged transitions found in every complete recording.
    pub acknowledged: usize,
}

impl fmt::Display for WatchStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "watches: {} recordings, {} events, {} sessions, {} acknowledged transitions present",
            self.recordings, self.events, self.sessions, self.acknowledged
        )
    }
}

/// Checks each recording on its own, the recordings against each other, and
/// every acknowledged transition against every complete recording.
pub fn check_watches(ops: &[Op], recordings: &[Recording]) -> Result<WatchStats, Violation> {
    let _ = (ops, recordings);
    todo!("watch recording checks (issue 15)")
}
