//! Ingress → route specs.
//!
//! [`translate`] turns the Ingresses a controller (or `route explain`) sees
//! into [`RouteSpec`]s for `tuna-routing`, with everything it could not use
//! listed as [`Skipped`] items carrying a machine-readable [`SkipReason`]
//! (they become `RuleSkipped` / `BackendSkipped` events). One bad rule, path
//! or backend never discards the rest of its Ingress.
//!
//! Decisions (see also the crate docs of `tuna-routing` for matching):
//!
//! - **Class.** An Ingress is ours when `spec.ingressClassName` equals the
//!   configured class (default `tuna`), or, when that field is unset, when
//!   the legacy annotation `kubernetes.io/ingress.class` does. The field wins
//!   over the annotation. Ingresses without either are not ours (we do not
//!   act as the cluster's default IngressClass).
//! - **Rules** without a host, and rules with a wildcard host, are skipped:
//!   a tunnel publishes one reserved host. A rule with a host but no `http`
//!   section is skipped too (it routes nothing).
//! - **Paths.** A missing path is `/`; `pathType` must be `Exact`, `Prefix`
//!   or `ImplementationSpecific` (treated as Prefix). Path syntax is checked
//!   by `RouteTable::build`, which reports bad ones as build issues.
//! - **Backends.** Only Service backends; `resource` backends are skipped.
//!   The Service port is kept as a reference (name or number): resolving it
//!   to addresses happens later, where Services are read.
//! - **`spec.defaultBackend` is not routed** and is reported as skipped: tuna
//!   routes reserved hosts, and a host-less catch-all has no host to publish
//!   on. Requests that match no path get a 404 rather than going to a
//!   backend no rule names. Add a `Prefix /` path to a rule instead.
//! - **Several Ingresses on one host** merge into one table when they are in
//!   one namespace (equal rules go to the oldest; see `tuna-routing`). A host
//!   belongs to one namespace only: the namespace of the Domain that reserves
//!   it, else the one the agent recorded as its holder, else that of its
//!   first claimant of any kind ([`super::claims`]); rules of other
//!   namespaces for that host are skipped (`HostOwnedByOtherNamespace`), so
//!   no tenant can hijack another's host, not even by adding it to an older
//!   Ingress.
//! - **Tie-break time.** An Ingress without `metadata.creationTimestamp` (a
//!   manifest not yet applied) counts as newer than any that has one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::networking::v1::{HTTPIngressPath, Ingress, IngressBackend};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use tuna_routing::{Origin, PathType, RouteSpec, TieBreak};

use super::claims::{Claim, Owner, Strength};

/// The class name this controller answers to unless configured otherwise.
pub const DEFAULT_INGRESS_CLASS: &str = "tuna";

/// The pre-`ingressClassName` way of choosing a controller.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// A Service port as an Ingress names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(untagged)]
pub enum ServicePort {
    /// `port.number`.
    Number(i32),
    /// `port.name`, resolved against the Service's ports later.
    Name(String),
}

impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Name(n) => f.write_str(n),
        }
    }
}

/// The backend of an Ingress route: a Service of the Ingress's namespace and
/// a port reference. Not resolved to addresses here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ServiceRef {
    /// Always the Ingress's namespace (Ingress cannot name another).
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// Port name or number.
    pub port: ServicePort,
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

/// What a skipped item was: it decides the event it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SkipKind {
    /// A whole Ingress (another class).
    Ingress,
    /// A rule or one path of a rule (`RuleSkipped`).
    Rule,
    /// A backend (`BackendSkipped`).
    Backend,
}

/// Why something was skipped. The variant name is the machine-readable
/// reason (`as_str`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SkipReason {
    /// The Ingress names another class (or none).
    OtherIngressClass,
    /// The rule has no host.
    RuleWithoutHost,
    /// The rule's host is a wildcard.
    WildcardHost,
    /// The rule has a host but no `http` paths.
    RuleWithoutPaths,
    /// `pathType` is missing or not one of the three known values.
    InvalidPathType,
    /// The backend is a `resource` reference, not a Service.
    ResourceBackend,
    /// The backend names neither a Service nor a resource.
    MissingBackend,
    /// The Service backend has no port.
    MissingServicePort,
    /// The Service port sets both or neither of name and number, or the
    /// number is outside 1–65535.
    InvalidServicePort,
    /// `spec.defaultBackend` is not routed (see the module docs).
    DefaultBackendIgnored,
    /// The host belongs to another namespace (Domain or older Ingress).
    HostOwnedByOtherNamespace,
}

