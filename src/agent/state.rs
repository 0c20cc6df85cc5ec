//! What the agent's reconcilers (Tunnel, Ingress) share: the publisher, the
//! reflector stores, the Services read with `get`, the edge clients of
//! `apiKeySecretRef` keys, and what each object published.
//!
//! The agent is the only component that reads Secrets and Services, and only
//! with `get` (no list, no watch): a Service is read again on every reconcile
//! of an object that references it, and every object is reconciled at least
//! every `--resync-interval`, so a Service change is picked up within that
//! interval (or at once when the referencing object changes). A headless
//! Service's EndpointSlices are listed by their service-name label.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::Api;
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;
use tuna_crds::{Domain, TcpEndpoint, Tunnel};
use tuna_protocol::api::{Scope, Secret as ApiKey};

use crate::edge::api::{EdgeApi, RemoteEdge};
use crate::edge::publisher::{Publisher, TunnelKey};
use crate::metrics::MeteredEdge;
use crate::plan::ObjectRef;
use crate::plan::ingress::TranslateOptions;
use crate::plan::service::{ServiceIndex, ServiceInfo, UpstreamPolicy};
use crate::reconcile::Context;
use crate::role::EdgeArgs;

/// Label keys of every tunnel token the agent mints: they let the start-up
/// sweep find tokens whose owner is gone.
pub mod labels {
    /// The cluster's identity (`--cluster-id`, default the kube-system namespace's uid).
    pub const CLUSTER: &str = "k8s.tuna.am/cluster";
    /// `Tunnel`, `Ingress` or `HTTPRoute`.
    pub const KIND: &str = "k8s.tuna.am/kind";
    /// The owner's namespace.
    pub const NAMESPACE: &str = "k8s.tuna.am/namespace";
    /// The owner's name (a Tunnel; for Ingress hosts the host's first Ingress).
    pub const NAME: &str = "k8s.tuna.am/name";
    /// The owner's uid (Tunnels).
    pub const UID: &str = "k8s.tuna.am/uid";
    /// The public host (Ingress hosts), as a label value.
    pub const HOST: &str = "k8s.tuna.am/host";
    /// The agent process that minted it.
    pub const AGENT: &str = "k8s.tuna.am/agent";
    /// `true` when the agent reserved the Tunnel's subdomain for it (released with it).
    pub const RESERVED: &str = "k8s.tuna.am/reserved-host";
}

/// A label value for any string: kept when it is a valid value of at most 63
/// characters, else shortened with a hash suffix (stable).
pub fn label_value(s: &str) -> String {
    let valid = |v: &str| {
        v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
            && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
    };
    if valid(s) {
        return s.to_owned();
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    let clean: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .take(46)
        .collect();
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{clean}-{:016x}", h.finish())
}

/// Settings of the agent role.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The cluster's identity on tokens.
    pub cluster_id: String,
    /// This agent process (on tokens).
    pub instance: String,
    /// The IngressClass name of `--ingress-class`.
    pub ingress_class: String,
    /// What upstreams may point at (`--allow-external-upstreams`).
    pub policy: UpstreamPolicy,
    /// How to build clients for `apiKeySecretRef` keys.
    pub edge_args: EdgeArgs,
    /// Where the claim book is kept: namespace and ConfigMap name
    /// (see [`super::claims`]).
    pub claims_configmap: (String, String),
}

/// The reflector stores the agent reads.
#[derive(Clone)]
pub struct Stores {
    /// Tunnels.
    pub tunnels: Store<Tunnel>,
    /// The Tunnels by subdomain, port or alias (fed by the same watch).
    pub tunnel_index: Arc<super::index::TunnelIndex>,
    /// Ingresses.
    pub ingresses: Store<Ingress>,
    /// IngressClasses.
    pub classes: Store<IngressClass>,
    /// Domains.
    pub domains: Store<Domain>,
    /// TCPEndpoints.
    pub tcp_endpoints: Store<TcpEndpoint>,
}

/// Services read with `get`, by namespace and name (`None`: not found).
pub struct ServiceCache {
    client: kube::Client,
    services: Mutex<HashMap<(String, String), Option<ServiceInfo>>>,
}

