//! Tunnel: publishes one Service of the Tunnel's namespace at
//! `https://<subdomain>.<base domain>` (http) or on a reserved TCP port (tcp).
//!
//! - observe: the Tunnel; the Tunnels, Domains and TCPEndpoints that compete
//!   for the same host or endpoint (reflector stores); the upstream Service
//!   (`get`), and the Secret of `apiKeySecretRef` (`get`);
//! - desired ([`desired`], pure): the tunnel to run, or why not — the rules of
//!   [`crate::plan::plan`] (own-namespace Services only unless
//!   `--allow-external-upstreams`, the oldest Tunnel owns a host, …);
//! - apply: reserve the subdomain (or adopt it), publish the tunnel (own token
//!   with owner labels, minted with the operator's key or the Tunnel's),
//!   status `url` and `Ready` (True only while the edge serves it), events on
//!   every transition. A deleted Tunnel's tunnel stops and its token is
//!   revoked; the subdomain the agent reserved for it is released.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tuna_crds::{ConditionStatus, Domain, TcpEndpoint, Tunnel, TunnelStatus};
use tuna_protocol::api::CreateDomain;

use super::gateway_objects::{GatewaySnapshot, backend_services};
use super::state::{AgentState, SETTLE_WAIT, labels};
use crate::Error;
use crate::edge::api::{EdgeApi, ErrorClass, gone_is_ok};
use crate::edge::publisher::{Serving, TunnelKey, TunnelSpec, TunnelState};
use crate::plan::claims::ClaimBook;
use crate::plan::gateway_model::GatewayInputs;
use crate::plan::ingress::rule_hosts;
use crate::plan::service::ServiceIndex;
use crate::plan::tunnel::{DesiredTunnel, PortOrAlias, PublicEndpoint, upstream_service};
use crate::plan::{Inputs, Kind, ObjectRef, Plan, PlanOptions, Refusal, plan};
use crate::reconcile::kit::{Deletion, KitContext, Reconciler};
use crate::reconcile::{apply_status, ready, ready_of, reason_of, resync};

/// The objects that compete with a Tunnel for its host or endpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct Competitors<'a> {
    /// Tunnels of the same protocol and host or endpoint (the Tunnel among them).
    pub tunnels: &'a [Arc<Tunnel>],
    /// Ingresses with a rule for the Tunnel's host: an older one of another
    /// namespace owns an account host against the Tunnel.
    pub ingresses: &'a [Arc<Ingress>],
    /// Domains.
    pub domains: &'a [Arc<Domain>],
    /// TCPEndpoints.
    pub tcp_endpoints: &'a [Arc<TcpEndpoint>],
    /// HTTPRoutes that may serve the Tunnel's host, and the Gateways whose
    /// TCP listeners name its endpoint (with their classes).
    pub gateway: GatewayInputs<'a>,
    /// The claim book.
    pub claims: Option<&'a ClaimBook>,
}

/// What a Tunnel asks for, given the objects that compete with it (pure),
/// and the plan that decided it. `options` are the agent's plan options
/// (base domain, upstream policy, the account's hosts, the Ingress class).
pub fn desired(
    tunnel: &Tunnel,
    competitors: Competitors<'_>,
    services: &ServiceIndex,
    options: &PlanOptions,
) -> (Plan, Result<DesiredTunnel, Box<Refusal>>) {
    let me = ObjectRef::of(Kind::Tunnel, &tunnel.metadata);
    let inputs = Inputs {
        tunnels: competitors.tunnels,
        ingresses: competitors.ingresses,
        domains: competitors.domains,
        tcp_endpoints: competitors.tcp_endpoints,
        gateway: competitors.gateway,
        claims: competitors.claims,
    };
    let plan = plan(&inputs, services, options);
    let result = if let Some(r) = plan.refusals_of(&me).next() {
        Err(Box::new(r.clone()))
    } else {
        plan.tunnels.get(&me).cloned().ok_or_else(|| {
            Box::new(Refusal {
                object: me,
                rule: None,
                path: None,
                reason: crate::plan::Reason::HostConflict,
                message: "the Tunnel is not in the plan".into(),
            })
        })
    };
    (plan, result)
}

