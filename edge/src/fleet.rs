//! Any replica serves any tunnel: attachments with leases in PostgreSQL and
//! an internal hop between replicas over mutually authenticated TLS.
//!
//! # Design
//!
//! Every replica of a fleet (`edge --store postgres://… --peer-bind …`)
//! publishes what its agent sessions hold in one row of `edge_attachments`:
//! its replica id, the address other replicas dial (`--peer-advertise`), the
//! public hosts and TCP ports its tunnels serve, and a lease expiry. The row
//! is upserted whenever the local routing table changes and renewed every
//! [`RENEW`]; the upsert of a change is followed by `NOTIFY
//! tuna_attachments`, on which every replica re-reads the live rows (those
//! whose lease has not expired by the database's clock) into a local index.
//! A replica whose lease is stale is not chosen; a replica that shuts down
//! deletes its row.
//!
//! The rows stay **out of the store's change log** (`store_head`,
//! `store_changes`): that log is serialised by one fleet-wide row lock and
//! is for durable reservations whose every write must reach every mirror.
//! Attachments are soft state — rebuilt by each replica from its live
//! sessions every few seconds, worthless after a crash — so they take one
//! upsert of one row per replica, no lock, and a restart of PostgreSQL
//! loses nothing that the next renewal does not put back.
//!
//! Public traffic for a host or port with no local tunnel goes to a replica
//! that holds one: over one HTTP/2 connection per peer (TLS, ALPN
//! `tuna-peer/1`, client certificates on both sides), each public
//! connection's stream carries the same [`StreamMeta`] an agent stream does
//! (client address, host or port). The owning replica relays the stream
//! through its **local** tunnel only — a hopped stream is never hopped
//! again, so there are no loops and at most one extra hop. The request
//! bytes on the stream are the ones the receiving replica would have sent
//! to an agent (its public path has already applied the header policy), so
//! the answer through the hop is the direct answer.
//!
//! Why this and not the alternatives (references in
//! `docs/edge-fleet.md`): piko gossips its endpoint table between nodes and
//! forwards a request to a node that has the upstream with a header that
//! forbids a second forward; we do the same forward with the same one-hop
//! rule, but keep the table in the PostgreSQL the fleet already depends on
//! (no second membership protocol to run and secure). cloudflared avoids a
//! hop by connecting every connector to several edge servers; the agent
//! does that too (`--edge-agent` repeated), and the hop covers a replica
//! that a load balancer picks while the agent is not (yet) connected to it.
//!
//! # Trust between replicas
//!
//! The peer listener accepts only clients whose certificate chains to
//! `--peer-ca`, carries the DNS name [`PEER_SERVER_NAME`] and lists the
//! extended key usage `clientAuth`; a replica dialling a peer checks the
//! peer's certificate against the same CA for the same name. Each replica's
//! `--peer-tls-cert` must therefore carry that DNS name and both usages
//! (`serverAuth`, `clientAuth`) and be issued by the fleet's CA (one
//! certificate shared by all replicas works too). Another certificate of
//! the same CA is not a peer. A peer is trusted to state the public
//! client's address.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::task::AbortOnDropHandle;
use tuna_protocol::mux;
use tuna_protocol::wire::{HANDSHAKE_TIMEOUT, StreamKind, StreamMeta};

use crate::budget::{PreAuthBudget, PreAuthSlot};
use crate::control::{FleetShare, StoreUrl};
use crate::error::{Error, Result};
use crate::registry::{AgentSession, Peers, Registry, TCP_COPY_BUFFER, TunnelRoute};
use crate::tasks::TaskGuard;

/// ALPN of the peer listener.
pub const PEER_ALPN: &[u8] = b"tuna-peer/1";
/// The name a replica's peer certificate must carry (and is checked for).
pub const PEER_SERVER_NAME: &str = "tuna-edge-peer";
/// A lease lasts this long after its last renewal. Long enough to bridge a
/// restart of PostgreSQL (a replica that died is noticed sooner: its peer
/// connection drops).
pub const LEASE: Duration = Duration::from_secs(10);
/// How often a replica renews its lease and re-reads the others'.
pub const RENEW: Duration = Duration::from_secs(2);
/// The `NOTIFY` channel attachment changes are announced on.
const CHANNEL: &str = "tuna_attachments";
/// How long a hop waits for the peer to grant a stream.
const PEER_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause bounds between attempts to reach a peer or the store.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The TLS of the internal hop: one server and one client configuration
/// built from the same certificate, key and CA files.
#[derive(Clone)]
pub struct PeerTls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls(***)")
    }
}

