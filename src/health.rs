//! The probe and metrics listeners every role serves: `/healthz` and
//! `/readyz` on `--probe-listen`, `/metrics` on `--metrics-listen`.
//!
//! `/healthz` answers 200 while the process runs its tasks; `/readyz`
//! answers 200 once the role is ready (its watches are synced, it reached the
//! edge) and 503 with the reason otherwise.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Whether a role is ready, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Serving.
    Ready,
    /// Not yet (or no longer), with the reason.
    NotReady(String),
}

/// Renders the `/metrics` body.
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(ready): State<watch::Receiver<Readiness>>) -> impl IntoResponse {
    match &*ready.borrow() {
        Readiness::Ready => (StatusCode::OK, "ok".to_owned()),
        Readiness::NotReady(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}")),
    }
}

async fn metrics(State(render): State<MetricsRenderer>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(),
    )
}

async fn serve(listener: TcpListener, router: Router, what: &'static str) {
    if let Err(e) = axum::serve(listener, router).await {
        tracing::error!(error = %e, listener = what, "listener failed");
    }
}

/// Binds both listeners (so that a busy port fails the start) and serves them
/// in background tasks. Returns the bound addresses (probe, metrics).
pub async fn start(
    probe_listen: SocketAddr,
    metrics_listen: SocketAddr,
    ready: watch::Receiver<Readiness>,
    render: MetricsRenderer,
) -> crate::Result<(SocketAddr, SocketAddr)> {
    let listen = |flag, addr| move |source| crate::Error::Listen { flag, addr, source };
    let probe = TcpListener::bind(probe_listen)
        .await
        .map_err(listen("--probe-listen", probe_listen))?;
    let metrics_listener = TcpListener::bind(metrics_listen)
        .await
        .map_err(listen("--metrics-listen", metrics_listen))?;
    let addrs = (
        probe
            .local_addr()
            .map_err(listen("--probe-listen", probe_listen))?,
        metrics_listener
            .local_addr()
            .map_err(listen("--metrics-listen", metrics_listen))?,
    );
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready);
    let metrics_router = Router::new()
        .route("/metrics", get(metrics))
        .with_state(render);
    tokio::spawn(serve(probe, probes, "probes"));
    tokio::spawn(serve(metrics_listener, metrics_router, "metrics"));
    Ok(addrs)
}
