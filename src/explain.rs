//! `tuna-operator route explain`: which Ingress rule and Service serve a URL,
//! and why every other candidate lost.
//!
//! It loads manifests with [`crate::manifest`], translates Ingresses with
//! [`crate::plan::ingress::translate`] and builds a
//! [`tuna_routing::RouteTable`] exactly as the running controller does, then
//! asks the table to explain the URL. The exit code is 0 whether or not a
//! route matches; unreadable or invalid input is an error.

use std::fmt::Write as _;
use std::path::PathBuf;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, ListParams};
use serde::Serialize;
use tuna_crds::gateway::{Gateway, GatewayClass, HttpRoute, ReferenceGrant};
use tuna_crds::{Domain, Tunnel};
use tuna_routing::{HostSelection, Outcome, RouteTable};

use crate::plan::gateway::GROUP as GATEWAY_GROUP;
use crate::plan::gateway_model::GatewayInputs;
use crate::plan::ingress::{DEFAULT_INGRESS_CLASS, ServicePort, SkipKind, TranslateOptions};
use crate::plan::service::{ServiceIndex, ServiceInfo};
use crate::plan::{Backend, Backends, HostRoute, Inputs, Kind, PlanOptions, Reason, Refusal, plan};
use crate::{Error, cluster, manifest};

/// Subcommands of `tuna-operator route`.
#[derive(Debug, clap::Subcommand)]
pub enum RouteCommand {
    /// Show which Ingress rule and Service serve a URL, and why the other
    /// candidates lost (or that a 404 would be served).
    Explain(ExplainArgs),
}

/// Arguments of `route explain`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// A manifest file or directory (read recursively); repeat for more.
    /// Without it, the Ingresses, IngressClasses, Tunnels, Domains and the
    /// Services they name are read (read-only) from the current kubeconfig context.
    #[arg(short = 'f', long = "filename", value_name = "FILE_OR_DIR")]
    pub files: Vec<PathBuf>,
    /// A host reserved on the account outside Kubernetes (repeatable): Ingresses
    /// may publish it without a Domain, as the agent allows.
    #[arg(long = "account-domain", value_name = "HOST")]
    pub account_domains: Vec<String>,
    /// The edge's base domain, for Domains with `subdomain:` (default: what the
    /// cluster's Domains show in `status.fqdn`, else `localhost`).
    #[arg(long)]
    pub base_domain: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// The IngressClass name the controller answers to.
    #[arg(long, default_value = DEFAULT_INGRESS_CLASS)]
    pub ingress_class: String,
    /// The request's method (HTTPRoute `method` matches).
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// A request header, `Name: value` (repeatable; HTTPRoute header matches).
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// The URL to explain, e.g. `https://shop.example.com/api/users?page=2`.
    pub url: String,
}

/// How `route explain` prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Text for humans.
    Text,
    /// One JSON object.
    Json,
}

/// Runs a `route` subcommand, printing to stdout.
pub fn run(cmd: RouteCommand) -> crate::Result<()> {
    match cmd {
        RouteCommand::Explain(args) => {
            let report = explain(&args)?;
            match args.output {
                OutputFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report.json).map_err(Error::Json)?
                ),
                OutputFormat::Text => print!("{}", report.text),
            }
            Ok(())
        }
    }
}

/// The answer of `route explain`, in both output forms.
#[derive(Debug, Clone)]
pub struct ExplainReport {
    /// The `--output json` object.
    pub json: ExplainJson,
    /// The human-readable text.
    pub text: String,
}

/// The `--output json` object. Route fields are null when nothing matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExplainJson {
    /// Whether a route serves the URL.
    pub matched: bool,
    /// Namespace of the serving Ingress.
    pub namespace: Option<String>,
    /// Name of the serving Ingress.
    pub ingress: Option<String>,
    /// Host of the serving rule (as written in the Ingress).
    pub host: Option<String>,
    /// Path of the serving rule (as written in the Ingress).
    pub path: Option<String>,
    /// `Exact`, `Prefix` or `ImplementationSpecific`.
    pub path_type: Option<String>,
    /// Name of the Service.
    pub service: Option<String>,
    /// Service port: a number or a port name.
    pub port: Option<ServicePort>,
    /// Everything not routed, and why.
    pub skipped: Vec<SkippedJson>,
    /// http Tunnels for this URL's host that do not publish it, and why (for
    /// example `HostOwnedByOtherNamespace`, `HostConflict`); left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused_tunnels: Vec<RefusedTunnelJson>,
    /// With Gateway API objects: the status, backends and route.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayJson>,
}