impl ServiceCache {
    /// An empty cache.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            services: Mutex::new(HashMap::new()),
        }
    }

    /// Reads `namespace/name` again (`get`). A read that fails (the API
    /// server refuses or is unreachable) is logged and leaves what was known:
    /// the last Service read, or none, so that this backend alone is
    /// unresolved (`BackendNotFound`) — one object's bad reference never fails
    /// the caller's sync of every other object. A name that cannot be a
    /// Service is not found without an API call ([`crate::cluster::read_service`]).
    pub async fn refresh(&self, namespace: &str, name: &str) {
        match crate::cluster::read_service(&self.client, namespace, name).await {
            Ok(info) => {
                self.services
                    .lock()
                    .expect("service cache")
                    .insert((namespace.to_owned(), name.to_owned()), info);
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    service = %format_args!("{namespace}/{name}"),
                    "reading a Service failed: its backends stay as last read (unknown if never read); read again on the next sync"
                );
            }
        }
    }

    /// Reads `namespace/name` unless it was read before (see [`Self::refresh`]
    /// for failures: a Service never read successfully is read again).
    pub async fn ensure(&self, namespace: &str, name: &str) {
        let known = self
            .services
            .lock()
            .expect("service cache")
            .contains_key(&(namespace.to_owned(), name.to_owned()));
        if !known {
            self.refresh(namespace, name).await;
        }
    }

    /// Whether `namespace/name` was read and does not resolve yet: not
    /// found, or headless without a ready endpoint (its EndpointSlices may
    /// be filled a moment later).
    pub fn is_unresolved(&self, namespace: &str, name: &str) -> bool {
        match self
            .services
            .lock()
            .expect("service cache")
            .get(&(namespace.to_owned(), name.to_owned()))
        {
            Some(None) => true,
            Some(Some(info)) => info
                .headless
                .as_ref()
                .is_some_and(|h| h.addresses.is_empty()),
            None => false,
        }
    }

    /// The known Services, as an index for the plan.
    pub fn snapshot(&self) -> ServiceIndex {
        ServiceIndex::new(
            self.services
                .lock()
                .expect("service cache")
                .values()
                .flatten()
                .cloned(),
        )
    }
}

/// An edge client with a Tunnel's own API key.
#[derive(Clone)]
pub struct KeyClient {
    /// The client (metered).
    pub edge: Arc<dyn EdgeApi>,
    /// `secret ns/name#key@resourceVersion`: changes when the Secret does.
    pub identity: String,
}

/// Why a Tunnel's `apiKeySecretRef` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What to do.
    pub message: String,
}

/// What an object published, to undo on change or deletion.
#[derive(Debug, Clone, Default)]
pub struct Claim {
    /// Tunnels: the key of its tunnel (set through [`Claims`], which indexes it).
    tunnel: Option<TunnelKey>,
    /// Tunnels: the host the agent reserved for it (not adopted), released with it.
    pub reserved_host: Option<String>,
    /// Ingresses: the hosts it had rules for (set through [`Claims`]).
    hosts: BTreeSet<String>,
}

impl Claim {
    /// Tunnels: the key of its tunnel.
    pub fn tunnel(&self) -> Option<&TunnelKey> {
        self.tunnel.as_ref()
    }

    /// Ingresses: the hosts it had rules for.
    pub fn hosts(&self) -> &BTreeSet<String> {
        &self.hosts
    }
}

/// The claims by object, with the two reverse lookups a tunnel's state change
/// needs (who publishes this tunnel key, which Ingresses name this host)
/// kept as indexes: a walk of every claim per change made 10 000 Tunnels
/// quadratic.
#[derive(Debug, Default)]
pub struct Claims {
    by_object: HashMap<ObjectRef, Claim>,
    tunnel_owners: HashMap<TunnelKey, BTreeSet<ObjectRef>>,
    host_claimants: HashMap<String, BTreeSet<ObjectRef>>,
}

impl Claims {
    /// The claim of `object`.
    pub fn get(&self, object: &ObjectRef) -> Option<&Claim> {
        self.by_object.get(object)
    }

    /// Forgets `object`'s claim.
    pub fn remove(&mut self, object: &ObjectRef) -> Option<Claim> {
        let claim = self.by_object.remove(object)?;
        if let Some(key) = &claim.tunnel {
            unindex(&mut self.tunnel_owners, key, object);
        }
        for host in &claim.hosts {
            unindex(&mut self.host_claimants, host, object);
        }
        Some(claim)
    }

