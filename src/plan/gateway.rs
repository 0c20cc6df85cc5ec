//! Gateway API semantics the plan needs before any route is built, pure and
//! exactly as the specification (`sigs.k8s.io/gateway-api` v1.6.1,
//! `apis/v1/httproute_types.go`) defines them:
//!
//! - [`hostname_matches`]: an exact hostname, or a `*.` wildcard that stands
//!   for one *or more* labels (`*.example.com` matches `a.example.com` and
//!   `a.b.example.com`, never `example.com`);
//! - [`intersect_hostnames`]: the hostnames a route serves on a listener —
//!   route hostnames that do not match the listener's are ignored, and none
//!   left means the route is not accepted there
//!   (`NoMatchingListenerHostname`);
//! - [`MatchRank`]: the precedence of every match of every route attached to
//!   a listener (the hostname's non-wildcard characters, then its characters,
//!   an `Exact` path, the longest `PathPrefix`, a method, the most header
//!   matches, the most query matches, the oldest route, `namespace/name`, the
//!   first rule and match), a total order whose sort does not depend on the
//!   order the routes arrive in;
//! - [`path_prefix_matches`]: `PathPrefix` is element-wise (`/foo` matches
//!   `/foo` and `/foo/bar`, not `/foobar`).
//!
//! Attaching routes, ReferenceGrants, filters and route status build on these
//! (issue 31).

use std::cmp::{Ordering, Reverse};

/// Whether `host` (a concrete hostname, or itself a `*.` wildcard) is matched
/// by `pattern`. Case-insensitive (DNS names).
pub fn hostname_matches(pattern: &str, host: &str) -> bool {
    let (pattern, host) = (pattern.to_ascii_lowercase(), host.to_ascii_lowercase());
    match pattern.strip_prefix('*') {
        // `*.example.com` (suffix `.example.com`): one or more whole labels
        // before the suffix, or a wildcard at least as narrow.
        Some(suffix) => match host.strip_prefix('*') {
            Some(host_suffix) => host_suffix.ends_with(suffix),
            None => host.len() > suffix.len() && host.ends_with(suffix),
        },
        None => pattern == host,
    }
}

