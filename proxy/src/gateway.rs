//! What a Gateway API rule's filters do to a request, as the `HTTPRoute`
//! specification (v1.6.1) and its conformance tests define it: the
//! redirect `Location`, the rewritten path and host, the header edits.
//! Pure functions of the request; `http.rs` calls them from its hooks.

use http::{HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use tuna_routing::action::{HeaderModifier, PathModifier, Redirect, Rewrite};

use crate::client::Scheme;

/// The well-known port of `scheme` (`http` or `https`).
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// The port of a `Host` value (`app.example:8080`, `[::1]:80`), if it
/// names one.
pub(crate) fn host_port(host_value: &str) -> Option<u16> {
    let (_, port) = host_value.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

/// `ReplacePrefixMatch`: the elements of `path` that `prefix` matched
/// (whole segments; a trailing `/` of either side does not count) give
/// way to `replacement`, the rest follows (`/foo/bar`, `/foo`, `/xyz` →
/// `/xyz/bar`). A `path` the prefix does not match is returned as is.
pub(crate) fn replace_prefix(path: &str, prefix: &str, replacement: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    let Some(rest) = path.strip_prefix(prefix) else {
        return path.to_owned();
    };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return path.to_owned();
    }
    let mut out = replacement.trim_end_matches('/').to_owned();
    out.push_str(rest);
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    out
}

/// The path a [`PathModifier`] makes of `path` (no query), given the
/// `PathPrefix` the rule matched with.
fn modified_path(modifier: &PathModifier, path: &str, matched_prefix: &str) -> String {
    match modifier {
        PathModifier::ReplaceFullPath(full) => full.clone(),
        PathModifier::ReplacePrefixMatch(r) => replace_prefix(path, matched_prefix, r),
    }
}

fn split_query(path_and_query: &str) -> (&str, Option<&str>) {
    match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    }
}

/// The request as a redirect or rewrite sees it.
pub(crate) struct RequestLine<'a> {
    /// The scheme the client used.
    pub(crate) scheme: Scheme,
    /// The host name, without port (`[…]` for an IPv6 literal).
    pub(crate) host: &'a str,
    /// The port the client named in its `Host`, if any.
    pub(crate) port: Option<u16>,
    /// The path and query as received.
    pub(crate) path_and_query: &'a str,
    /// The path of the rule's match (its `PathPrefix`).
    pub(crate) matched_prefix: &'a str,
}

/// The `Location` of a `RequestRedirect`: scheme, host and path from the
/// filter where it sets them, else from the request; the query kept. The
/// port is the filter's, else the well-known port of the filter's scheme
/// when it sets one, else the port the client connected to (its `Host`'s,
/// or its scheme's well-known one), and it is left out when it is the
/// well-known port of the `Location`'s scheme.
pub(crate) fn redirect_location(redirect: &Redirect, req: &RequestLine<'_>) -> String {
    let scheme = redirect.scheme.as_deref().unwrap_or(req.scheme.as_str());
    let port = redirect
        .port
        .or_else(|| redirect.scheme.as_deref().and_then(default_port))
        .or(req.port)
        .or_else(|| default_port(req.scheme.as_str()));
    let host = redirect.hostname.as_deref().unwrap_or(req.host);
    let (path, query) = split_query(req.path_and_query);
    let path = match &redirect.path {
        Some(m) => modified_path(m, path, req.matched_prefix),
        None => path.to_owned(),
    };
    let mut location = format!("{scheme}://");
    if host.contains(':') && !host.starts_with('[') {
        location.push('[');
        location.push_str(host);
        location.push(']');
    } else {
        location.push_str(host);
    }
    if let Some(port) = port.filter(|p| Some(*p) != default_port(scheme)) {
        location.push(':');
        location.push_str(&port.to_string());
    }
    location.push_str(&path);
    if let Some(q) = query {
        location.push('?');
        location.push_str(q);
    }
    location
}

/// What a `URLRewrite` makes of the forwarded request: the new `Host`
/// and path and query (the query kept), each `None` when unchanged.
pub(crate) fn rewrite(
    rewrite: &Rewrite,
    path_and_query: &str,
    matched_prefix: &str,
) -> (Option<String>, Option<String>) {
    let path_and_query = rewrite.path.as_ref().map(|m| {
        let (path, query) = split_query(path_and_query);
        let mut out = modified_path(m, path, matched_prefix);
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        out
    });
    (rewrite.hostname.clone(), path_and_query)
}

