//! What a caller gives a table and gets back from it: route specs, their
//! path types and matchers, the match of a lookup, and the issues a build
//! reports. Plain data, below every module that builds or reads a table.

use std::fmt;

use crate::normalize::{InvalidHost, InvalidPath};

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

/// Something wrong with the input of [`RouteTable::build`](crate::RouteTable::build); the spec named
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
