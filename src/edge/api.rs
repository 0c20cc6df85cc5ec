//! The edge's REST API as the operator uses it: reservations (the controller's
//! job) and tunnel tokens (the agent's job), behind one object-safe trait with
//! two implementations — [`RemoteEdge`] over [`TunaClient`] (any edge that
//! speaks `docs/tuna-api.md`) and the embedded edge of standalone mode
//! (`crate::standalone::edge::Embedded`).
//!
//! Errors keep the client's classification ([`Error::class`](crate::Error::class)): a caller
//! backs off on [`ErrorClass::Retryable`], waits `Retry-After` on
//! [`ErrorClass::RateLimited`], and stops retrying on
//! [`ErrorClass::NeedsChange`] until a person changes something (the spec, the
//! API key); [`ErrorClass::Gone`] is a 404, which release paths count as done.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use futures::future::BoxFuture;
use tuna_agent::client::{Reserved, TunaClient};
use tuna_protocol::api::{
    CreateDomain, CreateGatewayAddress, CreateTcpEndpoint, CreateToken, Domain, GatewayAddress,
    RenewToken, TcpEndpoint, Token, WhoAmI,
};
use tuna_protocol::wire::{Binding, TunnelToken};

use crate::Error;

/// What a caller should do about a failed call (it is the crate error's
/// classification, kept with it).
pub use crate::error::ErrorClass;

/// A tunnel token just minted: its id (what renewal and revocation name) and
/// the secret (masked in `Debug`).
#[derive(Debug, Clone)]
pub struct MintedToken {
    /// Token id.
    pub id: String,
    /// The secret.
    pub token: TunnelToken,
    /// When it expires unless renewed (unix seconds).
    pub expires_at: i64,
}

/// The edge's REST API as the operator needs it (see the module docs).
pub trait EdgeApi: Send + Sync + 'static {
    /// Who the key is: account, scopes, base domain, public host.
    fn whoami(&self) -> BoxFuture<'_, crate::Result<WhoAmI>>;
    /// Reserves a domain, or adopts the account's existing one.
    fn ensure_domain<'a>(
        &'a self,
        request: &'a CreateDomain,
    ) -> BoxFuture<'a, crate::Result<Reserved<Domain>>>;
    /// Asks the edge to check a custom domain's DNS records now.
    fn verify_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<Domain>>;
    /// The account's domains.
    fn list_domains(&self) -> BoxFuture<'_, crate::Result<Vec<Domain>>>;
    /// Releases a domain (`Gone` when it is not there).
    fn delete_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<()>>;
    /// Reserves a TCP endpoint, or adopts the account's existing one of that alias.
    fn ensure_tcp_endpoint<'a>(
        &'a self,
        request: &'a CreateTcpEndpoint,
    ) -> BoxFuture<'a, crate::Result<Reserved<TcpEndpoint>>>;
    /// Releases a TCP endpoint (`Gone` when it is not there).
    fn delete_tcp_endpoint<'a>(&'a self, alias: &'a str) -> BoxFuture<'a, crate::Result<()>>;
    /// Reserves an address of the edge's Gateway pool under `request.name`,
    /// or adopts the account's existing one of that name.
    fn ensure_gateway_address<'a>(
        &'a self,
        request: &'a CreateGatewayAddress,
    ) -> BoxFuture<'a, crate::Result<Reserved<GatewayAddress>>>;
    /// Gives a Gateway address back (`Gone` when it is not there).
    fn delete_gateway_address(&self, address: IpAddr) -> BoxFuture<'_, crate::Result<()>>;
    /// The account's Gateway addresses.
    fn list_gateway_addresses(&self) -> BoxFuture<'_, crate::Result<Vec<GatewayAddress>>>;
    /// Mints a tunnel token allowed exactly `bindings`, with owner labels.
    fn create_token<'a>(
        &'a self,
        labels: &'a BTreeMap<String, String>,
        bindings: &'a [Binding],
        ttl: Duration,
    ) -> BoxFuture<'a, crate::Result<MintedToken>>;
    /// Extends a live token by `ttl`; returns the new expiry (unix seconds).
    fn renew_token<'a>(&'a self, id: &'a str, ttl: Duration) -> BoxFuture<'a, crate::Result<i64>>;
    /// Revokes a token: sessions using it close (`Gone` when it is not there).
    fn revoke_token<'a>(&'a self, id: &'a str) -> BoxFuture<'a, crate::Result<()>>;
    /// Tokens matching an equality label selector (`k=v,k2=v2`).
    fn list_tokens<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, crate::Result<Vec<Token>>>;
}