impl PeerTls {
    /// Loads a replica's peer certificate chain, its key and the fleet CA
    /// (PEM). Both directions check the other side against `ca_file`.
    pub fn from_files(cert_file: &Path, key_file: &Path, ca_file: &Path) -> Result<Self> {
        let tls =
            |what: &Path, e: &dyn std::fmt::Display| Error::Tls(format!("{}: {e}", what.display()));
        let chain = CertificateDer::pem_file_iter(cert_file)
            .and_then(|c| c.collect::<Result<Vec<_>, _>>())
            .map_err(|e| tls(cert_file, &e))?;
        if chain.is_empty() {
            return Err(tls(cert_file, &"no CERTIFICATE block found"));
        }
        let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| tls(key_file, &e))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file).map_err(|e| tls(ca_file, &e))? {
            roots
                .add(cert.map_err(|e| tls(ca_file, &e))?)
                .map_err(|e| tls(ca_file, &e))?;
        }
        if roots.is_empty() {
            return Err(tls(ca_file, &"no CERTIFICATE block found"));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain_of_ca = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::clone(&roots),
            Arc::clone(&provider),
        )
        .build()
        .map_err(|e| tls(ca_file, &e))?;
        let verifier = Arc::new(PeerClientVerifier {
            chain_of_ca,
            roots: Arc::clone(&roots),
            algorithms: provider.signature_verification_algorithms,
        });
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| tls(cert_file, &e))?;
        server.alpn_protocols = vec![PEER_ALPN.to_vec()];
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls(cert_file, &e))?;
        client.alpn_protocols = vec![PEER_ALPN.to_vec()];
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// The object identifier of the extended key usage `clientAuth`
/// (1.3.6.1.5.5.7.3.2), DER-encoded without its tag and length.
const EKU_CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];

/// The peer listener's check of a client: a chain to `--peer-ca` (as
/// rustls' WebPKI verifier checks it) **and** a certificate made for a
/// peer — the DNS name [`PEER_SERVER_NAME`] and the extended key usage
/// `clientAuth`, which WebPKI requires only when the certificate lists key
/// usages at all. A CA that also issues other certificates (a corporate
/// CA, a cert-manager issuer) thereby does not make their holders peers.
#[derive(Debug)]
struct PeerClientVerifier {
    chain_of_ca: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    roots: Arc<rustls::RootCertStore>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::server::danger::ClientCertVerifier for PeerClientVerifier {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.chain_of_ca.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = self
            .chain_of_ca
            .verify_client_cert(end_entity, intermediates, now)?;
        let refused = |error: rustls::CertificateError, why: &str| {
            tracing::warn!(%why, "peer listener: a client certificate of --peer-ca refused");
            rustls::Error::InvalidCertificate(error)
        };
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| refused(rustls::CertificateError::BadEncoding, "not a certificate"))?;
        cert.verify_for_usage(
            self.algorithms.all,
            &self.roots.roots,
            intermediates,
            now,
            webpki::KeyUsage::required(EKU_CLIENT_AUTH),
            None,
            None,
        )
        .map_err(|_| {
            refused(
                rustls::CertificateError::InvalidPurpose,
                "no extended key usage clientAuth",
            )
        })?;
        let name = ServerName::try_from(PEER_SERVER_NAME).expect("a DNS name");
        cert.verify_is_valid_for_subject_name(&name).map_err(|_| {
            refused(
                rustls::CertificateError::NotValidForName,
                "no DNS name tuna-edge-peer",
            )
        })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain_of_ca.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain_of_ca.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.chain_of_ca.supported_verify_schemes()
    }
}

/// What makes an edge a replica that hops to and from its peers.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The fleet's PostgreSQL (the same `--store` the control plane uses).
    pub store: StoreUrl,
    /// This replica's id in `edge_attachments` (stable across restarts, so
    /// a restarted replica takes its old row over).
    pub replica_id: String,
    /// Where the peer listener binds.
    pub peer_bind: SocketAddr,
    /// The address other replicas dial; `None`: the bound address.
    pub peer_advertise: Option<SocketAddr>,
    /// Certificates of the hop.
    pub tls: PeerTls,
    /// Set to the number of live replicas (this one included) whenever the
    /// leases are read: the API's rate limits are the fleet's, shared out
    /// (`ControlConfig::fleet_share` is the same handle).
    pub share: FleetShare,
    /// The least time between two rounds of the lease loop (upsert of this
    /// replica's row, `NOTIFY`, read of every live row) that a change woke
    /// (a tunnel attached or detached here, another replica's `NOTIFY`):
    /// changes arriving meanwhile are published together by the next
    /// round. [`LEASE_ROUND_INTERVAL`] by default; zero publishes every
    /// change on its own (the behaviour before coalescing, for the bench).
    pub round_interval: Duration,
}

