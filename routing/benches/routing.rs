//! Route lookup and table build, side by side with a naive linear scan (same
//! semantics) and raw `matchit` (equivalent routes, no canonicalisation).
//!
//! Shapes: `many_hosts` (n/5 hosts × 5 paths each) and `one_host` (1 host ×
//! n paths). `tuna`, `matchit` and `naive` take, at each iteration, the next
//! request of a fixed, shuffled list of up to 1024 hits spread over the whole
//! table, so caches see a realistic spread rather than one hot route;
//! `tuna_hot` and `matchit_hot` repeat one request, which keeps the touched
//! cache lines hot and shows the algorithmic cost alone.
//!
//! `lookup/gateway_hosts` compares, in one run, hosts matched by Gateway
//! API precedence (8 HTTPRoute-style matches each: prefixes, an Exact, a
//! method, a header and a query condition) with Ingress-only hosts of the
//! same shape (the same hosts and distinct paths, no conditions), both
//! through `lookup_request` with the same requests, each a head in one
//! buffer as the proxy's parser leaves it ([`Head`]).
//!
//! `lookup/gateway_port` compares, in one run, a port of a Gateway's own
//! address ([`PortTable`]: one listener for every host, n exact hostnames
//! with 5 paths each, a wildcard over them all with 5 paths, a catch-all)
//! with the same routes as the shared ports install them (a `RouteTable`
//! with one host per exact hostname, the wildcard's specs copied into each
//! for the fallback across hostnames): `exact` requests are served by an
//! exact hostname's spec, `fallback` ones by the wildcard's (the port table
//! then tries two tables, the shared table one).

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tuna_routing::{
    GatewayMatch, HostTable, ListenerSpecs, Matcher, Origin, PathType, PortTable, RequestView,
    RouteSpec, RouteTable, SimpleRequest, TieBreak, normalize_host, normalize_path,
};

/// The product's allocator (src/main.rs), so that tables lie in memory as
/// they do in the proxy.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [usize; 4] = [10, 1_000, 10_000, 100_000];

fn spec(host: String, path: String, path_type: PathType, backend: u32) -> RouteSpec<u32> {
    RouteSpec {
        host,
        path,
        path_type,
        backend,
        origin: Origin::default(),
        tie_break: TieBreak::default(),
        matcher: tuna_routing::Matcher::Ingress,
    }
}

/// n routes over n/5 hosts, each with a typical small app's paths.
fn many_hosts(n: usize) -> (Vec<RouteSpec<u32>>, Vec<(String, String)>) {
    let hosts = (n / 5).max(1);
    let mut specs = Vec::with_capacity(n);
    let mut requests = Vec::new();
    for h in 0..hosts {
        let host = format!("app{h}.tenant{}.example.com", h % 97);
        let base = (h * 5) as u32;
        specs.push(spec(host.clone(), "/".into(), PathType::Prefix, base));
        specs.push(spec(
            host.clone(),
            "/api".into(),
            PathType::Prefix,
            base + 1,
        ));
        specs.push(spec(
            host.clone(),
            "/api/v1/users".into(),
            PathType::Prefix,
            base + 2,
        ));
        specs.push(spec(
            host.clone(),
            "/api/health".into(),
            PathType::Exact,
            base + 3,
        ));
        specs.push(spec(
            host.clone(),
            "/static".into(),
            PathType::Prefix,
            base + 4,
        ));
        requests.push((host.clone(), "/api/v1/users/42?expand=true".to_string()));
        requests.push((host.clone(), "/static/js/app.js".to_string()));
        requests.push((host, "/api/health".to_string()));
    }
    (specs, spread(requests))
}

/// n routes on one host: `/svc{i}/v1` prefixes.
fn one_host(n: usize) -> (Vec<RouteSpec<u32>>, Vec<(String, String)>) {
    let host = "api.example.com".to_string();
    let specs: Vec<_> = (0..n)
        .map(|i| {
            spec(
                host.clone(),
                format!("/svc{i}/v1"),
                PathType::Prefix,
                i as u32,
            )
        })
        .collect();
    let requests = (0..n)
        .map(|i| (host.clone(), format!("/svc{i}/v1/items/42")))
        .collect();
    (specs, spread(requests))
}

/// Up to 1024 requests spread evenly over the list, in a scrambled order.
fn spread(all: Vec<(String, String)>) -> Vec<(String, String)> {
    let step = (all.len() / 1024).max(1);
    let mut picked: Vec<_> = all.into_iter().step_by(step).take(1024).collect();
    // A fixed multiplicative scramble: deterministic, no rand dependency.
    let len = picked.len();
    for i in 0..len {
        let j = (i * 7919 + 13) % len;
        picked.swap(i, j);
    }
    picked
}