/// What `route explain` adds when it reads Gateway API objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayJson {
    /// The status the edge answers when no backend serves: 404 when nothing
    /// matched, 500 when the matched rule has no valid backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The matched rule's valid backends with weight > 0.
    pub backends: Vec<BackendJson>,
    /// The matched rule's refused backendRefs.
    pub invalid_backends: Vec<InvalidBackendJson>,
    /// The matched rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteJson>,
    /// Every candidate rule of the host and its fate.
    pub candidates: Vec<CandidateJson>,
    /// HTTPRoutes (or their hosts) not served, and why.
    pub refused_routes: Vec<RefusedRouteJson>,
}

/// One backend of the matched rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendJson {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The port as the backendRef (or Ingress) gives it.
    pub port: Option<serde_json::Value>,
    /// The weight (1 when omitted).
    pub weight: u32,
}

/// One refused backendRef of the matched rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvalidBackendJson {
    /// The namespace it names.
    pub namespace: String,
    /// The name it names.
    pub service: String,
    /// Its kind (`Service`, or `group/kind`).
    pub kind: String,
    /// Its port.
    pub port: Option<i32>,
    /// `RefNotPermitted`, `BackendNotFound`, `InvalidKind`, …
    pub reason: String,
    /// For a human.
    pub message: String,
}

/// The object and rule that matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteJson {
    /// `HTTPRoute`, `Ingress` or `Tunnel`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The rule's index (0-based).
    pub rule: usize,
}

/// A candidate rule for the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateJson {
    /// `HTTPRoute`, `Ingress` or `Tunnel`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Rule index.
    pub rule: usize,
    /// Match index in the rule (path index for an Ingress).
    #[serde(rename = "match")]
    pub match_index: usize,
    /// The host it is published on.
    pub host: String,
    /// Its path.
    pub path: String,
    /// `Exact` or `Prefix`.
    pub path_type: String,
    /// `Selected`, `PathDoesNotMatch`, `MethodDoesNotMatch`, …
    pub outcome: String,
    /// For a human.
    pub message: String,
}

/// An HTTPRoute refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedRouteJson {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Reason.
    pub reason: String,
    /// For a human.
    pub message: String,
}

/// The request as `route explain` is told it.
struct ExplainRequest {
    method: String,
    headers: Vec<(String, String)>,
}

