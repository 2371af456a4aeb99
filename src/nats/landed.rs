//! The store requests that tell whether a write whose answer was lost
//! landed after all (the policy is `attempts`).
//!
//! A write is tried again, with the same bytes over the same revision, when
//! its try went unanswered (a timeout, a leader move). If the first try
//! landed, the retry meets a conflict, and the call must answer what its own
//! write did, never decide and write a second time: a Cancel applied twice
//! cancels a response another gateway started in between, a Start applied
//! twice supersedes it (model 4, `tests/model_check/nats_path.rs`, finds
//! exactly this when the key moved again before the re-read).
//!
//! A compare-and-set lands only over the revision it expects, so if it
//! landed it is the key's first message after that revision, however many
//! came after it ([`Inner::successor`]). The stream holds a key's last
//! `--nats-history` messages: when the expected revision itself is still
//! held ([`Inner::still_held`]), nothing between it and its successor was
//! dropped, and the successor tells for certain whether the write landed.

use async_nats::jetstream::stream::RawMessageErrorKind;
use bytes::Bytes;

use super::{
    attempts::Successor,
    entry::KvRevision,
    failure::{Patience, StoreFailure},
    observed::{RetryReason, StoreOp},
    Inner,
};
use crate::error::CoordError;

impl Inner {
    /// The key's first message after `expected`, and whether it holds
    /// `value`, the bytes the write sent. Read from the stream leader: a
    /// read a deposed leader serves holds a prefix of the stream, which may
    /// lack the successor the conflict proved exists, and is then asked
    /// again.
    pub(super) async fn successor(
        &self,
        key: &str,
        expected: KvRevision,
        value: &Bytes,
        patience: &mut Patience,
    ) -> Result<Successor, CoordError> {
        let subject = format!("{}{key}", self.kv.prefix);
        let (sequence, payload) = patience
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
        Ok(Successor {
            revision: KvRevision::at(sequence),
            ours: payload == *value,
        })
    }

    /// Whether the stream still holds `key`'s message at `revision`.
    pub(super) async fn still_held(
        &self,
        key: &str,
        revision: KvRevision,
        patience: &mut Patience,
    ) -> Result<bool, CoordError> {
        let subject = format!("{}{key}", self.kv.prefix);
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
