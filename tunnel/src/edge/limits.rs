//! The edge's bounds on agent connections, sessions and tunnels, and the
//! pre-authentication budget every listener draws from, in one place
//! (`docs/tunnel-protocol.md`, "Limits", lists them with their defaults
//! and `tuna-operator edge` flags).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::control::RateLimit;
use crate::wire::PRE_AUTH_TIMEOUT;

/// Bounds the edge enforces on agents. The defaults suit one edge serving
/// many agents; the benchmark of 10 000 tunnels on one account fits them.
#[derive(Clone, Debug)]
pub struct EdgeLimits {
    /// Unauthenticated agent connections (TCP accept to a judged hello) at
    /// once, edge-wide; more are closed at accept.
    pub max_pending_handshakes: usize,
    /// The same, per client IP address.
    pub max_pending_handshakes_per_ip: usize,
    /// REST API connections that have not carried an authenticated request
    /// yet (TLS handshake, no or a refused key, idle) at once, edge-wide;
    /// more are closed at accept. See `control::serve_connection_pre_auth`
    /// for why the slot is held until authentication, not the first request.
    pub max_pending_api_connections: usize,
    /// The same, per client (IPv4 address, IPv6 /64).
    pub max_pending_api_connections_per_ip: usize,
    /// Peer-listener connections whose client certificate is not verified
    /// yet (TCP accept to a completed mutual TLS handshake) at once; more
    /// are closed at accept.
    pub max_pending_peer_connections: usize,
    /// The same, per client (IPv4 address, IPv6 /64).
    pub max_pending_peer_connections_per_ip: usize,
    /// Public connections (per listener, HTTP and HTTPS each) that have not
    /// sent a complete request head yet (TLS handshake included); more are
    /// closed at accept. Connections past their first request are bounded
    /// by `PublicLimits::max_connections` and its per-client limit.
    pub max_pending_public_connections: usize,
    /// The same, per client (IPv4 address, IPv6 /64) and listener; trusted
    /// proxies are not exempt.
    pub max_pending_public_connections_per_ip: usize,
    /// Public TCP endpoint connections open at once, over every endpoint
    /// of the edge; more are closed at accept. A TCP endpoint has no
    /// authentication of its own, so this holds for the whole connection.
    pub max_tcp_connections: usize,
    /// The same, per client (IPv4 address, IPv6 /64).
    pub max_tcp_connections_per_ip: usize,
    /// A TCP endpoint connection on which no byte has moved, in either
    /// direction, this long after accept is closed (a server-first protocol
    /// counts: the backend's greeting is a byte).
    pub tcp_first_byte_timeout: Duration,
    /// A TCP endpoint connection on which no byte has moved, in either
    /// direction, for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// Time an unauthenticated connection gets from TCP accept to a judged hello.
    pub pre_auth_timeout: Duration,
    /// Failed tunnel authentications (bad, expired or revoked tokens in a
    /// hello or attach) per client IP: a token bucket; when it is empty the
    /// address is answered `rate_limited` without a look at its tokens.
    pub auth_failures: RateLimit,
    /// Control frames queued for an agent; an agent that lets more pile up
    /// (it does not read its control stream) loses its session.
    pub control_queue: usize,
    /// A control frame not written within this ends the session (an agent
    /// withholding flow-control window cannot stall the edge's session loop,
    /// which keeps handling revocations meanwhile).
    pub control_write_timeout: Duration,
    /// Opening a data stream waits at most this long for the agent to grant
    /// a stream (h2 concurrency); then the public client gets 502.
    pub open_stream_timeout: Duration,
    /// A session whose last tunnel is gone is closed after this long.
    pub empty_session_grace: Duration,
    /// Tunnels one tunnel token may have open at once, across sessions (an
    /// agent reconnecting overlaps its old session briefly). API-key grants
    /// are bounded by the account's quota only.
    pub max_tunnels_per_token: usize,
    /// Tunnels one account may have open at once.
    pub max_tunnels_per_account: usize,
    /// Sessions (agent connections) carrying tunnels of one account at once.
    pub max_sessions_per_account: usize,
    /// REST API connections: an HTTP/1.1 client must send each request's
    /// headers within this (an idle keep-alive connection closes after it);
    /// HTTP/2 connections are pinged at this interval and closed when a
    /// ping goes unanswered as long.
    pub api_header_timeout: Duration,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        Self {
            max_pending_handshakes: 256,
            max_pending_handshakes_per_ip: 16,
            max_pending_api_connections: 256,
            max_pending_api_connections_per_ip: 16,
            max_pending_peer_connections: 64,
            max_pending_peer_connections_per_ip: 16,
            // Per client as many as `PublicLimits::max_connections_per_ip`:
            // one client is refused nothing it was allowed before the budget.
            max_pending_public_connections: 4096,
            max_pending_public_connections_per_ip: 256,
            max_tcp_connections: 4096,
            max_tcp_connections_per_ip: 256,
            tcp_first_byte_timeout: Duration::from_secs(30),
            tcp_idle_timeout: Duration::from_secs(600),
            pre_auth_timeout: PRE_AUTH_TIMEOUT,
            auth_failures: RateLimit {
                burst: 30,
                per_second: 1.0,
            },
            control_queue: 16_384,
            control_write_timeout: Duration::from_secs(30),
            open_stream_timeout: Duration::from_secs(10),
            empty_session_grace: Duration::from_secs(30),
            max_tunnels_per_token: 4,
            max_tunnels_per_account: 20_000,
            max_sessions_per_account: 64,
            api_header_timeout: Duration::from_secs(30),
        }
    }
}

