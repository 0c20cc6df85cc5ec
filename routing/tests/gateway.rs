//! Gateway API (`HTTPRoute` v1.6.1) matching on a host: the precedence,
//! rule by rule, fallback, the conditions, conflicts, and cases restated
//! from the upstream conformance suite.
//!
//! Every precedence test pits a spec `first` against a spec `second` that
//! both match the request, where `first` wins by exactly one key of the
//! order and `second` is favoured by every later key. Breaking that key
//! (dropping it, or swapping it with the next one) makes the later keys
//! decide and the test fail. This was checked by mutating `gateway.rs`:
//! swapping method/headers, headers/query, age/namespace-name and
//! rule/match, dropping either hostname key, and trying Prefix slots
//! before the Exact one each make the matching test here fail.

use std::sync::Arc;

use tuna_routing::{
    BuildIssue, GatewayMatch, Matcher, Origin, PathType, RouteSpec, RouteTable, SimpleRequest,
    TieBreak,
};

const HOST: &str = "a.example.com";

/// A spec under construction: `Prefix /` on [`HOST`], no conditions,
/// object `ns/route` created at 0, rule 0, match 0.
#[derive(Clone)]
struct R {
    spec: RouteSpec<&'static str>,
    m: GatewayMatch,
}

fn r(backend: &'static str) -> R {
    R {
        spec: RouteSpec {
            host: HOST.into(),
            path: "/".into(),
            path_type: PathType::Prefix,
            backend,
            origin: Origin {
                namespace: "ns".into(),
                name: "route".into(),
                rule: 0,
                path: 0,
            },
            tie_break: TieBreak {
                created: 0,
                namespace: "ns".into(),
                name: "route".into(),
            },
            matcher: Matcher::Ingress,
        },
        m: GatewayMatch::default(),
    }
}

impl R {
    fn host(mut self, host: &str) -> Self {
        self.spec.host = host.into();
        self
    }
    fn prefix(mut self, path: &str) -> Self {
        self.spec.path = path.into();
        self.spec.path_type = PathType::Prefix;
        self
    }
    fn exact(mut self, path: &str) -> Self {
        self.spec.path = path.into();
        self.spec.path_type = PathType::Exact;
        self
    }
    fn hostname(mut self, hostname: &str) -> Self {
        self.m.hostname = Some(hostname.into());
        self
    }
    fn method(mut self, method: &str) -> Self {
        self.m.method = Some(method.into());
        self
    }
    fn header(mut self, name: &str, value: &str) -> Self {
        self.m.headers.push((name.into(), value.into()));
        self
    }
    fn query(mut self, name: &str, value: &str) -> Self {
        self.m.query.push((name.into(), value.into()));
        self
    }
    fn created(mut self, created: i64) -> Self {
        self.spec.tie_break.created = created;
        self
    }
    fn object(mut self, namespace: &str, name: &str) -> Self {
        self.spec.origin.namespace = namespace.into();
        self.spec.origin.name = name.into();
        self.spec.tie_break.namespace = namespace.into();
        self.spec.tie_break.name = name.into();
        self
    }
    fn at(mut self, rule: usize, index: usize) -> Self {
        self.spec.origin.rule = rule;
        self.spec.origin.path = index;
        self
    }
    /// A spec built as Ingress: no conditions, its host as hostname.
    fn ingress(self) -> RouteSpec<&'static str> {
        self.spec
    }
    fn done(mut self) -> RouteSpec<&'static str> {
        self.spec.matcher = Matcher::Gateway(Arc::new(self.m));
        self.spec
    }
}

fn get() -> SimpleRequest {
    SimpleRequest::get()
}

fn route(
    table: &RouteTable<&'static str>,
    target: &str,
    request: &SimpleRequest,
) -> Option<&'static str> {
    table
        .lookup_request(HOST, target, request)
        .map(|m| *m.backend)
}

