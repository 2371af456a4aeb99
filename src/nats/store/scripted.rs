//! A store that a test scripts: it passes every request to the store it
//! wraps, except the next ones a test has set up, which it answers or
//! delays the way a fault would (a deposed leader's stale read, a write
//! whose answer is lost while something else happens, writes between a
//! watch's steps).

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Mutex, PoisonError},
};

use async_trait::async_trait;
use bytes::Bytes;

use super::{KvRevision, Store, StoreFailure, Stored};
use crate::nats::observed::RetryReason;

/// What a scripted request awaits before it answers.
pub(in crate::nats) type Meanwhile = Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Default)]
struct Script {
    /// The next read of a key returns this instead.
    stale_reads: HashMap<String, Stored>,
    /// The next write of a key lands, then this runs, then its answer is
    /// lost.
    lost_answers: HashMap<String, Meanwhile>,
    /// The next read of any key, or of the stream's last sequence, is
    /// answered only after this ran.
    after_next_read: Option<Meanwhile>,
}

pub(in crate::nats) struct Scripted<S> {
    store: S,
    script: Mutex<Script>,
}

impl<S: Store> Scripted<S> {
    pub(in crate::nats) fn new(store: S) -> Self {
        Self {
            store,
            script: Mutex::default(),
        }
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next read of `key` returns `stale`, as a deposed stream leader
    /// would serve it.
    pub(in crate::nats) fn serve_stale_read(&self, key: &str, stale: Stored) {
        self.script().stale_reads.insert(key.to_owned(), stale);
    }

    /// The next write of `key` lands; then `meanwhile` runs; then its
    /// answer is lost, as a timeout during a leader move loses it.
    pub(in crate::nats) fn lose_next_answer(&self, key: &str, meanwhile: Meanwhile) {
        self.script().lost_answers.insert(key.to_owned(), meanwhile);
    }

    /// The next read of a key, or of the stream's last sequence, answers
    /// only after `meanwhile` ran: writes that land between a watch's
    /// first read and what it does next.
    pub(in crate::nats) fn after_next_read(&self, meanwhile: Meanwhile) {
        self.script().after_next_read = Some(meanwhile);
    }

    /// Whether every scripted fault has happened.
    pub(in crate::nats) fn played(&self) -> bool {
        let script = self.script();
        script.stale_reads.is_empty()
            && script.lost_answers.is_empty()
            && script.after_next_read.is_none()
    }

    async fn then_meanwhile<T>(&self, answer: T) -> T {
        let meanwhile = self.script().after_next_read.take();
        if let Some(meanwhile) = meanwhile {
            meanwhile.await;
        }
        answer
    }
}

#[async_trait]
impl<S: Store> Store for Scripted<S> {
    async fn entry(&self, key: &str) -> Result<Option<Stored>, StoreFailure> {
        let stale = self.script().stale_reads.remove(key);
        let answer = match stale {
            Some(stale) => Ok(Some(stale)),
            None => self.store.entry(key).await,
        };
        self.then_meanwhile(answer).await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: KvRevision,
    ) -> Result<KvRevision, StoreFailure> {
        let lost = self.script().lost_answers.remove(key);
        let landed = self.store.update(key, value, expected).await;
        match lost {
            Some(meanwhile) => {
                landed?;
                meanwhile.await;
                Err(StoreFailure::Transient(
                    RetryReason::Timeout,
                    "scripted: the write landed and its answer was lost".into(),
                ))
            }
            None => landed,
        }
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<KvRevision, StoreFailure> {
        self.store.put(key, value).await
    }

    async fn purge(&self, key: &str, expected: KvRevision) -> Result<(), StoreFailure> {
        self.store.purge(key, expected).await
    }

    async fn message_after(
        &self,
        key: &str,
        revision: KvRevision,
    ) -> Result<Option<(KvRevision, Bytes)>, StoreFailure> {
        self.store.message_after(key, revision).await
    }

    async fn holds(&self, key: &str, revision: KvRevision) -> Result<bool, StoreFailure> {
        self.store.holds(key, revision).await
    }

    async fn last_sequence(&self) -> Result<u64, StoreFailure> {
        let answer = self.store.last_sequence().await;
        self.then_meanwhile(answer).await
    }
}
