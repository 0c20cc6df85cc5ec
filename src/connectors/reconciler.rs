//! Connector (`connectors.alauda.io/v1alpha1`): checks what a connector
//! needs, probes its address, fronts the proxy with a Service, and hands the
//! proxy its target.
//!
//! - observe: the Connector, its ConnectorClass (a reflector store), its
//!   Secret and CA Secret (`get`), its address (DNS, then two HTTPS probes
//!   with the real token: the class's liveness path and auth probe path);
//! - desired ([`observe_*`](check_class) checks and [`status_for`], pure):
//!   the conditions below, `status.proxy.httpAddress`, the Service `c-<name>`
//!   ([`proxy_service`]) and the proxy target;
//! - apply: the Service by server-side apply (owned by the Connector, so it
//!   goes with it), the target into [`ProxyTargets`], the status by
//!   server-side apply, an event for every condition that changes.
//!
//! | condition | True when |
//! |---|---|
//! | `ConnectorClassReady` | `spec.connectorClassName` names an existing class this operator serves (`k8s`) |
//! | `SecretReady` | `spec.auth.name` is an auth type of the class, and the Secret of `spec.auth.secretRef` exists in the namespace with the type's `secretType` and a non-empty `token` |
//! | `CACertReady` (Info) | no `caCertSecretRef` (system roots), or its Secret has PEM certificates in `ca.crt` |
//! | `LivenessReady` | `spec.address` is an `https://` URL whose host resolves, the CA is usable, and `GET <address><liveness path>` answers over TLS verified with it, any status below 500 |
//! | `AuthReady` | `GET <address><auth probe path>` (`/api/v1/pods?limit=1`: the token must be able to list pods) with the Secret's token answers 2xx; 401/403 give `Unauthorized`/`Forbidden` with the server's message |
//! | `ProxyServiceReady` | the Service `c-<name>` is applied |
//! | `Ready` | all of the above but `CACertReady` (which LivenessReady depends on) |
//!
//! A condition whose prerequisite failed is `Unknown` (`NotChecked`). The
//! Connector is re-probed, and its Secrets read again by `get`, at once when
//! it, its class or its Service change, and then every `--resync-interval`
//! while it is Ready. Secrets are not watched (the role may not), so a
//! Connector that is not Ready is checked again sooner, with a backoff of
//! its own ([`RECHECK_FIRST`], doubling up to the resync interval): a user
//! who fixes a wrong Secret sees it Ready within seconds, not at the resync.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use rustls::pki_types::CertificateDer;
use tuna_crds::{
    Addressable, BEARER_TOKEN_KEY, CA_CERT_KEY, ConditionStatus, Connector, ConnectorClass,
    ConnectorCondition, ConnectorConditions, ConnectorProxyStatus, ConnectorStatus, K8S_CLASS,
};
use tuna_proxy::{Authority, Credential, UpstreamTarget};

use crate::Error;
use crate::connectors::probe::{self, ProbeResult};
use crate::connectors::targets::{ProxyTarget, ProxyTargets};
use crate::metrics::Metrics;
use crate::reconcile::kit::{self, Deletion, KitContext, Reconciler};
use crate::reconcile::{Backoff, Events, apply_status, key_of, publish_event, resync};

/// Field manager of the Services and the built-in class the connectors role applies.
pub const FIELD_MANAGER: &str = "tuna-operator-connectors";
/// `reportingController` of the connectors role's events.
pub const REPORTER: &str = "tuna-operator-connectors";
/// Label on every Service the role manages (its watch selects them).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", FIELD_MANAGER);
/// Label naming the Connector of a Service.
pub const CONNECTOR_LABEL: &str = "connectors.alauda.io/connector";
/// A Connector that is not Ready is checked again after this (jittered),
/// then after twice as long each time, up to the resync interval.
pub const RECHECK_FIRST: Duration = Duration::from_secs(1);

/// Condition types.
pub mod types {
    /// The ConnectorClass exists and accepts the Connector.
    pub const CLASS: &str = "ConnectorClassReady";
    /// The auth Secret holds what the class asks for.
    pub const SECRET: &str = "SecretReady";
    /// The CA certificates (of the Secret, or the system's) load.
    pub const CA_CERT: &str = "CACertReady";
    /// The address answers over verified TLS.
    pub const LIVENESS: &str = "LivenessReady";
    /// The address accepts the Secret's credentials.
    pub const AUTH: &str = "AuthReady";
    /// The `c-<name>` Service in front of the proxy exists.
    pub const PROXY_SERVICE: &str = "ProxyServiceReady";
    /// All of the above.
    pub const READY: &str = "Ready";
}

/// Settings of the Connector reconciler.
#[derive(Debug, Clone)]
pub struct ConnectorOptions {
    /// Every Ready Connector is probed again this often (one that is not
    /// Ready sooner, see [`RECHECK_FIRST`]).
    pub probe_interval: Duration,
    /// A probe gives up after this long.
    pub probe_timeout: Duration,
    /// The cluster's DNS domain (`cluster.local`).
    pub cluster_domain: String,
    /// Where the `c-<name>` Services point (`externalName`): the DNS name of
    /// the Service in front of the connectors role's proxy listener (port 80).
    pub proxy_service_host: String,
    /// Audience of the proxy passwords (ServiceAccount tokens).
    pub token_audience: String,
}

