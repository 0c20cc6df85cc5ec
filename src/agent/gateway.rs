//! Gateway API (group `gateway.networking.k8s.io`): HTTPRoutes attached to
//! Gateways of our GatewayClasses (`controllerName:
//! k8s.tuna.am/gateway-controller`) are published like Ingress hosts — one
//! tunnel per host, a route change swaps the routes in the proxy core without
//! reconnecting, a host that loses its last route is unpublished. TCPRoutes
//! (when their CRD is installed) are published like tcp Tunnels: one tunnel
//! per endpoint (the TCPEndpoint alias the listener's name gives, see
//! [`crate::plan::tcproute`]), keyed `TCPRoute/namespace/name`, its token
//! labelled with the TCPRoute; once bound, the Gateway's `status.addresses`
//! shows the public `host:port` (type `k8s.tuna.am/TCPEndpoint`).
//!
//! - observe: GatewayClasses, Gateways, HTTPRoutes, ReferenceGrants and
//!   Namespaces (their labels, for `allowedRoutes` selectors) in reflector
//!   stores, when the cluster serves the Gateway API: the agent looks at
//!   start-up and then every resync interval until it finds the CRDs (no
//!   restart needed when they are installed later); the Services the
//!   backendRefs name (`get`);
//! - desired: [`crate::plan::plan`] — the same function the Ingress
//!   reconciler uses, so a host is never served by two kinds: a Tunnel's or an
//!   Ingress's host stays theirs (the HTTPRoute is refused for it);
//! - apply: one sync of every Gateway API object at once (there are few,
//!   and attachment, hostnames and grants tie them together): publish the
//!   hosts the routes win, stop those they lost, then write the status of
//!   our GatewayClasses (`Accepted`), their Gateways (`Accepted`,
//!   `Programmed`, `addresses` — the hosts served, `listeners`) by
//!   server-side apply, and the HTTPRoutes' `status.parents` entries of our
//!   controller (the list is atomic: read-modify-write with the
//!   resourceVersion, keeping other controllers' entries); events on
//!   HTTPRoutes as on Ingresses: `RoutesUpdated`, `RuleSkipped`,
//!   `BackendSkipped`, `TunnelConnected`, `TunnelStopped`.
//!
//! A sync runs on any change of those objects, of a Domain, of an Ingress or
//! Tunnel on a host the routes may serve, of the tunnel of such a host, and
//! every resync interval (Services are re-read then).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tuna_crds::gateway::httproutes::{HttpRouteStatus, HttpRouteStatusParents};
use tuna_crds::gateway::{
    CONTROLLER_NAME, Gateway, GatewayClass, HttpRoute, ReferenceGrant, TcpRoute,
};

use super::gateway_objects::{
    GatewaySnapshot, GatewayStores, backend_services, names_our_gateway, tcp_backend_services,
    tcp_names_our_gateway,
};
use super::publish::{self, publish_hosts, routes_summary};
use super::state::AgentState;
use crate::Error;
use crate::edge::publisher::{Serving, TunnelKey, TunnelSpec, TunnelState};
use crate::plan::gateway_model::{CertificateSecret, Cond, GatewayStatus, RouteStatus};
use crate::plan::gateway_status::certificate_secrets;
use crate::plan::ingress::{rule_hosts, service_names};
use crate::plan::tunnel::PortOrAlias;
use crate::plan::{HostSource, Inputs, Kind, ObjectRef, Plan, plan};
use crate::reconcile::{FIELD_MANAGER, PendingEvents, store_ready};

/// The API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// What the cluster serves of the Gateway API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// The version ReferenceGrants are read in (`v1`, else `v1beta1`; none
    /// when the CRD is missing: then no backendRef crosses namespaces).
    pub grants_version: Option<&'static str>,
    /// Whether TCPRoutes are served in `v1` (the standard channel since
    /// v1.5; without them TCP listeners have no routes).
    pub tcp_routes: bool,
}

/// Whether the cluster serves GatewayClass, Gateway and HTTPRoute in `v1`
/// (API discovery; any error counts as "not yet").
pub async fn discover(client: &Client) -> Option<Discovered> {
    let names = |list: k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList| {
        list.resources
            .into_iter()
            .map(|r| r.name)
            .collect::<BTreeSet<String>>()
    };
    let v1 = names(
        client
            .list_api_group_resources(&format!("{GROUP}/v1"))
            .await
            .ok()?,
    );
    if !["gatewayclasses", "gateways", "httproutes"]
        .iter()
        .all(|r| v1.contains(*r))
    {
        return None;
    }
    let grants_version = if v1.contains("referencegrants") {
        Some("v1")
    } else {
        client
            .list_api_group_resources(&format!("{GROUP}/v1beta1"))
            .await
            .ok()
            .filter(|l| l.resources.iter().any(|r| r.name == "referencegrants"))
            .map(|_| "v1beta1")
    };
    Some(Discovered {
        grants_version,
        tcp_routes: v1.contains("tcproutes"),
    })
}

/// Reads (with `get`, as every Secret the agent reads) the Secrets our
/// Gateways' listeners name as `certificateRefs` and may use (their own
/// namespace's, or another's that a ReferenceGrant opens): whether each
/// holds a PEM certificate chain in `tls.crt` and a private key in
/// `tls.key`. Nothing of their data is kept or logged. Secrets are not
/// watched (the agent may not list Secrets): a Secret created or fixed
/// later is seen at the next sync, and while one is missing or unusable
/// the agent syncs again soon ([`CERTIFICATE_RECHECK`]), so that a Gateway
/// applied a moment before its Secret does not wait for the resync
/// interval. Returns the Secrets read, and whether one is missing or
/// unusable.
async fn read_certificates(
    state: &AgentState,
    snapshot: &GatewaySnapshot,
) -> (Vec<CertificateSecret>, Certificates, bool) {
    let ours = snapshot.our_gateways();
    let grants: Vec<&ReferenceGrant> = snapshot.grants.iter().map(|g| &**g).collect();
    let wanted: BTreeSet<(String, String)> = snapshot
        .gateways
        .iter()
        .filter(|g| {
            ours.contains(&(
                g.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                g.metadata.name.clone().unwrap_or_default(),
            ))
        })
        .flat_map(|g| certificate_secrets(g, &grants))
        .collect();
    let mut found = Vec::new();
    let mut usable = Certificates::new();
    let mut pending = false;
    for (namespace, name) in wanted {
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(state.ctx.client.clone(), &namespace);
        let problem = match api.get_opt(&name).await {
            Ok(Some(secret)) => match server_certificate(&secret) {
                Ok(certificate) => {
                    usable.insert((namespace.clone(), name.clone()), certificate);
                    None
                }
                Err(problem) => Some(problem),
            },
            Ok(None) => {
                pending = true;
                continue;
            }
            Err(e) => {
                tracing::warn!(%namespace, %name, error = %e, "cannot read a listener's certificate Secret");
                Some(format!("cannot be read: {e}"))
            }
        };
        pending |= problem.is_some();
        found.push(CertificateSecret {
            namespace,
            name,
            problem,
        });
    }
    (found, usable, pending)
}

