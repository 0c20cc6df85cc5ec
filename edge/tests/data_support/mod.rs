//! Shared fixtures of the data-plane tests: real TLS, real sockets on
//! 127.0.0.1, a hyper backend fed by the agent's streams.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tuna_agent::{
    Agent, AgentConfig, AgentHandle, AgentStatus, StreamHandler, Trust, TunnelStatus,
};
use tuna_edge::{EdgeConfig, EdgeHandle, EdgeServer, MemoryAuthority};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{Binding, StreamKind, StreamMeta, TunnelToken};

/// Upper bound for waits that only guard against a hung test.
pub const HANG_GUARD: Duration = Duration::from_secs(30);

pub fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A self-signed certificate for localhost / 127.0.0.1, `*.tuna.test` and `app.tuna.test`.
pub struct TestCert {
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: Vec<u8>,
}

impl TestCert {
    pub fn new() -> Self {
        let names = vec![
            "localhost".into(),
            "127.0.0.1".into(),
            "*.tuna.test".into(),
            "app.tuna.test".into(),
        ];
        let ck = rcgen::generate_simple_self_signed(names).unwrap();
        Self {
            cert_pem: ck.cert.pem(),
            cert_der: ck.cert.der().clone(),
            key_der: ck.signing_key.serialize_der(),
        }
    }

    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let key = PrivateKeyDer::try_from(self.key_der.clone()).unwrap();
        Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![self.cert_der.clone()], key)
            .unwrap(),
        )
    }
}

pub fn far_future() -> SystemTime {
    SystemTime::now() + Duration::from_secs(3600)
}

pub struct Edge {
    pub handle: EdgeHandle,
    pub authority: MemoryAuthority,
}

pub fn edge_config(cert: &TestCert, agent_addr: SocketAddr) -> EdgeConfig {
    let mut config = EdgeConfig::new(agent_addr, cert.server_config());
    config.http_addr = Some("127.0.0.1:0".parse().unwrap());
    config.https_addr = Some("127.0.0.1:0".parse().unwrap());
    config.public_tls = Some(cert.server_config());
    config.tcp_bind_ip = "127.0.0.1".parse().unwrap();
    config.tcp_ports = 1024..=65535;
    // A host whose tunnel left answers at once, as these tests expect; the
    // wait for a restarting agent has its own test (data_tunnel).
    config.public_limits.reconnect_grace = Duration::ZERO;
    config
}

pub async fn start_edge(cert: &TestCert, authority: &MemoryAuthority) -> EdgeHandle {
    EdgeServer::start(
        edge_config(cert, "127.0.0.1:0".parse().unwrap()),
        Arc::new(authority.clone()),
        None,
    )
    .await
    .unwrap()
}

/// A listener on 127.0.0.1:0 for a TCP endpoint, to hand to the edge
/// (`EdgeConfig::tcp_listeners`), and its port: no bind-drop-reuse race.
pub fn endpoint_listener() -> (Arc<std::net::TcpListener>, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    (Arc::new(listener), port)
}

/// An edge serving `listeners` as TCP endpoints.
pub async fn start_edge_with(
    cert: &TestCert,
    authority: &MemoryAuthority,
    listeners: &[Arc<std::net::TcpListener>],
) -> EdgeHandle {
    let mut config = edge_config(cert, "127.0.0.1:0".parse().unwrap());
    config.tcp_listeners = listeners.to_vec();
    EdgeServer::start(config, Arc::new(authority.clone()), None)
        .await
        .unwrap()
}

pub fn agent_config(cert: &TestCert, edge: &EdgeHandle) -> AgentConfig {
    let mut config = AgentConfig::new(
        format!("127.0.0.1:{}", edge.agent_addr.port()),
        Trust::CaPem(cert.cert_pem.clone().into_bytes()),
    );
    config.server_name = Some("localhost".into());
    config.backoff_initial = Duration::from_millis(50);
    config.backoff_max = Duration::from_millis(500);
    config
}

/// The tunnel id the helpers give a token's tunnel: its public part
/// (`tunat_<id>` of a real token, short test tokens whole), never the secret.
pub fn tunnel_id(token: &str) -> String {
    token.chars().take(22).collect()
}

