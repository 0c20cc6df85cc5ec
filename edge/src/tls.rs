//! TLS material of the edge and the rustls configurations built from it.
//!
//! An edge given no certificate runs its own small CA: on first start it
//! generates a CA key and certificate and persists them in
//! `<data dir>/tls/` (`ca.pem`, `ca.key`, the key readable by the owner
//! only). On every start it issues a fresh server certificate from that CA
//! for the names it serves. Agents and API clients trust `ca.pem` (a CA file
//! flag), so the server certificate may change — names added, a later
//! rotation — without touching them. The client side, a configuration that
//! trusts such a CA file, is `tuna_agent::tls::client_config_trusting`.
//!
//! Every configuration built here names the ring provider explicitly, so it
//! works whether or not a process-wide default provider was installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// Folder of the generated CA inside the data dir.
pub const TLS_DIR: &str = "tls";
/// The generated CA certificate clients trust.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The generated CA private key.
pub const CA_KEY_FILE: &str = "ca.key";

/// ALPN of a server that speaks HTTP/2 and HTTP/1.1.
pub const ALPN_H2_HTTP1: &[&[u8]] = &[b"h2", b"http/1.1"];

/// A certificate chain and its private key.
pub struct ServerIdentity {
    /// Leaf first.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
    /// The CA file clients should trust, when the edge generated it.
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("certificates", &self.cert_chain.len())
            .field("key", &"***")
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

fn tls_error(what: &str) -> impl FnOnce(rcgen::Error) -> Error + '_ {
    move |e| Error::Tls(format!("{what}: {e}"))
}

/// The CA's parameters. They are rebuilt identically on each start: an
/// issuer needs only its name and key to sign, so the CA certificate itself
/// never has to be parsed back.
fn ca_params() -> Result<CertificateParams> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(tls_error("CA parameters"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Tuna edge CA");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "tuna-operator self-hosted edge");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(Error::file(path))?;
    file.write_all(contents.as_bytes())
        .map_err(Error::file(path))?;
    file.sync_all().map_err(Error::file(path))
}

/// Loads the edge's CA from `<data_dir>/tls/` (generating it on first use)
/// and issues a server certificate for `names` (host names or IP
/// addresses; `localhost`, `127.0.0.1` and `::1` are always included).
pub fn self_signed_identity(data_dir: &Path, names: &[String]) -> Result<ServerIdentity> {
    let dir = data_dir.join(TLS_DIR);
    std::fs::create_dir_all(&dir).map_err(Error::file(&dir))?;
    let ca_cert_path = dir.join(CA_CERT_FILE);
    let ca_key_path = dir.join(CA_KEY_FILE);

    let ca_key = if ca_key_path.exists() {
        let pem = std::fs::read_to_string(&ca_key_path).map_err(Error::file(&ca_key_path))?;
        KeyPair::from_pem(&pem).map_err(tls_error("reading the CA key"))?
    } else {
        let key = KeyPair::generate().map_err(tls_error("generating the CA key"))?;
        let cert = ca_params()?
            .self_signed(&key)
            .map_err(tls_error("signing the CA certificate"))?;
        // Key first: a crash between the two writes leaves a key without a
        // certificate, which the branch below completes.
        write_private(&ca_key_path, &key.serialize_pem())?;
        std::fs::write(&ca_cert_path, cert.pem()).map_err(Error::file(&ca_cert_path))?;
        key
    };
    if !ca_cert_path.exists() {
        let cert = ca_params()?
            .self_signed(&ca_key)
            .map_err(tls_error("signing the CA certificate"))?;
        std::fs::write(&ca_cert_path, cert.pem()).map_err(Error::file(&ca_cert_path))?;
    }
    let ca_der = CertificateDer::from_pem_file(&ca_cert_path)
        .map_err(|e| Error::Tls(format!("{}: {e}", ca_cert_path.display())))?;

    let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for name in names {
        if !sans.contains(name) {
            sans.push(name.clone());
        }
    }
    let mut params = CertificateParams::new(sans).map_err(tls_error("server certificate names"))?;
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().map_or("localhost", String::as_str),
    );
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = KeyPair::generate().map_err(tls_error("generating the server key"))?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let leaf = params
        .signed_by(&leaf_key, &issuer)
        .map_err(tls_error("signing the server certificate"))?;
    Ok(ServerIdentity {
        cert_chain: vec![leaf.der().clone(), ca_der],
        key: PrivateKeyDer::try_from(leaf_key.serialize_der())
            .map_err(|e| Error::Tls(format!("server key: {e}")))?,
        ca_file: Some(ca_cert_path),
    })
}

