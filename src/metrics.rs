//! Prometheus metrics of the operator's roles (`/metrics` on `--metrics-listen`).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `tuna_operator_reconciles_total` | `kind`, `outcome` (`ok`, `error`) | reconciles |
//! | `tuna_operator_reconcile_duration_seconds` | `kind` | histogram of reconcile time |
//! | `tuna_operator_edge_api_calls_total` | `operation`, `outcome` (`ok`, `retryable`, `rate_limited`, `refused`, `not_found`) | calls to the edge's REST API |
//! | `tuna_operator_leader` | — | 1 while this process holds the controller's Lease |
//! | `tuna_operator_tunnels` | `state` (`pending`, `serving`, `refused`, `failed`, `disconnected`, `stopped`) | tunnels of the agent by state (recounted at most once a second) |
//!
//! The agent's `/metrics` appends the proxy core's own metrics (`tuna_proxy_*`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tuna_agent::client::Reserved;
use tuna_protocol::api::{CreateDomain, CreateTcpEndpoint, Domain, TcpEndpoint, Token, WhoAmI};
use tuna_protocol::wire::Binding;

use crate::edge::api::{EdgeApi, ErrorClass, MintedToken};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    kind: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

type DurationHistograms = Family<KindLabels, Histogram, fn() -> Histogram>;

/// The metrics of one process.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: DurationHistograms,
    edge_calls: Family<CallLabels, Counter>,
    leader: Gauge,
    tunnels: Family<StateLabels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    /// Registers every family.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "tuna_operator_reconciles",
            "Reconciles by kind and outcome",
            reconciles.clone(),
        );
        let durations: DurationHistograms = Family::new_with_constructor(duration_histogram);
        registry.register(
            "tuna_operator_reconcile_duration_seconds",
            "Time spent in one reconcile, by kind",
            durations.clone(),
        );
        let edge_calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "tuna_operator_edge_api_calls",
            "Calls to the edge's REST API by operation and outcome",
            edge_calls.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "tuna_operator_leader",
            "1 while this process holds the controller's Lease",
            leader.clone(),
        );
        let tunnels = Family::<StateLabels, Gauge>::default();
        registry.register(
            "tuna_operator_tunnels",
            "Tunnels of the agent by state",
            tunnels.clone(),
        );
        Self {
            registry,
            reconciles,
            durations,
            edge_calls,
            leader,
            tunnels,
        }
    }

    /// Counts a finished reconcile and its duration.
    pub fn reconciled(&self, kind: &str, ok: bool, took: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                kind: kind.to_owned(),
                outcome: if ok { "ok" } else { "error" },
            })
            .inc();
        self.durations
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a failed reconcile (from the error policy).
    pub fn reconcile_error(&self, kind: &str) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                kind: kind.to_owned(),
                outcome: "error",
            })
            .inc();
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Sets the number of tunnels in `state`.
    pub fn set_tunnels(&self, state: &'static str, n: usize) {
        self.tunnels
            .get_or_create(&StateLabels { state })
            .set(n as i64);
    }

    fn edge_call<T>(&self, operation: &'static str, result: &crate::Result<T>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => match e.class() {
                ErrorClass::Retryable => "retryable",
                ErrorClass::RateLimited(_) => "rate_limited",
                ErrorClass::NeedsChange => "refused",
                ErrorClass::Gone => "not_found",
            },
        };
        self.edge_calls
            .get_or_create(&CallLabels { operation, outcome })
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Times a reconcile: `let _t = ReconcileTimer::start(&metrics, "Domain"); … t.finish(ok)`.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    kind: &'static str,
    started: Instant,
}

impl<'a> ReconcileTimer<'a> {
    /// Starts timing.
    pub fn start(metrics: &'a Metrics, kind: &'static str) -> Self {
        Self {
            metrics,
            kind,
            started: Instant::now(),
        }
    }

    /// Records the outcome.
    pub fn finish(self, ok: bool) {
        self.metrics
            .reconciled(self.kind, ok, self.started.elapsed());
    }
}

