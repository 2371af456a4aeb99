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
    collections::{BTreeMap, HashMap},
    ops::Bound,
    sync::{Arc, PoisonError},
};

use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use tokio::sync::{broadcast, watch};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::{
    error::CoordError,
    events::{EventLog, OnDrop, Scope, SharedEvent, Subscription},
    ids::{SessionId, SessionScope},
    machine::Phase,
    nats::entry::{self, Entry},
    session::{Millis, SessionSnapshot},
    stats::PhaseCounts,
    sync::Mutex,
};

/// What a replica knows of one session: its latest stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    pub phase: Phase,
    pub revision: u64,
    pub responses_started: u64,
    /// Unix milliseconds (see the entry's `since_unix_ms`).
    pub since: Millis,
}

impl Known {
    fn snapshot(&self, id: &SessionId) -> SessionSnapshot {
        SessionSnapshot {
            session_id: id.clone(),
            phase: self.phase,
            revision: self.revision,
            responses_started: self.responses_started,
        }
    }
}

/// One message of the bucket's stream, as the mirror needs it.
pub enum Change {
    Stored(Entry),
    /// A delete or purge marker: the session was forgotten.
    Removed,
}

/// The mirror's state, without the fan-out (built alone at boot).
#[derive(Default)]
pub struct MirrorState {
    sessions: BTreeMap<SessionId, Known>,
    watchers: HashMap<SessionId, broadcast::Sender<SharedEvent>>,
    /// The last stream sequence applied.
    stream_seq: u64,
    counts: PhaseCounts,
}

/// What applying one message produced.
struct Applied {
    events: Vec<SharedEvent>,
    /// Events of this session were lost before this replica saw them.
    gap: bool,
}

impl MirrorState {
    pub fn stream_seq(&self) -> u64 {
        self.stream_seq
    }

    fn count(&mut self, phase: Phase, delta: i64) {
        let slot = match phase {
            Phase::Idle => &mut self.counts.idle,
            Phase::Active(_) => &mut self.counts.active,
            Phase::Terminated => &mut self.counts.terminated,
        };
        *slot = slot.saturating_add_signed(delta);
    }

