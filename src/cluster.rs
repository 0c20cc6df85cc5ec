//! Reading the Kubernetes API: the client, Services (with `get` only), and the
//! snapshot `route explain` explains without `-f`.
//!
//! The client follows kube-rs's standard resolution: `KUBECONFIG` (or
//! `~/.kube/config`) and its current context, else the in-cluster
//! ServiceAccount. TLS uses ring, the one crypto provider of the process.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::Client;
use kube::api::{Api, ListParams};
use tuna_crds::{Domain, Tunnel};

use crate::plan::ingress::{ServiceRef, TranslateOptions, translate_one};
use crate::plan::service::{
    HeadlessEndpoints, ServiceInfo, UpstreamHost, is_namespace_name, is_service_name,
    parse_upstream_url,
};

/// `spec.controller` of the IngressClasses this operator serves.
pub const INGRESS_CONTROLLER: &str = "k8s.tuna.am/ingress-controller";
/// Annotation marking the cluster's default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// Label EndpointSlices carry with the name of their Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Installs ring as the process's crypto provider (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for the current kubeconfig context or the in-cluster ServiceAccount.
pub async fn client() -> Result<Client, kube::Error> {
    install_crypto_provider();
    Client::try_default().await
}

/// Reads Service `namespace/name` with one `get` (and, for a headless Service,
/// a `list` of its EndpointSlices by the `kubernetes.io/service-name` label).
/// `None` when the Service does not exist, or when `namespace/name` cannot
/// name a Service at all (checked first, with no API call: such a name can
/// come from any route's backendRef and must not fail the caller's sync).
pub async fn read_service(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<ServiceInfo>, kube::Error> {
    if !is_service_name(name) || !is_namespace_name(namespace) {
        return Ok(None);
    }
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let Some(service) = services.get_opt(name).await? else {
        return Ok(None);
    };
    let mut info = ServiceInfo::from_service(&service);
    if info.cluster_ip.is_none() && info.external_name.is_none() {
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
        let list = slices
            .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}")))
            .await?;
        info.headless = Some(headless_endpoints(&list.items));
    }
    Ok(Some(info))
}

/// Merges the ready endpoints of a headless Service's EndpointSlices. An
/// endpoint whose `conditions.ready` is absent counts as ready (the API says so).
pub fn headless_endpoints(slices: &[EndpointSlice]) -> HeadlessEndpoints {
    let mut out = HeadlessEndpoints::default();
    for slice in slices {
        for endpoint in &slice.endpoints {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in &endpoint.addresses {
                if let Ok(ip) = address.parse()
                    && !out.addresses.contains(&ip)
                {
                    out.addresses.push(ip);
                }
            }
        }
        for port in slice.ports.iter().flatten() {
            if let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()) {
                let entry = (port.name.clone().filter(|n| !n.is_empty()), number);
                if !out.ports.contains(&entry) {
                    out.ports.push(entry);
                }
            }
        }
    }
    out
}

/// The Services an Ingress backend or a Tunnel upstream names.
pub fn referenced_services(
    ingresses: &[Arc<Ingress>],
    tunnels: &[Arc<Tunnel>],
    options: &TranslateOptions,
) -> BTreeSet<(String, String)> {
    let mut wanted = BTreeSet::new();
    for ingress in ingresses {
        for spec in translate_one(ingress, options).specs {
            let ServiceRef {
                namespace, name, ..
            } = spec.backend;
            wanted.insert((namespace, name));
        }
    }
    for tunnel in tunnels {
        let namespace = tunnel.metadata.namespace.as_deref().unwrap_or("default");
        if let Ok(url) = parse_upstream_url(&tunnel.spec.upstream.url) {
            match url.host {
                UpstreamHost::Service {
                    namespace: ns,
                    name,
                } => {
                    wanted.insert((ns.unwrap_or_else(|| namespace.to_owned()), name));
                }
                UpstreamHost::ServiceFqdn { namespace, name } => {
                    wanted.insert((namespace, name));
                }
                UpstreamHost::Ip(_) | UpstreamHost::External(_) => {}
            }
        }
    }
    wanted
}

/// The Ingress options of a cluster: every IngressClass whose controller is
/// ours (`k8s.tuna.am/ingress-controller`) is served, and class-less Ingresses
/// too when one of them is the default. `class` (the `--ingress-class` flag)
/// is always served, so that the legacy annotation works without an
/// IngressClass object.
pub fn ingress_options<'a>(
    classes: impl IntoIterator<Item = &'a IngressClass>,
    class: &str,
) -> TranslateOptions {
    let mut options = TranslateOptions::for_class(class);
    for c in classes {
        let ours =
            c.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(INGRESS_CONTROLLER);
        let Some(name) = c.metadata.name.as_deref().filter(|_| ours) else {
            continue;
        };
        if name != class {
            options.also.push(name.to_owned());
        }
        let default = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v == "true");
        options.is_default_class |= default;
    }
    options.also.sort();
    options
}

/// The base domain the cluster's Domains show: `status.fqdn` minus `spec.subdomain`.
pub fn base_domain_of(domains: &[Arc<Domain>]) -> Option<String> {
    domains.iter().find_map(|d| {
        let sub = d.spec.subdomain.as_deref()?;
        let fqdn = d.status.as_ref()?.fqdn.as_deref()?;
        fqdn.strip_prefix(sub)?.strip_prefix('.').map(str::to_owned)
    })
}
