//! The routes of one port of a Gateway's own address ([`PortTable`]): the
//! listener a host selects, wildcards over several labels, precedence across
//! hostnames, restated cases of the upstream conformance suite, and a
//! property test against a naive reference (`support/naive.rs` for the
//! precedence, a scan for the listener).

mod support;

use std::sync::Arc;

use proptest::prelude::*;
use support::naive::{naive_host, naive_lookup_request};
use tuna_routing::{
    BuildIssue, GatewayMatch, ListenerSpecs, Matcher, Origin, PathType, PortTable, RouteSpec,
    SimpleRequest, TieBreak,
};

fn spec<B>(hostname: Option<&str>, path: &str, backend: B) -> RouteSpec<B> {
    RouteSpec {
        host: String::new(),
        path: path.into(),
        path_type: PathType::Prefix,
        backend,
        origin: Origin::default(),
        tie_break: TieBreak::default(),
        matcher: Matcher::Gateway(Arc::new(GatewayMatch {
            hostname: hostname.map(str::to_owned),
            ..GatewayMatch::default()
        })),
    }
}

fn listener<B>(hostname: Option<&str>, specs: Vec<RouteSpec<B>>) -> ListenerSpecs<B> {
    ListenerSpecs {
        hostname: hostname.map(str::to_owned),
        specs,
    }
}

fn route<'t>(table: &'t PortTable<&'static str>, host: &str, path: &str) -> Option<&'t str> {
    table
        .lookup_request(host, path, &SimpleRequest::get())
        .map(|m| *m.backend)
}

/// `HTTPRouteListenerHostnameMatching` (v1.6.1): four listeners on one
/// port, one route each; the most specific listener serves a host, and a
/// host no listener matches gets nothing.
#[test]
fn the_most_specific_listener_serves_a_host() {
    let (table, issues) = PortTable::build(vec![
        listener(Some("bar.com"), vec![spec(Some("bar.com"), "/", "v1")]),
        listener(
            Some("foo.bar.com"),
            vec![spec(Some("foo.bar.com"), "/", "v2")],
        ),
        listener(Some("*.bar.com"), vec![spec(Some("*.bar.com"), "/", "v3")]),
        listener(Some("*.foo.com"), vec![spec(Some("*.foo.com"), "/", "v4")]),
    ]);
    assert!(issues.is_empty(), "{issues:?}");
    for (host, want) in [
        ("bar.com", Some("v1")),
        ("foo.bar.com", Some("v2")),
        ("baz.bar.com", Some("v3")),
        ("boo.bar.com", Some("v3")),
        ("multiple.prefixes.bar.com", Some("v3")),
        ("multiple.prefixes.foo.com", Some("v4")),
        ("foo.com", None),
        ("no.matching.host", None),
    ] {
        assert_eq!(route(&table, host, "/"), want, "{host}");
    }
}

/// A less specific listener never serves a host a more specific one
/// claims, even when only it has a route for the path.
#[test]
fn a_selected_listener_does_not_fall_back_to_another() {
    let (table, _) = PortTable::build(vec![
        listener(
            Some("*.example.com"),
            vec![spec(Some("*.example.com"), "/", "wild")],
        ),
        listener(
            Some("shop.example.com"),
            vec![spec(Some("shop.example.com"), "/cart", "cart")],
        ),
        listener(None, vec![spec(None, "/", "any")]),
    ]);
    assert_eq!(route(&table, "shop.example.com", "/cart"), Some("cart"));
    assert_eq!(route(&table, "shop.example.com", "/"), None);
    assert_eq!(route(&table, "blog.example.com", "/"), Some("wild"));
    assert_eq!(route(&table, "example.com", "/"), Some("any"));
}