/// Asserts that `first` wins over `second` on `target`, whatever their
/// input order, and that each serves the request alone.
fn assert_precedes(
    first: RouteSpec<&'static str>,
    second: RouteSpec<&'static str>,
    target: &str,
    request: &SimpleRequest,
) {
    for specs in [
        vec![first.clone(), second.clone()],
        vec![second.clone(), first.clone()],
    ] {
        let (table, issues) = RouteTable::build(specs).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(route(&table, target, request), Some(first.backend));
    }
    for alone in [first, second] {
        let backend = alone.backend;
        let (table, _) = RouteTable::build(vec![alone]).unwrap();
        assert_eq!(
            route(&table, target, request),
            Some(backend),
            "{backend} alone"
        );
    }
}

/// Favoured by every key after the hostname's: Exact, a method, headers,
/// query parameters, older, first by name, first rule.
fn favoured(backend: &'static str) -> R {
    r(backend)
        .exact("/x")
        .method("GET")
        .header("h1", "1")
        .header("h2", "2")
        .query("q1", "1")
        .query("q2", "2")
        .created(-1)
        .object("a", "a")
}

fn favoured_request() -> SimpleRequest {
    get().with_header("h1", "1").with_header("h2", "2")
}

/// Key 1: the most non-wildcard characters of the hostname. The second
/// has more characters in all (key 2), so dropping key 1 fails this.
#[test]
fn non_wildcard_hostname_characters_first() {
    assert_precedes(
        r("first").hostname("a.example.com").done(),
        favoured("second")
            .hostname("*.long-wildcard.example.com")
            .done(),
        "/x?q1=1&q2=2",
        &favoured_request(),
    );
}

/// Key 2: then the most characters of the hostname; no hostname has none.
#[test]
fn longer_hostname_next() {
    assert_precedes(
        r("first").hostname("*.b.example.com").done(),
        favoured("second").hostname("*.example.com").done(),
        "/x?q1=1&q2=2",
        &favoured_request(),
    );
    assert_precedes(
        r("first").hostname("*.example.com").done(),
        favoured("second").done(),
        "/x?q1=1&q2=2",
        &favoured_request(),
    );
}

/// An Ingress spec on a Gateway host ranks with the host as hostname.
#[test]
fn ingress_spec_ranks_with_its_host_as_hostname() {
    assert_precedes(
        r("ingress").ingress(),
        favoured("gateway").hostname("*.example.com").done(),
        "/x?q1=1&q2=2",
        &favoured_request(),
    );
}

/// Key 3: an Exact path before any Prefix, even an equally long one with
/// every later key in its favour.
#[test]
fn exact_path_before_prefix() {
    let second = favoured("second").prefix("/x");
    assert_precedes(
        r("first").exact("/x").done(),
        second.done(),
        "/x?q1=1&q2=2",
        &favoured_request(),
    );
}

/// Key 4: the longest Prefix, in characters without its trailing slash.
#[test]
fn longer_prefix_next() {
    let second = favoured("second").prefix("/x/");
    assert_precedes(
        r("first").prefix("/x/y").done(),
        second.done(),
        "/x/y/z?q1=1&q2=2",
        &favoured_request(),
    );
}

/// Key 5: a method before any number of header or query matches.
#[test]
fn method_next() {
    assert_precedes(
        r("first").method("GET").done(),
        r("second")
            .header("h1", "1")
            .header("h2", "2")
            .query("q1", "1")
            .query("q2", "2")
            .created(-1)
            .object("a", "a")
            .done(),
        "/x?q1=1&q2=2",
        &favoured_request(),
    );
}

/// Key 6: more header matches before more query matches.
#[test]
fn more_headers_next() {
    assert_precedes(
        r("first").header("h1", "1").header("h2", "2").done(),
        r("second")
            .header("h1", "1")
            .query("q1", "1")
            .query("q2", "2")
            .query("q3", "3")
            .created(-1)
            .object("a", "a")
            .done(),
        "/x?q1=1&q2=2&q3=3",
        &favoured_request(),
    );
}

