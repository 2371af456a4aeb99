//! Command line and environment. Every flag has a `RESPCOORD_*` variable;
//! a bad value exits with status 2 and a message naming the flag (clap).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `--log-format`'s values; the type is `telemetry`'s, which consumes it.
pub use crate::telemetry::LogFormat;
use crate::{
    auth::Tokens,
    grpc::WatchSettings,
    nats::{NatsSecurity, NatsSettings, Secret},
    server::{Limits, Pem, TlsConfig},
    shared::CoordConfig,
};

#[derive(Debug, Parser)]
#[command(
    name = "respcoord",
    version,
    about = "The response coordinator (machine M3) for realtime voice/LLM gateways"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the coordinator over gRPC (embedded in-memory by default).
    Serve(ServeArgs),
}

impl Cli {
    /// Parses the command line and the `RESPCOORD_*` environment. A value
    /// that came from a variable is refused under the variable's name as
    /// well as the flag's: an operator who never typed `--listen` looks for
    /// `RESPCOORD_LISTEN` in the manifest, not for a flag.
    pub fn try_parse_naming_variables<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        Self::try_parse_from(&args).map_err(|error| name_the_variable(error, &args))
    }
}

/// Adds "(from RESPCOORD_X)" after the flag an invalid value is reported
/// under, when the flag was not on the command line and its variable is set.
fn name_the_variable(error: clap::Error, args: &[std::ffi::OsString]) -> clap::Error {
    use clap::{
        error::{ContextKind, ContextValue, ErrorKind},
        CommandFactory,
    };
    if !matches!(
        error.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return error;
    }
    let Some(ContextValue::String(shown)) = error.get(ContextKind::InvalidArg) else {
        return error;
    };
    let Some(long) = shown
        .split_whitespace()
        .next()
        .and_then(|f| f.strip_prefix("--"))
    else {
        return error;
    };
    let command = Cli::command();
    let Some(variable) = command
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .find(|arg| arg.get_long() == Some(long))
        .and_then(|arg| arg.get_env())
    else {
        return error;
    };
    let flag = format!("--{long}");
    let typed = args.iter().any(|arg| {
        let arg = arg.to_string_lossy();
        arg == flag.as_str() || arg.starts_with(&format!("{flag}="))
    });
    if typed || std::env::var_os(variable).is_none() {
        return error;
    }
    let rendered = error.render().to_string();
    let quoted = format!("'{shown}'");
    let named = rendered.replacen(
        &quoted,
        &format!("{quoted} (from {})", variable.to_string_lossy()),
        1,
    );
    clap::Error::raw(
        ErrorKind::ValueValidation,
        named.trim_start_matches("error: "),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The embedded in-memory coordinator.
    Memory,
    /// A NATS JetStream key-value bucket shared by every replica.
    Nats,
}

/// JetStream bucket names: letters, digits, `-` and `_`.
fn bucket_name(raw: &str) -> Result<String, String> {
    if !raw.is_empty()
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        Ok(raw.to_owned())
    } else {
        Err("must be letters, digits, '-' or '_'".into())
    }
}

/// `HOST:PORT` to listen on: an address (`0.0.0.0:50051`, `[::]:50051`) or
/// a name that resolves to one (`localhost:50051`, as the examples connect);
/// a name is resolved once, at startup, to its first address.
fn listen_address(raw: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = raw.parse() {
        return Ok(address);
    }
    let mut resolved = std::net::ToSocketAddrs::to_socket_addrs(raw)
        .map_err(|e| format!("expected HOST:PORT (0.0.0.0:50051, localhost:50051): {e}"))?;
    resolved
        .next()
        .ok_or_else(|| format!("{raw} resolves to no address"))
}

/// Parses `30s`, `5m`, `1h`, `1h30m`; zero is refused.
fn positive_duration(raw: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(raw).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(duration)
}

/// `--auth-tokens`: the file is read and checked while the flags are parsed,
/// so a bad one exits 2 naming the flag. The message names lines, never tokens.
fn token_file(raw: &str) -> Result<Tokens, String> {
    Tokens::load(Path::new(raw)).map_err(|e| e.to_string())
}

