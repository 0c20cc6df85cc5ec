//! The edge's bounds on agent connections, sessions and tunnels, and the
//! pre-authentication budget every listener draws from, in one place
//! (`docs/tunnel-protocol.md`, "Limits", lists them with their defaults
//! and `tuna-operator edge` flags).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::rate::RateLimit;
use tuna_protocol::wire::PRE_AUTH_TIMEOUT;

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
    /// ping goes unanswered as long. A connection that has not carried an
    /// authenticated request this long after accept is closed, whatever
    /// it does meanwhile.
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

/// The /48 an IPv6 address belongs to (what one site is usually given); an
/// IPv4 address (or an IPv4-mapped one) has none.
fn site_key(ip: IpAddr) -> Option<Ipv6Addr> {
    match source_key(ip) {
        IpAddr::V6(v6) => Some(Ipv6Addr::from(u128::from(v6) & !(u128::MAX >> 48))),
        IpAddr::V4(_) => None,
    }
}

/// How many sources (IPv6 /64s) of one /48 may hold as many slots as one
/// source: the second-tier cap is `per_source` times this.
pub const SOURCES_PER_SITE: usize = 4;

/// A listener's budget of connections that have not authenticated yet: at
/// most `total` at once, `per_source` from one [`source_key`] and
/// `per_source × SOURCES_PER_SITE` from one IPv6 /48. A connection holds a
/// [`PreAuthSlot`] from accept until it has proved who it is (what that
/// means is the listener's: a verified client certificate, an
/// authenticated request); over budget it is closed at once, before any
/// TLS or HTTP work. The budget bounds what unauthenticated clients cost in
/// descriptors and memory; an authenticated client does not count, so idle
/// junk from one address cannot starve it.
///
/// When the total is full, a newcomer is not simply refused (a handful of
/// sources would then hold the listener shut): the source holding the
/// most slots, if it holds more than the newcomer's source would, gives up
/// its oldest one — that connection's [`PreAuthSlot::evicted`] fires and
/// its listener closes it. A budget made with [`PreAuthBudget::new_fixed`]
/// never evicts (TCP endpoints: their connections are a tenant's traffic).
#[derive(Clone)]
pub struct PreAuthBudget {
    inner: Arc<BudgetState>,
}

struct BudgetState {
    total: usize,
    per_source: usize,
    evicts: bool,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    /// Per source, its slots oldest first (sources with none are removed).
    sources:
        HashMap<IpAddr, std::collections::VecDeque<(u64, tokio_util::sync::CancellationToken)>>,
    /// Slots per IPv6 /48 (sites with none are removed).
    sites: HashMap<Ipv6Addr, usize>,
    next: u64,
}

impl Held {
    /// Forgets slot `id` of `source`; whether it was held (not evicted).
    fn release(&mut self, source: IpAddr, id: u64) -> bool {
        let Some(slots) = self.sources.get_mut(&source) else {
            return false;
        };
        let Some(at) = slots.iter().position(|(i, _)| *i == id) else {
            return false;
        };
        slots.remove(at);
        if slots.is_empty() {
            self.sources.remove(&source);
        }
        self.total -= 1;
        if let Some(site) = site_key(source)
            && let Some(n) = self.sites.get_mut(&site)
        {
            *n -= 1;
            if *n == 0 {
                self.sites.remove(&site);
            }
        }
        true
    }
}

/// One unauthenticated connection's place in a [`PreAuthBudget`]; dropping
/// it (the connection authenticated or closed) frees the place.
pub struct PreAuthSlot {
    state: Arc<BudgetState>,
    source: IpAddr,
    id: u64,
    evicted: tokio_util::sync::CancellationToken,
}

impl PreAuthSlot {
    /// Cancelled when the budget took this slot back for a newcomer (the
    /// listener then closes the connection). Clone it before handing the
    /// slot to whatever drops it on authentication: a slot given up that
    /// way is never evicted.
    pub fn evicted(&self) -> tokio_util::sync::CancellationToken {
        self.evicted.clone()
    }
}

impl PreAuthBudget {
    /// A budget of `total` slots, `per_source` of them for one source,
    /// evicting the largest source's oldest slot when full.
    pub fn new(total: usize, per_source: usize) -> Self {
        Self::build(total, per_source, true)
    }

    /// Like [`PreAuthBudget::new`], but a full budget refuses newcomers.
    pub fn new_fixed(total: usize, per_source: usize) -> Self {
        Self::build(total, per_source, false)
    }

    fn build(total: usize, per_source: usize, evicts: bool) -> Self {
        Self {
            inner: Arc::new(BudgetState {
                total,
                per_source,
                evicts,
                held: Mutex::new(Held::default()),
            }),
        }
    }