/// Key 7: more query matches before age.
#[test]
fn more_query_params_next() {
    assert_precedes(
        r("first").query("q1", "1").query("q2", "2").done(),
        r("second")
            .query("q1", "1")
            .created(-1)
            .object("a", "a")
            .done(),
        "/x?q1=1&q2=2",
        &get(),
    );
}

/// Key 8: the oldest object before namespace/name order. (Equal counts
/// of conditions, but not equal conditions, which would be a conflict.)
#[test]
fn older_object_next() {
    let both = get().with_header("h1", "1").with_header("h2", "1");
    assert_precedes(
        r("first")
            .header("h1", "1")
            .created(1)
            .object("z", "z")
            .at(5, 5)
            .done(),
        r("second")
            .header("h2", "1")
            .created(2)
            .object("a", "a")
            .done(),
        "/",
        &both,
    );
}

/// Key 9: then `{namespace}/{name}` in alphabetical order, before rule order.
#[test]
fn namespace_then_name_next() {
    let both = get().with_header("h1", "1").with_header("h2", "1");
    assert_precedes(
        r("first")
            .header("h1", "1")
            .object("a", "z")
            .at(5, 5)
            .done(),
        r("second").header("h2", "1").object("b", "a").done(),
        "/",
        &both,
    );
    assert_precedes(
        r("first")
            .header("h1", "1")
            .object("a", "a")
            .at(5, 5)
            .done(),
        r("second").header("h2", "1").object("a", "b").done(),
        "/",
        &both,
    );
}

/// Key 10: within one object, the first rule, then the first match of it.
#[test]
fn first_rule_then_first_match_last() {
    let both = get().with_header("h1", "1").with_header("h2", "1");
    assert_precedes(
        r("first").header("h1", "1").at(0, 5).done(),
        r("second").header("h2", "1").at(1, 0).done(),
        "/",
        &both,
    );
    assert_precedes(
        r("first").header("h1", "1").at(0, 0).done(),
        r("second").header("h2", "1").at(0, 1).done(),
        "/",
        &both,
    );
}

/// A less specific spec serves when the more specific ones do not match:
/// across hostnames, across paths, and across conditions on one path.
#[test]
fn falls_back_across_hostnames_paths_and_conditions() {
    let (table, issues) = RouteTable::build(vec![
        r("exact-host-api-post")
            .hostname(HOST)
            .prefix("/api")
            .method("POST")
            .done(),
        r("exact-host-canary")
            .hostname(HOST)
            .prefix("/")
            .header("env", "canary")
            .done(),
        r("wildcard-api")
            .hostname("*.example.com")
            .prefix("/api")
            .done(),
        r("wildcard-login")
            .hostname("*.example.com")
            .exact("/login")
            .done(),
        r("catch-all").done(),
    ])
    .unwrap();
    assert!(issues.is_empty());
    let canary = get().with_header("Env", "canary");
    let cases: [(&str, &SimpleRequest, Option<&str>); 8] = [
        (
            "/api/cart",
            &SimpleRequest::new("POST"),
            Some("exact-host-api-post"),
        ),
        ("/api/cart", &canary, Some("exact-host-canary")),
        ("/api/cart", &get(), Some("wildcard-api")),
        ("/apix", &get(), Some("catch-all")),
        ("/login", &get(), Some("wildcard-login")),
        ("/login", &canary, Some("exact-host-canary")),
        ("/login/", &get(), Some("catch-all")),
        ("/", &SimpleRequest::new("DELETE"), Some("catch-all")),
    ];
    for (target, request, want) in cases {
        assert_eq!(route(&table, target, request), want, "{target} {request:?}");
    }
    // `lookup` is a GET without headers.
    assert_eq!(
        table.lookup(HOST, "/api/cart").map(|m| *m.backend),
        Some("wildcard-api")
    );
}

/// No spec matches: no route, even on a host with routes.
#[test]
fn no_match_is_no_route() {
    let (table, _) = RouteTable::build(vec![
        r("post").method("POST").done(),
        r("api").prefix("/api").header("x", "1").done(),
    ])
    .unwrap();
    assert_eq!(route(&table, "/api", &get()), None);
    assert_eq!(route(&table, "/api", &SimpleRequest::new("post")), None);
    assert_eq!(
        route(&table, "/api", &SimpleRequest::new("POST")),
        Some("post")
    );
}

