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
        let (revision, payload) = patience
            .retry(&self.observed, StoreOp::Read, || async {
                self.store
                    .message_after(key, expected)
                    .await?
                    .ok_or_else(|| {
                        StoreFailure::Transient(
                            RetryReason::NotReady,
                            "the key moved, but the stream read holds no later message".into(),
                        )
                    })
            })
            .await
            .map_err(StoreFailure::into_error)?;
        Ok(Successor {
            revision,
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
        patience
            .retry(&self.observed, StoreOp::Read, || {
                self.store.holds(key, revision)
            })
            .await
            .map_err(StoreFailure::into_error)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, PoisonError};

    use super::super::{
        entry,
        watch_tests::{coordinator_on, fresh_bucket, require_nats, scripted_on},
    };
    use crate::{ids::SessionId, machine::Source, registry::CoordConfig};

    /// The counterexample the NATS-path model found: a Cancel lands and its
    /// answer is lost; another replica starts a response before the retry;
    /// the retry must answer what the landed Cancel did, not cancel the
    /// new response too.
    #[tokio::test]
    async fn a_write_whose_answer_was_lost_is_not_applied_again_after_another_write() {
        require_nats().await;
        let bucket = fresh_bucket();
        let (a, script) = scripted_on(&bucket, 16, CoordConfig::default()).await;
        let b = Arc::new(coordinator_on(&bucket, 16, CoordConfig::default()).await);
        let id = SessionId::parse("lost-answer").unwrap();
        let first = a.start(&id, Source::Client, None).await.unwrap();
        let other = Arc::clone(&b);
        let started_meanwhile = Arc::new(std::sync::Mutex::new(None));
        let record = Arc::clone(&started_meanwhile);
        let meanwhile_id = id.clone();
        script.lose_next_answer(
            &entry::key(&id),
            Box::pin(async move {
                let started = other
                    .start(&meanwhile_id, Source::Vad, None)
                    .await
                    .expect("the other replica starts a response");
                *record.lock().unwrap_or_else(PoisonError::into_inner) = Some(started);
            }),
        );
        let cancelled = a.cancel(&id, None, Source::Client).await.unwrap();
        assert!(script.played(), "the answer was lost");
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
