//! What a CONNECT asks and what the authorizer answers: the caller's
//! credentials and target ([`ConnectRequest`]), the grant with its upstream
//! and credentials ([`ConnectGrant`]) or the refusal ([`ConnectRefusal`]),
//! and the [`ConnectAuthorizer`] that decides. The contract is in
//! [`super`]'s docs.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::utils::tls::{WrappedX509, parse_x509};

use crate::error::{Error, Result};
use crate::routes::UpstreamTarget;

/// A secret string (a password, a bearer token): its `Debug` and `Display`
/// print a mask, so it can sit in structs that are logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl Credential {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself: pass it on, never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(***)")
    }
}

impl std::fmt::Display for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// The decoded `Proxy-Authorization: Basic` credentials of a CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyCredentials {
    /// Before the first `:` (e.g. `namespace/connector`).
    pub username: String,
    /// After the first `:` (e.g. a ServiceAccount token).
    pub password: Credential,
}

impl ProxyCredentials {
    /// Parses a `Proxy-Authorization` value: `Basic <base64(user:password)>`
    /// (scheme case-insensitive), the decoded text UTF-8, split at the first
    /// `:`. `None` for anything else.
    pub fn from_header(value: &[u8]) -> Option<Self> {
        let value = std::str::from_utf8(value).ok()?.trim();
        let (scheme, encoded) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        use base64::Engine as _;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (username, password) = text.split_once(':')?;
        Some(Self {
            username: username.to_owned(),
            password: Credential::new(password),
        })
    }
}

/// The target of a CONNECT: `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Authority {
    /// A DNS name (lower-case) or an IP address (IPv6 without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl std::fmt::Display for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Authority {
    /// Parses an authority-form target, `host:port` (RFC 9112 §3.2.3), with the
    /// rules of the shared codec for the host; the port is required.
    pub fn parse(target: &str) -> Option<Self> {
        let host = tuna_http1::parse_host(target.as_bytes())?;
        if host.value.ends_with(']') {
            return None;
        }
        let (_, port) = host.value.rsplit_once(':')?;
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        let name = host.name.trim_start_matches('[').trim_end_matches(']');
        Some(Self {
            host: name.trim_end_matches('.').to_ascii_lowercase(),
            port,
        })
    }
}

/// What the authorizer is asked.
#[derive(Debug, Clone)]
pub struct ConnectRequest {
    /// The CONNECT target.
    pub authority: Authority,
    /// The decoded proxy credentials (requests without valid Basic
    /// credentials never reach the authorizer: they get `407`).
    pub credentials: ProxyCredentials,
    /// The client's address.
    pub client_addr: SocketAddr,
}

/// Why a CONNECT is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectRefusal {
    /// `407 Proxy Authentication Required`: the credentials name no one
    /// (unknown, invalid or expired password, unknown user).
    Unauthenticated(String),
    /// `403 Forbidden`: the caller is known but may not go there.
    Forbidden(String),
    /// `503 Service Unavailable`: it cannot be decided now (the authority
    /// that checks credentials is unreachable, the target is not ready).
    Unavailable(String),
    /// `429 Too Many Requests` with `Retry-After`: the authorizer will not
    /// check this now (e.g. its budget of credential reviews is spent).
    TooManyRequests {
        /// What the client is told.
        message: String,
        /// When to try again (`Retry-After`, whole seconds, at least 1).
        retry_after: Duration,
    },
}

impl ConnectRefusal {
    pub(crate) fn status(&self) -> u16 {
        match self {
            Self::Unauthenticated(_) => 407,
            Self::Forbidden(_) => 403,
            Self::Unavailable(_) => 503,
            Self::TooManyRequests { .. } => 429,
        }
    }

    pub(crate) fn message(&self) -> &str {
        match self {
            Self::Unauthenticated(m) | Self::Forbidden(m) | Self::Unavailable(m) => m,
            Self::TooManyRequests { message, .. } => message,
        }
    }

    /// `Retry-After` in whole seconds, for the refusals that have one.
    pub(crate) fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::TooManyRequests { retry_after, .. } => {
                Some(retry_after.as_secs_f64().ceil().max(1.0) as u64)
            }
            _ => None,
        }
    }
}

