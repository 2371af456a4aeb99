//! Throwaway certificate authorities for TLS tests: a CA and leaf
//! certificates it signs (`tests/client.rs`, `tests/ops_security.rs`,
//! `examples/scenario_fixture.rs`).

use std::path::Path;

pub struct Ca {
    pub pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Result<Self, rcgen::Error> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let pem = params.self_signed(&key)?.pem();
        Ok(Self {
            pem,
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// A leaf certificate for `name` (also its DNS SAN): (cert PEM, key PEM).
    pub fn leaf(&self, name: &str) -> Result<(String, String), rcgen::Error> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()])?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// The files of the mutual-TLS scenario (clients/scenarios/README.md):
/// a server CA and its `localhost` leaf, a client CA and its `gateway-1` leaf.
pub fn write_mutual_tls_files(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let (server_ca, client_ca) = (Ca::new("server CA")?, Ca::new("client CA")?);
    let (server, server_key) = server_ca.leaf("localhost")?;
    let (gateway, gateway_key) = client_ca.leaf("gateway-1")?;
    std::fs::create_dir_all(dir)?;
    for (name, contents) in [
        ("server-ca.pem", &server_ca.pem),
        ("server.pem", &server),
        ("server-key.pem", &server_key),
        ("client-ca.pem", &client_ca.pem),
        ("gateway.pem", &gateway),
        ("gateway-key.pem", &gateway_key),
    ] {
        std::fs::write(dir.join(name), contents)?;
    }
    Ok(())
}