/// What the Connector reconciler shares.
pub struct ConnectorContext {
    /// The operator cluster's client.
    pub client: Client,
    /// Publishes events as [`REPORTER`].
    pub recorder: Events,
    /// Metrics of this process.
    pub metrics: Arc<Metrics>,
    /// Per-object backoff of failed reconciles (errors of the API server).
    pub backoff: Backoff,
    /// Per-object backoff of the checks of a Connector that is not Ready
    /// (its reconcile succeeded: the kit resets `backoff` then).
    pub recheck: Backoff,
    /// Settings.
    pub options: ConnectorOptions,
    /// PEM of the proxy's CA (published in each Connector's status).
    pub proxy_ca_pem: String,
    /// What the proxy may reach.
    pub targets: Arc<ProxyTargets>,
}

impl ConnectorContext {
    /// A context; `instance` names this process in events.
    pub fn new(
        client: Client,
        instance: Option<String>,
        metrics: Arc<Metrics>,
        options: ConnectorOptions,
        proxy_ca_pem: String,
        targets: Arc<ProxyTargets>,
    ) -> Self {
        let recorder = Events::new(
            client.clone(),
            Reporter {
                controller: REPORTER.to_owned(),
                instance,
            },
        );
        Self {
            client,
            recorder,
            metrics,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(300)),
            recheck: Backoff::new(RECHECK_FIRST, options.probe_interval.max(RECHECK_FIRST)),
            options,
            proxy_ca_pem,
            targets,
        }
    }
}

/// One condition's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// True, False, or Unknown (not checked).
    pub status: ConditionStatus,
    /// The condition's CamelCase reason.
    pub reason: String,
    /// What a person reads.
    pub message: String,
}

impl Outcome {
    fn new(status: ConditionStatus, reason: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
    /// A passed check.
    pub fn ok(reason: &str, message: impl Into<String>) -> Self {
        Self::new(ConditionStatus::True, reason, message)
    }
    /// A failed check.
    pub fn failed(reason: &str, message: impl Into<String>) -> Self {
        Self::new(ConditionStatus::False, reason, message)
    }
    /// A check that waits for `waiting_for` to pass.
    pub fn not_checked(waiting_for: &str) -> Self {
        Self::new(
            ConditionStatus::Unknown,
            "NotChecked",
            format!("not checked until {waiting_for} is True"),
        )
    }
    fn is_ok(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// Every verdict of one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// [`types::CLASS`].
    pub class: Outcome,
    /// [`types::SECRET`].
    pub secret: Outcome,
    /// [`types::CA_CERT`].
    pub ca: Outcome,
    /// [`types::LIVENESS`].
    pub liveness: Outcome,
    /// [`types::AUTH`].
    pub auth: Outcome,
    /// [`types::PROXY_SERVICE`].
    pub service: Outcome,
}

/// `ConnectorClassReady`: the class exists and is served here.
pub fn check_class(connector: &Connector, class: Option<&ConnectorClass>) -> Outcome {
    let name = &connector.spec.connector_class_name;
    if name.is_empty() {
        return Outcome::failed(
            "ConnectorClassNotSet",
            "set spec.connectorClassName (k8s for a Kubernetes API server)",
        );
    }
    if class.is_none() {
        return Outcome::failed(
            "ConnectorClassNotFound",
            format!("ConnectorClass {name} does not exist (the built-in class is k8s)"),
        );
    }
    if name != K8S_CLASS {
        return Outcome::failed(
            "ConnectorClassNotSupported",
            format!("tuna-operator serves connectors of the built-in class k8s only, not {name}"),
        );
    }
    Outcome::ok(
        "ConnectorClassReady",
        format!("ConnectorClass {name} is served"),
    )
}

/// The name of the auth Secret, or why there is none to read.
pub fn auth_secret_name<'a>(
    connector: &'a Connector,
    class: &ConnectorClass,
) -> Result<&'a str, Outcome> {
    let Some(auth) = connector.spec.auth.as_ref().filter(|a| !a.name.is_empty()) else {
        return Err(Outcome::failed(
            "AuthNotSet",
            "set spec.auth.name (bearerTokenAuth) and spec.auth.secretRef.name",
        ));
    };
    if class.spec.auth_type(&auth.name).is_none() {
        let known: Vec<&str> = class
            .spec
            .auth
            .iter()
            .flat_map(|a| a.types.iter().map(|t| t.name.as_str()))
            .collect();
        return Err(Outcome::failed(
            "AuthTypeUnknown",
            format!(
                "auth type {} is not one of the class's: {}",
                auth.name,
                known.join(", ")
            ),
        ));
    }
    let Some(secret_ref) = auth.secret_ref.as_ref() else {
        return Err(Outcome::failed(
            "SecretRefNotSet",
            "set spec.auth.secretRef.name to the Secret holding the token",
        ));
    };
    let Some(name) = secret_ref.name.as_deref().filter(|n| !n.is_empty()) else {
        return Err(Outcome::failed(
            "SecretRefNotSet",
            "set spec.auth.secretRef.name to the Secret holding the token",
        ));
    };
    if let Some(ns) = secret_ref.namespace.as_deref()
        && Some(ns) != connector.metadata.namespace.as_deref()
        && !ns.is_empty()
    {
        return Err(Outcome::failed(
            "SecretInOtherNamespace",
            format!("the Secret must be in the Connector's namespace, not in {ns}"),
        ));
    }
    Ok(name)
}

