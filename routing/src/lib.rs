//! Host and path route tables with Kubernetes Ingress semantics, and Gateway
//! API (`HTTPRoute`) matching on the hosts that carry Gateway routes.
//!
//! This crate doc is the specification; every rule below is pinned by a test
//! (unit tables, the data files under `conformance/ingress/`, and property
//! tests against a deliberately naive reference in `tests/`).
//!
//! # Model
//!
//! A [`RouteSpec`] says: requests for `host` whose path matches `path` under
//! `path_type` go to `backend`. [`RouteTable::build`] compiles a list of specs
//! into an immutable table; invalid specs and conflicts are reported there, as
//! [`BuildIssue`]s carrying the spec's [`Origin`], and never at lookup time.
//! One bad spec never discards the others. [`RouteTable::lookup`] answers
//! `(Host header, request path)` with the winning spec, allocating nothing.
//!
//! # Hosts
//!
//! - Request hosts compare case-insensitively; a `:port` and one trailing dot
//!   are ignored (`WWW.Example.com.:8443` is `www.example.com`), see
//!   [`normalize_host`].
//! - A route host is an exact DNS name or a wildcard `*.example.com`, which
//!   matches exactly one extra label: `a.example.com`, not `example.com` nor
//!   `a.b.example.com`.
//! - Host selection comes before path matching: when a request host has exact
//!   routes, wildcard routes are not consulted for it, even if none of the
//!   exact host's paths match (the request then gets no route). This is what
//!   ingress controllers that map hosts to virtual servers do.
//!
//! # Paths
//!
//! - `Exact` matches the whole path, case-sensitively.
//! - `Prefix` matches element-wise by `/`-separated segments: `/foo` and
//!   `/foo/` both match `/foo`, `/foo/` and `/foo/bar`, but not `/foobar`;
//!   `/` matches every path. A trailing slash in a Prefix route is ignored, so
//!   `Prefix /foo/` and `Prefix /foo` are the same rule.
//! - `ImplementationSpecific` behaves exactly as `Prefix` (literal, no regular
//!   expressions) and is the same rule as a `Prefix` on the same path.
//! - Among matching routes of the selected host, the longest path wins; on an
//!   equal path, `Exact` beats `Prefix` (a Prefix's length is measured without
//!   its trailing slash, so `Exact /foo` beats `Prefix /foo/` on `/foo`).
//! - Equal rules (same host, same path, both Exact or both Prefix-like) are a
//!   conflict: the spec with the smallest [`TieBreak`] (oldest creation time,
//!   then namespace, then name; then the earlier rule/path index) wins, and
//!   each loser is reported as [`BuildIssue::Conflict`].
//!
//! # Gateway hosts (`HTTPRoute` v1.6.1)
//!
//! A host with any spec whose [`RouteSpec::matcher`] is [`Matcher::Gateway`]
//! is matched by the Gateway API's precedence instead of the Ingress rules
//! above; hosts without one are unaffected. Host selection is the same.
//! [`RouteTable::lookup_request`] takes what these matches need besides host
//! and path: the method and headers through a [`RequestView`], the query
//! from the request target. [`RouteTable::lookup`] on such a host stands for
//! a `GET` without headers.
//!
//! - The host's specs form one total order, first wins: the most
//!   non-wildcard characters of [`GatewayMatch::hostname`] (a wildcard
//!   hostname has none), then the most characters of it (no hostname: 0
//!   and 0; an Ingress spec on the host counts the host as its hostname);
//!   an `Exact` path before any Prefix; the longest Prefix (in characters,
//!   without its trailing slash); a method before none; more header
//!   conditions; more query conditions; then [`TieBreak`] (oldest, then
//!   namespace, then name); then [`Origin::rule`] and [`Origin::path`] (the
//!   rule, and the match within it).
//! - A lookup answers with the first spec in that order that matches the
//!   request: the path as on an Ingress host (canonical form; `Exact` the
//!   whole path, Prefix element-wise, `Prefix /` every path), the method
//!   exactly, every header condition (name case-insensitive, the value of
//!   the request's first header of that name exactly), every query
//!   condition (name and value exactly after percent-decoding, the first
//!   parameter of that name; `+` is not a space; a parameter without `=`
//!   has the empty value). So a less specific spec serves whatever the more
//!   specific ones do not: precedence falls back across hostnames, paths
//!   and conditions. No matching spec: no route.
//! - Two specs equal in path (Exact, or Prefix-like, on one canonical
//!   path), method, header and query conditions (as sets) and hostname are
//!   a conflict: the later in the order could never match; it is reported
//!   as [`BuildIssue::Conflict`] and not routed. Invalid paths are reported
//!   as on an Ingress host.
//! - [`RouteTable::explain_request`] gives every candidate its
//!   [`Outcome`], including [`Outcome::MethodDoesNotMatch`],
//!   [`Outcome::HeaderDoesNotMatch`], [`Outcome::QueryDoesNotMatch`] and
//!   [`Outcome::LowerPrecedence`].
//!
//! The order is laid out along the path trie (a trie per hostname rank,
//! and at each slot the specs of that path sorted by the later keys), so a
//! lookup walks the path once per hostname rank and checks the conditions
//! of the candidates on that branch, in order, until one holds. It
//! allocates nothing either (the allocation test covers a Gateway host).
//!
//! # Canonical paths (the percent-encoding, dot-segment and slash policy)
//!
//! Request paths and route paths are compared in one canonical form, so that
//! two spellings of one resource cannot be routed differently (a backend that
//! normalises `/public/../admin` to `/admin` must not receive it through the
//! `/public` route). See [`normalize_path`]:
//!
//! 1. The query (`?…`) and fragment (`#…`) are removed; an empty path is `/`.
//!    A path not starting with `/` (`*`, absolute-form) matches nothing.
//! 2. Percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are
//!    decoded (RFC 3986 §6.2.2.2): `/%61pi` is `/api`. Every other escape is
//!    kept encoded, with upper-case hex. **`%2F` is never decoded**: it is
//!    part of a segment, never a separator, so `/api%2Fusers` does not match
//!    `Prefix /api/users` nor `Prefix /api`. A `%` that starts no valid escape
//!    becomes `%25`; bytes not allowed in a path (space, `\`, `{`, non-ASCII…)
//!    are percent-encoded. `\` is never a separator.
//! 3. Repeated slashes are merged: `//a///b` is `/a/b`.
//! 4. Dot segments are resolved (RFC 3986 §5.2.4), after step 2 so `%2e%2e` is
//!    `..`; `..` never climbs above the root: `/../a` is `/a`.
//! 5. A trailing slash is kept: `/a/` is not `/a` (it matters to `Exact`).
//!
//! Route paths must already be clean: a route containing `//`, a dot segment,
//! `%2F`, `?` or `#`, or not starting with `/`, is reported as
//! [`BuildIssue::InvalidPath`] (the Kubernetes API server rejects the same
//! sequences for Exact and Prefix). The proxy forwards the original request
//! path to the backend; canonicalisation only decides the route.
//!
//! # Cost
//!
//! `lookup` allocates nothing (a test with a counting global allocator proves
//! it): one pass over the host and one over the path to check they are
//! already canonical, a host hash lookup, then one child lookup per path
//! segment in a segment trie (flat arrays of nodes and edges per host; edges
//! compared by an integer of their first 8 bytes; nodes with more than 8
//! children hashed). Its cost depends on the number of path segments, not on
//! the number of routes. A path that needs rewriting is rewritten into a
//! stack buffer of [`MAX_PATH_LEN`] bytes; if its rewritten form does not fit,
//! it matches no route (a 404; already-canonical paths of any length match).
//! Building is `O(total path length)`; `RouteTable::build` of 100 000
//! routes takes a few hundred milliseconds, so tables are built off the
//! request path and swapped in whole. Rules of different host patterns never
//! interact, so a host also compiles alone ([`HostTable::build`]) and a table
//! is assembled from compiled hosts ([`RouteTable::from_hosts`], one map
//! insert per host): a caller that changes one host among thousands compiles
//! that host only.
//!
//! `matchit` was the first candidate for the path trie, but its lookup pushes
//! onto a heap `Vec` whenever it passes a node holding both static and
//! catch-all children — exactly the shape of nested Prefix routes (`/` and
//! `/api`) — so it cannot meet the zero-allocation contract. The benches still
//! compare against it.
//!
//! # Example
//!
//! ```
//! use tuna_routing::{Origin, PathType, RouteSpec, RouteTable, TieBreak};
//!
//! let spec = |path: &str, path_type, backend| RouteSpec {
//!     host: "shop.example.com".into(),
//!     path: path.into(),
//!     path_type,
//!     backend,
//!     origin: Origin { namespace: "default".into(), name: "shop".into(), rule: 0, path: 0 },
//!     tie_break: TieBreak { created: 0, namespace: "default".into(), name: "shop".into() },
//!     matcher: tuna_routing::Matcher::Ingress,
//! };
//! let (table, issues) = RouteTable::build(vec![
//!     spec("/", PathType::Prefix, "web"),
//!     spec("/api", PathType::Prefix, "api"),
//!     spec("/api", PathType::Exact, "api-root"),
//! ])
//! .unwrap();
//! assert!(issues.is_empty());
//! assert_eq!(table.lookup("Shop.Example.com:443", "/api/users?page=2").map(|m| *m.backend), Some("api"));
//! assert_eq!(table.lookup("shop.example.com", "/api").map(|m| *m.backend), Some("api-root"));
//! assert_eq!(table.lookup("shop.example.com", "/apix").map(|m| *m.backend), Some("web"));
//! assert!(table.lookup("other.example.com", "/").is_none());
//! ```