#[test]
fn header_names_compare_case_insensitively_values_exactly() {
    let (table, _) = RouteTable::build(vec![
        r("canary").header("X-Env", "Canary").done(),
        r("default").done(),
    ])
    .unwrap();
    let cases = [
        ("x-env", "Canary", "canary"),
        ("X-ENV", "Canary", "canary"),
        ("x-env", "canary", "default"),
        ("x-env", "Canary ", "default"),
        ("x-envy", "Canary", "default"),
    ];
    for (name, value, want) in cases {
        let request = get().with_header(name, value);
        assert_eq!(route(&table, "/", &request), Some(want), "{name}: {value}");
    }
}

/// The first value of a header and the first occurrence of a query
/// parameter decide; later ones are not consulted.
#[test]
fn first_value_decides() {
    let (table, _) = RouteTable::build(vec![
        r("header").header("v", "2").done(),
        r("query").query("v", "2").done(),
        r("default").done(),
    ])
    .unwrap();
    let two_values = get().with_header("V", "1").with_header("v", "2");
    assert_eq!(route(&table, "/", &two_values), Some("default"));
    let two_values = get().with_header("v", "2").with_header("v", "1");
    assert_eq!(route(&table, "/", &two_values), Some("header"));
    assert_eq!(route(&table, "/?v=1&v=2", &get()), Some("default"));
    assert_eq!(route(&table, "/?v=2&v=1", &get()), Some("query"));
    assert_eq!(route(&table, "/?w=2&%76=2", &get()), Some("query"));
}

#[test]
fn query_params_compare_after_percent_decoding() {
    let (table, _) = RouteTable::build(vec![
        r("match").query("the name", "a&b=c/é").done(),
        r("default").done(),
    ])
    .unwrap();
    let cases = [
        ("/?the%20name=a%26b%3Dc%2F%C3%A9", "match"),
        ("/?the%20name=a%26b%3dc/%c3%a9", "match"),
        ("/?x=1&the%20name=a%26b%3Dc%2F%C3%A9#frag", "match"),
        // `+` is not a space in a URI query.
        ("/?the+name=a%26b%3Dc%2F%C3%A9", "default"),
        // Unencoded `&` and `=` split the query.
        ("/?the%20name=a&b=c/%C3%A9", "default"),
        ("/#?the%20name=a%26b%3Dc%2F%C3%A9", "default"),
    ];
    for (target, want) in cases {
        assert_eq!(route(&table, target, &get()), Some(want), "{target}");
    }
}

/// Paths follow the crate's canonical rules on a Gateway host too.
#[test]
fn paths_are_canonical_and_prefixes_element_wise() {
    let (table, _) = RouteTable::build(vec![
        r("exact").exact("/a/b").method("GET").done(),
        r("prefix").prefix("/a/").method("GET").done(),
        r("root").prefix("/").method("GET").done(),
    ])
    .unwrap();
    let cases = [
        ("/a/b", "exact"),
        ("/a//./b?x", "exact"),
        ("/%61/b", "exact"),
        ("/a/b/", "prefix"),
        ("/a", "prefix"),
        ("/a/c/../b", "exact"),
        ("/ab", "root"),
        ("/a%2Fb", "root"),
        ("", "root"),
    ];
    for (target, want) in cases {
        assert_eq!(route(&table, target, &get()), Some(want), "{target}");
    }
}