/// `HTTPRouteHostnameIntersection` / `HTTPRouteMatchingAcrossRoutes`:
/// within a listener, an exact hostname's specs come first, then the
/// wildcards' from the longest suffix, then those without a hostname, each
/// tried only when the more specific ones do not match.
#[test]
fn precedence_falls_back_across_hostnames() {
    let (table, issues) = PortTable::build(vec![listener(
        None,
        vec![
            spec(None, "/", "none"),
            spec(Some("*.example.com"), "/", "wild"),
            spec(Some("*.a.example.com"), "/deep", "deeper-wild"),
            spec(Some("b.a.example.com"), "/exact", "exact"),
        ],
    )]);
    assert!(issues.is_empty(), "{issues:?}");
    assert_eq!(route(&table, "b.a.example.com", "/exact/1"), Some("exact"));
    assert_eq!(
        route(&table, "b.a.example.com", "/deep"),
        Some("deeper-wild")
    );
    assert_eq!(route(&table, "b.a.example.com", "/other"), Some("wild"));
    assert_eq!(
        route(&table, "c.b.a.example.com", "/deep"),
        Some("deeper-wild")
    );
    assert_eq!(route(&table, "a.example.com", "/deep"), Some("wild"));
    assert_eq!(route(&table, "example.com", "/deep"), Some("none"));
    assert_eq!(route(&table, "10.0.0.1", "/"), Some("none"));
}

/// Hosts compare as elsewhere: any case, a port and one trailing dot
/// ignored; a request without a host reaches only a listener without a
/// hostname, and an invalid host nothing.
#[test]
fn hosts_are_canonical_and_a_missing_host_reaches_only_any() {
    let (table, _) = PortTable::build(vec![
        listener(Some("*.example.com"), vec![spec(None, "/", "wild")]),
        listener(None, vec![spec(None, "/", "any")]),
    ]);
    assert_eq!(route(&table, "A.Example.COM.:8080", "/"), Some("wild"));
    assert_eq!(route(&table, "", "/"), Some("any"));
    assert_eq!(route(&table, "a.example.com:http", "/"), None);
    let (only_named, _) = PortTable::build(vec![listener(
        Some("a.example.com"),
        vec![spec(None, "/", "a")],
    )]);
    assert_eq!(route(&only_named, "", "/"), None);
    assert!(!only_named.is_empty());
    assert!(PortTable::<()>::build(vec![]).0.is_empty());
}

