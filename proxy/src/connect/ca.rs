//! The CA of a CONNECT listener and the certificates it signs for the hosts
//! clients CONNECT to.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::grant::Credential;
use crate::error::{Error, Result};

/// How long a leaf certificate is valid; it is re-signed when half of it is
/// gone, so a client never meets an expired one.
const LEAF_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Clock skew allowed for, backwards, on every certificate.
const BACKDATE: Duration = Duration::from_secs(3600);
/// How long a generated CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Most hosts with a cached certificate (the cache is emptied when full).
/// Hosts are those of granted CONNECTs only, i.e. connector addresses.
const MAX_CACHED: usize = 1024;

/// A CA certificate and its private key, PEM-encoded (how a Secret keeps them).
#[derive(Clone)]
pub struct CaPem {
    /// The certificate (`tls.crt`): what clients trust.
    pub cert_pem: String,
    /// The private key (`tls.key`).
    pub key_pem: Credential,
}

impl std::fmt::Debug for CaPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaPem")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &self.key_pem)
            .finish()
    }
}

struct Leaf {
    config: Arc<rustls::ServerConfig>,
    renew_at: Instant,
}

/// Signs, and caches, a certificate for each host a client CONNECTs to.
pub struct InterceptCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    leaves: Mutex<HashMap<String, Leaf>>,
}

impl std::fmt::Debug for InterceptCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterceptCa").finish_non_exhaustive()
    }
}

fn tls_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |e| Error::InvalidCertificate(format!("{what}: {e}"))
}

fn offset(d: Duration, forward: bool) -> time::OffsetDateTime {
    let now = time::OffsetDateTime::now_utc();
    let d = time::Duration::try_from(d).unwrap_or(time::Duration::ZERO);
    if forward { now + d } else { now - d }
}

impl InterceptCa {
    /// Generates a new CA (ECDSA P-256, valid ten years) named `common_name`.
    /// Keep the returned PEM (in a Secret) and load it with [`Self::from_pem`]
    /// afterwards: kubeconfigs carry its certificate.
    pub fn generate(common_name: &str) -> Result<CaPem> {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(tls_error("CA parameters"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "tuna-operator connectors");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = offset(BACKDATE, false);
        params.not_after = offset(CA_VALIDITY, true);
        let key = KeyPair::generate().map_err(tls_error("generating the CA key"))?;
        let cert = params
            .self_signed(&key)
            .map_err(tls_error("signing the CA certificate"))?;
        Ok(CaPem {
            cert_pem: cert.pem(),
            key_pem: Credential::new(key.serialize_pem()),
        })
    }

    /// Loads a CA from its PEM certificate and key.
    pub fn from_pem(pem: &CaPem) -> Result<Self> {
        let key = KeyPair::from_pem(pem.key_pem.expose()).map_err(tls_error("the CA key"))?;
        let issuer = Issuer::from_ca_cert_pem(&pem.cert_pem, key)
            .map_err(tls_error("the CA certificate"))?;
        let ca = Self {
            issuer,
            cert_pem: pem.cert_pem.clone(),
            leaves: Mutex::new(HashMap::new()),
        };
        ca.check_key_matches()?;
        Ok(ca)
    }

    /// A key that is not the certificate's would sign certificates no client
    /// accepts: sign one and verify it as a client would.
    fn check_key_matches(&self) -> Result<()> {
        use rustls::pki_types::pem::PemObject;
        let ca_der = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| Error::InvalidCertificate(format!("the CA certificate: {e}")))?;
        let (leaf, _) = self.sign_leaf("localhost")?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(ca_der)
            .map_err(|e| Error::InvalidCertificate(format!("the CA certificate: {e}")))?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .map_err(|e| Error::InvalidCertificate(e.to_string()))?;
        use rustls::client::danger::ServerCertVerifier as _;
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &rustls::pki_types::ServerName::try_from("localhost").expect("a valid name"),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .map_err(|e| {
                Error::InvalidCertificate(format!(
                    "the CA key does not belong to the CA certificate: {e}"
                ))
            })?;
        Ok(())
    }

    /// The CA certificate (PEM): what clients trust
    /// (`certificate-authority-data` of a kubeconfig).
    pub fn certificate_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A server configuration presenting a certificate for `host` (a DNS name,
    /// or an IP address: then an IP SAN), offering `http/1.1`. Cached per host.
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>> {
        let now = Instant::now();
        {
            let leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(leaf) = leaves.get(host)
                && leaf.renew_at > now
            {
                return Ok(leaf.config.clone());
            }
        }
        let config = self.sign(host)?;
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if leaves.len() >= MAX_CACHED {
            leaves.clear();
        }
        leaves.insert(
            host.to_owned(),
            Leaf {
                config: config.clone(),
                renew_at: now + LEAF_VALIDITY / 2,
            },
        );
        Ok(config)
    }

    fn sign(&self, host: &str) -> Result<Arc<rustls::ServerConfig>> {
        let (cert, key_der) = self.sign_leaf(host)?;
        let chain: Vec<CertificateDer<'static>> = vec![cert];
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidCertificate(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| Error::InvalidCertificate(e.to_string()))?;
        // Upgrades (exec, port-forward) need HTTP/1.1, and the proxy's
        // pinned path speaks HTTP/1.1 upstream.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    fn sign_leaf(&self, host: &str) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(tls_error("certificate parameters"))?;
        let san = match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.to_owned()
                    .try_into()
                    .map_err(tls_error("the host name"))?,
            ),
        };
        params.subject_alt_names = vec![san];
        params.distinguished_name.push(DnType::CommonName, host);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = offset(BACKDATE, false);
        params.not_after = offset(LEAF_VALIDITY, true);
        let key = KeyPair::generate().map_err(tls_error("generating a certificate key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(tls_error("signing a certificate"))?;
        let key_der = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| Error::InvalidCertificate(format!("certificate key: {e}")))?;
        Ok((cert.der().clone(), key_der))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_survives_its_pem_and_signs_names_and_ips() {
        let pem = InterceptCa::generate("test CA").unwrap();
        assert!(!format!("{pem:?}").contains("PRIVATE KEY"));
        let ca = InterceptCa::from_pem(&pem).unwrap();
        assert_eq!(ca.certificate_pem(), pem.cert_pem);
        let a = ca.server_config("192.168.1.100").unwrap();
        let b = ca.server_config("192.168.1.100").unwrap();
        assert!(Arc::ptr_eq(&a, &b), "cached per host");
        ca.server_config("api.example.com").unwrap();
        ca.server_config("::1").unwrap();
        assert_eq!(a.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let bad = CaPem {
            cert_pem: pem.cert_pem.clone(),
            key_pem: Credential::new("not a key"),
        };
        assert!(InterceptCa::from_pem(&bad).is_err());
        let other = InterceptCa::generate("other CA").unwrap();
        let mismatched = CaPem {
            cert_pem: pem.cert_pem.clone(),
            key_pem: other.key_pem,
        };
        let err = InterceptCa::from_pem(&mismatched).unwrap_err().to_string();
        assert!(err.contains("does not belong"), "{err}");
    }
}