impl SkipReason {
    /// Stable machine-readable name.
    ///
    /// ```
    /// use tuna_operator::plan::ingress::SkipReason;
    /// assert_eq!(SkipReason::WildcardHost.as_str(), "WildcardHost");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OtherIngressClass => "OtherIngressClass",
            Self::RuleWithoutHost => "RuleWithoutHost",
            Self::WildcardHost => "WildcardHost",
            Self::RuleWithoutPaths => "RuleWithoutPaths",
            Self::InvalidPathType => "InvalidPathType",
            Self::ResourceBackend => "ResourceBackend",
            Self::MissingBackend => "MissingBackend",
            Self::MissingServicePort => "MissingServicePort",
            Self::InvalidServicePort => "InvalidServicePort",
            Self::DefaultBackendIgnored => "DefaultBackendIgnored",
            Self::HostOwnedByOtherNamespace => "HostOwnedByOtherNamespace",
        }
    }

    /// The kind of item this reason applies to.
    ///
    /// ```
    /// use tuna_operator::plan::ingress::{SkipKind, SkipReason};
    /// assert_eq!(SkipReason::ResourceBackend.kind(), SkipKind::Backend);
    /// ```
    pub fn kind(self) -> SkipKind {
        match self {
            Self::OtherIngressClass => SkipKind::Ingress,
            Self::RuleWithoutHost
            | Self::WildcardHost
            | Self::RuleWithoutPaths
            | Self::InvalidPathType
            | Self::HostOwnedByOtherNamespace => SkipKind::Rule,
            Self::ResourceBackend
            | Self::MissingBackend
            | Self::MissingServicePort
            | Self::InvalidServicePort
            | Self::DefaultBackendIgnored => SkipKind::Backend,
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing that was not turned into a route, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Machine-readable reason.
    pub reason: SkipReason,
    /// Namespace of the Ingress.
    pub namespace: String,
    /// Name of the Ingress.
    pub ingress: String,
    /// Index in `spec.rules`, when the item is a rule or inside one.
    pub rule: Option<usize>,
    /// Index in the rule's `http.paths`, when the item is a path.
    pub path: Option<usize>,
    /// What a user should read.
    pub message: String,
}

impl Skipped {
    /// The Kubernetes event reason this becomes on the Ingress.
    pub fn event_reason(&self) -> &'static str {
        match self.reason.kind() {
            SkipKind::Backend => "BackendSkipped",
            SkipKind::Rule | SkipKind::Ingress => "RuleSkipped",
        }
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.ingress)?;
        if let Some(rule) = self.rule {
            write!(f, " rule {rule}")?;
        }
        if let Some(path) = self.path {
            write!(f, " path {path}")?;
        }
        write!(f, ": {}: {}", self.reason, self.message)
    }
}

/// Translation settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslateOptions {
    /// The IngressClass name this controller answers to.
    pub class: String,
    /// Other IngressClass names that are ours too (every IngressClass whose
    /// `spec.controller` is `k8s.tuna.am/ingress-controller`).
    pub also: Vec<String>,
    /// That IngressClass is the cluster's default
    /// (`ingressclass.kubernetes.io/is-default-class: "true"`): an Ingress with
    /// neither `ingressClassName` nor the legacy annotation is ours too. The
    /// `DefaultIngressClass` admission plugin fills the field only on create, so
    /// Ingresses created before the class became the default have none.
    pub is_default_class: bool,
}

impl Default for TranslateOptions {
    fn default() -> Self {
        Self {
            class: DEFAULT_INGRESS_CLASS.to_owned(),
            also: Vec::new(),
            is_default_class: false,
        }
    }
}

impl TranslateOptions {
    /// Options for `class` (not the default class).
    pub fn for_class(class: impl Into<String>) -> Self {
        Self {
            class: class.into(),
            also: Vec::new(),
            is_default_class: false,
        }
    }

