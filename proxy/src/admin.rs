//! The admin listener: `/healthz`, `/readyz`, `/metrics`.
//!
//! Served by hyper rather than Pingora: it must keep answering while the
//! proxy drains, and it never proxies anything.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::accept::accept_until;
use crate::inner::Inner;

/// Serves the admin endpoints on `listener` until `stop`.
pub(crate) async fn serve(listener: TcpListener, inner: Arc<Inner>, stop: CancellationToken) {
    let stopped = stop.cancelled();
    accept_until(listener, stopped, "admin accept failed", |tcp, _| {
        let inner = inner.clone();
        let stop = stop.clone();
        // Not on the core's task tracker: shutdown does not wait for the
        // admin connections, which stay up until `stop`.
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let inner = inner.clone();
                async move { Ok::<_, Infallible>(handle(&inner, req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    })
    .await;
}

fn handle(inner: &Inner, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String, content_type: &'static str| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(content_type),
        );
        resp
    };
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        "/readyz" => {
            if inner.is_ready() {
                text(StatusCode::OK, "ready\n".into(), "text/plain")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready\n".into(),
                    "text/plain",
                )
            }
        }
        "/metrics" => {
            let snapshot = inner.shared.snapshot.load();
            text(
                StatusCode::OK,
                inner.shared.metrics.render(&snapshot.hosts),
                "text/plain; version=0.0.4",
            )
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    }
}
