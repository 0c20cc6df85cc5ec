//! The forward-proxy listener of the connector family: `CONNECT host:port`
//! with proxy credentials, TLS intercepted with certificates of the
//! listener's own CA, and requests forwarded over verified TLS with the
//! credentials of the grant.
//!
//! # Contract
//!
//! - **Registration.** [`crate::ProxyCore::add_connect_listener`] binds a
//!   listener with a [`ConnectConfig`]: the [`ConnectAuthorizer`] that
//!   decides who may go where (the proxy core knows nothing about who its
//!   callers are — the operator implements it with Kubernetes reviews), the
//!   [`InterceptCa`] that signs the certificates clients see, and
//!   [`ConnectLimits`].
//! - **The CONNECT exchange.** The first request of a connection must be
//!   `CONNECT host:port HTTP/1.1` (anything else: `405`, a target that is
//!   not `host:port`: `400`), whole within [`ConnectLimits::handshake_timeout`]
//!   and within the core's header limits (`431`). `Proxy-Authorization`
//!   must be `Basic base64(user:password)`, split at the first `:`; when it is
//!   missing or malformed the answer is `407` with `Proxy-Authenticate`. The
//!   authorizer's [`ConnectRefusal`] answers `407`, `403`, `429` (with
//!   `Retry-After`) or `503`; its [`ConnectGrant`] answers `200 Connection
//!   Established`.
//! - **Re-checks.** A grant holds until its [`ConnectGrant::valid_until`].
//!   Past it, the listener asks [`ConnectAuthorizer::reauthorize`] before the
//!   connection's next request, and at that instant even when no request
//!   comes (a watch or an exec session may stay open for hours). A refusal
//!   answers the request under way with the refusal's status and closes the
//!   connection; a grant replaces the old one (new credentials, new upstream)
//!   for the requests that follow. So a revoked caller keeps an open
//!   connection no longer than the authorizer's `valid_until` allows.
//! - **TLS.** Right after the `200`, the client's TLS handshake is answered
//!   with a certificate for the CONNECT host (an IP SAN for an IP: Go sends
//!   no SNI for IPs, so the certificate is chosen by the CONNECT target, not
//!   by SNI), signed by the listener's CA, offering `http/1.1` only.
//! - **Requests.** Every request on the intercepted connection must name
//!   the CONNECT host (`421` otherwise). It goes through the core's HTTP
//!   path (the same limits, hop-by-hop policy, `X-Forwarded-*`, request id,
//!   error pages and metrics as every route), pinned to the grant's
//!   [`UpstreamTarget`] — TLS verified against the grant's CA (or the
//!   system roots) and the address's name — with the client's
//!   `Authorization` replaced by the grant's. Responses stream (long
//!   watches idle up to [`ConnectLimits::upstream_idle`]); upgrades (`101`:
//!   exec, attach, port-forward) are spliced both ways.
//! - **Bounds.** A connection that has not been granted yet holds one of
//!   [`ConnectLimits::max_unauthenticated`] places, and at most
//!   [`ConnectLimits::max_unauthenticated_per_ip`] of them per client
//!   address (more are closed at accept): idle sockets of one client cannot
//!   lock the others out. A granted connection moves to the
//!   [`ConnectLimits::max_connections`] budget (`503` when it is full). The
//!   CONNECT head must arrive within [`ConnectLimits::handshake_timeout`],
//!   and the authorizer is given [`ConnectLimits::authorize_timeout`] (`503`
//!   after it).
//! - **Secrets.** Passwords and injected credentials are [`Credential`]s:
//!   their `Debug` prints a mask, and nothing here logs them.

mod ca;
mod config;
mod grant;
mod recheck;
mod serve;

pub use crate::routes::UpstreamTarget;
pub use ca::{CaPem, InterceptCa};
pub use config::{ConnectConfig, ConnectLimits};
pub use grant::{
    Authority, ConnectAuthorizer, ConnectGrant, ConnectRefusal, ConnectRequest, Credential,
    MIN_RECHECK, ProxyCredentials,
};
pub(crate) use serve::accept_connect;