    /// Whether these options make `ingress` ours (see [`is_our_class`]).
    pub fn serves(&self, ingress: &Ingress) -> bool {
        if is_our_class(ingress, &self.class) || self.also.iter().any(|c| is_our_class(ingress, c))
        {
            return true;
        }
        let unclassed = ingress
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.as_deref())
            .is_none()
            && !ingress
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(LEGACY_CLASS_ANNOTATION));
        self.is_default_class && unclassed
    }
}

/// Routes and skipped items of a set of Ingresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngressRoutes {
    /// Route specs, in Ingress / rule / path order.
    pub specs: Vec<RouteSpec<ServiceRef>>,
    /// What could not be used, in the same order.
    pub skipped: Vec<Skipped>,
}

fn namespace_of(ingress: &Ingress) -> &str {
    ingress.metadata.namespace.as_deref().unwrap_or("default")
}

fn name_of(ingress: &Ingress) -> &str {
    ingress.metadata.name.as_deref().unwrap_or("")
}

fn tie_break_of(ingress: &Ingress) -> TieBreak {
    TieBreak {
        created: ingress
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        namespace: namespace_of(ingress).to_owned(),
        name: name_of(ingress).to_owned(),
    }
}

/// Whether this controller serves the Ingress (see the module docs).
///
/// ```
/// use k8s_openapi::api::networking::v1::{Ingress, IngressSpec};
/// use tuna_operator::plan::ingress::is_our_class;
///
/// let mut ing = Ingress::default();
/// assert!(!is_our_class(&ing, "tuna"));
/// ing.spec = Some(IngressSpec { ingress_class_name: Some("tuna".into()), ..Default::default() });
/// assert!(is_our_class(&ing, "tuna"));
/// assert!(!is_our_class(&ing, "nginx"));
/// ```
pub fn is_our_class(ingress: &Ingress, class: &str) -> bool {
    match ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
    {
        Some(name) => name == class,
        None => ingress
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
            .is_some_and(|name| name == class),
    }
}

/// Translates one Ingress, without host-ownership checks (see
/// [`translate`] for a set). An Ingress of another class yields no specs and
/// one `OtherIngressClass` item.
///
/// ```
/// use k8s_openapi::api::networking::v1::Ingress;
/// use tuna_operator::plan::ingress::{translate_one, SkipReason, TranslateOptions};
///
/// let ingress: Ingress = serde_json::from_value(serde_json::json!({
///     "metadata": {"name": "web", "namespace": "shop"},
///     "spec": {"ingressClassName": "tuna", "rules": [
///         {"host": "shop.example.com", "http": {"paths": [
///             {"path": "/api", "pathType": "Prefix",
///              "backend": {"service": {"name": "api", "port": {"name": "http"}}}}]}},
///         {"http": {"paths": []}}
///     ]}
/// })).unwrap();
/// let out = translate_one(&ingress, &TranslateOptions::default());
/// assert_eq!(out.specs[0].backend.to_string(), "shop/api:http");
/// assert_eq!(out.skipped[0].reason, SkipReason::RuleWithoutHost);
/// assert_eq!(out.skipped[0].event_reason(), "RuleSkipped");
/// ```
pub fn translate_one(ingress: &Ingress, options: &TranslateOptions) -> IngressRoutes {
    let namespace = namespace_of(ingress);
    let name = name_of(ingress);
    let mut out = IngressRoutes::default();
    let skip =
        |reason: SkipReason, rule: Option<usize>, path: Option<usize>, message: String| Skipped {
            reason,
            namespace: namespace.to_owned(),
            ingress: name.to_owned(),
            rule,
            path,
            message,
        };
    if !options.serves(ingress) {
        let named = ingress
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.clone())
            .or_else(|| {
                ingress
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION).cloned())
            });
        let message = match named {
            Some(class) => format!("class is {class:?}, not {:?}", options.class),
            None => format!(
                "no ingressClassName (or {LEGACY_CLASS_ANNOTATION} annotation) naming {:?}",
                options.class
            ),
        };
        out.skipped
            .push(skip(SkipReason::OtherIngressClass, None, None, message));
        return out;
    }
    let Some(spec) = ingress.spec.as_ref() else {
        return out;
    };
    if spec.default_backend.is_some() {
        out.skipped.push(skip(
            SkipReason::DefaultBackendIgnored,
            None,
            None,
            "spec.defaultBackend is not routed; add a Prefix / path to each rule instead".into(),
        ));
    }
    let tie_break = tie_break_of(ingress);
    for (rule_index, rule) in spec.rules.iter().flatten().enumerate() {
        let host = rule.host.as_deref().unwrap_or("");
        if host.is_empty() {
            out.skipped.push(skip(
                SkipReason::RuleWithoutHost,
                Some(rule_index),
                None,
                "rules without a host are not published; set a reserved host".into(),
            ));
            continue;
        }
        if host.contains('*') {
            out.skipped.push(skip(
                SkipReason::WildcardHost,
                Some(rule_index),
                None,
                format!("wildcard host {host:?} is not published; name each host"),
            ));
            continue;
        }
        let Some(http) = rule.http.as_ref() else {
            out.skipped.push(skip(
                SkipReason::RuleWithoutPaths,
                Some(rule_index),
                None,
                format!("rule for {host} has no http paths"),
            ));
            continue;
        };
        for (path_index, path) in http.paths.iter().enumerate() {
            let origin = Origin {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                rule: rule_index,
                path: path_index,
            };
            match translate_path(path, namespace) {
                Ok((path_type, service)) => out.specs.push(RouteSpec {
                    host: host.to_owned(),
                    path: path.path.clone().unwrap_or_else(|| "/".to_owned()),
                    path_type,
                    backend: service,
                    origin,
                    tie_break: tie_break.clone(),
                    matcher: tuna_routing::Matcher::Ingress,
                }),
                Err((reason, message)) => {
                    out.skipped
                        .push(skip(reason, Some(rule_index), Some(path_index), message))
                }
            }
        }
    }
    out
}