/// An [`EdgeApi`] that counts every call by operation and outcome.
pub struct MeteredEdge {
    inner: Arc<dyn EdgeApi>,
    metrics: Arc<Metrics>,
}

impl MeteredEdge {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn EdgeApi>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

macro_rules! metered {
    ($self:ident, $op:literal, $call:expr) => {{
        let result = $call.await;
        $self.metrics.edge_call($op, &result);
        result
    }};
}

impl EdgeApi for MeteredEdge {
    fn whoami(&self) -> BoxFuture<'_, crate::Result<WhoAmI>> {
        Box::pin(async move { metered!(self, "whoami", self.inner.whoami()) })
    }
    fn ensure_domain<'a>(
        &'a self,
        request: &'a CreateDomain,
    ) -> BoxFuture<'a, crate::Result<Reserved<Domain>>> {
        Box::pin(async move { metered!(self, "ensure_domain", self.inner.ensure_domain(request)) })
    }
    fn verify_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<Domain>> {
        Box::pin(async move { metered!(self, "verify_domain", self.inner.verify_domain(name)) })
    }
    fn list_domains(&self) -> BoxFuture<'_, crate::Result<Vec<Domain>>> {
        Box::pin(async move { metered!(self, "list_domains", self.inner.list_domains()) })
    }
    fn delete_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move { metered!(self, "delete_domain", self.inner.delete_domain(name)) })
    }
    fn ensure_tcp_endpoint<'a>(
        &'a self,
        request: &'a CreateTcpEndpoint,
    ) -> BoxFuture<'a, crate::Result<Reserved<TcpEndpoint>>> {
        Box::pin(async move {
            metered!(
                self,
                "ensure_tcp_endpoint",
                self.inner.ensure_tcp_endpoint(request)
            )
        })
    }
    fn delete_tcp_endpoint<'a>(&'a self, alias: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move {
            metered!(
                self,
                "delete_tcp_endpoint",
                self.inner.delete_tcp_endpoint(alias)
            )
        })
    }
    fn ensure_gateway_address<'a>(
        &'a self,
        request: &'a tuna_protocol::api::CreateGatewayAddress,
    ) -> BoxFuture<
        'a,
        crate::Result<tuna_agent::client::Reserved<tuna_protocol::api::GatewayAddress>>,
    > {
        Box::pin(async move {
            metered!(
                self,
                "ensure_gateway_address",
                self.inner.ensure_gateway_address(request)
            )
        })
    }
    fn delete_gateway_address(
        &self,
        address: std::net::IpAddr,
    ) -> BoxFuture<'_, crate::Result<()>> {
        Box::pin(async move {
            metered!(
                self,
                "delete_gateway_address",
                self.inner.delete_gateway_address(address)
            )
        })
    }
    fn list_gateway_addresses(
        &self,
    ) -> BoxFuture<'_, crate::Result<Vec<tuna_protocol::api::GatewayAddress>>> {
        Box::pin(async move {
            metered!(
                self,
                "list_gateway_addresses",
                self.inner.list_gateway_addresses()
            )
        })
    }
    fn create_token<'a>(
        &'a self,
        labels: &'a std::collections::BTreeMap<String, String>,
        bindings: &'a [Binding],
        ttl: Duration,
    ) -> BoxFuture<'a, crate::Result<MintedToken>> {
        Box::pin(async move {
            metered!(
                self,
                "create_token",
                self.inner.create_token(labels, bindings, ttl)
            )
        })
    }
    fn renew_token<'a>(&'a self, id: &'a str, ttl: Duration) -> BoxFuture<'a, crate::Result<i64>> {
        Box::pin(async move { metered!(self, "renew_token", self.inner.renew_token(id, ttl)) })
    }
    fn revoke_token<'a>(&'a self, id: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move { metered!(self, "revoke_token", self.inner.revoke_token(id)) })
    }
    fn list_tokens<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, crate::Result<Vec<Token>>> {
        Box::pin(async move { metered!(self, "list_tokens", self.inner.list_tokens(selector)) })
    }
}