/// See [`FleetConfig::round_interval`]: at most 4 rounds a second from
/// changes (3 statements each), plus the renewal every [`RENEW`].
pub const LEASE_ROUND_INTERVAL: Duration = Duration::from_millis(250);

/// One other replica as the index knows it.
struct Peer {
    addr: SocketAddr,
    /// The lease's end on this machine's clock.
    deadline: Instant,
    hosts: HashSet<String>,
    ports: HashSet<u16>,
    /// The open connection to it, as a route (tunnel id empty: the peer
    /// resolves the target itself).
    link: Option<Arc<TunnelRoute>>,
    /// Whether a task is keeping a connection to it.
    linking: bool,
}

/// The other replicas' attachments, read from the store.
pub(crate) struct FleetIndex {
    peers: RwLock<HashMap<String, Peer>>,
}

impl FleetIndex {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            peers: RwLock::new(HashMap::new()),
        })
    }

    fn pick(&self, holds: impl Fn(&Peer) -> bool) -> Option<Arc<TunnelRoute>> {
        let now = Instant::now();
        let peers = self.peers.read();
        let mut live: Vec<(&String, &Arc<TunnelRoute>)> = peers
            .iter()
            .filter(|(_, p)| p.deadline > now && holds(p))
            .filter_map(|(id, p)| p.link.as_ref().map(|l| (id, l)))
            .filter(|(_, l)| !l.closed.is_cancelled())
            .collect();
        // The same choice for the same table: the lowest replica id.
        live.sort_by(|a, b| a.0.cmp(b.0));
        live.first().map(|(_, l)| Arc::clone(l))
    }

    /// Ports some live replica serves.
    fn ports(&self) -> HashSet<u16> {
        let now = Instant::now();
        self.peers
            .read()
            .values()
            .filter(|p| p.deadline > now)
            .flat_map(|p| p.ports.iter().copied())
            .collect()
    }
}

impl Peers for FleetIndex {
    fn route_for_host(&self, host: &str) -> Option<Arc<TunnelRoute>> {
        self.pick(|p| p.hosts.contains(host))
    }

    fn route_for_port(&self, port: u16) -> Option<Arc<TunnelRoute>> {
        self.pick(|p| p.ports.contains(&port))
    }
}

struct Row {
    replica: String,
    addr: SocketAddr,
    hosts: Vec<String>,
    ports: Vec<u16>,
    remaining: Duration,
}

/// Starts the peer listener and the lease task; returns the bound peer
/// address. Everything ends with `guard`'s cancellation. A connection to
/// the peer listener holds a slot of `pre_auth` until its client
/// certificate is verified (the mutual TLS handshake is done); over budget
/// it is closed at accept.
pub(crate) async fn start(
    config: FleetConfig,
    registry: Arc<Registry>,
    guard: TaskGuard,
    pre_auth: PreAuthBudget,
) -> Result<SocketAddr> {
    let pg = config.store.config()?;
    let listener = TcpListener::bind(config.peer_bind).await.map_err(|e| {
        Error::Config(format!(
            "cannot listen on {} for the peer listener: {e}",
            config.peer_bind
        ))
    })?;
    let bound = listener.local_addr()?;
    let advertise = config.peer_advertise.unwrap_or(bound);
    if advertise.ip().is_unspecified() {
        return Err(Error::Config(format!(
            "--peer-bind {bound} is a wildcard address: give --peer-advertise, the address other replicas dial"
        )));
    }
    let index = FleetIndex::new();
    registry.set_fleet(index.clone());

    let acceptor = TlsAcceptor::from(Arc::clone(&config.tls.server));
    {
        let registry = Arc::clone(&registry);
        let guard = guard.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = guard.cancel.cancelled() => return,
                    a = listener.accept() => a,
                };
                match accepted {
                    Ok((tcp, peer)) => {
                        let Some(slot) = pre_auth.try_acquire(peer.ip()) else {
                            tracing::debug!(%peer, "peer listener: too many connections without a verified certificate; closing");
                            continue;
                        };
                        let _ = tcp.set_nodelay(true);
                        let acceptor = acceptor.clone();
                        let registry = Arc::clone(&registry);
                        let g = guard.clone();
                        tokio::spawn(async move {
                            let cancel = g.cancel.clone();
                            let evicted = slot.evicted();
                            tokio::select! {
                                _ = cancel.cancelled() => {}
                                _ = evicted.cancelled() => {}
                                r = serve_peer(tcp, acceptor, registry, g, slot) => if let Err(e) = r {
                                    tracing::debug!(%peer, error = %e, "peer connection ended");
                                }
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept on the peer listener failed");
                        tokio::time::sleep(BACKOFF_MIN).await;
                    }
                }
            }
        });
    }
    let lease = Lease {
        pg,
        store: config.store.redacted(),
        me: config.replica_id,
        advertise,
        registry,
        index,
        tls: TlsConnector::from(Arc::clone(&config.tls.client)),
        guard,
        share: config.share,
        round_interval: config.round_interval,
    };
    tokio::spawn(lease.run());
    Ok(bound)
}