/// `SecretReady` and the token, given the Secret as read.
pub fn check_auth_secret(
    connector: &Connector,
    class: &ConnectorClass,
    name: &str,
    secret: Option<&Secret>,
) -> Result<Credential, Outcome> {
    let auth_name = connector
        .spec
        .auth
        .as_ref()
        .map(|a| a.name.as_str())
        .unwrap_or_default();
    let wanted = class
        .spec
        .auth_type(auth_name)
        .and_then(|t| t.secret_type.clone());
    let Some(secret) = secret else {
        return Err(Outcome::failed(
            "SecretNotFound",
            format!("Secret {name} does not exist in this namespace"),
        ));
    };
    let actual = secret.type_.as_deref().unwrap_or("Opaque");
    if let Some(wanted) = wanted
        && actual != wanted
    {
        return Err(Outcome::failed(
            "SecretTypeMismatch",
            format!("Secret {name} has type {actual}; auth type {auth_name} needs {wanted}"),
        ));
    }
    let token = secret
        .data
        .as_ref()
        .and_then(|d| d.get(BEARER_TOKEN_KEY))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    match token {
        Some(token) => Ok(Credential::new(token)),
        None => Err(Outcome::failed(
            "SecretKeyMissing",
            format!("Secret {name} has no non-empty key {BEARER_TOKEN_KEY}"),
        )),
    }
}

/// `CACertReady` and the CA certificates (`None`: the system roots).
pub fn check_ca(
    connector: &Connector,
    secret: Option<&Secret>,
) -> Result<Option<Vec<CertificateDer<'static>>>, Outcome> {
    let Some(reference) = &connector.spec.ca_cert_secret_ref else {
        return Ok(None);
    };
    let name = &reference.name;
    let Some(secret) = secret else {
        return Err(Outcome::failed(
            "CACertSecretNotFound",
            format!("Secret {name} of spec.caCertSecretRef does not exist in this namespace"),
        ));
    };
    let Some(pem) = secret.data.as_ref().and_then(|d| d.get(CA_CERT_KEY)) else {
        return Err(Outcome::failed(
            "CACertKeyMissing",
            format!("Secret {name} has no key {CA_CERT_KEY}"),
        ));
    };
    use rustls::pki_types::pem::PemObject;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem.0).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => {
            let mut roots = rustls::RootCertStore::empty();
            for c in &certs {
                if let Err(e) = roots.add(c.clone()) {
                    return Err(Outcome::failed(
                        "CACertInvalid",
                        format!("{CA_CERT_KEY} of Secret {name}: {e}"),
                    ));
                }
            }
            Ok(Some(certs))
        }
        Ok(_) => Err(Outcome::failed(
            "CACertInvalid",
            format!("{CA_CERT_KEY} of Secret {name} holds no PEM certificate"),
        )),
        Err(e) => Err(Outcome::failed(
            "CACertInvalid",
            format!("{CA_CERT_KEY} of Secret {name}: {e}"),
        )),
    }
}

/// A connector's address, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// `host:port` a client CONNECTs to (port 443 if absent).
    pub authority: Authority,
    /// `https://host:port/path` without a trailing `/`: probe paths follow.
    pub base: String,
}

