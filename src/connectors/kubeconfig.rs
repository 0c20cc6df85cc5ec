//! The `kubeconfig` configuration of the `k8s` ConnectorClass: a kubeconfig
//! that sends `kubectl` through the connector's proxy with a short-lived
//! token of the workload's own, never the target cluster's credentials.
//!
//! One renderer for every consumer: `tuna-operator connector kubeconfig`
//! (people, CI pipelines) and the CSI driver (files in pod volumes, with
//! tokens bound to pods). The command takes the proxy's address and CA from
//! the Connector's status ([`KubeconfigInput::from_connector`]); the CSI
//! plugin derives them from the proxy's Service name and CA Secret
//! ([`KubeconfigInput::with_proxy`]), so that patching a status cannot
//! redirect workloads.

use serde::Serialize;
use tuna_crds::{Connector, KUBECONFIG_CONFIGURATION};
use tuna_proxy::Credential;

use crate::Error;

/// What a kubeconfig is rendered from.
#[derive(Debug, Clone)]
pub struct KubeconfigInput {
    /// The Connector's namespace.
    pub namespace: String,
    /// The Connector's name.
    pub name: String,
    /// The target API server, `spec.address` (kubectl connects there — through
    /// the proxy).
    pub server: String,
    /// `host[:port]` of the proxy: its own Service,
    /// `tuna-operator-connectors.<operator ns>.svc.cluster.local`.
    pub proxy_host: String,
    /// PEM of the proxy's CA.
    pub proxy_ca_pem: String,
    /// The workload's ServiceAccount token: the proxy password.
    pub token: Credential,
}

/// One rendered file of a configuration.
#[derive(Debug, Clone)]
pub struct RenderedFile {
    /// File name, e.g. `kubeconfig`.
    pub name: String,
    /// Contents (contains the workload's token: write it with mode 0600/0640).
    pub contents: String,
}

/// Name of the cluster, user and context of the rendered kubeconfig.
const ENTRY: &str = "k8s";
/// The client's own token: the proxy replaces it with the real one.
pub const FAKE_TOKEN: &str = "fake-token";

impl KubeconfigInput {
    /// The input for `connector` and `token`. `proxy_url` overrides the
    /// status's proxy URL (`http://host[:port]`), for clients that cannot
    /// resolve cluster DNS names.
    pub fn from_connector(
        connector: &Connector,
        token: Credential,
        proxy_url: Option<&str>,
    ) -> crate::Result<Self> {
        let address = connector
            .status
            .as_ref()
            .and_then(|s| s.proxy.as_ref())
            .and_then(|p| p.http_address.as_ref());
        let (Some(url), Some(ca)) = (
            address.and_then(|a| a.url.as_deref()),
            address.and_then(|a| a.ca_certs.as_deref()),
        ) else {
            return Err(Error::NoProxyAddress(connector_id(connector)));
        };
        Self::with_proxy(connector, token, proxy_url.unwrap_or(url), ca.to_owned())
    }

    /// The input for `connector` and `token` with the proxy's URL
    /// (`http://host[:port]`) and CA given, not read from the Connector's
    /// status (which whoever may patch `connectors/status` can change: the
    /// CSI plugin derives both from the proxy's Service and its CA's ConfigMap).
    pub fn with_proxy(
        connector: &Connector,
        token: Credential,
        proxy_url: &str,
        proxy_ca_pem: String,
    ) -> crate::Result<Self> {
        let namespace = connector
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = connector.metadata.name.clone().unwrap_or_default();
        if connector.spec.address.is_empty() {
            return Err(Error::NoConnectorAddress(connector_id(connector)));
        }
        Ok(Self {
            namespace,
            name,
            server: connector.spec.address.clone(),
            proxy_host: proxy_host_of(proxy_url)?,
            proxy_ca_pem,
            token,
        })
    }
}

/// `namespace/name` of `connector`.
fn connector_id(connector: &Connector) -> String {
    format!(
        "{}/{}",
        connector.metadata.namespace.as_deref().unwrap_or("default"),
        connector.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `host[:port]` of an `http://host[:port][/]` URL.
fn proxy_host_of(url: &str) -> crate::Result<String> {
    let bad = || Error::BadProxyUrl(url.to_owned());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let host = rest.strip_suffix('/').unwrap_or(rest);
    if host.is_empty() || host.contains(['/', '@', '?', '#']) {
        return Err(bad());
    }
    Ok(host.to_owned())
}

/// Percent-encodes everything but RFC 3986 unreserved characters (userinfo).
fn encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The proxy URL of a kubeconfig: `http://<ns>%2F<name>:<token>@<host>`
/// (Go unescapes the userinfo, so the proxy sees `<ns>/<name>`).
pub fn proxy_url(namespace: &str, name: &str, token: &Credential, host: &str) -> String {
    format!(
        "http://{}:{}@{host}",
        encode_userinfo(&format!("{namespace}/{name}")),
        encode_userinfo(token.expose())
    )
}

#[derive(Serialize)]
struct Kubeconfig<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    clusters: [Named<'a, Cluster<'a>>; 1],
    contexts: [Named<'a, ContextEntry<'a>>; 1],
    users: [Named<'a, User<'a>>; 1],
    #[serde(rename = "current-context")]
    current_context: &'a str,
}

#[derive(Serialize)]
struct Named<'a, T> {
    name: &'a str,
    #[serde(flatten)]
    value: T,
}

#[derive(Serialize)]
struct Cluster<'a> {
    cluster: ClusterFields<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterFields<'a> {
    server: &'a str,
    proxy_url: String,
    certificate_authority_data: String,
}

#[derive(Serialize)]
struct ContextEntry<'a> {
    context: ContextFields<'a>,
}