/// The naive router: every lookup scans every route, with the same rules.
struct Naive {
    routes: Vec<(String, String, bool, u32)>, // host, canonical key path, exact, backend
}

impl Naive {
    fn new(specs: &[RouteSpec<u32>]) -> Self {
        let routes = specs
            .iter()
            .map(|s| {
                let path = normalize_path(&s.path).unwrap().into_owned();
                let exact = s.path_type == PathType::Exact;
                let key = if exact {
                    path
                } else {
                    path.trim_end_matches('/').to_owned()
                };
                (s.host.to_ascii_lowercase(), key, exact, s.backend)
            })
            .collect();
        Naive { routes }
    }

    fn lookup(&self, host: &str, path: &str) -> Option<u32> {
        let host = normalize_host(host)?;
        let path = normalize_path(path)?;
        let mut best: Option<(usize, bool, u32)> = None;
        for (h, key, exact, backend) in &self.routes {
            if *h != *host {
                continue;
            }
            let hit = if *exact {
                **key == *path
            } else {
                key.is_empty()
                    || *path == **key
                    || (path.starts_with(key.as_str()) && path.as_bytes()[key.len()] == b'/')
            };
            if hit && best.is_none_or(|(len, ex, _)| (key.len(), *exact) > (len, ex)) {
                best = Some((key.len(), *exact, *backend));
            }
        }
        best.map(|(_, _, b)| b)
    }
}

/// Raw matchit: one router per host, Prefix p as `p`, `p/`, `p/{*rest}`.
fn raw_matchit(specs: &[RouteSpec<u32>]) -> HashMap<String, matchit::Router<u32>> {
    let mut hosts: HashMap<String, matchit::Router<u32>> = HashMap::new();
    for s in specs {
        let router = hosts.entry(s.host.clone()).or_default();
        let p = s.path.trim_end_matches('/');
        if s.path_type == PathType::Exact {
            router.insert(s.path.clone(), s.backend).unwrap();
        } else if p.is_empty() {
            router.insert("/", s.backend).unwrap();
            router.insert("/{*rest}", s.backend).unwrap();
        } else {
            router.insert(p, s.backend).unwrap();
            router.insert(format!("{p}/"), s.backend).unwrap();
            router.insert(format!("{p}/{{*rest}}"), s.backend).unwrap();
        }
    }
    hosts
}

fn matchit_lookup(
    hosts: &HashMap<String, matchit::Router<u32>>,
    host: &str,
    path: &str,
) -> Option<u32> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    hosts.get(host)?.at(path).ok().map(|m| *m.value)
}

fn lookups(c: &mut Criterion) {
    for (shape, make) in [
        ("many_hosts", many_hosts as fn(usize) -> _),
        ("one_host", one_host),
    ] {
        let mut group = c.benchmark_group(format!("lookup/{shape}"));
        for n in SIZES {
            let (specs, requests) = make(n);
            let (table, issues) = RouteTable::build(specs.clone()).unwrap();
            assert!(issues.is_empty());
            let naive = Naive::new(&specs);
            let raw = raw_matchit(&specs);
            // The three must agree before their speed means anything.
            for (h, p) in &requests {
                let want = table.lookup(h, p).map(|m| *m.backend);
                assert!(want.is_some(), "{h}{p}");
                assert_eq!(naive.lookup(h, p), want, "naive {h}{p}");
                assert_eq!(matchit_lookup(&raw, h, p), want, "matchit {h}{p}");
            }
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new("tuna", n), |b| {
                b.iter(|| {
                    let (h, p) = &requests[i % requests.len()];
                    i = i.wrapping_add(1);
                    black_box(table.lookup(black_box(h), black_box(p)).map(|m| *m.backend))
                })
            });
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new("matchit", n), |b| {
                b.iter(|| {
                    let (h, p) = &requests[i % requests.len()];
                    i = i.wrapping_add(1);
                    black_box(matchit_lookup(&raw, black_box(h), black_box(p)))
                })
            });
            // One request over and over: the table's cache lines stay hot, so
            // this isolates the algorithm's cost from memory latency.
            let (hot_host, hot_path) = &requests[requests.len() / 2];
            group.bench_function(BenchmarkId::new("tuna_hot", n), |b| {
                b.iter(|| {
                    black_box(
                        table
                            .lookup(black_box(hot_host), black_box(hot_path))
                            .map(|m| *m.backend),
                    )
                })
            });
            group.bench_function(BenchmarkId::new("matchit_hot", n), |b| {
                b.iter(|| {
                    black_box(matchit_lookup(
                        &raw,
                        black_box(hot_host),
                        black_box(hot_path),
                    ))
                })
            });
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new("naive", n), |b| {
                b.iter(|| {
                    let (h, p) = &requests[i % requests.len()];
                    i = i.wrapping_add(1);
                    black_box(naive.lookup(black_box(h), black_box(p)))
                })
            });
        }
        group.finish();
    }
}

