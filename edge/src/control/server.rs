//! The REST API as an axum `Router`: authentication, rate limiting, and one
//! thin handler per endpoint over the [`ControlPlane`] operations.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::keys::Caller;
use super::plane::ControlPlane;
use super::secrets::{self, API_KEY_PREFIX};
use super::serve::ClientAddr;
use tuna_protocol::api::{
    ApiKey, CreateApiKey, CreateDomain, CreateGatewayAddress, CreateTcpEndpoint, CreateToken,
    CreatedApiKey, CreatedToken, Domain, GatewayAddress, List, RenewToken, TcpEndpoint, Token,
    WhoAmI,
};

use crate::error::{Error, Result};

/// Every route of the REST API as `(method, path)`, as written in
/// `docs/tuna-api.md` (a test checks the document lists each one).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/v1/account"),
    ("POST", "/v1/domains"),
    ("GET", "/v1/domains"),
    ("GET", "/v1/domains/{name}"),
    ("DELETE", "/v1/domains/{name}"),
    ("POST", "/v1/domains/{name}/verify"),
    ("POST", "/v1/tcp-endpoints"),
    ("GET", "/v1/tcp-endpoints"),
    ("GET", "/v1/tcp-endpoints/{aliasOrPort}"),
    ("DELETE", "/v1/tcp-endpoints/{aliasOrPort}"),
    ("POST", "/v1/gateway-addresses"),
    ("GET", "/v1/gateway-addresses"),
    ("GET", "/v1/gateway-addresses/{address}"),
    ("DELETE", "/v1/gateway-addresses/{address}"),
    ("POST", "/v1/tokens"),
    ("GET", "/v1/tokens"),
    ("GET", "/v1/tokens/{id}"),
    ("DELETE", "/v1/tokens/{id}"),
    ("POST", "/v1/tokens/{id}/renew"),
    ("POST", "/v1/keys"),
    ("GET", "/v1/keys"),
    ("DELETE", "/v1/keys/{id}"),
];

impl ControlPlane {
    /// The REST API (`docs/tuna-api.md`), ready to serve.
    pub fn router(&self) -> Router {
        router(self.clone())
    }
}

fn router(plane: ControlPlane) -> Router {
    Router::new()
        .route("/v1/account", get(whoami))
        .route("/v1/domains", post(create_domain).get(list_domains))
        .route("/v1/domains/{name}", get(get_domain).delete(delete_domain))
        .route("/v1/domains/{name}/verify", post(verify_domain))
        .route(
            "/v1/tcp-endpoints",
            post(create_tcp_endpoint).get(list_tcp_endpoints),
        )
        .route(
            "/v1/tcp-endpoints/{aliasOrPort}",
            get(get_tcp_endpoint).delete(delete_tcp_endpoint),
        )
        .route(
            "/v1/gateway-addresses",
            post(create_gateway_address).get(list_gateway_addresses),
        )
        .route(
            "/v1/gateway-addresses/{address}",
            get(get_gateway_address).delete(delete_gateway_address),
        )
        .route("/v1/tokens", post(create_token).get(list_tokens))
        .route("/v1/tokens/{id}", get(get_token).delete(revoke_token))
        .route("/v1/tokens/{id}/renew", post(renew_token))
        .route("/v1/keys", post(create_key).get(list_keys))
        .route("/v1/keys/{id}", axum::routing::delete(revoke_key))
        // Only matched routes authenticate: unknown paths answer 404 below.
        .route_layer(middleware::from_fn_with_state(plane.clone(), authenticate))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(plane)
}