/// The names of the Services the routable paths of `ingress` name (in its
/// namespace), without translating it: what a caller reads before planning,
/// so that the plan's one translation finds them. A path the translation
/// then skips (a bad port, an unknown path type) may still be named here.
///
/// ```
/// use tuna_operator::plan::ingress::{service_names, TranslateOptions};
///
/// let ingress = serde_saphyr::from_str(r#"
/// metadata: {name: web, namespace: shop}
/// spec:
///   ingressClassName: tuna
///   rules:
///   - host: shop.example.com
///     http:
///       paths:
///       - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
///   - http:
///       paths:
///       - {path: /, pathType: Prefix, backend: {service: {name: unhosted, port: {number: 80}}}}
/// "#)
/// .unwrap();
/// let names: Vec<String> = service_names(&ingress, &TranslateOptions::default()).into_iter().collect();
/// assert_eq!(names, ["web"]);
/// ```
pub fn service_names(ingress: &Ingress, options: &TranslateOptions) -> BTreeSet<String> {
    if !options.serves(ingress) {
        return BTreeSet::new();
    }
    ingress
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .filter(|r| {
            r.host
                .as_deref()
                .is_some_and(|h| !h.is_empty() && !h.contains('*'))
        })
        .flat_map(|r| r.http.iter().flat_map(|h| &h.paths))
        .filter_map(|p| p.backend.service.as_ref().map(|s| s.name.clone()))
        .collect()
}

fn translate_path(
    path: &HTTPIngressPath,
    namespace: &str,
) -> Result<(PathType, ServiceRef), (SkipReason, String)> {
    let path_type: PathType = path
        .path_type
        .parse()
        .map_err(|message: String| (SkipReason::InvalidPathType, message))?;
    let service = service_ref(&path.backend, namespace)?;
    Ok((path_type, service))
}

fn service_ref(
    backend: &IngressBackend,
    namespace: &str,
) -> Result<ServiceRef, (SkipReason, String)> {
    let Some(service) = backend.service.as_ref() else {
        return Err(match &backend.resource {
            Some(resource) => (
                SkipReason::ResourceBackend,
                format!(
                    "backend is a {} resource {:?}; only Service backends are routed",
                    resource.kind, resource.name
                ),
            ),
            None => (
                SkipReason::MissingBackend,
                "backend names no Service".into(),
            ),
        });
    };
    let port = match service.port.as_ref() {
        None => {
            return Err((
                SkipReason::MissingServicePort,
                format!("Service {:?} backend has no port", service.name),
            ));
        }
        Some(port) => match (port.name.as_deref(), port.number) {
            (Some(name), None) if !name.is_empty() => ServicePort::Name(name.to_owned()),
            (None, Some(number)) if (1..=65535).contains(&number) => ServicePort::Number(number),
            _ => {
                return Err((
                    SkipReason::InvalidServicePort,
                    format!(
                        "Service {:?} backend port must set exactly one of name and number (1-65535)",
                        service.name
                    ),
                ));
            }
        },
    };
    Ok(ServiceRef {
        namespace: namespace.to_owned(),
        name: service.name.clone(),
        port,
    })
}