/// `hosts` hosts with 8 Gateway matches each, the Ingress-only specs of
/// the same hosts and distinct paths, and requests (host, target, request)
/// with the backend each must reach on the Gateway table.
#[allow(clippy::type_complexity)]
fn gateway_hosts(
    hosts: usize,
) -> (
    Vec<RouteSpec<u32>>,
    Vec<RouteSpec<u32>>,
    Vec<(String, String, SimpleRequest, u32)>,
) {
    let mut gateway = Vec::with_capacity(hosts * 8);
    let mut ingress = Vec::with_capacity(hosts * 6);
    let mut requests = Vec::new();
    for h in 0..hosts {
        let host = format!("app{h}.tenant{}.example.com", h % 97);
        let base = (h * 8) as u32;
        let pairs = |n: &str, v: &str| vec![(n.to_string(), v.to_string())];
        let matches: [(
            &str,
            PathType,
            Option<&str>,
            Vec<(String, String)>,
            Vec<(String, String)>,
        ); 8] = [
            ("/", PathType::Prefix, None, vec![], vec![]),
            ("/api", PathType::Prefix, Some("GET"), vec![], vec![]),
            ("/api", PathType::Prefix, Some("POST"), vec![], vec![]),
            (
                "/api/v1/users",
                PathType::Prefix,
                None,
                pairs("x-version", "2"),
                vec![],
            ),
            ("/api/v1/users", PathType::Prefix, None, vec![], vec![]),
            ("/api/health", PathType::Exact, None, vec![], vec![]),
            ("/static", PathType::Prefix, None, vec![], vec![]),
            (
                "/api/v1",
                PathType::Prefix,
                None,
                vec![],
                pairs("debug", "1"),
            ),
        ];
        let mut seen = std::collections::HashSet::new();
        for (i, (path, path_type, method, headers, query)) in matches.into_iter().enumerate() {
            let m = GatewayMatch {
                hostname: Some(host.clone()),
                method: method.map(Into::into),
                headers,
                query,
            };
            let backend = base + i as u32;
            if seen.insert((path, path_type)) {
                ingress.push(spec(host.clone(), path.into(), path_type, backend));
            }
            gateway.push(RouteSpec {
                matcher: Matcher::Gateway(Arc::new(m)),
                ..spec(host.clone(), path.into(), path_type, backend)
            });
        }
        let get = SimpleRequest::get()
            .with_header("user-agent", "bench")
            .with_header("accept", "*/*");
        let versioned = get.clone().with_header("X-Version", "2");
        let post = SimpleRequest {
            method: "POST".into(),
            ..get.clone()
        };
        requests.push((
            host.clone(),
            "/api/v1/users/42?expand=true".into(),
            versioned,
            base + 3,
        ));
        requests.push((
            host.clone(),
            "/api/v1/users/42?expand=true".into(),
            get.clone(),
            base + 4,
        ));
        requests.push((
            host.clone(),
            "/static/js/app.js".into(),
            get.clone(),
            base + 6,
        ));
        requests.push((host.clone(), "/api/health".into(), get.clone(), base + 5));
        requests.push((host.clone(), "/api/cart".into(), post, base + 2));
        requests.push((host, "/api/v1/orders?page=2&debug=1".into(), get, base + 7));
    }
    let step = (requests.len() / 1024).max(1);
    let mut picked: Vec<_> = requests.into_iter().step_by(step).take(1024).collect();
    let len = picked.len();
    for i in 0..len {
        picked.swap(i, (i * 7919 + 13) % len);
    }
    (gateway, ingress, picked)
}

/// A request head as the proxy's parser leaves it (`tuna_http1::Request`
/// over the bytes just read): one buffer holding the method, target, host
/// and headers, and the places of its parts, with no allocation per header.
/// Both tables are looked up with the same heads.
struct Head {
    text: Box<str>,
    method: (u16, u16),
    host: (u16, u16),
    target: (u16, u16),
    headers: [(u16, u16, u16, u16); 4],
    count: usize,
}