/// Serves one peer connection: every stream is a hopped public connection
/// for a target of a local tunnel.
async fn serve_peer(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    registry: Arc<Registry>,
    guard: TaskGuard,
    pre_auth: PreAuthSlot,
) -> Result<()> {
    let tls = timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;
    // The handshake verified the client's certificate: a peer.
    drop(pre_auth);
    let mut conn = timeout(
        HANDSHAKE_TIMEOUT,
        mux::server_builder().handshake::<_, bytes::Bytes>(mux::Coalesced::new(tls)),
    )
    .await
    .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;
    while let Some(accepted) = conn.accept().await {
        let (request, respond) = accepted?;
        let registry = Arc::clone(&registry);
        let _g = guard.clone();
        tokio::spawn(async move {
            let _g = _g;
            if let Err(e) = hop_in(request, respond, registry).await {
                tracing::debug!(error = %e, "hopped stream ended");
            }
        });
    }
    Ok(())
}

/// Relays one hopped stream through the local tunnel of its target, never
/// through another peer.
async fn hop_in(
    request: http::Request<h2::RecvStream>,
    respond: h2::server::SendResponse<bytes::Bytes>,
    registry: Arc<Registry>,
) -> Result<()> {
    let meta = StreamMeta::from_headers(request.headers())?;
    let (route, kind) = match meta.kind {
        StreamKind::Http { host, scheme } => {
            let route = registry.local_route_for_host(&host);
            (route, StreamKind::Http { host, scheme })
        }
        StreamKind::Tcp { port, .. } => match registry.local_route_for_port(port) {
            Some((route, endpoint)) => (Some(route), StreamKind::Tcp { endpoint, port }),
            None => (
                None,
                StreamKind::Tcp {
                    endpoint: String::new(),
                    port,
                },
            ),
        },
        StreamKind::Address { address } => (
            registry.local_route_for_address(address),
            StreamKind::Address { address },
        ),
    };
    let Some(route) = route else {
        // The sender's index was stale: refuse the stream (it answers as
        // for a tunnel that went away).
        return Err(Error::Closed(format!(
            "no local tunnel for the hopped {kind:?}"
        )));
    };
    let (_, mut inbound) = mux::accept_stream(request, respond)?;
    let local = StreamMeta {
        client_addr: meta.client_addr,
        kind,
        tunnel: route.tunnel.clone(),
    };
    let mut outbound = route.open(&local).await?;
    tokio::select! {
        _ = route.closed.cancelled() => {}
        r = tokio::io::copy_bidirectional_with_sizes(&mut inbound, &mut outbound, TCP_COPY_BUFFER, TCP_COPY_BUFFER) => {
            r?;
        }
    }
    Ok(())
}

/// The lease task: publishes this replica's attachments, reads the others'.
struct Lease {
    pg: crate::control::StoreTarget,
    store: String,
    me: String,
    advertise: SocketAddr,
    registry: Arc<Registry>,
    index: Arc<FleetIndex>,
    tls: TlsConnector,
    guard: TaskGuard,
    share: FleetShare,
    round_interval: Duration,
}