/// Translates a set of Ingresses into one set of route specs, as the
/// controller builds its table: each Ingress via [`translate_one`], then host
/// ownership ([`super::claims::settle`] with no other claimants and nothing
/// recorded). `domain_owners` maps hosts reserved by a Domain to the Domain's
/// namespace; other hosts belong to the namespace of their first claimant.
///
/// ```
/// use std::collections::BTreeMap;
/// use tuna_operator::plan::ingress::{translate, TranslateOptions};
///
/// let routes = translate(&[], &TranslateOptions::default(), &BTreeMap::new());
/// assert!(routes.specs.is_empty() && routes.skipped.is_empty());
/// ```
pub fn translate<'a>(
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    options: &TranslateOptions,
    domain_owners: &BTreeMap<String, String>,
) -> IngressRoutes {
    let all = translate_each(ingresses, options);
    let claims = host_claims(&all.specs);
    let owners = super::claims::settle(&claims, domain_owners, &BTreeMap::new());
    keep_owned(all, &owners)
}

/// Each Ingress via [`translate_one`], concatenated; no ownership settled yet.
pub fn translate_each<'a>(
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    options: &TranslateOptions,
) -> IngressRoutes {
    let mut all = IngressRoutes::default();
    for ingress in ingresses {
        let one = translate_one(ingress, options);
        all.specs.extend(one.specs);
        all.skipped.extend(one.skipped);
    }
    all
}

/// The annotation in which agents before 0.x recorded, on an Ingress or a
/// Tunnel, when the object first served each of its hosts (a JSON object,
/// host → RFC 3339 time). It is no longer trusted for ownership: a tenant,
/// or any controller that may write `ingresses/status`, can set it. The agent
/// reads it once, when it finds no claim book, to carry the holders it
/// recorded over ([`super::claims::ClaimBook`]); the plan never reads it.
pub const HOSTS_CLAIMED_AT: &str = "k8s.tuna.am/hosts-claimed-at";

/// The legacy recorded claim times of an object (Unix seconds by lower-case
/// host; see [`HOSTS_CLAIMED_AT`]); entries that do not parse are left out.
pub fn recorded_claims(meta: &ObjectMeta) -> BTreeMap<String, i64> {
    let Some(raw) = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(HOSTS_CLAIMED_AT))
    else {
        return BTreeMap::new();
    };
    let Ok(map) = serde_json::from_str::<BTreeMap<String, String>>(raw) else {
        return BTreeMap::new();
    };
    map.into_iter()
        .filter_map(|(host, at)| {
            let at = at.parse::<k8s_openapi::jiff::Timestamp>().ok()?;
            Some((
                host.trim_end_matches('.').to_ascii_lowercase(),
                at.as_second(),
            ))
        })
        .collect()
}

/// The explicit claims the route specs of Ingresses make on their hosts
/// ([`super::claims`]), one per Ingress and host. The plan counts only those
/// on reserved hosts: a claim on a host nobody reserved is refused anyway and
/// must not block anyone.
pub fn host_claims<'a>(specs: impl IntoIterator<Item = &'a RouteSpec<ServiceRef>>) -> Vec<Claim> {
    let mut seen: BTreeSet<(String, &str, &str)> = BTreeSet::new();
    let mut out = Vec::new();
    for spec in specs {
        let host = spec.host.to_ascii_lowercase();
        if seen.insert((host.clone(), &spec.origin.namespace, &spec.origin.name)) {
            out.push(Claim::new(
                host,
                spec.origin.namespace.clone(),
                format!("Ingress/{}", spec.origin.name),
                spec.tie_break.created,
                Strength::Explicit,
            ));
        }
    }
    out
}

