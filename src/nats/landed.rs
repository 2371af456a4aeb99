//! Whether a write whose answer was lost landed after all.
//!
//! A write is tried again, with the same bytes over the same revision, when
//! its try went unanswered (a timeout, a leader move). If the first try
//! landed, the retry meets a conflict, and the call must answer what its own
//! write did, never decide and write a second time: a Cancel applied twice
//! cancels a response another gateway started in between, a Start applied
//! twice supersedes it (the NATS-path model, `tests/model_check/nats_path.rs`,
//! found exactly this when the key moved again before the re-read).
//!
//! A compare-and-set lands only over the revision it expects, so if it
//! landed it is the key's first message after that revision, however many
//! came after it. The stream holds a key's last `--nats-history` messages:
//! when the expected revision itself is still held, nothing between it and
//! its successor was dropped, and the successor tells for certain whether
//! the write landed. When it is not (the key moved that many times since, or
//! the write created the key), and the successor is not this write, nobody
//! can tell: the call is answered UNAVAILABLE, as any write whose answer
//! was lost is, and never applied a second time.

use async_nats::jetstream::stream::RawMessageErrorKind;
use bytes::Bytes;

use super::{
    entry::KvRevision,
    failure::{Patience, StoreFailure},
    observed::{RetryReason, StoreOp},
    Inner,
};
use crate::error::CoordError;

/// What became of a write whose retry met a conflict.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Landed {
    /// It landed, at this revision: the call's answer is what it decided.
    At(KvRevision),
    /// Another write came first: decide again from a fresh read.
    No,
}

impl Inner {
    /// Whether `value`, written to `key` over `expected`, landed (see the
    /// module). Read from the stream leader: a read a deposed leader serves
    /// holds a prefix of the stream, which may lack the successor the
    /// conflict proved exists, and is then asked again.
    pub(super) async fn landed(
        &self,
        key: &str,
        expected: KvRevision,
        value: &Bytes,
        patience: &mut Patience,
    ) -> Result<Landed, CoordError> {
        let subject = format!("{}{key}", self.kv.prefix);
        let successor = patience
            .retry(&self.observed, StoreOp::Read, || async {
                match self
                    .stream
                    .raw_message_builder()
                    .sequence(expected.get() + 1)
                    .next_by_subject(subject.clone())
                    .send()
                    .await
                {
                    Ok(message) => Ok((message.sequence, message.payload)),
                    Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => {
                        Err(StoreFailure::Transient(
                            RetryReason::NotReady,
                            "the key moved, but the stream read holds no later message".into(),
                        ))
                    }
                    Err(error) => Err(StoreFailure::of(&error)),
                }
            })
            .await
            .map_err(StoreFailure::into_error)?;
        if successor.1 == *value {
            return Ok(Landed::At(KvRevision::at(successor.0)));
        }
        if expected != KvRevision::NONE && self.still_held(&subject, expected, patience).await? {
            return Ok(Landed::No);
        }
        Err(CoordError::Unavailable(format!(
            "the answer to a write of {key} was lost and the stream no longer holds what it \
             was written over, so whether it landed cannot be told; retry"
        )))
    }

    /// Whether the stream still holds `subject`'s message at `revision`.
    async fn still_held(
        &self,
        subject: &str,
        revision: KvRevision,
        patience: &mut Patience,
    ) -> Result<bool, CoordError> {
        patience
            .retry(&self.observed, StoreOp::Read, || async {
                match self.stream.get_raw_message(revision.get()).await {
                    Ok(message) => Ok(message.subject.as_str() == subject),
                    Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => Ok(false),
                    Err(error) => Err(StoreFailure::of(&error)),
                }
            })
            .await
            .map_err(StoreFailure::into_error)
    }
}

/// What the test seam runs between a write landing and its lost answer.
#[cfg(test)]
pub(super) type Meanwhile =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

#[cfg(test)]
impl Inner {
    pub(super) fn take_lost_answer(&self, key: &str) -> Option<Meanwhile> {
        self.lost_answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key)
    }

    /// The write lands; then `meanwhile` runs; then the answer is lost, as a
    /// timeout during a leader move loses it.
    pub(super) async fn land_and_lose_the_answer(
        &self,
        key: &str,
        value: &Bytes,
        expected: KvRevision,
        meanwhile: Meanwhile,
    ) -> Result<u64, StoreFailure> {
        self.kv
            .update(key, value.clone(), expected.get())
            .await
            .map_err(|error| StoreFailure::of(&error))?;
        meanwhile().await;
        Err(StoreFailure::Transient(
            RetryReason::Timeout,
            "test: the write landed and its answer was lost".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, PoisonError};

    use super::super::{
        entry,
        watch_tests::{coordinator_on, fresh_bucket, nats_available},
    };
    use super::*;
    use crate::{ids::SessionId, machine::Source, registry::CoordConfig};

    fn lose_next_answer(c: &super::super::NatsCoordinator, id: &SessionId, meanwhile: Meanwhile) {
        c.inner.cache.take(id);
        c.inner
            .lost_answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(entry::key(id), meanwhile);
    }

    /// The counterexample the NATS-path model found: a Cancel lands and its
    /// answer is lost; another replica starts a response before the retry;
    /// the retry must answer what the landed Cancel did, not cancel the
    /// new response too.
    #[tokio::test]
    async fn a_write_whose_answer_was_lost_is_not_applied_again_after_another_write() {
        if !nats_available().await {
            return;
        }
        let bucket = fresh_bucket();
        let a = coordinator_on(&bucket, 16, CoordConfig::default()).await;
        let b = Arc::new(coordinator_on(&bucket, 16, CoordConfig::default()).await);
        let id = SessionId::parse("lost-answer").unwrap();
        let first = a.start(&id, Source::Client, None).await.unwrap();
        let other = Arc::clone(&b);
        let started_meanwhile = Arc::new(std::sync::Mutex::new(None));
        let record = Arc::clone(&started_meanwhile);
        let meanwhile_id = id.clone();
        lose_next_answer(
            &a,
            &id,
            Box::new(move || {
                Box::pin(async move {
                    let started = other
                        .start(&meanwhile_id, Source::Vad, None)
                        .await
                        .expect("the other replica starts a response");
                    *record.lock().unwrap_or_else(PoisonError::into_inner) = Some(started);
                })
            }),
        );
        let cancelled = a.cancel(&id, None, Source::Client).await.unwrap();
        assert!(
            a.inner.take_lost_answer(&entry::key(&id)).is_none(),
            "the seam ran"
        );
        let second = started_meanwhile
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .expect("the other replica's Start ran between the write and its answer");
        assert_eq!(
            cancelled.result,
            Some(first.response),
            "the Cancel answers what it did: it cancelled the first response"
        );
        let state = b.state(&id).await.unwrap();
        assert_eq!(
            state.phase.active().map(|live| live.id),
            Some(second.response),
            "the second response is untouched"
        );
        assert_eq!(second.superseded, None, "the Cancel had ended the first");
        assert_eq!(state.revision, second.state.revision);
    }
}