/// The usable certificates of listeners' Secrets, by (namespace, name):
/// what HTTPS listeners on Gateway addresses serve. Kept in memory only,
/// for the sync that read them.
type Certificates = BTreeMap<(String, String), tuna_proxy::ServerCertificate>;

/// How soon a sync runs again while a listener's certificate Secret or a
/// route's Service is missing (or the Secret unusable): from 2 s, doubling
/// to 1 min (both are read, not watched: see [`read_certificates`]).
const CERTIFICATE_RECHECK: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(60));

/// Why a Secret cannot serve TLS (`None`: `tls.crt` holds a PEM
/// certificate chain and `tls.key` the PEM private key of its leaf)
/// (pure).
pub fn certificate_problem(secret: &k8s_openapi::api::core::v1::Secret) -> Option<String> {
    server_certificate(secret).err()
}

/// The certificate and key a Secret holds (`tls.crt`, `tls.key`), ready
/// for an HTTPS listener on a Gateway's address; else why it cannot serve
/// TLS, in words that name nothing of its data (pure).
pub fn server_certificate(
    secret: &k8s_openapi::api::core::v1::Secret,
) -> Result<tuna_proxy::ServerCertificate, String> {
    let data = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| &v.0[..])
    };
    let Some(crt) = data("tls.crt") else {
        return Err("it has no tls.crt".into());
    };
    let Some(key) = data("tls.key") else {
        return Err("it has no tls.key".into());
    };
    tuna_proxy::ServerCertificate::from_pem(crt, key).map_err(|e| match e {
        tuna_proxy::Error::InvalidCertificate(why) => why,
        other => other.to_string(),
    })
}

/// The tunnel key of a TCPRoute's endpoint (`TCPRoute/namespace/name`: a
/// tcp Tunnel's is `namespace/name`).
pub fn tcp_route_key(route: &ObjectRef) -> TunnelKey {
    TunnelKey::Tcp(format!("TCPRoute/{}/{}", route.namespace, route.name))
}

/// Watches `api` into `writer`; every change asks for a sync.
fn spawn_watch<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    writer: Writer<K>,
    trigger: mpsc::UnboundedSender<()>,
) -> tokio::task::JoinHandle<()>
where
    K: Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    let stream = stream.default_backoff().reflect(writer).touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(changed) = stream.next().await {
            if changed.is_ok() {
                let _ = trigger.send(());
            }
        }
    })
}

/// A watch event of another version of a kind, as `K` (same schema).
fn convert<K: DeserializeOwned>(event: watcher::Event<DynamicObject>) -> Option<watcher::Event<K>> {
    let object = |o: DynamicObject| -> Option<K> {
        serde_json::to_value(o)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
    };
    Some(match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(object(o)?),
        watcher::Event::Delete(o) => watcher::Event::Delete(object(o)?),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(object(o)?),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}

/// Starts the watches and the sync loop; sets `state.gateway`.
pub fn start(
    client: &Client,
    state: &Arc<AgentState>,
    discovered: &Discovered,
    triggers: mpsc::UnboundedReceiver<()>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let config = watcher::Config::default();
    let tx = state.gateway_triggers.clone();
    let mut tasks = Vec::new();
    let (classes, w) = reflector::store::<GatewayClass>();
    tasks.push(spawn_watch(
        watcher(Api::all(client.clone()), config.clone()),
        w,
        tx.clone(),
    ));
    let (gateways, w) = reflector::store::<Gateway>();
    tasks.push(spawn_watch(
        watcher(Api::all(client.clone()), config.clone()),
        w,
        tx.clone(),
    ));
    let (routes, w) = reflector::store::<HttpRoute>();
    tasks.push(spawn_watch(
        watcher(Api::all(client.clone()), config.clone()),
        w,
        tx.clone(),
    ));
    let tcp_routes = discovered.tcp_routes.then(|| {
        let (tcp_routes, w) = reflector::store::<TcpRoute>();
        tasks.push(spawn_watch(
            watcher(Api::all(client.clone()), config.clone()),
            w,
            tx.clone(),
        ));
        tcp_routes
    });
    let (namespaces, w) = reflector::store::<Namespace>();
    tasks.push(spawn_watch(
        watcher(Api::all(client.clone()), config.clone()),
        w,
        tx.clone(),
    ));
    let grants = match discovered.grants_version {
        Some("v1") => {
            let (grants, w) = reflector::store::<ReferenceGrant>();
            tasks.push(spawn_watch(
                watcher(Api::all(client.clone()), config.clone()),
                w,
                tx.clone(),
            ));
            Some(grants)
        }
        Some(version) => {
            let (grants, w) = reflector::store::<ReferenceGrant>();
            let resource = ApiResource {
                group: GROUP.into(),
                version: version.into(),
                api_version: format!("{GROUP}/{version}"),
                kind: "ReferenceGrant".into(),
                plural: "referencegrants".into(),
            };
            let stream = watcher(
                Api::<DynamicObject>::all_with(client.clone(), &resource),
                config.clone(),
            )
            .filter_map(|e| async move {
                match e {
                    Ok(e) => convert::<ReferenceGrant>(e).map(Ok),
                    Err(e) => Some(Err(e)),
                }
            });
            tasks.push(spawn_watch(stream, w, tx.clone()));
            Some(grants)
        }
        None => None,
    };
    let _ = state.gateway.set(GatewayStores {
        classes,
        gateways,
        routes,
        grants,
        tcp_routes,
        namespaces,
    });
    let state = Arc::clone(state);
    tasks.push(tokio::spawn(run(state, triggers)));
    tasks
}

/// Finds the Gateway API (now, else every resync interval) and then runs it.
pub async fn discover_and_run(
    client: Client,
    state: Arc<AgentState>,
    triggers: mpsc::UnboundedReceiver<()>,
) {
    let mut logged = false;
    let discovered = loop {
        if let Some(d) = discover(&client).await {
            break d;
        }
        // Known to be absent: plans need not wait for HTTPRoutes.
        state.gateway_known.send_replace(true);
        if !logged {
            tracing::info!(
                group = GROUP,
                "the Gateway API CRDs are not installed: HTTPRoutes are not served; the agent looks again every resync interval"
            );
            logged = true;
        }
        tokio::time::sleep(state.ctx.resync_interval).await;
    };
    tracing::info!(referencegrants = ?discovered.grants_version, tcproutes = discovered.tcp_routes, "serving the Gateway API (HTTPRoute, TCPRoute)");
    let tasks = start(&client, &state, &discovered, triggers);
    // Aborted with this future (the agent's side tasks are).
    struct AbortAll(Vec<tokio::task::JoinHandle<()>>);
    impl Drop for AbortAll {
        fn drop(&mut self) {
            for t in &self.0 {
                t.abort();
            }
        }
    }
    let _guard = AbortAll(tasks);
    // Plans wait for the Gateway API's stores: a plan without the
    // HTTPRoutes would not see their claims (and record another holder).
    if let Some(stores) = state.gateway.get().cloned()
        && stores.ready().await
    {
        state.gateway_known.send_replace(true);
    }
    std::future::pending::<()>().await;
}

/// How long a failed sync waits before it runs again.
const RETRY: Duration = Duration::from_secs(2);

async fn run(state: Arc<AgentState>, mut triggers: mpsc::UnboundedReceiver<()>) {
    let Some(stores) = state.gateway.get().cloned() else {
        return;
    };
    let s = &state.stores;
    let (a, b, c, d) = futures::join!(
        stores.ready(),
        store_ready(&s.ingresses),
        store_ready(&s.tunnels),
        store_ready(&s.domains),
    );
    if !(a && b && c && d) {
        return;
    }
    let mut resync = tokio::time::interval(state.ctx.resync_interval);
    let mut recheck = CERTIFICATE_RECHECK.0;
    loop {
        // A resync tick re-reads the Services; a change uses the cache.
        let refresh = tokio::select! {
            t = triggers.recv() => {
                if t.is_none() {
                    return;
                }
                false
            }
            _ = resync.tick() => true,
        };
        while triggers.try_recv().is_ok() {}
        let again = match sync(&state, refresh).await {
            Err(e) => {
                tracing::warn!(error = %e, "Gateway API sync failed; retrying");
                Some(RETRY)
            }
            // A certificate Secret or a Service missing: look again soon.
            Ok(true) => {
                let wait = recheck;
                recheck = (recheck * 2).min(CERTIFICATE_RECHECK.1);
                Some(wait)
            }
            Ok(false) => {
                recheck = CERTIFICATE_RECHECK.0;
                None
            }
        };
        if let Some(wait) = again {
            let tx = state.gateway_triggers.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let _ = tx.send(());
            });
        }
    }
}