/// Skips the routes on hosts another namespace holds (`owners`, settled by
/// [`super::claims::settle`] over the claims of every kind):
/// `HostOwnedByOtherNamespace`.
pub fn keep_owned(mut all: IngressRoutes, owners: &BTreeMap<String, Owner>) -> IngressRoutes {
    let mut kept = Vec::with_capacity(all.specs.len());
    for spec in all.specs {
        match owners.get(&spec.host.to_ascii_lowercase()) {
            Some(owner) if owner.namespace != spec.origin.namespace => {
                all.skipped.push(Skipped {
                    reason: SkipReason::HostOwnedByOtherNamespace,
                    namespace: spec.origin.namespace.clone(),
                    ingress: spec.origin.name.clone(),
                    rule: Some(spec.origin.rule),
                    path: Some(spec.origin.path),
                    message: format!(
                        "host {} belongs to namespace {:?}, {}",
                        spec.host,
                        owner.namespace,
                        owner.why()
                    ),
                });
            }
            _ => kept.push(spec),
        }
    }
    all.specs = kept;
    all
}

/// The hosts an Ingress has rules for (lower case; no wildcards).
pub fn rule_hosts(ingress: &Ingress) -> std::collections::BTreeSet<String> {
    ingress
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .filter_map(|r| r.host.as_deref())
        .filter(|h| !h.is_empty() && !h.starts_with('*'))
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds an Ingress from YAML, as users write them.
    fn ingress(yaml: &str) -> Ingress {
        serde_saphyr::from_str(yaml).expect("test manifest")
    }

    const MIXED: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  creationTimestamp: "2024-01-02T03:04:05Z"
spec:
  ingressClassName: tuna
  defaultBackend:
    service: {name: fallback, port: {number: 80}}
  rules:
    - http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: nohost, port: {number: 80}}}}
    - host: "*.example.com"
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: wild, port: {number: 80}}}}
    - host: shop.example.com
      http:
        paths:
          - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {name: http}}}}
          - {path: /img, pathType: Prefix, backend: {resource: {apiGroup: k8s.example.com, kind: Bucket, name: images}}}
          - {path: /x, pathType: Regex, backend: {service: {name: x, port: {number: 80}}}}
          - {pathType: ImplementationSpecific, backend: {service: {name: root, port: {number: 8080}}}}
          - {path: /noport, pathType: Exact, backend: {service: {name: noport}}}
          - {path: /both, pathType: Exact, backend: {service: {name: both, port: {name: http, number: 80}}}}
          - {path: /big, pathType: Exact, backend: {service: {name: big, port: {number: 70000}}}}
    - host: empty.example.com
