//! A real control plane served over real TLS on 127.0.0.1:0, for the
//! `api_*` integration tests.

#![allow(dead_code)] // a suite of its own (tests/<suite>.rs) uses a part

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tuna_agent::client::{ClientOptions, TunaClient};
use tuna_edge::control::{ControlConfig, ControlPlane, RateLimit, serve_https};
use tuna_edge::tls;
use tuna_protocol::api::{Scope, Secret};

pub const BASE_DOMAIN: &str = "tuna.test";
pub const PUBLIC_HOST: &str = "edge.tuna.test";
pub const PORTS: std::ops::RangeInclusive<u16> = 40000..=40003;

pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn config(data_dir: &Path) -> ControlConfig {
    let mut config = ControlConfig::new(data_dir, BASE_DOMAIN, PUBLIC_HOST);
    config.tcp_port_range = PORTS;
    // Generous: only the rate-limit test wants to hit the limit.
    config.rate_limit = RateLimit {
        burst: 1000,
        per_second: 1000.0,
    };
    config
}

/// The REST API of one control plane, served until [`TestEdge::stop`].
pub struct TestEdge {
    pub plane: ControlPlane,
    pub url: String,
    pub addr: SocketAddr,
    pub ca_file: PathBuf,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl TestEdge {
    pub async fn start(config: ControlConfig) -> Self {
        install_crypto();
        let data_dir = config.data_dir.clone();
        let plane = ControlPlane::open(config).expect("open control plane");
        let identity =
            tls::self_signed_identity(&data_dir, &["localhost".into()]).expect("TLS identity");
        let ca_file = identity.ca_file.clone().expect("generated CA file");
        let server_config =
            tls::server_config(&identity, tls::ALPN_H2_HTTP1).expect("server config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve_https(
            listener,
            server_config,
            plane.router(),
            shutdown.clone(),
        ));
        Self {
            plane,
            url: format!("https://127.0.0.1:{}", addr.port()),
            addr,
            ca_file,
            shutdown,
            task,
        }
    }

    /// Stops serving and drops the control plane, releasing the store.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("server task");
        drop(self.plane);
    }

    pub fn key(&self, account: &str, scopes: &[Scope]) -> Secret {
        self.plane
            .create_key(account, None, scopes.to_vec())
            .expect("create key")
            .1
    }

    pub fn client(&self, key: &Secret) -> TunaClient {
        TunaClient::new(ClientOptions::new(&self.url, key.clone()).with_ca_file(&self.ca_file))
            .expect("client")
    }

    /// A plain reqwest client trusting the edge's CA, for raw error shapes.
    pub fn raw(&self) -> reqwest::Client {
        let tls = tuna_agent::tls::client_config_trusting(&self.ca_file).expect("client TLS");
        reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .build()
            .expect("reqwest client")
    }
}
