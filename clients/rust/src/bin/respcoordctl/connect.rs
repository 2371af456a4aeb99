//! The connection flags: where and how respcoordctl connects. Each flag has
//! a `RESPCOORDCTL_*` variable; the token itself is read from `--token-file`
//! or, failing that, the `RESPCOORDCTL_TOKEN` variable (never a flag, so it
//! does not show in `ps`).

use std::{path::PathBuf, time::Duration};

use respcoord_client::{ClientError, ConnectOptions, TlsOptions, DEFAULT_ENDPOINT};

/// The connection flags of every command.
#[derive(Clone, Debug, clap::Args)]
pub struct ConnectArgs {
    /// The coordinator: http://host:port, https://host:port or host:port.
    #[arg(long, env = "RESPCOORDCTL_ENDPOINT", default_value = DEFAULT_ENDPOINT, global = true)]
    pub endpoint: String,

    /// PEM file of the CA to trust (turns TLS on; default: platform roots for https).
    #[arg(long, env = "RESPCOORDCTL_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --tls-key).
    #[arg(long, env = "RESPCOORDCTL_TLS_CERT", global = true)]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for mutual TLS (with --tls-cert).
    #[arg(long, env = "RESPCOORDCTL_TLS_KEY", global = true)]
    pub tls_key: Option<PathBuf>,

    /// Server name to verify the certificate against, if not the endpoint's host.
    #[arg(long, env = "RESPCOORDCTL_TLS_DOMAIN", global = true)]
    pub tls_domain: Option<String>,

    /// File holding the bearer token (default: the RESPCOORDCTL_TOKEN variable).
    #[arg(long, env = "RESPCOORDCTL_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,

    /// Deadline of each command's calls, retries included (e.g. 5s, 500ms).
    #[arg(long, env = "RESPCOORDCTL_TIMEOUT", default_value = "10s",
          value_parser = humantime::parse_duration, global = true)]
    pub timeout: Duration,
}

/// The environment variable holding the token when no --token-file is given.
pub const TOKEN_ENV: &str = "RESPCOORDCTL_TOKEN";

impl ConnectArgs {
    pub fn options(&self) -> Result<ConnectOptions, ClientError> {
        let token = match &self.token_file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                ClientError::Config(format!("--token-file: {}: {e}", path.display()))
            })?),
            None => std::env::var(TOKEN_ENV)
                .ok()
                .filter(|t| !t.trim().is_empty()),
        };
        let mut options = ConnectOptions::new(self.endpoint.clone()).with_tls(TlsOptions {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            domain: self.tls_domain.clone(),
        });
        options.token = token.map(|t| t.trim().to_owned());
        options.connect_timeout = self.timeout.min(options.connect_timeout);
        options.retry.deadline = self.timeout;
        options.retry.attempt_timeout = self.timeout.min(options.retry.attempt_timeout);
        Ok(options)
    }
}