/// One sync of every Gateway API object (see the module docs). Returns
/// whether a listener's certificate Secret or a route's Service is missing
/// (or the Secret unusable): then it should run again soon.
async fn sync(state: &AgentState, refresh: bool) -> Result<bool, Error> {
    // First: it waits until every store is filled (a plan must see every claimant).
    let book = state.claim_book().await?;
    let who = state.ctx.edge_info().await?.clone();
    let options = publish::options_for(
        state,
        state.ingress_options(),
        &who.base_domain,
        state.account_hosts().await,
    );
    let mut gateway = GatewaySnapshot::of(state.gateway.get());
    let (certificates, usable, certificates_pending) = read_certificates(state, &gateway).await;
    gateway.certificates = certificates;
    // tcp Tunnels on the aliases TCP listeners name: they keep them (their
    // Services are read so that the plan sees them as it does in their
    // reconciler).
    // By one key: a listener named `30001` and `portOrAlias: 30001` are
    // the same port (issue 37, item 3).
    let listener_keys: BTreeSet<String> = gateway
        .gateways
        .iter()
        .flat_map(|g| &g.spec.listeners)
        .filter(|l| l.protocol == "TCP")
        .map(|l| crate::plan::claims::tcp_key(&l.name))
        .collect();
    let tcp_tunnels: Vec<_> = state
        .stores
        .tunnels
        .state()
        .into_iter()
        .filter(|t| crate::plan::tunnel_tcp_key(t).is_some_and(|k| listener_keys.contains(&k)))
        .collect();
    // Only routes we may serve cost Service reads (any tenant may create
    // routes; those naming no Gateway of ours are not ours to resolve).
    let ours = gateway.our_gateways();
    let services: BTreeSet<(String, String)> = gateway
        .routes
        .iter()
        .filter(|r| names_our_gateway(r, &ours))
        .flat_map(|r| backend_services(r))
        .chain(
            gateway
                .tcp_routes
                .iter()
                .filter(|r| tcp_names_our_gateway(r, &ours))
                .flat_map(|r| tcp_backend_services(r)),
        )
        .chain(
            tcp_tunnels
                .iter()
                .filter_map(|t| crate::plan::tunnel::upstream_service(t)),
        )
        .collect();
    // A Service a route names that was not found (or is headless without
    // a ready endpoint) is read again at every sync, and while one is
    // unresolved the agent syncs again soon (as for certificate Secrets):
    // a route applied a moment before its Service (or its EndpointSlices)
    // resolves in seconds, not at the next resync.
    let mut services_missing = false;
    for (namespace, name) in &services {
        if refresh || state.services.is_unresolved(namespace, name) {
            state.services.refresh(namespace, name).await;
        } else {
            state.services.ensure(namespace, name).await;
        }
        services_missing |= state.services.is_unresolved(namespace, name);
    }
    let certificates_pending = certificates_pending || services_missing;
    let domains = state.stores.domains.state();
    let all = gateway.inputs(&gateway.routes);
    // Where the routes may go (without the Tunnels and Ingresses that may
    // hold some of those hosts): the hosts to plan, and to watch for.
    let reach = plan(
        &Inputs {
            domains: &domains,
            gateway: all,
            ..Default::default()
        },
        &state.services.snapshot(),
        &options,
    );
    let may: BTreeSet<String> = reach.hosts.keys().cloned().collect();
    let mut hosts: BTreeSet<String> = {
        let mut known = state.gateway_hosts.lock().expect("gateway hosts");
        let hosts = known.union(&may).cloned().collect();
        *known = may;
        hosts
    };
    if refresh {
        // The sweep: every published host is planned again at each resync,
        // so one that nothing claims any more (a deleted Ingress whose
        // cleanup failed) is unpublished below; hosts an Ingress or a Tunnel
        // still publishes stay their reconciler's.
        hosts.extend(state.publisher.keys().into_iter().filter_map(|k| match k {
            TunnelKey::Host(h) => Some(h),
            _ => None,
        }));
    }
    let ingresses: Vec<_> = state
        .stores
        .ingresses
        .state()
        .into_iter()
        .filter(|i| rule_hosts(i).iter().any(|h| hosts.contains(h)))
        .collect();
    let translate = state.ingress_options();
    for i in &ingresses {
        let namespace = i.metadata.namespace.as_deref().unwrap_or("default");
        for name in service_names(i, &translate) {
            state.services.ensure(namespace, &name).await;
        }
    }
    let base = options.base_domain.clone();
    let tunnels: Vec<_> = state
        .stores
        .tunnels
        .state()
        .into_iter()
        .filter(|t| crate::plan::tunnel_host(t, &base).is_some_and(|h| hosts.contains(&h)))
        .chain(tcp_tunnels)
        .collect();
    let tcp_endpoints = state.stores.tcp_endpoints.state();
    let plan = plan(
        &Inputs {
            ingresses: &ingresses,
            tunnels: &tunnels,
            domains: &domains,
            tcp_endpoints: &tcp_endpoints,
            gateway: all,
            claims: Some(&book),
        },
        &state.services.snapshot(),
        &options,
    );
    // Every claimant of these hosts and TCP endpoints was in view: their
    // holders are recorded before anything is published.
    state
        .claim_store
        .absorb(&plan, &hosts, &listener_keys)
        .await?;
    // The hosts HTTPRoutes publish, and those nothing publishes any more;
    // a Tunnel's or an Ingress's host is their reconciler's.
    let ours: BTreeSet<String> = hosts
        .iter()
        .filter(|h| {
            plan.hosts
                .get(*h)
                .is_none_or(|p| matches!(p.source, HostSource::HttpRoutes(_)))
        })
        .cloned()
        .collect();
    publish_hosts(state, &ours, &plan, None).await;
    publish_tcp_routes(state, &plan).await;
    let own = publish_addresses(state, &plan, refresh, &usable).await;
    {
        // Hosts published now stay watched even if no route may reach them
        // any more (until a sync unpublishes them).
        let mut known = state.gateway_hosts.lock().expect("gateway hosts");
        known.extend(
            plan.hosts
                .iter()
                .filter(|(_, p)| matches!(p.source, HostSource::HttpRoutes(_)))
                .map(|(h, _)| h.clone()),
        );
    }
    let mut first_error = None;
    let mut keep = |r: Result<(), Error>| {
        if let Err(e) = r
            && first_error.is_none()
        {
            first_error = Some(e);
        }
    };
    let stores = state.gateway.get().cloned();
    let Some(stores) = stores else {
        return Ok(certificates_pending);
    };
    for class in &plan.gateway.classes {
        if let Some(object) = stores.classes.get(&reflector::ObjectRef::new(&class.name)) {
            keep(write_class_status(state, &object, class).await);
        }
    }
    for g in &plan.gateway.gateways {
        let key = reflector::ObjectRef::new(&g.object.name).within(&g.object.namespace);
        if let Some(object) = stores.gateways.get(&key) {
            let address = own.get(&g.object).cloned();
            keep(write_gateway_status(state, &object, g, &who.public_host, address).await);
        }
    }
    let statuses: BTreeMap<&ObjectRef, &RouteStatus> =
        plan.gateway.routes.iter().map(|r| (&r.object, r)).collect();
    let mut live = BTreeSet::new();
    for route in &gateway.routes {
        let me = ObjectRef::of(Kind::HttpRoute, &route.metadata);
        live.insert(me.clone());
        let status = statuses.get(&me).copied();
        keep(write_route_status(state, route.as_ref(), status).await);
        if status.is_some() || state.reported.lock().expect("reported").contains_key(&me) {
            report(state, route, &me, &plan, status).await;
        }
    }
    for route in &gateway.tcp_routes {
        let me = ObjectRef::of(Kind::TcpRoute, &route.metadata);
        live.insert(me.clone());
        let status = statuses.get(&me).copied();
        keep(write_route_status(state, route.as_ref(), status).await);
        if status.is_some() || state.reported.lock().expect("reported").contains_key(&me) {
            report_tcp(state, route, &me, &plan, status, &who.public_host).await;
        }
    }
    state
        .reported
        .lock()
        .expect("reported")
        .retain(|o, _| !matches!(o.kind, Kind::HttpRoute | Kind::TcpRoute) || live.contains(o));
    first_error.map_or(Ok(certificates_pending), Err)
}