/// The header edits both message kinds take (Pingora keeps a
/// case-preserving copy of the names, so edits go through its methods).
pub(crate) trait HeaderEdit {
    fn set(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()>;
    fn add(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()>;
    fn remove(&mut self, name: &HeaderName);
}

impl HeaderEdit for RequestHeader {
    fn set(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()> {
        self.insert_header(name, value)
    }
    fn add(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()> {
        self.append_header(name, value).map(|_| ())
    }
    fn remove(&mut self, name: &HeaderName) {
        self.remove_header(name);
    }
}

impl HeaderEdit for ResponseHeader {
    fn set(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()> {
        self.insert_header(name, value)
    }
    fn add(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()> {
        self.append_header(name, value).map(|_| ())
    }
    fn remove(&mut self, name: &HeaderName) {
        self.remove_header(name);
    }
}

/// The request id header the proxy sets unless configured otherwise
/// ([`crate::ProxyConfig::request_id_header`]).
pub const DEFAULT_REQUEST_ID_HEADER: &str = "x-request-id";

/// Whether a rule's header filter must leave `name` alone: the message's
/// framing (`Content-Length`, `Transfer-Encoding`), hop-by-hop fields
/// (`Connection`, `Keep-Alive`, `Upgrade`, `TE`, `Trailer`, `Proxy-*`), the
/// routed `Host` (`URLRewrite` changes it), and what the proxy vouches for
/// toward the backend (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`, the request
/// id). Setting them would let a route desynchronise the upstream
/// connection or forge the client's identity toward a Service that trusts
/// the proxy. The plan refuses such filters (`UnsupportedValue`); the proxy
/// ignores those names as well. Case-insensitive.
pub fn protected_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "upgrade"
            | "te"
            | "trailer"
            | "forwarded"
            | "x-real-ip"
            | DEFAULT_REQUEST_ID_HEADER
    ) || name.starts_with("proxy-")
        || name.starts_with("x-forwarded-")
}

/// Applies an `HTTPHeaderFilter`: `set` replaces every value of a header
/// (or adds it), `add` appends one more value, `remove` drops every value;
/// names compare case-insensitively. A name or value that is not a valid
/// header is skipped (the plan validates them; the proxy never fails a
/// request over one), and so is a [`protected_header`] or the configured
/// `request_id` header.
pub(crate) fn edit_headers(
    m: &HeaderModifier,
    headers: &mut impl HeaderEdit,
    request_id: &HeaderName,
) {
    let parse_name = |name: &str| {
        let n = HeaderName::from_bytes(name.as_bytes()).ok()?;
        (!protected_header(n.as_str()) && n != *request_id).then_some(n)
    };
    let parse =
        |name: &str, value: &str| Some((parse_name(name)?, HeaderValue::from_str(value).ok()?));
    for (name, value) in &m.set {
        if let Some((n, v)) = parse(name, value) {
            let _ = headers.set(n, v);
        }
    }
    for (name, value) in &m.add {
        if let Some((n, v)) = parse(name, value) {
            let _ = headers.add(n, v);
        }
    }
    for name in &m.remove {
        if let Some(n) = parse_name(name) {
            headers.remove(&n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's table (`HTTPPathModifier.ReplacePrefixMatch`)
    /// plus the conformance cases of `HTTPRouteRewritePath`.
    #[test]
    fn replace_prefix_is_element_wise() {
        let cases = [
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/foo", "", "/bar"),
            ("/foo/", "/foo", "", "/"),
            ("/foo", "/foo", "", "/"),
            ("/foo/", "/foo", "/", "/"),
            ("/foo", "/foo", "/", "/"),
            ("/prefix/one/two", "/prefix/one", "/one", "/one/two"),
            ("/strip-prefix/three", "/strip-prefix", "/", "/three"),
            ("/strip-prefix", "/strip-prefix", "/", "/"),
            ("/foo/baz", "/foo", "/bar", "/bar/baz"),
            ("/foo/baz", "/foo", "/", "/baz"),
            ("/anything", "/", "/api", "/api/anything"),
            ("/foobar", "/foo", "/xyz", "/foobar"),
        ];
        for (path, prefix, replacement, want) in cases {
            assert_eq!(
                replace_prefix(path, prefix, replacement),
                want,
                "{path} {prefix} {replacement}"
            );
        }
    }

    fn redirect(scheme: Option<&str>, port: Option<u16>) -> Redirect {
        Redirect {
            scheme: scheme.map(Into::into),
            hostname: Some("example.org".into()),
            path: None,
            port,
            status_code: 302,
        }
    }

    /// `HTTPRouteRedirectPortAndScheme`: listeners on 80, 8080 and 443
    /// (here: the client's scheme and the port its `Host` names).
    #[test]
    fn redirect_port_follows_the_scheme_and_the_listener() {
        use Scheme::{Http, Https};
        /// Client scheme and `Host` port, filter scheme and port, `Location`.
        type Case = (
            Scheme,
            Option<u16>,
            Option<&'static str>,
            Option<u16>,
            &'static str,
        );
        let cases: &[Case] = &[
            (Http, None, None, None, "http://example.org/p"),
            (Http, None, None, Some(80), "http://example.org/p"),
            (Http, None, None, Some(8080), "http://example.org:8080/p"),
            (Http, None, Some("https"), None, "https://example.org/p"),
            (
                Http,
                None,
                Some("https"),
                Some(443),
                "https://example.org/p",
            ),
            (
                Http,
                None,
                Some("https"),
                Some(8443),
                "https://example.org:8443/p",
            ),
            (Http, Some(8080), None, None, "http://example.org:8080/p"),
            (Http, Some(8080), None, Some(80), "http://example.org/p"),
            (
                Http,
                Some(8080),
                Some("https"),
                None,
                "https://example.org/p",
            ),
            (Https, None, None, None, "https://example.org/p"),
            (Https, None, None, Some(443), "https://example.org/p"),
            (Https, None, None, Some(8443), "https://example.org:8443/p"),
            (Https, None, Some("http"), None, "http://example.org/p"),
            (Https, None, Some("http"), Some(80), "http://example.org/p"),
            (
                Https,
                None,
                Some("http"),
                Some(8080),
                "http://example.org:8080/p",
            ),
        ];
        for (scheme, client_port, to_scheme, to_port, want) in cases {
            let req = RequestLine {
                scheme: *scheme,
                host: "shop.example",
                port: *client_port,
                path_and_query: "/p",
                matched_prefix: "/",
            };
            assert_eq!(
                redirect_location(&redirect(*to_scheme, *to_port), &req),
                *want,
                "{scheme:?} :{client_port:?} → {to_scheme:?} :{to_port:?}"
            );
        }
    }

    /// `HTTPRouteRedirectPath`, `HTTPRouteRedirectHostAndStatus`: the path
    /// replaced whole or by prefix, the query kept, the host kept unless set.
    #[test]
    fn redirect_path_and_host() {
        let prefix = |p: &str| Some(PathModifier::ReplacePrefixMatch(p.into()));
        let full = |p: &str| Some(PathModifier::ReplaceFullPath(p.into()));
        let cases = [
            (
                "/original-prefix/lemon",
                "/original-prefix",
                None,
                prefix("/replacement-prefix"),
                "http://shop.example/replacement-prefix/lemon",
            ),
            (
                "/full/path/original",
                "/full",
                None,
                full("/full-path-replacement"),
                "http://shop.example/full-path-replacement",
            ),
            (
                "/path-and-host",
                "/path-and-host",
                Some("example.org"),
                prefix("/replacement-prefix"),
                "http://example.org/replacement-prefix",
            ),
            (
                "/keep?a=1&b=2",
                "/",
                None,
                None,
                "http://shop.example/keep?a=1&b=2",
            ),
            (
                "/old/x?q=1",
                "/old",
                Some("example.org"),
                prefix("/new"),
                "http://example.org/new/x?q=1",
            ),
        ];
        for (path, matched, hostname, modifier, want) in cases {
            let r = Redirect {
                scheme: None,
                hostname: hostname.map(Into::into),
                path: modifier,
                port: None,
                status_code: 301,
            };
            let req = RequestLine {
                scheme: Scheme::Http,
                host: "shop.example",
                port: None,
                path_and_query: path,
                matched_prefix: matched,
            };
            assert_eq!(redirect_location(&r, &req), want, "{path}");
        }
    }

    #[test]
    fn rewrite_keeps_the_query_and_what_it_does_not_set() {
        let r = Rewrite {
            hostname: Some("one.example.org".into()),
            path: Some(PathModifier::ReplacePrefixMatch("/two".into())),
        };
        assert_eq!(
            rewrite(&r, "/one/x?y=1", "/one"),
            (Some("one.example.org".into()), Some("/two/x?y=1".into()))
        );
        assert_eq!(rewrite(&Rewrite::default(), "/a", "/"), (None, None));
    }

    #[test]
    fn host_port_of_a_host_value() {
        let cases = [
            ("a.example", None),
            ("a.example:8080", Some(8080)),
            ("[::1]:80", Some(80)),
            ("[::1]", None),
            ("a.example:", None),
        ];
        for (value, want) in cases {
            assert_eq!(host_port(value), want, "{value}");
        }
    }
}
