//! Proves that `RouteTable::lookup` allocates nothing, with a counting global
//! allocator. It lives in its own test binary because a global allocator is
//! process-wide; counting is armed per thread so the harness cannot interfere.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use tuna_routing::{Origin, PathType, RouteSpec, RouteTable, TieBreak};

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

/// The counter itself must be able to fail: an allocation is seen.
#[test]
fn counter_sees_allocations() {
    let n = count_allocations(|| {
        let v: Vec<u64> = std::hint::black_box(Vec::with_capacity(16));
        drop(v);
    });
    assert!(n >= 1);
}
