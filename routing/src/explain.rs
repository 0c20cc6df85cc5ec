//! Why a request was routed where it was: every candidate with its outcome.
//!
//! This is the slow, allocating companion of `lookup`, for humans and tools
//! (`tuna-operator route explain`). The winner is always taken from the
//! compiled table, so the explanation cannot disagree with real routing.

use std::fmt;

use crate::normalize::{self, InvalidPath};
use crate::request::{Mismatch, PlainGet, RequestView};
use crate::spec::{Match, Origin, PathType, RouteSpec};
use crate::table::HostTable;
use crate::table::RouteTable;
use crate::trie::SpecState;

/// Which host routes a request host selected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSelection {
    /// The request host has exact routes.
    Exact(String),
    /// The request host matched a wildcard, shown as `*.example.com`.
    Wildcard(String),
    /// No route names this host.
    NoRoutes,
    /// The `Host` value cannot name a host (bad port, empty, too long).
    InvalidHost,
}

/// The fate of one candidate spec for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This spec serves the request.
    Selected,
    /// The spec's path does not match the request path.
    PathDoesNotMatch,
    /// Both match; the winner's path is longer.
    LongerPathWins {
        /// The spec that serves the request.
        winner: Origin,
    },
    /// Both match on an equally long path; `Exact` beats `Prefix`.
    ExactWins {
        /// The spec that serves the request.
        winner: Origin,
    },
    /// The spec is an equal rule to another that won the tie-break (older,
    /// or first by namespace/name), so it is not routed at all.
    LostConflict {
        /// The spec that holds the rule.
        winner: Origin,
    },
    /// A wildcard spec, not consulted because the request host has exact routes.
    HostShadowed {
        /// The exact host that was selected instead.
        host: String,
    },
    /// The spec's path is invalid, so it is not routed.
    InvalidPath(InvalidPath),
    /// Gateway host: the spec names another method.
    MethodDoesNotMatch,
    /// Gateway host: the request lacks the header, or its first value differs.
    HeaderDoesNotMatch {
        /// The header (lower case).
        name: String,
    },
    /// Gateway host: the request lacks the query parameter, or its first
    /// value differs.
    QueryDoesNotMatch {
        /// The parameter.
        name: String,
    },
    /// Gateway host: the spec matches, but a spec earlier in the
    /// precedence order matches too.
    LowerPrecedence {
        /// The spec that serves the request.
        winner: Origin,
    },
}

impl Outcome {
    /// Stable machine-readable name.
    ///
    /// ```
    /// assert_eq!(tuna_routing::Outcome::Selected.as_str(), "Selected");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Selected => "Selected",
            Self::PathDoesNotMatch => "PathDoesNotMatch",
            Self::LongerPathWins { .. } => "LongerPathWins",
            Self::ExactWins { .. } => "ExactWins",
            Self::LostConflict { .. } => "LostConflict",
            Self::HostShadowed { .. } => "HostShadowed",
            Self::InvalidPath(reason) => reason.as_str(),
            Self::MethodDoesNotMatch => "MethodDoesNotMatch",
            Self::HeaderDoesNotMatch { .. } => "HeaderDoesNotMatch",
            Self::QueryDoesNotMatch { .. } => "QueryDoesNotMatch",
            Self::LowerPrecedence { .. } => "LowerPrecedence",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Selected => f.write_str("selected"),
            Self::PathDoesNotMatch => f.write_str("path does not match"),
            Self::LongerPathWins { winner } => write!(f, "a longer matching path wins ({winner})"),
            Self::ExactWins { winner } => {
                write!(f, "Exact beats Prefix on the same path ({winner})")
            }
            Self::LostConflict { winner } => {
                write!(
                    f,
                    "same rule as {winner}, which wins as the older object (then by namespace/name)"
                )
            }
            Self::HostShadowed { host } => {
                write!(f, "wildcard not consulted: {host} has its own routes")
            }
            Self::InvalidPath(reason) => write!(f, "not routed: {reason}"),
            Self::MethodDoesNotMatch => f.write_str("method does not match"),
            Self::HeaderDoesNotMatch { name } => write!(f, "header {name:?} does not match"),
            Self::QueryDoesNotMatch { name } => {
                write!(f, "query parameter {name:?} does not match")
            }
            Self::LowerPrecedence { winner } => write!(
                f,
                "matches, but {winner} comes first in Gateway API precedence (hostname, path, method, headers, query, age, rule order)"
            ),
        }
    }
}

/// One spec considered for a request.
#[derive(Debug)]
pub struct Candidate<'a, B> {
    /// The spec.
    pub spec: &'a RouteSpec<B>,
    /// What happened to it.
    pub outcome: Outcome,
}