/// An edge reached through its REST API.
#[derive(Debug, Clone)]
pub struct RemoteEdge {
    client: TunaClient,
}

impl RemoteEdge {
    /// Wraps a client.
    pub fn new(client: TunaClient) -> Self {
        Self { client }
    }

    /// The client.
    pub fn client(&self) -> &TunaClient {
        &self.client
    }
}

/// The API's view of a token's bindings (the wire's, grouped by kind).
pub fn bindings_of(bindings: &[Binding]) -> tuna_protocol::api::Bindings {
    let mut out = tuna_protocol::api::Bindings::default();
    for b in bindings {
        match b {
            Binding::Http { host } => out.hosts.push(host.clone()),
            Binding::Tcp { endpoint } => out.tcp_endpoints.push(endpoint.clone()),
            Binding::Address { address, .. } => {
                if !out.addresses.contains(address) {
                    out.addresses.push(*address);
                }
            }
        }
    }
    out
}

impl EdgeApi for RemoteEdge {
    fn whoami(&self) -> BoxFuture<'_, crate::Result<WhoAmI>> {
        Box::pin(async move {
            self.client
                .whoami()
                .await
                .map_err(|e| Error::edge("asking the edge who the API key is", e))
        })
    }

    fn ensure_domain<'a>(
        &'a self,
        request: &'a CreateDomain,
    ) -> BoxFuture<'a, crate::Result<Reserved<Domain>>> {
        Box::pin(async move {
            let name = request
                .domain
                .as_deref()
                .or(request.subdomain.as_deref())
                .unwrap_or("?");
            self.client
                .ensure_domain(request)
                .await
                .map_err(|e| Error::edge(format!("reserving domain {name}"), e))
        })
    }

    fn verify_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<Domain>> {
        Box::pin(async move {
            self.client
                .verify_domain(name)
                .await
                .map_err(|e| Error::edge(format!("verifying domain {name}"), e))
        })
    }

    fn list_domains(&self) -> BoxFuture<'_, crate::Result<Vec<Domain>>> {
        Box::pin(async move {
            self.client
                .list_domains()
                .await
                .map_err(|e| Error::edge("listing the account's domains", e))
        })
    }

    fn delete_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move {
            self.client
                .delete_domain(name)
                .await
                .map_err(|e| Error::edge(format!("releasing domain {name}"), e))
        })
    }

    fn ensure_tcp_endpoint<'a>(
        &'a self,
        request: &'a CreateTcpEndpoint,
    ) -> BoxFuture<'a, crate::Result<Reserved<TcpEndpoint>>> {
        Box::pin(async move {
            self.client
                .ensure_tcp_endpoint(request)
                .await
                .map_err(|e| Error::edge(format!("reserving TCP endpoint {}", request.alias), e))
        })
    }

    fn delete_tcp_endpoint<'a>(&'a self, alias: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move {
            self.client
                .delete_tcp_endpoint(alias)
                .await
                .map_err(|e| Error::edge(format!("releasing TCP endpoint {alias}"), e))
        })
    }

    fn ensure_gateway_address<'a>(
        &'a self,
        request: &'a CreateGatewayAddress,
    ) -> BoxFuture<'a, crate::Result<Reserved<GatewayAddress>>> {
        Box::pin(async move {
            self.client
                .ensure_gateway_address(request)
                .await
                .map_err(|e| Error::edge(format!("reserving an address for {}", request.name), e))
        })
    }

    fn delete_gateway_address(&self, address: IpAddr) -> BoxFuture<'_, crate::Result<()>> {
        Box::pin(async move {
            self.client
                .delete_gateway_address(address)
                .await
                .map_err(|e| Error::edge(format!("giving back the Gateway address {address}"), e))
        })
    }

    fn list_gateway_addresses(&self) -> BoxFuture<'_, crate::Result<Vec<GatewayAddress>>> {
        Box::pin(async move {
            self.client
                .list_gateway_addresses()
                .await
                .map_err(|e| Error::edge("listing the Gateway addresses", e))
        })
    }

    fn create_token<'a>(
        &'a self,
        labels: &'a BTreeMap<String, String>,
        bindings: &'a [Binding],
        ttl: Duration,
    ) -> BoxFuture<'a, crate::Result<MintedToken>> {
        Box::pin(async move {
            let request = CreateToken {
                labels: labels.clone(),
                bindings: bindings_of(bindings),
                ttl_seconds: Some(ttl.as_secs().max(1)),
            };
            let created = self
                .client
                .create_token(&request)
                .await
                .map_err(|e| Error::edge("minting a tunnel token", e))?;
            Ok(MintedToken {
                id: created.id,
                token: TunnelToken::new(created.token.expose()),
                expires_at: created.expires_at.unix_seconds(),
            })
        })
    }

    fn renew_token<'a>(&'a self, id: &'a str, ttl: Duration) -> BoxFuture<'a, crate::Result<i64>> {
        Box::pin(async move {
            let request = RenewToken {
                ttl_seconds: Some(ttl.as_secs().max(1)),
            };
            self.client
                .renew_token(id, &request)
                .await
                .map(|t| t.expires_at.unix_seconds())
                .map_err(|e| Error::edge(format!("renewing tunnel token {id}"), e))
        })
    }

    fn revoke_token<'a>(&'a self, id: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move {
            self.client
                .revoke_token(id)
                .await
                .map_err(|e| Error::edge(format!("revoking tunnel token {id}"), e))
        })
    }

    fn list_tokens<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, crate::Result<Vec<Token>>> {
        Box::pin(async move {
            self.client
                .list_tokens(selector)
                .await
                .map_err(|e| Error::edge("listing tunnel tokens", e))
        })
    }
}