#![forbid(unsafe_code)]

pub mod action;
mod explain;
mod gateway;
mod normalize;
mod request;
mod table;
mod trie;

pub use explain::{Candidate, Explanation, HostSelection, Outcome};
pub use normalize::{
    InvalidHost, InvalidPath, MAX_HOST_LEN, MAX_PATH_LEN, normalize_host, normalize_path,
};
pub use request::{RequestView, SimpleRequest};
pub use table::{HostTable, RouteTable};

use std::fmt;

/// The crate's error type. Almost everything that can go wrong with a spec is
/// a [`BuildIssue`], not an error: a table is still built from the rest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The table indexes specs with 32-bit integers to stay compact.
    #[error("{count} route specs given; a table holds at most {max}: split the configuration")]
    TooManySpecs {
        /// Specs given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// [`HostTable::build`] was given a host that cannot be routed.
    #[error("{host:?} cannot be a route host: {reason}")]
    InvalidHost {
        /// The host given.
        host: String,
        /// Why it is not valid.
        reason: InvalidHost,
    },
    /// [`HostTable::build`] was given a spec of another host.
    #[error("a spec for {spec:?} was given to the table of {host:?}")]
    OtherHost {
        /// The table's host.
        host: String,
        /// The spec's host.
        spec: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a route's path is compared with a request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathType {
    /// The whole path, case-sensitively.
    Exact,
    /// `/`-separated segments, from the start.
    Prefix,
    /// Treated exactly as [`PathType::Prefix`].
    ImplementationSpecific,
}

impl PathType {
    /// The Kubernetes spelling.
    ///
    /// ```
    /// assert_eq!(tuna_routing::PathType::Exact.as_str(), "Exact");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exact => "Exact",
            Self::Prefix => "Prefix",
            Self::ImplementationSpecific => "ImplementationSpecific",
        }
    }

    /// True for the types that match by prefix (Prefix, ImplementationSpecific).
    ///
    /// ```
    /// assert!(tuna_routing::PathType::ImplementationSpecific.is_prefix());
    /// ```
    pub fn is_prefix(self) -> bool {
        !matches!(self, Self::Exact)
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PathType {
    type Err = String;

    /// Parses the Kubernetes spelling.
    ///
    /// ```
    /// assert_eq!("Prefix".parse(), Ok(tuna_routing::PathType::Prefix));
    /// ```
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "Exact" => Ok(Self::Exact),
            "Prefix" => Ok(Self::Prefix),
            "ImplementationSpecific" => Ok(Self::ImplementationSpecific),
            other => Err(format!(
                "unknown path type {other:?} (Exact, Prefix, ImplementationSpecific)"
            )),
        }
    }
}

