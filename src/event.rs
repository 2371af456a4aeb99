//! The lifecycle event as watchers and retained histories see it, and the one
//! place events are built: a [`Change`] (what a transition emitted) stamped
//! with its seqs. Pure: the log that sequences and fans events out is
//! `events`; this module holds only the data.

use std::sync::Arc;

use arrayvec::ArrayVec;

use crate::{
    ids::SessionId,
    machine::{EventKind, MAX_EVENTS_PER_TRANSITION},
};

/// One emitted event, as watchers and the retained history see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LifecycleEvent {
    pub session_id: SessionId,
    /// Per session, 1, 2, 3, ... with no gap.
    pub revision: u64,
    /// Coordinator-wide, strictly increasing.
    pub seq: u64,
    pub unix_nanos: i64,
    pub kind: EventKind,
}

impl LifecycleEvent {
    /// The one constructor: every event a watcher or a history sees is made
    /// here (from a fresh [`Change`] or a retained one).
    pub fn shared(
        session_id: &SessionId,
        revision: u64,
        seq: u64,
        unix_nanos: i64,
        kind: EventKind,
    ) -> SharedEvent {
        Arc::new(LifecycleEvent {
            session_id: session_id.clone(),
            revision,
            seq,
            unix_nanos,
            kind,
        })
    }

    pub fn is_terminated(&self) -> bool {
        matches!(self.kind, EventKind::Terminated { .. })
    }
}

pub type SharedEvent = Arc<LifecycleEvent>;

/// What one transition emitted, before it has seqs: the decision's output
/// (`decision::Decision::change`) and, on the NATS backend, what an entry
/// stores. The seqs come from whoever orders events: the memory log at
/// append time, the NATS stream once the write is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Revision of the first event; the others follow without a gap.
    pub first_revision: u64,
    pub unix_nanos: i64,
    pub kinds: ArrayVec<EventKind, MAX_EVENTS_PER_TRANSITION>,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The events watchers see, numbered with consecutive seqs from
    /// `first_seq`.
    pub fn events(
        &self,
        session_id: &SessionId,
        first_seq: u64,
    ) -> ArrayVec<SharedEvent, MAX_EVENTS_PER_TRANSITION> {
        self.kinds
            .iter()
            .enumerate()
            .map(|(index, kind)| {
                LifecycleEvent::shared(
                    session_id,
                    self.first_revision + index as u64,
                    first_seq + index as u64,
                    self.unix_nanos,
                    *kind,
                )
            })
            .collect()
    }
}