impl tuna_routing::RequestView for ExplainRequest {
    fn method(&self) -> &str {
        &self.method
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn explain_request(args: &ExplainArgs) -> crate::Result<ExplainRequest> {
    let mut headers = Vec::new();
    for h in &args.headers {
        let Some((name, value)) = h.split_once(':') else {
            return Err(Error::ManifestsInvalid(vec![format!(
                "--header {h:?}: expected `Name: value`"
            )]));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(ExplainRequest {
        method: args.method.to_ascii_uppercase(),
        headers,
    })
}

fn kind_of(spec: &HostRoute) -> &'static str {
    match (&spec.matcher, &spec.backend.url) {
        (tuna_routing::Matcher::Gateway(_), _) => "HTTPRoute",
        (_, Some(_)) => "Tunnel",
        _ => "Ingress",
    }
}

fn gateway_json(
    why: &tuna_routing::Explanation<'_, Backend>,
    plan: &crate::plan::Plan,
    host: &str,
) -> GatewayJson {
    let mut json = GatewayJson {
        status: None,
        backends: Vec::new(),
        invalid_backends: Vec::new(),
        route: None,
        candidates: why
            .candidates
            .iter()
            .map(|c| CandidateJson {
                kind: kind_of(c.spec).into(),
                namespace: c.spec.origin.namespace.clone(),
                name: c.spec.origin.name.clone(),
                rule: c.spec.origin.rule,
                match_index: c.spec.origin.path,
                host: c.spec.host.clone(),
                path: c.spec.path.clone(),
                path_type: c.spec.path_type.as_str().into(),
                outcome: c.outcome.as_str().into(),
                message: c.outcome.to_string(),
            })
            .collect(),
        refused_routes: plan
            .refusals
            .iter()
            .filter(|r| r.object.kind == Kind::HttpRoute)
            .filter(|r| {
                !matches!(
                    r.reason,
                    Reason::HostNotReserved
                        | Reason::HostOwnedByOtherNamespace
                        | Reason::HostUsedByIngress
                        | Reason::HostUsedByTunnel
                ) || r.message.contains(host)
            })
            .map(|r| RefusedRouteJson {
                namespace: r.object.namespace.clone(),
                name: r.object.name.clone(),
                reason: r.reason.as_str().into(),
                message: r.message.clone(),
            })
            .collect(),
    };
    let Some(m) = &why.winner else {
        json.status = Some(404);
        return json;
    };
    json.route = Some(RouteJson {
        kind: kind_of(m.spec).into(),
        namespace: m.spec.origin.namespace.clone(),
        name: m.spec.origin.name.clone(),
        rule: m.spec.origin.rule,
    });
    match &m.backend.gateway {
        Some(action) => {
            json.backends = action
                .backends
                .iter()
                .map(|b| BackendJson {
                    namespace: b.namespace.clone(),
                    service: b.service.clone(),
                    port: b.port.map(serde_json::Value::from),
                    weight: b.weight,
                })
                .collect();
            json.invalid_backends = action
                .invalid
                .iter()
                .map(|b| InvalidBackendJson {
                    namespace: b.namespace.clone(),
                    service: b.name.clone(),
                    kind: b.kind.clone(),
                    port: b.port,
                    reason: b.reason.clone(),
                    message: b.message.clone(),
                })
                .collect();
            // A redirect answers without a backend.
            let redirects = action
                .filters
                .iter()
                .any(|f| matches!(f, tuna_routing::action::Filter::RequestRedirect(_)));
            if json.backends.is_empty() && !redirects {
                json.status = Some(500);
            }
        }
        None => {
            if let Some(s) = &m.backend.service {
                json.backends.push(BackendJson {
                    namespace: s.namespace.clone(),
                    service: s.name.clone(),
                    port: serde_json::to_value(&s.port).ok(),
                    weight: 1,
                });
            }
        }
    }
    json
}

/// An http Tunnel for the explained host that is not published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedTunnelJson {
    /// Namespace of the Tunnel.
    pub namespace: String,
    /// Name of the Tunnel.
    pub name: String,
    /// Machine-readable reason, the Tunnel's `Ready` reason.
    pub reason: String,
    /// For a human.
    pub message: String,
}

/// One skipped item in the JSON output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedJson {
    /// `Ingress`, `Rule` or `Backend`.
    pub kind: SkipKind,
    /// Machine-readable reason, e.g. `RuleWithoutHost` or `RouteConflict`.
    pub reason: String,
    /// Namespace of the Ingress.
    pub namespace: String,
    /// Name of the Ingress.
    pub ingress: String,
    /// Index in `spec.rules`.
    pub rule: Option<usize>,
    /// Index in the rule's `http.paths`.
    pub path: Option<usize>,
    /// For a human.
    pub message: String,
}

impl From<&Refusal> for SkippedJson {
    fn from(r: &Refusal) -> Self {
        let kind = match r.reason {
            Reason::Ingress(reason) => reason.kind(),
            Reason::Backend(_) => SkipKind::Backend,
            _ => SkipKind::Rule,
        };
        Self {
            kind,
            reason: r.reason.as_str().to_owned(),
            namespace: r.object.namespace.clone(),
            ingress: r.object.name.clone(),
            rule: r.rule,
            path: r.path,
            message: r.message.clone(),
        }
    }
}

/// Splits a URL into the `Host` value and the request target path. The path
/// is kept exactly as written (canonicalising it is the router's job).
///
/// ```
/// use tuna_operator::explain::split_url;
/// assert_eq!(split_url("https://Shop.example.com:8443/a/../b?x=1").unwrap(),
///            ("Shop.example.com:8443".to_string(), "/a/../b?x=1".to_string()));
/// assert_eq!(split_url("example.com").unwrap(), ("example.com".to_string(), "/".to_string()));
/// assert!(split_url("ftp://example.com/").is_err());
/// ```
pub fn split_url(url: &str) -> crate::Result<(String, String)> {
    let rest = match url.split_once("://") {
        Some((scheme, rest)) => {
            if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
                return Err(Error::UrlScheme { url: url.into() });
            }
            rest
        }
        None => url,
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        return Err(Error::UrlNoHost { url: url.into() });
    }
    if tuna_routing::normalize_host(host).is_none() {
        return Err(Error::UrlHost {
            url: url.into(),
            host: host.into(),
        });
    }
    let path = &rest[end..];
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Ok((host.to_owned(), path))
}

