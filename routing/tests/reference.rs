//! Property tests: the compiled table against the naive reference in
//! `support/naive.rs`, on random route sets and random requests.

mod support;

use proptest::prelude::*;
use support::naive::{
    naive_host, naive_is_conflict_loser, naive_lookup, naive_lookup_request, naive_path,
};
use tuna_routing::{
    BuildIssue, GatewayMatch, HostTable, Matcher, Origin, PathType, RouteSpec, RouteTable,
    SimpleRequest, TieBreak, normalize_host, normalize_path,
};

/// Route segments: a small alphabet so that routes overlap often.
fn route_segment() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a",
        "b",
        "ab",
        "A",
        "c~",
        "%7E",
        "x:y",
        "%3F",
        "d",
        "e",
        "f",
        "abcdefgh",
        "abcdefghi",
        "abcdefghijk",
    ])
    .prop_map(String::from)
}

fn route_path() -> impl Strategy<Value = String> {
    (prop::collection::vec(route_segment(), 0..4), any::<bool>()).prop_map(|(segs, slash)| {
        let mut p = format!("/{}", segs.join("/"));
        if slash && !segs.is_empty() {
            p.push('/');
        }
        p
    })
}

fn path_type() -> impl Strategy<Value = PathType> {
    prop::sample::select(vec![
        PathType::Exact,
        PathType::Prefix,
        PathType::ImplementationSpecific,
    ])
}

fn spec() -> impl Strategy<Value = (String, String, PathType, i64, String)> {
    (
        prop::sample::select(vec![
            "a.example.com",
            "B.example.com",
            "*.example.com",
            "*.b.example.com",
            "example.com",
        ]),
        route_path(),
        path_type(),
        0i64..3,
        prop::sample::select(vec!["x", "y"]),
    )
        .prop_map(|(h, p, t, c, n)| (h.to_string(), p, t, c, n.to_string()))
}

fn specs() -> impl Strategy<Value = Vec<RouteSpec<u32>>> {
    prop::collection::vec(spec(), 0..24).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (host, path, path_type, created, name))| RouteSpec {
                host,
                path,
                path_type,
                backend: i as u32,
                origin: Origin {
                    namespace: "ns".into(),
                    name: name.clone(),
                    rule: i % 3,
                    path: i,
                },
                tie_break: TieBreak {
                    created,
                    namespace: "ns".into(),
                    name,
                },
                matcher: tuna_routing::Matcher::Ingress,
            })
            .collect()
    })
}

/// Request segments include everything the canonicalisation must handle.
fn request_segment() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a",
        "b",
        "ab",
        "A",
        "c~",
        "c%7e",
        "%7E",
        "x:y",
        "%3f",
        "%3F",
        "%61",
        "%2F",
        "%2f",
        ".",
        "..",
        "%2e",
        "%2E%2e",
        "",
        "a b",
        "%",
        "%zz",
        "{x}",
        "\\",
        "é",
        "abcdefgh",
        "abcdefghi",
        "abcdefghz",
        "abcdefghijk",
        "abcdefghijz",
        "abcdefgH",
    ])
    .prop_map(String::from)
}

fn request_path() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(request_segment(), 0..6),
        prop::sample::select(vec!["", "?", "?q=/a/../b", "#f"]),
    )
        .prop_map(|(segs, tail)| format!("/{}{}", segs.join("/"), tail))
}

fn request_host() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a.example.com",
        "A.EXAMPLE.COM.",
        "b.example.com:8080",
        "c.example.com",
        "x.b.example.com",
        "y.x.b.example.com",
        "example.com",
        "Example.com.:1",
        "example.com:x",
        "[::1]:80",
    ])
    .prop_map(String::from)
}

/// Requests that mostly hit the routes: a route's own host and path with a
/// suffix, mixed with fully random ones.
fn specs_and_requests() -> impl Strategy<Value = (Vec<RouteSpec<u32>>, Vec<(String, String)>)> {
    specs().prop_flat_map(|specs| {
        let derived: Vec<(String, String)> = specs
            .iter()
            .map(|s| (s.host.replace('*', "w"), s.path.clone()))
            .collect();
        let n = derived.len().max(1);
        let one = (
            any::<bool>(),
            0..n,
            prop::sample::select(vec![
                "", "/", "/a", "/b/", "/x/y", "?q=1", "/./", "/..", "//",
            ]),
            request_host(),
            request_path(),
        )
            .prop_map(
                move |(use_route, i, suffix, host, path)| match derived.get(i) {
                    Some((h, p)) if use_route => (h.clone(), format!("{p}{suffix}")),
                    _ => (host, path),
                },
            );
        (Just(specs), prop::collection::vec(one, 1..16))
    })
}