/// Loads a PEM certificate chain and private key (e.g. a wildcard
/// certificate for the base domain given by flags).
pub fn pem_identity(cert_file: &Path, key_file: &Path) -> Result<ServerIdentity> {
    let cert_chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::Tls(format!("{}: {e}", cert_file.display())))?;
    if cert_chain.is_empty() {
        return Err(Error::Tls(format!(
            "{}: no CERTIFICATE block found",
            cert_file.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| Error::Tls(format!("{}: {e}", key_file.display())))?;
    Ok(ServerIdentity {
        cert_chain,
        key,
        ca_file: None,
    })
}

/// A rustls server configuration for `identity`, offering `alpn`.
pub fn server_config(
    identity: &ServerIdentity,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(identity.cert_chain.clone(), identity.key.clone_key())
    .map_err(|e| Error::Tls(format!("certificate and key do not match: {e}")))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tuna_agent::tls::client_config_trusting;

    #[test]
    fn ca_is_persisted_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = self_signed_identity(dir.path(), &["edge.tuna.test".into()]).unwrap();
        let ca_pem = std::fs::read(dir.path().join("tls/ca.pem")).unwrap();
        let second = self_signed_identity(dir.path(), &["other.tuna.test".into()]).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("tls/ca.pem")).unwrap(),
            ca_pem
        );
        assert_eq!(first.cert_chain[1], second.cert_chain[1]);
        assert_ne!(first.cert_chain[0], second.cert_chain[0]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("tls/ca.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "CA key must be private");
        }
        // Both identities load into a server config, and the CA file into a client config.
        server_config(&first, ALPN_H2_HTTP1).unwrap();
        client_config_trusting(&dir.path().join("tls/ca.pem")).unwrap();
        assert!(format!("{first:?}").contains("***"));
    }

    /// What a client that dials the edge by an IP address checks: the
    /// generated certificate, verified by rustls against `ca.pem` for that
    /// address, holds for the names it was issued for and no other.
    #[test]
    fn the_generated_certificate_holds_for_the_given_ip_addresses_only() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{ServerName, UnixTime};
        let dir = tempfile::tempdir().unwrap();
        let identity = self_signed_identity(
            dir.path(),
            &["edge.tuna.test".into(), "198.19.254.1".into()],
        )
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(identity.cert_chain[1].clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let verify = |name: &str| {
            verifier.verify_server_cert(
                &identity.cert_chain[0],
                &identity.cert_chain[1..],
                &ServerName::try_from(name.to_owned()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        for good in ["198.19.254.1", "127.0.0.1", "localhost", "edge.tuna.test"] {
            verify(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in ["198.19.254.2", "other.tuna.test"] {
            assert!(verify(bad).is_err(), "{bad} must not be valid");
        }
    }

    #[test]
    fn pem_files_given_by_flags_load_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["*.tuna.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let identity = pem_identity(&cert_file, &key_file).unwrap();
        assert_eq!(identity.cert_chain, [cert.der().clone()]);
        assert!(identity.ca_file.is_none());
        server_config(&identity, ALPN_H2_HTTP1).unwrap();

        // A key that does not match the certificate, an empty file, a missing file.
        let other_key = dir.path().join("other.key");
        std::fs::write(&other_key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let mismatched = pem_identity(&cert_file, &other_key).unwrap();
        assert!(server_config(&mismatched, ALPN_H2_HTTP1).is_err());
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(pem_identity(&empty, &key_file).is_err());
        assert!(client_config_trusting(&empty).is_err());
        assert!(pem_identity(&dir.path().join("missing.pem"), &key_file).is_err());
    }
}