impl Head {
    fn new(host: &str, target: &str, request: &SimpleRequest) -> Self {
        let mut text = String::new();
        let mut put = |part: &str| {
            let start = text.len() as u16;
            text.push_str(part);
            text.push(' ');
            (start, start + part.len() as u16)
        };
        let method = put(&request.method);
        let target = put(target);
        let host = put(host);
        let mut headers = [(0, 0, 0, 0); 4];
        assert!(request.headers.len() <= headers.len());
        for (slot, (name, value)) in headers.iter_mut().zip(&request.headers) {
            let (n, v) = (put(name), put(value));
            *slot = (n.0, n.1, v.0, v.1);
        }
        Head {
            text: text.into(),
            method,
            host,
            target,
            headers,
            count: request.headers.len(),
        }
    }

    fn part(&self, (start, end): (u16, u16)) -> &str {
        &self.text[start as usize..end as usize]
    }

    fn host(&self) -> &str {
        self.part(self.host)
    }

    fn target(&self) -> &str {
        self.part(self.target)
    }
}

impl RequestView for Head {
    fn method(&self) -> &str {
        self.part(self.method)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers[..self.count]
            .iter()
            .find(|h| self.part((h.0, h.1)).eq_ignore_ascii_case(name))
            .map(|h| self.part((h.2, h.3)))
    }
}

fn gateway_lookups(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup/gateway_hosts");
    for hosts in [1_000, 10_000] {
        let (gateway, ingress, requests) = gateway_hosts(hosts);
        let (gateway, issues) = RouteTable::build(gateway).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        let (ingress, issues) = RouteTable::build(ingress).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        // The requests as heads in one buffer each, made after the tables
        // are built: a request the proxy has just parsed lies together and
        // is hot in cache. A `SimpleRequest` keeps every header name and
        // value in a `String` of its own, and left where generation put
        // them (among 10 000 hosts' specs) its strings cost a Gateway
        // lookup, which reads the method and headers, cache lines and page
        // walks the proxy's lookups never make (benches/README.md).
        let requests: Vec<_> = requests
            .iter()
            .map(|(h, t, r, want)| (Head::new(h, t, r), *want))
            .collect();
        for (head, want) in &requests {
            let (h, t, r) = (head.host(), head.target(), head);
            let got = gateway.lookup_request(h, t, r).map(|m| *m.backend);
            assert_eq!(got, Some(*want), "{}", head.text);
            assert!(ingress.lookup_request(h, t, r).is_some(), "{h}{t}");
        }
        for (name, table) in [("gateway", &gateway), ("ingress", &ingress)] {
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new(name, hosts), |b| {
                b.iter(|| {
                    let (r, _) = &requests[i % requests.len()];
                    i = i.wrapping_add(1);
                    black_box(
                        table
                            .lookup_request(black_box(r.host()), black_box(r.target()), r)
                            .map(|m| *m.backend),
                    )
                })
            });
        }
    }
    group.finish();
}

/// A Gateway spec: `host` is the table's key on the shared ports, the
/// hostname the one it serves through.
fn port_spec(host: &str, hostname: Option<&str>, path: &str, backend: u32) -> RouteSpec<u32> {
    let mut s = spec(host.to_owned(), path.to_owned(), PathType::Prefix, backend);
    s.matcher = Matcher::Gateway(Arc::new(GatewayMatch {
        hostname: hostname.map(str::to_owned),
        ..GatewayMatch::default()
    }));
    s
}

