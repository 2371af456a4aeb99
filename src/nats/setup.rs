//! Reaching NATS and laying out the bucket: settings, the connection, the
//! stream's configuration and the server version check.

use std::time::Duration;

use async_nats::jetstream::{
    self, kv,
    stream::{DiscardPolicy, StorageType},
};

/// How to reach and lay out the bucket.
#[derive(Clone, Debug)]
pub struct NatsSettings {
    /// `nats://host:port`, comma-separated for several seed servers.
    pub url: String,
    pub bucket: String,
    /// JetStream replicas of the bucket's stream (1, 3 or 5).
    pub replicas: usize,
    /// Entries kept per session key: the window for Watch `after_revision`
    /// resume, in transitions (at most 64, JetStream's per-key cap).
    pub history: u8,
    /// Longest a single JetStream request may take before the call is
    /// answered UNAVAILABLE.
    pub request_timeout: Duration,
    /// Keep the bucket in memory instead of on disk (when this process
    /// creates it): faster, and lost if every NATS node restarts at once.
    pub memory_storage: bool,
    /// Drop stored messages older than this (when this process creates the
    /// bucket); zero keeps them. Reclaims the purge markers forgotten
    /// sessions leave behind. It must exceed the idle TTL plus the tombstone
    /// TTL by a margin, or a live session's entry could age out.
    pub max_age: Duration,
}

impl Default for NatsSettings {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            bucket: "respcoord".into(),
            replicas: 1,
            history: 16,
            request_timeout: Duration::from_secs(2),
            memory_storage: false,
            max_age: Duration::ZERO,
        }
    }
}

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("bucket {bucket:?}: {reason}")]
    Bucket { bucket: String, reason: String },
    #[error("reading bucket {bucket:?} at startup: {reason}")]
    Load { bucket: String, reason: String },
}

/// Connects to NATS and opens the bucket, creating it if it does not exist
/// (after checking that the server's compare-and-set is safe for its
/// replication).
pub(super) async fn open_bucket(
    settings: &NatsSettings,
) -> Result<(kv::Store, jetstream::stream::Stream), NatsError> {
    let client = async_nats::ConnectOptions::new()
        .name("respcoord")
        .connection_timeout(settings.request_timeout.max(Duration::from_secs(1)))
        .request_timeout(Some(settings.request_timeout))
        // A comma-separated list of seeds: the client fails over among
        // them (and learns the rest of the cluster from the servers).
        .connect(seed_servers(&settings.url))
        .await
        .map_err(|e| NatsError::Connect {
            url: settings.url.clone(),
            reason: e.to_string(),
        })?;
    let server_version = client.server_info().version;
    let mut js = jetstream::new(client);
    js.set_timeout(settings.request_timeout);
    let bucket_error = |reason: String| NatsError::Bucket {
        bucket: settings.bucket.clone(),
        reason,
    };
    check_replication(settings.replicas, &server_version).map_err(bucket_error)?;
    let stream = ensure_bucket(&js, settings).await.map_err(bucket_error)?;
    check_replication(stream.cached_info().config.num_replicas, &server_version)
        .map_err(bucket_error)?;
    let kv = js
        .get_key_value(settings.bucket.as_str())
        .await
        .map_err(|e| bucket_error(e.to_string()))?;
    Ok((kv, stream))
}

fn seed_servers(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|seed| !seed.is_empty())
        .collect()
}

/// The first nats-server that serializes compare-and-set
/// (`Nats-Expected-Last-Subject-Sequence`) across a clustered stream: before
/// it, two writes computed from the same revision could both be accepted on
/// a replicated bucket (nats-io/nats-server#4320, fixed in 2.9.21), which
/// would let two replicas apply the same transition.
const REPLICATED_CAS_SINCE: (u64, u64, u64) = (2, 9, 21);

/// Refuses a replicated bucket on a server whose compare-and-set is not
/// serializable there. A single-replica bucket is safe on any 2.9.
fn check_replication(replicas: usize, server_version: &str) -> Result<(), String> {
    if replicas <= 1 {
        return Ok(());
    }
    let mut parts = server_version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let version = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    if version >= REPLICATED_CAS_SINCE {
        return Ok(());
    }
    let (major, minor, patch) = REPLICATED_CAS_SINCE;
    Err(format!(
        "a replicated bucket (R{replicas}) needs nats-server {major}.{minor}.{patch} or newer: \
         {server_version} does not serialize compare-and-set on a clustered stream \
         (nats-io/nats-server#4320), so two writes of one session could both land; \
         upgrade NATS or use --nats-replicas 1"
    ))
}

/// Creates the bucket's stream if it does not exist, with direct gets off so
/// every read goes to the stream leader (a follower may lag, and a stale read
/// would show a caller a state older than its own acknowledged write).
async fn ensure_bucket(
    js: &jetstream::Context,
    settings: &NatsSettings,
) -> Result<jetstream::stream::Stream, String> {
    let name = format!("KV_{}", settings.bucket);
    if let Ok(stream) = js.get_stream(&name).await {
        if stream.cached_info().config.allow_direct {
            tracing::warn!(bucket = %settings.bucket, "bucket allows direct gets: GetState may be served by a lagging replica");
        }
        return Ok(stream);
    }
    let config = jetstream::stream::Config {
        name,
        description: Some("respcoord sessions (one entry per session)".into()),
        subjects: vec![format!("$KV.{}.>", settings.bucket)],
        max_messages_per_subject: i64::from(settings.history.clamp(1, 64)),
        storage: if settings.memory_storage {
            StorageType::Memory
        } else {
            StorageType::File
        },
        num_replicas: settings.replicas.max(1),
        discard: DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: false,
        max_age: settings.max_age,
        ..Default::default()
    };
    match js.create_stream(config).await {
        Ok(stream) => Ok(stream),
        // Another replica created it first.
        Err(error) => js
            .get_stream(format!("KV_{}", settings.bucket))
            .await
            .map_err(|_| error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::check_replication;

    #[test]
    fn replicated_buckets_need_a_server_with_serializable_compare_and_set() {
        assert!(check_replication(1, "2.9.10").is_ok());
        assert!(check_replication(3, "2.9.21").is_ok());
        assert!(check_replication(3, "2.10.26").is_ok());
        assert!(check_replication(5, "2.11.0-beta.1").is_ok());
        let refused = check_replication(3, "2.9.10").unwrap_err();
        assert!(
            refused.contains("4320") && refused.contains("2.9.21"),
            "{refused}"
        );
        assert!(check_replication(3, "garbage").is_err());
    }
}
