//! Reaching NATS and laying out the bucket: settings, the connection (and
//! how it authenticates), the stream's configuration and the server version
//! check.

use std::{fmt, path::PathBuf, sync::Arc, time::Duration};

use async_nats::jetstream::{
    self, kv,
    stream::{DiscardPolicy, StorageType},
};

use super::{observed::NatsStats, timings, turnover::Turnover};

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
    /// Longest a single JetStream request may take before it counts as
    /// failed (and is tried again within `patience`).
    pub request_timeout: Duration,
    /// How long a call keeps trying through transient store failures (a
    /// stream leader election, a request that timed out) before it is
    /// answered UNAVAILABLE.
    pub patience: Duration,
    /// How this replica authenticates to NATS and verifies it.
    pub security: NatsSecurity,
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
            history: timings::HISTORY,
            request_timeout: timings::REQUEST_TIMEOUT,
            patience: timings::PATIENCE,
            security: NatsSecurity::default(),
            memory_storage: false,
            max_age: Duration::ZERO,
        }
    }
}

/// A secret read from a file or the environment: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    fn expose(&self) -> String {
        self.0.clone()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How respcoord authenticates to NATS and checks the server back: the
/// ways secured NATS deployments are reached (decentralized accounts with a
/// creds file, an nkey, user and password, a token; TLS with a private CA,
/// mutual TLS). Several may be combined where NATS allows (TLS with any of
/// them). Files are read when connecting, so a rotated Secret takes effect
/// at the next restart.
#[derive(Clone, Debug, Default)]
pub struct NatsSecurity {
    /// A `.creds` file (user JWT and nkey seed), as `nsc` writes it.
    pub creds_file: Option<PathBuf>,
    /// A file holding a user nkey seed (`SU...`).
    pub nkey_seed_file: Option<PathBuf>,
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub token: Option<Secret>,
    /// Verify the server against this CA bundle (PEM) instead of the
    /// platform's roots, and require TLS.
    pub tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM) and key for mutual TLS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Require TLS even without a CA or certificate of our own.
    pub tls_required: bool,
}

impl NatsSecurity {
    /// The connect options these settings call for.
    async fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, String> {
        if let Some(path) = &self.creds_file {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| format!("reading the creds file {}: {e}", path.display()))?;
        }
        if let Some(path) = &self.nkey_seed_file {
            let seed = std::fs::read_to_string(path)
                .map_err(|e| format!("reading the nkey seed file {}: {e}", path.display()))?;
            let seed = seed.trim();
            // Checked here so a wrong file is named now, not as an opaque
            // authorization failure from the server. Only user keys
            // authenticate clients: an account or operator seed parses
            // just as well, so its kind is checked too.
            let key = nkeys::KeyPair::from_seed(seed).map_err(|e| {
                format!(
                    "the nkey seed file {} holds no user seed: {e}",
                    path.display()
                )
            })?;
            if key.key_pair_type() != nkeys::KeyPairType::User {
                return Err(format!(
                    "the nkey seed file {} holds a seed of type {:?}, not a user seed (SU...)",
                    path.display(),
                    key.key_pair_type()
                ));
            }
            options = options.nkey(seed.to_owned());
        }
        match (&self.user, &self.password) {
            (Some(user), Some(password)) => {
                options = options.user_and_password(user.clone(), password.expose());
            }
            (Some(_), None) => return Err("a NATS user needs a password".into()),
            (None, Some(_)) => return Err("a NATS password needs a user".into()),
            (None, None) => {}
        }
        if let Some(token) = &self.token {
            options = options.token(token.expose());
        }
        if let Some(ca) = &self.tls_ca {
            readable(ca, "the NATS TLS CA")?;
            options = options.add_root_certificates(ca.clone());
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                readable(cert, "the NATS client certificate")?;
                readable(key, "the NATS client key")?;
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
            (Some(_), None) => return Err("a NATS client certificate needs its key".into()),
            (None, Some(_)) => return Err("a NATS client key needs its certificate".into()),
            (None, None) => {}
        }
        if self.tls_required || self.tls_ca.is_some() || self.tls_cert.is_some() {
            options = options.require_tls(true);
        }
        Ok(options)
    }
}