    /// Records that `object` publishes the tunnel `key` (`None`: no tunnel);
    /// the claim, for its other fields.
    pub fn set_tunnel(&mut self, object: &ObjectRef, key: Option<TunnelKey>) -> &mut Claim {
        let claim = self.by_object.entry(object.clone()).or_default();
        if claim.tunnel != key {
            if let Some(old) = &claim.tunnel {
                unindex(&mut self.tunnel_owners, old, object);
            }
            if let Some(new) = &key {
                self.tunnel_owners
                    .entry(new.clone())
                    .or_default()
                    .insert(object.clone());
            }
            claim.tunnel = key;
        }
        claim
    }

    /// Records the hosts `object` (an Ingress) has rules for.
    pub fn set_hosts(&mut self, object: &ObjectRef, hosts: BTreeSet<String>) {
        let claim = self.by_object.entry(object.clone()).or_default();
        for gone in claim.hosts.difference(&hosts) {
            unindex(&mut self.host_claimants, gone, object);
        }
        for new in hosts.difference(&claim.hosts) {
            self.host_claimants
                .entry(new.clone())
                .or_default()
                .insert(object.clone());
        }
        claim.hosts = hosts;
    }

    /// The objects publishing the tunnel `key`.
    pub fn owners_of(&self, key: &TunnelKey) -> BTreeSet<ObjectRef> {
        self.tunnel_owners.get(key).cloned().unwrap_or_default()
    }

    /// The objects whose claim names `host`.
    pub fn claimants_of(&self, host: &str) -> BTreeSet<ObjectRef> {
        self.host_claimants.get(host).cloned().unwrap_or_default()
    }
}

fn unindex<K: std::hash::Hash + Eq>(
    index: &mut HashMap<K, BTreeSet<ObjectRef>>,
    key: &K,
    object: &ObjectRef,
) {
    if let Some(set) = index.get_mut(key) {
        set.remove(object);
        if set.is_empty() {
            index.remove(key);
        }
    }
}

/// The agent's shared state (see the module docs).
pub struct AgentState {
    /// Client, events, the operator's edge API, metrics, backoff, resync.
    pub ctx: Arc<Context>,
    /// The proxy core and the tunnels.
    pub publisher: Publisher,
    /// Services read with `get`.
    pub services: ServiceCache,
    /// The stores.
    pub stores: Stores,
    /// Settings.
    pub options: AgentOptions,
    /// Claims by object.
    pub claims: Mutex<Claims>,
    /// Who holds which host and TCP endpoint (see [`super::claims`]).
    pub claim_store: super::claims::ClaimStore,
    /// The host plans last published, by host (for `RoutesUpdated` and to
    /// re-reconcile the other Ingresses of a host only when it changed).
    pub host_plans: Mutex<HashMap<String, String>>,
    /// Last reported events per object: reason → messages (to emit only changes).
    pub reported: Mutex<HashMap<ObjectRef, BTreeMap<String, BTreeSet<String>>>>,
    /// Clients of `apiKeySecretRef` keys, by identity.
    key_clients: Mutex<HashMap<String, KeyClient>>,
    /// The account's domains (hosts reserved outside Kubernetes), refreshed
    /// at most every resync interval.
    account_hosts: Mutex<Option<(Instant, BTreeSet<String>)>>,
    /// Subdomains an earlier agent process reserved for Tunnels (uid → host),
    /// learnt at start-up from its tokens' labels: the edge then calls them
    /// adopted, but they are still the operator's to release.
    pub inherited_reservations: Mutex<HashMap<String, String>>,
    /// Re-reconcile a Tunnel / an Ingress.
    pub tunnel_triggers: mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<Tunnel>>,
    /// Re-reconcile an Ingress.
    pub ingress_triggers: mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<Ingress>>,
    /// The Gateway API stores, once the CRDs are found (see [`super::gateway`]).
    pub gateway: std::sync::OnceLock<super::gateway_objects::GatewayStores>,
    /// Re-plan the Gateway API objects and their hosts.
    pub gateway_triggers: mpsc::UnboundedSender<()>,
    /// The hosts HTTPRoutes published at the last Gateway API sync, and
    /// those they may publish (to re-plan them when another kind changes).
    pub gateway_hosts: Mutex<BTreeSet<String>>,
    /// The edge's Gateway addresses this agent holds: reservation name →
    /// address (see [`super::gateway`], `publish_addresses`).
    pub gateway_addresses: Mutex<BTreeMap<String, std::net::IpAddr>>,
    /// Set once the addresses a previous process left were looked for.
    pub gateway_addresses_swept: std::sync::atomic::AtomicBool,
    /// True once the Gateway API is known: its CRDs found absent, or its
    /// stores listed once (a plan before that would miss HTTPRoutes' claims).
    pub gateway_known: tokio::sync::watch::Sender<bool>,
}