/// The tunnel key and public URL of a desired tunnel.
fn key_and_url(
    d: &DesiredTunnel,
    public_host: &str,
    port: Option<u16>,
) -> (TunnelKey, Option<String>) {
    match &d.public {
        PublicEndpoint::Http { host } => (
            TunnelKey::Host(host.clone()),
            Some(format!("https://{host}")),
        ),
        PublicEndpoint::Tcp(_) => (
            TunnelKey::Tcp(format!("{}/{}", d.namespace, d.name)),
            port.map(|p| format!("tcp://{public_host}:{p}")),
        ),
    }
}

/// The `Ready` condition a tunnel state means (pure).
pub fn condition_of(state: &TunnelState) -> (ConditionStatus, String, String) {
    match state {
        TunnelState::Serving { warnings, .. } if warnings.is_empty() => (
            ConditionStatus::True,
            "Connected".into(),
            "the tunnel is connected and serving".into(),
        ),
        TunnelState::Serving { warnings, .. } => (
            ConditionStatus::False,
            "UpstreamUnavailable".into(),
            format!(
                "the tunnel is connected but cannot forward: {}",
                warnings.join("; ")
            ),
        ),
        TunnelState::Pending { step } => (
            ConditionStatus::False,
            "Connecting".into(),
            step.to_string(),
        ),
        TunnelState::Refused { code, message } => (
            ConditionStatus::False,
            camel(code),
            format!("the edge refused the tunnel: {message}"),
        ),
        TunnelState::Failed { message, retrying } => (
            ConditionStatus::False,
            "TokenNotIssued".into(),
            if *retrying {
                format!("{message}; retrying with backoff")
            } else {
                message.clone()
            },
        ),
        TunnelState::Disconnected { reason } => (
            ConditionStatus::False,
            "Disconnected".into(),
            format!("the connection to the edge is down ({reason}); reconnecting"),
        ),
        TunnelState::Stopped => (ConditionStatus::False, "Stopped".into(), "stopped".into()),
    }
}

