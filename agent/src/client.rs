//! `TunaClient`: the typed REST client the operator's reconcilers use.
//!
//! Its failures are the crate's `Api*` errors, sorted by what a reconciler does next:
//! adopt ([`Error::ApiAlreadyExists`]), give up with a condition
//! ([`Error::ApiForbidden`], [`Error::ApiInvalid`]), wait
//! ([`Error::ApiRateLimited`]) or retry with backoff
//! ([`Error::ApiTransient`]).

use std::path::PathBuf;
use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use tuna_protocol::api::{
    ApiKey, CreateApiKey, CreateDomain, CreateGatewayAddress, CreateTcpEndpoint, CreateToken,
    CreatedApiKey, CreatedToken, Domain, ErrorBody, GatewayAddress, List, RenewToken, Secret,
    TcpEndpoint, Token, WhoAmI,
};

use crate::error::Error;

/// How to reach an edge's REST API.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// `https://edge.example.net:8443` (a path prefix is kept).
    pub base_url: String,
    /// The API key, sent as `Authorization: Bearer`.
    pub api_key: Secret,
    /// PEM file of the CA that signed the edge's certificate (a self-hosted
    /// edge writes `tls/ca.pem` into its data dir). Absent: the platform's
    /// trust store.
    pub ca_file: Option<PathBuf>,
    /// Timeout of one request, connection included.
    pub timeout: Duration,
}

impl ClientOptions {
    /// Options with a 30 s timeout and the platform's trust store.
    pub fn new(base_url: impl Into<String>, api_key: Secret) -> Self {
        Self {
            base_url: base_url.into(),
            api_key,
            ca_file: None,
            timeout: Duration::from_secs(30),
        }
    }

    /// Trusts the CA in this PEM file (and nothing else).
    pub fn with_ca_file(mut self, ca_file: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(ca_file.into());
        self
    }
}

/// A reservation made by [`TunaClient::ensure_domain`] or
/// [`TunaClient::ensure_tcp_endpoint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserved<T> {
    /// The reservation as the edge holds it.
    pub object: T,
    /// True when it existed already (made elsewhere) and was adopted: an
    /// adopted reservation is never deleted by the operator.
    pub adopted: bool,
}

/// A typed client of one edge's REST API (`docs/tuna-api.md`).
///
/// Cheap to clone: clones share the connection pool.
#[derive(Clone, Debug)]
pub struct TunaClient {
    http: reqwest::Client,
    base: Url,
    api_key: Secret,
}

