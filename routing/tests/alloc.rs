//! Proves that `RouteTable::lookup` and `lookup_request` allocate nothing, with a counting global
//! allocator. It lives in its own test binary because a global allocator is
//! process-wide; counting is armed per thread so the harness cannot interfere.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;

use tuna_routing::{
    GatewayMatch, Matcher, Origin, PathType, RouteSpec, RouteTable, SimpleRequest, TieBreak,
};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// wrapper only bumps a counter (which itself never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count_allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    ARMED.with(|a| a.set(true));
    f();
    ARMED.with(|a| a.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

fn spec(host: &str, path: &str, path_type: PathType, backend: u32) -> RouteSpec<u32> {
    RouteSpec {
        host: host.into(),
        path: path.into(),
        path_type,
        backend,
        origin: Origin::default(),
        tie_break: TieBreak::default(),
        matcher: tuna_routing::Matcher::Ingress,
    }
}

#[test]
fn lookup_allocates_nothing() {
    let mut specs = vec![
        spec("shop.example.com", "/", PathType::Prefix, 1),
        spec("shop.example.com", "/api", PathType::Prefix, 2),
        spec("shop.example.com", "/api", PathType::Exact, 3),
        spec("shop.example.com", "/api/v1/users/", PathType::Exact, 4),
        spec(
            "*.example.com",
            "/static",
            PathType::ImplementationSpecific,
            5,
        ),
    ];
    // Enough siblings that the root switches to a hashed child map.
    for i in 0..100 {
        specs.push(spec(
            "shop.example.com",
            &format!("/svc{i}"),
            PathType::Prefix,
            100 + i,
        ));
    }
    let (table, issues) = RouteTable::build(specs).unwrap();
    assert!(issues.is_empty());
    let long_dotty = format!("/api/{}", "./".repeat(1000));
    let requests: Vec<(&str, &str, Option<u32>)> = vec![
        ("shop.example.com", "/api/v1/users/", Some(4)),
        ("shop.example.com", "/api", Some(3)),
        ("SHOP.Example.COM.:8443", "/api/x?y=1", Some(2)),
        ("shop.example.com", "//api/./v1/../x", Some(2)),
        ("shop.example.com", "/%61pi/a%2Fb", Some(2)),
        ("shop.example.com", "/svc42/deep/path", Some(142)),
        ("shop.example.com", "/nothing/here", Some(1)),
        ("cdn.example.com", "/static/app.js", Some(5)),
        ("CDN.EXAMPLE.COM", "/other", None),
        ("a.b.example.com", "/static", None),
        ("unknown.test", "/", None),
        ("bad:port", "/", None),
        ("shop.example.com", &long_dotty, Some(2)),
        ("shop.example.com", "*", None),
    ];
    // Warm up anything lazily initialised (e.g. the hasher's random keys)
    // outside the measured region.
    for (host, path, _) in &requests {
        let _ = table.lookup(host, path);
    }
    for (host, path, want) in &requests {
        let mut got = None;
        let allocations = count_allocations(|| got = table.lookup(host, path).map(|m| *m.backend));
        assert_eq!(got, *want, "lookup({host:?}, {path:?})");
        assert_eq!(allocations, 0, "lookup({host:?}, {path:?}) allocated");
    }
}

fn gateway(path: &str, path_type: PathType, m: GatewayMatch, backend: u32) -> RouteSpec<u32> {
    RouteSpec {
        matcher: Matcher::Gateway(Arc::new(m)),
        ..spec("gw.example.com", path, path_type, backend)
    }
}

#[test]
fn lookup_request_on_a_gateway_host_allocates_nothing() {
    let pairs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    };
    let m = |hostname: Option<&str>, method: Option<&str>, headers, query| GatewayMatch {
        hostname: hostname.map(Into::into),
        method: method.map(Into::into),
        headers: pairs(headers),
        query: pairs(query),
    };
    let mut specs = vec![
        gateway("/", PathType::Prefix, m(None, None, &[], &[]), 1),
        gateway(
            "/api",
            PathType::Prefix,
            m(Some("gw.example.com"), Some("POST"), &[], &[]),
            2,
        ),
        gateway(
            "/api",
            PathType::Prefix,
            m(
                Some("*.example.com"),
                None,
                &[("x-env", "canary"), ("x-team", "a")],
                &[],
            ),
            3,
        ),
        gateway(
            "/api/v1/users/",
            PathType::Exact,
            m(None, Some("GET"), &[], &[("page", "2")]),
            4,
        ),
        spec("gw.example.com", "/legacy", PathType::Prefix, 5),
    ];
    for i in 0..20 {
        specs.push(gateway(
            &format!("/svc{i}"),
            PathType::Prefix,
            m(None, None, &[("x-svc", "on")], &[]),
            100 + i,
        ));
    }
    let (table, issues) = RouteTable::build(specs).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    let get = SimpleRequest::get();
    let post = SimpleRequest::new("POST");
    let canary = SimpleRequest::get()
        .with_header("X-Env", "canary")
        .with_header("x-team", "a");
    let svc = SimpleRequest::get().with_header("x-svc", "on");
    let long_dotty = format!("/api/{}?x=1", "./".repeat(1000));
    let requests: Vec<(&str, &SimpleRequest, Option<u32>)> = vec![
        ("/api/x", &post, Some(2)),
        ("/api/x", &canary, Some(3)),
        ("/api/x", &get, Some(1)),
        ("/api/v1/users/?a=1&page=2", &get, Some(4)),
        ("/api/v1/users/?page=%32", &get, Some(4)),
        ("/api/v1/users/?page=3", &get, Some(1)),
        ("/%61pi//x?y", &post, Some(2)),
        ("/legacy/a", &get, Some(5)),
        ("/svc7/a", &svc, Some(107)),
        ("/svc7/a", &get, Some(1)),
        (&long_dotty, &canary, Some(3)),
        ("*", &get, None),
    ];
    for (target, request, _) in &requests {
        let _ = table.lookup_request("gw.example.com", target, *request);
    }
    for (target, request, want) in &requests {
        let mut got = None;
        let allocations = count_allocations(|| {
            got = table
                .lookup_request("GW.example.com:443", target, *request)
                .map(|m| *m.backend)
        });
        assert_eq!(got, *want, "lookup_request({target:?}, {request:?})");
        assert_eq!(allocations, 0, "lookup_request({target:?}) allocated");
    }
}

/// The counter itself must be able to fail: an allocation is seen.
#[test]
fn counter_sees_allocations() {
    let n = count_allocations(|| {
        let v: Vec<u64> = std::hint::black_box(Vec::with_capacity(16));
        drop(v);
    });
    assert!(n >= 1);
}