fn camel(code: &str) -> String {
    code.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn previous_ready(tunnel: &Tunnel) -> Option<Condition> {
    tunnel
        .status
        .as_ref()
        .and_then(|s| ready_of(&s.conditions).cloned())
}

/// Writes the status and emits an event when the Ready reason changed.
async fn report(
    state: &AgentState,
    tunnel: &Tunnel,
    url: Option<String>,
    status: ConditionStatus,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let api: Api<Tunnel> = Api::namespaced(
        state.ctx.client.clone(),
        tunnel.namespace().as_deref().unwrap_or("default"),
    );
    let previous = tunnel.status.clone().unwrap_or_default();
    let was = previous_ready(tunnel);
    let next = TunnelStatus {
        conditions: ready(
            &previous.conditions,
            status,
            reason,
            message,
            tunnel.metadata.generation,
        ),
        observed_generation: tunnel.metadata.generation,
        url,
    };
    apply_status(&api, tunnel, tunnel.status.as_ref(), &next).await?;
    if was.as_ref().is_none_or(|c| c.reason != reason) {
        let (type_, event) = match (status, was.as_ref().map(|c| c.status.as_str())) {
            (ConditionStatus::True, _) => (EventType::Normal, "TunnelConnected"),
            (_, Some("True")) => (EventType::Warning, "TunnelStopped"),
            _ => (EventType::Warning, reason),
        };
        state
            .ctx
            .event(
                tunnel,
                type_,
                event,
                "Publish",
                format!("{reason}: {message}"),
            )
            .await;
    }
    Ok(())
}

/// Stops what `object` published (token revoked) and releases the host the
/// agent reserved for it.
async fn withdraw(state: &AgentState, object: &ObjectRef, keep: Option<&TunnelKey>) {
    let claim = state
        .claims
        .lock()
        .expect("claims")
        .get(object)
        .cloned()
        .unwrap_or_default();
    if let Some(key) = claim.tunnel().filter(|k| Some(*k) != keep) {
        state.publisher.unpublish(key).await;
        if let Some(host) = claim.reserved_host.as_ref()
            && let Err(e) = gone_is_ok(state.ctx.edge.delete_domain(host).await)
        {
            tracing::warn!(tunnel = %object, %host, error = %e, "could not release the subdomain");
        }
        let mut claims = state.claims.lock().expect("claims");
        if claims.get(object).is_some() {
            claims.set_tunnel(object, None).reserved_host = None;
        }
    }
}

/// A deleted Tunnel: stop its tunnel, revoke its token, release its subdomain.
pub async fn cleanup(state: &AgentState, namespace: &str, name: &str) {
    let object = ObjectRef::new(Kind::Tunnel, namespace, name);
    withdraw(state, &object, None).await;
    state.claims.lock().expect("claims").remove(&object);
    state.reported.lock().expect("reported").remove(&object);
    tracing::info!(tunnel = %object, "deleted: tunnel stopped and its token revoked");
}

/// The Tunnel reconciler: no finalizer — once the Tunnel is gone,
/// [`cleanup`] withdraws what it published (the agent holds it alone).
pub struct Tunnels {
    state: Arc<AgentState>,
}

impl Tunnels {
    /// The reconciler over the agent's shared state.
    pub fn new(state: Arc<AgentState>) -> Self {
        Self { state }
    }
}

impl Reconciler for Tunnels {
    type Object = Tunnel;
    const KIND: &'static str = "Tunnel";
    const DELETION: Deletion = Deletion::Forget;

    fn kit(&self) -> KitContext<'_> {
        self.state.ctx.kit()
    }

    async fn apply(self: Arc<Self>, tunnel: Arc<Tunnel>) -> Result<Action, Error> {
        apply(&tunnel, &self.state).await
    }

    async fn forget(self: Arc<Self>, namespace: String, name: String) {
        cleanup(&self.state, &namespace, &name).await;
    }
}