/// Where a spec came from, for diagnostics: an Ingress and the indexes of the
/// rule and of the path inside that rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Origin {
    /// Namespace of the source object.
    pub namespace: String,
    /// Name of the source object.
    pub name: String,
    /// Index in `spec.rules`.
    pub rule: usize,
    /// Index in `spec.rules[rule].http.paths`.
    pub path: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} rule {} path {}",
            self.namespace, self.name, self.rule, self.path
        )
    }
}

/// Decides equal rules: the smallest value wins (oldest first, then
/// namespace, then name — the derived order of the fields).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TieBreak {
    /// Creation time of the source object (Unix seconds).
    pub created: i64,
    /// Namespace of the source object.
    pub namespace: String,
    /// Name of the source object.
    pub name: String,
}

/// One route: requests for `host` whose path matches `path` go to `backend`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec<B> {
    /// An exact host name or `*.example.com`; compared case-insensitively.
    pub host: String,
    /// An absolute path; see the crate docs for what is valid.
    pub path: String,
    /// How `path` is compared.
    pub path_type: PathType,
    /// Opaque to this crate; returned by lookups.
    pub backend: B,
    /// Where the spec came from.
    pub origin: Origin,
    /// Decides equal rules.
    pub tie_break: TieBreak,
    /// What else a request must carry (Gateway API matches); Ingress specs
    /// match on host and path alone.
    pub matcher: Matcher,
}