fn certificate_file(raw: &str) -> Result<Pem, String> {
    Pem::certificates(Path::new(raw))
}

fn private_key_file(raw: &str) -> Result<Pem, String> {
    Pem::private_key(Path::new(raw))
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to serve gRPC on. Loopback unless given (as etcd and Redis
    /// do): a coordinator is reachable from the network only when its
    /// operator says so, the container image and the manifests included.
    #[arg(long, env = "RESPCOORD_LISTEN", default_value = "127.0.0.1:50051",
          value_parser = listen_address)]
    pub listen: SocketAddr,

    /// Where sessions live: `memory` (this process is the one authority: run
    /// exactly one) or `nats` (a JetStream key-value bucket is the authority:
    /// run as many replicas as you like).
    #[arg(long, env = "RESPCOORD_BACKEND", value_enum, default_value_t = Backend::Memory)]
    pub backend: Backend,

    /// NATS server(s) for `--backend nats`, comma-separated
    /// (`nats://user:pass@host:4222`).
    #[arg(
        long,
        env = "RESPCOORD_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,

    /// The JetStream key-value bucket holding the sessions (created if absent).
    #[arg(long, env = "RESPCOORD_NATS_BUCKET", default_value = "respcoord",
          value_parser = bucket_name)]
    pub nats_bucket: String,

    /// JetStream replicas of the bucket when this process creates it (1, 3 or 5).
    #[arg(long, env = "RESPCOORD_NATS_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=5))]
    pub nats_replicas: u64,

    /// Entries kept per session in the bucket when this process creates it:
    /// how many transitions back a Watch `after_revision` can resume (JetStream
    /// caps it at 64).
    #[arg(long, env = "RESPCOORD_NATS_HISTORY", default_value_t = crate::nats::timings::HISTORY,
          value_parser = clap::value_parser!(u8).range(1..=i64::from(crate::nats::timings::MAX_HISTORY)))]
    pub nats_history: u8,

    /// Keep the bucket in NATS memory rather than on disk, when this process
    /// creates it (lost if every NATS node restarts at once).
    #[arg(long, env = "RESPCOORD_NATS_MEMORY_STORAGE")]
    pub nats_memory_storage: bool,

    /// Drop bucket messages older than this, when this process creates the
    /// bucket (reclaims forgotten sessions' purge markers). Must exceed
    /// --session-idle-ttl plus --tombstone-ttl by a margin; unset keeps all.
    #[arg(long, env = "RESPCOORD_NATS_MAX_AGE", value_parser = positive_duration)]
    pub nats_max_age: Option<Duration>,

    /// Longest one JetStream request may take before it is tried again.
    #[arg(long, env = "RESPCOORD_NATS_TIMEOUT", default_value = crate::nats::timings::request_timeout_text(),
          value_parser = positive_duration)]
    pub nats_timeout: Duration,

    /// How long a call rides out a NATS leader election or a timed-out
    /// request, retrying, before it is answered UNAVAILABLE (a client's own
    /// deadline ends it sooner). nats-server elects a new stream leader in
    /// 4 to 9 s after a crash.
    #[arg(long, env = "RESPCOORD_NATS_PATIENCE", default_value = crate::nats::timings::patience_text(),
          value_parser = positive_duration)]
    pub nats_patience: Duration,

    /// A NATS `.creds` file (user JWT and nkey seed) to authenticate with.
    #[arg(long, env = "RESPCOORD_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,

    /// A file holding a NATS user nkey seed to authenticate with.
    #[arg(long, env = "RESPCOORD_NATS_NKEY_SEED_FILE", value_name = "FILE")]
    pub nats_nkey_seed_file: Option<PathBuf>,

    /// NATS user name (with a password from --nats-password-file or
    /// RESPCOORD_NATS_PASSWORD).
    #[arg(long, env = "RESPCOORD_NATS_USER")]
    pub nats_user: Option<String>,

    /// A file holding the NATS user's password.
    #[arg(
        long,
        env = "RESPCOORD_NATS_PASSWORD_FILE",
        value_name = "FILE",
        conflicts_with = "nats_password"
    )]
    pub nats_password_file: Option<PathBuf>,

    /// The NATS user's password from the environment only (never a flag,
    /// which `ps` would show).
    #[arg(long = "nats-password-from-env", env = "RESPCOORD_NATS_PASSWORD",
          hide = true, hide_env_values = true, value_parser = secret)]
    pub nats_password: Option<Secret>,

    /// A file holding a NATS authentication token.
    #[arg(
        long,
        env = "RESPCOORD_NATS_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "nats_token"
    )]
    pub nats_token_file: Option<PathBuf>,

    /// A NATS token from the environment only (never a flag).
    #[arg(long = "nats-token-from-env", env = "RESPCOORD_NATS_TOKEN",
          hide = true, hide_env_values = true, value_parser = secret)]
    pub nats_token: Option<Secret>,

    /// Verify NATS servers against this CA bundle (PEM); implies TLS.
    #[arg(long, env = "RESPCOORD_NATS_TLS_CA", value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for mutual TLS with NATS; needs --nats-tls-key.
    #[arg(
        long,
        env = "RESPCOORD_NATS_TLS_CERT",
        value_name = "FILE",
        requires = "nats_tls_key"
    )]
    pub nats_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --nats-tls-cert.
    #[arg(
        long,
        env = "RESPCOORD_NATS_TLS_KEY",
        value_name = "FILE",
        requires = "nats_tls_cert"
    )]
    pub nats_tls_key: Option<PathBuf>,

    /// Require TLS to NATS even without --nats-tls-ca (servers verified
    /// against the platform's roots).
    #[arg(long, env = "RESPCOORD_NATS_TLS")]
    pub nats_tls: bool,

    /// A session no call names for this long is shut down with reason EXPIRED.
    #[arg(long, env = "RESPCOORD_SESSION_IDLE_TTL", default_value = "1h", value_parser = positive_duration)]
    pub session_idle_ttl: Duration,

    /// A terminated session is forgotten this long after it terminated.
    #[arg(long, env = "RESPCOORD_TOMBSTONE_TTL", default_value = "10m", value_parser = positive_duration)]
    pub tombstone_ttl: Duration,

    /// Most sessions (including terminated ones not yet forgotten).
    #[arg(long, env = "RESPCOORD_MAX_SESSIONS", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sessions: u64,

    /// Registry shards (independent locks); more shards, less contention.
    #[arg(long, env = "RESPCOORD_SHARDS", default_value_t = 96,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub shards: u64,

    /// Events retained per session for Watch `after_revision` resume.
    #[arg(long, env = "RESPCOORD_SESSION_HISTORY", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub session_history: u64,

    /// Events retained coordinator-wide for Watch `after_seq` resume.
    #[arg(long, env = "RESPCOORD_GLOBAL_HISTORY", default_value_t = 65_536,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub global_history: u64,

    /// Events a single-session watcher may fall behind before it is ended.
    #[arg(long, env = "RESPCOORD_SESSION_WATCH_BUFFER", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub session_watch_buffer: u64,

    /// Events a watch-all watcher may fall behind before it is ended.
    #[arg(long, env = "RESPCOORD_WATCH_ALL_BUFFER", default_value_t = 16_384,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub watch_all_buffer: u64,

    /// A quiet Watch stream gets a bookmark at least this often.
    #[arg(long, env = "RESPCOORD_BOOKMARK_INTERVAL", default_value = "10s", value_parser = positive_duration)]
    pub bookmark_interval: Duration,

    /// On SIGTERM, how long in-flight calls may take before the process exits anyway.
    #[arg(long, env = "RESPCOORD_SHUTDOWN_GRACE", default_value = "10s", value_parser = positive_duration)]
    pub shutdown_grace: Duration,

    /// Address of the metrics port: Prometheus `/metrics`, `/healthz`, `/readyz`
    /// over plain HTTP (unset: no metrics port).
    #[arg(long, env = "RESPCOORD_METRICS_LISTEN", value_parser = listen_address)]
    pub metrics_listen: Option<SocketAddr>,

    /// Serve the read-only web view (the sessions and each session's
    /// timeline, live) at /ui/ on the metrics port; with --auth-tokens it
    /// asks for a token and shows only that token's sessions.
    #[arg(long, env = "RESPCOORD_WEB_UI", requires = "metrics_listen")]
    pub web_ui: bool,

    /// Longest a call may run; a shorter `grpc-timeout` from the caller wins.
    #[arg(long, env = "RESPCOORD_REQUEST_TIMEOUT", default_value = "30s", value_parser = positive_duration)]
    pub request_timeout: Duration,

    /// Calls in flight at once; beyond it a call is answered UNAVAILABLE at once.
    #[arg(long, env = "RESPCOORD_MAX_CONCURRENT_CALLS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_concurrent_calls: u64,

    /// Largest request or response message, in bytes.
    #[arg(long, env = "RESPCOORD_MAX_MESSAGE_SIZE", default_value_t = 4 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1024..=1024 * 1024 * 1024))]
    pub max_message_size: u64,

    /// HTTP/2 PING interval on idle connections (dead peers are noticed).
    #[arg(long, env = "RESPCOORD_HTTP2_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = positive_duration)]
    pub http2_keepalive_interval: Duration,

    /// How long a PING may go unanswered before the connection is closed.
    #[arg(long, env = "RESPCOORD_HTTP2_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = positive_duration)]
    pub http2_keepalive_timeout: Duration,

    /// Concurrent HTTP/2 streams (calls and watches) per connection.
    #[arg(long, env = "RESPCOORD_MAX_CONCURRENT_STREAMS", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_streams: u32,

    /// Watch streams open at once; beyond it Watch is RESOURCE_EXHAUSTED.
    #[arg(long, env = "RESPCOORD_MAX_WATCHERS", default_value_t = 150_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_watchers: u64,

    /// Serve TLS with this PEM certificate chain (needs --tls-key).
    #[arg(long, env = "RESPCOORD_TLS_CERT", value_name = "PEM_FILE",
          value_parser = certificate_file, requires = "tls_key")]
    pub tls_cert: Option<Pem>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "RESPCOORD_TLS_KEY", value_name = "PEM_FILE",
          value_parser = private_key_file, requires = "tls_cert")]
    pub tls_key: Option<Pem>,

    /// Mutual TLS: require client certificates signed by these PEM CA certificates.
    #[arg(long, env = "RESPCOORD_TLS_CLIENT_CA", value_name = "PEM_FILE",
          value_parser = certificate_file, requires = "tls_cert")]
    pub tls_client_ca: Option<Pem>,

    /// Require `authorization: Bearer <token>` on coordinator calls, with the
    /// tokens (and their session id prefix scopes) listed in this file.
    #[arg(long, env = "RESPCOORD_AUTH_TOKENS", value_name = "FILE", value_parser = token_file)]
    pub auth_tokens: Option<Tokens>,

    /// Log line format.
    #[arg(long, env = "RESPCOORD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,

    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info,respcoord=debug`).
    #[arg(long, env = "RESPCOORD_LOG", default_value = "info")]
    pub log: String,
}

impl ServeArgs {
    pub fn registry_config(&self) -> CoordConfig {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        CoordConfig {
            shards: size(self.shards),
            max_sessions: size(self.max_sessions),
            idle_ttl: self.session_idle_ttl,
            tombstone_ttl: self.tombstone_ttl,
            session_history: size(self.session_history),
            global_history: size(self.global_history),
            session_watch_buffer: size(self.session_watch_buffer),
            watch_all_buffer: size(self.watch_all_buffer),
        }
    }

    /// The NATS backend's settings, with the password and token files read
    /// (their errors name the flag).
    pub fn nats_settings(&self) -> Result<NatsSettings, String> {
        let secret = |file: &Option<PathBuf>, env: &Option<Secret>, flag: &str| match (file, env) {
            (Some(path), _) => std::fs::read_to_string(path)
                .map(|text| Some(Secret::new(text.trim_end_matches(['\r', '\n']))))
                .map_err(|e| format!("{flag} {}: {e}", path.display())),
            (None, env) => Ok(env.clone()),
        };
        Ok(NatsSettings {
            url: self.nats_url.clone(),
            bucket: self.nats_bucket.clone(),
            replicas: usize::try_from(self.nats_replicas).unwrap_or(1),
            history: self.nats_history,
            request_timeout: self.nats_timeout,
            patience: self.nats_patience,
            security: NatsSecurity {
                creds_file: self.nats_creds.clone(),
                nkey_seed_file: self.nats_nkey_seed_file.clone(),
                user: self.nats_user.clone(),
                password: secret(
                    &self.nats_password_file,
                    &self.nats_password,
                    "--nats-password-file",
                )?,
                token: secret(&self.nats_token_file, &self.nats_token, "--nats-token-file")?,
                tls_ca: self.nats_tls_ca.clone(),
                tls_cert: self.nats_tls_cert.clone(),
                tls_key: self.nats_tls_key.clone(),
                tls_required: self.nats_tls,
            },
            memory_storage: self.nats_memory_storage,
            max_age: self.nats_max_age.unwrap_or_default(),
        })
    }

    pub fn watch_settings(&self) -> WatchSettings {
        WatchSettings {
            bookmark_interval: self.bookmark_interval,
            max_watchers: usize::try_from(self.max_watchers).unwrap_or(usize::MAX),
            ..WatchSettings::default()
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            request_timeout: self.request_timeout,
            max_concurrent_calls: usize::try_from(self.max_concurrent_calls).unwrap_or(usize::MAX),
            max_message_bytes: usize::try_from(self.max_message_size).unwrap_or(usize::MAX),
            http2_keepalive_interval: Some(self.http2_keepalive_interval),
            http2_keepalive_timeout: self.http2_keepalive_timeout,
            max_concurrent_streams: self.max_concurrent_streams,
        }
    }

    pub fn tls(&self) -> Option<TlsConfig> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsConfig {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            _ => None,
        }
    }
}

/// A secret from the environment, kept out of `Debug` output.
fn secret(value: &str) -> Result<Secret, String> {
    Ok(Secret::new(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let cli = Cli::try_parse_from(["respcoord", "serve"]).unwrap();
        let Command::Serve(args) = cli.command;
        assert_eq!(args.listen, "127.0.0.1:50051".parse().unwrap());
        assert_eq!(args.session_idle_ttl, Duration::from_secs(3600));
        assert_eq!(args.tombstone_ttl, Duration::from_secs(600));
        assert_eq!(args.max_sessions, 1_000_000);
        assert_eq!(args.bookmark_interval, Duration::from_secs(10));
    }

    #[test]
    fn listen_takes_an_address_or_a_name_and_names_the_flag_otherwise() {
        let parse = |listen: &str| {
            Cli::try_parse_from(["respcoord", "serve", "--listen", listen]).map(|cli| {
                let Command::Serve(args) = cli.command;
                args.listen
            })
        };
        assert_eq!(parse("[::1]:7000").unwrap(), "[::1]:7000".parse().unwrap());
        let named = parse("localhost:7001").unwrap();
        assert!(named.ip().is_loopback() && named.port() == 7001, "{named}");
        for bad in ["localhost", "nope:port", ":"] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains("--listen"), "{bad}: {error}");
        }
    }

    #[test]
    fn durations_parse_and_zero_is_refused() {
        let cli = Cli::try_parse_from([
            "respcoord",
            "serve",
            "--session-idle-ttl",
            "30s",
            "--tombstone-ttl",
            "5m",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command;
        assert_eq!(args.session_idle_ttl, Duration::from_secs(30));
        assert_eq!(args.tombstone_ttl, Duration::from_secs(300));
        let err =
            Cli::try_parse_from(["respcoord", "serve", "--session-idle-ttl", "0s"]).unwrap_err();
        assert!(err.to_string().contains("--session-idle-ttl"), "{err}");
        let err = Cli::try_parse_from(["respcoord", "serve", "--max-sessions", "0"]).unwrap_err();
        assert!(err.to_string().contains("--max-sessions"), "{err}");
    }
}