/// The full answer of [`RouteTable::explain`].
#[derive(Debug)]
pub struct Explanation<'a, B> {
    /// The canonical request host, if the `Host` value names one.
    pub host: Option<String>,
    /// The canonical request path, if the path can be routed.
    pub path: Option<String>,
    /// Which host routes were selected.
    pub selection: HostSelection,
    /// The spec serving the request; identical to [`RouteTable::lookup`]
    /// (or [`RouteTable::lookup_request`] for `explain_request`).
    pub winner: Option<Match<'a, B>>,
    /// Every spec whose host pattern covers the request host, in input order.
    pub candidates: Vec<Candidate<'a, B>>,
}

impl<B> RouteTable<B> {
    /// Explains a lookup: the winner (the same as [`RouteTable::lookup`]) and
    /// every other spec for the host with why it lost. Allocates; not for the
    /// request path.
    ///
    /// ```
    /// use tuna_routing::{Origin, Outcome, PathType, RouteSpec, RouteTable, TieBreak};
    ///
    /// let spec = |path: &str, path_type, rule| RouteSpec {
    ///     host: "example.com".into(),
    ///     path: path.into(),
    ///     path_type,
    ///     backend: (),
    ///     origin: Origin { namespace: "default".into(), name: "web".into(), rule, path: 0 },
    ///     tie_break: TieBreak::default(),
    ///     matcher: tuna_routing::Matcher::Ingress,
    /// };
    /// let (table, _) = RouteTable::build(vec![
    ///     spec("/", PathType::Prefix, 0),
    ///     spec("/foo", PathType::Prefix, 1),
    ///     spec("/foo", PathType::Exact, 2),
    ///     spec("/bar", PathType::Prefix, 3),
    /// ])
    /// .unwrap();
    /// let why = table.explain("example.com", "/foo");
    /// let outcomes: Vec<&str> = why.candidates.iter().map(|c| c.outcome.as_str()).collect();
    /// assert_eq!(outcomes, ["LongerPathWins", "ExactWins", "Selected", "PathDoesNotMatch"]);
    /// assert_eq!(why.winner.unwrap().spec.origin.rule, 2);
    /// ```
    pub fn explain(&self, host: &str, path: &str) -> Explanation<'_, B> {
        self.explain_request(host, path, &PlainGet)
    }

    /// Explains a [`RouteTable::lookup_request`]: the winner (the same) and
    /// every other spec for the host with why it lost. On a host matched by
    /// Gateway API precedence, a spec whose path matches but a condition
    /// does not is [`Outcome::MethodDoesNotMatch`],
    /// [`Outcome::HeaderDoesNotMatch`] or [`Outcome::QueryDoesNotMatch`]
    /// (the first failing, in that order), and a matching spec that is not
    /// the winner is [`Outcome::LowerPrecedence`]. Allocates; not for the
    /// request path.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tuna_routing::{GatewayMatch, Matcher, Origin, PathType, RouteSpec, RouteTable, SimpleRequest, TieBreak};
    ///
    /// let spec = |m: GatewayMatch, rule| RouteSpec {
    ///     host: "example.com".into(),
    ///     path: "/".into(),
    ///     path_type: PathType::Prefix,
    ///     backend: (),
    ///     origin: Origin { namespace: "default".into(), name: "web".into(), rule, path: 0 },
    ///     tie_break: TieBreak::default(),
    ///     matcher: Matcher::Gateway(Arc::new(m)),
    /// };
    /// let (table, _) = RouteTable::build(vec![
    ///     spec(GatewayMatch::default(), 0),
    ///     spec(GatewayMatch { method: Some("POST".into()), ..Default::default() }, 1),
    ///     spec(GatewayMatch { headers: vec![("env".into(), "canary".into())], ..Default::default() }, 2),
    ///     spec(GatewayMatch { query: vec![("v".into(), "2".into())], ..Default::default() }, 3),
    /// ])
    /// .unwrap();
    /// let request = SimpleRequest::get().with_header("Env", "canary");
    /// let why = table.explain_request("example.com", "/a?v=1", &request);
    /// let outcomes: Vec<&str> = why.candidates.iter().map(|c| c.outcome.as_str()).collect();
    /// assert_eq!(outcomes, ["LowerPrecedence", "MethodDoesNotMatch", "Selected", "QueryDoesNotMatch"]);
    /// assert_eq!(why.winner.unwrap().spec.origin.rule, 2);
    /// ```
    pub fn explain_request(
        &self,
        host: &str,
        path: &str,
        request: &impl RequestView,
    ) -> Explanation<'_, B> {
        let canonical_host = normalize::normalize_host(host).map(|h| h.into_owned());
        let canonical_path = normalize::normalize_path(path).map(|p| p.into_owned());
        let winner = self.lookup_request(host, path, request);
        let Some(req_host) = canonical_host.clone() else {
            return Explanation {
                host: None,
                path: canonical_path,
                selection: HostSelection::InvalidHost,
                winner,
                candidates: Vec::new(),
            };
        };
        let selection = match self.host_routes_canonical(&req_host) {
            None => HostSelection::NoRoutes,
            Some((false, _)) => HostSelection::Exact(req_host.clone()),
            Some((true, _)) => {
                let dot = req_host.find('.').unwrap_or(0);
                HostSelection::Wildcard(format!("*.{}", &req_host[dot + 1..]))
            }
        };
        let winner_at = self.lookup_index(host, path, request);
        // Candidates: the exact host's specs and those of the one wildcard
        // that covers the request host, in input order.
        let dot = req_host.find('.').filter(|&d| d > 0);
        let wildcard = dot.and_then(|d| self.wildcard_host(&req_host[d + 1..]));
        let mut considered: Vec<(&HostTable<B>, usize)> = self
            .exact_host(&req_host)
            .into_iter()
            .chain(wildcard)
            .flat_map(|table| (0..table.specs().len()).map(move |i| (table, i)))
            .collect();
        considered.sort_by_key(|(table, i)| table.seq(*i));
        let mut candidates = Vec::new();
        for (table, index) in considered {
            let spec = &table.specs()[index];
            let state = &table.states[index];
            let (spec_path, conflict_winner) = match state {
                SpecState::InvalidPath => (None, None),
                SpecState::Active { path } => (Some(path), None),
                SpecState::Conflict { path, winner } => (Some(path), Some(*winner)),
            };
            let is_wildcard = table.wildcard_suffix().is_some();
            let outcome = if is_wildcard && matches!(selection, HostSelection::Exact(_)) {
                Outcome::HostShadowed {
                    host: req_host.clone(),
                }
            } else if let SpecState::InvalidPath = state {
                Outcome::InvalidPath(
                    normalize::parse_route_path(&spec.path).expect_err("recorded as invalid"),
                )
            } else if !canonical_path
                .as_deref()
                .zip(spec_path)
                .is_some_and(|(req, route)| path_matches(spec.path_type, route, req))
            {
                Outcome::PathDoesNotMatch
            } else if let Some(Err(mismatch)) = table
                .gateway_conditions(index)
                .map(|c| c.check(path, request))
            {
                match mismatch {
                    Mismatch::Method => Outcome::MethodDoesNotMatch,
                    Mismatch::Header(name) => Outcome::HeaderDoesNotMatch { name: name.into() },
                    Mismatch::Query(name) => Outcome::QueryDoesNotMatch { name: name.into() },
                }
            } else if let Some(w) = conflict_winner {
                Outcome::LostConflict {
                    winner: table.specs()[w].origin.clone(),
                }
            } else if winner_at.is_some_and(|(t, i)| std::ptr::eq(t, table) && i == index) {
                Outcome::Selected
            } else {
                let Some((_, w)) = winner_at else {
                    unreachable!("a matching active spec implies a winner")
                };
                // A matching active spec of the selected host lost to a
                // winner of the same host.
                let w_spec = &table.specs()[w];
                let w_len = rank_len(w_spec, &table.states[w]);
                let my_len = spec_path.map(|p| key_len(spec.path_type, p)).unwrap_or(0);
                let winner = w_spec.origin.clone();
                if table.gateway_conditions(w).is_some() {
                    Outcome::LowerPrecedence { winner }
                } else if w_len > my_len || !matches!(w_spec.path_type, PathType::Exact) {
                    Outcome::LongerPathWins { winner }
                } else {
                    Outcome::ExactWins { winner }
                }
            };
            candidates.push(Candidate { spec, outcome });
        }
        Explanation {
            host: canonical_host,
            path: canonical_path,
            selection,
            winner,
            candidates,
        }
    }
}

/// Kubernetes path matching on canonical paths, written plainly.
fn path_matches(path_type: PathType, route: &str, request: &str) -> bool {
    if path_type.is_prefix() {
        let route = route.trim_end_matches('/');
        route.is_empty()
            || request == route
            || request
                .strip_prefix(route)
                .is_some_and(|rest| rest.starts_with('/'))
    } else {
        route == request
    }
}

/// Length used to rank matches: a Prefix without its trailing slash.
fn key_len(path_type: PathType, path: &str) -> usize {
    if path_type.is_prefix() {
        path.trim_end_matches('/').len()
    } else {
        path.len()
    }
}

fn rank_len<B>(spec: &RouteSpec<B>, state: &SpecState) -> usize {
    match state {
        SpecState::Active { path } => key_len(spec.path_type, path),
        _ => 0,
    }
}
