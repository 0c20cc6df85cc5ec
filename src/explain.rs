//! `tuna-operator route explain`: which Ingress rule and Service serve a URL,
//! and why every other candidate lost.
//!
//! It loads manifests with [`crate::manifest`], translates Ingresses with
//! [`crate::translate::ingress::translate`] and builds a
//! [`tuna_routing::RouteTable`] exactly as the running controller does, then
//! asks the table to explain the URL. The exit code is 0 whether or not a
//! route matches; unreadable or invalid input is an error.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use k8s_openapi::api::networking::v1::Ingress;
use serde::Serialize;
use tuna_routing::{BuildIssue, HostSelection, Outcome, RouteTable};

use crate::manifest;
use crate::translate::ingress::{
    DEFAULT_INGRESS_CLASS, ServicePort, ServiceRef, SkipKind, Skipped, TranslateOptions, translate,
};

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
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE_OR_DIR",
        required = true
    )]
    pub files: Vec<PathBuf>,
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
pub fn run(cmd: RouteCommand) -> anyhow::Result<()> {
    match cmd {
        RouteCommand::Explain(args) => {
            let report = explain(&args)?;
            match args.output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report.json)?),
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

impl From<&Skipped> for SkippedJson {
    fn from(s: &Skipped) -> Self {
        Self {
            kind: s.reason.kind(),
            reason: s.reason.as_str().to_owned(),
            namespace: s.namespace.clone(),
            ingress: s.ingress.clone(),
            rule: s.rule,
            path: s.path,
            message: s.message.clone(),
        }
    }
}

impl From<&BuildIssue> for SkippedJson {
    fn from(issue: &BuildIssue) -> Self {
        let origin = issue.origin();
        let message = match issue {
            BuildIssue::InvalidHost { host, reason, .. } => format!("host {host:?}: {reason}"),
            BuildIssue::InvalidPath { path, reason, .. } => format!("path {path:?}: {reason}"),
            BuildIssue::Conflict {
                winner,
                host,
                path,
                path_type,
                ..
            } => {
                format!(
                    "{path_type} {host}{path} is also defined by {winner}, which wins (older, then by namespace/name)"
                )
            }
        };
        Self {
            kind: SkipKind::Rule,
            reason: issue.reason().to_owned(),
            namespace: origin.namespace.clone(),
            ingress: origin.name.clone(),
            rule: Some(origin.rule),
            path: Some(origin.path),
            message,
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
pub fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let rest = match url.split_once("://") {
        Some((scheme, rest)) => {
            if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
                bail!("URL {url:?}: only http and https URLs are routed");
            }
            rest
        }
        None => url,
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        bail!("URL {url:?} has no host");
    }
    if tuna_routing::normalize_host(host).is_none() {
        bail!("URL {url:?}: {host:?} is not a valid host[:port]");
    }
    let path = &rest[end..];
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Ok((host.to_owned(), path))
}

/// Loads the manifests, builds the table and explains the URL.
pub fn explain(args: &ExplainArgs) -> anyhow::Result<ExplainReport> {
    let (host, path) = split_url(&args.url)?;
    let loaded = manifest::load_paths(&args.files);
    if !loaded.errors.is_empty() {
        let list: Vec<String> = loaded.errors.iter().map(|e| format!("  {e}")).collect();
        bail!("cannot read the manifests:\n{}", list.join("\n"));
    }
    let mut ingresses = Vec::new();
    let mut problems = Vec::new();
    for object in loaded.objects.iter().filter(|o| o.kind == "Ingress") {
        if object.api_version != "networking.k8s.io/v1" {
            problems.push(format!(
                "  {}: Ingress {}/{} uses {}; only networking.k8s.io/v1 is served",
                object.source, object.namespace, object.name, object.api_version
            ));
            continue;
        }
        match object.parse::<Ingress>() {
            Ok(ingress) => ingresses.push(ingress),
            Err(e) => problems.push(format!("  {e}")),
        }
    }
    if !problems.is_empty() {
        bail!("invalid Ingress manifests:\n{}", problems.join("\n"));
    }
    let options = TranslateOptions {
        class: args.ingress_class.clone(),
    };
    let routes = translate(&ingresses, &options, &BTreeMap::new());
    let (table, issues) = RouteTable::build(routes.specs).context("building the route table")?;
    let mut skipped: Vec<SkippedJson> = routes.skipped.iter().map(SkippedJson::from).collect();
    skipped.extend(issues.iter().map(SkippedJson::from));

    let why = table.explain(&host, &path);
    let json = match why.winner {
        Some(m) => ExplainJson {
            matched: true,
            namespace: Some(m.spec.origin.namespace.clone()),
            ingress: Some(m.spec.origin.name.clone()),
            host: Some(m.spec.host.clone()),
            path: Some(m.spec.path.clone()),
            path_type: Some(m.spec.path_type.as_str().to_owned()),
            service: Some(m.backend.name.clone()),
            port: Some(m.backend.port.clone()),
            skipped,
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
        },
    };
    let text = render_text(&args.url, &ingresses, &why, &json);
    Ok(ExplainReport { json, text })
}

fn render_text(
    url: &str,
    ingresses: &[Ingress],
    why: &tuna_routing::Explanation<'_, ServiceRef>,
    json: &ExplainJson,
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
    match why.winner {
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
    if ingresses.is_empty() {
        let _ = writeln!(out, "\nNote: the manifests contain no Ingress.");
    }
    out
}