async fn apply(tunnel: &Arc<Tunnel>, state: &AgentState) -> Result<Action, Error> {
    let ctx = &state.ctx;
    let me = ObjectRef::of(Kind::Tunnel, &tunnel.metadata);
    let who = match ctx.edge_info().await {
        Ok(w) => w.clone(),
        Err(e) => {
            report(
                state,
                tunnel,
                None,
                ConditionStatus::False,
                &reason_of(&e, "EdgeUnavailable"),
                &format!("{e}; retrying"),
            )
            .await?;
            return Err(e);
        }
    };
    // First: it waits until every store is filled (a plan must see every claimant).
    let book = state.claim_book().await?;
    // Observe: competitors for the same host or endpoint, and the Services.
    let competitors = state
        .stores
        .tunnel_index
        .competitors(tunnel, &state.stores.tunnels);
    for t in &competitors {
        if let Some((ns, name)) = upstream_service(t) {
            if Arc::ptr_eq(t, tunnel) || t.metadata.uid == tunnel.metadata.uid {
                state.services.refresh(&ns, &name).await;
            } else {
                state.services.ensure(&ns, &name).await;
            }
        }
    }
    let domains = state.stores.domains.state();
    let endpoints = state.stores.tcp_endpoints.state();
    let mut options = PlanOptions::cluster(&who.base_domain);
    options.policy = state.options.policy;
    // Ingresses on the same host: on an account host, the oldest claimant's
    // namespace owns it, whatever its kind.
    let mut claiming: Vec<Arc<Ingress>> = Vec::new();
    if let Some(host) = crate::plan::tunnel_host(tunnel, &options.base_domain) {
        claiming = state
            .stores
            .ingresses
            .state()
            .into_iter()
            .filter(|i| rule_hosts(i).contains(&host))
            .collect();
        if !claiming.is_empty() {
            options.ingress = state.ingress_options();
            options.account_hosts = state.account_hosts().await;
        }
    }
    // HTTPRoutes that may serve its host, Gateways whose TCP listeners name
    // its endpoint: ownership is settled over every kind's claims.
    let host = crate::plan::tunnel_host(tunnel, &options.base_domain);
    let tcp_key = crate::plan::tunnel_tcp_key(tunnel);
    let snapshot = GatewaySnapshot::of(state.gateway.get());
    let routes = match &host {
        Some(h) => snapshot.touching(&BTreeSet::from([h.clone()])),
        None => Vec::new(),
    };
    if !routes.is_empty() {
        options.ingress = state.ingress_options();
        options.account_hosts = state.account_hosts().await;
        for (ns, name) in routes.iter().flat_map(|r| backend_services(r)) {
            state.services.ensure(&ns, &name).await;
        }
    }
    let mut gateway = snapshot.inputs(&routes);
    gateway.tcp_routes = &[];
    if tcp_key.is_none() && routes.is_empty() {
        gateway = Default::default();
    }
    let competitors = Competitors {
        tunnels: &competitors,
        ingresses: &claiming,
        domains: &domains,
        tcp_endpoints: &endpoints,
        gateway,
        claims: Some(&book),
    };
    let (plan, desired) = desired(tunnel, competitors, &state.services.snapshot(), &options);
    // Every claimant of its host (or endpoint) was in view: the holder is
    // recorded before anything is published.
    state
        .claim_store
        .absorb(
            &plan,
            &host.into_iter().collect(),
            &tcp_key.into_iter().collect(),
        )
        .await?;
    let desired = match desired {
        Ok(d) => d,
        Err(refusal) => {
            withdraw(state, &me, None).await;
            report(
                state,
                tunnel,
                None,
                ConditionStatus::False,
                refusal.reason.as_str(),
                &refusal.message,
            )
            .await?;
            return Ok(resync(ctx.resync_interval));
        }
    };
    // The key this tunnel mints its token with.
    let (edge, identity): (Arc<dyn EdgeApi>, String) = match &desired.api_key_secret {
        None => (Arc::clone(&ctx.edge), "operator".to_owned()),
        Some((secret, key)) => match state.key_client(&desired.namespace, secret, key).await {
            Ok(k) => (k.edge, k.identity),
            Err(problem) => {
                withdraw(state, &me, None).await;
                report(
                    state,
                    tunnel,
                    None,
                    ConditionStatus::False,
                    problem.reason,
                    &problem.message,
                )
                .await?;
                return Ok(resync(ctx.resync_interval));
            }
        },
    };
    let (key, _) = key_and_url(&desired, &who.public_host, None);
    // An http Tunnel's subdomain is reserved for it (or adopted when the
    // account holds it already, e.g. through a Domain: never released then).
    let mut reserved_host = None;
    if let PublicEndpoint::Http { host } = &desired.public {
        // Once it serves, the reservation is there; otherwise (new, or refused
        // because the name was released elsewhere) reserve it again.
        let claimed = state
            .claims
            .lock()
            .expect("claims")
            .get(&me)
            .is_some_and(|c| c.tunnel() == Some(&key));
        // Re-reserve only when the edge refused the tunnel (the name may have
        // been released elsewhere); a lost connection is not the name's fault.
        let refused = state
            .publisher
            .state(&key)
            .is_none_or(|s| matches!(*s.borrow(), TunnelState::Refused { .. }));
        if !claimed || refused {
            let request = CreateDomain {
                subdomain: tunnel.spec.subdomain.clone(),
                domain: None,
            };
            match ctx.edge.ensure_domain(&request).await {
                Ok(r) => {
                    // Adopted, unless an earlier agent process reserved it for
                    // this very Tunnel (then it is still ours to release).
                    let uid = tunnel.metadata.uid.as_deref().unwrap_or("");
                    if !r.adopted || state.inherited_reservation(uid, host) {
                        reserved_host = Some(host.clone());
                    }
                }
                Err(e) => {
                    let needs_change =
                        matches!(e.class(), ErrorClass::NeedsChange | ErrorClass::Gone);
                    let (fallback, message) = if needs_change {
                        ("ReservationFailed", e.edge_message())
                    } else {
                        ("EdgeUnavailable", format!("{e}; retrying with backoff"))
                    };
                    report(
                        state,
                        tunnel,
                        None,
                        ConditionStatus::False,
                        &reason_of(&e, fallback),
                        &message,
                    )
                    .await?;
                    return if needs_change {
                        Ok(resync(ctx.resync_interval))
                    } else {
                        Err(e)
                    };
                }
            }
        }
    }
    // A changed host or endpoint: the old tunnel goes first.
    withdraw(state, &me, Some(&key)).await;
    let serving = match (&desired.public, &key) {
        (PublicEndpoint::Http { host }, _) => Serving::Http {
            host: host.clone(),
            routes: vec![tuna_routing::RouteSpec {
                host: host.clone(),
                path: "/".into(),
                path_type: tuna_routing::PathType::Prefix,
                backend: desired.upstream.clone().into(),
                origin: tuna_routing::Origin {
                    namespace: desired.namespace.clone(),
                    name: desired.name.clone(),
                    rule: 0,
                    path: 0,
                },
                tie_break: tuna_routing::TieBreak::default(),
                matcher: tuna_routing::Matcher::Ingress,
            }],
        },
        (PublicEndpoint::Tcp(endpoint), _) => Serving::Tcp {
            endpoint: match endpoint {
                PortOrAlias::Port(p) => p.to_string(),
                PortOrAlias::Alias(a) => a.clone(),
            },
            upstream: desired.upstream.clone(),
        },
    };
    let mut token_labels = state.token_labels("Tunnel", &desired.namespace, &desired.name);
    token_labels.insert(
        labels::UID.to_owned(),
        tunnel.metadata.uid.clone().unwrap_or_default(),
    );
    {
        let mut claims = state.claims.lock().expect("claims");
        let claim = claims.set_tunnel(&me, Some(key.clone()));
        if reserved_host.is_some() {
            claim.reserved_host = reserved_host;
        }
        if claim.reserved_host.is_some() {
            token_labels.insert(labels::RESERVED.to_owned(), "true".into());
        }
    }
    let (mut watch, revision) = state.publisher.publish(
        key.clone(),
        TunnelSpec {
            serving,
            keep_on_shutdown: token_labels.contains_key(labels::RESERVED),
            labels: token_labels,
            edge,
            edge_identity: identity,
        },
    );
    let _ = tokio::time::timeout(SETTLE_WAIT, watch.wait_for(|s| s.reached(revision))).await;
    let now = watch.borrow().clone();
    let port = match &now {
        TunnelState::Serving { port, .. } => *port,
        _ => None,
    };
    let (_, url) = key_and_url(
        &desired,
        &who.public_host,
        port.or_else(|| current_port(tunnel)),
    );
    let (status, reason, message) = condition_of(&now);
    report(state, tunnel, url, status, &reason, &message).await?;
    Ok(resync(ctx.resync_interval))
}

