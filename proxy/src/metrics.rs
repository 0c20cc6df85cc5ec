//! Prometheus metrics, kept as plain atomics.
//!
//! Every counter on the request path is an atomic reachable without a lock:
//! per-host counters hang off the compiled backend of the matched route, so a
//! request never looks its host up in a second map. `/metrics` renders the
//! text exposition format on demand from the current snapshot.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the request latency histogram.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The configured hosts' counters by canonical host, sorted for `/metrics`:
/// a persistent map, so that a snapshot shares it with the route registry.
pub(crate) type HostStatsMap = imbl::OrdMap<Arc<str>, Arc<HostStats>>;

/// Requests of one host, by status class (1xx … 5xx).
#[derive(Debug, Default)]
pub(crate) struct HostStats {
    by_class: [AtomicU64; 5],
}

impl HostStats {
    pub(crate) fn record(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.by_class[class].fetch_add(1, Relaxed);
    }
}

/// Why an upstream attempt failed; one counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamErrorCause {
    ConnectRefused,
    ConnectTimeout,
    ReadTimeout,
    WriteTimeout,
    Tls,
    ConnectionClosed,
    Other,
}

impl UpstreamErrorCause {
    const ALL: [UpstreamErrorCause; 7] = [
        Self::ConnectRefused,
        Self::ConnectTimeout,
        Self::ReadTimeout,
        Self::WriteTimeout,
        Self::Tls,
        Self::ConnectionClosed,
        Self::Other,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::ConnectRefused => "connect_refused",
            Self::ConnectTimeout => "connect_timeout",
            Self::ReadTimeout => "read_timeout",
            Self::WriteTimeout => "write_timeout",
            Self::Tls => "tls",
            Self::ConnectionClosed => "connection_closed",
            Self::Other => "other",
        }
    }
}

/// How a CONNECT ended before its requests; one counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectOutcome {
    Granted,
    Unauthenticated,
    Forbidden,
    Unavailable,
    BadRequest,
    Timeout,
    TlsFailed,
    OverLimit,
    /// Closed at accept: too many connections not granted yet (in all, or
    /// from the client's address).
    UnauthenticatedOverLimit,
    /// Refused with 429: the authorizer would not check it now.
    TooManyRequests,
    /// A granted connection whose re-check refused it (and closed it).
    Revoked,
}

impl ConnectOutcome {
    const ALL: [ConnectOutcome; 11] = [
        Self::Granted,
        Self::Unauthenticated,
        Self::Forbidden,
        Self::Unavailable,
        Self::BadRequest,
        Self::Timeout,
        Self::TlsFailed,
        Self::OverLimit,
        Self::UnauthenticatedOverLimit,
        Self::TooManyRequests,
        Self::Revoked,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::Unavailable => "unavailable",
            Self::BadRequest => "bad_request",
            Self::Timeout => "timeout",
            Self::TlsFailed => "tls_failed",
            Self::OverLimit => "over_limit",
            Self::UnauthenticatedOverLimit => "unauthenticated_over_limit",
            Self::TooManyRequests => "too_many_requests",
            Self::Revoked => "revoked",
        }
    }
}

/// Process-wide counters of one proxy core.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Requests that matched no route (404), by status class.
    pub(crate) unrouted: HostStats,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
    upstream_errors: [AtomicU64; UpstreamErrorCause::ALL.len()],
    pub(crate) http_connections_active: AtomicI64,
    pub(crate) http_connections_total: AtomicU64,
    pub(crate) tcp_connections_active: AtomicI64,
    pub(crate) tcp_connections_total: AtomicU64,
    pub(crate) tcp_connections_rejected: AtomicU64,
    pub(crate) tcp_bytes_to_upstream: AtomicU64,
    pub(crate) tcp_bytes_to_client: AtomicU64,
    pub(crate) header_rejections: AtomicU64,
    /// TLS handshakes on HTTPS ports of Gateway addresses that failed.
    pub(crate) tls_handshake_failures: AtomicU64,
    /// Requests the HTTP/1.1 fast path served (answered or failed).
    pub(crate) fast_path_requests: AtomicU64,
    /// Connections the fast path handed to Pingora.
    pub(crate) pingora_handoffs: AtomicU64,
    /// Route tables made live: one per change of a host.
    pub(crate) route_table_builds: AtomicU64,
    connect_outcomes: [AtomicU64; ConnectOutcome::ALL.len()],
    /// Intercepted CONNECT connections open now.
    pub(crate) connect_active: AtomicI64,
    /// Requests on intercepted CONNECT connections, by status class.
    pub(crate) connect_http: Arc<HostStats>,
}

impl Metrics {
    pub(crate) fn observe_latency(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        // Buckets are stored non-cumulatively and summed when rendering, so
        // a request touches exactly one bucket counter.
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.latency_buckets[i].fetch_add(1, Relaxed);
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_micros
            .fetch_add(elapsed.as_micros() as u64, Relaxed);
    }

    pub(crate) fn connect_outcome(&self, outcome: ConnectOutcome) {
        let i = ConnectOutcome::ALL
            .iter()
            .position(|c| *c == outcome)
            .unwrap_or(0);
        self.connect_outcomes[i].fetch_add(1, Relaxed);
    }

    pub(crate) fn upstream_error(&self, cause: UpstreamErrorCause) {
        let i = UpstreamErrorCause::ALL
            .iter()
            .position(|c| *c == cause)
            .unwrap_or(UpstreamErrorCause::ALL.len() - 1);
        self.upstream_errors[i].fetch_add(1, Relaxed);
    }