/// What `route explain` explains from: the objects of files or of a cluster.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Ingresses (all classes).
    pub ingresses: Vec<Arc<Ingress>>,
    /// Tunnels (their hosts are not available to Ingresses).
    pub tunnels: Vec<Arc<Tunnel>>,
    /// Domains (they reserve hosts for a namespace).
    pub domains: Vec<Arc<Domain>>,
    /// Services, when they are known (a cluster); files leave backends unchecked.
    pub services: Option<ServiceIndex>,
    /// The Services of `-f` files with Gateway API objects: known, not dialled.
    pub file_services: Option<ServiceIndex>,
    /// The names of the cluster's IngressClasses whose controller is ours.
    pub classes: Vec<String>,
    /// One of them is the cluster's default.
    pub is_default_class: bool,
    /// The edge's base domain as the cluster's Domains show it (`status.fqdn`).
    pub base_domain: Option<String>,
    /// GatewayClasses (all controllers).
    pub gateway_classes: Vec<Arc<GatewayClass>>,
    /// Gateways.
    pub gateways: Vec<Arc<Gateway>>,
    /// HTTPRoutes.
    pub http_routes: Vec<Arc<HttpRoute>>,
    /// ReferenceGrants.
    pub grants: Vec<Arc<ReferenceGrant>>,
    /// Namespaces (their labels, for listeners' namespace selectors).
    pub namespaces: Vec<Arc<Namespace>>,
    /// The agent's claim book (a cluster: the ConfigMap labelled
    /// [`crate::plan::claims::BOOK_LABEL`], when it can be read).
    pub claims: Option<crate::plan::claims::ClaimBook>,
}

impl Snapshot {
    /// Whether Gateway API objects take part.
    pub fn has_gateway_api(&self) -> bool {
        !self.gateway_classes.is_empty()
            || !self.gateways.is_empty()
            || !self.http_routes.is_empty()
    }
}