impl Lease {
    async fn run(self) {
        let me = Arc::new(self);
        let wake = Arc::new(Notify::new());
        let mut backoff = BACKOFF_MIN;
        loop {
            let cancel = me.guard.cancel.clone();
            // Not raced against the cancellation: the session ends by itself
            // when cancelled, after deleting this replica's row.
            let session = Arc::clone(&me).session(Arc::clone(&wake)).await;
            if cancel.is_cancelled() {
                return;
            }
            if let Err(e) = session {
                tracing::warn!(store = %me.store, error = %e, retry_in = ?backoff, "attachment leases: store unreachable");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One connection to the store: LISTEN, then renew and re-read until it fails.
    async fn session(self: Arc<Self>, wake: Arc<Notify>) -> Result<(), tokio_postgres::Error> {
        let (client, mut connection) = self.pg.connect().await?;
        let notified = Arc::clone(&wake);
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            use futures::StreamExt;
            while let Some(message) = messages.next().await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notification(_)) => notified.notify_one(),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "attachment connection ended");
                        break;
                    }
                }
            }
        });
        let _driver = AbortOnDropHandle::new(driver);
        client
            .batch_execute(&format!("SET statement_timeout = 5000; LISTEN {CHANNEL}"))
            .await?;
        let mut published: Option<(Vec<String>, Vec<u16>)> = None;
        loop {
            let (mut hosts, mut ports) = self.registry.local_targets();
            hosts.sort();
            ports.sort_unstable();
            let changed = published.as_ref() != Some(&(hosts.clone(), ports.clone()));
            let ports_sql: Vec<i32> = ports.iter().map(|p| i32::from(*p)).collect();
            client
                .execute(
                    "INSERT INTO edge_attachments (replica, peer_addr, hosts, ports, expires_at) \
                     VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond') \
                     ON CONFLICT (replica) DO UPDATE SET peer_addr = EXCLUDED.peer_addr, \
                     hosts = EXCLUDED.hosts, ports = EXCLUDED.ports, expires_at = EXCLUDED.expires_at",
                    &[
                        &self.me,
                        &self.advertise.to_string(),
                        &hosts,
                        &ports_sql,
                        &(LEASE.as_millis() as f64),
                    ],
                )
                .await?;
            if changed {
                client
                    .execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &self.me])
                    .await?;
                published = Some((hosts, ports));
            }
            let rows = client
                .query(
                    "SELECT replica, peer_addr, hosts, ports, \
                     EXTRACT(EPOCH FROM (expires_at - now()))::float8 \
                     FROM edge_attachments WHERE expires_at > now() AND replica <> $1",
                    &[&self.me],
                )
                .await?;
            let rows = rows
                .iter()
                .filter_map(|row| {
                    let addr: String = row.get(1);
                    let ports: Vec<i32> = row.get(3);
                    let remaining: f64 = row.get(4);
                    Some(Row {
                        replica: row.get(0),
                        addr: addr.parse().ok()?,
                        hosts: row.get(2),
                        ports: ports
                            .into_iter()
                            .filter_map(|p| u16::try_from(p).ok())
                            .collect(),
                        remaining: Duration::from_secs_f64(remaining.max(0.0)),
                    })
                })
                .collect();
            self.apply(rows);
            let round_done = tokio::time::Instant::now();
            let (deleted, woken) = tokio::select! {
                _ = self.guard.cancel.cancelled() => (true, false),
                _ = self.registry.changed.notified() => (false, true),
                _ = wake.notified() => (false, true),
                _ = tokio::time::sleep(RENEW) => (false, false),
            };
            // Coalesce: a burst of changes (1 000 tunnels attaching at
            // once) is published by one round per interval, not one each.
            let deleted = if woken && !deleted {
                tokio::select! {
                    _ = self.guard.cancel.cancelled() => true,
                    _ = tokio::time::sleep_until(round_done + self.round_interval) => false,
                }
            } else {
                deleted
            };
            if deleted {
                // Shutting down: the others stop choosing this replica now
                // rather than at the lease's end.
                let _ = timeout(
                    Duration::from_secs(1),
                    client.execute(
                        "DELETE FROM edge_attachments WHERE replica = $1",
                        &[&self.me],
                    ),
                )
                .await;
                let _ = timeout(
                    Duration::from_secs(1),
                    client.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &self.me]),
                )
                .await;
                return Ok(());
            }
        }
    }

    /// Replaces the index with `rows` and starts links to new peers.
    fn apply(self: &Arc<Self>, rows: Vec<Row>) {
        // The rows are the other live replicas.
        let replicas = rows.len() + 1;
        if self.share.replicas() as usize != replicas {
            tracing::info!(replicas, "replicas sharing the API's rate limits");
        }
        self.share.set(replicas);
        let now = Instant::now();
        let mut start = Vec::new();
        {
            let mut peers = self.index.peers.write();
            let seen: HashSet<&str> = rows.iter().map(|r| r.replica.as_str()).collect();
            peers.retain(|id, p| {
                let keep = seen.contains(id.as_str());
                if !keep && let Some(link) = &p.link {
                    link.session.closed.cancel();
                }
                keep
            });
            for row in rows {
                let peer = peers.entry(row.replica.clone()).or_insert_with(|| Peer {
                    addr: row.addr,
                    deadline: now,
                    hosts: HashSet::new(),
                    ports: HashSet::new(),
                    link: None,
                    linking: false,
                });
                if peer.addr != row.addr {
                    // Moved: the old connection goes to whoever is there now.
                    if let Some(link) = peer.link.take() {
                        link.session.closed.cancel();
                    }
                    peer.addr = row.addr;
                }
                peer.deadline = now + row.remaining;
                peer.hosts = row.hosts.into_iter().collect();
                peer.ports = row.ports.into_iter().collect();
                if !peer.linking {
                    peer.linking = true;
                    start.push(row.replica);
                }
            }
        }
        self.registry.set_fleet_ports(self.index.ports());
        for id in start {
            tokio::spawn(Arc::clone(self).link(id));
        }
    }

    /// Keeps a connection to peer `id` while it is in the index.
    async fn link(self: Arc<Self>, id: String) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let addr = match self.index.peers.read().get(&id) {
                Some(p) => p.addr,
                None => return,
            };
            match self.connect(&id, addr).await {
                Ok((route, driver)) => {
                    backoff = BACKOFF_MIN;
                    match self.index.peers.write().get_mut(&id) {
                        Some(p) => p.link = Some(Arc::clone(&route)),
                        None => return,
                    }
                    tracing::info!(peer = %id, %addr, "connected to a peer replica");
                    let closed = route.session.closed.clone();
                    let shutdown = self.guard.cancel.clone();
                    tokio::select! {
                        _ = driver => {}
                        _ = closed.cancelled() => {}
                        _ = shutdown.cancelled() => {}
                    }
                    route.close();
                    route.session.closed.cancel();
                    if let Some(p) = self.index.peers.write().get_mut(&id)
                        && p.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, &route))
                    {
                        p.link = None;
                    }
                    tracing::info!(peer = %id, %addr, "peer connection closed");
                }
                Err(e) => {
                    tracing::debug!(peer = %id, %addr, error = %e, retry_in = ?backoff, "cannot reach a peer replica");
                }
            }
            tokio::select! {
                _ = self.guard.cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            let mut peers = self.index.peers.write();
            if let Some(p) = peers.get_mut(&id)
                && p.deadline <= Instant::now()
            {
                // Its lease ran out: forget it until it shows up again.
                peers.remove(&id);
                return;
            }
        }
    }

    async fn connect(
        &self,
        id: &str,
        addr: SocketAddr,
    ) -> Result<(Arc<TunnelRoute>, tokio::task::JoinHandle<()>)> {
        let tcp = timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(PEER_SERVER_NAME).map_err(|e| Error::Tls(e.to_string()))?;
        let tls = timeout(HANDSHAKE_TIMEOUT, self.tls.connect(name, tcp))
            .await
            .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;
        let (sender, connection) = timeout(
            HANDSHAKE_TIMEOUT,
            mux::client_builder().handshake(mux::Coalesced::new(tls)),
        )
        .await
        .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;
        let driver = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "peer h2 connection ended");
            }
        });
        let (session, _events) = AgentSession::new(format!("peer:{id}"), sender, PEER_OPEN_TIMEOUT);
        Ok((
            TunnelRoute::new(&session, String::new(), Default::default()),
            driver,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose as Eku, IsCa, Issuer, KeyPair,
    };

    /// A leaf of `issuer` for `name` with extended key usages `usages`
    /// (none: no such extension), as (certificate PEM, key PEM).
    fn leaf(issuer: &Issuer<'_, KeyPair>, name: &str, usages: &[Eku]) -> (String, String) {
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.extended_key_usages = usages.to_vec();
        let key = KeyPair::generate().unwrap();
        (
            params.signed_by(&key, issuer).unwrap().pem(),
            key.serialize_pem(),
        )
    }

    /// Whether the peer listener's TLS (of `tls`) completes a handshake
    /// with a client showing `client` (certificate PEM, key PEM).
    async fn peer_accepts(tls: &PeerTls, ca_pem: &str, client: &(String, String)) -> bool {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = TlsAcceptor::from(Arc::clone(&tls.server));
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            acceptor.accept(tcp).await.is_ok()
        });
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(client.0.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(client.1.as_bytes()).unwrap(),
            )
            .unwrap();
        config.alpn_protocols = vec![PEER_ALPN.to_vec()];
        let tcp = TcpStream::connect(addr).await.unwrap();
        // TLS 1.3: the client is done before the server has judged its
        // certificate; the server's side of the handshake tells.
        let _client = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(PEER_SERVER_NAME).unwrap(), tcp)
            .await;
        server.await.unwrap()
    }

    /// Any certificate of `--peer-ca` was a peer: one for `metrics.internal`
    /// completed the handshake and could have hopped streams with a client
    /// address of its choosing. Only the peer name with `clientAuth` is.
    #[tokio::test]
    async fn only_peer_certificates_of_the_ca_are_peers() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let dir = tempfile::tempdir().unwrap();
        let replica = leaf(
            &issuer,
            PEER_SERVER_NAME,
            &[Eku::ServerAuth, Eku::ClientAuth],
        );
        let files = [
            ("ca.pem", &ca_pem),
            ("peer.pem", &replica.0),
            ("peer.key", &replica.1),
        ];
        for (name, pem) in files {
            std::fs::write(dir.path().join(name), pem).unwrap();
        }
        let tls = PeerTls::from_files(
            &dir.path().join("peer.pem"),
            &dir.path().join("peer.key"),
            &dir.path().join("ca.pem"),
        )
        .unwrap();

        assert!(peer_accepts(&tls, &ca_pem, &replica).await, "a replica");
        let client_only = leaf(&issuer, PEER_SERVER_NAME, &[Eku::ClientAuth]);
        assert!(peer_accepts(&tls, &ca_pem, &client_only).await);
        let refused = [
            (
                "another name",
                leaf(&issuer, "metrics.internal", &[Eku::ClientAuth]),
            ),
            ("no usages", leaf(&issuer, PEER_SERVER_NAME, &[])),
            (
                "server only",
                leaf(&issuer, PEER_SERVER_NAME, &[Eku::ServerAuth]),
            ),
        ];
        for (what, client) in &refused {
            assert!(!peer_accepts(&tls, &ca_pem, client).await, "{what}: a peer");
        }
    }

    /// A `--store` the fleet cannot use is reported with the store's own
    /// message, once (it read "invalid configuration: configuration: …"
    /// while the store and the data plane had error types of their own).
    #[tokio::test]
    async fn a_store_url_that_is_not_postgres_is_reported_once() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        crate::tls::self_signed_identity(dir.path(), &[PEER_SERVER_NAME.into()]).unwrap();
        let tls_dir = dir.path().join(crate::tls::TLS_DIR);
        let (ca, key) = (
            tls_dir.join(crate::tls::CA_CERT_FILE),
            tls_dir.join(crate::tls::CA_KEY_FILE),
        );
        let config = FleetConfig {
            store: "mysql://edge@db/tuna".parse().unwrap(),
            replica_id: "a".into(),
            peer_bind: "127.0.0.1:0".parse().unwrap(),
            peer_advertise: None,
            tls: PeerTls::from_files(&ca, &key, &ca).unwrap(),
            share: FleetShare::default(),
            round_interval: LEASE_ROUND_INTERVAL,
        };
        let (guard, _tasks) = crate::tasks::task_set();
        let registry = Registry::new(
            "127.0.0.1".parse().unwrap(),
            1024..=65535,
            &[],
            crate::registry::TcpAdmission::new(&crate::budget::EdgeLimits::default(), &[]),
            guard.clone(),
        )
        .unwrap();
        let err = start(config, registry, guard, PreAuthBudget::new(1, 1))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "configuration: --store takes a postgres://USER[:PASSWORD]@HOST:PORT/DB URL"
        );
    }
}