impl AgentState {
    /// New state.
    pub fn new(
        ctx: Arc<Context>,
        publisher: Publisher,
        stores: Stores,
        options: AgentOptions,
        tunnel_triggers: mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<Tunnel>>,
        ingress_triggers: mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<Ingress>>,
        gateway_triggers: mpsc::UnboundedSender<()>,
    ) -> Self {
        let (namespace, name) = &options.claims_configmap;
        let claim_store = super::claims::ClaimStore::new(ctx.client.clone(), namespace, name);
        Self {
            claim_store,
            services: ServiceCache::new(ctx.client.clone()),
            ctx,
            publisher,
            stores,
            options,
            claims: Mutex::new(Claims::default()),
            host_plans: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashMap::new()),
            key_clients: Mutex::new(HashMap::new()),
            account_hosts: Mutex::new(None),
            inherited_reservations: Mutex::new(HashMap::new()),
            tunnel_triggers,
            ingress_triggers,
            gateway: std::sync::OnceLock::new(),
            gateway_triggers,
            gateway_hosts: Mutex::new(BTreeSet::new()),
            gateway_addresses: Mutex::new(BTreeMap::new()),
            gateway_addresses_swept: std::sync::atomic::AtomicBool::new(false),
            gateway_known: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The claim book, loaded at its first use, once every store the plans
    /// read is filled (the Gateway API's too, or known to be absent) (then carried over from the annotations of earlier
    /// agents when its ConfigMap holds none yet). Call it before reading the
    /// stores for a plan.
    pub async fn claim_book(&self) -> Result<crate::plan::claims::ClaimBook, kube::Error> {
        let loaded = self.claim_store.snapshot_if_loaded();
        if let Some(book) = loaded {
            return Ok(book);
        }
        // Every store a plan reads must be filled before the first plan: a
        // plan that misses a claimant would record the wrong holder. Not
        // `wait_until_ready`: it wakes one waiter only, and the controllers
        // wait on these stores too (see `store_ready`).
        let s = &self.stores;
        let mut gateway = self.gateway_known.subscribe();
        let _ = gateway.wait_for(|known| *known).await;
        futures::join!(
            crate::reconcile::store_ready(&s.ingresses),
            crate::reconcile::store_ready(&s.tunnels),
            crate::reconcile::store_ready(&s.domains),
            crate::reconcile::store_ready(&s.tcp_endpoints),
        );
        let base = self
            .ctx
            .edge_info_now()
            .map(|w| w.base_domain.clone())
            .unwrap_or_default();
        self.claim_store
            .load(|| {
                super::claims::legacy_book(
                    &self.stores.ingresses.state(),
                    &self.stores.tunnels.state(),
                    &base,
                )
            })
            .await
    }

    /// Asks for a Gateway API sync when `host` is one HTTPRoutes publish or
    /// may publish.
    pub fn trigger_gateway_on(&self, host: &str) {
        if self.gateway.get().is_some()
            && self
                .gateway_hosts
                .lock()
                .expect("gateway hosts")
                .contains(host)
        {
            let _ = self.gateway_triggers.send(());
        }
    }

    /// The Ingress options the IngressClasses of the cluster give.
    pub fn ingress_options(&self) -> TranslateOptions {
        let classes = self.stores.classes.state();
        crate::cluster::ingress_options(
            classes.iter().map(|c| c.as_ref()),
            &self.options.ingress_class,
        )
    }

    /// The account's domains, listed at the edge at most every resync interval.
    pub async fn account_hosts(&self) -> BTreeSet<String> {
        let fresh = self
            .account_hosts
            .lock()
            .expect("account hosts")
            .as_ref()
            .filter(|(at, _)| at.elapsed() < self.ctx.resync_interval)
            .map(|(_, hosts)| hosts.clone());
        if let Some(hosts) = fresh {
            return hosts;
        }
        match self.ctx.edge.list_domains().await {
            Ok(domains) => {
                let hosts: BTreeSet<String> = domains
                    .into_iter()
                    .filter(|d| d.status == tuna_protocol::api::DomainStatus::Verified)
                    .map(|d| d.name)
                    .collect();
                *self.account_hosts.lock().expect("account hosts") =
                    Some((Instant::now(), hosts.clone()));
                hosts
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not list the account's domains");
                self.account_hosts
                    .lock()
                    .expect("account hosts")
                    .as_ref()
                    .map(|(_, h)| h.clone())
                    .unwrap_or_default()
            }
        }
    }

    /// Token labels of an owner.
    pub fn token_labels(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                labels::CLUSTER.to_owned(),
                label_value(&self.options.cluster_id),
            ),
            (
                labels::AGENT.to_owned(),
                label_value(&self.options.instance),
            ),
            (labels::KIND.to_owned(), kind.to_owned()),
            (labels::NAMESPACE.to_owned(), label_value(namespace)),
            (labels::NAME.to_owned(), label_value(name)),
        ])
    }

    /// The edge client of a Tunnel's `apiKeySecretRef`: the Secret is read
    /// with `get` every time (a fixed Secret is picked up at the next
    /// reconcile); the key must be able to open tunnels (`tunnels:connect`).
    pub async fn key_client(
        &self,
        namespace: &str,
        secret: &str,
        key: &str,
    ) -> Result<KeyClient, KeyProblem> {
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
        let object = api.get_opt(secret).await.map_err(|e| KeyProblem {
            reason: "SecretUnreadable",
            message: format!("cannot read Secret {namespace}/{secret}: {e}"),
        })?;
        let Some(object) = object else {
            return Err(KeyProblem {
                reason: "SecretNotFound",
                message: format!(
                    "Secret {namespace}/{secret} (spec.apiKeySecretRef) does not exist; create it with the key {key:?}"
                ),
            });
        };
        let value = object
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
            .or_else(|| {
                object
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|v| v.trim().to_owned())
            })
            .filter(|v| !v.is_empty());
        let Some(value) = value else {
            let keys: Vec<String> = object
                .data
                .as_ref()
                .map(|d| d.keys().cloned().collect())
                .unwrap_or_default();
            return Err(KeyProblem {
                reason: "SecretKeyNotFound",
                message: format!(
                    "Secret {namespace}/{secret} has no key {key:?} (it has: {}); put the API key there",
                    if keys.is_empty() {
                        "none".to_owned()
                    } else {
                        keys.join(", ")
                    }
                ),
            });
        };
        let identity = format!(
            "secret {namespace}/{secret}#{key}@{}",
            object.metadata.resource_version.as_deref().unwrap_or("")
        );
        if let Some(known) = self.key_clients.lock().expect("key clients").get(&identity) {
            return Ok(known.clone());
        }
        let client = self
            .options
            .edge_args
            .client_with(ApiKey::new(value))
            .map_err(|e| KeyProblem {
                reason: "EdgeClientFailed",
                message: e.to_string(),
            })?;
        let edge: Arc<dyn EdgeApi> = Arc::new(MeteredEdge::new(
            Arc::new(RemoteEdge::new(client)),
            Arc::clone(&self.ctx.metrics),
        ));
        let who = edge.whoami().await.map_err(|e: crate::Error| KeyProblem {
            reason: if e.code() == Some("unauthorized") {
                "ApiKeyRejected"
            } else {
                "EdgeUnavailable"
            },
            message: format!(
                "the API key of Secret {namespace}/{secret} ({key}): {}",
                e.edge_message()
            ),
        })?;
        if !who
            .scopes
            .iter()
            .any(|s| matches!(s, Scope::TunnelsConnect | Scope::Full))
        {
            let scopes: Vec<&str> = who.scopes.iter().map(|s| s.as_str()).collect();
            return Err(KeyProblem {
                reason: "MissingConnectScope",
                message: format!(
                    "the API key of Secret {namespace}/{secret} has scopes [{}]; a Tunnel's key needs tunnels:connect",
                    scopes.join(", ")
                ),
            });
        }
        let client = KeyClient {
            edge,
            identity: identity.clone(),
        };
        let mut clients = self.key_clients.lock().expect("key clients");
        // Older versions of this Secret's key are not needed any more.
        let prefix = format!("secret {namespace}/{secret}#{key}@");
        clients.retain(|k, _| !k.starts_with(&prefix));
        clients.insert(identity, client.clone());
        Ok(client)
    }

    /// Learns, from the tokens of this cluster that an earlier agent minted,
    /// which subdomains it reserved for which Tunnel (label
    /// `k8s.tuna.am/reserved-host`).
    pub fn inherit_reservations(&self, tokens: &[tuna_protocol::api::Token]) {
        let mut inherited = self.inherited_reservations.lock().expect("inherited");
        for t in tokens {
            let l = &t.info.labels;
            if l.get(labels::KIND).map(String::as_str) == Some("Tunnel")
                && l.get(labels::RESERVED).is_some_and(|v| v == "true")
                && let (Some(uid), Some(host)) = (l.get(labels::UID), t.info.bindings.hosts.first())
            {
                inherited.insert(uid.clone(), host.clone());
            }
        }
    }

    /// Whether an earlier agent reserved `host` for the Tunnel `uid`.
    pub fn inherited_reservation(&self, uid: &str, host: &str) -> bool {
        self.inherited_reservations
            .lock()
            .expect("inherited")
            .get(uid)
            .is_some_and(|h| h == host)
    }

    /// Records `message` as what `object` last reported about `topic`; true
    /// when it differs from what was reported before (then report it).
    pub fn first_report_exclusive(&self, object: &ObjectRef, topic: &str, message: &str) -> bool {
        let mut reported = self.reported.lock().expect("reported");
        let topics = reported.entry(object.clone()).or_default();
        let next = BTreeSet::from([message.to_owned()]);
        if topics.get(topic) == Some(&next) {
            return false;
        }
        topics.insert(topic.to_owned(), next);
        true
    }

    /// Forgets what `object` reported about `topic`; true when there was something.
    pub fn clear_and_was(&self, object: &ObjectRef, topic: &str) -> bool {
        self.reported
            .lock()
            .expect("reported")
            .get_mut(object)
            .is_some_and(|topics| topics.remove(topic).is_some())
    }
}