/// The hostnames a route with `route` hostnames serves on a listener with
/// hostname `listener`, each the more specific of the two where both are
/// given; `None` when both give hostnames and none intersect (the route is
/// then not accepted on that listener). No hostname on either side is `*`.
pub fn intersect_hostnames(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    let listener = listener.filter(|l| !l.is_empty());
    if route.is_empty() {
        return Some(vec![listener.unwrap_or("*").to_ascii_lowercase()]);
    }
    let Some(listener) = listener else {
        return Some(route.iter().map(|h| h.to_ascii_lowercase()).collect());
    };
    let mut out: Vec<String> = Vec::new();
    for host in route {
        let served = if hostname_matches(listener, host) {
            // The route's is at least as specific.
            Some(host.to_ascii_lowercase())
        } else if hostname_matches(host, listener) {
            // A route wildcard covering the listener's hostname.
            Some(listener.to_ascii_lowercase())
        } else {
            None
        };
        if let Some(h) = served
            && !out.contains(&h)
        {
            out.push(h);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether request path `path` is matched by a `PathPrefix` of `prefix`,
/// element by element (a trailing `/` of the prefix is ignored).
pub fn path_prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return path.starts_with('/');
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The kind of path a match has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// `Exact`.
    Exact,
    /// `PathPrefix` (the default, `/`).
    Prefix,
}

/// What ranks one match of one rule of one route on one hostname. Sorting
/// ascending puts the match that wins first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchRank {
    /// The hostname the route serves it on ([`intersect_hostnames`]).
    pub hostname: String,
    /// Path kind and value.
    pub path: (PathKind, String),
    /// The match names a method.
    pub method: bool,
    /// Header matches.
    pub headers: usize,
    /// Query parameter matches.
    pub query_params: usize,
    /// The route's `creationTimestamp`, seconds.
    pub created: i64,
    /// The route's namespace and name.
    pub route: (String, String),
    /// Rule index in the route, then match index in the rule.
    pub position: (usize, usize),
}

impl MatchRank {
    /// The tuple that orders ranks: larger counts first, older routes first.
    #[allow(clippy::type_complexity)]
    fn key(
        &self,
    ) -> (
        Reverse<usize>,
        Reverse<usize>,
        Reverse<bool>,
        Reverse<usize>,
        Reverse<bool>,
        Reverse<usize>,
        Reverse<usize>,
        i64,
        (&str, &str),
        (usize, usize),
    ) {
        let literal = self.hostname.trim_start_matches("*.");
        let non_wildcard = if self.hostname.starts_with("*.") {
            0
        } else {
            literal.len()
        };
        let (kind, value) = &self.path;
        (
            Reverse(non_wildcard),
            Reverse(self.hostname.len()),
            Reverse(*kind == PathKind::Exact),
            Reverse(if *kind == PathKind::Prefix {
                value.len()
            } else {
                0
            }),
            Reverse(self.method),
            Reverse(self.headers),
            Reverse(self.query_params),
            self.created,
            (self.route.0.as_str(), self.route.1.as_str()),
            self.position,
        )
    }
}

impl Ord for MatchRank {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for MatchRank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    /// The specification's own examples (`HTTPRouteSpec.Hostnames`).
    #[test]
    fn hostnames_match_and_intersect_as_the_specification_says() {
        assert!(hostname_matches("*.example.com", "test.example.com"));
        assert!(hostname_matches("*.example.com", "foo.test.example.com"));
        assert!(hostname_matches("*.example.com", "*.test.example.com"));
        assert!(hostname_matches("*.example.com", "*.example.com"));
        assert!(!hostname_matches("*.example.com", "example.com"));
        assert!(!hostname_matches("*.example.com", "test.example.net"));
        assert!(!hostname_matches("*.example.com", "testexample.com"));
        assert!(hostname_matches("Test.Example.com", "test.example.COM"));
        assert!(!hostname_matches("test.example.com", "*.example.com"));

        // A listener `test.example.com`: routes with no hostnames, with
        // `test.example.com` or with `*.example.com`.
        let l = Some("test.example.com");
        assert_eq!(
            intersect_hostnames(l, &[]),
            Some(hosts(&["test.example.com"]))
        );
        assert_eq!(
            intersect_hostnames(l, &hosts(&["*.example.com"])),
            Some(hosts(&["test.example.com"]))
        );
        assert_eq!(intersect_hostnames(l, &hosts(&["other.example.com"])), None);
        // A listener `*.example.com`: the route's matching hostnames; the
        // others are ignored; none left, not accepted.
        let l = Some("*.example.com");
        assert_eq!(
            intersect_hostnames(l, &hosts(&["test.example.com", "test.example.net"])),
            Some(hosts(&["test.example.com"]))
        );
        assert_eq!(
            intersect_hostnames(l, &hosts(&["*.example.com", "foo.test.example.com"])),
            Some(hosts(&["*.example.com", "foo.test.example.com"]))
        );
        assert_eq!(
            intersect_hostnames(l, &hosts(&["example.com", "test.example.net"])),
            None
        );
        // No listener hostname: the route's; neither: any.
        assert_eq!(
            intersect_hostnames(None, &hosts(&["A.example.com"])),
            Some(hosts(&["a.example.com"]))
        );
        assert_eq!(intersect_hostnames(None, &[]), Some(hosts(&["*"])));
    }

    #[test]
    fn path_prefixes_match_whole_elements() {
        assert!(path_prefix_matches("/foo", "/foo"));
        assert!(path_prefix_matches("/foo", "/foo/bar"));
        assert!(path_prefix_matches("/foo/", "/foo"));
        assert!(path_prefix_matches("/foo/", "/foo/bar"));
        assert!(!path_prefix_matches("/foo", "/foobar"));
        assert!(path_prefix_matches("/", "/anything"));
    }

    fn rank(host: &str, path: (PathKind, &str), created: i64, name: &str) -> MatchRank {
        MatchRank {
            hostname: host.into(),
            path: (path.0, path.1.into()),
            method: false,
            headers: 0,
            query_params: 0,
            created,
            route: ("ns".into(), name.into()),
            position: (0, 0),
        }
    }

    /// Every criterion of the specification, each deciding between two
    /// matches equal on the criteria before it; listed winner first.
    fn ladder() -> Vec<MatchRank> {
        let base = |host: &str| rank(host, (PathKind::Prefix, "/"), 100, "r");
        let mut v = vec![
            base("shop.example.com"),
            // Fewer non-wildcard characters.
            base("*.shop.example.com"),
            base("*.example.com"),
        ];
        let with = |f: &dyn Fn(&mut MatchRank)| {
            let mut r = base("*.e.com");
            f(&mut r);
            r
        };
        v.extend([
            with(&|r| r.path = (PathKind::Exact, "/a".into())),
            with(&|r| r.path = (PathKind::Prefix, "/longer".into())),
            with(&|r| r.path = (PathKind::Prefix, "/abc".into())),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.method = true;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 2;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 3;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.created = 50;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.route.1 = "a".into();
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.route.1 = "b".into();
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.route.1 = "b".into();
                r.position = (1, 0);
            }),
        ]);
        v
    }

    #[test]
    fn precedence_follows_the_specification_criterion_by_criterion() {
        let ladder = ladder();
        for pair in ladder.windows(2) {
            assert!(pair[0] < pair[1], "{:?}\nbefore\n{:?}", pair[0], pair[1]);
        }
    }

    /// The order does not depend on the order the routes arrive in: every
    /// rotation and reversal of the ladder sorts back into it.
    #[test]
    fn precedence_does_not_depend_on_arrival_order() {
        let ladder = ladder();
        for k in 0..ladder.len() {
            for reversed in [false, true] {
                let mut shuffled = ladder.clone();
                shuffled.rotate_left(k);
                if reversed {
                    shuffled.reverse();
                }
                shuffled.sort();
                assert_eq!(shuffled, ladder, "rotation {k}, reversed {reversed}");
            }
        }
    }
}