/// Pairs with distinct names (case-insensitively), from a small pool.
fn named_pairs(
    pool: &'static [(&'static str, &'static str)],
) -> impl Strategy<Value = Vec<(String, String)>> {
    prop::sample::subsequence(pool.to_vec(), 0..=2).prop_map(|picked| {
        let mut out: Vec<(String, String)> = Vec::new();
        for (n, v) in picked {
            if !out.iter().any(|(m, _)| m.eq_ignore_ascii_case(n)) {
                out.push((n.to_string(), v.to_string()));
            }
        }
        out
    })
}

/// Ingress (`None`) or a Gateway match over a small pool of conditions.
fn matcher() -> impl Strategy<Value = Option<GatewayMatch>> {
    let gateway = (
        prop::sample::select(vec![
            None,
            Some("a.example.com"),
            Some("*.example.com"),
            None,
        ]),
        prop::sample::select(vec![None, None, None, Some("GET"), Some("POST")]),
        named_pairs(&[("x-a", "1"), ("X-A", "2"), ("x-b", "1")]),
        named_pairs(&[("q", "1"), ("q", "2"), ("r", "1"), ("q r", "1 2")]),
    )
        .prop_map(|(hostname, method, headers, query)| GatewayMatch {
            hostname: hostname.map(Into::into),
            method: method.map(Into::into),
            headers,
            query,
        });
    prop_oneof![1 => Just(None), 3 => gateway.prop_map(Some)]
}

/// Specs over three hosts and few paths, most with Gateway matches: some
/// hosts end up Ingress-only, most are matched by Gateway API precedence.
fn gateway_specs() -> impl Strategy<Value = Vec<RouteSpec<u32>>> {
    let one = (
        prop::sample::select(vec![
            "a.example.com",
            "a.example.com",
            "*.example.com",
            "example.com",
        ]),
        // Few paths, so that specs share one often and the keys after
        // the path decide.
        prop::sample::select(vec!["/", "/a", "/a/", "/a/b", "/ab"]).prop_map(String::from),
        path_type(),
        0i64..2,
        prop::sample::select(vec!["x", "y"]),
        matcher(),
    );
    prop::collection::vec(one, 0..16).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (host, path, path_type, created, name, m))| RouteSpec {
                host: host.into(),
                path,
                path_type,
                backend: i as u32,
                origin: Origin {
                    namespace: "ns".into(),
                    name: name.into(),
                    rule: i % 2,
                    path: i,
                },
                tie_break: TieBreak {
                    created,
                    namespace: "ns".into(),
                    name: name.into(),
                },
                matcher: m.map_or(Matcher::Ingress, |m| {
                    Matcher::Gateway(std::sync::Arc::new(m))
                }),
            })
            .collect()
    })
}

/// A request: host, target (path and query), method, headers.
type GatewayRequest = (String, String, String, Vec<(String, String)>);

fn gateway_specs_and_requests() -> impl Strategy<Value = (Vec<RouteSpec<u32>>, Vec<GatewayRequest>)>
{
    gateway_specs().prop_flat_map(|specs| {
        // A route's host, path and, for Gateway specs, the method, headers
        // and query that satisfy it: requests that meet several specs are
        // what tell the precedence keys apart.
        let derived: Vec<GatewayRequest> = specs
            .iter()
            .map(|s| {
                let (method, headers, query) = match &s.matcher {
                    Matcher::Gateway(m) => (
                        m.method.clone().unwrap_or_else(|| "GET".into()),
                        m.headers.clone(),
                        m.query
                            .iter()
                            .map(|(n, v)| {
                                format!("{}={}", n.replace(' ', "%20"), v.replace(' ', "%20"))
                            })
                            .collect::<Vec<_>>()
                            .join("&"),
                    ),
                    Matcher::Ingress => ("GET".into(), vec![], String::new()),
                };
                (
                    s.host.replace('*', "w"),
                    format!("{}?{query}", s.path),
                    method,
                    headers,
                )
            })
            .collect();
        let n = derived.len().max(1);
        let one = (
            (0..3u8, 0..n, 0..n),
            prop::sample::select(vec!["", "/", "/a", "/b/", "/x/y"]),
            request_host(),
            request_path(),
            prop::sample::select(vec![
                "",
                "?q=1",
                "?q=2&q=1",
                "?%71=%31",
                "?r=1&q=2",
                "?q",
                "?q%20r=1%202",
                "?q+r=1+2",
                "#?q=1",
                "?r=1&q=1#x",
            ]),
            prop::sample::select(vec!["GET", "POST", "get"]),
            prop::collection::vec(
                prop::sample::select(vec![("X-A", "1"), ("x-a", "2"), ("x-b", "1"), ("X-B", "2")]),
                0..3,
            ),
        )
            .prop_map(
                move |((how, i, j), suffix, host, path, query, method, headers)| {
                    let random_headers: Vec<(String, String)> = headers
                        .into_iter()
                        .map(|(n, v)| (n.to_string(), v.to_string()))
                        .collect();
                    match (how, derived.get(i), derived.get(j)) {
                        // Random everything.
                        (0, _, _) | (_, None, _) | (_, _, None) => (
                            host,
                            format!("{}{query}", path.split(['?', '#']).next().unwrap()),
                            method.to_string(),
                            random_headers,
                        ),
                        // One spec's request, a path suffix, extra headers last.
                        (1, Some((h, p, m, hs)), _) => {
                            let (p, q) = p.split_once('?').unwrap();
                            let mut hs = hs.clone();
                            hs.extend(random_headers);
                            (h.clone(), format!("{p}{suffix}?{q}"), m.clone(), hs)
                        }
                        // Two specs' conditions at once, on the first's path.
                        (_, Some((h, p, m, hs)), Some((_, p2, _, hs2))) => {
                            let q2 = p2.split_once('?').unwrap().1;
                            let mut hs = hs.clone();
                            hs.extend(hs2.iter().cloned());
                            (h.clone(), format!("{p}&{q2}"), m.clone(), hs)
                        }
                    }
                },
            );
        (Just(specs), prop::collection::vec(one, 1..16))
    })
}