/// Specs equal in path, conditions and hostname: the one later in the
/// order can never match, so it is reported and not routed.
#[test]
fn equal_specs_conflict() {
    let h = |backend| r(backend).hostname(HOST);
    let (table, issues) = RouteTable::build(vec![
        h("newer")
            .prefix("/api/")
            .header("a", "1")
            .header("B", "2")
            .query("q", "1")
            .method("GET")
            .created(2)
            .at(0, 0)
            .done(),
        h("older")
            .prefix("/api")
            .header("b", "2")
            .header("a", "1")
            .query("q", "1")
            .method("GET")
            .created(1)
            .at(1, 0)
            .done(),
        // Not equal: another method, another (lower ranking) hostname,
        // another path type, another query value.
        h("put").prefix("/api").method("PUT").done(),
        h("hostname")
            .prefix("/api")
            .hostname("*.example.com")
            .header("a", "1")
            .header("b", "2")
            .query("q", "1")
            .method("GET")
            .done(),
        h("exact")
            .exact("/api")
            .header("a", "1")
            .header("b", "2")
            .query("q", "1")
            .method("GET")
            .done(),
        h("other-query")
            .prefix("/api")
            .header("a", "1")
            .header("b", "2")
            .query("q", "2")
            .method("GET")
            .done(),
        // Equal to `put` as an ImplementationSpecific path.
        RouteSpec {
            path_type: PathType::ImplementationSpecific,
            ..h("put-again").prefix("/api").method("PUT").at(9, 0).done()
        },
        h("invalid").prefix("/api/../x").done(),
    ])
    .unwrap();
    let summary: Vec<(String, &str)> = issues
        .iter()
        .map(|issue| match issue {
            BuildIssue::Conflict { loser, winner, .. } => {
                (format!("{}:{}", loser.rule, winner.rule), issue.reason())
            }
            other => (other.origin().rule.to_string(), other.reason()),
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("0:1".to_string(), "RouteConflict"),
            ("9:0".to_string(), "RouteConflict"),
            ("0".to_string(), "PathDotSegment"),
        ]
    );
    assert_eq!(
        route(
            &table,
            "/api?q=1",
            &get().with_header("a", "1").with_header("b", "2")
        ),
        Some("exact")
    );
    assert_eq!(
        route(
            &table,
            "/api/x?q=1",
            &get().with_header("a", "1").with_header("b", "2")
        ),
        Some("older")
    );
}

/// A host without Gateway specs keeps Ingress semantics and ignores the
/// request's method, headers and query.
#[test]
fn ingress_only_hosts_ignore_the_request() {
    let (table, _) = RouteTable::build(vec![
        r("root").ingress(),
        r("api").prefix("/api").ingress(),
        r("gateway").host("b.example.com").method("POST").done(),
    ])
    .unwrap();
    let post = SimpleRequest::new("POST").with_header("x", "1");
    assert_eq!(route(&table, "/api/x?q=1", &post), Some("api"));
    assert_eq!(
        table
            .lookup_request("b.example.com", "/", &post)
            .map(|m| *m.backend),
        Some("gateway")
    );
    assert_eq!(
        table
            .lookup_request("b.example.com", "/", &get())
            .map(|m| *m.backend),
        None
    );
}

/// One routing table per conformance scenario, restated from the upstream
/// suite (`conformance/tests/httproute-*.go` and their manifests): a match
/// without a path is `PathPrefix /`; the expectations are upstream's.
mod conformance {
    use super::*;

    /// Header names and values of a request.
    type Headers<'a> = &'a [(&'a str, &'a str)];