/// How long a reconcile waits for a new tunnel to be accepted or refused
/// before it writes the status it has (later changes trigger a reconcile).
pub const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Tunnels whose tunnel key is `key` (to re-reconcile on a state change).
pub fn owners_of(state: &AgentState, key: &TunnelKey) -> BTreeSet<ObjectRef> {
    let owners = state.claims.lock().expect("claims").owners_of(key);
    owners
        .into_iter()
        .filter(|o| o.kind == crate::plan::Kind::Tunnel)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Kind;

    fn hosts(h: &[&str]) -> BTreeSet<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_reverse_lookups_follow_every_change_of_a_claim() {
        let mut claims = Claims::default();
        let (a, b) = (
            ObjectRef::new(Kind::Tunnel, "x", "a"),
            ObjectRef::new(Kind::Tunnel, "x", "b"),
        );
        let web = TunnelKey::Host("web.example".into());
        let api = TunnelKey::Host("api.example".into());
        claims.set_tunnel(&a, Some(web.clone()));
        claims.set_tunnel(&b, Some(web.clone()));
        assert_eq!(claims.owners_of(&web), [a.clone(), b.clone()].into());
        // A move, a withdrawal, a removal.
        claims.set_tunnel(&a, Some(api.clone()));
        assert_eq!(claims.owners_of(&web), [b.clone()].into());
        assert_eq!(claims.owners_of(&api), [a.clone()].into());
        claims.set_tunnel(&b, None);
        assert!(claims.owners_of(&web).is_empty());
        assert!(claims.get(&b).is_some_and(|c| c.tunnel().is_none()));
        claims.remove(&a);
        assert!(claims.owners_of(&api).is_empty());

        let i = ObjectRef::new(Kind::Ingress, "x", "site");
        claims.set_hosts(&i, hosts(&["a.example", "b.example"]));
        assert_eq!(claims.claimants_of("a.example"), [i.clone()].into());
        claims.set_hosts(&i, hosts(&["b.example", "c.example"]));
        assert!(claims.claimants_of("a.example").is_empty());
        assert_eq!(claims.claimants_of("c.example"), [i.clone()].into());
        assert_eq!(
            claims.remove(&i).map(|c| c.hosts().clone()),
            Some(hosts(&["b.example", "c.example"]))
        );
        assert!(claims.claimants_of("b.example").is_empty());
    }
}
