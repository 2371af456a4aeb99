//! Each replica's view of the bucket, and its event fan-out.
//!
//! Every replica follows the bucket's stream with one ordered consumer and
//! applies each stored entry here: the session's latest state (for
//! ListSessions, the session limit, the expirer and the metrics) and the
//! events the entry carries (published to this replica's watchers through
//! the shared event log). Watchers on any replica therefore see every
//! replica's events, with the same revisions and seqs, in stream order.
//!
//! Redeliveries (a consumer recreated after a disconnect) are dropped by
//! stream sequence. A session whose entry arrives with events beyond one it
//! has not seen (its earlier messages left the stream before this replica
//! read them) is a gap this replica cannot fill in order: every open watch
//! on it is ended as fallen behind, so the client resumes explicitly instead
//! of silently missing events.

use std::{
    collections::BTreeMap,
    ops::Bound,
    sync::{Arc, PoisonError},
};

use tokio::sync::watch;

use crate::{
    error::CoordError,
    events::{EventLog, HoldsFeeds, LiveFeed, SessionFeeds, SharedEvent, Subscription},
    ids::{SessionId, SessionScope},
    machine::Phase,
    nats::entry::{self, Entry, KvRevision},
    session::{Millis, SessionSnapshot, Ttls},
    stats::PhaseCounts,
    sync::Mutex,
};

/// What a replica knows of one session: its latest stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    pub phase: Phase,
    pub revision: u64,
    pub responses_started: u64,
    /// Last activity, Unix ms: the stream's stamp on the key's last entry
    /// (`clock`).
    pub since: Millis,
    /// The stream sequence of the key's last message (its KV revision, a
    /// touch included): what a quorum-confirmed read compares its read with.
    pub stored_at: KvRevision,
    /// The key's message before `stored_at`, 0 when this mirror did not see
    /// the key hold one (`Mirror::latest_at`).
    pub replaced: KvRevision,
    /// When the session last changed: the time of the last entry with
    /// events this mirror read (a touch changes nothing).
    pub changed_unix_nanos: Option<i64>,
}

impl Known {
    /// The key's message that was latest at stream sequence `point`, if it
    /// is one of the two this record remembers.
    fn latest_at(&self, point: u64) -> Option<KvRevision> {
        if self.stored_at.get() <= point {
            Some(self.stored_at)
        } else if self.replaced != KvRevision::NONE && self.replaced.get() <= point {
            Some(self.replaced)
        } else {
            None
        }
    }

    /// The session as GetState and every reply report it: without the time
    /// of its last change, which only a listing promises (a reply decided
    /// from the bucket does not know it, and GetState must agree with it).
    pub(super) fn snapshot(&self, id: &SessionId) -> SessionSnapshot {
        SessionSnapshot {
            session_id: id.clone(),
            phase: self.phase,
            revision: self.revision,
            responses_started: self.responses_started,
            changed_unix_nanos: None,
        }
    }

    /// [`Known::snapshot`] with the time of the last change, for a listing
    /// (as the memory backend's `Session::listed`).
    pub(super) fn listed(&self, id: &SessionId) -> SessionSnapshot {
        SessionSnapshot {
            changed_unix_nanos: self.changed_unix_nanos,
            ..self.snapshot(id)
        }
    }
}

/// One message of the bucket's stream, as the mirror needs it.
pub enum KeyUpdate {
    Stored(Entry),
    /// A delete or purge marker: the session was forgotten.
    Removed,
}

/// The mirror's state, without the fan-out (built alone at boot).
#[derive(Default)]
pub struct MirrorState {
    sessions: BTreeMap<SessionId, Known>,
    /// Feeds of the sessions watched through this replica.
    watchers: SessionFeeds,
    /// The last stream sequence applied.
    pub(super) stream_seq: u64,
    counts: PhaseCounts,
}

/// What applying one message produced.
pub(super) struct Applied {
    events: Vec<SharedEvent>,
    /// Events of this session were lost before this replica saw them.
    gap: bool,
}

impl MirrorState {
    pub fn stream_seq(&self) -> u64 {
        self.stream_seq
    }