/// Who a connection counts against: an IPv4 address, or the /64 prefix of
/// an IPv6 address (what one host or one customer line is usually given,
/// so rotating through its addresses gains nothing). An IPv4-mapped IPv6
/// address (`::ffff:192.0.2.1`, what a dual-stack socket reports) is its
/// IPv4 address.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u64::MAX as u128))),
        },
        v4 => v4,
    }
}

/// A listener's budget of connections that have not authenticated yet: at
/// most `total` at once, and `per_source` from one [`source_key`]. A
/// connection holds a [`PreAuthSlot`] from accept until it has proved who
/// it is (what that means is the listener's: a verified client
/// certificate, an authenticated request); over budget it is closed at
/// once, before any TLS or HTTP work. The budget bounds what
/// unauthenticated clients cost in descriptors and memory; an
/// authenticated client does not count, so idle junk from one address
/// cannot starve it.
#[derive(Clone)]
pub struct PreAuthBudget {
    inner: Arc<BudgetState>,
}

struct BudgetState {
    total: usize,
    per_source: usize,
    /// Slots held in all, and per source (sources with none are removed).
    held: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One unauthenticated connection's place in a [`PreAuthBudget`]; dropping
/// it (the connection authenticated or closed) frees the place.
pub struct PreAuthSlot {
    state: Arc<BudgetState>,
    source: IpAddr,
}

impl PreAuthBudget {
    /// A budget of `total` slots, `per_source` of them for one source.
    pub fn new(total: usize, per_source: usize) -> Self {
        Self {
            inner: Arc::new(BudgetState {
                total,
                per_source,
                held: Mutex::new((0, HashMap::new())),
            }),
        }
    }

    /// A slot for a connection from `ip`, or `None` when the listener or
    /// `ip`'s source already holds as many as allowed.
    pub fn try_acquire(&self, ip: IpAddr) -> Option<PreAuthSlot> {
        let source = source_key(ip);
        let mut held = self.inner.held.lock();
        if held.0 >= self.inner.total {
            return None;
        }
        let n = held.1.get(&source).copied().unwrap_or(0);
        if n >= self.inner.per_source {
            return None;
        }
        held.1.insert(source, n + 1);
        held.0 += 1;
        Some(PreAuthSlot {
            state: Arc::clone(&self.inner),
            source,
        })
    }

    /// Slots held now (all sources).
    pub fn held(&self) -> usize {
        self.inner.held.lock().0
    }
}

impl std::fmt::Debug for PreAuthBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreAuthBudget")
            .field("total", &self.inner.total)
            .field("per_source", &self.inner.per_source)
            .field("held", &self.held())
            .finish()
    }
}

impl Drop for PreAuthSlot {
    fn drop(&mut self) {
        let mut held = self.state.held.lock();
        held.0 -= 1;
        if let Some(n) = held.1.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                held.1.remove(&self.source);
            }
        }
    }
}

/// Descriptors the edge keeps free beyond its listeners' pre-auth totals
/// for what it needs anyway: its listening sockets, the store's and the
/// fleet's database connections, links to peers, log and data files. The
/// authenticated connections (agent sessions, public requests, tunnel
/// traffic) need more on top: a soft limit well above the sum (systemd
/// `LimitNOFILE=65536`) keeps them room.
pub const FD_HEADROOM: u64 = 256;

/// One listener's pre-auth total, named by the flag that sets it.
#[derive(Debug, Clone, Copy)]
pub struct PreAuthTotal {
    /// The `tuna-operator edge` flag of this total.
    pub flag: &'static str,
    /// Connections it lets in before they authenticate.
    pub total: usize,
}

