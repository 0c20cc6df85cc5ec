//! The HTTP routes of one port of a Gateway's own address (Gateway API
//! v1.6.1): every request on the port belongs to that Gateway, whatever its
//! `Host`, so the port is matched the way the specification matches a
//! Gateway, not by the reserved hosts of a shared listener.
//!
//! - **A listener first.** Of the port's listeners whose hostname matches
//!   the request's host, the most specific serves it: an exact hostname,
//!   then the wildcard with the longest suffix, then a listener without a
//!   hostname. Only that listener's routes are consulted, even when none of
//!   them matches (the request then gets no route): a less specific listener
//!   never serves a host a more specific one claims.
//! - **Wildcards span labels.** `*.example.com` matches `a.example.com` and
//!   `a.b.example.com`, never `example.com` itself (the Gateway API's rule;
//!   an Ingress wildcard spans one label).
//! - **Then the routes, by precedence across hostnames.** Each spec carries
//!   the hostname it serves through ([`crate::GatewayMatch::hostname`]: the
//!   route's hostname intersected with the listener's; `None` when neither
//!   names one). The specs whose hostname matches the request are ordered
//!   as on a Gateway host ([`crate::Matcher`]): the hostname's rank first
//!   (exact, the longest wildcard, none), then path, method, headers,
//!   query, age. The first that matches wins, so a request that no
//!   exact-hostname spec matches falls back to the wildcard's specs, then
//!   to those without a hostname.
//!
//! The specs of each (listener, hostname) compile alone into one
//! [`HostTable`], and since the hostname is the first key of the order, a
//! lookup walks the tables of the hostnames that match the request, most
//! specific first, and answers with the first table's match: the same
//! answer as one table of every matching spec, without copying a
//! wildcard's specs into every more specific hostname's table. A lookup is
//! a few hash probes (one per label of the host) plus the path walk of each
//! table it tries, and allocates nothing.

use crate::normalize::{self, MAX_HOST_LEN, RouteHost};
use crate::request::RequestView;
use crate::spec::{BuildIssue, Match, Matcher, RouteSpec};
use crate::table::HostTable;
use std::collections::HashMap;

/// One listener of a port and its routes, as [`PortTable::build`] takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpecs<B> {
    /// The listener's hostname: exact, a `*.` wildcard (any number of
    /// labels), or `None` for every host.
    pub hostname: Option<String>,
    /// The specs of the routes attached to it. Each is matched through its
    /// [`crate::GatewayMatch::hostname`] (an Ingress spec through its
    /// `host`); its `host` is not read otherwise.
    pub specs: Vec<RouteSpec<B>>,
}

/// Values by hostname pattern, looked up the Gateway API's way: the exact
/// hostname, then wildcards by their suffix, longest first (a wildcard
/// spans any number of labels), then the value for any host.
#[derive(Debug)]
struct Hostnames<T> {
    exact: Map<T>,
    /// Keyed by the suffix after `*.`.
    wildcard: Map<T>,
    any: Option<T>,
}

/// Hashed as the route table's hosts are (`table.rs`): request hosts are
/// chosen by clients, but a table's keys are not, so collision flooding
/// costs nothing here, and a lookup hashes a host once per label.
type Map<T> = HashMap<Box<str>, T, foldhash::fast::RandomState>;

impl<T> Default for Hostnames<T> {
    fn default() -> Self {
        Self {
            exact: Map::default(),
            wildcard: Map::default(),
            any: None,
        }
    }
}

/// A hostname pattern in canonical form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Pattern {
    Exact(String),
    /// The suffix after `*.`.
    Wildcard(String),
    Any,
}

impl Pattern {
    /// Lower case, one trailing dot removed; an empty name is any host.
    fn parse(hostname: Option<&str>) -> Self {
        let Some(h) = hostname else {
            return Self::Any;
        };
        let h = h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase();
        if h.is_empty() || h == "*" {
            Self::Any
        } else if let Some(suffix) = h.strip_prefix("*.") {
            Self::Wildcard(suffix.to_owned())
        } else {
            Self::Exact(h)
        }
    }

    /// The pattern as a route names it (`*` for any host).
    fn name(&self) -> String {
        match self {
            Self::Exact(h) => h.clone(),
            Self::Wildcard(s) => format!("*.{s}"),
            Self::Any => "*".to_owned(),
        }
    }
}

impl<T> Hostnames<T> {
    fn contains(&self, pattern: &Pattern) -> bool {
        match pattern {
            Pattern::Exact(h) => self.exact.contains_key(h.as_str()),
            Pattern::Wildcard(s) => self.wildcard.contains_key(s.as_str()),
            Pattern::Any => self.any.is_some(),
        }
    }

    fn insert(&mut self, pattern: Pattern, value: T) {
        match pattern {
            Pattern::Exact(h) => {
                self.exact.insert(h.into(), value);
            }
            Pattern::Wildcard(s) => {
                self.wildcard.insert(s.into(), value);
            }
            Pattern::Any => self.any = Some(value),
        }
    }
}