/// The port of the URL already in status (kept while reconnecting).
fn current_port(tunnel: &Tunnel) -> Option<u16> {
    let url = tunnel.status.as_ref()?.url.as_deref()?;
    url.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::service::UpstreamPolicy;

    fn objects<K: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<K>> {
        yaml.split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| Arc::new(serde_saphyr::from_str::<K>(d).expect("test manifest")))
            .collect()
    }

    fn services(yaml: &str) -> ServiceIndex {
        ServiceIndex::new(
            objects::<k8s_openapi::api::core::v1::Service>(yaml)
                .iter()
                .map(|s| crate::plan::service::ServiceInfo::from_service(s)),
        )
    }

    /// Each refused upstream kind, and the same with --allow-external-upstreams.
    #[test]
    fn upstream_rules_and_external_upstreams() {
        let svc = services(
            "metadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.0.0.1, ports: [{name: http, port: 8080}]}\n---\nmetadata: {name: other, namespace: blog}\nspec: {clusterIP: 10.0.0.2, ports: [{port: 80}]}\n---\nmetadata: {name: ext, namespace: shop}\nspec: {type: ExternalName, externalName: example.com, ports: [{port: 80}]}",
        );
        let table = [
            ("http://web:8080", Ok("10.0.0.1:8080")),
            ("http://web:http", Ok("10.0.0.1:8080")),
            ("http://web:nope", Err("ServicePortNotFound")),
            ("http://missing:80", Err("ServiceNotFound")),
            ("http://10.1.2.3:80", Err("IpAddressUpstream")),
            ("http://example.org:80", Err("ExternalHostUpstream")),
            ("http://other.blog:80", Err("OtherNamespaceService")),
            ("http://ext:80", Err("ExternalNameService")),
            ("not a url", Err("InvalidUpstreamUrl")),
        ];
        for (url, want) in table {
            let tunnel = objects::<Tunnel>(&format!(
                "metadata: {{name: t, namespace: shop}}\nspec: {{subdomain: web, upstream: {{url: '{url}'}}}}"
            ));
            let got = desired(
                &tunnel[0],
                Competitors {
                    tunnels: &tunnel,
                    ..Competitors::default()
                },
                &svc,
                &PlanOptions::cluster("tuna.test"),
            )
            .1
            .map(|d| d.upstream.authority())
            .map_err(|r| r.reason.as_str());
            assert_eq!(got.as_deref().map_err(|e| *e), want, "{url}");
            if want.is_err()
                && want != Err("ServicePortNotFound")
                && want != Err("ServiceNotFound")
                && want != Err("InvalidUpstreamUrl")
            {
                let mut options = PlanOptions::cluster("tuna.test");
                options.policy = UpstreamPolicy::cluster_allow_external();
                let allowed = desired(
                    &tunnel[0],
                    Competitors {
                        tunnels: &tunnel,
                        ..Competitors::default()
                    },
                    &svc,
                    &options,
                )
                .1;
                assert!(
                    allowed.is_ok(),
                    "{url} with allowExternalUpstreams: {allowed:?}"
                );
            }
        }
    }

    #[test]
    fn conditions_of_tunnel_states() {
        let serving = TunnelState::Serving {
            revision: 1,
            session_id: "s".into(),
            port: None,
            warnings: vec![],
        };
        assert_eq!(condition_of(&serving).0, ConditionStatus::True);
        let refused = TunnelState::Refused {
            code: "binding_not_allowed".into(),
            message: "no".into(),
        };
        assert_eq!(condition_of(&refused).1, "BindingNotAllowed");
        let down = TunnelState::Disconnected { reason: "x".into() };
        assert_eq!(condition_of(&down).0, ConditionStatus::False);
    }

    #[test]
    fn services_of_upstreams() {
        let t = objects::<Tunnel>(
            "metadata: {name: t, namespace: shop}\nspec: {protocol: tcp, portOrAlias: pg, upstream: {url: 'tcp://db.data.svc.cluster.local:5432'}}",
        );
        assert_eq!(upstream_service(&t[0]), Some(("data".into(), "db".into())));
        let t = objects::<Tunnel>(
            "metadata: {name: t, namespace: shop}\nspec: {subdomain: a, upstream: {url: 'http://web:80'}}",
        );
        assert_eq!(upstream_service(&t[0]), Some(("shop".into(), "web".into())));
    }
}