/// Parses `spec.address`: `https://<host>[:<port>][/<path>]`.
pub fn parse_address(address: &str) -> Result<Address, Outcome> {
    let invalid = |why: &str| {
        Outcome::failed(
            "AddressInvalid",
            format!("spec.address {address:?} {why}: use https://<host>[:<port>][/<path>]"),
        )
    };
    if address.is_empty() {
        return Err(invalid("is empty"));
    }
    let uri: http::Uri = address.parse().map_err(|_| invalid("is not a URL"))?;
    if uri.scheme_str() != Some("https") {
        return Err(Outcome::failed(
            "AddressNotHTTPS",
            format!(
                "spec.address {address:?} is not https://: the proxy tunnels TLS connections only"
            ),
        ));
    }
    let authority = uri.authority().ok_or_else(|| invalid("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(invalid("has user information"));
    }
    if uri.query().is_some() {
        return Err(invalid("has a query"));
    }
    let port = authority.port_u16().unwrap_or(443);
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if host.is_empty() {
        return Err(invalid("has no host"));
    }
    let authority = Authority { host, port };
    let path = uri.path().trim_end_matches('/');
    Ok(Address {
        base: format!("https://{authority}{path}"),
        authority,
    })
}

/// `LivenessReady` from the liveness probe.
pub fn liveness_outcome(path: &str, result: &ProbeResult) -> Outcome {
    match result {
        ProbeResult::Answered { status, .. } if *status < 500 => Outcome::ok(
            "Reachable",
            format!("GET {path} answered {status} over verified TLS"),
        ),
        ProbeResult::Answered { status, message } => Outcome::failed(
            "ServerError",
            format!("GET {path} answered {status}: {message}"),
        ),
        ProbeResult::Failed { reason, message } => {
            Outcome::failed(reason, format!("GET {path}: {message}"))
        }
    }
}

/// `AuthReady` from the auth probe.
pub fn auth_outcome(path: &str, result: &ProbeResult) -> Outcome {
    match result {
        ProbeResult::Answered { status, .. } if (200..300).contains(status) => Outcome::ok(
            "Authenticated",
            format!("the token is accepted: GET {path} answered {status}"),
        ),
        ProbeResult::Answered {
            status: 401,
            message,
        } => Outcome::failed(
            "Unauthorized",
            format!("the API server refused the token (401): {message}"),
        ),
        ProbeResult::Answered {
            status: 403,
            message,
        } => Outcome::failed(
            "Forbidden",
            format!("the token may not GET {path} (403): {message}"),
        ),
        ProbeResult::Answered { status, message } => Outcome::failed(
            "UnexpectedStatus",
            format!("GET {path} answered {status}: {message}"),
        ),
        ProbeResult::Failed { reason, message } => {
            Outcome::failed(reason, format!("GET {path}: {message}"))
        }
    }
}

/// Name of the Service fronting the proxy for `connector`: `c-<name>`.
pub fn service_name(connector_name: &str) -> String {
    format!("c-{connector_name}")
}

/// The host of the proxy's own Service: `<service>.<namespace>.svc.<domain>`
/// in the operator's namespace, or `service` itself when it is a DNS name
/// already. Kubeconfigs and `status.proxy.httpAddress` name it, never a
/// Service of the Connector's namespace, which that namespace's editors
/// could repoint to collect the workloads' tokens; the proxy knows the
/// Connector from the URL's userinfo (`<ns>/<name>`).
pub fn proxy_service_host(service: &str, namespace: &str, cluster_domain: &str) -> String {
    if service.contains('.') {
        service.to_owned()
    } else {
        format!("{service}.{namespace}.svc.{cluster_domain}")
    }
}

/// The Service `c-<name>`: an `ExternalName` for the proxy's own Service
/// (port 80), owned by the Connector. Too long a name is refused (a Service
/// name is one DNS label).
pub fn proxy_service(
    connector: &Connector,
    options: &ConnectorOptions,
) -> Result<Service, Outcome> {
    let name = connector.name_any();
    let service = service_name(&name);
    if service.len() > 63 {
        return Err(Outcome::failed(
            "NameTooLong",
            format!(
                "the proxy Service {service} would be longer than 63 characters: use a Connector name of at most 61"
            ),
        ));
    }
    let mut labels = BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())]);
    labels.insert(CONNECTOR_LABEL.to_owned(), name.clone());
    let owner = OwnerReference {
        api_version: Connector::api_version(&()).into_owned(),
        kind: Connector::kind(&()).into_owned(),
        name: name.clone(),
        uid: connector.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    };
    let value = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service,
            "namespace": connector.metadata.namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "type": "ExternalName",
            "externalName": options.proxy_service_host,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        },
    });
    serde_json::from_value(value)
        .map_err(|e| Outcome::failed("ServiceInvalid", format!("building the Service: {e}")))
}

/// The status for `observation` (pure): the conditions (transition times
/// kept unless a status flips), `Ready`, and the proxy's address.
pub fn status_for(
    connector: &Connector,
    observation: &Observation,
    options: &ConnectorOptions,
    proxy_ca_pem: &str,
    now: Time,
) -> ConnectorStatus {
    let previous = connector.status.clone().unwrap_or_default();
    let generation = connector.metadata.generation;
    let mut conditions = previous.conditions.clone();
    let mut set = |type_: &str, outcome: &Outcome, severity: &str| {
        ConnectorCondition::set(
            &mut conditions,
            ConnectorCondition {
                type_: type_.to_owned(),
                status: outcome.status.as_str().to_owned(),
                reason: outcome.reason.clone(),
                message: outcome.message.clone(),
                severity: severity.to_owned(),
                last_transition_time: None,
                observed_generation: generation,
            },
            now.clone(),
        );
    };
    let deciding = [
        (types::CLASS, &observation.class),
        (types::SECRET, &observation.secret),
        (types::LIVENESS, &observation.liveness),
        (types::AUTH, &observation.auth),
        (types::PROXY_SERVICE, &observation.service),
    ];
    for (type_, outcome) in deciding {
        set(type_, outcome, "");
    }
    set(types::CA_CERT, &observation.ca, "Info");
    // Ready: the first False condition decides (else the first Unknown).
    let failed = deciding
        .iter()
        .find(|(_, o)| o.status == ConditionStatus::False)
        .or_else(|| deciding.iter().find(|(_, o)| !o.is_ok()));
    let ready = match failed {
        None => Outcome::ok(
            "Ready",
            "the connector is ready: workloads reach it through its proxy",
        ),
        Some((type_, first)) => Outcome::new(
            first.status,
            &first.reason,
            format!("{type_}: {}", first.message),
        ),
    };
    set(types::READY, &ready, "");
    let order = [
        types::CLASS,
        types::SECRET,
        types::CA_CERT,
        types::LIVENESS,
        types::AUTH,
        types::PROXY_SERVICE,
        types::READY,
    ];
    conditions.sort_by_key(|c| {
        order
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(order.len())
    });
    ConnectorStatus {
        conditions,
        observed_generation: generation,
        proxy: Some(ConnectorProxyStatus {
            http_address: Some(Addressable {
                url: Some(format!("http://{}", options.proxy_service_host)),
                name: Some("proxy".into()),
                audience: Some(options.token_audience.clone()),
                ca_certs: Some(proxy_ca_pem.to_owned()),
            }),
        }),
        annotations: previous.annotations,
    }
}

