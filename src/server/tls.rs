//! TLS from PEM files: the certificate chain, its private key and the
//! optional client CA of mutual TLS, each read and checked when the flags are
//! parsed (`config`), so a bad file is refused at startup naming the flag.

use std::{fmt, path::Path, sync::Arc};

use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use super::ServeError;

/// PEM text read from a file. `Debug` shows only its size: a private key
/// never reaches a log.
#[derive(Clone)]
pub struct Pem(Arc<[u8]>);

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pem({} bytes)", self.0.len())
    }
}

impl Pem {
    /// A file of one or more PEM certificates (a chain, or CA roots).
    pub fn certificates(path: &Path) -> Result<Self, String> {
        let pem = read(path)?;
        let mut count = 0;
        for certificate in CertificateDer::pem_slice_iter(&pem) {
            certificate.map_err(|e| format!("not a PEM certificate file: {e}"))?;
            count += 1;
        }
        if count == 0 {
            return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) in the file".into());
        }
        Ok(Self(pem.into()))
    }

    /// A file holding a PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub fn private_key(path: &Path) -> Result<Self, String> {
        let pem = read(path)?;
        // The parse error never quotes the key.
        PrivateKeyDer::from_pem_slice(&pem).map_err(|_| "no PEM private key in the file")?;
        Ok(Self(pem.into()))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read: {e}"))
}

/// TLS from PEM files; mutual TLS when `client_ca` is set (clients must
/// present a certificate it signed).
#[derive(Clone, Debug)]
pub struct TlsConfig {
    pub cert: Pem,
    pub key: Pem,
    pub client_ca: Option<Pem>,
}

impl TlsConfig {
    pub(super) fn server_config(&self) -> ServerTlsConfig {
        let config =
            ServerTlsConfig::new().identity(Identity::from_pem(&*self.cert.0, &*self.key.0));
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(&*ca.0)),
            None => config,
        }
    }

    /// Builds the rustls configuration once, to refuse a bad one at startup
    /// (a key that does not match the certificate, ...).
    pub fn check(&self) -> Result<(), ServeError> {
        Server::builder().tls_config(self.server_config())?;
        Ok(())
    }
}