/// Two listeners with one hostname: the first serves it. Conflicts and
/// invalid paths are reported in input order, across listeners.
#[test]
fn issues_follow_the_input_and_the_first_of_equal_listeners_serves() {
    let mut older = spec(Some("a.example.com"), "/x", "older");
    older.origin.path = 0;
    let mut newer = spec(Some("a.example.com"), "/x", "newer");
    newer.origin.path = 1;
    newer.tie_break.created = 1;
    let mut bad = spec(Some("a.example.com"), "/a/../b", "bad");
    bad.origin.path = 2;
    let (table, issues) = PortTable::build(vec![
        listener(Some("a.example.com"), vec![newer, older]),
        listener(Some("b.example.com"), vec![bad]),
        listener(Some("a.example.com"), vec![spec(None, "/", "second")]),
    ]);
    assert_eq!(route(&table, "a.example.com", "/x"), Some("older"));
    assert_eq!(route(&table, "a.example.com", "/"), None);
    let reported: Vec<(&str, usize)> = issues
        .iter()
        .map(|i| match i {
            BuildIssue::Conflict { loser, .. } => ("conflict", loser.path),
            BuildIssue::InvalidPath { origin, .. } => ("path", origin.path),
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(reported, [("conflict", 1), ("path", 2)]);
}

// ----- the property test ------------------------------------------------

/// Whether `hostname` (a listener's or a spec's; `None`: any) matches the
/// canonical request `host`, the Gateway API's way: a wildcard spans one or
/// more labels.
fn naive_matches(hostname: Option<&str>, host: &str) -> bool {
    match hostname {
        None => true,
        Some(h) => match h.strip_prefix("*.") {
            Some(suffix) => host.ends_with(&format!(".{suffix}")),
            None => h == host,
        },
    }
}

/// A hostname's specificity for listener selection: exact, then the
/// longest wildcard, then none. Larger wins.
fn naive_rank(hostname: Option<&str>) -> (u8, usize) {
    match hostname {
        None => (0, 0),
        Some(h) if h.starts_with("*.") => (1, h.len()),
        Some(h) => (2, h.len()),
    }
}

type Request = (String, String, String, Vec<(String, String)>);

fn naive_port(listeners: &[ListenerSpecs<u32>], request: &Request) -> Option<u32> {
    let (raw_host, target, method, headers) = request;
    let host = naive_host(raw_host)?;
    let chosen = listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| naive_matches(l.hostname.as_deref(), &host))
        .min_by_key(|(i, l)| (std::cmp::Reverse(naive_rank(l.hostname.as_deref())), *i))?
        .1;
    // Every spec of the listener whose hostname matches, on the request's
    // host: one Gateway host, ordered by the precedence.
    let pool: Vec<RouteSpec<u32>> = chosen
        .specs
        .iter()
        .filter(|s| match &s.matcher {
            Matcher::Gateway(m) => naive_matches(m.hostname.as_deref(), &host),
            Matcher::Ingress => false,
        })
        .map(|s| RouteSpec {
            host: host.clone(),
            ..s.clone()
        })
        .collect();
    naive_lookup_request(&pool, &host, target, method, headers).map(|i| pool[i].backend)
}

const HOSTNAMES: &[Option<&str>] = &[
    None,
    Some("a.example.com"),
    Some("b.a.example.com"),
    Some("*.example.com"),
    Some("*.a.example.com"),
    Some("example.com"),
];

fn listeners() -> impl Strategy<Value = Vec<ListenerSpecs<u32>>> {
    let one_spec = (
        prop::sample::select(HOSTNAMES.to_vec()),
        prop::sample::select(vec!["/", "/a", "/a/b", "/ab"]),
        prop::bool::ANY,
        0i64..2,
        prop::sample::select(vec![None, None, Some("POST")]),
    );
    let one_listener = (
        prop::sample::select(HOSTNAMES.to_vec()),
        prop::collection::vec(one_spec, 0..6),
    );
    prop::collection::vec(one_listener, 0..5).prop_map(|raw| {
        let mut n = 0u32;
        raw.into_iter()
            .map(|(hostname, specs)| ListenerSpecs {
                hostname: hostname.map(str::to_owned),
                specs: specs
                    .into_iter()
                    .map(|(h, path, exact, created, method)| {
                        n += 1;
                        RouteSpec {
                            host: String::new(),
                            path: path.into(),
                            path_type: if exact {
                                PathType::Exact
                            } else {
                                PathType::Prefix
                            },
                            backend: n,
                            origin: Origin {
                                namespace: "ns".into(),
                                name: "r".into(),
                                rule: 0,
                                path: n as usize,
                            },
                            tie_break: TieBreak {
                                created,
                                namespace: "ns".into(),
                                name: "r".into(),
                            },
                            matcher: Matcher::Gateway(Arc::new(GatewayMatch {
                                hostname: h.map(str::to_owned),
                                method: method.map(str::to_owned),
                                ..GatewayMatch::default()
                            })),
                        }
                    })
                    .collect(),
            })
            .collect()
    })
}

fn requests() -> impl Strategy<Value = Vec<Request>> {
    let one = (
        prop::sample::select(vec![
            "a.example.com",
            "B.A.example.com:8080",
            "c.b.a.example.com",
            "x.example.com",
            "example.com.",
            "other.org",
            "198.51.100.7",
        ]),
        prop::sample::select(vec!["/", "/a", "/a/b?x=1", "/ab", "/b", "/a/"]),
        prop::sample::select(vec!["GET", "POST"]),
    );
    prop::collection::vec(one, 1..12).prop_map(|raw| {
        raw.into_iter()
            .map(|(h, t, m)| (h.to_owned(), t.to_owned(), m.to_owned(), Vec::new()))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The compiled port (a table per listener and hostname, walked most
    /// specific first) routes as the naive reference: the listener by a
    /// scan, then one Gateway host of every spec of that listener whose
    /// hostname matches the request.
    #[test]
    fn port_table_agrees_with_reference(listeners in listeners(), requests in requests()) {
        let (table, _) = PortTable::build(listeners.clone());
        for request in &requests {
            let (host, target, method, _) = request;
            let got = table
                .lookup_request(host, target, &SimpleRequest::new(method))
                .map(|m| *m.backend);
            prop_assert_eq!(got, naive_port(&listeners, request), "{:?}", request);
        }
    }
}
