//! The bucket requests a call makes, behind one small interface
//! ([`Store`]): read a key, write it with compare-and-set, purge it, write
//! a quorum point, find a key's message after a revision (a lost answer's
//! check), and read the stream's last sequence. [`NatsStore`] is the
//! async-nats implementation; a fault is a wrapper around a store, never a
//! branch inside one (the fault build's [`Faulty`], and the tests'
//! scripted stores in `store/scripted.rs`).
//!
//! The follower's consumer, a watch's history and the expirer's lease read
//! the bucket through async-nats directly: they are not a call's requests,
//! and their faults are a server's (killed, partitioned), which the fault
//! runs make on real clusters.

use async_nats::jetstream::{self, kv, stream::RawMessageErrorKind};
use async_trait::async_trait;
use bytes::Bytes;

use super::{entry::KvRevision, failure::StoreFailure};

/// A key's latest message as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) revision: KvRevision,
    pub(super) value: Bytes,
    /// The stream's stamp on the message, in Unix nanoseconds.
    pub(super) created_nanos: i128,
    /// A put; else a delete or purge marker (no entry).
    pub(super) put: bool,
}

impl From<kv::Entry> for Stored {
    fn from(entry: kv::Entry) -> Self {
        Self {
            revision: KvRevision::at(entry.revision),
            created_nanos: entry.created.unix_timestamp_nanos(),
            put: entry.operation == kv::Operation::Put,
            value: entry.value,
        }
    }
}

/// The bucket requests of a call (see the module).
#[async_trait]
pub(super) trait Store: Send + Sync + 'static {
    /// The key's latest message, from the stream leader.
    async fn entry(&self, key: &str) -> Result<Option<Stored>, StoreFailure>;

    /// Writes `value` if the key is still at `expected`: the new revision,
    /// or `StoreFailure::Conflict`.
    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: KvRevision,
    ) -> Result<KvRevision, StoreFailure>;

    /// Writes `value` whatever the key holds (quorum points).
    async fn put(&self, key: &str, value: Bytes) -> Result<KvRevision, StoreFailure>;

    /// Purges the key if it is still at `expected`.
    async fn purge(&self, key: &str, expected: KvRevision) -> Result<(), StoreFailure>;

    /// The key's first message after `revision`, from the stream leader;
    /// `None` when the stream holds none.
    async fn message_after(
        &self,
        key: &str,
        revision: KvRevision,
    ) -> Result<Option<(KvRevision, Bytes)>, StoreFailure>;

    /// Whether the stream still holds the key's message at `revision`.
    async fn holds(&self, key: &str, revision: KvRevision) -> Result<bool, StoreFailure>;

    /// The stream's last sequence.
    async fn last_sequence(&self) -> Result<u64, StoreFailure>;
}

/// The bucket through async-nats.
pub(super) struct NatsStore {
    pub(super) kv: kv::Store,
    pub(super) stream: jetstream::stream::Stream,
}

impl NatsStore {
    fn subject(&self, key: &str) -> String {
        format!("{}{key}", self.kv.prefix)
    }
}

#[async_trait]
impl Store for NatsStore {
    async fn entry(&self, key: &str) -> Result<Option<Stored>, StoreFailure> {
        let entry = self
            .kv
            .entry(key)
            .await
            .map_err(|error| StoreFailure::of(&error))?;
        Ok(entry.map(Stored::from))
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: KvRevision,
    ) -> Result<KvRevision, StoreFailure> {
        self.kv
            .update(key, value, expected.get())
            .await
            .map(KvRevision::at)
            .map_err(|error| StoreFailure::of(&error))
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<KvRevision, StoreFailure> {
        self.kv
            .put(key, value)
            .await
            .map(KvRevision::at)
            .map_err(|error| StoreFailure::of(&error))
    }

    async fn purge(&self, key: &str, expected: KvRevision) -> Result<(), StoreFailure> {
        self.kv
            .purge_expect_revision(key, Some(expected.get()))
            .await
            .map_err(|error| StoreFailure::of(&error))
    }

    async fn message_after(
        &self,
        key: &str,
        revision: KvRevision,
    ) -> Result<Option<(KvRevision, Bytes)>, StoreFailure> {
        match self
            .stream
            .raw_message_builder()
            .sequence(revision.get() + 1)
            .next_by_subject(self.subject(key))
            .send()
            .await
        {
            Ok(message) => Ok(Some((KvRevision::at(message.sequence), message.payload))),
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(error) => Err(StoreFailure::of(&error)),
        }
    }

    async fn holds(&self, key: &str, revision: KvRevision) -> Result<bool, StoreFailure> {
        match self.stream.get_raw_message(revision.get()).await {
            Ok(message) => Ok(message.subject.as_str() == self.subject(key)),
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => Ok(false),
            Err(error) => Err(StoreFailure::of(&error)),
        }
    }

    async fn last_sequence(&self) -> Result<u64, StoreFailure> {
        let info = self
            .stream
            .get_info()
            .await
            .map_err(|error| StoreFailure::Unavailable(error.to_string()))?;
        Ok(info.state.last_sequence)
    }
}

/// The fault build's broken stores, which the fault runs' checker must
/// catch: every compare-and-set a plain put
/// (`shared::faults::unguarded_writes`), or quorum points answered at once
/// with nothing written, so whatever the mirror holds stands
/// (`shared::faults::unconfirmed_reads`).
pub(super) struct Faulty<S> {
    pub(super) store: S,
    pub(super) unguarded_writes: bool,
    pub(super) unconfirmed_reads: bool,
}

#[async_trait]
impl<S: Store> Store for Faulty<S> {
    async fn entry(&self, key: &str) -> Result<Option<Stored>, StoreFailure> {
        self.store.entry(key).await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: KvRevision,
    ) -> Result<KvRevision, StoreFailure> {
        if self.unguarded_writes {
            return self.store.put(key, value).await;
        }
        self.store.update(key, value, expected).await
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<KvRevision, StoreFailure> {
        if self.unconfirmed_reads {
            return Ok(KvRevision::NONE);
        }
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
        self.store.last_sequence().await
    }
}

#[cfg(test)]
pub(super) mod scripted;