/// Reads the `-f` files: Ingresses, Tunnels and Domains; other kinds are ignored.
pub fn snapshot_from_files(files: &[PathBuf]) -> crate::Result<Snapshot> {
    let loaded = manifest::load_paths(files);
    if !loaded.errors.is_empty() {
        let list = loaded.errors.iter().map(|e| e.to_string()).collect();
        return Err(Error::ManifestsUnreadable(list));
    }
    let mut snapshot = Snapshot::default();
    let mut problems = Vec::new();
    let mut file_services = Vec::new();
    for object in &loaded.objects {
        let result = match object.kind.as_str() {
            "Ingress" if object.api_version != "networking.k8s.io/v1" => {
                problems.push(format!(
                    "{}: Ingress {}/{} uses {}; only networking.k8s.io/v1 is served",
                    object.source, object.namespace, object.name, object.api_version
                ));
                continue;
            }
            "Ingress" => object
                .parse::<Ingress>()
                .map(|i| snapshot.ingresses.push(Arc::new(i))),
            "Tunnel" if object.is(tuna_crds::GROUP, "Tunnel") => object
                .parse::<Tunnel>()
                .map(|t| snapshot.tunnels.push(Arc::new(t))),
            "Domain" if object.is(tuna_crds::GROUP, "Domain") => object
                .parse::<Domain>()
                .map(|d| snapshot.domains.push(Arc::new(d))),
            "GatewayClass" if object.is(GATEWAY_GROUP, "GatewayClass") => object
                .parse::<GatewayClass>()
                .map(|c| snapshot.gateway_classes.push(Arc::new(c))),
            "Gateway" if object.is(GATEWAY_GROUP, "Gateway") => object
                .parse::<Gateway>()
                .map(|g| snapshot.gateways.push(Arc::new(g))),
            "HTTPRoute" if object.is(GATEWAY_GROUP, "HTTPRoute") => object
                .parse::<HttpRoute>()
                .map(|r| snapshot.http_routes.push(Arc::new(r))),
            "ReferenceGrant" if object.is(GATEWAY_GROUP, "ReferenceGrant") => object
                .parse::<ReferenceGrant>()
                .map(|g| snapshot.grants.push(Arc::new(g))),
            "Namespace" if object.api_version == "v1" => object
                .parse::<Namespace>()
                .map(|n| snapshot.namespaces.push(Arc::new(n))),
            "Service" if object.api_version == "v1" => object
                .parse::<Service>()
                .map(|svc| file_services.push(ServiceInfo::from_service(&svc))),
            _ => continue,
        };
        if let Err(e) = result {
            problems.push(e.to_string());
        }
    }
    if !problems.is_empty() {
        return Err(Error::ManifestsInvalid(problems));
    }
    // Gateway API backendRefs are checked against the Services of the files
    // (without dialling them); Ingress backends stay unchecked, as before.
    if snapshot.has_gateway_api() {
        snapshot.file_services = Some(ServiceIndex::new(file_services));
    }
    Ok(snapshot)
}

/// Loads the manifests (or reads the cluster), plans exactly as the agent does
/// and explains the URL.
pub fn explain(args: &ExplainArgs) -> crate::Result<ExplainReport> {
    split_url(&args.url)?;
    let snapshot = if args.files.is_empty() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        runtime.block_on(read_snapshot(&args.ingress_class))?
    } else {
        snapshot_from_files(&args.files)?
    };
    explain_snapshot(&snapshot, args)
}

/// Reads what `route explain` needs from the current kubeconfig context,
/// read-only: Ingresses, IngressClasses, Tunnels and Domains (list), and the
/// Services they name (get).
async fn read_snapshot(class: &str) -> crate::Result<Snapshot> {
    let client = cluster::client().await.map_err(Error::NoClusterToRead)?;
    let lp = ListParams::default();
    let ingresses = Api::<Ingress>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing Ingresses"))?;
    let classes = Api::<IngressClass>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing IngressClasses"))?;
    let tunnels = Api::<Tunnel>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing Tunnels (are the CRDs installed?)"))?;
    let domains = Api::<Domain>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing Domains (are the CRDs installed?)"))?;
    let options = cluster::ingress_options(&classes.items, class);
    let ingresses: Vec<Arc<Ingress>> = ingresses.items.into_iter().map(Arc::new).collect();
    let tunnels: Vec<Arc<Tunnel>> = tunnels.items.into_iter().map(Arc::new).collect();
    let domains: Vec<Arc<Domain>> = domains.items.into_iter().map(Arc::new).collect();
    let mut services = Vec::new();
    for (namespace, name) in cluster::referenced_services(&ingresses, &tunnels, &options) {
        if let Some(info) = cluster::read_service(&client, &namespace, &name)
            .await
            .map_err(Error::kube(format!("reading Service {namespace}/{name}")))?
        {
            services.push(info);
        }
    }
    let gateway = read_gateway_api(&client).await?;
    let claims = read_claim_book(&client).await;
    let mut known: std::collections::BTreeSet<(String, String)> = services
        .iter()
        .map(|s: &ServiceInfo| (s.namespace.clone(), s.name.clone()))
        .collect();
    for route in &gateway.http_routes {
        let route_ns = route.metadata.namespace.as_deref().unwrap_or("default");
        for rule in route.spec.rules.iter().flatten() {
            for b in rule.backend_refs.iter().flatten() {
                if !b.group.as_deref().unwrap_or("").is_empty()
                    || b.kind.as_deref().unwrap_or("Service") != "Service"
                {
                    continue;
                }
                let namespace = b.namespace.clone().unwrap_or_else(|| route_ns.to_owned());
                if !known.insert((namespace.clone(), b.name.clone())) {
                    continue;
                }
                if let Some(info) = cluster::read_service(&client, &namespace, &b.name)
                    .await
                    .map_err(Error::kube(format!(
                        "reading Service {namespace}/{}",
                        b.name
                    )))?
                {
                    services.push(info);
                }
            }
        }
    }
    Ok(Snapshot {
        base_domain: cluster::base_domain_of(&domains),
        ingresses,
        tunnels,
        domains,
        services: Some(ServiceIndex::new(services)),
        classes: options.also,
        is_default_class: options.is_default_class,
        claims,
        ..gateway
    })
}

