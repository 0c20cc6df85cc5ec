//! TLS client set-up: the agent's connection to the edge, and the trust of
//! the REST client ([`client_config_trusting`]). Every configuration built
//! here names the ring provider explicitly, so it works whether or not a
//! process-wide default provider was installed.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::TlsConnector;
use tuna_protocol::wire::ALPN;

use crate::config::{AgentConfig, Trust};
use crate::error::{Error, Result};

/// Builds the connector with the ring provider explicitly, so the agent does
/// not depend on a process-wide default provider being installed.
pub(crate) fn connector(trust: &Trust) -> Result<TlsConnector> {
    let mut roots = RootCertStore::empty();
    match trust {
        Trust::CaPem(pem) => add_pem(&mut roots, pem)?,
        Trust::CaFile(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                Error::Config(format!("cannot read CA file {}: {e}", path.display()))
            })?;
            add_pem(&mut roots, &pem)?;
        }
        Trust::SystemRoots => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A broken system certificate must not stop the agent.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(Error::Tls(
                    "no usable certificate in the system trust store".into(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

fn add_pem(roots: &mut RootCertStore, pem: &[u8]) -> Result<()> {
    let mut added = 0;
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| Error::Tls(format!("bad PEM certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| Error::Tls(format!("unusable CA certificate: {e}")))?;
        added += 1;
    }
    if added == 0 {
        return Err(Error::Tls("the CA PEM holds no certificate".into()));
    }
    Ok(())
}

/// The name to verify: the configured one, else the host part of the address.
pub(crate) fn server_name(config: &AgentConfig) -> Result<ServerName<'static>> {
    let name = match &config.server_name {
        Some(name) => name.clone(),
        None => {
            let addr = &config.edge_addr;
            let host = match addr.rsplit_once(':') {
                Some((host, port)) if port.parse::<u16>().is_ok() => host,
                _ => {
                    return Err(Error::Config(format!(
                        "edge address {addr:?} is not host:port"
                    )));
                }
            };
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        }
    };
    ServerName::try_from(name.clone())
        .map_err(|_| Error::Config(format!("{name:?} is not a valid TLS server name")))
}

/// A rustls client configuration that trusts exactly the CA certificates in
/// `ca_file` (PEM), without ALPN (callers set what they speak).
pub fn client_config_trusting(ca_file: &Path) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::Tls(format!("CA file {}: {e}", ca_file.display())))?;
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| Error::Tls(format!("CA file {}: {e}", ca_file.display())))?;
    }
    if roots.is_empty() {
        return Err(Error::Tls(format!(
            "CA file {}: no CERTIFICATE block found",
            ca_file.display()
        )));
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth())
}