/// The values of a canonical host, most specific pattern first.
fn matching<'m, 'h, T>(
    map: &'m Hostnames<T>,
    host: &'h str,
) -> impl Iterator<Item = &'m T> + use<'m, 'h, T> {
    let exact = map.exact.get(host);
    // Each suffix after a dot, longest first: `a.b.c` → `b.c`, `c`.
    let wildcards = host
        .match_indices('.')
        .map(move |(dot, _)| &host[dot + 1..])
        .filter(|suffix| !suffix.is_empty() && !map.wildcard.is_empty())
        .filter_map(|suffix| map.wildcard.get(suffix));
    exact.into_iter().chain(wildcards).chain(map.any.as_ref())
}

/// Values by listener hostname, found the way [`PortTable`] finds a
/// request's listener: the exact hostname, then the wildcard with the
/// longest suffix (spanning any number of labels), then the value without
/// a hostname. The TLS side of a port uses it to pick a listener's
/// certificate by SNI, so that a handshake and the requests after it choose
/// a listener by one rule.
///
/// ```
/// use tuna_routing::ListenerHostnames;
///
/// let mut certs = ListenerHostnames::default();
/// assert!(certs.insert(Some("*.example.com"), "wildcard"));
/// assert!(certs.insert(None, "any"));
/// assert!(!certs.insert(Some("*.EXAMPLE.com."), "second")); // the first keeps it
/// assert_eq!(certs.get("a.b.example.com"), Some(&"wildcard"));
/// assert_eq!(certs.get("example.com"), Some(&"any"));
/// assert_eq!(certs.get(""), Some(&"any")); // no SNI
/// ```
#[derive(Debug)]
pub struct ListenerHostnames<T>(Hostnames<T>);

impl<T> Default for ListenerHostnames<T> {
    fn default() -> Self {
        Self(Hostnames::default())
    }
}

impl<T> ListenerHostnames<T> {
    /// Sets the value of a listener hostname (exact, `*.` wildcard, or
    /// `None` for every host), unless one is already set for it: returns
    /// whether it was (of two listeners with one hostname, the first
    /// serves).
    pub fn insert(&mut self, hostname: Option<&str>, value: T) -> bool {
        let pattern = Pattern::parse(hostname);
        if self.0.contains(&pattern) {
            return false;
        }
        self.0.insert(pattern, value);
        true
    }

    /// The value of the most specific hostname matching `host` (a DNS name
    /// in any case, an optional trailing dot; empty for none, which only
    /// the value without a hostname serves).
    pub fn get(&self, host: &str) -> Option<&T> {
        let host = host.strip_suffix('.').unwrap_or(host);
        if host.bytes().any(|b| b.is_ascii_uppercase()) {
            return matching(&self.0, &host.to_ascii_lowercase()).next();
        }
        matching(&self.0, host).next()
    }

    /// Whether no hostname has a value.
    pub fn is_empty(&self) -> bool {
        self.0.exact.is_empty() && self.0.wildcard.is_empty() && self.0.any.is_none()
    }
}

/// The compiled HTTP routes of one port of a Gateway's address. See the
/// module docs for how a request finds its route.
///
/// ```
/// use std::sync::Arc;
/// use tuna_routing::{GatewayMatch, ListenerSpecs, Matcher, Origin, PathType, PortTable, RouteSpec, SimpleRequest, TieBreak};
///
/// let spec = |hostname: Option<&str>, path: &str, backend| RouteSpec {
///     host: String::new(),
///     path: path.into(),
///     path_type: PathType::Prefix,
///     backend,
///     origin: Origin::default(),
///     tie_break: TieBreak::default(),
///     matcher: Matcher::Gateway(Arc::new(GatewayMatch {
///         hostname: hostname.map(str::to_owned),
///         ..Default::default()
///     })),
/// };
/// let (port, issues) = PortTable::build(vec![
///     ListenerSpecs {
///         hostname: Some("*.example.com".into()),
///         specs: vec![
///             spec(Some("*.example.com"), "/", "wildcard"),
///             spec(Some("shop.example.com"), "/cart", "cart"),
///         ],
///     },
///     ListenerSpecs { hostname: None, specs: vec![spec(None, "/", "any")] },
/// ]);
/// assert!(issues.is_empty());
/// let route = |host, path| port.lookup_request(host, path, &SimpleRequest::get()).map(|m| *m.backend);
/// assert_eq!(route("shop.example.com", "/cart/1"), Some("cart"));
/// // No exact-hostname spec matches `/`: the wildcard's does.
/// assert_eq!(route("shop.example.com", "/"), Some("wildcard"));
/// // A wildcard spans labels.
/// assert_eq!(route("a.b.example.com:8080", "/"), Some("wildcard"));
/// assert_eq!(route("example.com", "/"), Some("any"));
/// assert_eq!(route("198.51.100.7", "/x"), Some("any"));
/// ```
#[derive(Debug)]
pub struct PortTable<B> {
    listeners: Hostnames<Hostnames<HostTable<B>>>,
}