/// The agent's claim book, found by its label in any namespace; `None`
/// (with a warning: ownership is then decided as on a first start) when it
/// cannot be listed or there is none.
async fn read_claim_book(client: &kube::Client) -> Option<crate::plan::claims::ClaimBook> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let lp = ListParams::default().labels(&format!("{}=true", crate::plan::claims::BOOK_LABEL));
    match Api::<ConfigMap>::all(client.clone()).list(&lp).await {
        Ok(list) => {
            let cm = list.items.into_iter().next()?;
            Some(crate::plan::claims::ClaimBook::from_data(
                &cm.data.unwrap_or_default(),
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the agent's claim book: hosts are explained as if nothing were recorded");
            None
        }
    }
}

/// Lists the Gateway API objects (none when the CRDs are not installed)
/// and the Namespaces.
async fn read_gateway_api(client: &kube::Client) -> crate::Result<Snapshot> {
    async fn list<K>(client: &kube::Client, what: &str) -> crate::Result<Vec<Arc<K>>>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        match Api::<K>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => Ok(list.items.into_iter().map(Arc::new).collect()),
            // The CRD is not installed: there is nothing of this kind.
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
            Err(e) => Err(Error::kube(format!("listing {what}"))(e)),
        }
    }
    let classes = match Api::<GatewayClass>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items.into_iter().map(Arc::new).collect(),
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(e) => return Err(Error::kube("listing GatewayClasses")(e)),
    };
    if classes.is_empty() {
        return Ok(Snapshot::default());
    }
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing Namespaces"))?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    Ok(Snapshot {
        gateway_classes: classes,
        gateways: list::<Gateway>(client, "Gateways").await?,
        http_routes: list::<HttpRoute>(client, "HTTPRoutes").await?,
        grants: list::<ReferenceGrant>(client, "ReferenceGrants").await?,
        namespaces,
        ..Snapshot::default()
    })
}