/// Treats a 404 as done: what release and revocation paths want.
pub fn gone_is_ok(result: crate::Result<()>) -> crate::Result<()> {
    match result {
        Err(e) if e.class() == ErrorClass::Gone => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tuna_agent::Error as TunnelError;

    #[test]
    fn classification_follows_the_client() {
        let api = |e| Error::edge("x", e);
        let cases = [
            (
                api(TunnelError::ApiTransient {
                    message: "down".into(),
                    status: Some(503),
                }),
                ErrorClass::Retryable,
            ),
            (
                api(TunnelError::ApiRateLimited {
                    retry_after: Some(Duration::from_secs(7)),
                    message: "slow".into(),
                }),
                ErrorClass::RateLimited(Duration::from_secs(7)),
            ),
            (
                api(TunnelError::ApiInvalid {
                    code: "invalid_name".into(),
                    message: "bad".into(),
                }),
                ErrorClass::NeedsChange,
            ),
            (
                api(TunnelError::ApiUnauthorized {
                    message: "key".into(),
                }),
                ErrorClass::NeedsChange,
            ),
            (
                api(TunnelError::ApiNotFound {
                    message: "no".into(),
                }),
                ErrorClass::Gone,
            ),
        ];
        for (error, class) in cases {
            assert_eq!(error.class(), class, "{error}");
        }
        assert!(
            gone_is_ok(Err(api(TunnelError::ApiNotFound {
                message: "no".into()
            })))
            .is_ok()
        );
    }
}
