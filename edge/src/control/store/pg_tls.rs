//! How the connection to PostgreSQL is secured: libpq's `sslmode` and
//! `sslrootcert` in the `--store` URL, carried out by rustls
//! (`tokio-postgres-rustls`).
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default, as in libpq) | when the server offers it | not checked |
//! | `require` | always | not checked; with `sslrootcert`, as `verify-ca` (libpq does the same) |
//! | `verify-ca` | always | chains to `sslrootcert` |
//! | `verify-full` | always | chains to `sslrootcert` and names the URL's host |
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the
//! machine's trust store. Only `verify-full` stops an active attacker on the
//! path to the database, who could otherwise answer as the store and feed
//! every replica keys and reservations of their choosing; the other modes
//! are reported at start when the host is not on this machine. A server whose
//! certificate does not verify is refused in the handshake, before any
//! statement is sent. Client certificates (`sslcert`, `sslkey`) are not
//! supported: the store authenticates with the URL's password.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::{Host, SslMode as PgSslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(Error::ControlConfig(format!(
                    "the --store URL's sslmode={other} is not one of disable, prefer, require, \
                     verify-ca, verify-full"
                )));
            }
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// The TLS parameters taken out of a `--store` URL, and what is left of it
/// for tokio-postgres (which knows neither `verify-*` nor `sslrootcert`).
#[derive(Debug)]
pub(crate) struct UrlTls {
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<String>,
    /// The URL without `sslmode` and `sslrootcert`.
    pub(crate) rest: String,
}

/// Splits the TLS parameters off `url` (`postgres://…?sslmode=…&…`).
pub(crate) fn split_url(url: &str) -> Result<UrlTls> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = None;
    let mut root_cert = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| Error::ControlConfig(format!("the --store URL's {key} is not UTF-8")))?;
        match key {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => root_cert = Some(value.into_owned()),
            "sslcert" | "sslkey" | "sslpassword" => {
                return Err(Error::ControlConfig(format!(
                    "the --store URL's {key}: client certificates are not supported; the store \
                     authenticates with the URL's password"
                )));
            }
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let mode = mode.unwrap_or(if root_cert.is_some() {
        SslMode::VerifyCa
    } else {
        SslMode::Prefer
    });
    Ok(UrlTls {
        mode,
        root_cert,
        rest,
    })
}

/// The sslmode tokio-postgres runs (it negotiates; rustls verifies).
pub(crate) fn negotiation(mode: SslMode) -> PgSslMode {
    match mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
    }
}

/// The rustls connector for `tls`.
pub(crate) fn connector(tls: &UrlTls) -> Result<MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let mode = match (tls.mode, &tls.root_cert) {
        // libpq: require with a root certificate verifies as verify-ca.
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (mode, _) => mode,
    };
    let config = match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth(),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let Some(root_cert) = &tls.root_cert else {
                return Err(Error::ControlConfig(format!(
                    "the --store URL's sslmode={} needs sslrootcert=PATH (a PEM file of the CA \
                     that issued the server's certificate) or sslrootcert=system",
                    mode.name()
                )));
            };
            let roots = Arc::new(roots(root_cert)?);
            let webpki =
                rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| Error::Tls(format!("sslrootcert {root_cert}: {e}")))?;
            if mode == SslMode::VerifyFull {
                builder.with_webpki_verifier(webpki).with_no_client_auth()
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
                    .with_no_client_auth()
            }
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// The CA certificates of `sslrootcert`.
fn roots(root_cert: &str) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    if root_cert == "system" {
        let found = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(found.certs);
    } else {
        let bad = |e: &dyn std::fmt::Display| Error::Tls(format!("sslrootcert {root_cert}: {e}"));
        for cert in CertificateDer::pem_file_iter(Path::new(root_cert)).map_err(|e| bad(&e))? {
            roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
        }
    }
    if roots.is_empty() {
        return Err(Error::Tls(format!(
            "sslrootcert {root_cert}: no CA certificate found"
        )));
    }
    Ok(roots)
}

/// Why a connection to `hosts` in `mode` is open to an attacker on the
/// path, when it is and the database is not on this machine.
pub(crate) fn exposure(mode: SslMode, hosts: &[Host]) -> Option<String> {
    let remote = hosts.iter().any(|host| match host {
        Host::Unix(_) => false,
        Host::Tcp(name) => {
            name != "localhost"
                && !name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    });
    let why = match mode {
        SslMode::VerifyFull => return None,
        SslMode::Disable => "sslmode=disable: the connection is not encrypted",
        SslMode::Prefer | SslMode::Require => {
            "the server's certificate is not verified (sslmode without verify-ca/verify-full)"
        }
        SslMode::VerifyCa => "sslmode=verify-ca: any certificate of the CA is taken for the server",
    };
    remote.then(|| why.to_owned())
}

/// libpq's `prefer`/`require` without a root certificate: encryption
/// without authentication of the server (signatures are still checked, so
/// the session is with the certificate's key holder).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain to the root certificates is checked, the name
/// is not (rustls checks the name after the chain, so a name error means
/// the chain verified).
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_are_split_off_and_the_rest_kept() {
        let tls = split_url(
            "postgres://edge:pw@db:5432/tuna?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(
            tls.rest,
            "postgres://edge:pw@db:5432/tuna?application_name=x"
        );
        let plain = split_url("postgres://edge@db/tuna").unwrap();
        assert_eq!(
            (plain.mode, plain.rest.as_str()),
            (SslMode::Prefer, "postgres://edge@db/tuna")
        );
        let root_only = split_url("postgres://edge@db/tuna?sslrootcert=system").unwrap();
        assert_eq!(
            root_only.mode,
            SslMode::VerifyCa,
            "libpq's default with a root"
        );
    }

    #[test]
    fn bad_tls_parameters_are_refused_with_a_reason() {
        let err = split_url("postgres://edge@db/tuna?sslmode=verify_full").unwrap_err();
        assert!(
            err.to_string()
                .contains("sslmode=verify_full is not one of"),
            "{err}"
        );
        let err = split_url("postgres://edge@db/tuna?sslcert=c.pem").unwrap_err();
        assert!(
            err.to_string()
                .contains("client certificates are not supported"),
            "{err}"
        );
        let tls = split_url("postgres://edge@db/tuna?sslmode=verify-full").unwrap();
        let err = connector(&tls).err().expect("no root certificate");
        assert!(err.to_string().contains("needs sslrootcert=PATH"), "{err}");
    }

    #[test]
    fn only_unverified_connections_off_this_machine_are_reported() {
        let remote = [Host::Tcp("db.internal".into())];
        let local = [Host::Tcp("127.0.0.1".into()), Host::Tcp("localhost".into())];
        assert!(exposure(SslMode::Disable, &remote).is_some());
        assert!(exposure(SslMode::Require, &remote).is_some());
        assert!(exposure(SslMode::VerifyCa, &remote).is_some());
        assert!(exposure(SslMode::VerifyFull, &remote).is_none());
        assert!(exposure(SslMode::Disable, &local).is_none());
        assert!(exposure(SslMode::Disable, &[Host::Unix("/run/postgresql".into())]).is_none());
    }
}
