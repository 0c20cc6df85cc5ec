//! `tuna-operator connector kubeconfig -n NS NAME --service-account SA
//! [--duration 30m] [--proxy-url URL]`: prints, on stdout and nothing else
//! there, a kubeconfig that reaches the connector's target through its proxy
//! with a fresh token of ServiceAccount `NS/SA` as the proxy password.
//!
//! It needs, in the kubeconfig's cluster: `get` on the Connector and
//! `create` on `serviceaccounts/token` of the ServiceAccount. The token is
//! minted with a TokenRequest for the proxy's audience (the Connector's
//! `status.proxy.httpAddress.audience`), so it is no credential for the API
//! server itself.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tuna_crds::Connector;
use tuna_proxy::Credential;

use super::kubeconfig::{KubeconfigInput, render_kubeconfig};
use super::role::DEFAULT_AUDIENCE;
use crate::Error;
use crate::role::parse_duration;

/// The API server refuses shorter TokenRequests.
pub const MIN_DURATION: Duration = Duration::from_secs(600);

/// `tuna-operator connector …`.
#[derive(Debug, clap::Subcommand)]
pub enum ConnectorCommand {
    /// Print a kubeconfig that reaches the connector's cluster through its
    /// proxy, with a short-lived ServiceAccount token as the proxy password.
    Kubeconfig(KubeconfigArgs),
}

/// Flags of `tuna-operator connector kubeconfig`.
#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// Namespace of the Connector and the ServiceAccount (default: the
    /// kubeconfig's namespace).
    #[arg(short = 'n', long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Name of the Connector.
    pub name: String,
    /// ServiceAccount (of the same namespace) whose token is the proxy password.
    #[arg(long, value_name = "SA")]
    pub service_account: String,
    /// Lifetime of the token (at least 10m: the API server refuses shorter).
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    pub duration: Duration,
    /// Proxy URL to put in the kubeconfig instead of the Connector's
    /// `status.proxy.httpAddress.url` (`http://host[:port]`), for clients
    /// outside the cluster (or without its DNS).
    #[arg(long, value_name = "URL")]
    pub proxy_url: Option<String>,
}

/// Runs `tuna-operator connector …`.
pub fn run(command: ConnectorCommand) -> crate::Result<()> {
    let ConnectorCommand::Kubeconfig(args) = command;
    let text = tokio::runtime::Runtime::new()
        .map_err(Error::Runtime)?
        .block_on(kubeconfig(args))?;
    print!("{text}");
    Ok(())
}

/// The kubeconfig `args` ask for.
pub async fn kubeconfig(args: KubeconfigArgs) -> crate::Result<String> {
    if args.duration < MIN_DURATION {
        return Err(Error::DurationTooShort(args.duration));
    }
    let client = crate::cluster::client()
        .await
        .map_err(Error::ClusterConnect)?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let connector = Api::<Connector>::namespaced(client.clone(), &namespace)
        .get_opt(&args.name)
        .await
        .map_err(Error::kube(format!(
            "reading connector {namespace}/{}",
            args.name
        )))?
        .ok_or_else(|| Error::NoConnector {
            namespace: namespace.clone(),
            name: args.name.clone(),
        })?;
    let audience = connector
        .status
        .as_ref()
        .and_then(|s| s.proxy.as_ref())
        .and_then(|p| p.http_address.as_ref())
        .and_then(|a| a.audience.clone())
        .unwrap_or_else(|| DEFAULT_AUDIENCE.to_owned());
    // Fail on what the Connector lacks before a token is minted for nothing.
    KubeconfigInput::from_connector(&connector, Credential::new(""), args.proxy_url.as_deref())?;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience],
            expiration_seconds: Some(args.duration.as_secs() as i64),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(client, &namespace)
        .create_token_request(&args.service_account, &PostParams::default(), &request)
        .await
        .map_err(Error::kube(format!(
            "minting a token of ServiceAccount {namespace}/{} (TokenRequest)",
            args.service_account
        )))?;
    let token = issued
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or(Error::NoToken)?;
    let input = KubeconfigInput::from_connector(
        &connector,
        Credential::new(token),
        args.proxy_url.as_deref(),
    )?;
    Ok(render_kubeconfig(&input))
}