/// Explains the URL over `snapshot` (see [`explain`]).
pub fn explain_snapshot(snapshot: &Snapshot, args: &ExplainArgs) -> crate::Result<ExplainReport> {
    let (host, path) = split_url(&args.url)?;
    let base_domain = args
        .base_domain
        .clone()
        .or_else(|| snapshot.base_domain.clone())
        .unwrap_or_else(|| "localhost".to_owned());
    let mut options = PlanOptions::cluster(&base_domain);
    options.ingress = TranslateOptions {
        class: args.ingress_class.clone(),
        also: snapshot.classes.clone(),
        is_default_class: snapshot.is_default_class,
    };
    options.account_hosts = args
        .account_domains
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let empty = ServiceIndex::default();
    let services = match (&snapshot.services, &snapshot.file_services) {
        (Some(index), _) => index,
        (None, Some(index)) => {
            options.backends = Backends::Declared;
            index
        }
        (None, None) => {
            options.backends = Backends::Unchecked;
            &empty
        }
    };
    let inputs = Inputs {
        ingresses: &snapshot.ingresses,
        tunnels: &snapshot.tunnels,
        domains: &snapshot.domains,
        tcp_endpoints: &[],
        gateway: GatewayInputs {
            classes: &snapshot.gateway_classes,
            gateways: &snapshot.gateways,
            http_routes: &snapshot.http_routes,
            // TCP is not explained (no request to match).
            tcp_routes: &[],
            grants: &snapshot.grants,
            namespaces: &snapshot.namespaces,
            certificates: None,
        },
        claims: snapshot.claims.as_ref(),
    };
    let plan = plan(&inputs, services, &options);
    let mut specs: Vec<HostRoute> = plan
        .hosts
        .values()
        .flat_map(|h| h.routes.iter().chain(&h.refused).cloned())
        .collect();
    // A request by IP address reaches only what no hostname restricts.
    let ip_host = tuna_routing::normalize_host(&host).is_some_and(|h| {
        h.trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok()
    });
    if ip_host && let Some(canonical) = tuna_routing::normalize_host(&host) {
        specs.extend(plan.gateway.catch_all.iter().map(|s| {
            let mut s = s.clone();
            s.host = canonical.to_string();
            s
        }));
    }
    let request = explain_request(args)?;
    let (table, _) = RouteTable::build(specs).map_err(Error::RouteTable)?;
    let skipped: Vec<SkippedJson> = plan
        .refusals
        .iter()
        .filter(|r| r.object.kind == Kind::Ingress)
        .map(SkippedJson::from)
        .collect();
    let host_lower = host.to_ascii_lowercase();
    let refused_tunnels: Vec<RefusedTunnelJson> = snapshot
        .tunnels
        .iter()
        .filter(|t| {
            crate::plan::tunnel_host(t, &options.base_domain).as_deref()
                == Some(host_lower.as_str())
        })
        .flat_map(|t| {
            let object = crate::plan::ObjectRef::of(Kind::Tunnel, &t.metadata);
            plan.refusals_of(&object)
                .map(|r| RefusedTunnelJson {
                    namespace: r.object.namespace.clone(),
                    name: r.object.name.clone(),
                    reason: r.reason.as_str().to_owned(),
                    message: r.message.clone(),
                })
                .collect::<Vec<_>>()
        })
        .collect();

    let why = table.explain_request(&host, &path, &request);
    let gateway = snapshot
        .has_gateway_api()
        .then(|| gateway_json(&why, &plan, &host_lower));
    let json = match &why.winner {
        Some(m) => ExplainJson {
            matched: true,
            namespace: Some(m.spec.origin.namespace.clone()),
            ingress: (kind_of(m.spec) == "Ingress").then(|| m.spec.origin.name.clone()),
            host: Some(m.spec.host.clone()),
            path: Some(m.spec.path.clone()),
            path_type: Some(m.spec.path_type.as_str().to_owned()),
            service: m.backend.service.as_ref().map(|s| s.name.clone()),
            port: m.backend.service.as_ref().map(|s| s.port.clone()),
            skipped,
            refused_tunnels,
            gateway,
        },
        None => ExplainJson {
            matched: false,
            namespace: None,
            ingress: None,
            host: None,
            path: None,
            path_type: None,
            service: None,
            port: None,
            skipped,
            refused_tunnels,
            gateway,
        },
    };
    let notes = Notes {
        no_ingress: snapshot.ingresses.is_empty() && !snapshot.has_gateway_api(),
        unchecked_backends: snapshot.services.is_none() && snapshot.file_services.is_none(),
    };
    let text = render_text(&args.url, &why, &json, notes);
    Ok(ExplainReport { json, text })
}

#[derive(Debug, Clone, Copy)]
struct Notes {
    no_ingress: bool,
    unchecked_backends: bool,
}