fn gateway_port(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup/gateway_port");
    let paths = ["/a", "/b/c", "/d", "/e/f/g", "/h"];
    let wild_paths = ["/w", "/x/y", "/z", "/q/r", "/s"];
    for hosts in [100, 10_000] {
        let mut port_specs = Vec::new();
        let mut shared_specs = Vec::new();
        let mut backend = 0;
        for i in 0..hosts {
            let host = format!("h{i}.example.com");
            for p in paths {
                backend += 1;
                port_specs.push(port_spec("", Some(&host), p, backend));
                shared_specs.push(port_spec(&host, Some(&host), p, backend));
            }
            for (k, p) in wild_paths.iter().enumerate() {
                shared_specs.push(port_spec(
                    &host,
                    Some("*.example.com"),
                    p,
                    1_000_000 + k as u32,
                ));
            }
        }
        for (k, p) in wild_paths.iter().enumerate() {
            port_specs.push(port_spec(
                "",
                Some("*.example.com"),
                p,
                1_000_000 + k as u32,
            ));
        }
        port_specs.push(port_spec("", None, "/", 2_000_000));
        let (port, issues) = PortTable::build(vec![ListenerSpecs {
            hostname: None,
            specs: port_specs,
        }]);
        assert!(issues.is_empty(), "{issues:?}");
        let (shared, issues) = RouteTable::build(shared_specs).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        let get = SimpleRequest::get();
        let requests = |fallback: bool| {
            let all: Vec<(String, String)> = (0..hosts)
                .flat_map(|i| {
                    let host = format!("h{i}.example.com");
                    let list = if fallback { wild_paths } else { paths };
                    list.iter()
                        .map(move |p| (host.clone(), format!("{p}/x")))
                        .collect::<Vec<_>>()
                })
                .collect();
            spread(all)
        };
        for (case, fallback) in [("exact", false), ("fallback", true)] {
            let requests = requests(fallback);
            for (h, t) in &requests {
                let a = port.lookup_request(h, t, &get).map(|m| *m.backend);
                let b = shared.lookup_request(h, t, &get).map(|m| *m.backend);
                assert!(a.is_some() && a == b, "{h}{t}: {a:?} {b:?}");
            }
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new(format!("port_{case}"), hosts), |b| {
                b.iter(|| {
                    let (h, t) = &requests[i % requests.len()];
                    i = i.wrapping_add(1);
                    black_box(
                        port.lookup_request(black_box(h), black_box(t), &get)
                            .map(|m| *m.backend),
                    )
                })
            });
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new(format!("shared_{case}"), hosts), |b| {
                b.iter(|| {
                    let (h, t) = &requests[i % requests.len()];
                    i = i.wrapping_add(1);
                    black_box(
                        shared
                            .lookup_request(black_box(h), black_box(t), &get)
                            .map(|m| *m.backend),
                    )
                })
            });
        }
    }
    group.finish();
}

fn builds(c: &mut Criterion) {
    let mut group = c.benchmark_group("build");
    group.sample_size(10);
    for (shape, make) in [
        ("many_hosts", many_hosts as fn(usize) -> _),
        ("one_host", one_host),
    ] {
        for n in [10_000, 100_000] {
            let (specs, _) = make(n);
            group.bench_function(BenchmarkId::new(shape, n), |b| {
                b.iter_batched(
                    || specs.clone(),
                    |specs| black_box(RouteTable::build(specs).unwrap()),
                    criterion::BatchSize::LargeInput,
                )
            });
        }
    }
    group.finish();
}

/// One host changes among 10 000 (5 paths each): what it costs to make the
/// change routable. `whole` is the first way, compiling every host again;
/// `one_host` compiles the changed host alone; `assemble` builds the table
/// from the compiled hosts (the second way, `one_host + assemble`); `set_host`
/// sets the compiled host on a clone of the live table, which shares every
/// other host — the proxy's way now, `one_host + set_host` per change.
fn changes(c: &mut Criterion) {
    let mut group = c.benchmark_group("change_of_one_host/10000_hosts");
    let (specs, _) = many_hosts(50_000);
    let mut by_host: std::collections::BTreeMap<String, Vec<RouteSpec<u32>>> = Default::default();
    for s in &specs {
        by_host.entry(s.host.clone()).or_default().push(s.clone());
    }
    let compiled: Vec<Arc<HostTable<u32>>> = by_host
        .iter()
        .map(|(h, s)| Arc::new(HostTable::build(h, s.clone()).unwrap().0))
        .collect();
    let (changed_host, changed) = by_host.iter().next().unwrap();
    group.bench_function("whole", |b| {
        b.iter_batched(
            || specs.clone(),
            |specs| black_box(RouteTable::build(specs).unwrap()),
            criterion::BatchSize::LargeInput,
        )
    });
    group.bench_function("one_host", |b| {
        b.iter_batched(
            || changed.clone(),
            |specs| black_box(HostTable::build(changed_host, specs).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("assemble", |b| {
        b.iter(|| black_box(RouteTable::from_hosts(compiled.iter().cloned())))
    });
    let live = RouteTable::from_hosts(compiled.iter().cloned());
    let host = compiled[0].clone();
    group.bench_function("set_host", |b| {
        b.iter(|| {
            let mut next = live.clone();
            next.set_host(host.clone());
            black_box(next)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    lookups,
    gateway_lookups,
    gateway_port,
    builds,
    changes
);
criterion_main!(benches);