/// Starts an agent whose streams go to `handler` and attaches one tunnel
/// ([`tunnel_id`] of its token) with `bindings`.
pub async fn start_tunnel(
    cert: &TestCert,
    edge: &EdgeHandle,
    token: &str,
    bindings: Vec<Binding>,
    handler: impl StreamHandler,
) -> AgentHandle {
    let agent = Agent::start(agent_config(cert, edge), handler).unwrap();
    agent
        .attach(tunnel_id(token), TunnelToken::new(token), bindings)
        .await
        .unwrap();
    agent
}

/// Like [`start_tunnel`], with streams served by [`serve_backend`].
pub async fn start_agent(
    cert: &TestCert,
    edge: &EdgeHandle,
    token: &str,
    bindings: Vec<Binding>,
) -> AgentHandle {
    start_tunnel(cert, edge, token, bindings, backend_handler).await
}

/// A stream handler that serves every stream with [`serve_backend`].
pub fn backend_handler(stream: MuxStream, meta: StreamMeta) {
    tokio::spawn(serve_backend(stream, meta));
}

/// Waits until tunnel `id` of `agent` matches `pred`.
pub async fn wait_tunnel(
    agent: &AgentHandle,
    id: &str,
    pred: impl FnMut(&TunnelStatus) -> bool,
) -> TunnelStatus {
    let mut rx = agent.tunnel_status(id).expect("tunnel attached");
    tokio::time::timeout(HANG_GUARD, rx.wait_for(pred))
        .await
        .expect("tunnel status never matched")
        .unwrap()
        .clone()
}

pub async fn wait_status(
    agent: &AgentHandle,
    pred: impl FnMut(&AgentStatus) -> bool,
) -> AgentStatus {
    let mut rx = agent.status();
    tokio::time::timeout(HANG_GUARD, rx.wait_for(pred))
        .await
        .expect("agent status never matched")
        .unwrap()
        .clone()
}

/// The test backend: HTTP streams get a small hyper server, TCP streams an
/// echo, address streams a line naming the address and then an echo.
pub async fn serve_backend(stream: MuxStream, meta: StreamMeta) {
    match meta.kind.clone() {
        StreamKind::Tcp { .. } => {
            let (mut r, mut w) = tokio::io::split(stream);
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        }
        StreamKind::Address { address } => {
            let (mut r, mut w) = tokio::io::split(stream);
            let line = format!("address={address} client_ip={}\n", meta.client_addr.ip());
            if w.write_all(line.as_bytes()).await.is_ok() {
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
            let _ = w.shutdown().await;
        }
        StreamKind::Http { .. } => {
            let meta = Arc::new(meta);
            let service = hyper::service::service_fn(move |req| backend(req, Arc::clone(&meta)));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        }
    }
}

async fn backend(
    mut req: Request<Incoming>,
    meta: Arc<StreamMeta>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let path = req.uri().path().to_owned();
    if path == "/ws" {
        // Any HTTP/1.1 upgrade: answer 101 and echo raw bytes afterwards.
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        return Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "echo")
            .body(Full::new(Bytes::new()))
            .unwrap());
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap();
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n]))));
    }
    let host_header = req
        .headers()
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = req.into_body().collect().await?.to_bytes();
    let (host, scheme) = match &meta.kind {
        StreamKind::Http { host, scheme } => (host.clone(), scheme.as_str()),
        StreamKind::Tcp { .. } | StreamKind::Address { .. } => unreachable!(),
    };
    let text = format!(
        "host={host} scheme={scheme} client_ip={} host_header={host_header} path={path} body={} tunnel={}",
        meta.client_addr.ip(),
        body.len(),
        meta.tunnel
    );
    Ok(Response::new(Full::new(Bytes::from(text))))
}

/// A reqwest client that resolves `*.tuna.test` names to the edge and trusts the test cert.
pub fn http_client(cert: &TestCert, edge: &EdgeHandle, hosts: &[&str]) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert_pem.as_bytes()).unwrap())
        .no_proxy();
    for host in hosts {
        // Ports come from the URL; the resolved address only supplies the IP.
        builder = builder.resolve(host, edge.http_addr.unwrap());
    }
    builder.build().unwrap()
}

pub fn http_url(edge: &EdgeHandle, host: &str, path: &str) -> String {
    format!("http://{host}:{}{path}", edge.http_addr.unwrap().port())
}

pub fn https_url(edge: &EdgeHandle, host: &str, path: &str) -> String {
    format!("https://{host}:{}{path}", edge.https_addr.unwrap().port())
}