/// Publishes the TCP endpoints of the TCPRoutes in `plan` (one tunnel per
/// endpoint, its token labelled with the TCPRoute), and stops those of
/// TCPRoutes that no longer have one.
async fn publish_tcp_routes(state: &AgentState, plan: &Plan) {
    let wanted: BTreeMap<TunnelKey, (&ObjectRef, &crate::plan::TcpPlan)> = plan
        .tcp
        .iter()
        .filter(|(o, _)| o.kind == Kind::TcpRoute)
        .map(|(o, t)| (tcp_route_key(o), (o, t)))
        .collect();
    for (key, (route, tcp)) in &wanted {
        state.publisher.publish(
            key.clone(),
            TunnelSpec {
                serving: Serving::Tcp {
                    endpoint: match &tcp.endpoint {
                        PortOrAlias::Port(p) => p.to_string(),
                        PortOrAlias::Alias(a) => a.clone(),
                    },
                    upstream: tcp.upstream.clone(),
                },
                labels: state.token_labels("TCPRoute", &route.namespace, &route.name),
                edge: Arc::clone(&state.ctx.edge),
                edge_identity: "operator".into(),
                keep_on_shutdown: false,
            },
        );
    }
    for key in state.publisher.keys() {
        if matches!(&key, TunnelKey::Tcp(id) if id.starts_with("TCPRoute/"))
            && !wanted.contains_key(&key)
        {
            state.publisher.unpublish(&key).await;
            tracing::info!(tunnel = %key.id(), "TCPRoute no longer published: tunnel stopped, token revoked");
        }
    }
}

/// The edge's name of a Gateway's address: the cluster, then the Gateway
/// (unique within the account, which several clusters may share).
fn address_name(state: &AgentState, gateway: &ObjectRef) -> String {
    format!(
        "{}/{}/{}",
        state.options.cluster_id, gateway.namespace, gateway.name
    )
}

