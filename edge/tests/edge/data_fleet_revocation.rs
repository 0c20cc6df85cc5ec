//! A revocation made on one replica closes a live tunnel on another: two
//! control planes on one real PostgreSQL store (started by the test), an
//! edge and an agent on replica B with traffic flowing, the token revoked
//! through replica A. The tunnel closes within the contract's bound, by the
//! same path a local revocation takes (the control plane's revocation
//! channel, fed by the store's change feed).

use crate::data_support;
use crate::pg_support;

use std::sync::Arc;

use data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tuna_agent::TunnelStatus;
use tuna_edge::control::{Caller, ControlConfig, ControlPlane};
use tuna_edge::{EdgeConfig, EdgeServer};
use tuna_protocol::api::{Bindings, CreateDomain, CreateTcpEndpoint, CreateToken, Scope};
use tuna_protocol::wire::{Binding, ErrorCode};

/// Runs a blocking control-plane call (a PostgreSQL commit) off the runtime.
async fn blocking<T: Send + 'static>(op: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(op).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_on_replica_a_closes_its_tunnel_on_replica_b() {
    init();
    let cert = TestCert::new();
    let (tcp, tcp_port) = endpoint_listener();
    let server = blocking(pg_support::PgServer::start).await;
    let url = server.create_database();
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open = |dir: &std::path::Path| {
        let mut config = ControlConfig::new(dir, "tuna.test", "127.0.0.1");
        config.store = Some(url.parse().unwrap());
        config.tcp_port_range = tcp_port..=tcp_port;
        move || ControlPlane::open(config).unwrap()
    };
    let replica_a = blocking(open(dirs.0.path())).await;
    let replica_b = blocking(open(dirs.1.path())).await;

    // Reservations and the token made through B, whose edge serves them.
    let owner = Caller {
        key_id: "test".into(),
        account: "default".into(),
        scopes: vec![Scope::Full],
    };
    let token = {
        let (plane, owner) = (replica_b.clone(), owner.clone());
        blocking(move || {
            let app = CreateDomain {
                subdomain: Some("app".into()),
                domain: None,
            };
            plane.create_domain(&owner, &app).unwrap();
            let db = CreateTcpEndpoint {
                alias: "db".into(),
                port: None,
            };
            plane.create_tcp_endpoint(&owner, &db).unwrap();
            let request = CreateToken {
                bindings: Bindings {
                    hosts: vec!["app.tuna.test".into()],
                    tcp_endpoints: vec!["db".into()],
                    addresses: Vec::new(),
                },
                ..Default::default()
            };
            plane.create_token(&owner, &request).unwrap()
        })
        .await
    };
    let mut config: EdgeConfig = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.tcp_ports = tcp_port..=tcp_port;
    config.tcp_listeners = vec![Arc::clone(&tcp)];
    let edge = EdgeServer::start(config, Arc::new(replica_b.clone()), None)
        .await
        .unwrap();
    let bindings = vec![Binding::http("app.tuna.test"), Binding::tcp("db")];
    let agent = start_agent(&cert, &edge, token.token.expose(), bindings).await;
    let tunnel = tunnel_id(token.token.expose());
    agent.serving(&tunnel).await.unwrap();
    let mut stream = TcpStream::connect(("127.0.0.1", tcp_port)).await.unwrap();
    stream.write_all(b"through replica B").await.unwrap();
    let mut back = [0u8; 17];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"through replica B");

    // Revoked through A, which has no edge at all.
    let mut status = agent.tunnel_status(&tunnel).unwrap();
    let revoked_at = std::time::Instant::now();
    {
        let (plane, owner, id) = (replica_a.clone(), owner.clone(), token.id.clone());
        blocking(move || plane.revoke_token(&owner, &id).unwrap()).await;
    }
    let closed = tokio::time::timeout(
        std::time::Duration::from_millis(1500),
        status.wait_for(|s| matches!(s, TunnelStatus::Closed(_))),
    )
    .await
    .expect("the tunnel on replica B was not closed within the second")
    .unwrap()
    .clone();
    eprintln!(
        "the tunnel on replica B closed {:?} after the revocation on A",
        revoked_at.elapsed()
    );
    assert!(
        matches!(&closed, TunnelStatus::Closed(r) if r.code == ErrorCode::TokenRevoked),
        "{closed:?}"
    );
    let resp = http_client(&cert, &edge, &["app.tuna.test"])
        .get(http_url(&edge, "app.tuna.test", "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    edge.shutdown().await;
}

/// A TCP forwarder to the database that can be cut: the stand-in for a
/// network partition between a replica and its store. Cut, it drops every
/// connection it carries and every new one.
struct Forwarder {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Forwarder {
    async fn start(to: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if *watch.borrow() {
                    continue;
                }
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", to)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = watch.wait_for(|cut| *cut) => {}
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    }
                });
            }
        });
        Self { port, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Item 4 of issue 21, with a TCP forwarder standing in for the partition:
/// a replica whose store is out of reach for longer than the revocation
/// bound refuses new agent sessions (`unavailable`, retried by the agent)
/// instead of judging them on a stale copy, while its open tunnels keep
/// serving; once the store is back it accepts them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_store_by_a_cut_forwarder_refuses_new_sessions() {
    use tuna_agent::AgentStatus;
    init();
    let cert = TestCert::new();
    let (tcp, tcp_port) = endpoint_listener();
    let server = blocking(pg_support::PgServer::start).await;
    let url = server.create_database();
    let forwarder = Forwarder::start(server.port()).await;
    let via = url.replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", forwarder.port),
    );
    assert_ne!(via, url);
    let dir = tempfile::tempdir().unwrap();
    let replica = {
        let mut config = ControlConfig::new(dir.path(), "tuna.test", "127.0.0.1");
        config.store = Some(via.parse().unwrap());
        config.tcp_port_range = tcp_port..=tcp_port;
        blocking(move || ControlPlane::open(config).unwrap()).await
    };
    let owner = Caller {
        key_id: "test".into(),
        account: "default".into(),
        scopes: vec![Scope::Full],
    };
    let mint = |alias: &'static str| {
        let (plane, owner) = (replica.clone(), owner.clone());
        blocking(move || {
            plane
                .create_tcp_endpoint(
                    &owner,
                    &CreateTcpEndpoint {
                        alias: alias.into(),
                        port: None,
                    },
                )
                .ok();
            let request = CreateToken {
                bindings: Bindings {
                    hosts: Vec::new(),
                    tcp_endpoints: vec![alias.into()],
                    addresses: Vec::new(),
                },
                ..Default::default()
            };
            plane.create_token(&owner, &request).unwrap()
        })
    };
    let open = mint("db").await;
    let later = {
        let (plane, owner) = (replica.clone(), owner.clone());
        blocking(move || {
            let request = CreateToken {
                bindings: Bindings {
                    hosts: vec![],
                    tcp_endpoints: vec!["db".into()],
                    addresses: Vec::new(),
                },
                ..Default::default()
            };
            plane.create_token(&owner, &request).unwrap()
        })
        .await
    };
    let mut config: EdgeConfig = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.tcp_ports = tcp_port..=tcp_port;
    config.tcp_listeners = vec![Arc::clone(&tcp)];
    let edge = EdgeServer::start(config, Arc::new(replica.clone()), None)
        .await
        .unwrap();
    let agent = start_agent(&cert, &edge, open.token.expose(), vec![Binding::tcp("db")]).await;
    agent
        .serving(&tunnel_id(open.token.expose()))
        .await
        .unwrap();

    forwarder.set_cut(true);
    let cut_at = std::time::Instant::now();
    // Once the copy is older than the bound, a new session is refused as
    // unavailable (and retried by the agent with its backoff).
    while replica.store_staleness() <= std::time::Duration::from_secs(1) {
        assert!(
            cut_at.elapsed() < std::time::Duration::from_secs(30),
            "the copy stays fresh with the store cut off"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let second = start_agent(&cert, &edge, later.token.expose(), vec![Binding::tcp("db")]).await;
    let refused = wait_status(
        &second,
        |s| matches!(s, AgentStatus::Rejected(r) if r.code == ErrorCode::Unavailable),
    )
    .await;
    eprintln!(
        "cut off from the store: new sessions refused {:?} after the cut: {refused:?}",
        cut_at.elapsed()
    );
    // The open tunnel keeps serving meanwhile.
    let mut stream = TcpStream::connect(("127.0.0.1", tcp_port)).await.unwrap();
    stream.write_all(b"still serving").await.unwrap();
    let mut back = [0u8; 13];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still serving");

    forwarder.set_cut(false);
    let healed = std::time::Instant::now();
    second
        .serving(&tunnel_id(later.token.expose()))
        .await
        .unwrap();
    eprintln!(
        "store reachable again: the refused session was accepted {:?} later",
        healed.elapsed()
    );
    edge.shutdown().await;
}

/// Issue 30, item 3: two replicas on one PostgreSQL; A reaches it
/// directly, B (with an edge and its REST API) through a [`Forwarder`] the
/// tests cut. Through A, before the cut: domains `one`, `two`, `three`,
/// `late` and `shared` of the account `default`, a token per tunnel (`two`'s
/// also for `shared`), and an API key; B has seen all of it.
struct CutReplica {
    _server: pg_support::PgServer,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    forwarder: Forwarder,
    replica_a: ControlPlane,
    replica_b: ControlPlane,
    edge: tuna_edge::EdgeHandle,
    cert: TestCert,
    owner: Caller,
    one: tuna_protocol::api::CreatedToken,
    two: tuna_protocol::api::CreatedToken,
    three: tuna_protocol::api::CreatedToken,
    late: tuna_protocol::api::CreatedToken,
    key: tuna_protocol::api::Secret,
    /// B's outage bound (`max_store_staleness`).
    bound: std::time::Duration,
    public: reqwest::Client,
}

const CUT_HOSTS: [&str; 5] = [
    "one.tuna.test",
    "two.tuna.test",
    "three.tuna.test",
    "late.tuna.test",
    "shared.tuna.test",
];

impl CutReplica {
    async fn start() -> Self {
        use std::time::{Duration, Instant};
        init();
        let cert = TestCert::new();
        let server = blocking(pg_support::PgServer::start).await;
        let url = server.create_database();
        let forwarder = Forwarder::start(server.port()).await;
        let via = url.replace(
            &format!(":{}/", server.port()),
            &format!(":{}/", forwarder.port),
        );
        assert_ne!(via, url);
        // Long enough to tell a refusal of the stale copy (after 1 s) from
        // the end of serving (after the bound) on a loaded machine.
        let bound = Duration::from_secs(6);
        let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let replica_a = {
            let mut config = ControlConfig::new(dirs.0.path(), "tuna.test", "127.0.0.1");
            config.store = Some(url.parse().unwrap());
            blocking(move || ControlPlane::open(config).unwrap()).await
        };
        let replica_b = {
            let mut config = ControlConfig::new(dirs.1.path(), "tuna.test", "127.0.0.1");
            config.store = Some(via.parse().unwrap());
            config.max_store_staleness = bound;
            blocking(move || ControlPlane::open(config).unwrap()).await
        };
        let owner = Caller {
            key_id: "test".into(),
            account: "default".into(),
            scopes: vec![Scope::Full],
        };
        let (one, two, three, late, key) = {
            let (plane, owner) = (replica_a.clone(), owner.clone());
            blocking(move || {
                for sub in ["one", "two", "three", "late", "shared"] {
                    let request = CreateDomain {
                        subdomain: Some(sub.into()),
                        domain: None,
                    };
                    plane.create_domain(&owner, &request).unwrap();
                }
                let (_, key) = plane
                    .create_key("default", None, vec![Scope::Full])
                    .unwrap();
                let token = |hosts: &[&str]| {
                    let request = CreateToken {
                        bindings: Bindings {
                            hosts: hosts.iter().map(|h| format!("{h}.tuna.test")).collect(),
                            tcp_endpoints: Vec::new(),
                            addresses: Vec::new(),
                        },
                        ..Default::default()
                    };
                    plane.create_token(&owner, &request).unwrap()
                };
                let one = token(&["one"]);
                let two = token(&["two", "shared"]);
                let three = token(&["three"]);
                // Last, so that B knowing it means B holds everything above.
                let late = token(&["late"]);
                (one, two, three, late, key)
            })
            .await
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while replica_b.authenticate_tunnel(late.token.expose()).is_err() {
            assert!(Instant::now() < deadline, "replica B never saw A's writes");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut config: EdgeConfig = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
        config.api_addr = Some("127.0.0.1:0".parse().unwrap());
        let edge = EdgeServer::start(
            config,
            Arc::new(replica_b.clone()),
            Some(replica_b.router()),
        )
        .await
        .unwrap();
        let public = http_client(&cert, &edge, &CUT_HOSTS);
        Self {
            _server: server,
            _dirs: dirs,
            forwarder,
            replica_a,
            replica_b,
            edge,
            cert,
            owner,
            one,
            two,
            three,
            late,
            key,
            bound,
            public,
        }
    }

    /// An agent on B serving `token`'s tunnel with one HTTP binding.
    async fn agent(
        &self,
        token: &tuna_protocol::api::CreatedToken,
        host: &str,
    ) -> tuna_agent::AgentHandle {
        let agent = start_agent(
            &self.cert,
            &self.edge,
            token.token.expose(),
            vec![Binding::http(host)],
        )
        .await;
        agent
            .serving(&tunnel_id(token.token.expose()))
            .await
            .unwrap();
        agent
    }

    /// Cuts B off its store and waits until B's copy is older than the
    /// revocation bound (1 s): B then judges nothing.
    async fn cut(&self) -> std::time::Instant {
        use std::time::Duration;
        self.forwarder.set_cut(true);
        let cut_at = std::time::Instant::now();
        while self.replica_b.store_staleness() <= Duration::from_secs(1) {
            assert!(
                cut_at.elapsed() < Duration::from_secs(30),
                "the copy stays fresh with the store cut off"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cut_at
    }

    /// Runs `op` on replica A (which still reaches the store).
    async fn through_a(&self, op: impl FnOnce(&ControlPlane, &Caller) + Send + 'static) {
        let (plane, owner) = (self.replica_a.clone(), self.owner.clone());
        blocking(move || op(&plane, &owner)).await;
    }

    /// The status of a public request to `host` through B.
    async fn get(&self, host: &str) -> u16 {
        self.public
            .get(http_url(&self.edge, host, "/"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// `GET /v1/domains` on B's REST API with the account's key.
    async fn list_domains(&self) -> reqwest::Response {
        let api = format!("http://{}/v1/domains", self.edge.api_addr.unwrap());
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(api)
            .bearer_auth(self.key.expose())
            .send()
            .await
            .unwrap()
    }

    /// Asserts B's copy is still younger than its outage bound: what the
    /// test saw was a refusal of the stale copy, not the end of serving.
    fn within_bound(&self) {
        assert!(
            self.replica_b.store_staleness() < self.bound,
            "the test took too long to tell a refusal from the outage bound"
        );
    }

    async fn heal(self) -> Self {
        self.forwarder.set_cut(false);
        self
    }
}

/// Waits (at most 30 s) until `agent`'s session has ended with `unavailable`.
async fn ended_unavailable(agent: &tuna_agent::AgentHandle) {
    use tuna_agent::AgentStatus;
    wait_status(
        agent,
        |s| matches!(s, AgentStatus::Rejected(r) if r.code == ErrorCode::Unavailable),
    )
    .await;
}

/// Waits (at most 30 s) until tunnel `id` serves again.
async fn serves_again(
    agent: &tuna_agent::AgentHandle,
    id: &str,
) -> Vec<tuna_protocol::wire::BindingOutcome> {
    tokio::time::timeout(std::time::Duration::from_secs(30), agent.serving(id))
        .await
        .expect("the replica did not serve again once its store was back")
        .unwrap()
}

/// A token revoked through A after B was cut off, then attached on a live
/// session of B, is not granted from B's stale copy: the session ends with
/// `unavailable` (its hello would get the same), the agent retries, and
/// once the store is back the token is refused as revoked while the
/// session's other tunnel serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_replica_does_not_grant_a_token_revoked_elsewhere_on_an_open_session() {
    let fleet = CutReplica::start().await;
    let agent = fleet.agent(&fleet.one, "one.tuna.test").await;
    fleet.cut().await;
    let id = fleet.late.id.clone();
    fleet
        .through_a(move |plane, owner| plane.revoke_token(owner, &id).unwrap())
        .await;

    let late_id = tunnel_id(fleet.late.token.expose());
    agent
        .attach(
            late_id.clone(),
            tuna_protocol::wire::TunnelToken::new(fleet.late.token.expose()),
            vec![Binding::http("late.tuna.test")],
        )
        .await
        .unwrap();
    let answer = wait_tunnel(&agent, &late_id, |s| !matches!(s, TunnelStatus::Pending)).await;
    assert!(
        !matches!(answer, TunnelStatus::Serving { .. }),
        "the cut replica granted a token revoked elsewhere: {answer:?}"
    );
    ended_unavailable(&agent).await;
    fleet.within_bound();
    assert_ne!(fleet.get("late.tuna.test").await, 200);

    let fleet = fleet.heal().await;
    serves_again(&agent, &tunnel_id(fleet.one.token.expose())).await;
    let late = wait_tunnel(&agent, &late_id, |s| {
        matches!(s, TunnelStatus::Refused(_) | TunnelStatus::Serving { .. })
    })
    .await;
    assert!(
        matches!(&late, TunnelStatus::Refused(r) if r.code == ErrorCode::BadToken),
        "{late:?}"
    );
    assert_eq!(fleet.get("one.tuna.test").await, 200);
    assert_ne!(fleet.get("late.tuna.test").await, 200);
    fleet.edge.shutdown().await;
}

/// A domain released through A after B was cut off and reserved there by
/// another account is not bound from B's stale copy when a live tunnel of
/// B adds it (`update_bindings`): the session ends with `unavailable`, and
/// once the store is back the binding is refused while the tunnel serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_replica_does_not_bind_a_domain_released_elsewhere_on_an_open_session() {
    let fleet = CutReplica::start().await;
    let agent = fleet.agent(&fleet.two, "two.tuna.test").await;
    let id = tunnel_id(fleet.two.token.expose());
    fleet.cut().await;
    fleet
        .through_a(|plane, owner| {
            plane.delete_domain(owner, "shared.tuna.test").unwrap();
            let other = Caller {
                key_id: "other-test".into(),
                account: "other".into(),
                scopes: vec![Scope::Full],
            };
            let request = CreateDomain {
                subdomain: Some("shared".into()),
                domain: None,
            };
            plane.create_domain(&other, &request).unwrap();
        })
        .await;

    let shared = Binding::http("shared.tuna.test");
    agent
        .set_bindings(&id, vec![Binding::http("two.tuna.test"), shared.clone()])
        .await
        .unwrap();
    let answer = wait_tunnel(&agent, &id, |s| match s {
        TunnelStatus::Serving { bound, .. } => bound.iter().any(|o| o.binding == shared),
        _ => true,
    })
    .await;
    if let TunnelStatus::Serving { bound, .. } = &answer {
        let outcome = bound.iter().find(|o| o.binding == shared).unwrap();
        assert!(
            outcome.bound.is_none(),
            "the cut replica bound a domain released elsewhere: {outcome:?}"
        );
    }
    ended_unavailable(&agent).await;
    fleet.within_bound();
    assert_ne!(fleet.get("shared.tuna.test").await, 200);

    let fleet = fleet.heal().await;
    let outcomes = serves_again(&agent, &id).await;
    let outcome = outcomes.iter().find(|o| o.binding == shared).unwrap();
    assert!(
        outcome.bound.is_none() && outcome.error.is_some(),
        "{outcome:?}"
    );
    assert_eq!(fleet.get("two.tuna.test").await, 200);
    assert_ne!(fleet.get("shared.tuna.test").await, 200);
    fleet.edge.shutdown().await;
}

/// A replica cut off from its store keeps serving the tunnels it granted
/// (and answering API reads from its copy) up to its outage bound, then
/// ends their sessions (`unavailable`; public requests get no answer of
/// theirs) and answers API reads `503 store_unavailable` with
/// `Retry-After`. Once the store is back, it serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_replica_stops_serving_and_answering_after_its_outage_bound() {
    use tuna_agent::AgentStatus;
    let fleet = CutReplica::start().await;
    let agent = fleet.agent(&fleet.three, "three.tuna.test").await;
    let id = tunnel_id(fleet.three.token.expose());
    assert_eq!(fleet.get("three.tuna.test").await, 200);
    assert_eq!(fleet.list_domains().await.status(), 200);
    let cut_at = fleet.cut().await;
    // Stale, within the bound: nothing new is judged, what was granted serves.
    assert_eq!(fleet.get("three.tuna.test").await, 200);
    assert_eq!(fleet.list_domains().await.status(), 200);
    fleet.within_bound();

    let mut status = agent.status();
    tokio::time::timeout(
        fleet.bound + std::time::Duration::from_secs(5),
        status.wait_for(
            |s| matches!(s, AgentStatus::Rejected(r) if r.code == ErrorCode::Unavailable),
        ),
    )
    .await
    .expect("the cut replica kept serving past its outage bound")
    .unwrap();
    eprintln!(
        "cut off from the store: the session ended {:?} after the cut (bound {:?})",
        cut_at.elapsed(),
        fleet.bound
    );
    assert!(fleet.replica_b.store_staleness() > fleet.bound);
    assert_ne!(fleet.get("three.tuna.test").await, 200);
    let resp = fleet.list_domains().await;
    assert_eq!(resp.status(), 503);
    let retry_after: u64 = resp.headers()[reqwest::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "store_unavailable", "{body}");

    let fleet = fleet.heal().await;
    let healed = std::time::Instant::now();
    serves_again(&agent, &id).await;
    eprintln!(
        "store reachable again: serving {:?} later",
        healed.elapsed()
    );
    assert_eq!(fleet.get("three.tuna.test").await, 200);
    assert_eq!(fleet.list_domains().await.status(), 200);
    fleet.edge.shutdown().await;
}