proptest! {
    // More cases than below: two specs must meet on one path and hostname
    // rank, with conditions one request satisfies, before the later keys
    // of the order are exercised (at 512, swapping the header and query
    // keys went unnoticed in about one run of three).
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Gateway hosts: the compiled table (lookup, explain, conflicts)
    /// against the naive reference, which scans every spec and takes the
    /// minimum of the precedence written out as one key.
    #[test]
    fn gateway_table_agrees_with_reference((specs, requests) in gateway_specs_and_requests()) {
        let (table, issues) = RouteTable::build(specs.clone()).unwrap();
        for (host, target, method, headers) in &requests {
            let request = SimpleRequest { method: method.clone(), headers: headers.clone() };
            let got = table.lookup_request(host, target, &request).map(|m| *m.backend as usize);
            let want = naive_lookup_request(&specs, host, target, method, headers);
            prop_assert_eq!(got, want, "lookup_request({:?}, {:?}, {:?})", host, target, request);
            let why = table.explain_request(host, target, &request);
            prop_assert_eq!(why.winner.map(|m| *m.backend as usize), want);
            let selected = why.candidates.iter().filter(|c| c.outcome == tuna_routing::Outcome::Selected).count();
            prop_assert_eq!(selected, usize::from(want.is_some()));
        }
        let losers: Vec<usize> = (0..specs.len()).filter(|&i| naive_is_conflict_loser(&specs, i)).collect();
        let reported: Vec<usize> = issues
            .iter()
            .map(|issue| match issue {
                BuildIssue::Conflict { loser, .. } => loser.path,
                other => panic!("unexpected issue {other}"),
            })
            .collect();
        prop_assert_eq!(reported, losers);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]


    #[test]
    fn table_agrees_with_reference((specs, requests) in specs_and_requests()) {
        let (table, issues) = RouteTable::build(specs.clone()).unwrap();
        for (host, path) in &requests {
            let got = table.lookup(host, path).map(|m| *m.backend as usize);
            let want = naive_lookup(&specs, host, path);
            prop_assert_eq!(got, want, "lookup({:?}, {:?})", host, path);
            let why = table.explain(host, path);
            prop_assert_eq!(why.winner.map(|m| *m.backend as usize), want);
            prop_assert_eq!(why.candidates.iter().filter(|c| c.outcome == tuna_routing::Outcome::Selected).count(), usize::from(want.is_some()));
        }
        let losers: Vec<usize> = (0..specs.len()).filter(|&i| naive_is_conflict_loser(&specs, i)).collect();
        let reported: Vec<usize> = issues
            .iter()
            .map(|issue| match issue {
                BuildIssue::Conflict { loser, .. } => loser.path,
                other => panic!("unexpected issue {other}"),
            })
            .collect();
        prop_assert_eq!(reported, losers);
    }

    /// The proxy compiles each host alone and assembles the table from the
    /// compiled hosts: that must route, report and explain exactly as one
    /// build of every spec.
    #[test]
    fn hosts_compiled_alone_agree_with_one_build((specs, requests) in specs_and_requests()) {
        let (whole, whole_issues) = RouteTable::build(specs.clone()).unwrap();
        let mut by_host: std::collections::BTreeMap<String, Vec<RouteSpec<u32>>> = Default::default();
        for spec in &specs {
            let host = spec.host.trim_end_matches('.').to_ascii_lowercase();
            by_host.entry(host).or_default().push(spec.clone());
        }
        let mut hosts = Vec::new();
        let mut issues = Vec::new();
        for (host, specs) in by_host {
            let Ok((table, host_issues)) = HostTable::build(&host, specs) else {
                continue; // an invalid host: one build reports it and routes nothing
            };
            prop_assert_eq!(table.name(), host.as_str());
            issues.extend(host_issues.iter().map(|i| i.to_string()));
            hosts.push(std::sync::Arc::new(table));
        }
        let assembled = RouteTable::from_hosts(hosts);
        let mut whole_issues: Vec<String> = whole_issues
            .iter()
            .filter(|i| !matches!(i, BuildIssue::InvalidHost { .. }))
            .map(|i| i.to_string())
            .collect();
        whole_issues.sort();
        issues.sort();
        prop_assert_eq!(issues, whole_issues);
        prop_assert_eq!(assembled.hosts().collect::<Vec<_>>(), whole.hosts().collect::<Vec<_>>());
        for (host, path) in &requests {
            let got = assembled.lookup(host, path).map(|m| *m.backend);
            prop_assert_eq!(got, whole.lookup(host, path).map(|m| *m.backend));
            let outcomes = |t: &RouteTable<u32>| {
                // Across an exact host and its wildcard, input order is known to
                // one build only: compare as sets.
                let mut v = t.explain(host, path).candidates.iter().map(|c| (c.spec.backend, c.outcome.clone())).collect::<Vec<_>>();
                v.sort_by_key(|(b, _)| *b);
                v
            };
            prop_assert_eq!(outcomes(&assembled), outcomes(&whole));
        }
    }

    /// The proxy changes its table one host at a time, on a clone of the
    /// live one: every version must route as one build of its own specs,
    /// while the versions share every host they did not change.
    #[test]
    fn tables_changed_one_host_at_a_time_agree_with_builds((specs, requests) in specs_and_requests()) {
        let mut by_host: std::collections::BTreeMap<String, Vec<RouteSpec<u32>>> = Default::default();
        for spec in &specs {
            let host = spec.host.trim_end_matches('.').to_ascii_lowercase();
            by_host.entry(host).or_default().push(spec.clone());
        }
        let compiled: Vec<_> = by_host
            .into_iter()
            .filter_map(|(host, specs)| {
                let (table, _) = HostTable::build(&host, specs.clone()).ok()?;
                Some((host, std::sync::Arc::new(table), specs))
            })
            .collect();
        let full = RouteTable::from_hosts(compiled.iter().map(|(_, t, _)| t.clone()));
        // Every other host removed from a clone, then set again on a clone of that.
        let mut fewer = full.clone();
        for (host, _, _) in compiled.iter().step_by(2) {
            prop_assert!(fewer.remove_host(host).is_some(), "{host} not in the table");
            prop_assert!(fewer.remove_host(host).is_none(), "{host} removed twice");
        }
        let mut again = fewer.clone();
        for (_, table, _) in compiled.iter().step_by(2).rev() {
            prop_assert!(again.set_host(table.clone()).is_none());
        }
        let kept: Vec<RouteSpec<u32>> = compiled.iter().skip(1).step_by(2).flat_map(|(_, _, s)| s.clone()).collect();
        let all: Vec<RouteSpec<u32>> = compiled.iter().flat_map(|(_, _, s)| s.clone()).collect();
        for (version, specs) in [(&full, &all), (&fewer, &kept), (&again, &all)] {
            let (built, _) = RouteTable::build(specs.clone()).unwrap();
            prop_assert_eq!(version.hosts().collect::<Vec<_>>(), built.hosts().collect::<Vec<_>>());
            for (host, path) in &requests {
                prop_assert_eq!(
                    version.lookup(host, path).map(|m| *m.backend),
                    built.lookup(host, path).map(|m| *m.backend),
                    "{}{}", host, path
                );
            }
        }
    }

    #[test]
    fn path_canonicalisation_agrees_with_reference(path in request_path()) {
        let got = normalize_path(&path).map(|p| p.into_owned());
        prop_assert_eq!(&got, &naive_path(&path));
        // Idempotent: a canonical path is its own canonical form.
        if let Some(c) = got {
            let again = normalize_path(&c).map(|p| p.into_owned());
            prop_assert_eq!(again, Some(c));
        }
    }

    #[test]
    fn arbitrary_paths_canonicalise_consistently(path in "/[a-zA-Z0-9%./?~ é-]{0,40}") {
        let got = normalize_path(&path).map(|p| p.into_owned());
        prop_assert_eq!(&got, &naive_path(&path));
    }

    #[test]
    fn host_normalisation_agrees_with_reference(host in "[a-zA-Z.:\\[\\]0-9]{0,20}") {
        prop_assert_eq!(normalize_host(&host).map(|h| h.into_owned()), naive_host(&host));
    }
}
