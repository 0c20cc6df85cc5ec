//! Proves that the codec allocates nothing on the request path (heads, the
//! hop-by-hop and forwarding checks, bodies whose lines arrive whole), with
//! a counting global allocator. It lives in its own test binary because a
//! global allocator is process-wide; counting is armed per thread so the
//! harness cannot interfere.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

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

use tuna_http1::{BodyTracker, Framing, MAX_HEAD, header_buf, parse_request, parse_response};

#[test]
fn heads_checks_and_bodies_allocate_nothing() {
    let request = b"POST /api/v1/items?x=1 HTTP/1.1\r\nHost: App.Example:8080\r\n\
        Content-Length: 5\r\nConnection: keep-alive, x-a\r\nX-A: 1\r\nTE: trailers\r\n\
        X-Forwarded-For: 6.6.6.6\r\nUser-Agent: test\r\n\r\nhello";
    let response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n";
    let body = b"5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n";
    let n = count_allocations(|| {
        let mut storage = header_buf();
        let req = parse_request(request, &mut storage, MAX_HEAD)
            .unwrap()
            .unwrap();
        assert!(req.host.unwrap().is("app.example"));
        let kept = req
            .headers
            .iter()
            .filter(|h| !req.is_hop_by_hop(h.name) && !tuna_http1::is_forwarding(h.name))
            .count();
        assert_eq!(kept, 4);
        let mut storage = header_buf();
        let resp = parse_response(response, &mut storage, false)
            .unwrap()
            .unwrap();
        assert_eq!(resp.framing, Framing::Chunked);
        assert!(resp.is_hop_by_hop("content-length"));
        let mut tracker = BodyTracker::new(Framing::Chunked);
        assert_eq!(tracker.feed(body).unwrap(), body.len());
        assert!(tracker.is_done());
    });
    assert_eq!(n, 0, "the codec allocated on the request path");
}
