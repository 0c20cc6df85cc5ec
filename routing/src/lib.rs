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
mod error;
mod explain;
mod gateway;
mod listeners;
mod normalize;
mod request;
mod spec;
mod table;
mod trie;

pub use error::{Error, Result};
pub use explain::{Candidate, Explanation, HostSelection, Outcome};
pub use listeners::{ListenerHostnames, ListenerSpecs, PortTable};
pub use normalize::{
    InvalidHost, InvalidPath, MAX_HOST_LEN, MAX_PATH_LEN, normalize_host, normalize_path,
};
pub use request::{RequestView, SimpleRequest};
pub use spec::{BuildIssue, GatewayMatch, Match, Matcher, Origin, PathType, RouteSpec, TieBreak};
pub use table::{HostTable, RouteTable};

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