/// The events of a status change: a Warning for every condition that turned
/// False or changed its reason while False, a Normal one when Ready turns
/// True (pure).
pub fn events_for(
    previous: &[ConnectorCondition],
    next: &[ConnectorCondition],
) -> Vec<(EventType, String, String)> {
    let mut events = Vec::new();
    for c in next {
        let before = previous.condition(&c.type_);
        let changed = before.is_none_or(|b| b.status != c.status || b.reason != c.reason);
        if !changed {
            continue;
        }
        if c.type_ == types::READY && c.status == "True" {
            events.push((EventType::Normal, "Ready".into(), c.message.clone()));
        } else if c.status == "False" && c.type_ != types::READY {
            events.push((
                EventType::Warning,
                c.reason.clone(),
                format!("{}: {}", c.type_, c.message),
            ));
        }
    }
    events
}

/// Reads a Secret of the Connector's namespace; a failure becomes `outcome`.
async fn read_secret(
    secrets: &Api<Secret>,
    name: &str,
    errors: &mut Vec<kube::Error>,
) -> Result<Option<Secret>, Outcome> {
    match secrets.get_opt(name).await {
        Ok(s) => Ok(s),
        Err(e) => {
            let outcome =
                Outcome::failed("SecretUnreadable", format!("reading Secret {name}: {e}"));
            errors.push(e);
            Err(outcome)
        }
    }
}

async fn apply(
    connector: &Connector,
    ctx: &ConnectorContext,
    classes: &Store<ConnectorClass>,
) -> Result<Action, Error> {
    let namespace = connector
        .namespace()
        .unwrap_or_else(|| "default".to_owned());
    let name = connector.name_any();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut errors = Vec::new();

    let class = classes.get(&ObjectRef::new(&connector.spec.connector_class_name));
    let class_outcome = check_class(connector, class.as_deref());
    let (secret_outcome, token) = match class.as_deref().filter(|_| class_outcome.is_ok()) {
        None => (Outcome::not_checked(types::CLASS), None),
        Some(class) => match auth_secret_name(connector, class) {
            Err(o) => (o, None),
            Ok(secret_name) => match read_secret(&secrets, secret_name, &mut errors).await {
                Err(o) => (o, None),
                Ok(secret) => {
                    match check_auth_secret(connector, class, secret_name, secret.as_ref()) {
                        Ok(token) => (
                            Outcome::ok(
                                "SecretReady",
                                format!("Secret {secret_name} holds a {BEARER_TOKEN_KEY}"),
                            ),
                            Some(token),
                        ),
                        Err(o) => (o, None),
                    }
                }
            },
        },
    };
    let ca = match &connector.spec.ca_cert_secret_ref {
        None => Ok(None),
        Some(r) => match read_secret(&secrets, &r.name, &mut errors).await {
            Err(o) => Err(o),
            Ok(secret) => check_ca(connector, secret.as_ref()),
        },
    };
    let ca_outcome = match &ca {
        Ok(None) => Outcome::ok(
            "SystemRoots",
            "no spec.caCertSecretRef: the system's CA certificates verify the address",
        ),
        Ok(Some(certs)) => Outcome::ok(
            "CACertReady",
            format!("{} CA certificate(s) verify the address", certs.len()),
        ),
        Err(o) => o.clone(),
    };

    // Liveness: a valid address, a usable CA, a name that resolves, an answer.
    let liveness_path = class
        .as_deref()
        .and_then(|c| c.spec.liveness())
        .map(|p| p.path.clone())
        .unwrap_or_else(|| "/version".into());
    let auth_path = class
        .as_deref()
        .and_then(|c| {
            let auth = connector.spec.auth.as_ref()?;
            c.spec.auth_probe(&auth.name)
        })
        .map(|p| p.path.clone())
        .unwrap_or_else(|| "/api/v1/pods?limit=1".into());
    let mut upstream = None;
    let mut client = None;
    let liveness_outcome = match (parse_address(&connector.spec.address), &ca) {
        (Err(o), _) => o,
        (Ok(_), Err(o)) => Outcome::failed(
            "CACertNotReady",
            format!("the address cannot be verified: {}", o.message),
        ),
        (Ok(address), Ok(ca_certs)) => {
            let host = address.authority.host.clone();
            match tokio::net::lookup_host((host.as_str(), address.authority.port)).await {
                Err(e) => Outcome::failed(
                    "AddressUnresolvable",
                    format!("{} does not resolve: {e}", address.authority.host),
                ),
                Ok(addrs) => {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    let ca_der = ca_certs
                        .as_ref()
                        .map(|certs| certs.iter().map(|c| c.to_vec()).collect());
                    match (
                        UpstreamTarget::new(addrs, &host, ca_der),
                        probe::client(ca_certs.as_deref(), ctx.options.probe_timeout),
                    ) {
                        (Err(e), _) => Outcome::failed("AddressInvalid", e.to_string()),
                        (_, Err(e)) => Outcome::failed("CACertInvalid", e.to_string()),
                        (Ok(target), Ok(http)) => {
                            let url = format!("{}{liveness_path}", address.base);
                            let result = probe::get(&http, &url, token.as_ref()).await;
                            upstream = Some((address, Arc::new(target)));
                            client = Some(http);
                            let mut outcome = liveness_outcome(&liveness_path, &result);
                            if outcome.reason == "TLSVerificationFailed" && ca_certs.is_none() {
                                outcome.message.push_str(
                                    "; if the API server's certificate is not from a public CA (kubeadm's is not), set spec.caCertSecretRef to a Secret with its CA in ca.crt",
                                );
                            }
                            outcome
                        }
                    }
                }
            }
        }
    };
    let auth_outcome = match (&token, &client, &upstream) {
        (None, _, _) => Outcome::not_checked(types::SECRET),
        (_, _, _) if !liveness_outcome.is_ok() => Outcome::not_checked(types::LIVENESS),
        (Some(token), Some(http), Some((address, _))) => {
            let url = format!("{}{auth_path}", address.base);
            auth_outcome(&auth_path, &probe::get(http, &url, Some(token)).await)
        }
        _ => Outcome::not_checked(types::LIVENESS),
    };

    // The proxy serves a connector whose configuration is complete, whatever
    // the probes say: a target that is down now answers its own errors.
    let target = match (&token, &upstream) {
        (Some(token), Some((address, target))) if class_outcome.is_ok() => Ok(ProxyTarget {
            uid: connector.metadata.uid.clone().unwrap_or_default(),
            authorities: vec![address.authority.clone()],
            upstream: target.clone(),
            authorization: Credential::new(format!("Bearer {}", token.expose())),
        }),
        _ => {
            let first = [&class_outcome, &secret_outcome, &liveness_outcome]
                .into_iter()
                .find(|o| !o.is_ok())
                .map(|o| format!("{}: {}", o.reason, o.message))
                .unwrap_or_else(|| "its configuration is incomplete".into());
            Err(first)
        }
    };
    ctx.targets.set(&namespace, &name, target);

    let service_outcome = match proxy_service(connector, &ctx.options) {
        Err(o) => o,
        Ok(service) => {
            let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
            match services
                .patch(
                    &service_name(&name),
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&service),
                )
                .await
            {
                Ok(_) => Outcome::ok(
                    "ServiceReady",
                    format!(
                        "Service {} fronts the proxy ({})",
                        service_name(&name),
                        ctx.options.proxy_service_host
                    ),
                ),
                Err(e) => {
                    let o = Outcome::failed(
                        "ServiceNotApplied",
                        format!("applying Service {}: {e}", service_name(&name)),
                    );
                    errors.push(e);
                    o
                }
            }
        }
    };

    let observation = Observation {
        class: class_outcome,
        secret: secret_outcome,
        ca: ca_outcome,
        liveness: liveness_outcome,
        auth: auth_outcome,
        service: service_outcome,
    };
    let status = status_for(
        connector,
        &observation,
        &ctx.options,
        &ctx.proxy_ca_pem,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let api: Api<Connector> = Api::namespaced(ctx.client.clone(), &namespace);
    apply_status(&api, connector, connector.status.as_ref(), &status).await?;
    let previous = connector
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    for (type_, reason, note) in events_for(previous, &status.conditions) {
        publish_event(&ctx.recorder, connector, type_, &reason, "Reconcile", note).await;
    }
    if let Some(e) = errors.into_iter().next() {
        return Err(Error::Kube(e));
    }
    Ok(next_check(ctx, connector, &status))
}