impl<B> Default for PortTable<B> {
    fn default() -> Self {
        Self {
            listeners: Hostnames::default(),
        }
    }
}

impl<B> PortTable<B> {
    /// Compiles the listeners of a port. Invalid paths and the losers of
    /// equal rules are returned as issues, in input order (listener by
    /// listener), and left out. Of two listeners with the same hostname,
    /// the first serves it (the second is a conflict the Gateway's status
    /// reports; its specs are not routed and not reported here).
    pub fn build(listeners: Vec<ListenerSpecs<B>>) -> (Self, Vec<BuildIssue>) {
        let mut table = Self::default();
        let mut issues: Vec<(usize, BuildIssue)> = Vec::new();
        let mut seq = 0;
        for listener in listeners {
            let pattern = Pattern::parse(listener.hostname.as_deref());
            let first = !table.listeners.contains(&pattern);
            // Specs by the hostname they serve through, in input order.
            let mut groups: Vec<(Pattern, Vec<RouteSpec<B>>, Vec<usize>)> = Vec::new();
            for spec in listener.specs {
                let hostname = match &spec.matcher {
                    Matcher::Gateway(m) => Pattern::parse(m.hostname.as_deref()),
                    Matcher::Ingress => Pattern::parse(Some(&spec.host)),
                };
                let at = match groups.iter().position(|(p, _, _)| *p == hostname) {
                    Some(at) => at,
                    None => {
                        groups.push((hostname, Vec::new(), Vec::new()));
                        groups.len() - 1
                    }
                };
                groups[at].1.push(spec);
                groups[at].2.push(seq);
                seq += 1;
            }
            if !first {
                continue;
            }
            let mut routes: Hostnames<HostTable<B>> = Hostnames::default();
            for (hostname, specs, positions) in groups {
                let host = match &hostname {
                    Pattern::Exact(h) => RouteHost::Exact(h.clone()),
                    Pattern::Wildcard(s) => RouteHost::Wildcard(s.clone()),
                    // A name no request host has: the table's name in
                    // issues, as the plan spells a catch-all.
                    Pattern::Any => RouteHost::Exact(hostname.name()),
                };
                // Too many specs on one hostname: none of them routes (the
                // plan bounds a hostname's specs far below).
                if let Ok((compiled, _)) = HostTable::compile(host, specs, positions) {
                    issues.extend(compiled.issues());
                    routes.insert(hostname, compiled);
                }
            }
            table.listeners.insert(pattern, routes);
        }
        issues.sort_by_key(|(seq, _)| *seq);
        (table, issues.into_iter().map(|(_, i)| i).collect())
    }

    /// Whether the port routes nothing.
    pub fn is_empty(&self) -> bool {
        self.listeners.exact.is_empty()
            && self.listeners.wildcard.is_empty()
            && self.listeners.any.is_none()
    }

    /// Whether two hosts (raw, as [`Self::lookup_request`] takes them) are
    /// served by one listener of the port, or both by none: a TLS
    /// connection's SNI and a request's `Host`, whose listeners must agree
    /// (else the certificate presented was another listener's).
    pub fn same_listener(&self, a: &str, b: &str) -> bool {
        let mut buf_a = [0u8; MAX_HOST_LEN];
        let mut buf_b = [0u8; MAX_HOST_LEN];
        let listener = |host: &str, buf: &mut [u8; MAX_HOST_LEN]| {
            if host.is_empty() {
                return Some(matching(&self.listeners, "").next());
            }
            let host = normalize::normalize_host_into(host, buf)?;
            Some(matching(&self.listeners, host).next())
        };
        match (listener(a, &mut buf_a), listener(b, &mut buf_b)) {
            (Some(Some(x)), Some(Some(y))) => std::ptr::eq(x, y),
            (Some(None), Some(None)) => true,
            _ => false,
        }
    }

    /// Finds the route for a request: `host` is the raw `Host` (any case,
    /// optional port and trailing dot; empty when the request has none, which
    /// only a listener without a hostname serves), `path_and_query` the raw
    /// request target. Allocates nothing.
    pub fn lookup_request(
        &self,
        host: &str,
        path_and_query: &str,
        request: &impl RequestView,
    ) -> Option<Match<'_, B>> {
        let mut buf = [0u8; MAX_HOST_LEN];
        let host = if host.is_empty() {
            ""
        } else {
            normalize::normalize_host_into(host, &mut buf)?
        };
        let listener = matching(&self.listeners, host).next()?;
        matching(listener, host).find_map(|table| {
            let index = table.find(path_and_query, request)?;
            let spec = &table.specs()[index];
            Some(Match {
                backend: &spec.backend,
                spec,
            })
        })
    }
}