    /// Applies one message; `None` if it was already applied.
    pub(super) fn apply(
        &mut self,
        stream_seq: u64,
        id: SessionId,
        change: KeyUpdate,
    ) -> Option<Applied> {
        if stream_seq <= self.stream_seq {
            return None;
        }
        self.stream_seq = stream_seq;
        let entry = match change {
            KeyUpdate::Removed => {
                let old = self.sessions.remove(&id);
                self.counts.moved(old.map(|old| old.phase), None);
                return Some(Applied {
                    events: Vec::new(),
                    gap: false,
                });
            }
            KeyUpdate::Stored(entry) => entry,
        };
        let known_revision = self.sessions.get(&id).map_or(0, |k| k.revision);
        let revision = entry.persisted.revision;
        // A session that starts over (forgotten, then created again) begins
        // again at revision 1.
        let restarted = entry.first_revision() == 1 && !entry.events.is_empty();
        let seen_through = if restarted { 0 } else { known_revision };
        let gap = !entry.events.is_empty() && entry.first_revision() > seen_through + 1;
        let events = entry
            .lifecycle_events(&id, stream_seq)
            .into_iter()
            .filter(|event| event.revision > seen_through)
            .collect();
        let old = self.sessions.get(&id);
        let known = Known {
            phase: entry.persisted.phase,
            revision,
            responses_started: entry.persisted.responses_started,
            since: entry.persisted.since,
            stored_at: KvRevision::at(stream_seq),
            replaced: old.map_or(KvRevision::NONE, |old| old.stored_at),
            changed_unix_nanos: if entry.events.is_empty() {
                old.and_then(|old| old.changed_unix_nanos)
            } else {
                Some(entry.unix_nanos)
            },
        };
        let old = self.sessions.insert(id, known);
        self.counts
            .moved(old.map(|old| old.phase), Some(known.phase));
        Some(Applied { events, gap })
    }
}

/// The live mirror: state plus fan-out and progress.
pub struct Mirror {
    state: Mutex<MirrorState>,
    log: Arc<EventLog>,
    /// The last stream sequence applied, for calls that must see their own
    /// writes (ListSessions waits on it).
    progress: watch::Sender<u64>,
    session_watch_buffer: usize,
}