/// The conditions of a spec beyond host and path.
///
/// A host whose specs are all [`Matcher::Ingress`] is matched as the crate
/// docs say (a segment trie, longest path first). A host with any
/// [`Matcher::Gateway`] spec is matched by the Gateway API's precedence
/// (`HTTPRoute` v1.6.1): every spec that matches the request is a candidate
/// and the first in this order wins — the most non-wildcard characters of
/// the route hostname that matched, then the most characters of it, an
/// `Exact` path, the longest `Prefix`, a method, the most header matches, the
/// most query matches, the oldest object ([`TieBreak`]), then the first rule
/// and match ([`Origin`]'s `rule` and `path`). An Ingress spec on such a host
/// is a Gateway spec without conditions whose hostname is the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Matcher {
    /// Host and path only.
    #[default]
    Ingress,
    /// Gateway API conditions (shared: one match of one rule may be
    /// published on several hosts).
    Gateway(std::sync::Arc<GatewayMatch>),
}

/// One `HTTPRouteMatch`, besides its path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GatewayMatch {
    /// The route hostname (after intersection with the listener's) through
    /// which the spec serves its host: `None` when neither the route nor the
    /// listener names one. It ranks, it is not matched: the spec's `host`
    /// is what requests are matched on.
    pub hostname: Option<String>,
    /// An HTTP method, upper case, compared exactly.
    pub method: Option<String>,
    /// Header `Exact` matches: names lower case (compared
    /// case-insensitively), values exactly; a name appears once.
    pub headers: Vec<(String, String)>,
    /// Query parameter `Exact` matches: names and values exactly; a name
    /// appears once.
    pub query: Vec<(String, String)>,
}