fn readable(path: &std::path::Path, what: &str) -> Result<(), String> {
    std::fs::metadata(path)
        .map(drop)
        .map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("NATS security settings: {0}")]
    Security(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("bucket {bucket:?}: {reason}")]
    Bucket { bucket: String, reason: String },
    #[error("reading bucket {bucket:?} at startup: {reason}")]
    Load { bucket: String, reason: String },
}

/// The bucket, opened.
pub(super) struct Opened {
    pub(super) client: async_nats::Client,
    pub(super) kv: kv::Store,
    pub(super) stream: jetstream::stream::Stream,
}

/// Connects to NATS and opens the bucket, creating it if it does not exist
/// (after checking that the server's compare-and-set is safe for its
/// replication). The connection's events go to `observed` and `turnover`;
/// a server entering lame duck is left at once (`lame_duck`).
pub(super) async fn open_bucket(
    settings: &NatsSettings,
    observed: &Arc<NatsStats>,
    turnover: &Arc<Turnover>,
) -> Result<Opened, NatsError> {
    let options = settings
        .security
        .apply(async_nats::ConnectOptions::new())
        .await
        .map_err(NatsError::Security)?;
    let (events, turnovers) = (Arc::clone(observed), Arc::clone(turnover));
    let connected = Arc::new(std::sync::OnceLock::<async_nats::Client>::new());
    let reconnect = Arc::clone(&connected);
    let client = options
        .name("respcoord")
        .event_callback(move |event| {
            events.connection(&event);
            turnovers.on_connection(&event);
            if event == async_nats::Event::LameDuckMode {
                lame_duck(reconnect.get().cloned());
            }
            std::future::ready(())
        })
        .connection_timeout(settings.request_timeout.max(timings::CONNECT_TIMEOUT_FLOOR))
        .request_timeout(Some(settings.request_timeout))
        // A comma-separated list of seeds: the client fails over among
        // them (and learns the rest of the cluster from the servers).
        .connect(seed_servers(&settings.url))
        .await
        .map_err(|e| NatsError::Connect {
            url: redacted_url(&settings.url),
            reason: e.to_string(),
        })?;
    // The callback only reads it; set once, right after connecting.
    let _ = connected.set(client.clone());
    let server_version = client.server_info().version;
    let mut js = jetstream::new(client.clone());
    js.set_timeout(settings.request_timeout);
    let bucket_error = |reason: String| NatsError::Bucket {
        bucket: settings.bucket.clone(),
        reason,
    };
    check_server_version(&server_version).map_err(NatsError::Unsupported)?;
    let stream = ensure_bucket(&js, settings).await.map_err(bucket_error)?;
    let kv = js
        .get_key_value(settings.bucket.as_str())
        .await
        .map_err(|e| bucket_error(e.to_string()))?;
    Ok(Opened { client, kv, stream })
}

/// The server this replica is connected to entered lame duck: it will
/// close every client connection at a moment of its choosing within its
/// lame-duck duration, and it no longer takes new ones. Moving now, while
/// the rest of the cluster serves, makes that break happen at once and
/// once (a turnover: requests in flight are sent again) instead of at a
/// random moment later, possibly in the middle of the restart it announces.
fn lame_duck(client: Option<async_nats::Client>) {
    let Some(client) = client else { return };
    tokio::spawn(async move {
        if let Err(error) = client.force_reconnect().await {
            tracing::warn!(%error, "leaving a NATS server in lame duck");
        }
    });
}

fn seed_servers(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|seed| !seed.is_empty())
        .collect()
}

/// The oldest nats-server line respcoord runs on. 2.9.21 was the first to
/// serialize compare-and-set across a clustered stream
/// (nats-io/nats-server#4320); 2.10 is the oldest line still maintained
/// and the oldest the test command runs.
const SUPPORTED_FROM: (u64, u64, u64) = (2, 10, 0);

/// The newest release line the test command runs (docs/cluster.md,
/// "Supported NATS"). A newer 2.x starts with a warning: JetStream has
/// moved error codes between lines before (`failure`).
const TESTED_THROUGH_MINOR: u64 = 14;

