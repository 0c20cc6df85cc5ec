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

use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, ListParams};
use serde::Serialize;
use tuna_crds::{Domain, Tunnel};
use tuna_routing::{HostSelection, Outcome, RouteTable};

use crate::plan::ingress::{DEFAULT_INGRESS_CLASS, ServicePort, SkipKind, TranslateOptions};
use crate::plan::service::ServiceIndex;
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
    /// The names of the cluster's IngressClasses whose controller is ours.
    pub classes: Vec<String>,
    /// One of them is the cluster's default.
    pub is_default_class: bool,
    /// The edge's base domain as the cluster's Domains show it (`status.fqdn`).
    pub base_domain: Option<String>,
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
            _ => continue,
        };
        if let Err(e) = result {
            problems.push(e.to_string());
        }
    }
    if !problems.is_empty() {
        return Err(Error::ManifestsInvalid(problems));
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
    Ok(Snapshot {
        base_domain: cluster::base_domain_of(&domains),
        ingresses,
        tunnels,
        domains,
        services: Some(ServiceIndex::new(services)),
        classes: options.also,
        is_default_class: options.is_default_class,
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
    let services = match &snapshot.services {
        Some(index) => index,
        None => {
            options.backends = Backends::Unchecked;
            &empty
        }
    };
    let inputs = Inputs {
        ingresses: &snapshot.ingresses,
        tunnels: &snapshot.tunnels,
        domains: &snapshot.domains,
        tcp_endpoints: &[],
        gateway: Default::default(),
    };
    let plan = plan(&inputs, services, &options);
    let specs: Vec<HostRoute> = plan
        .hosts
        .values()
        .flat_map(|h| h.routes.iter().chain(&h.refused).cloned())
        .collect();
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

    let why = table.explain(&host, &path);
    let json = match &why.winner {
        Some(m) => ExplainJson {
            matched: true,
            namespace: Some(m.spec.origin.namespace.clone()),
            ingress: m.backend.url.is_none().then(|| m.spec.origin.name.clone()),
            host: Some(m.spec.host.clone()),
            path: Some(m.spec.path.clone()),
            path_type: Some(m.spec.path_type.as_str().to_owned()),
            service: m.backend.service.as_ref().map(|s| s.name.clone()),
            port: m.backend.service.as_ref().map(|s| s.port.clone()),
            skipped,
            refused_tunnels,
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
        },
    };
    let notes = Notes {
        no_ingress: snapshot.ingresses.is_empty(),
        unchecked_backends: snapshot.services.is_none(),
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