impl TunaClient {
    /// Builds a client. Needs a rustls crypto provider installed in the
    /// process (`rustls::crypto::ring::default_provider().install_default()`).
    pub fn new(options: ClientOptions) -> Result<Self, Error> {
        let mut base = Url::parse(&options.base_url)
            .map_err(|e| Error::ClientConfig(format!("base URL {:?}: {e}", options.base_url)))?;
        if base.cannot_be_a_base() {
            return Err(Error::ClientConfig(format!(
                "base URL {:?} cannot carry paths",
                options.base_url
            )));
        }
        // A trailing slash lets joined paths keep a prefix such as `/tuna`.
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let mut builder = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout.min(Duration::from_secs(10)));
        if let Some(ca_file) = &options.ca_file {
            let tls = crate::tls::client_config_trusting(ca_file)
                .map_err(|e| Error::ClientConfig(e.to_string()))?;
            builder = builder.tls_backend_preconfigured(tls);
        }
        let http = builder
            .build()
            .map_err(|e| Error::ClientConfig(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base,
            api_key: options.api_key,
        })
    }

    /// `GET /v1/account`.
    pub async fn whoami(&self) -> Result<WhoAmI, Error> {
        self.call(Method::GET, &["v1", "account"], None::<&()>, &[])
            .await
    }

    /// `POST /v1/domains`.
    pub async fn create_domain(&self, request: &CreateDomain) -> Result<Domain, Error> {
        self.call(Method::POST, &["v1", "domains"], Some(request), &[])
            .await
    }

    /// `GET /v1/domains`.
    pub async fn list_domains(&self) -> Result<Vec<Domain>, Error> {
        let list: List<Domain> = self
            .call(Method::GET, &["v1", "domains"], None::<&()>, &[])
            .await?;
        Ok(list.items)
    }

    /// `GET /v1/domains/{name}`.
    pub async fn get_domain(&self, name: &str) -> Result<Domain, Error> {
        self.call(Method::GET, &["v1", "domains", name], None::<&()>, &[])
            .await
    }

    /// `DELETE /v1/domains/{name}`.
    pub async fn delete_domain(&self, name: &str) -> Result<(), Error> {
        self.call_empty(Method::DELETE, &["v1", "domains", name])
            .await
    }

    /// `POST /v1/domains/{name}/verify`: looks the DNS records up now.
    pub async fn verify_domain(&self, name: &str) -> Result<Domain, Error> {
        self.call(
            Method::POST,
            &["v1", "domains", name, "verify"],
            None::<&()>,
            &[],
        )
        .await
    }

    /// `POST /v1/tcp-endpoints`.
    pub async fn create_tcp_endpoint(
        &self,
        request: &CreateTcpEndpoint,
    ) -> Result<TcpEndpoint, Error> {
        self.call(Method::POST, &["v1", "tcp-endpoints"], Some(request), &[])
            .await
    }

    /// `GET /v1/tcp-endpoints`.
    pub async fn list_tcp_endpoints(&self) -> Result<Vec<TcpEndpoint>, Error> {
        let list: List<TcpEndpoint> = self
            .call(Method::GET, &["v1", "tcp-endpoints"], None::<&()>, &[])
            .await?;
        Ok(list.items)
    }

    /// `GET /v1/tcp-endpoints/{aliasOrPort}`.
    pub async fn get_tcp_endpoint(&self, alias_or_port: &str) -> Result<TcpEndpoint, Error> {
        self.call(
            Method::GET,
            &["v1", "tcp-endpoints", alias_or_port],
            None::<&()>,
            &[],
        )
        .await
    }

    /// `DELETE /v1/tcp-endpoints/{aliasOrPort}`.
    pub async fn delete_tcp_endpoint(&self, alias_or_port: &str) -> Result<(), Error> {
        self.call_empty(Method::DELETE, &["v1", "tcp-endpoints", alias_or_port])
            .await
    }

    /// `POST /v1/gateway-addresses`.
    pub async fn create_gateway_address(
        &self,
        request: &CreateGatewayAddress,
    ) -> Result<GatewayAddress, Error> {
        self.call(
            Method::POST,
            &["v1", "gateway-addresses"],
            Some(request),
            &[],
        )
        .await
    }

    /// `GET /v1/gateway-addresses`.
    pub async fn list_gateway_addresses(&self) -> Result<Vec<GatewayAddress>, Error> {
        let list: List<GatewayAddress> = self
            .call(Method::GET, &["v1", "gateway-addresses"], None::<&()>, &[])
            .await?;
        Ok(list.items)
    }

    /// `DELETE /v1/gateway-addresses/{address}`.
    pub async fn delete_gateway_address(&self, address: std::net::IpAddr) -> Result<(), Error> {
        let address = address.to_string();
        self.call_empty(Method::DELETE, &["v1", "gateway-addresses", &address])
            .await
    }

    /// `POST /v1/tokens`.
    pub async fn create_token(&self, request: &CreateToken) -> Result<CreatedToken, Error> {
        self.call(Method::POST, &["v1", "tokens"], Some(request), &[])
            .await
    }

    /// `GET /v1/tokens?selector=k=v,k2=v2` (empty selector: all tokens).
    pub async fn list_tokens(&self, selector: &str) -> Result<Vec<Token>, Error> {
        let query: &[(&str, &str)] = if selector.is_empty() {
            &[]
        } else {
            &[("selector", selector)]
        };
        let list: List<Token> = self
            .call(Method::GET, &["v1", "tokens"], None::<&()>, query)
            .await?;
        Ok(list.items)
    }

    /// `GET /v1/tokens/{id}`.
    pub async fn get_token(&self, id: &str) -> Result<Token, Error> {
        self.call(Method::GET, &["v1", "tokens", id], None::<&()>, &[])
            .await
    }

    /// `DELETE /v1/tokens/{id}`: revokes the token; its sessions close.
    pub async fn revoke_token(&self, id: &str) -> Result<(), Error> {
        self.call_empty(Method::DELETE, &["v1", "tokens", id]).await
    }

    /// `POST /v1/tokens/{id}/renew`.
    pub async fn renew_token(&self, id: &str, request: &RenewToken) -> Result<Token, Error> {
        self.call(
            Method::POST,
            &["v1", "tokens", id, "renew"],
            Some(request),
            &[],
        )
        .await
    }

    /// `POST /v1/keys` (full access): a new key for the caller's account.
    pub async fn create_key(&self, request: &CreateApiKey) -> Result<CreatedApiKey, Error> {
        self.call(Method::POST, &["v1", "keys"], Some(request), &[])
            .await
    }

    /// `GET /v1/keys` (full access): the account's keys, without secrets.
    pub async fn list_keys(&self) -> Result<Vec<ApiKey>, Error> {
        let list: List<ApiKey> = self
            .call(Method::GET, &["v1", "keys"], None::<&()>, &[])
            .await?;
        Ok(list.items)
    }

    /// `DELETE /v1/keys/{id}` (full access): revokes one of the account's keys.
    pub async fn revoke_key(&self, id: &str) -> Result<(), Error> {
        self.call_empty(Method::DELETE, &["v1", "keys", id]).await
    }

    /// Reserves a domain, or adopts it when the caller's account already
    /// holds it (the `409` case). Other errors pass through.
    pub async fn ensure_domain(&self, request: &CreateDomain) -> Result<Reserved<Domain>, Error> {
        match self.create_domain(request).await {
            Ok(domain) => Ok(Reserved {
                object: domain,
                adopted: false,
            }),
            Err(e) => match e.existing::<Domain>() {
                Some(domain) => Ok(Reserved {
                    object: domain,
                    adopted: true,
                }),
                None => Err(e),
            },
        }
    }

    /// Reserves a TCP endpoint, or adopts the caller's existing endpoint of
    /// that alias. A `409` about the requested *port* being held under
    /// another alias is not adopted: it stays an error.
    pub async fn ensure_tcp_endpoint(
        &self,
        request: &CreateTcpEndpoint,
    ) -> Result<Reserved<TcpEndpoint>, Error> {
        match self.create_tcp_endpoint(request).await {
            Ok(endpoint) => Ok(Reserved {
                object: endpoint,
                adopted: false,
            }),
            Err(e) => match e.existing::<TcpEndpoint>() {
                Some(endpoint)
                    if endpoint.alias.eq_ignore_ascii_case(&request.alias)
                        && request.port.is_none_or(|p| p == endpoint.port) =>
                {
                    Ok(Reserved {
                        object: endpoint,
                        adopted: true,
                    })
                }
                _ => Err(e),
            },
        }
    }

    /// Reserves an address of the edge's Gateway pool under `request.name`,
    /// or adopts the caller's existing address of that name (and, when one
    /// is asked for, that address).
    pub async fn ensure_gateway_address(
        &self,
        request: &CreateGatewayAddress,
    ) -> Result<Reserved<GatewayAddress>, Error> {
        match self.create_gateway_address(request).await {
            Ok(address) => Ok(Reserved {
                object: address,
                adopted: false,
            }),
            Err(e) => match e.existing::<GatewayAddress>() {
                Some(held)
                    if held.name == request.name
                        && request.address.is_none_or(|a| a == held.address) =>
                {
                    Ok(Reserved {
                        object: held,
                        adopted: true,
                    })
                }
                _ => Err(e),
            },
        }
    }

    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        {
            // `base` is known to be a base URL (checked in `new`).
            let mut path = url.path_segments_mut().expect("checked in new");
            path.pop_if_empty();
            path.extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    async fn send(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<&(impl Serialize + ?Sized)>,
        query: &[(&str, &str)],
    ) -> Result<reqwest::Response, Error> {
        let mut request = self
            .http
            .request(method, self.url(segments, query))
            .bearer_auth(self.api_key.expose());
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| Error::ApiTransient {
            message: error_chain(&e),
            status: None,
        })?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(error_from_response(response).await)
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<&(impl Serialize + ?Sized)>,
        query: &[(&str, &str)],
    ) -> Result<T, Error> {
        let response = self.send(method, segments, body, query).await?;
        let status = response.status().as_u16();
        response.json().await.map_err(|e| {
            if e.is_decode() {
                Error::ApiUnexpected {
                    status,
                    message: format!("undecodable body: {e}"),
                }
            } else {
                Error::ApiTransient {
                    message: error_chain(&e),
                    status: Some(status),
                }
            }
        })
    }

    async fn call_empty(&self, method: Method, segments: &[&str]) -> Result<(), Error> {
        self.send(method, segments, None::<&()>, &[]).await?;
        Ok(())
    }
}

