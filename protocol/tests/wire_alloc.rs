//! What an unauthenticated peer can make the edge allocate: a hello frame is
//! buffered by the bytes that arrived, not by the length it announced
//! (issue 12 item 6). Its own test binary: it counts every allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;
use tokio::io::AsyncWriteExt;
use tuna_protocol::wire::{Frame, MAX_HELLO_LEN};

/// Counts the bytes every allocation asks for.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_hello_is_buffered_by_what_arrived_not_by_what_it_announced() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut peer, mut edge) = tokio::io::duplex(1 << 20);
        // The largest hello a peer may announce, and 16 bytes of it.
        let mut bytes = (MAX_HELLO_LEN as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(br#"{"type":"hello","#);
        peer.write_all(&bytes).await.unwrap();

        let before = ALLOCATED.load(Ordering::Relaxed);
        // One poll: it takes what arrived and waits for the rest.
        let read = Frame::read_limited(&mut edge, MAX_HELLO_LEN).now_or_never();
        let used = ALLOCATED.load(Ordering::Relaxed) - before;
        assert!(read.is_none(), "the frame cannot be complete yet");
        assert!(
            used < 16 * 1024,
            "{used} bytes allocated for a hello that sent 16 (it announced {MAX_HELLO_LEN})"
        );
        drop(peer);
    });
}