    /// Renders the Prometheus text format. `hosts` are the per-host counters
    /// of the current configuration.
    pub(crate) fn render(&self, hosts: &HostStatsMap) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str(
            "# HELP tuna_proxy_http_requests_total HTTP requests answered, by host and status class.\n\
             # TYPE tuna_proxy_http_requests_total counter\n",
        );
        let mut write_host = |host: &str, stats: &HostStats| {
            for (i, c) in stats.by_class.iter().enumerate() {
                let n = c.load(Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "tuna_proxy_http_requests_total{{host=\"{}\",class=\"{}xx\"}} {n}",
                        escape_label(host),
                        i + 1
                    );
                }
            }
        };
        for (host, stats) in hosts {
            write_host(host, stats);
        }
        // Unknown hosts share one series so that a scan of random Host
        // headers cannot grow the label set.
        write_host("", &self.unrouted);

        out.push_str(
            "# HELP tuna_proxy_http_request_duration_seconds Time from request header to end of logging.\n\
             # TYPE tuna_proxy_http_request_duration_seconds histogram\n",
        );
        let mut cumulative = 0;
        for (bound, c) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            cumulative += c.load(Relaxed);
            let _ = writeln!(
                out,
                "tuna_proxy_http_request_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.latency_count.load(Relaxed);
        let _ = writeln!(
            out,
            "tuna_proxy_http_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n\
             tuna_proxy_http_request_duration_seconds_sum {}\n\
             tuna_proxy_http_request_duration_seconds_count {count}",
            self.latency_sum_micros.load(Relaxed) as f64 / 1e6
        );

        out.push_str(
            "# HELP tuna_proxy_upstream_errors_total Failed upstream attempts, by cause.\n\
             # TYPE tuna_proxy_upstream_errors_total counter\n",
        );
        for (cause, c) in UpstreamErrorCause::ALL.iter().zip(&self.upstream_errors) {
            let _ = writeln!(
                out,
                "tuna_proxy_upstream_errors_total{{cause=\"{}\"}} {}",
                cause.label(),
                c.load(Relaxed)
            );
        }

        out.push_str(
            "# HELP tuna_proxy_connect_requests_total CONNECT requests of the connector listeners, by outcome.\n\
             # TYPE tuna_proxy_connect_requests_total counter\n",
        );
        for (outcome, c) in ConnectOutcome::ALL.iter().zip(&self.connect_outcomes) {
            let _ = writeln!(
                out,
                "tuna_proxy_connect_requests_total{{outcome=\"{}\"}} {}",
                outcome.label(),
                c.load(Relaxed)
            );
        }
        out.push_str(
            "# HELP tuna_proxy_connect_http_requests_total Requests inside intercepted CONNECT connections, by status class.\n\
             # TYPE tuna_proxy_connect_http_requests_total counter\n",
        );
        for (i, c) in self.connect_http.by_class.iter().enumerate() {
            let _ = writeln!(
                out,
                "tuna_proxy_connect_http_requests_total{{class=\"{}xx\"}} {}",
                i + 1,
                c.load(Relaxed)
            );
        }

        let gauges: [(&str, &str, &str, i64); 13] = [
            (
                "tuna_proxy_route_table_builds_total",
                "counter",
                "Route tables made live (one per change of a host).",
                self.route_table_builds.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_connect_connections_active",
                "gauge",
                "Intercepted CONNECT connections open now.",
                self.connect_active.load(Relaxed),
            ),
            (
                "tuna_proxy_http_fast_path_requests_total",
                "counter",
                "HTTP/1.1 requests served by the fast path.",
                self.fast_path_requests.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_http_pingora_handoffs_total",
                "counter",
                "Connections handed to Pingora (h2c, upgrades, chunked uploads, HTTP/1.0, h2c/TLS upstreams).",
                self.pingora_handoffs.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_http_connections_active",
                "gauge",
                "Open downstream HTTP connections (listener and tunnel streams).",
                self.http_connections_active.load(Relaxed),
            ),
            (
                "tuna_proxy_http_connections_total",
                "counter",
                "Downstream HTTP connections accepted.",
                self.http_connections_total.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_http_header_rejections_total",
                "counter",
                "Connections refused for oversized, too many or too slow request headers.",
                self.header_rejections.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_tls_handshake_failures_total",
                "counter",
                "TLS handshakes on HTTPS listeners of Gateway addresses that failed or timed out (no listener for the SNI, not TLS, too slow).",
                self.tls_handshake_failures.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_tcp_connections_active",
                "gauge",
                "Open spliced TCP connections.",
                self.tcp_connections_active.load(Relaxed),
            ),
            (
                "tuna_proxy_tcp_connections_total",
                "counter",
                "TCP connections accepted by listeners and tunnel TCP services.",
                self.tcp_connections_total.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_tcp_connections_rejected_total",
                "counter",
                "TCP connections refused by a connection limit.",
                self.tcp_connections_rejected.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_tcp_bytes_to_upstream_total",
                "counter",
                "Bytes spliced from TCP clients to upstreams.",
                self.tcp_bytes_to_upstream.load(Relaxed) as i64,
            ),
            (
                "tuna_proxy_tcp_bytes_to_client_total",
                "counter",
                "Bytes spliced from upstreams to TCP clients.",
                self.tcp_bytes_to_client.load(Relaxed) as i64,
            ),
        ];
        for (name, kind, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