fn render_text(
    url: &str,
    why: &tuna_routing::Explanation<'_, Backend>,
    json: &ExplainJson,
    notes: Notes,
) -> String {
    let mut out = String::new();
    let host = why.host.as_deref().unwrap_or("?");
    let _ = writeln!(out, "URL:    {url}");
    let selection = match &why.selection {
        HostSelection::Exact(h) => format!("{h} (routes for this exact host)"),
        HostSelection::Wildcard(w) => format!("{host} (routes of wildcard {w})"),
        HostSelection::NoRoutes => format!("{host} (no rule names this host)"),
        HostSelection::InvalidHost => "not a valid host".to_owned(),
    };
    let _ = writeln!(out, "Host:   {selection}");
    let _ = writeln!(
        out,
        "Path:   {}",
        why.path.as_deref().unwrap_or("(cannot be routed)")
    );
    match &why.winner {
        Some(m) if m.backend.url.is_some() => {
            let _ = writeln!(
                out,
                "Result: served by Tunnel {}/{} -> {}",
                m.spec.origin.namespace, m.spec.origin.name, m.backend
            );
        }
        Some(m) if m.backend.gateway.is_some() => {
            let action = m.backend.gateway.as_deref().expect("checked");
            let backends: Vec<String> = action
                .backends
                .iter()
                .map(|b| {
                    format!(
                        "Service {}/{}:{} (weight {})",
                        b.namespace,
                        b.service,
                        b.port.map(|p| p.to_string()).unwrap_or_default(),
                        b.weight
                    )
                })
                .collect();
            let target = if backends.is_empty() {
                let refused: Vec<String> = action
                    .invalid
                    .iter()
                    .map(|b| format!("{}/{} {}", b.namespace, b.name, b.reason))
                    .collect();
                format!("no valid backend, 500 ({})", refused.join(", "))
            } else {
                backends.join(", ")
            };
            let _ = writeln!(
                out,
                "Result: served by HTTPRoute {}/{} rule {} match {} ({} {}) -> {target}",
                m.spec.origin.namespace,
                m.spec.origin.name,
                m.spec.origin.rule,
                m.spec.origin.path,
                m.spec.path_type,
                m.spec.path,
            );
        }
        Some(m) => {
            let _ = writeln!(
                out,
                "Result: served by Ingress {}/{} rule {} path {} ({} {}) -> Service {}",
                m.spec.origin.namespace,
                m.spec.origin.name,
                m.spec.origin.rule,
                m.spec.origin.path,
                m.spec.path_type,
                m.spec.path,
                m.backend
            );
        }
        None => {
            let reason = match why.selection {
                HostSelection::NoRoutes | HostSelection::InvalidHost => "no route for this host",
                _ => "no path of this host matches",
            };
            let _ = writeln!(
                out,
                "Result: no route matches ({reason}): a 404 would be served"
            );
        }
    }
    if !why.candidates.is_empty() {
        let _ = writeln!(out, "\nCandidates:");
        for c in &why.candidates {
            let mark = if c.outcome == Outcome::Selected {
                "*"
            } else {
                "-"
            };
            let _ = writeln!(
                out,
                "  {mark} {}/{} rule {} path {}: {} {}{} -> {}: {}",
                c.spec.origin.namespace,
                c.spec.origin.name,
                c.spec.origin.rule,
                c.spec.origin.path,
                c.spec.path_type,
                c.spec.host,
                c.spec.path,
                c.spec.backend,
                c.outcome
            );
        }
    }
    if !json.skipped.is_empty() {
        let _ = writeln!(out, "\nSkipped:");
        for s in &json.skipped {
            let mut at = format!("{}/{}", s.namespace, s.ingress);
            if let Some(rule) = s.rule {
                let _ = write!(at, " rule {rule}");
            }
            if let Some(path) = s.path {
                let _ = write!(at, " path {path}");
            }
            let _ = writeln!(out, "  - {at}: {}: {}", s.reason, s.message);
        }
    }
    if !json.refused_tunnels.is_empty() {
        let _ = writeln!(out, "\nTunnels refused for this host:");
        for t in &json.refused_tunnels {
            let _ = writeln!(
                out,
                "  - Tunnel {}/{}: {}: {}",
                t.namespace, t.name, t.reason, t.message
            );
        }
    }
    if notes.no_ingress {
        let _ = writeln!(out, "\nNote: there is no Ingress.");
    }
    if notes.unchecked_backends {
        let _ = writeln!(
            out,
            "\nNote: read from files, so backends are not checked against Services (run without -f to read the cluster)."
        );
    }
    out
}