"#;

    #[test]
    fn one_bad_rule_never_discards_the_rest() {
        let out = translate_one(&ingress(MIXED), &TranslateOptions::default());
        let specs: Vec<(String, String, PathType, String)> = out
            .specs
            .iter()
            .map(|s| {
                (
                    s.host.clone(),
                    s.path.clone(),
                    s.path_type,
                    s.backend.to_string(),
                )
            })
            .collect();
        assert_eq!(
            specs,
            [
                (
                    "shop.example.com".into(),
                    "/api".into(),
                    PathType::Prefix,
                    "shop/api:http".into()
                ),
                (
                    "shop.example.com".into(),
                    "/".into(),
                    PathType::ImplementationSpecific,
                    "shop/root:8080".into()
                ),
            ]
        );
        let reasons: Vec<(SkipReason, Option<usize>, Option<usize>)> = out
            .skipped
            .iter()
            .map(|s| (s.reason, s.rule, s.path))
            .collect();
        assert_eq!(
            reasons,
            [
                (SkipReason::DefaultBackendIgnored, None, None),
                (SkipReason::RuleWithoutHost, Some(0), None),
                (SkipReason::WildcardHost, Some(1), None),
                (SkipReason::ResourceBackend, Some(2), Some(1)),
                (SkipReason::InvalidPathType, Some(2), Some(2)),
                (SkipReason::MissingServicePort, Some(2), Some(4)),
                (SkipReason::InvalidServicePort, Some(2), Some(5)),
                (SkipReason::InvalidServicePort, Some(2), Some(6)),
                (SkipReason::RuleWithoutPaths, Some(3), None),
            ]
        );
        let events: Vec<&str> = out.skipped.iter().map(Skipped::event_reason).collect();
        assert_eq!(
            events[..4],
            [
                "BackendSkipped",
                "RuleSkipped",
                "RuleSkipped",
                "BackendSkipped"
            ]
        );
        let spec = &out.specs[0];
        assert_eq!(
            spec.origin,
            Origin {
                namespace: "shop".into(),
                name: "web".into(),
                rule: 2,
                path: 0
            }
        );
        assert_eq!(spec.tie_break.created, 1_704_164_645);
    }

    #[test]
    fn class_selection() {
        let with = |class: &str, annotation: &str| {
            let mut yaml = String::from("metadata:\n  name: a\n");
            if !annotation.is_empty() {
                yaml.push_str(&format!(
                    "  annotations:\n    kubernetes.io/ingress.class: {annotation}\n"
                ));
            }
            yaml.push_str("spec:\n");
            if !class.is_empty() {
                yaml.push_str(&format!("  ingressClassName: {class}\n"));
            }
            yaml.push_str("  rules: [{host: a.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: s, port: {number: 1}}}}]}}]\n");
            ingress(&yaml)
        };
        let cases = [
            ("tuna", "", "tuna", true),
            ("", "tuna", "tuna", true),
            ("nginx", "tuna", "tuna", false),
            ("tuna", "nginx", "tuna", true),
            ("", "", "tuna", false),
            ("", "nginx", "tuna", false),
            ("edge", "", "edge", true),
            ("tuna", "", "edge", false),
        ];
        for (class, annotation, ours, want) in cases {
            let ing = with(class, annotation);
            assert_eq!(
                is_our_class(&ing, ours),
                want,
                "class {class:?} annotation {annotation:?} ours {ours:?}"
            );
            let out = translate_one(&ing, &TranslateOptions::for_class(ours));
            assert_eq!(out.specs.len(), usize::from(want));
            if !want {
                assert_eq!(out.skipped[0].reason, SkipReason::OtherIngressClass);
                assert_eq!(out.skipped[0].reason.kind(), SkipKind::Ingress);
            }
        }
    }

    fn simple(namespace: &str, name: &str, created: &str, host: &str, path: &str) -> Ingress {
        ingress(&format!(
            "metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: \"{created}\"}}\n\
             spec:\n  ingressClassName: tuna\n  rules: [{{host: {host}, http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{service: {{name: {name}, port: {{number: 80}}}}}}}}]}}}}]\n"
        ))
    }

    #[test]
    fn a_host_belongs_to_one_namespace() {
        let ingresses = [
            simple(
                "team-b",
                "late",
                "2024-02-01T00:00:00Z",
                "a.example.com",
                "/b",
            ),
            simple(
                "team-a",
                "early",
                "2024-01-01T00:00:00Z",
                "a.example.com",
                "/a",
            ),
            simple(
                "team-a",
                "second",
                "2024-03-01T00:00:00Z",
                "a.example.com",
                "/c",
            ),
            simple(
                "team-b",
                "own",
                "2024-03-01T00:00:00Z",
                "b.example.com",
                "/",
            ),
        ];
        let out = translate(&ingresses, &TranslateOptions::default(), &BTreeMap::new());
        let kept: Vec<&str> = out.specs.iter().map(|s| s.origin.name.as_str()).collect();
        assert_eq!(kept, ["early", "second", "own"]);
        assert_eq!(out.skipped.len(), 1);
        assert_eq!(out.skipped[0].reason, SkipReason::HostOwnedByOtherNamespace);
        assert_eq!(out.skipped[0].ingress, "late");

        // A Domain reservation decides ownership over Ingress age.
        let owners = BTreeMap::from([("a.example.com".to_string(), "team-b".to_string())]);
        let out = translate(&ingresses, &TranslateOptions::default(), &owners);
        let kept: Vec<&str> = out.specs.iter().map(|s| s.origin.name.as_str()).collect();
        assert_eq!(kept, ["late", "own"]);
    }

    #[test]
    fn missing_creation_timestamp_counts_as_newest() {
        let mut without = simple("ns", "a", "2024-01-01T00:00:00Z", "a.example.com", "/");
        without.metadata.creation_timestamp = None;
        let out = translate_one(&without, &TranslateOptions::default());
        assert_eq!(out.specs[0].tie_break.created, i64::MAX);
    }
}
