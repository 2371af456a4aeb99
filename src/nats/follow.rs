//! Reading the bucket's stream into the mirror: the load at startup and the
//! follower that applies every later message (one ordered consumer,
//! restarted on a break, a stall or a turnover, probing holes in the
//! sequence, and reading by sequence whenever a call finds the mirror
//! behind).

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use tokio::sync::Notify;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::{
    clock::{last_activity, stamp_millis, StreamClock, UnixMillis},
    entry,
    mirror::{KeyUpdate, Mirror, MirrorState},
    observed::NatsStats,
    timings::{
        FIRST_RESTART_DELAY, MAX_RESTART_DELAY, NUDGED_READ_BUDGET, NUDGE_AFTER, STALL_CHECK,
        STALL_INFO_TIMEOUT,
    },
    turnover::Turnovers,
};
use crate::ids::SessionId;

/// Decodes one stream message, whose reply subject the caller parsed into
/// `info` (once: it is the costliest part of a delivery), into the
/// session's change; `None` for a message that is not a session's (the
/// expirer's lease, a quorum point) or cannot be read.
/// Every message's stamp advances `clock`.
fn parse(
    message: &jetstream::Message,
    info: &jetstream::message::Info<'_>,
    subject_prefix: &str,
    clock: &StreamClock,
) -> Option<(SessionId, KeyUpdate)> {
    let stamp = stamp_millis(info.published.unix_timestamp_nanos());
    clock.observe(stamp);
    parse_parts(
        info.stream_sequence,
        message.subject.as_str(),
        message.headers.as_ref(),
        &message.payload,
        stamp,
        subject_prefix,
    )
}

/// A delivered message's reply subject, parsed.
fn info_of(message: &jetstream::Message) -> Result<jetstream::message::Info<'_>, String> {
    message.info().map_err(|e| e.to_string())
}

/// As [`parse`], for a message read by sequence from the stream. `stamp`
/// (the stream's, Unix ms) is the session's last activity.
fn parse_parts(
    stream_seq: u64,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    stamp: UnixMillis,
    subject_prefix: &str,
) -> Option<(SessionId, KeyUpdate)> {
    let id = subject
        .strip_prefix(subject_prefix)
        .and_then(entry::session_of_key)?;
    let operation = headers
        .and_then(|headers| headers.get("KV-Operation"))
        .map(|value| value.as_str().to_owned());
    if matches!(operation.as_deref(), Some("DEL" | "PURGE")) {
        return Some((id, KeyUpdate::Removed));
    }
    match entry::decode(payload) {
        Ok(mut entry) => {
            entry.persisted.since = last_activity(entry.persisted.since, stamp);
            Some((id, KeyUpdate::Stored(entry)))
        }
        Err(error) => {
            tracing::error!(session_id = %id, stream_seq, %error, "unreadable session entry skipped");
            None
        }
    }
}