/// Checks `Authorization: Bearer <key>` and the key's request budget, then
/// hands the [`Caller`] to the handler.
async fn authenticate(
    State(plane): State<ControlPlane>,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or_default();
    // Failed authentications are budgeted per client (an IPv4 address, an
    // IPv6 /64), and only they: a key this replica's copy holds is judged
    // whatever its client's budget, so a client sharing an address with an
    // attacker (an egress NAT, a load balancer) is not locked out with it.
    let client = request
        .extensions()
        .get::<ClientAddr>()
        .map(|a| crate::budget::source_key(a.0.ip()).to_string());
    let known = plane.authenticate_key(presented).is_ok();
    // Another replica may have committed a moment ago (a key, the object
    // this request names): catch up first, so that the request sees every
    // write acknowledged before it, on any replica. If the store is down,
    // answer from this replica's copy (writes then fail with 503) — unless
    // the copy is older than the replica's outage bound: a key or token
    // revoked, or a domain released, through another replica since then is
    // not in it, so nothing (the key presented included) is judged from it.
    // A missing or malformed key is refused without that round trip: an
    // unauthenticated client costs the store nothing. A key-shaped one the
    // copy lacks is charged to the client's failure budget *before* the
    // round trip (refunded if it turns out valid), and refused once the
    // budget is spent: a client that resets its request right after
    // sending it has paid all the same.
    let mut charged = false;
    if secrets::id_of(API_KEY_PREFIX, presented).is_some() {
        if let (Some(client), false) = (&client, known) {
            if let Err(retry_after) = plane.shared.auth_failures.check(client) {
                tracing::debug!(%client, "REST API authentication rate limited");
                return Error::RateLimited { retry_after }.into_response();
            }
            charged = true;
        }
        if let Err(e) = plane.store().sync_async().await {
            tracing::debug!(error = %e, "catching up with the store failed; answering from this replica's copy");
            if let Err(stale) = plane.store_outage() {
                return stale.into_response();
            }
        }
    }
    let caller = match plane.authenticate_key(presented) {
        Ok(caller) => {
            if let (Some(client), true) = (&client, charged) {
                plane.shared.auth_failures.refund(client);
            }
            caller
        }
        Err(e) => {
            if let (Some(client), false) = (&client, charged) {
                // Cost nothing, but counted: the budget is the client's.
                let _ = plane.shared.auth_failures.check(client);
            }
            return e.into_response();
        }
    };
    if let Err(retry_after) = plane.shared.limiter.check(&caller.key_id) {
        tracing::debug!(key_id = %caller.key_id, "REST API request rate limited");
        return Error::RateLimited { retry_after }.into_response();
    }
    request.extensions_mut().insert(caller);
    let mut response = next.run(request).await;
    response
        .extensions_mut()
        .insert(super::serve::Authenticated);
    response
}

async fn healthz() -> &'static str {
    "ok"
}

async fn not_found() -> Error {
    Error::NotFound("no such endpoint; see docs/tuna-api.md".into())
}

/// Runs an operation that writes the store off the async runtime: a redb
/// commit syncs the file, which would stall every task of the thread.
async fn blocking<T: Send + 'static>(
    plane: ControlPlane,
    op: impl FnOnce(&ControlPlane) -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(move || op(&plane))
        .await
        .map_err(|e| Error::Internal(format!("a store operation did not finish: {e}")))?
}

/// Decodes a JSON body whatever its content type; an empty body is `T::default()`
/// (lenient on purpose: `curl -X POST …/renew` with no body works).
fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        Error::InvalidRequest(format!(
            "request body is not valid JSON for this endpoint: {e}"
        ))
    })
}

async fn whoami(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
) -> Json<WhoAmI> {
    Json(WhoAmI {
        account: caller.account,
        key_id: caller.key_id,
        scopes: caller.scopes,
        base_domain: plane.base_domain().to_owned(),
        public_host: plane.public_host().to_owned(),
        gateway_addresses: !plane.gateway_addresses().is_empty(),
    })
}

