//! What a matched Gateway API rule does to a request besides choosing a
//! backend: the `HTTPRoute` filters a proxy can honour and the rule's
//! timeouts, as plain data. The plan fills them in from `HTTPRoute`s; the
//! proxy core applies them. Pure: no HTTP types, no I/O.

use std::time::Duration;

/// An `HTTPRouteFilter`, applied in list order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Filter {
    /// Changes the request's headers before it is forwarded.
    RequestHeaderModifier(HeaderModifier),
    /// Changes the response's headers before it is returned.
    ResponseHeaderModifier(HeaderModifier),
    /// Answers with a redirect instead of forwarding.
    RequestRedirect(Redirect),
    /// Rewrites the forwarded request's host and path.
    UrlRewrite(Rewrite),
}

/// `HTTPHeaderFilter`: `set` replaces (or adds), `add` appends a value,
/// `remove` drops every value. Names are lower case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HeaderModifier {
    /// Headers set to exactly this value.
    pub set: Vec<(String, String)>,
    /// Headers given one more value.
    pub add: Vec<(String, String)>,
    /// Headers removed.
    pub remove: Vec<String>,
}

/// How a path is changed: the whole of it, or the part the rule's
/// `PathPrefix` matched.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathModifier {
    /// `ReplaceFullPath`.
    ReplaceFullPath(String),
    /// `ReplacePrefixMatch` (only on a rule whose match is a `PathPrefix`).
    ReplacePrefixMatch(String),
}

/// `HTTPRequestRedirectFilter`. Unset fields keep the request's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Redirect {
    /// `http` or `https`.
    pub scheme: Option<String>,
    /// The `Location`'s host.
    pub hostname: Option<String>,
    /// The `Location`'s path.
    pub path: Option<PathModifier>,
    /// The `Location`'s port; when unset, the port of the scheme that is
    /// redirected to is implied (and left out of the `Location`).
    pub port: Option<u16>,
    /// 301, 302, 303, 307 or 308 (302 when unset).
    pub status_code: u16,
}

/// `HTTPURLRewriteFilter`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Rewrite {
    /// The forwarded `Host`.
    pub hostname: Option<String>,
    /// The forwarded path.
    pub path: Option<PathModifier>,
}

/// `HTTPRouteTimeouts`: `request` bounds the whole exchange with the
/// client, `backend_request` one attempt at a backend. `None`: the proxy's
/// defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timeouts {
    /// `timeouts.request`.
    pub request: Option<Duration>,
    /// `timeouts.backendRequest`.
    pub backend_request: Option<Duration>,
}