/// With an address per Gateway ([`crate::plan::PlanOptions::gateway_addresses`]):
/// reserves each planned Gateway's address at the edge (the one its
/// `spec.addresses` asks for, else the edge's pick; an existing reservation
/// of the same name is adopted, so a restarted agent keeps its addresses),
/// publishes its TCP and HTTP listeners on it, and gives back the addresses of
/// Gateways that are gone (on a resync also those a previous process held
/// for Gateways deleted while it was down). Returns each Gateway's address,
/// or why it has none.
async fn publish_addresses(
    state: &AgentState,
    plan: &Plan,
    refresh: bool,
    certificates: &Certificates,
) -> BTreeMap<ObjectRef, Result<std::net::IpAddr, String>> {
    let mut out = BTreeMap::new();
    let wanted: BTreeMap<String, (&ObjectRef, &crate::plan::gateway_model::AddressPlan)> = plan
        .gateway
        .addresses
        .iter()
        .map(|(g, a)| (address_name(state, g), (g, a)))
        .collect();
    // Gateways gone (or no longer ours) give their addresses back first,
    // so that a Gateway waiting for one gets it in this pass.
    let gone: Vec<(String, std::net::IpAddr)> = state
        .gateway_addresses
        .lock()
        .expect("gateway addresses")
        .iter()
        .filter(|(name, _)| !wanted.contains_key(*name))
        .map(|(n, ip)| (n.clone(), *ip))
        .collect();
    for (name, ip) in gone {
        release_address(state, &name, ip).await;
    }
    for (name, (gateway, want)) in &wanted {
        let held = state
            .gateway_addresses
            .lock()
            .expect("gateway addresses")
            .get(name)
            .copied();
        if let Some(why) = &want.unusable {
            // spec.addresses asks for what cannot be given: no address.
            let key = TunnelKey::Address(format!("{}/{}", gateway.namespace, gateway.name));
            state.publisher.unpublish(&key).await;
            if let Some(old) = held {
                release_address(state, name, old).await;
            }
            out.insert((*gateway).clone(), Err(why.clone()));
            continue;
        }
        let address = match held {
            Some(ip) if want.requested.is_none_or(|r| r == ip) => ip,
            _ => {
                if let Some(old) = held {
                    // spec.addresses now asks for another one.
                    release_address(state, name, old).await;
                }
                let request = tuna_protocol::api::CreateGatewayAddress {
                    name: name.clone(),
                    address: want.requested,
                };
                match state.ctx.edge.ensure_gateway_address(&request).await {
                    Ok(reserved) => {
                        let ip = reserved.object.address;
                        tracing::info!(gateway = %gateway, address = %ip, adopted = reserved.adopted, "the Gateway has its own address");
                        state
                            .gateway_addresses
                            .lock()
                            .expect("gateway addresses")
                            .insert(name.clone(), ip);
                        ip
                    }
                    Err(e) => {
                        tracing::warn!(gateway = %gateway, error = %e, "could not reserve the Gateway's address");
                        out.insert((*gateway).clone(), Err(e.to_string()));
                        continue;
                    }
                }
            }
        };
        out.insert((*gateway).clone(), Ok(address));
        let key = TunnelKey::Address(format!("{}/{}", gateway.namespace, gateway.name));
        let serving = Serving::address(address, want, certificates);
        if serving.is_empty() {
            state.publisher.unpublish(&key).await;
            continue;
        }
        state.publisher.publish(
            key,
            TunnelSpec {
                serving,
                labels: state.token_labels("Gateway", &gateway.namespace, &gateway.name),
                edge: Arc::clone(&state.ctx.edge),
                edge_identity: "operator".into(),
                keep_on_shutdown: false,
            },
        );
    }
    for key in state.publisher.keys() {
        if let TunnelKey::Address(g) = &key
            && !wanted.values().any(|(o, a)| {
                format!("{}/{}", o.namespace, o.name) == *g
                    && !(a.tcp.is_empty() && a.http.is_empty())
            })
        {
            state.publisher.unpublish(&key).await;
        }
    }
    let first = !state
        .gateway_addresses_swept
        .swap(true, std::sync::atomic::Ordering::Relaxed);
    if (refresh || first)
        && state
            .ctx
            .edge_info_now()
            .is_some_and(|w| w.gateway_addresses)
    {
        // Held by a previous process for Gateways deleted while it was down
        // (looked for at the first sync and at each resync).
        let mine = format!("{}/", state.options.cluster_id);
        match state.ctx.edge.list_gateway_addresses().await {
            Ok(list) => {
                for a in list {
                    if a.name.starts_with(&mine) && !wanted.contains_key(&a.name) {
                        release_address(state, &a.name, a.address).await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not list the Gateway addresses"),
        }
    }
    out
}

/// Gives one Gateway address back to the edge (already gone is fine).
async fn release_address(state: &AgentState, name: &str, address: std::net::IpAddr) {
    match crate::edge::api::gone_is_ok(state.ctx.edge.delete_gateway_address(address).await) {
        Ok(()) => {
            tracing::info!(reservation = %name, %address, "Gateway address given back");
            state
                .gateway_addresses
                .lock()
                .expect("gateway addresses")
                .remove(name);
        }
        Err(e) => {
            tracing::warn!(reservation = %name, %address, error = %e, "could not give the Gateway address back; retrying at the next sync")
        }
    }
}

/// The public `host:port` of a TCPRoute's endpoint, once its tunnel is bound.
fn tcp_address(state: &AgentState, public_host: &str, route: &ObjectRef) -> Option<String> {
    let watch = state.publisher.state(&tcp_route_key(route))?;
    let port = match &*watch.borrow() {
        TunnelState::Serving { port, .. } => (*port)?,
        _ => return None,
    };
    Some(format!("{public_host}:{port}"))
}

/// The `status.addresses` type of a TCPRoute's public endpoint.
pub const TCP_ADDRESS_TYPE: &str = "k8s.tuna.am/TCPEndpoint";

/// Whether the tunnel of `host` is serving.
fn serving(state: &AgentState, host: &str) -> bool {
    state
        .publisher
        .state(&TunnelKey::Host(host.to_owned()))
        .is_some_and(|w| matches!(*w.borrow(), TunnelState::Serving { .. }))
}

/// The conditions `desired` make, given the `previous` ones: a condition
/// whose status did not change keeps its `lastTransitionTime`; every one
/// carries `observedGeneration` (pure).
pub fn conditions(
    previous: &[Condition],
    desired: &[Cond],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            let since = previous
                .iter()
                .find(|p| p.type_ == c.type_ && p.status == status)
                .map_or_else(|| now.clone(), |p| p.last_transition_time.clone());
            Condition {
                type_: c.type_.to_owned(),
                status: status.to_owned(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// Conditions in a stable order, to compare lists the API server may keep
/// in another order.
fn sorted(mut c: Vec<Condition>) -> Vec<Condition> {
    c.sort_by(|a, b| a.type_.cmp(&b.type_));
    c
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Server-side apply of `status` on a cluster-scoped or namespaced object.
async fn apply_status<K>(api: &Api<K>, name: &str, status: Value) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

async fn write_class_status(
    state: &AgentState,
    class: &GatewayClass,
    desired: &crate::plan::gateway_model::ClassStatus,
) -> Result<(), Error> {
    let previous = class
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let next = conditions(&previous, &desired.conditions, desired.generation, &now());
    // A class annotated for the shared ports claims what they can serve.
    let own_addresses = state
        .ctx
        .edge_info_now()
        .is_some_and(|w| w.gateway_addresses)
        && !crate::plan::gateway_model::class_shares_ports(class);
    let features = crate::plan::httproute::supported_features(own_addresses);
    let current_features: Vec<String> = class
        .status
        .as_ref()
        .and_then(|s| s.supported_features.as_ref())
        .map(|f| f.iter().map(|f| f.name.clone()).collect())
        .unwrap_or_default();
    if sorted(next.clone()) == sorted(previous) && current_features == features {
        return Ok(());
    }
    let api: Api<GatewayClass> = Api::all(state.ctx.client.clone());
    let supported: Vec<Value> = features.iter().map(|f| json!({ "name": f })).collect();
    apply_status(
        &api,
        &desired.name,
        json!({ "conditions": next, "supportedFeatures": supported }),
    )
    .await
}

/// The `status` of a Gateway (pure): `addresses` are the hosts of
/// `desired` whose tunnel serves.
///
/// `tcp_address` gives the public `host:port` of a TCPRoute once its tunnel
/// is bound: listed with type [`TCP_ADDRESS_TYPE`] after the hosts.
pub fn gateway_status(
    gateway: &Gateway,
    desired: &GatewayStatus,
    own_address: Option<std::net::IpAddr>,
    serving: impl Fn(&str) -> bool,
    tcp_address: impl Fn(&ObjectRef) -> Option<String>,
    now: &Time,
) -> tuna_crds::gateway::gateways::GatewayStatus {
    use tuna_crds::gateway::gateways::{
        GatewayStatus as Status, GatewayStatusAddresses, GatewayStatusListeners,
        GatewayStatusListenersSupportedKinds,
    };
    let current = gateway.status.clone().unwrap_or_default();
    let previous_listener = |name: &str| {
        current
            .listeners
            .iter()
            .flatten()
            .find(|l| l.name == name)
            .map(|l| l.conditions.clone())
            .unwrap_or_default()
    };
    Status {
        // The Gateway's own address first: what the Gateway API's clients
        // (and its conformance suite) dial.
        addresses: Some(
            own_address
                .map(|ip| GatewayStatusAddresses {
                    r#type: Some("IPAddress".into()),
                    value: ip.to_string(),
                })
                .into_iter()
                .chain(desired.addresses.iter().filter(|h| serving(h)).map(|h| {
                    GatewayStatusAddresses {
                        r#type: Some("Hostname".into()),
                        value: h.clone(),
                    }
                }))
                .chain(desired.tcp_routes.iter().filter_map(|r| {
                    Some(GatewayStatusAddresses {
                        r#type: Some(TCP_ADDRESS_TYPE.into()),
                        value: tcp_address(r)?,
                    })
                }))
                .collect(),
        ),
        attached_listener_sets: None,
        conditions: Some(conditions(
            current.conditions.as_deref().unwrap_or_default(),
            &desired.conditions,
            desired.generation,
            now,
        )),
        listeners: Some(
            desired
                .listeners
                .iter()
                .map(|l| GatewayStatusListeners {
                    attached_routes: l.attached_routes,
                    conditions: conditions(
                        &previous_listener(&l.name),
                        &l.conditions,
                        desired.generation,
                        now,
                    ),
                    name: l.name.clone(),
                    supported_kinds: Some(
                        l.supported_kinds
                            .iter()
                            .map(|k| GatewayStatusListenersSupportedKinds {
                                group: Some(GROUP.into()),
                                kind: (*k).to_owned(),
                            })
                            .collect(),
                    ),
                })
                .collect(),
        ),
    }
}

/// A Gateway status with its lists in a stable order (for comparing).
fn normalized(
    mut s: tuna_crds::gateway::gateways::GatewayStatus,
) -> tuna_crds::gateway::gateways::GatewayStatus {
    s.conditions = s.conditions.map(sorted);
    if let Some(l) = &mut s.listeners {
        l.sort_by(|a, b| a.name.cmp(&b.name));
        for l in l.iter_mut() {
            l.conditions = sorted(std::mem::take(&mut l.conditions));
        }
    }
    s.addresses = Some(s.addresses.unwrap_or_default());
    s
}

/// Whether `spec.addresses` asks for an IP address (`IPAddress`, the
/// default type).
fn asks_for_an_address(gateway: &Gateway) -> bool {
    gateway
        .spec
        .addresses
        .iter()
        .flatten()
        .any(|a| a.r#type.as_deref().is_none_or(|t| t == "IPAddress"))
}

async fn write_gateway_status(
    state: &AgentState,
    gateway: &Gateway,
    desired: &GatewayStatus,
    public_host: &str,
    own_address: Option<Result<std::net::IpAddr, String>>,
) -> Result<(), Error> {
    let mut unassigned;
    let desired = match &own_address {
        Some(Err(why)) => {
            // The specification's reasons when no address could be given:
            // a static address asked for (spec.addresses) that cannot be
            // used, else none assigned.
            let (reason, message) = if asks_for_an_address(gateway) {
                (
                    "AddressNotUsable",
                    format!("the Gateway got no address: {why}"),
                )
            } else {
                (
                    "AddressNotAssigned",
                    format!("the edge gave the Gateway no address: {why}"),
                )
            };
            unassigned = desired.clone();
            for c in unassigned
                .conditions
                .iter_mut()
                .filter(|c| c.type_ == "Programmed")
            {
                *c = Cond::no("Programmed", reason, message.clone());
            }
            &unassigned
        }
        _ => desired,
    };
    let next = gateway_status(
        gateway,
        desired,
        own_address.and_then(Result::ok),
        |h| serving(state, h),
        |r| tcp_address(state, public_host, r),
        &now(),
    );
    let current = gateway.status.clone().unwrap_or_default();
    if normalized(next.clone()) == normalized(current) {
        return Ok(());
    }
    let api: Api<Gateway> = Api::namespaced(state.ctx.client.clone(), &desired.object.namespace);
    apply_status(
        &api,
        &desired.object.name,
        serde_json::to_value(&next).map_err(Error::Json)?,
    )
    .await
}

/// The route's `status.parents`: other controllers' entries as they are,
/// then ours as `desired` has them (none when it names none of our
/// Gateways); conditions keep their transition times (pure).
pub fn route_parents(
    route: &HttpRoute,
    desired: Option<&RouteStatus>,
    now: &Time,
) -> Vec<HttpRouteStatusParents> {
    parents_with(current_parents(route), desired, now)
}

/// The `status.parents` a route has now (a TCPRoute's, which has the same
/// shape, as the HTTPRoute type).
fn current_parents<K: Resource + serde::Serialize>(route: &K) -> Vec<HttpRouteStatusParents> {
    serde_json::to_value(route)
        .ok()
        .and_then(|v| v.get("status")?.get("parents").cloned())
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

/// [`route_parents`] from the entries the route has now.
fn parents_with(
    current: Vec<HttpRouteStatusParents>,
    desired: Option<&RouteStatus>,
    now: &Time,
) -> Vec<HttpRouteStatusParents> {
    let mut out: Vec<HttpRouteStatusParents> = current
        .iter()
        .filter(|p| p.controller_name != CONTROLLER_NAME)
        .cloned()
        .collect();
    for parent in desired.map(|d| d.parents.as_slice()).unwrap_or_default() {
        let parent_ref = serde_json::to_value(&parent.parent_ref)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let previous = current
            .iter()
            .find(|p| p.controller_name == CONTROLLER_NAME && p.parent_ref == parent_ref)
            .map(|p| p.conditions.clone())
            .unwrap_or_default();
        out.push(HttpRouteStatusParents {
            conditions: conditions(
                &previous,
                &parent.conditions,
                desired.and_then(|d| d.generation),
                now,
            ),
            controller_name: CONTROLLER_NAME.into(),
            parent_ref,
        });
    }
    out
}

/// Writes the `status.parents` of a route (HTTPRoute or TCPRoute).
async fn write_route_status<K>(
    state: &AgentState,
    route: &K,
    desired: Option<&RouteStatus>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let current = current_parents(route);
    let next = parents_with(current.clone(), desired, &now());
    let same = next.len() == current.len()
        && next.iter().zip(&current).all(|(a, b)| {
            a.controller_name == b.controller_name
                && a.parent_ref == b.parent_ref
                && sorted(a.conditions.clone()) == sorted(b.conditions.clone())
        });
    if same {
        return Ok(());
    }
    // `status.parents` is an atomic list: a merge patch replaces it whole,
    // guarded by the resourceVersion it was read at (a conflict means a newer
    // version is on its way through the watch, which syncs again).
    let api: Api<K> = Api::namespaced(
        state.ctx.client.clone(),
        route.namespace().as_deref().unwrap_or("default"),
    );
    let patch = json!({
        "metadata": { "resourceVersion": route.resource_version() },
        "status": HttpRouteStatus { parents: next },
    });
    match api
        .patch_status(
            &route.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
            tracing::debug!(kind = %K::kind(&()), route = %route.name_any(), code = e.code, "route changed while its status was written; the next sync writes it");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// `RuleSkipped` and `BackendSkipped` events of one route (HTTPRoute or
/// TCPRoute), each note once: its refusals in the plan and the conditions
/// of its parents that are not True.
fn report_refusals(
    state: &AgentState,
    me: &ObjectRef,
    plan: &Plan,
    status: Option<&RouteStatus>,
    events: &mut PendingEvents,
) {
    let mut notes: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
    for r in plan.refusals_of(me) {
        let mut note = String::new();
        if let (Some(rule), Some(m)) = (r.rule, r.path) {
            let _ = write!(note, "rule {rule} match {m}: ");
        }
        let _ = write!(note, "{}: {}", r.reason, r.message);
        notes.entry("RuleSkipped").or_default().insert(note);
    }
    for parent in status.map(|s| s.parents.as_slice()).unwrap_or_default() {
        for c in parent.conditions.iter().filter(|c| !c.status) {
            let (event, what) = match c.type_ {
                "ResolvedRefs" => ("BackendSkipped", "backendRef"),
                _ => ("RuleSkipped", "parentRef"),
            };
            notes.entry(event).or_default().insert(format!(
                "{what} (Gateway {}): {}: {}",
                parent.parent_ref.name, c.reason, c.message
            ));
        }
    }
    for event in ["RuleSkipped", "BackendSkipped"] {
        let now = notes.remove(event).unwrap_or_default();
        let known = state
            .reported
            .lock()
            .expect("reported")
            .get(me)
            .and_then(|r| r.get(event).cloned())
            .unwrap_or_default();
        for note in now.difference(&known) {
            events.push(EventType::Warning, event, "Route", note.clone());
        }
        state
            .reported
            .lock()
            .expect("reported")
            .entry(me.clone())
            .or_default()
            .insert(event.to_owned(), now);
    }
}

/// Events of one TCPRoute: its refusals, and its endpoint's tunnel
/// (`TunnelConnected` with the public `host:port`, `TunnelStopped`).
async fn report_tcp(
    state: &AgentState,
    route: &TcpRoute,
    me: &ObjectRef,
    plan: &Plan,
    status: Option<&RouteStatus>,
    public_host: &str,
) {
    let mut events = PendingEvents::default();
    report_refusals(state, me, plan, status, &mut events);
    let Some(watch) = state.publisher.state(&tcp_route_key(me)) else {
        if state.clear_and_was(me, "tunnel tcp") {
            events.push(
                EventType::Warning,
                "TunnelStopped",
                "Publish",
                "the TCP endpoint is no longer published by this TCPRoute".into(),
            );
        }
        state.ctx.write_events(route, events).await;
        return;
    };
    let tunnel = watch.borrow().clone();
    let note = match &tunnel {
        TunnelState::Serving {
            port: Some(port), ..
        } => Some((
            EventType::Normal,
            "TunnelConnected",
            format!("served at {public_host}:{port}"),
            format!("connected {port}"),
        )),
        TunnelState::Refused { code, message } => {
            let n = format!("the edge refused the tunnel ({code}): {message}");
            Some((EventType::Warning, "TunnelStopped", n.clone(), n))
        }
        TunnelState::Failed { message, .. } => Some((
            EventType::Warning,
            "TunnelStopped",
            message.clone(),
            message.clone(),
        )),
        _ => None,
    };
    if let Some((type_, reason, message, key)) = note
        && state.first_report_exclusive(me, "tunnel tcp", &key)
    {
        events.push(type_, reason, "Publish", message);
    }
    state.ctx.write_events(route, events).await;
}

/// Events of one HTTPRoute (each note once, as for Ingresses).
async fn report(
    state: &AgentState,
    route: &HttpRoute,
    me: &ObjectRef,
    plan: &Plan,
    status: Option<&RouteStatus>,
) {
    let mut events = PendingEvents::default();
    report_refusals(state, me, plan, status, &mut events);
    let hosts: BTreeSet<String> = plan.hosts_of(me).into_iter().collect();
    let before: Vec<String> = state
        .reported
        .lock()
        .expect("reported")
        .get(me)
        .map(|t| {
            t.keys()
                .filter_map(|k| k.strip_prefix("routes ").map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for host in before.iter().filter(|h| !hosts.contains(*h)) {
        state.clear_and_was(me, &format!("routes {host}"));
        if state.clear_and_was(me, &format!("tunnel {host}")) {
            events.push(
                EventType::Warning,
                "TunnelStopped",
                "Publish",
                format!("host {host} is no longer published by this HTTPRoute"),
            );
        }
    }
    for host in &hosts {
        let summary = routes_summary(&plan.hosts[host]);
        if state.first_report_exclusive(me, &format!("routes {host}"), &summary) {
            events.push(
                EventType::Normal,
                "RoutesUpdated",
                "Route",
                format!("host {host}: {summary}"),
            );
        }
        let Some(watch) = state.publisher.state(&TunnelKey::Host(host.clone())) else {
            continue;
        };
        let tunnel = watch.borrow().clone();
        let note = match &tunnel {
            TunnelState::Serving { .. } => Some((
                EventType::Normal,
                "TunnelConnected",
                format!("host {host} is served at https://{host}"),
                "connected".to_owned(),
            )),
            TunnelState::Refused { code, message } => {
                let n = format!("host {host}: the edge refused the tunnel ({code}): {message}");
                Some((EventType::Warning, "TunnelStopped", n.clone(), n))
            }
            TunnelState::Failed { message, .. } => {
                let n = format!("host {host}: {message}");
                Some((EventType::Warning, "TunnelStopped", n.clone(), n))
            }
            _ => None,
        };
        if let Some((type_, reason, message, key)) = note
            && state.first_report_exclusive(me, &format!("tunnel {host}"), &key)
        {
            events.push(type_, reason, "Publish", message);
        }
    }
    state.ctx.write_events(route, events).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a listener's certificateRef may find (GatewayInvalidTLSConfiguration's
    /// malformed Secret is base64 of "Hello world" in both keys).
    #[test]
    fn certificate_secrets_hold_a_pem_certificate_and_key_or_say_what_is_missing() {
        use k8s_openapi::ByteString;
        let cert = rcgen::generate_simple_self_signed(vec!["example.org".into()]).unwrap();
        let pem_crt = cert.cert.pem();
        let pem_key = cert.signing_key.serialize_pem();
        let other_key = rcgen::generate_simple_self_signed(vec!["example.org".into()])
            .unwrap()
            .signing_key
            .serialize_pem();
        let secret = |entries: &[(&str, &str)]| k8s_openapi::api::core::v1::Secret {
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        };
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: &[Case] = &[
            (
                "a certificate and its key",
                &[("tls.crt", &pem_crt), ("tls.key", &pem_key)],
                None,
            ),
            (
                "Hello world",
                &[("tls.crt", "Hello world\n"), ("tls.key", "Hello world\n")],
                Some("tls.crt holds no PEM certificate"),
            ),
            (
                "a key as the certificate",
                &[("tls.crt", &pem_key), ("tls.key", &pem_key)],
                Some("tls.crt holds no PEM certificate"),
            ),
            (
                "a certificate as the key",
                &[("tls.crt", &pem_crt), ("tls.key", &pem_crt)],
                Some("tls.key holds no PEM private key"),
            ),
            (
                "another certificate's key",
                &[("tls.crt", &pem_crt), ("tls.key", &other_key)],
                Some("tls.key is not the key of the certificate in tls.crt"),
            ),
            (
                "no tls.crt",
                &[("tls.key", &pem_key)],
                Some("it has no tls.crt"),
            ),
            (
                "no tls.key",
                &[("tls.crt", &pem_crt)],
                Some("it has no tls.key"),
            ),
        ];
        for (case, entries, problem) in cases {
            assert_eq!(
                certificate_problem(&secret(entries)).as_deref(),
                *problem,
                "{case}"
            );
        }
        // Nothing of the data in a problem.
        let p = certificate_problem(&secret(&[(
            "tls.crt",
            "-----BEGIN CERTIFICATE-----\nc2VjcmV0\n-----END CERTIFICATE-----\n",
        )]))
        .unwrap();
        assert!(!p.contains("c2VjcmV0"), "{p}");
    }

    fn route(yaml: &str) -> HttpRoute {
        serde_saphyr::from_str(yaml).expect("test HTTPRoute")
    }

    #[test]
    fn conditions_keep_their_transition_time_while_their_status_holds() {
        let t0 = Time("2025-01-01T00:00:00Z".parse().unwrap());
        let t1 = Time("2025-02-01T00:00:00Z".parse().unwrap());
        let first = conditions(
            &[],
            &[Cond {
                type_: "Accepted",
                status: true,
                reason: "Accepted".into(),
                message: "ok".into(),
            }],
            Some(1),
            &t0,
        );
        assert_eq!(first[0].last_transition_time, t0);
        assert_eq!(first[0].observed_generation, Some(1));
        let same = conditions(
            &first,
            &[Cond {
                type_: "Accepted",
                status: true,
                reason: "Accepted".into(),
                message: "still ok".into(),
            }],
            Some(2),
            &t1,
        );
        assert_eq!(same[0].last_transition_time, t0);
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = conditions(
            &same,
            &[Cond {
                type_: "Accepted",
                status: false,
                reason: "NotAllowedByListeners".into(),
                message: "no".into(),
            }],
            Some(3),
            &t1,
        );
        assert_eq!(flipped[0].last_transition_time, t1);
        assert_eq!(flipped[0].status, "False");
    }

    /// Other controllers' `status.parents` entries stay as they are; ours
    /// follow the plan, and go when the route names none of our Gateways.
    #[test]
    fn route_parents_keep_other_controllers_entries() {
        let r = route(
            "metadata: {name: a, namespace: d, generation: 4}
spec:
  parentRefs: [{name: theirs}, {name: ours}]
status:
  parents:
  - controllerName: example.com/gateway
    parentRef: {name: theirs}
    conditions: [{type: Accepted, status: 'True', reason: Accepted, message: '', lastTransitionTime: '2025-01-01T00:00:00Z'}]
  - controllerName: k8s.tuna.am/gateway-controller
    parentRef: {name: gone}
    conditions: [{type: Accepted, status: 'True', reason: Accepted, message: '', lastTransitionTime: '2025-01-01T00:00:00Z'}]",
        );
        let now = Time("2025-03-01T00:00:00Z".parse().unwrap());
        let desired = RouteStatus {
            object: ObjectRef::new(Kind::HttpRoute, "d", "a"),
            generation: Some(4),
            parents: vec![crate::plan::gateway_model::ParentStatus {
                parent_ref: r.spec.parent_refs.as_ref().unwrap()[1].clone(),
                conditions: vec![Cond {
                    type_: "Accepted",
                    status: true,
                    reason: "Accepted".into(),
                    message: "accepted by the Gateway".into(),
                }],
            }],
        };
        let parents = route_parents(&r, Some(&desired), &now);
        let names: Vec<(&str, &str)> = parents
            .iter()
            .map(|p| (p.controller_name.as_str(), p.parent_ref.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("example.com/gateway", "theirs"),
                ("k8s.tuna.am/gateway-controller", "ours")
            ]
        );
        assert_eq!(parents[1].conditions[0].observed_generation, Some(4));
        let none = route_parents(&r, None, &now);
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].controller_name, "example.com/gateway");
    }

    /// A TCPRoute's public `host:port` joins the Gateway's addresses (typed
    /// `k8s.tuna.am/TCPEndpoint`) once its tunnel is bound; hosts stay
    /// `Hostname`, each only while its tunnel serves.
    #[test]
    fn gateway_addresses_show_hosts_and_bound_tcp_endpoints() {
        let gateway: Gateway = serde_saphyr::from_str(
            "metadata: {name: web, namespace: d}\nspec: {gatewayClassName: tuna, listeners: []}",
        )
        .unwrap();
        let bound = ObjectRef::new(Kind::TcpRoute, "d", "pg");
        let unbound = ObjectRef::new(Kind::TcpRoute, "d", "redis");
        let desired = GatewayStatus {
            object: ObjectRef::new(Kind::Gateway, "d", "web"),
            generation: Some(1),
            conditions: Vec::new(),
            addresses: vec!["shop.example.com".into(), "down.example.com".into()],
            tcp_routes: vec![bound.clone(), unbound],
            listeners: Vec::new(),
        };
        let now = Time("2025-03-01T00:00:00Z".parse().unwrap());
        let addresses = |own: Option<std::net::IpAddr>| -> Vec<(String, String)> {
            gateway_status(
                &gateway,
                &desired,
                own,
                |h| h == "shop.example.com",
                |r| (*r == bound).then(|| "edge.example.com:30001".to_owned()),
                &now,
            )
            .addresses
            .unwrap()
            .into_iter()
            .map(|a| (a.r#type.unwrap_or_default(), a.value))
            .collect()
        };
        let shared = [
            ("Hostname".to_owned(), "shop.example.com".to_owned()),
            (
                "k8s.tuna.am/TCPEndpoint".to_owned(),
                "edge.example.com:30001".to_owned(),
            ),
        ];
        assert_eq!(addresses(None), shared);
        // Its own address comes first, typed IPAddress (what clients dial).
        let own = addresses(Some("127.0.100.7".parse().unwrap()));
        assert_eq!(own[0], ("IPAddress".to_owned(), "127.0.100.7".to_owned()));
        assert_eq!(own[1..], shared);
    }
}