#[derive(Serialize)]
struct ContextFields<'a> {
    cluster: &'a str,
    user: &'a str,
}

#[derive(Serialize)]
struct User<'a> {
    user: UserFields<'a>,
}

#[derive(Serialize)]
struct UserFields<'a> {
    token: &'a str,
}

/// Renders the kubeconfig: cluster `k8s` with `server` = the connector's
/// address, `proxy-url` = the proxy with the token as password, and the
/// proxy's CA in `certificate-authority-data`; user `k8s` with
/// `token: fake-token`; context and current-context `k8s`. The target's
/// credentials are nowhere in it.
pub fn render_kubeconfig(input: &KubeconfigInput) -> String {
    use base64::Engine as _;
    let config = Kubeconfig {
        api_version: "v1",
        kind: "Config",
        clusters: [Named {
            name: ENTRY,
            value: Cluster {
                cluster: ClusterFields {
                    server: &input.server,
                    proxy_url: proxy_url(
                        &input.namespace,
                        &input.name,
                        &input.token,
                        &input.proxy_host,
                    ),
                    certificate_authority_data: base64::engine::general_purpose::STANDARD
                        .encode(input.proxy_ca_pem.as_bytes()),
                },
            },
        }],
        contexts: [Named {
            name: ENTRY,
            value: ContextEntry {
                context: ContextFields {
                    cluster: ENTRY,
                    user: ENTRY,
                },
            },
        }],
        users: [Named {
            name: ENTRY,
            value: User {
                user: UserFields { token: FAKE_TOKEN },
            },
        }],
        current_context: ENTRY,
    };
    serde_saphyr::to_string(&config).expect("a kubeconfig of strings serializes")
}

/// Renders the configuration `name` of the `k8s` class: its files.
pub fn render_configuration(
    name: &str,
    input: &KubeconfigInput,
) -> crate::Result<Vec<RenderedFile>> {
    if name != KUBECONFIG_CONFIGURATION {
        return Err(Error::UnknownConfiguration(name.to_owned()));
    }
    Ok(vec![RenderedFile {
        name: KUBECONFIG_CONFIGURATION.to_owned(),
        contents: render_kubeconfig(input),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connector(status: bool) -> Connector {
        let mut yaml = String::from(
            "apiVersion: connectors.alauda.io/v1alpha1\nkind: Connector\nmetadata: {name: k8s-connector, namespace: k8s-connector-demo}\nspec: {connectorClassName: k8s, address: 'https://192.168.1.100:6443'}\n",
        );
        if status {
            yaml.push_str("status: {proxy: {httpAddress: {url: 'http://c-k8s-connector.k8s-connector-demo.svc.cluster.local', CACerts: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n\"}}}\n");
        }
        serde_saphyr::from_str(&yaml).unwrap()
    }

    /// The documentation's kubeconfig, field by field.
    #[test]
    fn renders_the_documented_kubeconfig() {
        let input = KubeconfigInput::from_connector(
            &connector(true),
            Credential::new("eyJhbGc.x-y_z"),
            None,
        )
        .unwrap();
        let text = render_kubeconfig(&input);
        let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "Config");
        let cluster = &v["clusters"][0];
        assert_eq!(cluster["name"], "k8s");
        assert_eq!(cluster["cluster"]["server"], "https://192.168.1.100:6443");
        assert_eq!(
            cluster["cluster"]["proxy-url"],
            "http://k8s-connector-demo%2Fk8s-connector:eyJhbGc.x-y_z@c-k8s-connector.k8s-connector-demo.svc.cluster.local"
        );
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD
            .decode(
                cluster["cluster"]["certificate-authority-data"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
        assert!(
            String::from_utf8(ca)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert_eq!(v["contexts"][0]["name"], "k8s");
        assert_eq!(v["contexts"][0]["context"]["cluster"], "k8s");
        assert_eq!(v["contexts"][0]["context"]["user"], "k8s");
        assert_eq!(v["users"][0]["name"], "k8s");
        assert_eq!(v["users"][0]["user"]["token"], "fake-token");
        assert_eq!(v["current-context"], "k8s");
        // Keys in the documented order.
        let order: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with([' ', '-']))
            .map(|l| l.split(':').next().unwrap())
            .collect();
        assert_eq!(
            order,
            [
                "apiVersion",
                "kind",
                "clusters",
                "contexts",
                "users",
                "current-context"
            ]
        );
        let files = render_configuration("kubeconfig", &input).unwrap();
        assert_eq!(files[0].name, "kubeconfig");
        assert!(render_configuration(".env", &input).is_err());
    }

    #[test]
    fn tokens_are_escaped_and_overrides_checked() {
        let url = proxy_url("ns", "n", &Credential::new("a:b@c/d"), "127.0.0.1:8080");
        assert_eq!(url, "http://ns%2Fn:a%3Ab%40c%2Fd@127.0.0.1:8080");
        let input = KubeconfigInput::from_connector(
            &connector(true),
            Credential::new("t"),
            Some("http://127.0.0.1:8080/"),
        )
        .unwrap();
        assert_eq!(input.proxy_host, "127.0.0.1:8080");
        for bad in ["https://x", "http://", "http://u@x", "http://x/path"] {
            assert!(
                KubeconfigInput::from_connector(&connector(true), Credential::new("t"), Some(bad))
                    .is_err(),
                "{bad}"
            );
        }
        let err = KubeconfigInput::from_connector(&connector(false), Credential::new("t"), None)
            .unwrap_err();
        assert!(matches!(err, Error::NoProxyAddress(_)), "{err}");
        assert!(!format!("{input:?}").contains("\"t\""));
    }
}