/// A supported nats-server, tested or newer than any line tested.
#[derive(Debug, PartialEq, Eq)]
enum Support {
    Tested,
    Newer,
}

/// Refuses a nats-server outside the supported range, saying why; warns of
/// one newer than the lines tested.
fn check_server_version(server_version: &str) -> Result<(), String> {
    if support(server_version)? == Support::Newer {
        tracing::warn!(
            nats_server = server_version,
            "nats-server is newer than the newest line respcoord is tested with (tested through 2.{TESTED_THROUGH_MINOR})"
        );
    }
    Ok(())
}

fn support(server_version: &str) -> Result<Support, String> {
    let mut parts = server_version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let version = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    let (major, minor, _) = SUPPORTED_FROM;
    if version < SUPPORTED_FROM || version.0 != major {
        return Err(format!(
            "nats-server {server_version} is not supported: respcoord needs {major}.{minor}.0 \
             or a newer 2.x (tested through 2.{TESTED_THROUGH_MINOR}); older servers do not \
             serialize compare-and-set on a clustered stream (nats-io/nats-server#4320) or \
             are no longer maintained. Upgrade NATS"
        ));
    }
    if version.1 > TESTED_THROUGH_MINOR {
        return Ok(Support::Newer);
    }
    Ok(Support::Tested)
}

/// `url` with any user, password or token in it replaced, for messages.
pub(crate) fn redacted_url(url: &str) -> String {
    url.split(',')
        .map(|seed| {
            let seed = seed.trim();
            let (scheme, rest) = seed.split_once("://").unwrap_or(("", seed));
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            let userinfo = if rest.contains('@') { "***@" } else { "" };
            if scheme.is_empty() {
                format!("{userinfo}{host}")
            } else {
                format!("{scheme}://{userinfo}{host}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
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
        max_messages_per_subject: i64::from(settings.history.clamp(1, timings::MAX_HISTORY)),
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
    use super::{check_server_version, redacted_url, support, Support, TESTED_THROUGH_MINOR};

    #[test]
    fn servers_from_2_10_on_are_supported_and_older_ones_refused_by_name() {
        for supported in [
            "2.10.0",
            "2.10.26",
            "2.12.8",
            "2.14.6",
            "2.15.1",
            "2.16.0-beta.1",
        ] {
            assert!(check_server_version(supported).is_ok(), "{supported}");
        }
        for refused in ["2.9.10", "2.9.21", "1.4.1", "3.0.0", "garbage"] {
            let why = check_server_version(refused).unwrap_err();
            assert!(
                why.contains(refused) && why.contains("2.10.0"),
                "{refused}: {why}"
            );
        }
    }

    /// The newest line tested is the one the test command installs
    /// (scripts/test.sh `NATS_NEWEST`) and docs/cluster.md names: a newer
    /// one starts with a warning, and every message says "tested through
    /// 2.14" as the docs do.
    #[test]
    fn tested_through_the_newest_line_the_test_command_runs() {
        let script = include_str!("../../scripts/test.sh");
        let newest = script
            .lines()
            .find_map(|line| line.strip_prefix("NATS_NEWEST="))
            .expect("scripts/test.sh sets NATS_NEWEST");
        let line = format!("2.{TESTED_THROUGH_MINOR}");
        assert!(
            newest.starts_with(&format!("{line}.")),
            "{newest} vs {line}"
        );
        let docs = include_str!("../../docs/cluster.md");
        assert!(
            docs.contains(&format!("{newest} (newest)")),
            "docs/cluster.md names {newest} newest"
        );
        assert_eq!(support(newest), Ok(Support::Tested));
        assert_eq!(support("2.15.1"), Ok(Support::Newer));
        assert_eq!(support("2.16.0-beta.1"), Ok(Support::Newer));
        let why = check_server_version("2.9.21").unwrap_err();
        assert!(why.contains(&format!("tested through {line}")), "{why}");
    }

    #[test]
    fn urls_in_messages_never_carry_credentials() {
        assert_eq!(
            redacted_url("nats://user:secret@a:4222, tls://token@b:4222,c:4222"),
            "nats://***@a:4222,tls://***@b:4222,c:4222"
        );
        assert_eq!(
            redacted_url("nats://127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
    }
}