impl<B> RouteSpec<B> {
    /// The same rule with another backend. A route keeps this one type from
    /// the plan (a Service) to the proxy (addresses) and its compiled form;
    /// only what it points at changes on the way.
    ///
    /// ```
    /// use tuna_routing::{Origin, PathType, RouteSpec, TieBreak};
    ///
    /// let planned = RouteSpec {
    ///     host: "shop.example.com".into(),
    ///     path: "/api".into(),
    ///     path_type: PathType::Prefix,
    ///     backend: "api:8080",
    ///     origin: Origin::default(),
    ///     tie_break: TieBreak::default(),
    ///     matcher: tuna_routing::Matcher::Ingress,
    /// };
    /// let resolved = planned.map_backend(|service| vec![format!("10.0.0.7 ({service})")]);
    /// assert_eq!(resolved.path, "/api");
    /// assert_eq!(resolved.backend, ["10.0.0.7 (api:8080)"]);
    /// ```
    pub fn map_backend<C>(self, f: impl FnOnce(B) -> C) -> RouteSpec<C> {
        RouteSpec {
            host: self.host,
            path: self.path,
            path_type: self.path_type,
            backend: f(self.backend),
            origin: self.origin,
            tie_break: self.tie_break,
            matcher: self.matcher,
        }
    }
}

/// The result of a successful lookup.
#[derive(Debug)]
pub struct Match<'a, B> {
    /// The winning spec's backend.
    pub backend: &'a B,
    /// The winning spec.
    pub spec: &'a RouteSpec<B>,
}

impl<B> Clone for Match<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Match<'_, B> {}

/// Something wrong with the input of [`RouteTable::build`]; the spec named
/// by the origin is not routed, everything else is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildIssue {
    /// The spec's host is not valid.
    InvalidHost {
        /// The spec.
        origin: Origin,
        /// The host as given.
        host: String,
        /// Why.
        reason: InvalidHost,
    },
    /// The spec's path is not valid.
    InvalidPath {
        /// The spec.
        origin: Origin,
        /// The path as given.
        path: String,
        /// Why.
        reason: InvalidPath,
    },
    /// The spec is an equal rule to another, which won the tie-break.
    Conflict {
        /// The spec that is not routed.
        loser: Origin,
        /// The spec that is routed instead.
        winner: Origin,
        /// Canonical host of both.
        host: String,
        /// Path of the loser as given.
        path: String,
        /// `Exact`, or `Prefix` for both Prefix-like types.
        path_type: PathType,
    },
}

impl BuildIssue {
    /// The spec this issue is about (the loser for a conflict).
    ///
    /// ```
    /// # use tuna_routing::*;
    /// let issue = BuildIssue::InvalidPath { origin: Origin::default(), path: "x".into(), reason: InvalidPath::NotAbsolute };
    /// assert_eq!(issue.origin(), &Origin::default());
    /// ```
    pub fn origin(&self) -> &Origin {
        match self {
            Self::InvalidHost { origin, .. } | Self::InvalidPath { origin, .. } => origin,
            Self::Conflict { loser, .. } => loser,
        }
    }

    /// Stable machine-readable reason, e.g. for event reasons and JSON.
    ///
    /// ```
    /// # use tuna_routing::*;
    /// let issue = BuildIssue::InvalidPath { origin: Origin::default(), path: "x".into(), reason: InvalidPath::NotAbsolute };
    /// assert_eq!(issue.reason(), "PathNotAbsolute");
    /// ```
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidHost { reason, .. } => reason.as_str(),
            Self::InvalidPath { reason, .. } => reason.as_str(),
            Self::Conflict { .. } => "RouteConflict",
        }
    }
}

impl fmt::Display for BuildIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidHost {
                origin,
                host,
                reason,
            } => write!(f, "{origin}: host {host:?}: {reason}"),
            Self::InvalidPath {
                origin,
                path,
                reason,
            } => write!(f, "{origin}: path {path:?}: {reason}"),
            Self::Conflict {
                loser,
                winner,
                host,
                path,
                path_type,
            } => write!(
                f,
                "{loser}: {path_type} {host}{path} is also defined by {winner}, which wins (older, then first by namespace/name, then by rule and path order)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    /// The proxy shares tables across threads behind an `ArcSwap`.
    #[test]
    fn table_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<crate::RouteTable<String>>();
        assert_send_sync::<crate::BuildIssue>();
    }
}
