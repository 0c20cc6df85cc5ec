//! TCP endpoints: runtime listeners and tunnel-fed TCP services, both
//! spliced byte for byte to an upstream.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Where a TCP endpoint's connections go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TcpUpstream {
    /// Round-robin targets (resolved by the caller); a connection tries
    /// each address once before giving up. Must not be empty unless
    /// `weighted` is given.
    pub addrs: Vec<SocketAddr>,
    /// Weighted backends (a TCPRoute's backendRefs). When given, each
    /// connection draws one by smooth weighted round-robin (so every share
    /// is exact over a cycle; weight 0 is never drawn), then dials its
    /// addresses as `addrs` are dialed; a drawn backend without addresses
    /// (one that does not resolve) closes the connection, as the Gateway
    /// API asks for its share. `addrs` is then not used.
    pub weighted: Vec<TcpTarget>,
}

impl TcpUpstream {
    /// One backend, round-robin over `addrs`.
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        Self {
            addrs,
            weighted: Vec::new(),
        }
    }
}

/// One weighted backend of a [`TcpUpstream`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTarget {
    /// Its addresses, round-robin; empty when it does not resolve.
    pub addrs: Vec<SocketAddr>,
    /// Its share of connections; 0 never gets any.
    pub weight: u32,
}

/// Bounds of one TCP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpLimits {
    /// Most concurrent connections; further ones are closed at once.
    pub max_connections: usize,
    /// Time allowed to connect to one upstream address.
    pub connect_timeout: std::time::Duration,
    /// How long connecting is tried again, with growing pauses, while every
    /// address refuses at once (nothing listens yet, no route yet), before
    /// the client's connection is closed: an upstream about to listen — a
    /// new Service whose rules kube-proxy is still programming, a pod being
    /// replaced — costs the client a delay, not its connection. Zero: one
    /// round over the addresses.
    pub connect_retry: std::time::Duration,
}

impl Default for TcpLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            connect_timeout: std::time::Duration::from_secs(5),
            connect_retry: std::time::Duration::from_secs(3),
        }
    }
}

/// First and longest pause between rounds of refused connects.
const RETRY_PAUSE_MIN: std::time::Duration = std::time::Duration::from_millis(50);
const RETRY_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// A registered TCP endpoint (listener or tunnel service): upstream, limit
/// and round-robin position.
#[derive(Debug)]
pub(crate) struct TcpEndpoint {
    pub(crate) upstream: TcpUpstream,
    pub(crate) limits: TcpLimits,
    permits: Arc<Semaphore>,
    next: AtomicUsize,
    /// For weighted backends: one cycle of target indexes (smooth weighted
    /// round-robin, computed once) and the position in it.
    schedule: Box<[u32]>,
    drawn: AtomicUsize,
    /// Round-robin position within each weighted target.
    next_in: Box<[AtomicUsize]>,
}

impl TcpEndpoint {
    pub(crate) fn new(upstream: TcpUpstream, limits: TcpLimits, what: &str) -> Result<Self> {
        let weights: Vec<u32> = upstream.weighted.iter().map(|t| t.weight).collect();
        let schedule = crate::routes::smooth_schedule(&weights);
        let usable = if upstream.weighted.is_empty() {
            !upstream.addrs.is_empty()
        } else {
            upstream
                .weighted
                .iter()
                .any(|t| t.weight > 0 && !t.addrs.is_empty())
        };
        if !usable {
            return Err(Error::NoAddresses { what: what.into() });
        }
        Ok(Self {
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            next_in: upstream
                .weighted
                .iter()
                .map(|_| AtomicUsize::new(0))
                .collect(),
            upstream,
            limits,
            next: AtomicUsize::new(0),
            schedule,
            drawn: AtomicUsize::new(0),
        })
    }

    /// The addresses of this connection's backend and where in them to
    /// start: the one backend, or the weighted backend drawn for it.
    fn draw(&self) -> (&[SocketAddr], usize) {
        if self.upstream.weighted.is_empty() {
            return (&self.upstream.addrs, self.next.fetch_add(1, Relaxed));
        }
        let i = self.drawn.fetch_add(1, Relaxed) % self.schedule.len();
        let target = self.schedule[i] as usize;
        (
            &self.upstream.weighted[target].addrs,
            self.next_in[target].fetch_add(1, Relaxed),
        )
    }

    /// Takes a connection slot, or says the limit is reached.
    pub(crate) fn admit(&self, metrics: &Metrics) -> Result<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().map_err(|_| {
            metrics.tcp_connections_rejected.fetch_add(1, Relaxed);
            Error::ConnectionLimit(self.limits.max_connections)
        })
    }

    /// Connects to the next address round-robin, trying each once per
    /// round; while every address refuses at once, rounds are repeated
    /// within [`TcpLimits::connect_retry`]. A connect that timed out ends
    /// the attempt (it already cost `connect_timeout`).
    async fn connect(&self) -> Result<TcpStream> {
        let started = tokio::time::Instant::now();
        let mut pause = RETRY_PAUSE_MIN;
        let (addrs, mut start) = self.draw();
        if addrs.is_empty() {
            return Err(Error::UpstreamUnreachable(std::io::Error::other(
                "the backend drawn for this connection does not resolve",
            )));
        }
        loop {
            let round = self.connect_round(addrs, start).await;
            start = start.wrapping_add(1);
            match round {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(Error::UpstreamUnreachable(e));
                }
                Err(e) => {
                    if started.elapsed() + pause > self.limits.connect_retry {
                        return Err(Error::UpstreamUnreachable(e));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
            }
        }
    }

    /// One round over the addresses of the backend drawn for this
    /// connection, from the next one round-robin.
    async fn connect_round(
        &self,
        addrs: &[SocketAddr],
        start: usize,
    ) -> std::io::Result<TcpStream> {
        let n = addrs.len();
        let mut last = None;
        for i in 0..n {
            let addr = addrs[(start + i) % n];
            match tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(addr)).await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("connect to {addr} timed out"),
                    ))
                }
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no upstream address")))
    }

    /// Connects upstream and splices until both directions are closed.
    /// Each direction's EOF is passed on as a write shutdown (half-close),
    /// so protocols that signal "done sending" by closing still work.
    pub(crate) async fn splice<S>(
        &self,
        client: S,
        metrics: &Metrics,
        _permit: OwnedSemaphorePermit,
    ) -> Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        metrics.tcp_connections_total.fetch_add(1, Relaxed);
        let mut upstream = self.connect().await?;
        metrics.tcp_connections_active.fetch_add(1, Relaxed);
        let mut client = Counted {
            inner: client,
            read: &metrics.tcp_bytes_to_upstream,
            written: &metrics.tcp_bytes_to_client,
        };
        let res = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        metrics.tcp_connections_active.fetch_sub(1, Relaxed);
        res.map(|_| ()).map_err(Error::Io)
    }
}

/// Counts bytes as they pass, so the metrics move while a long connection
/// is open rather than when it ends.
struct Counted<'a, S> {
    inner: S,
    read: &'a AtomicU64,
    written: &'a AtomicU64,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.read
            .fetch_add((buf.filled().len() - before) as u64, Relaxed);
        res
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = res {
            this.written.fetch_add(n as u64, Relaxed);
        }
        res
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
