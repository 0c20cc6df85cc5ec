//! What the proxy knows of the public client behind a connection: the
//! scheme it used and, for a stream the proxy did not accept itself, its
//! addresses, whether the hop is trusted and the one host it may serve.

use std::net::SocketAddr;

/// The scheme the client used on the public side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scheme {
    /// Plain HTTP.
    #[default]
    Http,
    /// HTTPS (TLS terminated before the stream reached the proxy core,
    /// e.g. at the edge).
    Https,
}

impl Scheme {
    /// `http` or `https`, as in `X-Forwarded-Proto`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }
}

/// What the proxy must know about a connection it did not accept itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// The public client's address (becomes `X-Forwarded-For`).
    pub client_addr: SocketAddr,
    /// The public address the client connected to, if known.
    pub local_addr: Option<SocketAddr>,
    /// Scheme the client used (becomes `X-Forwarded-Proto`).
    pub scheme: Scheme,
    /// Whether the hop that delivered the stream is trusted: its
    /// `X-Forwarded-For` is appended to, its `Forwarded` and `X-Real-IP`
    /// kept and its request id kept. True for streams from our own edge,
    /// which removes what public clients send (see `docs/tuna-api.md`).
    pub trusted: bool,
    /// The one host this stream may serve: a tunnel stream is opened for
    /// one host (its metadata's `tuna-host`), and a request on it for any
    /// other host — by `Host`, absolute-form target or h2 `:authority` —
    /// is answered `421 Misdirected Request` without being routed. `None`
    /// serves every registered host (a plain listener's connections).
    pub host: Option<String>,
}
