//! Where and how to connect: endpoint, TLS (rustls, optionally mTLS), and a
//! bearer token sent as `authorization` metadata on every call.

use std::{path::PathBuf, time::Duration};

use tonic::{
    metadata::{Ascii, MetadataValue},
    service::{interceptor::InterceptedService, Interceptor},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
    Request, Status,
};

use super::{ClientError, RetryPolicy};
use respcoord_proto::v1::response_coordinator_client::ResponseCoordinatorClient;

/// The generated client with the token interceptor.
pub type RawClient = ResponseCoordinatorClient<InterceptedService<Channel, Auth>>;

/// The default endpoint: a coordinator on this machine.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:50051";

/// TLS settings. Any of them, or an `https://` endpoint, turns TLS on.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// PEM file of the CA(s) to trust. Without it the platform's roots are used.
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain and key, for mutual TLS (both or neither).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name to verify the server's certificate against, when it is not
    /// the endpoint's host.
    pub domain: Option<String>,
}

impl TlsOptions {
    fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.domain.is_some()
    }
}

/// Everything [`super::Client::connect`] needs.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// `http://host:port`, `https://host:port`, or `host:port` (https when
    /// TLS options are given, http otherwise).
    pub endpoint: String,
    pub tls: TlsOptions,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub token: Option<String>,
    /// How long establishing a connection may take.
    pub connect_timeout: Duration,
    /// Retries and deadlines of calls.
    pub retry: RetryPolicy,
    /// How long a session's watch stays open after this client's last
    /// response there ended (or after [`super::Session::open_watch`]), so
    /// that the next Start finds it open and a stop right after that Start
    /// needs no Watch set-up. Zero closes it with the last response.
    pub watch_linger: Duration,
}

/// [`ConnectOptions::watch_linger`]'s default: longer than the pause
/// between a conversation's turns, short against a session's life.
pub const DEFAULT_WATCH_LINGER: Duration = Duration::from_secs(30);

impl ConnectOptions {
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            tls: TlsOptions::default(),
            token: None,
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            watch_linger: DEFAULT_WATCH_LINGER,
        }
    }

    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn with_watch_linger(mut self, linger: Duration) -> Self {
        self.watch_linger = linger;
        self
    }

    /// The endpoint URI with its scheme settled.
    fn uri(&self) -> Result<String, ClientError> {
        let raw = self.endpoint.trim();
        if raw.is_empty() {
            return Err(ClientError::Config("--endpoint: must not be empty".into()));
        }
        if raw.starts_with("http://") {
            if self.tls.any() {
                return Err(ClientError::Config(format!(
                    "--endpoint: {raw} is plaintext but TLS options are set; use https://"
                )));
            }
            Ok(raw.to_owned())
        } else if raw.starts_with("https://") {
            Ok(raw.to_owned())
        } else if raw.contains("://") {
            Err(ClientError::Config(format!(
                "--endpoint: {raw}: the scheme must be http or https"
            )))
        } else if self.tls.any() {
            Ok(format!("https://{raw}"))
        } else {
            Ok(format!("http://{raw}"))
        }
    }

    pub(crate) fn endpoint(&self) -> Result<Endpoint, ClientError> {
        let uri = self.uri()?;
        let mut endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| ClientError::Config(format!("--endpoint: {uri}: {e}")))?
            .connect_timeout(self.connect_timeout)
            // Unary replies are small: without TCP_NODELAY their trailing
            // frames wait on Nagle's algorithm.
            .tcp_nodelay(true)
            // Notice a dead peer on an otherwise quiet connection (the watch).
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if uri.starts_with("https://") {
            endpoint = endpoint
                .tls_config(self.tls_config()?)
                .map_err(|e| ClientError::Config(format!("TLS: {e}")))?;
        }
        Ok(endpoint)
    }

    fn tls_config(&self) -> Result<ClientTlsConfig, ClientError> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| ClientError::Config(format!("{flag}: {}: {e}", path.display())))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.tls.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read("--tls-ca", ca)?)),
            None => config.with_enabled_roots(),
        };
        match (&self.tls.cert, &self.tls.key) {
            (Some(cert), Some(key)) => {
                config = config.identity(Identity::from_pem(
                    read("--tls-cert", cert)?,
                    read("--tls-key", key)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(ClientError::Config(
                    "--tls-cert and --tls-key go together (mutual TLS needs both)".into(),
                ))
            }
        }
        if let Some(domain) = &self.tls.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }

    pub(crate) fn auth(&self) -> Result<Auth, ClientError> {
        match &self.token {
            None => Ok(Auth(None)),
            Some(token) => {
                let token = token.trim();
                if token.is_empty() {
                    return Err(ClientError::Config("token: must not be empty".into()));
                }
                let mut value: MetadataValue<Ascii> = format!("Bearer {token}")
                    .parse()
                    .map_err(|_| ClientError::Config("token: must be printable ASCII".into()))?;
                value.set_sensitive(true);
                Ok(Auth(Some(value)))
            }
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call, when there is a token.
#[derive(Clone, Debug)]
pub struct Auth(Option<MetadataValue<Ascii>>);

impl Interceptor for Auth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(
            ConnectOptions::new("127.0.0.1:1").uri().unwrap(),
            "http://127.0.0.1:1"
        );
        let tls = TlsOptions {
            domain: Some("coord".into()),
            ..TlsOptions::default()
        };
        assert_eq!(
            ConnectOptions::new("h:1")
                .with_tls(tls.clone())
                .uri()
                .unwrap(),
            "https://h:1"
        );
        assert!(ConnectOptions::new("http://h:1")
            .with_tls(tls)
            .uri()
            .is_err());
        assert!(ConnectOptions::new("ftp://h:1").uri().is_err());
        assert!(ConnectOptions::new(" ").uri().is_err());
    }

    #[test]
    fn mtls_needs_both_halves() {
        let options = ConnectOptions::new("https://h:1").with_tls(TlsOptions {
            cert: Some("/nonexistent/cert.pem".into()),
            ..TlsOptions::default()
        });
        let err = options.tls_config().unwrap_err().to_string();
        assert!(err.contains("--tls-key"), "{err}");
    }

    #[test]
    fn missing_ca_file_names_the_flag() {
        let options = ConnectOptions::new("https://h:1").with_tls(TlsOptions {
            ca: Some("/nonexistent/ca.pem".into()),
            ..TlsOptions::default()
        });
        let err = options.endpoint().unwrap_err().to_string();
        assert!(err.contains("--tls-ca"), "{err}");
    }

    #[test]
    fn token_becomes_a_sensitive_bearer_header() {
        let mut auth = ConnectOptions::new("h:1")
            .with_token(" s3cret\n")
            .auth()
            .unwrap();
        let request = auth.call(Request::new(())).unwrap();
        let value = request.metadata().get("authorization").unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer s3cret");
        assert!(value.is_sensitive());
        assert!(ConnectOptions::new("h:1")
            .with_token("a\u{7}b")
            .auth()
            .is_err());
        let mut none = ConnectOptions::new("h:1").auth().unwrap();
        assert!(none
            .call(Request::new(()))
            .unwrap()
            .metadata()
            .get("authorization")
            .is_none());
    }
}