/// When to check `connector` again: at the resync once Ready; else sooner,
/// with its own backoff — Secrets are not watched, and a fixed Secret should
/// not wait for the resync.
fn next_check(ctx: &ConnectorContext, connector: &Connector, status: &ConnectorStatus) -> Action {
    let key = key_of(connector);
    let ready = status
        .conditions
        .condition(types::READY)
        .is_some_and(|c| c.status == ConditionStatus::True.as_str());
    if ready {
        ctx.recheck.reset(&key);
        resync(ctx.options.probe_interval)
    } else {
        Action::requeue(ctx.recheck.fail(&key))
    }
}

/// The Connector reconciler: no finalizer — once a Connector is gone the
/// proxy forgets its target (its Service goes with it, by owner reference).
pub struct Connectors {
    ctx: Arc<ConnectorContext>,
    classes: Store<ConnectorClass>,
}

impl Reconciler for Connectors {
    type Object = Connector;
    const KIND: &'static str = "Connector";
    const DELETION: Deletion = Deletion::Forget;

    fn kit(&self) -> KitContext<'_> {
        KitContext {
            client: &self.ctx.client,
            metrics: &self.ctx.metrics,
            backoff: &self.ctx.backoff,
            resync_interval: self.ctx.options.probe_interval,
        }
    }

    async fn apply(self: Arc<Self>, connector: Arc<Connector>) -> Result<Action, Error> {
        apply(&connector, &self.ctx, &self.classes).await
    }

    async fn forget(self: Arc<Self>, namespace: String, name: String) {
        self.ctx.recheck.reset(&format!("{namespace}/{name}"));
        self.ctx.targets.remove(&namespace, &name);
    }
}

