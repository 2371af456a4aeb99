//! The NATS backend's stored form of a session: one key-value entry per
//! session, holding its durable fields and the events of the transition that
//! wrote it, so state and events are one atomic write and can never disagree.
//!
//! The value is a protobuf message (prost derive): compact, and new fields can
//! be added without breaking replicas that run the previous version during a
//! rolling update. `format` guards against a future incompatible change.
//!
//! Seqs: a transition emits at most [`MAX_EVENTS_PER_TRANSITION`] events and
//! they are stored in one stream message, so event `i` of the message at
//! stream sequence `s` has seq `s * SEQS_PER_WRITE + i`: strictly increasing,
//! the same on every replica, and it maps back to the stream for resume.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use bytes::Bytes;
use prost::Message as _;

use crate::{
    decision::Decision,
    event::{Change, SharedEvent},
    ids::{RequestId, ResponseId, SessionId},
    machine::{
        ActiveResponse, CancelReason, EventKind, Phase, Source, TeardownReason, Terminal,
        MAX_EVENTS_PER_TRANSITION,
    },
    session::{Persisted, StartRecord},
};

/// Seqs reserved per stream message (one transition's events).
pub const SEQS_PER_WRITE: u64 = 4;
const _: () = assert!(MAX_EVENTS_PER_TRANSITION as u64 <= SEQS_PER_WRITE);

/// The only stored format this version reads and writes.
const FORMAT: u32 = 1;

/// A key's revision in the bucket: the stream sequence of the message that
/// last wrote it. One counter for the whole bucket, so it is not the
/// session's own revision (`Persisted::revision`, 1, 2, 3, ... per session,
/// kept inside the entry); compare-and-set expects it, and the cache, the
/// mirror's `Known::stored_at` and a quorum-point confirmation hold it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KvRevision(u64);

impl KvRevision {
    /// Before the key's first message: what a write that creates it expects.
    pub const NONE: Self = Self(0);

    /// The revision a message at `stream_seq` gave its key.
    pub const fn at(stream_seq: u64) -> Self {
        Self(stream_seq)
    }