    fn run(specs: Vec<RouteSpec<&'static str>>, cases: &[(&str, &str, Headers<'_>, Option<&str>)]) {
        let (table, issues) = RouteTable::build(specs).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        for (method, target, headers, want) in cases {
            let request = headers
                .iter()
                .fold(SimpleRequest::new(*method), |r, (n, v)| {
                    r.with_header(*n, *v)
                });
            assert_eq!(
                route(&table, target, &request),
                *want,
                "{method} {target} {headers:?}"
            );
        }
    }

    /// HTTPRouteMatching: two rules, each a path OR a header.
    #[test]
    fn path_or_header_rules() {
        run(
            vec![
                r("v1").at(0, 0).done(),
                r("v1").header("version", "one").at(0, 1).done(),
                r("v2").prefix("/v2").at(1, 0).done(),
                r("v2").header("version", "two").at(1, 1).done(),
            ],
            &[
                ("GET", "/", &[], Some("v1")),
                ("GET", "/example", &[], Some("v1")),
                ("GET", "/", &[("Version", "one")], Some("v1")),
                ("GET", "/v2", &[], Some("v2")),
                ("GET", "/v2/example", &[], Some("v2")),
                ("GET", "/", &[("Version", "two")], Some("v2")),
                ("GET", "/v2/", &[], Some("v2")),
                ("GET", "/v2example", &[], Some("v1")),
                ("GET", "/foo/v2/example", &[], Some("v1")),
            ],
        );
    }

    /// HTTPRouteMethodMatching: methods alone, with paths and headers, and
    /// method before header in precedence.
    #[test]
    fn methods() {
        run(
            vec![
                r("v1").method("POST").at(0, 0).done(),
                r("v2").method("GET").at(1, 0).done(),
                r("v1").prefix("/path1").method("GET").at(2, 0).done(),
                r("v2")
                    .header("version", "one")
                    .method("PUT")
                    .at(3, 0)
                    .done(),
                r("v3")
                    .prefix("/path2")
                    .header("version", "two")
                    .method("POST")
                    .at(4, 0)
                    .done(),
                r("v1").prefix("/path3").method("PATCH").at(5, 0).done(),
                r("v1")
                    .prefix("/path4")
                    .header("version", "three")
                    .method("DELETE")
                    .at(5, 1)
                    .done(),
                r("v1").prefix("/path5").at(6, 0).done(),
                r("v2").method("PATCH").at(7, 0).done(),
                r("v3").header("version", "four").at(8, 0).done(),
            ],
            &[
                ("POST", "/", &[], Some("v1")),
                ("GET", "/", &[], Some("v2")),
                ("HEAD", "/", &[], None),
                ("GET", "/path1", &[], Some("v1")),
                ("PUT", "/", &[("version", "one")], Some("v2")),
                ("POST", "/path2", &[("version", "two")], Some("v3")),
                ("PATCH", "/path3", &[], Some("v1")),
                ("DELETE", "/path4", &[("version", "three")], Some("v1")),
                ("PUT", "/", &[], None),
                ("DELETE", "/path4", &[], None),
                ("PATCH", "/path5", &[], Some("v1")),
                ("PATCH", "/", &[("version", "four")], Some("v2")),
            ],
        );
    }

    /// HTTPRouteHeaderMatching: AND within a match, OR across matches, and
    /// the first rule among equally specific ones.
    #[test]
    fn headers() {
        run(
            vec![
                r("v1").header("version", "one").at(0, 0).done(),
                r("v2").header("version", "two").at(1, 0).done(),
                r("v1")
                    .header("version", "two")
                    .header("color", "orange")
                    .at(2, 0)
                    .done(),
                r("v1").header("color", "blue").at(3, 0).done(),
                r("v1").header("color", "green").at(3, 1).done(),
                r("v2").header("color", "red").at(4, 0).done(),
                r("v2").header("color", "yellow").at(4, 1).done(),
            ],
            &[
                ("GET", "/", &[("Version", "one")], Some("v1")),
                ("GET", "/", &[("Version", "two")], Some("v2")),
                (
                    "GET",
                    "/",
                    &[("Version", "two"), ("Color", "orange")],
                    Some("v1"),
                ),
                (
                    "GET",
                    "/",
                    &[("Version", "two"), ("Color", "blue")],
                    Some("v2"),
                ),
                ("GET", "/", &[("Color", "orange")], None),
                ("GET", "/", &[("Some-Other-Header", "one")], None),
                ("GET", "/", &[("Color", "blue")], Some("v1")),
                ("GET", "/", &[("Color", "green")], Some("v1")),
                ("GET", "/", &[("Color", "red")], Some("v2")),
                ("GET", "/", &[("Color", "yellow")], Some("v2")),
                ("GET", "/", &[("Color", "purple")], None),
            ],
        );
    }

    /// HTTPRouteQueryParamMatching: names and values exact (case matters),
    /// combined with paths and headers, header before query in precedence.
    #[test]
    fn query_params() {
        run(
            vec![
                r("v1").query("animal", "whale").at(0, 0).done(),
                r("v2").query("animal", "dolphin").at(1, 0).done(),
                r("v3")
                    .query("animal", "dolphin")
                    .query("color", "blue")
                    .at(2, 0)
                    .done(),
                r("v3").query("ANIMAL", "Whale").at(2, 1).done(),
                r("v1")
                    .prefix("/path1")
                    .query("animal", "whale")
                    .at(3, 0)
                    .done(),
                r("v2")
                    .header("version", "one")
                    .query("animal", "whale")
                    .at(4, 0)
                    .done(),
                r("v3")
                    .prefix("/path2")
                    .header("version", "two")
                    .query("animal", "whale")
                    .at(5, 0)
                    .done(),
                r("v1")
                    .prefix("/path3")
                    .query("animal", "shark")
                    .at(6, 0)
                    .done(),
                r("v1")
                    .prefix("/path4")
                    .header("version", "three")
                    .query("animal", "kraken")
                    .at(6, 1)
                    .done(),
                r("v1").prefix("/path5").at(7, 0).done(),
                r("v2").query("animal", "hydra").at(8, 0).done(),
                r("v3").header("version", "four").at(9, 0).done(),
            ],
            &[
                ("GET", "/?animal=whale", &[], Some("v1")),
                ("GET", "/?animal=dolphin", &[], Some("v2")),
                ("GET", "/?animal=dolphin&color=blue", &[], Some("v3")),
                ("GET", "/?ANIMAL=Whale", &[], Some("v3")),
                (
                    "GET",
                    "/?animal=whale&otherparam=irrelevant",
                    &[],
                    Some("v1"),
                ),
                ("GET", "/?animal=dolphin&color=yellow", &[], Some("v2")),
                ("GET", "/?color=blue", &[], None),
                ("GET", "/?animal=dog", &[], None),
                ("GET", "/?animal=whaledolphin", &[], None),
                ("GET", "/", &[], None),
                ("GET", "/path1?animal=whale", &[], Some("v1")),
                ("GET", "/?animal=whale", &[("version", "one")], Some("v2")),
                (
                    "GET",
                    "/path2?animal=whale",
                    &[("version", "two")],
                    Some("v3"),
                ),
                ("GET", "/path3?animal=shark", &[], Some("v1")),
                (
                    "GET",
                    "/path4?animal=kraken",
                    &[("version", "three")],
                    Some("v1"),
                ),
                ("GET", "/?animal=shark", &[], None),
                ("GET", "/path4?animal=kraken", &[], None),
                ("GET", "/path5?animal=hydra", &[], Some("v1")),
                ("GET", "/?animal=hydra", &[("version", "four")], Some("v3")),
            ],
        );
    }

    /// HTTPRouteMatchingAcrossRoutes: two routes, one of them on two
    /// hostnames; the plan publishes each hostname as a host.
    #[test]
    fn across_routes() {
        let part1 = |host: &str| {
            [
                r("v1")
                    .host(host)
                    .hostname(host)
                    .object("infra", "part1")
                    .done(),
                r("v1")
                    .host(host)
                    .hostname(host)
                    .header("version", "one")
                    .object("infra", "part1")
                    .at(0, 1)
                    .done(),
            ]
        };
        let part2 = [
            r("v2")
                .host("example.com")
                .hostname("example.com")
                .prefix("/v2")
                .object("infra", "part2")
                .done(),
            r("v2")
                .host("example.com")
                .hostname("example.com")
                .header("version", "two")
                .object("infra", "part2")
                .at(0, 1)
                .done(),
        ];
        let specs: Vec<_> = part1("example.com")
            .into_iter()
            .chain(part1("example.net"))
            .chain(part2)
            .collect();
        let (table, issues) = RouteTable::build(specs).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        let cases: [(&str, &str, Headers<'_>, &str); 8] = [
            ("example.com", "/", &[], "v1"),
            ("example.com", "/example", &[], "v1"),
            ("example.net", "/example", &[], "v1"),
            ("example.com", "/example", &[("Version", "one")], "v1"),
            ("example.com", "/v2", &[], "v2"),
            ("example.net", "/v2", &[], "v1"),
            ("example.com", "/v2/example", &[], "v2"),
            ("example.com", "/", &[("Version", "two")], "v2"),
        ];
        for (host, target, headers, want) in cases {
            let request = headers
                .iter()
                .fold(get(), |r, (n, v)| r.with_header(*n, *v));
            let got = table
                .lookup_request(host, target, &request)
                .map(|m| *m.backend);
            assert_eq!(got, Some(want), "{host}{target} {headers:?}");
        }
    }
}