impl Mirror {
    pub fn new(state: MirrorState, log: Arc<EventLog>, session_watch_buffer: usize) -> Self {
        let (progress, _) = watch::channel(state.stream_seq);
        Self {
            state: Mutex::new(state),
            log,
            progress,
            session_watch_buffer: session_watch_buffer.max(1),
        }
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, MirrorState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one message and publishes its events.
    pub fn apply(&self, stream_seq: u64, id: SessionId, change: KeyUpdate) {
        let mut state = self.lock();
        let Some(applied) = state.apply(stream_seq, id.clone(), change) else {
            return;
        };
        if applied.gap {
            tracing::warn!(session_id = %id, stream_seq, "events left the stream before this replica read them; ending open watches");
            self.log.break_watches();
            state.watchers.close_all();
        }
        self.log.publish(state.watchers.get(&id), &applied.events);
        self.log.advance(entry::last_seq_of_write(stream_seq));
        drop(state);
        self.progress.send_replace(stream_seq);
    }

    /// A message that is not a session's (the expirer's lease, a quorum
    /// point): only progress.
    pub fn skip(&self, stream_seq: u64) {
        let mut state = self.lock();
        if stream_seq <= state.stream_seq {
            return;
        }
        state.stream_seq = stream_seq;
        self.log.advance(entry::last_seq_of_write(stream_seq));
        drop(state);
        self.progress.send_replace(stream_seq);
    }

    pub fn stream_seq(&self) -> u64 {
        *self.progress.borrow()
    }

    /// Waits until the mirror has applied `stream_seq`.
    pub async fn caught_up_to(&self, stream_seq: u64) {
        let mut progress = self.progress.subscribe();
        // The sender lives as long as `self`, so this only ends when reached.
        let _ = progress.wait_for(|&seen| seen >= stream_seq).await;
    }

    pub fn session_count(&self) -> usize {
        self.lock().sessions.len()
    }

    /// What this mirror knows of one session now; `None` if absent.
    pub fn known(&self, id: &SessionId) -> Option<Known> {
        self.lock().sessions.get(id).copied()
    }

    /// The key's latest message at stream sequence `point` (`Some(None)`:
    /// absent), where this mirror, having applied `point`, can tell: the
    /// latest now, or the one it replaced if that came at or before the
    /// point. `None` when the key moved more than once since.
    pub fn latest_at(&self, id: &SessionId, point: u64) -> Option<Option<KvRevision>> {
        match self.lock().sessions.get(id) {
            Some(known) => known.latest_at(point).map(Some),
            None => Some(None),
        }
    }

    pub fn counts(&self) -> PhaseCounts {
        self.lock().counts
    }

    /// A page in id order after `after`, with the seq it reflects.
    pub fn list(
        &self,
        scope: &SessionScope,
        page_size: usize,
        after: Option<&SessionId>,
    ) -> (Vec<SessionSnapshot>, Option<SessionId>, u64) {
        let state = self.lock();
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut sessions = Vec::with_capacity(page_size.min(1024));
        let mut more = false;
        for (id, known) in state
            .sessions
            .range::<SessionId, _>((lower, Bound::Unbounded))
        {
            if !scope.contains(id) {
                continue;
            }
            if sessions.len() == page_size {
                more = true;
                break;
            }
            sessions.push(known.listed(id));
        }
        let next = more
            .then(|| {
                sessions
                    .last()
                    .map(|s: &SessionSnapshot| s.session_id.clone())
            })
            .flatten();
        (sessions, next, entry::last_seq_of_write(state.stream_seq))
    }

    /// Sessions whose deadline has passed at `now`: idle for `idle` (live)
    /// or terminated for `tombstone`. At most `limit`.
    pub fn due(
        &self,
        now: Millis,
        idle: Millis,
        tombstone: Millis,
        limit: usize,
    ) -> Vec<SessionId> {
        let ttls = Ttls { idle, tombstone };
        let state = self.lock();
        state
            .sessions
            .iter()
            .filter(|(_, known)| now > ttls.deadline(known.phase, known.since))
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect()
    }

    /// Live events of one session, from now, until the watch made from
    /// them ends (`LiveFeed::into_subscription`, with [`Mirror::log`]).
    pub(crate) fn subscribe_session(self: &Arc<Self>, id: &SessionId) -> LiveFeed {
        self.lock()
            .watchers
            .subscribe(self, id, self.session_watch_buffer)
    }

    /// The event log this mirror publishes to.
    pub(crate) fn log(&self) -> &Arc<EventLog> {
        &self.log
    }

    pub fn watch_all(
        &self,
        scope: &SessionScope,
        after_seq: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        self.log.subscribe_all_within(scope, after_seq)
    }
}

impl HoldsFeeds for Mirror {
    fn with_feeds(&self, _: &SessionId, f: impl FnOnce(&mut SessionFeeds)) {
        f(&mut self.lock().watchers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_message_at_a_point_is_told_only_where_it_is_remembered() {
        let known = |replaced, stored_at| Known {
            phase: Phase::Idle,
            revision: 1,
            responses_started: 0,
            since: 0,
            stored_at: KvRevision::at(stored_at),
            replaced: KvRevision::at(replaced),
            changed_unix_nanos: None,
        };
        // Written at 7 after 3: up to 6 the latest was 3, from 7 on it is 7.
        assert_eq!(known(3, 7).latest_at(9), Some(KvRevision::at(7)));
        assert_eq!(known(3, 7).latest_at(7), Some(KvRevision::at(7)));
        assert_eq!(known(3, 7).latest_at(6), Some(KvRevision::at(3)));
        assert_eq!(known(3, 7).latest_at(3), Some(KvRevision::at(3)));
        // Before 3 it moved at least twice, or was absent: not known here.
        assert_eq!(known(3, 7).latest_at(2), None);
        // First seen at 7 (created, or read at boot): nothing known before.
        assert_eq!(known(0, 7).latest_at(6), None);
    }
}
