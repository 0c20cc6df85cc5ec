//! TLS of the HTTPS listeners of a Gateway's own address: the edge carries
//! the client's TLS stream unterminated through the tunnel, and the proxy
//! terminates it here with the certificate of the listener that the
//! client's SNI selects (the same most-specific rule as the port's routes:
//! [`tuna_routing::ListenerHostnames`]). The private key never leaves the
//! cluster.

use crate::error::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::sync::Arc;
use tuna_routing::ListenerHostnames;

/// A listener's certificate chain and its private key, checked to belong
/// together and ready to serve. `Debug` shows neither the key nor the
/// certificates; two are equal when their chains are (a new key comes
/// with a new certificate).
#[derive(Clone)]
pub struct ServerCertificate {
    key: Arc<CertifiedKey>,
}

impl std::fmt::Debug for ServerCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCertificate")
            .field("chain_len", &self.key.cert.len())
            .finish_non_exhaustive()
    }
}

impl PartialEq for ServerCertificate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.key, &other.key) || self.key.cert == other.key.cert
    }
}

impl Eq for ServerCertificate {}

impl ServerCertificate {
    /// Reads a PEM certificate chain (leaf first, as `tls.crt` of a
    /// `kubernetes.io/tls` Secret holds it) and a PEM private key (PKCS#8,
    /// PKCS#1 or SEC1: `tls.key`). Fails with a reason that names neither
    /// value's content when either does not parse, the key type is not
    /// supported, or the key is not the certificate's.
    pub fn from_pem(chain: &[u8], key: &[u8]) -> Result<Self> {
        let bad = |m: String| Error::InvalidCertificate(m);
        let chain = CertificateDer::pem_slice_iter(chain)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| bad("tls.crt holds no PEM certificate".into()))?;
        if chain.is_empty() {
            return Err(bad("tls.crt holds no PEM certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|_| bad("tls.key holds no PEM private key".into()))?;
        let key = CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => {
                    bad("tls.key is not the key of the certificate in tls.crt".into())
                }
                other => bad(format!("tls.key cannot be used: {other}")),
            })?;
        Ok(Self { key: Arc::new(key) })
    }

    /// The certificate chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.key.cert
    }
}

/// Picks a listener's certificate by SNI; a client without SNI gets the
/// certificate of the listener without a hostname, if any.
#[derive(Debug)]
struct BySni(ListenerHostnames<Arc<CertifiedKey>>);

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.get(hello.server_name().unwrap_or("")).cloned()
    }
}

/// The TLS configuration of a port whose listeners have certificates
/// (`hostname`, certificate), in the listeners' order: the first of two
/// listeners with one hostname serves it. `None` when none has one.
pub(crate) fn acceptor<'a>(
    listeners: impl IntoIterator<Item = (Option<&'a str>, &'a ServerCertificate)>,
) -> Result<Option<Arc<rustls::ServerConfig>>> {
    let mut by_sni = ListenerHostnames::default();
    for (hostname, certificate) in listeners {
        by_sni.insert(hostname, Arc::clone(&certificate.key));
    }
    if by_sni.is_empty() {
        return Ok(None);
    }
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::InvalidCertificate(e.to_string()))?
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(BySni(by_sni)));
    // h2 (gRPC) and HTTP/1.1: the port's streams are served as a plain
    // port's are, h2 by its preface.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(Arc::new(config)))
}

/// How long a client of an HTTPS listener may take to finish its handshake.
pub(crate) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