/// `explain_request` on a Gateway host: every candidate with its outcome,
/// the winner from the compiled table.
#[test]
fn explain_request_names_every_outcome() {
    let (table, issues) = RouteTable::build(vec![
        r("catch-all").at(0, 0).done(),
        r("post").method("POST").at(1, 0).done(),
        r("canary").header("X-Env", "canary").at(2, 0).done(),
        r("debug").query("debug", "1").at(3, 0).done(),
        r("docs").prefix("/docs").at(4, 0).done(),
        r("both")
            .header("x-env", "canary")
            .query("v", "2")
            .at(5, 0)
            .done(),
        r("again").method("POST").at(6, 0).done(),
        r("bad").prefix("/a/./b").at(7, 0).done(),
        r("wildcard").host("*.example.com").at(8, 0).done(),
    ])
    .unwrap();
    assert_eq!(issues.len(), 2);
    let request = get().with_header("x-env", "canary");
    let why = table.explain_request(HOST, "/api?v=1", &request);
    let outcomes: Vec<(&str, String)> = why
        .candidates
        .iter()
        .map(|c| (c.spec.backend, c.outcome.to_string()))
        .collect();
    let winner = "ns/route rule 2 path 0";
    assert_eq!(
        outcomes,
        [
            ("catch-all", format!("matches, but {winner} comes first in Gateway API precedence (hostname, path, method, headers, query, age, rule order)")),
            ("post", "method does not match".into()),
            ("canary", "selected".into()),
            ("debug", "query parameter \"debug\" does not match".into()),
            ("docs", "path does not match".into()),
            ("both", "query parameter \"v\" does not match".into()),
            ("again", "method does not match".into()),
            ("bad", "not routed: path must not contain '.' or '..' segments (requests are matched with dot segments resolved)".into()),
            ("wildcard", "wildcard not consulted: a.example.com has its own routes".into()),
        ]
    );
    let names: Vec<&str> = why.candidates.iter().map(|c| c.outcome.as_str()).collect();
    assert_eq!(
        names,
        [
            "LowerPrecedence",
            "MethodDoesNotMatch",
            "Selected",
            "QueryDoesNotMatch",
            "PathDoesNotMatch",
            "QueryDoesNotMatch",
            "MethodDoesNotMatch",
            "PathDotSegment",
            "HostShadowed",
        ]
    );
    assert_eq!(why.winner.map(|m| *m.backend), Some("canary"));
    // A header mismatch, and a conflict loser whose conditions hold.
    let why = table.explain_request(HOST, "/?v=2", &SimpleRequest::new("POST"));
    let names: Vec<(&str, &str)> = why
        .candidates
        .iter()
        .map(|c| (c.spec.backend, c.outcome.as_str()))
        .take(7)
        .collect();
    assert_eq!(
        names,
        [
            ("catch-all", "LowerPrecedence"),
            ("post", "Selected"),
            ("canary", "HeaderDoesNotMatch"),
            ("debug", "QueryDoesNotMatch"),
            ("docs", "PathDoesNotMatch"),
            ("both", "HeaderDoesNotMatch"),
            ("again", "LostConflict"),
        ]
    );
    // `explain` is `explain_request` with a GET without headers.
    assert_eq!(
        table.explain(HOST, "/").winner.map(|m| *m.backend),
        Some("catch-all")
    );
}
