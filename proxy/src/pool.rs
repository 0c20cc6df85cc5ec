//! Idle keep-alive connections to HTTP/1.1 upstreams, per address.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

struct Idle {
    stream: TcpStream,
    since: Instant,
}

/// Last-in first-out stacks of idle connections: the most recently used
/// connection is the least likely to have been closed by the upstream.
pub(crate) struct Pool {
    idle: Mutex<HashMap<SocketAddr, Vec<Idle>>>,
    per_addr: usize,
    idle_timeout: Duration,
}

impl Pool {
    pub(crate) fn new(per_addr: usize, idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(HashMap::new()),
            per_addr,
            idle_timeout,
        }
    }

    /// An idle connection to `addr` that still looks open, if any.
    pub(crate) fn take(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut dead = Vec::new();
        let found = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let stack = idle.get_mut(&addr)?;
            let mut found = None;
            while let Some(c) = stack.pop() {
                if c.since.elapsed() < self.idle_timeout && looks_open(&c.stream) {
                    found = Some(c.stream);
                    break;
                }
                dead.push(c.stream);
            }
            found
        };
        // Closing sockets is a syscall each: not under the lock.
        drop(dead);
        found
    }

    /// Returns a connection whose last response was read completely.
    pub(crate) fn put(&self, addr: SocketAddr, stream: TcpStream) {
        if self.per_addr == 0 {
            return;
        }
        let evicted = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let stack = idle.entry(addr).or_default();
            let evicted = (stack.len() >= self.per_addr).then(|| stack.remove(0));
            stack.push(Idle {
                stream,
                since: Instant::now(),
            });
            evicted
        };
        drop(evicted);
    }

    /// Idle connections held now (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn idle_count(&self, addr: SocketAddr) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.get(&addr).map_or(0, Vec::len)
    }
}

/// An idle HTTP/1.1 connection has nothing to read: if the reactor has
/// seen it readable, the upstream closed it (or sent garbage). This reads
/// the readiness the reactor already recorded — no syscall — so a
/// connection closed just now may still pass; the caller retries those.
fn looks_open(stream: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(stream.poll_read_ready(&mut cx), Poll::Pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn closed_and_expired_connections_are_not_handed_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Pool::new(4, Duration::from_secs(60));

        let client = TcpStream::connect(addr).await.unwrap();
        let (mut server_side, _) = listener.accept().await.unwrap();
        pool.put(addr, client);
        assert_eq!(pool.idle_count(addr), 1);
        assert!(
            pool.take(addr).is_some(),
            "an open idle connection is reused"
        );

        let client = TcpStream::connect(addr).await.unwrap();
        let (server_side2, _) = listener.accept().await.unwrap();
        // Hold on to the first connection so that only the second closes.
        server_side.flush().await.unwrap();
        drop(server_side2);
        // Wait until the reactor has seen the close.
        client.readable().await.unwrap();
        pool.put(addr, client);
        assert!(pool.take(addr).is_none(), "a closed connection is dropped");
        assert_eq!(pool.idle_count(addr), 0);

        let expired = Pool::new(4, Duration::ZERO);
        let client = TcpStream::connect(addr).await.unwrap();
        let _keep = listener.accept().await.unwrap();
        expired.put(addr, client);
        assert!(
            expired.take(addr).is_none(),
            "an expired connection is dropped"
        );
    }

    #[tokio::test]
    async fn each_address_keeps_at_most_its_limit() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Pool::new(2, Duration::from_secs(60));
        let mut servers = Vec::new();
        for _ in 0..3 {
            let c = TcpStream::connect(addr).await.unwrap();
            servers.push(listener.accept().await.unwrap());
            pool.put(addr, c);
        }
        assert_eq!(pool.idle_count(addr), 2);
    }
}