    /// The stream sequence, as JetStream's requests take it.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// Session keys live under this prefix; the other keys (the expirer's
/// lease, `lease.expirer`, and the quorum points', `quorum.point`) do not.
pub const SESSION_KEY_PREFIX: &str = "s.";

/// The bucket key of a session. Session ids may hold any printable character,
/// KV keys only `[-/_=.a-zA-Z0-9]`, so the id is base64url-encoded.
pub fn key(id: &SessionId) -> String {
    let mut key = String::with_capacity(SESSION_KEY_PREFIX.len() + id.as_str().len() * 4 / 3 + 4);
    key.push_str(SESSION_KEY_PREFIX);
    URL_SAFE_NO_PAD.encode_string(id.as_str(), &mut key);
    key
}

/// The session a bucket key names, if it is a session key.
pub fn session_of_key(key: &str) -> Option<SessionId> {
    let encoded = key.strip_prefix(SESSION_KEY_PREFIX)?;
    let raw = URL_SAFE_NO_PAD.decode(encoded).ok()?;
    SessionId::parse(std::str::from_utf8(&raw).ok()?).ok()
}

pub fn event_seq(stream_seq: u64, index: usize) -> u64 {
    stream_seq.saturating_mul(SEQS_PER_WRITE) + index as u64
}

/// The highest seq a stream message can hold: bookmarks promise up to it.
pub fn last_seq_of_write(stream_seq: u64) -> u64 {
    event_seq(stream_seq, SEQS_PER_WRITE as usize - 1)
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredSession {
    #[prost(uint32, tag = "1")]
    format: u32,
    /// 1 idle, 2 active, 3 terminated.
    #[prost(uint32, tag = "2")]
    phase: u32,
    #[prost(uint64, tag = "3")]
    active_response: u64,
    #[prost(uint32, tag = "4")]
    active_source: u32,
    #[prost(uint64, tag = "5")]
    revision: u64,
    #[prost(uint64, tag = "6")]
    responses_started: u64,
    /// The highest response id this session minted (ids must keep rising).
    #[prost(uint64, tag = "7")]
    last_response: u64,
    /// Unix milliseconds on the writer's view of the stream's clock: last
    /// call while live, termination once terminated. Readers take the
    /// stream's own stamp on the entry instead (`clock`); this one stays for
    /// entries read without it.
    #[prost(uint64, tag = "8")]
    since_unix_ms: u64,
    #[prost(message, repeated, tag = "9")]
    replays: Vec<StoredReplay>,
    /// The events of the transition that wrote this entry; the last has
    /// revision `revision`.
    #[prost(message, repeated, tag = "10")]
    events: Vec<StoredEvent>,
    #[prost(int64, tag = "11")]
    unix_nanos: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredReplay {
    #[prost(string, tag = "1")]
    request_id: String,
    #[prost(uint64, tag = "2")]
    response: u64,
    #[prost(uint64, tag = "3")]
    superseded: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredEvent {
    /// 1 started, 2 cancel_requested, 3 ended, 4 terminated.
    #[prost(uint32, tag = "1")]
    kind: u32,
    #[prost(uint64, tag = "2")]
    response: u64,
    /// Source (started), cancel reason (cancel_requested), ending (ended),
    /// teardown reason (terminated); see the codes below.
    #[prost(uint32, tag = "3")]
    detail: u32,
    /// Who asked for a cancel_requested (a source code); 0 otherwise. An
    /// entry written before this field existed reads 0: unspecified.
    #[prost(uint32, tag = "4")]
    source: u32,
}

/// A decoded entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub persisted: Persisted,
    pub last_response: u64,
    pub events: Vec<EventKind>,
    pub unix_nanos: i64,
}

impl Entry {
    /// The entry a decided call writes: the session's record after it, the
    /// kinds of the events it emitted (none for a touch), its time.
    pub fn written(
        persisted: Persisted,
        last_response: u64,
        decision: &Decision,
        unix_nanos: i64,
    ) -> Self {
        Self {
            persisted,
            last_response,
            events: decision
                .change()
                .map(|change| change.kinds.to_vec())
                .unwrap_or_default(),
            unix_nanos,
        }
    }

    /// What the transition that wrote this entry emitted.
    pub fn change(&self) -> Change {
        Change {
            first_revision: self.first_revision(),
            unix_nanos: self.unix_nanos,
            // `decode` refuses more than a transition emits.
            kinds: self
                .events
                .iter()
                .copied()
                .take(MAX_EVENTS_PER_TRANSITION)
                .collect(),
        }
    }

    /// This entry's events as watchers see them, given the stream sequence
    /// of the message that stored it.
    pub fn lifecycle_events(&self, id: &SessionId, stream_seq: u64) -> Vec<SharedEvent> {
        self.change()
            .events(id, event_seq(stream_seq, 0))
            .into_iter()
            .collect()
    }

    /// Revision of this entry's first event (or one past the revision if it
    /// carries none).
    pub fn first_revision(&self) -> u64 {
        (self.persisted.revision + 1).saturating_sub(self.events.len() as u64)
    }
}

/// Why a stored value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not a stored session: {0}")]
    Malformed(String),
    #[error("stored session format {0} is not one this version reads")]
    Format(u32),
}

fn source_code(source: Source) -> u32 {
    match source {
        Source::Unspecified => 0,
        Source::Client => 1,
        Source::Vad => 2,
    }
}

fn source_of(code: u32) -> Result<Source, DecodeError> {
    Ok(match code {
        0 => Source::Unspecified,
        1 => Source::Client,
        2 => Source::Vad,
        other => return Err(malformed(format!("source {other}"))),
    })
}

fn cancel_code(reason: CancelReason) -> u32 {
    match reason {
        CancelReason::Superseded => 1,
        CancelReason::Requested => 2,
        CancelReason::Shutdown => 3,
        CancelReason::Expired => 4,
    }
}

fn cancel_of(code: u32) -> Result<CancelReason, DecodeError> {
    Ok(match code {
        1 => CancelReason::Superseded,
        2 => CancelReason::Requested,
        3 => CancelReason::Shutdown,
        4 => CancelReason::Expired,
        other => return Err(malformed(format!("cancel reason {other}"))),
    })
}

/// Completed 1, failed 2, cancelled with reason r: 10 + r.
fn ending_code(ending: Terminal) -> u32 {
    match ending {
        Terminal::Completed => 1,
        Terminal::Failed => 2,
        Terminal::Cancelled(reason) => 10 + cancel_code(reason),
    }
}

fn ending_of(code: u32) -> Result<Terminal, DecodeError> {
    Ok(match code {
        1 => Terminal::Completed,
        2 => Terminal::Failed,
        11..=14 => Terminal::Cancelled(cancel_of(code - 10)?),
        other => return Err(malformed(format!("ending {other}"))),
    })
}

fn teardown_code(reason: TeardownReason) -> u32 {
    match reason {
        TeardownReason::Shutdown => 1,
        TeardownReason::Expired => 2,
    }
}

fn teardown_of(code: u32) -> Result<TeardownReason, DecodeError> {
    Ok(match code {
        1 => TeardownReason::Shutdown,
        2 => TeardownReason::Expired,
        other => return Err(malformed(format!("teardown reason {other}"))),
    })
}

fn malformed(what: impl Into<String>) -> DecodeError {
    DecodeError::Malformed(what.into())
}

fn response(raw: u64) -> Result<ResponseId, DecodeError> {
    ResponseId::new(raw).ok_or_else(|| malformed("response id 0"))
}

fn stored_event(kind: &EventKind) -> StoredEvent {
    let (kind, response, detail, source) = match *kind {
        EventKind::Started { response, source } => (1, response.get(), source_code(source), 0),
        EventKind::CancelRequested {
            response,
            reason,
            source,
        } => (2, response.get(), cancel_code(reason), source_code(source)),
        EventKind::Ended { response, ending } => (3, response.get(), ending_code(ending), 0),
        EventKind::Terminated { reason } => (4, 0, teardown_code(reason), 0),
    };
    StoredEvent {
        kind,
        response,
        detail,
        source,
    }
}

fn event_kind(stored: &StoredEvent) -> Result<EventKind, DecodeError> {
    Ok(match stored.kind {
        1 => EventKind::Started {
            response: response(stored.response)?,
            source: source_of(stored.detail)?,
        },
        2 => EventKind::CancelRequested {
            response: response(stored.response)?,
            reason: cancel_of(stored.detail)?,
            source: source_of(stored.source)?,
        },
        3 => EventKind::Ended {
            response: response(stored.response)?,
            ending: ending_of(stored.detail)?,
        },
        4 => EventKind::Terminated {
            reason: teardown_of(stored.detail)?,
        },
        other => return Err(malformed(format!("event kind {other}"))),
    })
}

impl Entry {
    /// The stored value: the session after a transition, and the events
    /// that transition emitted.
    pub fn encode(&self) -> Bytes {
        let Self {
            persisted,
            last_response,
            events,
            unix_nanos,
        } = self;
        let (phase, active_response, active_source) = match persisted.phase {
            Phase::Idle => (1, 0, 0),
            Phase::Active(active) => (2, active.id.get(), source_code(active.source)),
            Phase::Terminated => (3, 0, 0),
        };
        let stored = StoredSession {
            format: FORMAT,
            phase,
            active_response,
            active_source,
            revision: persisted.revision,
            responses_started: persisted.responses_started,
            last_response: *last_response,
            since_unix_ms: persisted.since,
            replays: persisted
                .replays
                .iter()
                .map(|(request_id, record)| StoredReplay {
                    request_id: request_id.as_str().to_owned(),
                    response: record.response.get(),
                    superseded: record.superseded.map_or(0, ResponseId::get),
                })
                .collect(),
            events: events.iter().map(stored_event).collect(),
            unix_nanos: *unix_nanos,
        };
        stored.encode_to_vec().into()
    }
}

/// Reads a stored value, refusing anything that is not a consistent session.
pub fn decode(value: &[u8]) -> Result<Entry, DecodeError> {
    let stored = StoredSession::decode(value).map_err(|e| malformed(e.to_string()))?;
    if stored.format != FORMAT {
        return Err(DecodeError::Format(stored.format));
    }
    let phase = match stored.phase {
        1 => Phase::Idle,
        2 => Phase::Active(ActiveResponse {
            id: response(stored.active_response)?,
            source: source_of(stored.active_source)?,
        }),
        3 => Phase::Terminated,
        other => return Err(malformed(format!("phase {other}"))),
    };
    if stored.events.len() > MAX_EVENTS_PER_TRANSITION
        || (stored.events.len() as u64) > stored.revision
    {
        return Err(malformed(
            "more events than the transition or revision allows",
        ));
    }
    let replays = stored
        .replays
        .iter()
        .map(|replay| {
            let request_id = RequestId::parse_optional(&replay.request_id)
                .ok()
                .flatten()
                .ok_or_else(|| malformed("request id"))?;
            let record = StartRecord {
                response: response(replay.response)?,
                superseded: ResponseId::new(replay.superseded),
            };
            Ok((request_id, record))
        })
        .collect::<Result<Vec<_>, DecodeError>>()?;
    let events = stored
        .events
        .iter()
        .map(event_kind)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Entry {
        persisted: Persisted {
            phase,
            revision: stored.revision,
            responses_started: stored.responses_started,
            replays,
            since: stored.since_unix_ms,
        },
        last_response: stored.last_response,
        events,
        unix_nanos: stored.unix_nanos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(
        persisted: &Persisted,
        last_response: u64,
        events: &[EventKind],
        unix_nanos: i64,
    ) -> Bytes {
        Entry {
            persisted: persisted.clone(),
            last_response,
            events: events.to_vec(),
            unix_nanos,
        }
        .encode()
    }

    fn sid(raw: &str) -> SessionId {
        SessionId::parse(raw).expect("valid id")
    }

    #[test]
    fn keys_round_trip_any_valid_id() {
        for raw in ["a", "conv-1/user:7", "ü spaces and ✓", &"x".repeat(256)] {
            let id = sid(raw);
            let key = key(&id);
            assert!(key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_/=.".contains(c)));
            assert_eq!(session_of_key(&key), Some(id));
        }
        assert_eq!(session_of_key("lease.expirer"), None);
        assert_eq!(session_of_key("s.!!"), None);
    }

    #[test]
    fn entries_round_trip() {
        let r = |n| ResponseId::new(n).expect("nonzero");
        let persisted = Persisted {
            phase: Phase::Active(ActiveResponse {
                id: r(9),
                source: Source::Vad,
            }),
            revision: 7,
            responses_started: 3,
            replays: vec![(
                RequestId::parse_optional("req-1")
                    .expect("ok")
                    .expect("some"),
                StartRecord {
                    response: r(9),
                    superseded: Some(r(5)),
                },
            )],
            since: 1_700_000_000_000,
        };
        let events = [
            EventKind::CancelRequested {
                response: r(5),
                reason: CancelReason::Superseded,
                source: Source::Vad,
            },
            EventKind::Ended {
                response: r(5),
                ending: Terminal::Cancelled(CancelReason::Superseded),
            },
            EventKind::Started {
                response: r(9),
                source: Source::Vad,
            },
        ];
        let bytes = encode(&persisted, 9, &events, 42);
        let entry = decode(&bytes).expect("decodes");
        assert_eq!(entry.persisted, persisted);
        assert_eq!(entry.events, events);
        assert_eq!(entry.last_response, 9);
        assert_eq!(entry.first_revision(), 5);
        let lifecycle = entry.lifecycle_events(&sid("a"), 10);
        let seqs: Vec<_> = lifecycle.iter().map(|e| (e.revision, e.seq)).collect();
        assert_eq!(seqs, [(5, 40), (6, 41), (7, 42)]);
        // Every ending and teardown code survives.
        for ending in [
            Terminal::Completed,
            Terminal::Failed,
            Terminal::Cancelled(CancelReason::Expired),
        ] {
            let kind = EventKind::Ended {
                response: r(1),
                ending,
            };
            assert_eq!(event_kind(&stored_event(&kind)), Ok(kind));
        }
        let kind = EventKind::Terminated {
            reason: TeardownReason::Expired,
        };
        assert_eq!(event_kind(&stored_event(&kind)), Ok(kind));
    }

    /// An entry stored before `cancel_requested` carried its source (no
    /// field 4 on its events) still decodes, the source unspecified: a
    /// rolling update reads what the previous version wrote.
    #[test]
    fn a_cancel_stored_without_its_source_reads_unspecified() {
        /// The previous version's stored event, field for field.
        #[derive(Clone, PartialEq, prost::Message)]
        struct OldStoredEvent {
            #[prost(uint32, tag = "1")]
            kind: u32,
            #[prost(uint64, tag = "2")]
            response: u64,
            #[prost(uint32, tag = "3")]
            detail: u32,
        }
        let old = OldStoredEvent {
            kind: 2,
            response: 5,
            detail: cancel_code(CancelReason::Requested),
        };
        let stored = StoredEvent::decode(&old.encode_to_vec()[..]).expect("decodes");
        assert_eq!(
            event_kind(&stored),
            Ok(EventKind::CancelRequested {
                response: ResponseId::new(5).expect("nonzero"),
                reason: CancelReason::Requested,
                source: Source::Unspecified,
            })
        );
        // And the new field is one an old reader skips: its fields intact.
        let new = stored_event(&EventKind::CancelRequested {
            response: ResponseId::new(5).expect("nonzero"),
            reason: CancelReason::Requested,
            source: Source::Vad,
        });
        let read_by_old = OldStoredEvent::decode(&new.encode_to_vec()[..]).expect("decodes");
        assert_eq!(read_by_old, old);
    }

    #[test]
    fn garbage_is_refused_not_trusted() {
        assert!(decode(b"\xff\xff\xff").is_err());
        let persisted = Persisted {
            phase: Phase::Idle,
            revision: 0,
            responses_started: 0,
            replays: Vec::new(),
            since: 0,
        };
        let terminated = [EventKind::Terminated {
            reason: TeardownReason::Shutdown,
        }];
        // One event but revision 0: inconsistent.
        assert!(decode(&encode(&persisted, 0, &terminated, 0)).is_err());
        let mut bad_format = StoredSession::decode(&encode(&persisted, 0, &[], 0)[..]).expect("ok");
        bad_format.format = 2;
        assert_eq!(
            decode(&bad_format.encode_to_vec()),
            Err(DecodeError::Format(2))
        );
    }
}