/// Checks that every listener's pre-auth total (and the TCP endpoints'
/// total) at once, plus
/// [`FD_HEADROOM`], fits in `fd_limit` (the soft `RLIMIT_NOFILE` after
/// [`raise_fd_limit`]): otherwise unauthenticated clients could take the
/// last descriptor before any budget refuses them, which is what the
/// budgets exist to prevent.
pub fn check_fd_budget(totals: &[PreAuthTotal], fd_limit: u64) -> crate::Result<()> {
    let sum: u64 = totals.iter().map(|t| t.total as u64).sum();
    if sum.saturating_add(FD_HEADROOM) <= fd_limit {
        return Ok(());
    }
    let flags = totals
        .iter()
        .map(|t| format!("{} {}", t.flag, t.total))
        .collect::<Vec<_>>()
        .join(", ");
    Err(crate::Error::Config(format!(
        "the connection caps open to unauthenticated clients ({flags}; {sum} in all) plus {FD_HEADROOM} descriptors of headroom exceed the open-file limit {fd_limit} (RLIMIT_NOFILE, raised to the hard limit): lower the caps or raise the hard limit (systemd LimitNOFILE=65536)"
    )))
}

/// Raises this process's soft open-file limit (`RLIMIT_NOFILE`) to its hard
/// limit and returns the new soft limit: every connection the edge holds is
/// a descriptor, and the soft default (often 1024) is far below what a
/// replica serves. The hard limit is the operator's (systemd `LimitNOFILE`).
pub fn raise_fd_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::resource::{Resource, getrlimit};

    /// Set in the child process the test runs under a low soft limit.
    const CHILD: &str = "TUNA_TEST_FD_LIMIT_CHILD";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sources_are_ipv4_addresses_and_ipv6_slash_64s() {
        let cases = [
            ("192.0.2.7", "192.0.2.7"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::"),
            ("2001:db8:1:2::1", "2001:db8:1:2::"),
            ("2001:db8:1:3::1", "2001:db8:1:3::"),
            ("::1", "::"),
        ];
        for (addr, want) in cases {
            assert_eq!(source_key(ip(addr)), ip(want), "{addr}");
        }
    }

    #[test]
    fn budget_caps_in_total_and_per_source_and_frees_on_drop() {
        let budget = PreAuthBudget::new(4, 2);
        let a1 = budget.try_acquire(ip("198.51.100.1")).unwrap();
        let a2 = budget.try_acquire(ip("::ffff:198.51.100.1")).unwrap();
        assert!(
            budget.try_acquire(ip("198.51.100.1")).is_none(),
            "per source, IPv4-mapped counted as IPv4"
        );
        let v6a = budget.try_acquire(ip("2001:db8::1")).unwrap();
        let v6b = budget.try_acquire(ip("2001:db8::2")).unwrap();
        assert_eq!(budget.held(), 4);
        assert!(budget.try_acquire(ip("203.0.113.1")).is_none(), "in total");
        drop(a1);
        assert!(
            budget.try_acquire(ip("2001:db8::ffff")).is_none(),
            "one /64 is one source"
        );
        let other = budget.try_acquire(ip("2001:db8:0:1::1")).unwrap();
        assert!(budget.try_acquire(ip("203.0.113.1")).is_none());
        drop((a2, v6a, v6b, other));
        assert_eq!(budget.held(), 0);
        assert!(
            budget.inner.held.lock().1.is_empty(),
            "no source left behind"
        );
        let again: Vec<_> = (0..2)
            .map(|_| budget.try_acquire(ip("198.51.100.1")).unwrap())
            .collect();
        assert_eq!(again.len(), 2, "places are freed");
    }

    #[test]
    fn caps_that_do_not_fit_the_fd_limit_are_refused_naming_the_flags() {
        let totals = [
            PreAuthTotal {
                flag: "--max-pending-handshakes",
                total: 256,
            },
            PreAuthTotal {
                flag: "--max-pending-api-connections",
                total: 512,
            },
        ];
        check_fd_budget(&totals, 1024).unwrap();
        let err = check_fd_budget(&totals, 1000).unwrap_err();
        assert!(matches!(err, crate::Error::Config(_)));
        let msg = err.to_string();
        for needle in [
            "--max-pending-handshakes 256",
            "--max-pending-api-connections 512",
            "768 in all",
            "open-file limit 1000",
        ] {
            assert!(msg.contains(needle), "{needle:?} in {msg}");
        }
    }

    #[test]
    fn raise_fd_limit_reaches_the_hard_limit() {
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (512, 4096));
            assert_eq!(raise_fd_limit().expect("raising RLIMIT_NOFILE"), 4096);
            assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (4096, 4096));
            return;
        }
        // In a process of its own, started with a soft limit below the hard
        // one (as a shell's default 1024 is): lowering this test process's
        // limit would starve the tests running beside it.
        let out = std::process::Command::new("prlimit")
            .arg("--nofile=512:4096")
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "edge::limits::tests::raise_fd_limit_reaches_the_hard_limit",
            ])
            .env(CHILD, "1")
            .output()
            .expect("prlimit (util-linux)");
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{log}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(log.contains("1 passed"), "the child ran the test: {log}");
    }
}