async fn error_from_response(response: reqwest::Response) -> Error {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let text = response.text().await.unwrap_or_default();
    let body: Option<ErrorBody> = serde_json::from_str(&text).ok();
    let (code, message, existing) = match body {
        Some(b) => (b.code, b.message, b.existing),
        None => (String::new(), text, None),
    };
    match status {
        StatusCode::CONFLICT => match existing {
            Some(existing) => Error::ApiAlreadyExists {
                message,
                existing: Box::new(existing),
            },
            None => Error::ApiUnexpected {
                status: status.as_u16(),
                message,
            },
        },
        StatusCode::UNAUTHORIZED => Error::ApiUnauthorized { message },
        StatusCode::FORBIDDEN => Error::ApiForbidden { code, message },
        StatusCode::NOT_FOUND => Error::ApiNotFound { message },
        StatusCode::UNPROCESSABLE_ENTITY | StatusCode::BAD_REQUEST => {
            Error::ApiInvalid { code, message }
        }
        StatusCode::TOO_MANY_REQUESTS => Error::ApiRateLimited {
            retry_after,
            message,
        },
        s if s.is_server_error() || s == StatusCode::REQUEST_TIMEOUT => Error::ApiTransient {
            message: if code.is_empty() {
                message
            } else {
                format!("{code}: {message}")
            },
            status: Some(s.as_u16()),
        },
        s => Error::ApiUnexpected {
            status: s.as_u16(),
            message,
        },
    }
}

/// reqwest's top-level message hides the cause (`error sending request`);
/// the chain tells an operator whether it was DNS, TLS or a refused port.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