    /// Applies one message; `None` if it was already applied.
    fn apply(&mut self, stream_seq: u64, id: SessionId, change: Change) -> Option<Applied> {
        if stream_seq <= self.stream_seq {
            return None;
        }
        self.stream_seq = stream_seq;
        let entry = match change {
            Change::Removed => {
                if let Some(old) = self.sessions.remove(&id) {
                    self.count(old.phase, -1);
                }
                return Some(Applied {
                    events: Vec::new(),
                    gap: false,
                });
            }
            Change::Stored(entry) => entry,
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
        let known = Known {
            phase: entry.persisted.phase,
            revision,
            responses_started: entry.persisted.responses_started,
            since: entry.persisted.since,
        };
        if let Some(old) = self.sessions.insert(id, known) {
            self.count(old.phase, -1);
        }
        self.count(known.phase, 1);
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
    pub fn apply(&self, stream_seq: u64, id: SessionId, change: Change) {
        let mut state = self.lock();
        let Some(applied) = state.apply(stream_seq, id.clone(), change) else {
            return;
        };
        if applied.gap {
            tracing::warn!(session_id = %id, stream_seq, "events left the stream before this replica read them; ending open watches");
            self.log.break_watches();
            state.watchers.clear();
        }
        self.log.publish(state.watchers.get(&id), &applied.events);
        self.log.advance(entry::last_seq_of_write(stream_seq));
        drop(state);
        self.progress.send_replace(stream_seq);
    }

    /// A message that is not a session (the lease): only progress.
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
            sessions.push(known.snapshot(id));
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
        let state = self.lock();
        state
            .sessions
            .iter()
            .filter(|(_, known)| {
                let ttl = match known.phase {
                    Phase::Terminated => tombstone,
                    Phase::Idle | Phase::Active(_) => idle,
                };
                now > known.since.saturating_add(ttl)
            })
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect()
    }

    /// Live events of one session, from now; `OnDrop` releases the channel.
    pub fn subscribe_session(
        self: &Arc<Self>,
        id: &SessionId,
    ) -> (broadcast::Receiver<SharedEvent>, OnDrop) {
        let mut state = self.lock();
        let live = state
            .watchers
            .entry(id.clone())
            .or_insert_with(|| broadcast::channel(self.session_watch_buffer).0)
            .subscribe();
        drop(state);
        let mirror = Arc::clone(self);
        let released = id.clone();
        let release = OnDrop::new(move || {
            let mut state = mirror.lock();
            if state
                .watchers
                .get(&released)
                .is_some_and(|tx| tx.receiver_count() == 0)
            {
                state.watchers.remove(&released);
            }
        });
        (live, release)
    }

    /// A session watch: `backlog` (from the bucket) then live events beyond
    /// both `scope` and the backlog (see `Scope::after_backlog`).
    pub(crate) fn session_subscription(
        &self,
        backlog: std::collections::VecDeque<SharedEvent>,
        live: broadcast::Receiver<SharedEvent>,
        release: OnDrop,
        scope: Scope,
        terminated: bool,
    ) -> Subscription {
        let subscription =
            Subscription::new(scope, backlog, live, Arc::clone(&self.log), Some(release));
        if terminated {
            subscription.finish_after_backlog()
        } else {
            subscription
        }
    }

    pub fn watch_all(
        &self,
        scope: &SessionScope,
        after_seq: Option<u64>,
    ) -> Result<Subscription, CoordError> {
        self.log.subscribe_all_within(scope, after_seq)
    }
}

/// Decodes one stream message into (stream seq, session, change); `None`
/// for a message that is not a session's (the lease) or cannot be read.
fn parse(
    message: &jetstream::Message,
    subject_prefix: &str,
) -> Result<(u64, Option<(SessionId, Change)>), String> {
    let info = message.info().map_err(|e| e.to_string())?;
    let change = parse_parts(
        info.stream_sequence,
        message.subject.as_str(),
        message.headers.as_ref(),
        &message.payload,
        subject_prefix,
    );
    Ok((info.stream_sequence, change))
}

/// As [`parse`], for a message read by sequence from the stream.
fn parse_parts(
    stream_seq: u64,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    subject_prefix: &str,
) -> Option<(SessionId, Change)> {
    let id = subject
        .strip_prefix(subject_prefix)
        .and_then(entry::session_of_key)?;
    let operation = headers
        .and_then(|headers| headers.get("KV-Operation"))
        .map(|value| value.as_str().to_owned());
    if matches!(operation.as_deref(), Some("DEL" | "PURGE")) {
        return Some((id, Change::Removed));
    }
    match entry::decode(payload) {
        Ok(entry) => Some((id, Change::Stored(entry))),
        Err(error) => {
            tracing::error!(session_id = %id, stream_seq, %error, "unreadable session entry skipped");
            None
        }
    }
}

/// Reads the stream message by message from the stream leader, for as long
/// as `budget` allows or until caught up. Creating a consumer needs the
/// JetStream meta leader, which a lost NATS node can take seconds to
/// replace; reading by sequence needs only the stream leader, so the mirror
/// keeps up (and this replica's watchers keep receiving) meanwhile.
async fn read_by_sequence(
    stream: &jetstream::stream::Stream,
    mirror: &Mirror,
    subject_prefix: &str,
    budget: std::time::Duration,
) -> Result<(), String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let deadline = tokio::time::Instant::now() + budget;
    while tokio::time::Instant::now() < deadline {
        let next = mirror.stream_seq() + 1;
        match stream.get_raw_message(next).await {
            Ok(message) => {
                match parse_parts(
                    message.sequence,
                    message.subject.as_str(),
                    Some(&message.headers),
                    &message.payload,
                    subject_prefix,
                ) {
                    Some((id, change)) => mirror.apply(message.sequence, id, change),
                    None => mirror.skip(message.sequence),
                }
            }
            // The end, or a hole: a message dropped from the stream (purge,
            // history limit) or one a newly elected stream leader has not
            // applied yet, which look alike here. Only the consumer can tell
            // them apart (see `skipped`), so stop and leave it to that.
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(()),
            Err(error) => return Err(format!("reading stream sequence {next}: {error}")),
        }
    }
    Ok(())
}

/// Builds the mirror at boot: the latest entry of every key, up to the
/// stream's last sequence when we started.
pub async fn load(
    stream: &jetstream::stream::Stream,
    subject_prefix: &str,
) -> Result<MirrorState, String> {
    let info = stream.get_info().await.map_err(|e| e.to_string())?;
    let mut state = MirrorState::default();
    let last = info.state.last_sequence;
    if info.state.messages == 0 {
        state.stream_seq = last;
        return Ok(state);
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: format!("{subject_prefix}>"),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| e.to_string())?;
        let (stream_seq, change) = parse(&message, subject_prefix)?;
        let pending = message.info().map(|i| i.pending).unwrap_or(0);
        match change {
            Some((id, change)) => {
                state.apply(stream_seq, id, change);
            }
            None => state.stream_seq = state.stream_seq.max(stream_seq),
        }
        if pending == 0 || stream_seq >= last {
            break;
        }
    }
    state.stream_seq = state.stream_seq.max(last);
    Ok(state)
}