/// Reads the stream message by message from the stream leader until caught
/// up (`Follower::read_by_sequence` bounds it in time). Each read asks for
/// the first message at or after the next sequence, so a hole (messages a
/// hot key's per-key history limit or a purge dropped) is stepped over in
/// the same request instead of ending the read: the leader applies its log
/// in order, so what it holds after the hole proves the hole is gone for
/// good, and the mirror's per-session revision check turns it into a gap
/// if events were in it.
async fn read_by_sequence(
    stream: &jetstream::stream::Stream,
    mirror: &Mirror,
    clock: &StreamClock,
    subject_prefix: &str,
) -> Result<(), String> {
    loop {
        let next = mirror.stream_seq() + 1;
        match first_at_or_after(stream, subject_prefix, next).await? {
            Some(message) => {
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
            // Nothing at or after `next`: caught up.
            None => return Ok(()),
        }
    }
}

/// The stream's first message at or after `sequence`, from the stream
/// leader; `None` past the end. Every message of the bucket's stream is
/// under `subject_prefix`, so holes (purges, the per-key history limit) are
/// stepped over in the same request.
async fn first_at_or_after(
    stream: &jetstream::stream::Stream,
    subject_prefix: &str,
    sequence: u64,
) -> Result<Option<jetstream::message::StreamMessage>, String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    match stream
        .get_first_raw_message_by_subject(format!("{subject_prefix}>"), sequence)
        .await
    {
        Ok(message) => Ok(Some(message)),
        Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(error) => Err(format!("reading from stream sequence {sequence}: {error}")),
    }
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
        let info = info_of(&message)?;
        let (stream_seq, pending) = (info.stream_sequence, info.pending);
        match parse(&message, &info, subject_prefix, clock) {
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

/// What the follower needs: the stream, the mirror it fills, and the
/// signals that it should catch up now.
pub struct Follower {
    pub stream: jetstream::stream::Stream,
    pub mirror: Arc<Mirror>,
    pub clock: Arc<StreamClock>,
    pub subject_prefix: String,
    pub stats: Arc<NatsStats>,
    /// Turnovers (`turnover`): the consumer may have died with its server
    /// or its leader; it is recreated at once, from where the mirror is.
    pub turnovers: Turnovers,
    /// Notified by a call whose quorum point the mirror has not reached
    /// within `NUDGE_AFTER`: the follower reads what it is missing by
    /// sequence from the stream leader, whatever its consumer is doing.
    pub nudge: Arc<Notify>,
}

impl Follower {
    /// Follows the stream from where the mirror is until `stop`: its own
    /// reconnect loop (a fresh ordered consumer from the next sequence after
    /// any error or turnover), rather than trusting a client-side watch to
    /// resume; nothing delivered is read again.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut backoff = FIRST_RESTART_DELAY;
        loop {
            let start = self.mirror.stream_seq() + 1;
            let ended = tokio::select! {
                () = stop.cancelled() => return,
                ended = self.follow_once(start, &mut backoff) => ended,
            };
            tracing::warn!(error = %ended, resume_from = self.mirror.stream_seq() + 1, "bucket follower restarting");
            self.stats.follower_restarted();
            // Catch up by sequence for at most the pause before the next
            // consumer: a new consumer, not these one-message reads, keeps
            // up with a busy bucket, so its creation waits no longer.
            let read = tokio::select! {
                () = stop.cancelled() => return,
                read = self.read_by_sequence(backoff) => read,
            };
            if let Err(error) = read {
                tracing::debug!(%error, "reading the bucket by sequence");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
            }
            backoff = (backoff * 2).min(MAX_RESTART_DELAY);
        }
    }

    /// Reads the stream message by message from the stream leader, for as
    /// long as `budget` allows or until caught up. Creating a consumer needs
    /// the JetStream meta leader, which a lost NATS node can take seconds to
    /// replace; reading by sequence needs only the stream leader, so the
    /// mirror keeps up (and this replica's watchers keep receiving)
    /// meanwhile.
    async fn read_by_sequence(&self, budget: Duration) -> Result<(), String> {
        tokio::time::timeout(
            budget,
            read_by_sequence(
                &self.stream,
                &self.mirror,
                &self.clock,
                &self.subject_prefix,
            ),
        )
        .await
        .unwrap_or(Ok(()))
    }

    /// `work`, with the nudges that arrive meanwhile served by reading by
    /// sequence.
    async fn serving_nudges<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return done,
                () = self.nudge.notified() => self.nudged().await,
            }
        }
    }

    async fn nudged(&self) {
        let from = self.mirror.stream_seq();
        if let Err(error) = self.read_by_sequence(NUDGED_READ_BUDGET).await {
            tracing::debug!(%error, "nudged: reading the bucket by sequence");
        }
        tracing::debug!(
            from,
            to = self.mirror.stream_seq(),
            "nudged: read the bucket by sequence"
        );
    }

    async fn follow_once(&mut self, start: u64, backoff: &mut Duration) -> String {
        self.turnovers.mark_seen();
        let created = self.serving_nudges(self.stream.create_consumer(OrderedConfig {
            filter_subject: format!("{}>", self.subject_prefix),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ..Default::default()
        }));
        let consumer = match created.await {
            Ok(consumer) => consumer,
            Err(error) => return error.to_string(),
        };
        let mut messages = match self.serving_nudges(consumer.messages()).await {
            Ok(messages) => messages,
            Err(error) => return error.to_string(),
        };
        // Due a stall check: `STALL_CHECK` after the last message. A deadline,
        // not a timeout per wait, so nudges do not put the check off.
        let mut last_message = tokio::time::Instant::now();
        let mut quiet_until = last_message + STALL_CHECK;
        loop {
            // Biased: a message ready is taken before a nudge, so a consumer
            // that delivers is never taken for dead.
            let next = tokio::select! {
                biased;
                () = self.turnovers.next() => {
                    return "the stream leader or the NATS connection moved".to_owned()
                }
                next = tokio::time::timeout_at(quiet_until, messages.next()) => next,
                () = self.nudge.notified() => {
                    // A live consumer delivers within milliseconds of a
                    // write, and a quorum point is a write: one that has
                    // delivered nothing while a call waited `NUDGE_AFTER`
                    // for its point is dead (its node went, or it reads a
                    // replica that is catching up). Replace it now; reads by
                    // sequence, one message a request, cannot keep up with
                    // a busy bucket.
                    if last_message.elapsed() >= NUDGE_AFTER {
                        return "the consumer delivered nothing while a call waited for it"
                            .to_owned();
                    }
                    self.nudged().await;
                    continue;
                }
            };
            let message = match next {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(error))) => return error.to_string(),
                Ok(None) => return "the consumer's message stream ended".to_owned(),
                Err(_quiet) => match stalled(&self.stream, &self.mirror).await {
                    Ok(false) => {
                        quiet_until = tokio::time::Instant::now() + STALL_CHECK;
                        continue;
                    }
                    Ok(true) => {
                        return "the consumer stopped delivering; the stream has moved on"
                            .to_owned()
                    }
                    Err(error) => return error,
                },
            };
            last_message = tokio::time::Instant::now();
            quiet_until = last_message + STALL_CHECK;
            if let Err(why) = self.apply_delivered(&message).await {
                return why;
            }
            *backoff = FIRST_RESTART_DELAY;
        }
    }

    /// Applies a message the consumer delivered; why the consumer must be
    /// replaced, if it must. Every message of the stream matches the
    /// filter, so a hole in the delivered sequence is either messages the
    /// stream dropped (a purge, the per-key history limit) or messages this
    /// consumer skipped (seen right after a failover, reading a stream
    /// replica still catching up). Skipped ones would be a gap: start over
    /// from the hole.
    async fn apply_delivered(&self, message: &jetstream::Message) -> Result<(), String> {
        let info = info_of(message)?;
        let delivered = info.stream_sequence;
        self.stats.delivered(delivered, info.pending);
        let applied = self.mirror.stream_seq();
        if delivered > applied + 1 {
            let missing =
                skipped(&self.stream, &self.subject_prefix, applied + 1, delivered).await?;
            if let Some(missing) = missing {
                return Err(format!(
                    "the consumer skipped stream sequence {missing}, which the stream holds"
                ));
            }
        }
        match parse(message, &info, &self.subject_prefix, &self.clock) {
            Some((id, change)) => self.mirror.apply(delivered, id, change),
            None => self.mirror.skip(delivered),
        }
        Ok(())
    }
}

/// The first sequence in `from..to` that the stream still holds: one
/// request to the stream leader for the first message at or after `from`.
async fn skipped(
    stream: &jetstream::stream::Stream,
    subject_prefix: &str,
    from: u64,
    to: u64,
) -> Result<Option<u64>, String> {
    let first = first_at_or_after(stream, subject_prefix, from).await?;
    Ok(first
        .map(|message| message.sequence)
        .filter(|&sequence| sequence < to))
}

/// Whether the stream holds messages the mirror has not seen and the
/// consumer is not delivering them (checked twice, so a message merely in
/// flight is not mistaken for a stall).
async fn stalled(stream: &jetstream::stream::Stream, mirror: &Mirror) -> Result<bool, String> {
    let info = tokio::time::timeout(STALL_INFO_TIMEOUT, stream.get_info())
        .await
        .map_err(|_| "stream info: no answer within the stall check".to_owned())?;
    let last = info
        .map_err(|e| format!("stream info: {e}"))?
        .state
        .last_sequence;
    if mirror.stream_seq() >= last {
        return Ok(false);
    }
    tokio::time::sleep(STALL_CHECK / 2).await;
    Ok(mirror.stream_seq() < last)
}