    /// A slot for a connection from `ip`, or `None` when `ip`'s source (or
    /// IPv6 /48) holds as many as allowed, or the listener does and no
    /// source holds more than `ip`'s would.
    pub fn try_acquire(&self, ip: IpAddr) -> Option<PreAuthSlot> {
        let source = source_key(ip);
        let site = site_key(ip);
        let mut held = self.inner.held.lock();
        let n = held.sources.get(&source).map_or(0, |s| s.len());
        if n >= self.inner.per_source {
            return None;
        }
        if let Some(site) = site
            && held.sites.get(&site).copied().unwrap_or(0)
                >= self.inner.per_source.saturating_mul(SOURCES_PER_SITE)
        {
            return None;
        }
        if held.total >= self.inner.total {
            if !self.inner.evicts {
                return None;
            }
            // The source holding the most, if it holds more than this one
            // would (n + 1): it gives up its oldest slot.
            let (&top, slots) = held.sources.iter().max_by_key(|(_, s)| s.len())?;
            if slots.len() <= n + 1 {
                return None;
            }
            let (id, token) = slots.front().cloned()?;
            held.release(top, id);
            token.cancel();
            tracing::debug!(evicted = %top, newcomer = %source, "pre-auth budget full: the largest source's oldest connection gives way");
        }
        let id = held.next;
        held.next += 1;
        let evicted = tokio_util::sync::CancellationToken::new();
        held.sources
            .entry(source)
            .or_default()
            .push_back((id, evicted.clone()));
        if let Some(site) = site {
            *held.sites.entry(site).or_default() += 1;
        }
        held.total += 1;
        Some(PreAuthSlot {
            state: Arc::clone(&self.inner),
            source,
            id,
            evicted,
        })
    }

    /// Slots held now (all sources).
    pub fn held(&self) -> usize {
        self.inner.held.lock().total
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
        self.state.held.lock().release(self.source, self.id);
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
pub fn check_fd_budget(totals: &[PreAuthTotal], fd_limit: u64) -> crate::error::Result<()> {
    let sum: u64 = totals.iter().map(|t| t.total as u64).sum();
    if sum.saturating_add(FD_HEADROOM) <= fd_limit {
        return Ok(());
    }
    let flags = totals
        .iter()
        .map(|t| format!("{} {}", t.flag, t.total))
        .collect::<Vec<_>>()
        .join(", ");
    Err(crate::error::Error::Config(format!(
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
        let budget = PreAuthBudget::new_fixed(4, 2);
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
        {
            let held = budget.inner.held.lock();
            assert!(held.sources.is_empty(), "no source left behind");
            assert!(held.sites.is_empty(), "no /48 left behind");
        }
        let again: Vec<_> = (0..2)
            .map(|_| budget.try_acquire(ip("198.51.100.1")).unwrap())
            .collect();
        assert_eq!(again.len(), 2, "places are freed");
    }

    /// Issue 40, item 4: a full budget takes the oldest slot of the source
    /// holding the most for a newcomer, as long as that source holds more
    /// than the newcomer's would.
    #[test]
    fn a_full_budget_evicts_the_largest_source_s_oldest_slot() {
        let budget = PreAuthBudget::new(6, 4);
        let big: Vec<_> = (0..4)
            .map(|_| budget.try_acquire(ip("198.51.100.1")).unwrap())
            .collect();
        let small: Vec<_> = (0..2)
            .map(|_| budget.try_acquire(ip("198.51.100.2")).unwrap())
            .collect();
        assert_eq!(budget.held(), 6);
        let newcomer = budget
            .try_acquire(ip("203.0.113.9"))
            .expect("the newcomer gets a slot");
        assert!(
            big[0].evicted().is_cancelled(),
            "the largest source's oldest"
        );
        assert!(big[1..].iter().all(|s| !s.evicted().is_cancelled()));
        assert!(small.iter().all(|s| !s.evicted().is_cancelled()));
        assert_eq!(budget.held(), 6);
        // The evicted slot's drop frees nothing twice.
        let mut big = big.into_iter();
        drop(big.next());
        assert_eq!(budget.held(), 6);
        // `small` would hold 3, as many as `big` now: no one gives way.
        assert!(budget.try_acquire(ip("198.51.100.2")).is_none());
        drop(newcomer);
        // A fixed budget never evicts.
        let fixed = PreAuthBudget::new_fixed(1, 1);
        let held = fixed.try_acquire(ip("198.51.100.1")).unwrap();
        assert!(fixed.try_acquire(ip("203.0.113.9")).is_none());
        assert!(!held.evicted().is_cancelled());
    }

    /// Issue 40, item 4: one IPv6 /48 holds at most `SOURCES_PER_SITE`
    /// sources' worth of slots, however many /64s it spreads over.
    #[test]
    fn one_ipv6_slash_48_is_capped_as_a_second_tier() {
        let budget = PreAuthBudget::new(1000, 2);
        let mut held = Vec::new();
        for sub in 0..16u16 {
            for host in 1..=2u16 {
                if let Some(s) = budget.try_acquire(ip(&format!("2001:db8:7:{sub:x}::{host}"))) {
                    held.push(s);
                }
            }
        }
        assert_eq!(held.len(), 2 * SOURCES_PER_SITE, "the /48's cap");
        assert!(
            budget.try_acquire(ip("2001:db8:8::1")).is_some(),
            "another /48 is not affected"
        );
        assert!(budget.try_acquire(ip("198.51.100.1")).is_some());
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
        assert!(matches!(err, crate::error::Error::Config(_)));
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
                "budget::preauth::tests::raise_fd_limit_reaches_the_hard_limit",
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
