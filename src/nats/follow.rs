//! Reading the bucket's stream into the mirror: the load at startup and the
//! follower that applies every later message (one ordered consumer,
//! restarted on a break or a stall, probing holes in the sequence).

use std::sync::Arc;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::{
    clock::{last_activity, stamp_millis, StreamClock},
    entry,
    mirror::{Change, Mirror, MirrorState},
    observed::NatsStats,
};
use crate::ids::SessionId;

/// Decodes one stream message into (stream seq, session, change); `None`
/// for a message that is not a session's (the lease) or cannot be read.
/// Every message's stamp advances `clock`.
fn parse(
    message: &jetstream::Message,
    subject_prefix: &str,
    clock: &StreamClock,
) -> Result<(u64, Option<(SessionId, Change)>), String> {
    let info = message.info().map_err(|e| e.to_string())?;
    let stamp = stamp_millis(info.published.unix_timestamp_nanos());
    clock.observe(stamp);
    let change = parse_parts(
        info.stream_sequence,
        message.subject.as_str(),
        message.headers.as_ref(),
        &message.payload,
        stamp,
        subject_prefix,
    );
    Ok((info.stream_sequence, change))
}

/// As [`parse`], for a message read by sequence from the stream. `stamp`
/// (the stream's, Unix ms) is the session's last activity.
fn parse_parts(
    stream_seq: u64,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    stamp: u64,
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
        Ok(mut entry) => {
            entry.persisted.since = last_activity(entry.persisted.since, stamp);
            Some((id, Change::Stored(entry)))
        }
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
    clock: &StreamClock,
    subject_prefix: &str,
    budget: std::time::Duration,
) -> Result<(), String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let deadline = tokio::time::Instant::now() + budget;
    while tokio::time::Instant::now() < deadline {
        let next = mirror.stream_seq() + 1;
        match stream.get_raw_message(next).await {
            Ok(message) => {
                let stamp = stamp_millis(message.time.unix_timestamp_nanos());
                clock.observe(stamp);
                match parse_parts(
                    message.sequence,
                    message.subject.as_str(),
                    Some(&message.headers),
                    &message.payload,
                    stamp,
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
    clock: &StreamClock,
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
        let (stream_seq, change) = parse(&message, subject_prefix, clock)?;
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
    clock: Arc<StreamClock>,
    subject_prefix: String,
    stop: CancellationToken,
    stats: Arc<NatsStats>,
) {
    let mut backoff = std::time::Duration::from_millis(50);
    loop {
        let start = mirror.stream_seq() + 1;
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            ended = follow_once(&stream, &mirror, &clock, &subject_prefix, start, &mut backoff, &stats) => ended,
        };
        tracing::warn!(error = %ended, resume_from = mirror.stream_seq() + 1, "bucket follower restarting");
        stats.follower_restarted();
        tokio::select! {
            () = stop.cancelled() => return,
            read = read_by_sequence(&stream, &mirror, &clock, &subject_prefix, backoff.max(STALL_CHECK)) => {
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
    clock: &StreamClock,
    subject_prefix: &str,
    start: u64,
    backoff: &mut std::time::Duration,
    stats: &NatsStats,
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
        stats.delivered(&message);
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
        match parse(&message, subject_prefix, clock) {
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