/// Follows the stream from where the mirror is until `stop`: its own
/// reconnect loop (a fresh ordered consumer from the next sequence after
/// any error), rather than trusting a client-side watch to resume.
pub async fn follow(
    stream: jetstream::stream::Stream,
    mirror: Arc<Mirror>,
    subject_prefix: String,
    stop: CancellationToken,
) {
    let mut backoff = std::time::Duration::from_millis(50);
    loop {
        let start = mirror.stream_seq() + 1;
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            ended = follow_once(&stream, &mirror, &subject_prefix, start, &mut backoff) => ended,
        };
        tracing::warn!(error = %ended, resume_from = mirror.stream_seq() + 1, "bucket follower restarting");
        tokio::select! {
            () = stop.cancelled() => return,
            read = read_by_sequence(&stream, &mirror, &subject_prefix, backoff.max(STALL_CHECK)) => {
                if let Err(error) = read {
                    tracing::debug!(%error, "reading the bucket by sequence");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }
        backoff = (backoff * 2).min(MAX_RESTART_DELAY);
    }
}

async fn follow_once(
    stream: &jetstream::stream::Stream,
    mirror: &Mirror,
    subject_prefix: &str,
    start: u64,
    backoff: &mut std::time::Duration,
) -> String {
    let consumer = match stream
        .create_consumer(OrderedConfig {
            filter_subject: format!("{subject_prefix}>"),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ..Default::default()
        })
        .await
    {
        Ok(consumer) => consumer,
        Err(error) => return error.to_string(),
    };
    let mut messages = match consumer.messages().await {
        Ok(messages) => messages,
        Err(error) => return error.to_string(),
    };
    loop {
        let message = match tokio::time::timeout(STALL_CHECK, messages.next()).await {
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(error))) => return error.to_string(),
            Ok(None) => return "the consumer's message stream ended".to_owned(),
            Err(_quiet) => match stalled(stream, mirror).await {
                Ok(false) => continue,
                Ok(true) => {
                    return "the consumer stopped delivering; the stream has moved on".to_owned()
                }
                Err(error) => return error,
            },
        };
        // Every message of the stream matches the filter, so a hole in the
        // delivered sequence is either messages the stream dropped (a purge,
        // the per-key history limit) or messages this consumer skipped (seen
        // right after a failover, reading a stream replica still catching
        // up). Skipped ones would be a gap: start over from the hole.
        let delivered = message.info().map(|info| info.stream_sequence).unwrap_or(0);
        let applied = mirror.stream_seq();
        if delivered > applied + 1 {
            match skipped(stream, applied + 1, delivered).await {
                Ok(None) => {}
                Ok(Some(missing)) => {
                    return format!(
                        "the consumer skipped stream sequence {missing}, which the stream holds"
                    )
                }
                Err(error) => return error,
            }
        }
        match parse(&message, subject_prefix) {
            Ok((stream_seq, Some((id, change)))) => mirror.apply(stream_seq, id, change),
            Ok((stream_seq, None)) => mirror.skip(stream_seq),
            Err(error) => return error,
        }
        *backoff = std::time::Duration::from_millis(50);
    }
}

/// Sequences of a hole looked up before it is taken as dropped by the
/// stream: its first and last few (a skip is a run at the hole's start).
const HOLE_PROBES: u64 = 4;

/// The first sequence in `from..to` that the stream still holds, probing at
/// most `2 * HOLE_PROBES` of them.
async fn skipped(
    stream: &jetstream::stream::Stream,
    from: u64,
    to: u64,
) -> Result<Option<u64>, String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let probes = (from..to)
        .take(HOLE_PROBES as usize)
        .chain(to.saturating_sub(HOLE_PROBES).max(from)..to)
        .collect::<std::collections::BTreeSet<_>>();
    for sequence in probes {
        match stream.get_raw_message(sequence).await {
            Ok(_) => return Ok(Some(sequence)),
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {}
            Err(error) => return Err(format!("checking stream sequence {sequence}: {error}")),
        }
    }
    Ok(None)
}

/// The longest pause between follower restarts. Short: while the follower
/// is down this replica's watchers see nothing, and a session written more
/// than the bucket's per-key history in the meantime leaves a gap.
const MAX_RESTART_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// How long the follower waits for a message before it asks whether the
/// stream is really quiet. The client's ordered consumer notices a dead
/// server only after two missed heartbeats (tens of seconds); a follower
/// that stalls that long leaves this replica's watchers and listings behind.
const STALL_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the stream holds messages the mirror has not seen and the
/// consumer is not delivering them (checked twice, so a message merely in
/// flight is not mistaken for a stall).
async fn stalled(stream: &jetstream::stream::Stream, mirror: &Mirror) -> Result<bool, String> {
    let last = stream
        .get_info()
        .await
        .map_err(|e| format!("stream info: {e}"))?
        .state
        .last_sequence;
    if mirror.stream_seq() >= last {
        return Ok(false);
    }
    tokio::time::sleep(STALL_CHECK / 2).await;
    Ok(mirror.stream_seq() < last)
}