impl UpstreamTarget {
    /// A target at `addrs` (resolved by the caller: the proxy never resolves
    /// names) whose TLS certificate must be valid for `server_name` (a DNS
    /// name or an IP address) and chain to one of `ca_der` (DER
    /// certificates), or to the system roots when `ca_der` is `None`.
    pub fn new(
        addrs: Vec<SocketAddr>,
        server_name: &str,
        ca_der: Option<Vec<Vec<u8>>>,
    ) -> Result<Self> {
        if addrs.is_empty() {
            return Err(Error::NoAddresses {
                what: format!("upstream {server_name}"),
            });
        }
        let server_name = server_name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if rustls::pki_types::ServerName::try_from(server_name.clone()).is_err() {
            return Err(Error::InvalidHost { host: server_name });
        }
        let mut hasher = DefaultHasher::new();
        server_name.hash(&mut hasher);
        let ca = match ca_der {
            None => None,
            Some(certs) => {
                if certs.is_empty() {
                    return Err(Error::InvalidCertificate(
                        "no CA certificate given; give at least one or none for the system roots"
                            .into(),
                    ));
                }
                let mut store = rustls::RootCertStore::empty();
                for der in &certs {
                    // Parsed by rustls first: Pingora's own parser panics on
                    // a certificate it cannot read.
                    store
                        .add(rustls::pki_types::CertificateDer::from(der.as_slice()))
                        .map_err(|e| Error::InvalidCertificate(e.to_string()))?;
                    der.hash(&mut hasher);
                }
                let wrapped: Vec<WrappedX509> = certs
                    .into_iter()
                    .map(|der| WrappedX509::new(der, parse_x509))
                    .collect();
                Some(Arc::from(wrapped))
            }
        };
        Ok(Self {
            addrs,
            server_name,
            ca,
            group_key: hasher.finish(),
        })
    }

    /// The resolved addresses.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

/// What a granted CONNECT gets.
#[derive(Debug, Clone)]
pub struct ConnectGrant {
    /// Where its requests go.
    pub target: Arc<UpstreamTarget>,
    /// The `Authorization` value every request gets upstream, replacing the
    /// client's (e.g. `Bearer <real token>`).
    pub authorization: Credential,
    /// Who and what, for logs and traces (e.g. `namespace/connector` and the
    /// caller's name); never a secret.
    pub label: String,
    /// Until when this decision holds. Past it, the listener asks
    /// [`ConnectAuthorizer::reauthorize`] before the connection's next
    /// request and, with no request, at that instant; a refusal closes the
    /// connection. Set it to the authorizer's revocation bound (how long
    /// its cached answers live), and never past the expiry of the
    /// credentials it checked. (The listener re-checks at most every
    /// [`MIN_RECHECK`], so a deadline in the past cannot make it spin.)
    pub valid_until: Instant,
}

/// The shortest time between two checks of one connection.
pub const MIN_RECHECK: Duration = Duration::from_millis(100);

/// Decides CONNECTs. Implemented outside the proxy core (the operator checks
/// the password with a TokenReview and the caller's rights with a
/// SubjectAccessReview); it should cache its answers briefly, as API
/// servers cache webhook reviews.
#[async_trait]
pub trait ConnectAuthorizer: Send + Sync + 'static {
    /// Grants or refuses `request`.
    async fn authorize(&self, request: ConnectRequest) -> Result<ConnectGrant, ConnectRefusal>;

    /// Checks `request` again for a connection it granted before, once that
    /// grant's [`ConnectGrant::valid_until`] has passed: the same question,
    /// asked by a caller who was let in (an authorizer may, e.g., exempt it
    /// from limits meant for strangers). The default asks
    /// [`Self::authorize`].
    async fn reauthorize(&self, request: ConnectRequest) -> Result<ConnectGrant, ConnectRefusal> {
        self.authorize(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_split_at_the_first_colon() {
        // base64("ns/name:tok:en")
        let creds = ProxyCredentials::from_header(b"Basic bnMvbmFtZTp0b2s6ZW4=").unwrap();
        assert_eq!(creds.username, "ns/name");
        assert_eq!(creds.password.expose(), "tok:en");
        assert!(!format!("{creds:?}").contains("tok"));
        let lower = ProxyCredentials::from_header(b"basic bnMvbmFtZTp0b2s6ZW4=").unwrap();
        assert_eq!(lower, creds);
    }

    #[test]
    fn malformed_credentials_are_refused() {
        for bad in [
            &b""[..],
            b"Basic",
            b"Bearer bnMvbmFtZTp0b2s6ZW4=",
            b"Basic !!!!",
            b"Basic bnMvbmFtZQ==",    // "ns/name": no colon
            b"Basic bnMvbmFtZTp0b2=", // bad length
            b"Basic /w==",            // 0xff: not UTF-8
            b"Basic bnM=vbmF",        // padding inside
        ] {
            assert!(
                ProxyCredentials::from_header(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn authorities_need_a_port_and_a_valid_host() {
        assert_eq!(
            Authority::parse("192.168.1.100:6443"),
            Some(Authority {
                host: "192.168.1.100".into(),
                port: 6443
            })
        );
        assert_eq!(
            Authority::parse("API.Example.com.:443").unwrap().host,
            "api.example.com"
        );
        let v6 = Authority::parse("[::1]:6443").unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.to_string(), "[::1]:6443");
        for bad in [
            "example.com",
            "example.com:",
            "example.com:0",
            "example.com:99999",
            "user@example.com:443",
            "/path",
            "http://example.com:443",
        ] {
            assert_eq!(Authority::parse(bad), None, "{bad}");
        }
    }
}
