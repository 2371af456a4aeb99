//! A session's retained events in one exact-size allocation and a
//! two-word handle.
//!
//! A million idle sessions each keep their last few events, so the handle
//! sits in every registry slot and the buffer's slack is paid a million
//! times. `VecDeque` costs four words and doubles its buffer; this costs two
//! and keeps no slack. The buffer grows by one slot per event until it holds
//! the limit (in place when the allocator's size class has room), and the
//! event of revision `r` always sits at index `r % len`: the session's own
//! revision says where the oldest is, so no head index is stored.

/// A retained event, without what the session already knows (its id, and its
/// revision, which follows from its position). Kept to 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct RetainedEvent {
    pub seq: u64,
    pub unix_nanos: i64,
    pub kind: crate::machine::EventKind,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(super) struct History {
    events: Box<[RetainedEvent]>,
}

impl History {
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Retains `event`, whose revision is `revision` (one above the newest
    /// retained, if any), dropping the oldest beyond `limit`.
    pub fn push(&mut self, revision: u64, event: RetainedEvent, limit: usize) {
        let len = self.events.len();
        if limit == 0 {
            return;
        }
        if len >= limit {
            self.events[ring_index(revision, len)] = event;
            return;
        }
        let mut events = Vec::from(std::mem::take(&mut self.events));
        // Oldest first (the oldest, revision - len, sits at revision % len),
        // append, then put each event at its slot for the new length.
        if len > 0 {
            events.rotate_left(ring_index(revision, len));
        }
        events.reserve_exact(1);
        events.push(event);
        let len = events.len();
        events.rotate_right(ring_index(revision + 1, len));
        self.events = events.into_boxed_slice();
    }

    /// The newest retained event, given its revision: O(1), for the call
    /// path (`Session::live_since`).
    pub fn newest(&self, newest_revision: u64) -> Option<&RetainedEvent> {
        let len = self.events.len();
        (len > 0).then(|| &self.events[ring_index(newest_revision, len)])
    }

    /// The retained events oldest first, given the newest one's revision.
    pub fn oldest_first(&self, newest_revision: u64) -> impl Iterator<Item = &RetainedEvent> {
        let len = self.events.len();
        let start = if len == 0 {
            0
        } else {
            ring_index(newest_revision + 1, len)
        };
        let (newer, older) = self.events.split_at(start);
        older.iter().chain(newer)
    }
}

fn ring_index(revision: u64, len: usize) -> usize {
    // `len` is at most the history limit, far below u64::MAX, and the
    // remainder is below `len`: neither conversion can fail.
    let len64 = u64::try_from(len).unwrap_or(u64::MAX);
    usize::try_from(revision % len64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;
    use crate::machine::{EventKind, TeardownReason};

    fn event(revision: u64) -> RetainedEvent {
        RetainedEvent {
            seq: revision * 10,
            unix_nanos: i64::try_from(revision).unwrap_or(i64::MAX),
            kind: EventKind::Terminated {
                reason: TeardownReason::Shutdown,
            },
        }
    }

    proptest! {
        /// Against a `VecDeque` that keeps the last `limit`: the same events,
        /// in the same order, after any number of pushes from any starting
        /// revision (a session restored from a store starts at its stored
        /// revision with nothing retained), and never a spare slot.
        #[test]
        fn keeps_the_last_limit_events_oldest_first(
            limit in 0usize..9,
            first_revision in 1u64..1_000,
            pushes in 0usize..40,
        ) {
            let mut history = History::default();
            let mut model = VecDeque::new();
            for revision in first_revision..first_revision + pushes as u64 {
                history.push(revision, event(revision), limit);
                if limit > 0 {
                    if model.len() == limit {
                        model.pop_front();
                    }
                    model.push_back(event(revision));
                }
                let newest = revision;
                let got: Vec<_> = history.oldest_first(newest).copied().collect();
                let want: Vec<_> = model.iter().copied().collect();
                prop_assert_eq!(got, want);
                prop_assert_eq!(history.len(), model.len());
            }
        }
    }

    #[test]
    fn an_empty_history_yields_nothing() {
        let history = History::default();
        assert_eq!(history.oldest_first(7).count(), 0);
        assert_eq!(history.oldest_first(0).count(), 0);
    }
}