async fn create_domain(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Result<(StatusCode, Json<Domain>)> {
    let request: CreateDomain = body(&bytes)?;
    let created = blocking(plane, move |p| p.create_domain(&caller, &request)).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

async fn list_domains(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<List<Domain>>> {
    Ok(Json(List {
        items: plane.list_domains(&caller)?,
    }))
}

async fn get_domain(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Domain>> {
    Ok(Json(plane.get_domain(&caller, &name)?))
}

async fn delete_domain(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode> {
    blocking(plane, move |p| p.delete_domain(&caller, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn verify_domain(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Domain>> {
    Ok(Json(plane.verify_domain(&caller, &name).await?))
}

async fn create_tcp_endpoint(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Result<(StatusCode, Json<TcpEndpoint>)> {
    let request: CreateTcpEndpoint = body(&bytes)?;
    let created = blocking(plane, move |p| p.create_tcp_endpoint(&caller, &request)).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

async fn list_tcp_endpoints(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<List<TcpEndpoint>>> {
    Ok(Json(List {
        items: plane.list_tcp_endpoints(&caller)?,
    }))
}

async fn get_tcp_endpoint(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(alias_or_port): Path<String>,
) -> Result<Json<TcpEndpoint>> {
    Ok(Json(plane.get_tcp_endpoint(&caller, &alias_or_port)?))
}

async fn delete_tcp_endpoint(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(alias_or_port): Path<String>,
) -> Result<StatusCode> {
    blocking(plane, move |p| {
        p.delete_tcp_endpoint(&caller, &alias_or_port)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn create_gateway_address(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Result<(StatusCode, Json<GatewayAddress>)> {
    let request: CreateGatewayAddress = body(&bytes)?;
    let created = blocking(plane, move |p| p.create_gateway_address(&caller, &request)).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

async fn list_gateway_addresses(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<List<GatewayAddress>>> {
    Ok(Json(List {
        items: plane.list_gateway_addresses(&caller)?,
    }))
}

async fn get_gateway_address(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(address): Path<String>,
) -> Result<Json<GatewayAddress>> {
    Ok(Json(plane.get_gateway_address(&caller, &address)?))
}

async fn delete_gateway_address(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(address): Path<String>,
) -> Result<StatusCode> {
    blocking(plane, move |p| p.delete_gateway_address(&caller, &address)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn create_token(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Result<(StatusCode, Json<CreatedToken>)> {
    let request: CreateToken = body(&bytes)?;
    let created = blocking(plane, move |p| p.create_token(&caller, &request)).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[derive(Debug, Default, Deserialize)]
struct TokenQuery {
    #[serde(default)]
    selector: String,
}

async fn list_tokens(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    query: std::result::Result<Query<TokenQuery>, QueryRejection>,
) -> Result<Json<List<Token>>> {
    let Query(query) = query.map_err(|e| Error::InvalidRequest(e.body_text()))?;
    Ok(Json(List {
        items: plane.list_tokens(&caller, &query.selector)?,
    }))
}

async fn get_token(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Token>> {
    Ok(Json(plane.get_token(&caller, &id)?))
}

async fn revoke_token(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    blocking(plane, move |p| p.revoke_token(&caller, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn renew_token(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Json<Token>> {
    let request: RenewToken = body(&bytes)?;
    let renewed = blocking(plane, move |p| p.renew_token(&caller, &id, &request)).await?;
    Ok(Json(renewed))
}

async fn create_key(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Result<(StatusCode, Json<CreatedApiKey>)> {
    let request: CreateApiKey = body(&bytes)?;
    let created = blocking(plane, move |p| p.create_key_for(&caller, &request)).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

async fn list_keys(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<List<ApiKey>>> {
    Ok(Json(List {
        items: plane.list_keys_for(&caller)?,
    }))
}

async fn revoke_key(
    State(plane): State<ControlPlane>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    blocking(plane, move |p| p.revoke_key_for(&caller, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::control::{ControlConfig, serve_connection};

    /// An in-memory store whose every sync takes 300 ms, like a slow disk.
    #[derive(Debug, Default)]
    struct SlowDisk(redb::backends::InMemoryBackend);

    impl redb::StorageBackend for SlowDisk {
        fn len(&self) -> std::io::Result<u64> {
            self.0.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.0.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.0.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            std::thread::sleep(Duration::from_millis(300));
            self.0.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.0.write(offset, data)
        }
    }

    #[test]
    fn store_commits_do_not_stall_the_runtime() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let config = ControlConfig::new("/nonexistent", "tuna.test", "edge.tuna.test");
            let plane = ControlPlane::open_with_backend(config, SlowDisk::default()).unwrap();
            let (_, key) = plane
                .create_key("default", None, vec![tuna_protocol::api::Scope::Full])
                .unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let router = plane.router();
            tokio::spawn(async move {
                while let Ok((tcp, peer)) = listener.accept().await {
                    let router = router.clone();
                    tokio::spawn(serve_connection(
                        tcp,
                        false,
                        peer,
                        router,
                        Duration::from_secs(30),
                    ));
                }
            });
            // The runtime's heartbeat: the longest gap between 5 ms ticks.
            let worst = Arc::new(AtomicU64::new(0));
            let seen = Arc::clone(&worst);
            tokio::spawn(async move {
                loop {
                    let before = Instant::now();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let gap = before.elapsed().as_millis() as u64;
                    seen.fetch_max(gap, Ordering::Relaxed);
                }
            });
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            for label in ["a", "b"] {
                let resp = client
                    .post(format!("http://{addr}/v1/domains"))
                    .bearer_auth(key.expose())
                    .json(&serde_json::json!({ "subdomain": label }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::CREATED);
            }
            let worst = worst.load(Ordering::Relaxed);
            assert!(
                worst < 150,
                "a store commit stalled the runtime for {worst} ms"
            );
        });
    }
}