/// Runs the Connector controller until `shutdown`; `synced` is told once
/// the Connector and ConnectorClass stores are filled.
pub async fn run(
    ctx: Arc<ConnectorContext>,
    synced: tokio::sync::oneshot::Sender<()>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (classes, class_writer) = reflector::store::<ConnectorClass>();
    let class_stream = watcher(
        Api::<ConnectorClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(class_writer)
    .touched_objects();
    // Touched objects, not only applied ones: a Connector's own deletion
    // reconciles it (and the proxy forgets it) at once. `Controller::new`
    // reacts to applied objects only, so the role learnt of a deletion when
    // the garbage collector removed the Connector's Service (~10 s on a real
    // cluster) or at the next resync, while open connections kept their grant.
    let (connectors, connector_writer) = reflector::store::<Connector>();
    let connector_stream = watcher(
        Api::<Connector>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(connector_writer)
    .touched_objects();
    let controller = Controller::for_stream(connector_stream, connectors.clone());
    let by_class = {
        let connectors = connectors.clone();
        move |class: ConnectorClass| {
            let name = class.name_any();
            connectors
                .state()
                .into_iter()
                .filter(|c| c.spec.connector_class_name == name)
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    // No watch of Secrets (not even of their metadata): the role may read
    // only the Secrets Connectors name, by `get`, at each reconcile — on a
    // change of the Connector and at every resync — so it never lists the
    // Secrets of the cluster.
    let services = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    {
        let (connectors, classes) = (connectors.clone(), classes.clone());
        tokio::spawn(async move {
            if crate::reconcile::store_ready(&connectors).await
                && crate::reconcile::store_ready(&classes).await
            {
                let _ = synced.send(());
            }
        });
    }
    let controller = controller
        .owns(Api::<Service>::all(client.clone()), services)
        .watches_stream(class_stream, by_class);
    kit::run(Arc::new(Connectors { ctx, classes }), controller, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use tuna_crds::builtin_k8s_class;

    fn connector(yaml_spec: &str) -> Connector {
        serde_saphyr::from_str(&format!(
            "apiVersion: connectors.alauda.io/v1alpha1\nkind: Connector\nmetadata: {{name: k8s-connector, namespace: demo, generation: 2, uid: u1}}\nspec: {yaml_spec}\n"
        ))
        .unwrap()
    }

    fn secret(type_: &str, data: &[(&str, &str)]) -> Secret {
        Secret {
            type_: Some(type_.into()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    const DOC: &str = "{connectorClassName: k8s, address: 'https://192.168.1.100:6443', auth: {name: bearerTokenAuth, secretRef: {name: k8s-secret}}}";

    fn options() -> ConnectorOptions {
        ConnectorOptions {
            probe_interval: Duration::from_secs(60),
            probe_timeout: Duration::from_secs(5),
            cluster_domain: "cluster.local".into(),
            proxy_service_host: "tuna-operator-connectors.tuna-system.svc.cluster.local".into(),
            token_audience: "connectors.alauda.io".into(),
        }
    }

    #[test]
    fn class_and_secret_checks_name_what_is_wrong() {
        let class = builtin_k8s_class();
        let doc = connector(DOC);
        assert!(check_class(&doc, Some(&class)).is_ok());
        assert_eq!(check_class(&doc, None).reason, "ConnectorClassNotFound");
        assert_eq!(
            check_class(&connector("{connectorClassName: git}"), Some(&class)).reason,
            "ConnectorClassNotSupported"
        );
        assert_eq!(
            check_class(&connector("{}"), None).reason,
            "ConnectorClassNotSet"
        );

        assert_eq!(auth_secret_name(&doc, &class).unwrap(), "k8s-secret");
        let cases = [
            ("{connectorClassName: k8s}", "AuthNotSet"),
            (
                "{connectorClassName: k8s, auth: {name: basicAuth, secretRef: {name: s}}}",
                "AuthTypeUnknown",
            ),
            (
                "{connectorClassName: k8s, auth: {name: bearerTokenAuth}}",
                "SecretRefNotSet",
            ),
            (
                "{connectorClassName: k8s, auth: {name: bearerTokenAuth, secretRef: {name: s, namespace: other}}}",
                "SecretInOtherNamespace",
            ),
        ];
        for (spec, reason) in cases {
            assert_eq!(
                auth_secret_name(&connector(spec), &class)
                    .unwrap_err()
                    .reason,
                reason,
                "{spec}"
            );
        }

        let good = secret("connectors.cpaas.io/bearer-token", &[("token", "s3cr3t\n")]);
        assert_eq!(
            check_auth_secret(&doc, &class, "k8s-secret", Some(&good))
                .unwrap()
                .expose(),
            "s3cr3t"
        );
        let cases = [
            (None, "SecretNotFound"),
            (
                Some(secret("Opaque", &[("token", "s3cr3t")])),
                "SecretTypeMismatch",
            ),
            (
                Some(secret(
                    "connectors.cpaas.io/bearer-token",
                    &[("other", "s3cr3t")],
                )),
                "SecretKeyMissing",
            ),
            (
                Some(secret(
                    "connectors.cpaas.io/bearer-token",
                    &[("token", " ")],
                )),
                "SecretKeyMissing",
            ),
        ];
        for (s, reason) in cases {
            let outcome = check_auth_secret(&doc, &class, "k8s-secret", s.as_ref()).unwrap_err();
            assert_eq!(outcome.reason, reason);
            assert!(!outcome.message.contains("s3cr3t"), "{}", outcome.message);
        }
    }

    #[test]
    fn addresses_must_be_https_urls() {
        let a = parse_address("https://192.168.1.100:6443").unwrap();
        assert_eq!(a.authority.to_string(), "192.168.1.100:6443");
        assert_eq!(a.base, "https://192.168.1.100:6443");
        let b = parse_address("https://API.example.com/k8s/clusters/x/").unwrap();
        assert_eq!(b.authority.to_string(), "api.example.com:443");
        assert_eq!(b.base, "https://api.example.com:443/k8s/clusters/x");
        assert_eq!(
            parse_address("https://[::1]:6443").unwrap().authority.host,
            "::1"
        );
        for (bad, reason) in [
            ("", "AddressInvalid"),
            ("http://10.0.0.1:6443", "AddressNotHTTPS"),
            ("192.168.1.100:6443", "AddressNotHTTPS"),
            ("https://u:p@host:6443", "AddressInvalid"),
            ("https://host:6443/?x=1", "AddressInvalid"),
        ] {
            assert_eq!(parse_address(bad).unwrap_err().reason, reason, "{bad}");
        }
    }

    #[test]
    fn probes_decide_liveness_and_auth() {
        let answered = |status| ProbeResult::Answered {
            status,
            message: "Unauthorized".into(),
        };
        assert!(liveness_outcome("/version", &answered(401)).is_ok());
        assert_eq!(
            liveness_outcome("/version", &answered(503)).reason,
            "ServerError"
        );
        let down = ProbeResult::Failed {
            reason: "TLSVerificationFailed",
            message: "invalid peer certificate: UnknownIssuer".into(),
        };
        assert_eq!(
            liveness_outcome("/version", &down).reason,
            "TLSVerificationFailed"
        );
        let path = "/api/v1/pods?limit=1";
        assert!(auth_outcome(path, &answered(200)).is_ok());
        let refused = auth_outcome(path, &answered(401));
        assert_eq!(refused.reason, "Unauthorized");
        assert!(
            refused.message.contains("Unauthorized"),
            "the server's answer"
        );
        assert_eq!(auth_outcome(path, &answered(403)).reason, "Forbidden");
        assert_eq!(
            auth_outcome(path, &answered(404)).reason,
            "UnexpectedStatus"
        );
    }

    fn all_ok() -> Observation {
        Observation {
            class: Outcome::ok("ConnectorClassReady", "m"),
            secret: Outcome::ok("SecretReady", "m"),
            ca: Outcome::ok("SystemRoots", "m"),
            liveness: Outcome::ok("Reachable", "m"),
            auth: Outcome::ok("Authenticated", "m"),
            service: Outcome::ok("ServiceReady", "m"),
        }
    }

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn ready_follows_the_first_failing_condition_and_status_is_stable() {
        let mut doc = connector(DOC);
        let status = status_for(&doc, &all_ok(), &options(), "CA PEM", at(10));
        let ready = status.conditions.condition("Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Ready")
        );
        assert_eq!(ready.observed_generation, Some(2));
        assert_eq!(status.observed_generation, Some(2));
        let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                "ConnectorClassReady",
                "SecretReady",
                "CACertReady",
                "LivenessReady",
                "AuthReady",
                "ProxyServiceReady",
                "Ready"
            ]
        );
        assert_eq!(
            status.conditions.condition("CACertReady").unwrap().severity,
            "Info"
        );
        let address = status
            .proxy
            .as_ref()
            .unwrap()
            .http_address
            .as_ref()
            .unwrap();
        // Issue 37 item 7 (C1): the proxy's own Service in the operator's
        // namespace, not `c-<name>` in the Connector's.
        assert_eq!(
            address.url.as_deref(),
            Some("http://tuna-operator-connectors.tuna-system.svc.cluster.local")
        );
        assert_eq!(address.ca_certs.as_deref(), Some("CA PEM"));
        // The same observation later: an identical status (no write).
        doc.status = Some(status.clone());
        assert_eq!(
            status_for(&doc, &all_ok(), &options(), "CA PEM", at(20)),
            status
        );

        let mut broken = all_ok();
        broken.secret = Outcome::failed("SecretNotFound", "Secret k8s-secret does not exist");
        broken.auth = Outcome::not_checked(types::SECRET);
        let next = status_for(&doc, &broken, &options(), "CA PEM", at(30));
        let ready = next.conditions.condition("Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SecretNotFound")
        );
        assert!(
            ready.message.starts_with("SecretReady: "),
            "{}",
            ready.message
        );
        assert_eq!(ready.last_transition_time, Some(at(30)));
        assert_eq!(
            next.conditions.condition("AuthReady").unwrap().status,
            "Unknown"
        );
        let events = events_for(&status.conditions, &next.conditions);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].1, "SecretNotFound");
        let back = events_for(&next.conditions, &status.conditions);
        assert!(
            back.iter()
                .any(|(t, r, _)| *t == EventType::Normal && r == "Ready")
        );
    }

    #[test]
    fn the_proxy_service_points_at_the_proxy_and_belongs_to_the_connector() {
        let doc = connector(DOC);
        let service = proxy_service(&doc, &options()).unwrap();
        assert_eq!(service.metadata.name.as_deref(), Some("c-k8s-connector"));
        let spec = service.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
        assert_eq!(
            spec.external_name.as_deref(),
            Some("tuna-operator-connectors.tuna-system.svc.cluster.local")
        );
        let owner = &service.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Connector", "u1")
        );
        let mut long = connector("{connectorClassName: k8s}");
        long.metadata.name = Some("x".repeat(62));
        assert_eq!(
            proxy_service(&long, &options()).unwrap_err().reason,
            "NameTooLong"
        );
    }
}
