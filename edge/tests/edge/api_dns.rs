//! Custom-domain verification through a real DNS server (hickory-server,
//! in process, UDP and TCP on 127.0.0.1) serving the records.

use crate::api_support;

use std::net::SocketAddr;
use std::sync::Arc;

use api_support::{TestEdge, config};
use hickory_server::Server;
use hickory_server::proto::rr::rdata::{CNAME, SOA, TXT};
use hickory_server::proto::rr::{LowerName, Name, RData, Record};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};
use tokio::net::{TcpListener, UdpSocket};
use tuna_edge::authority::SessionAuthority;
use tuna_protocol::api::{CreateDomain, Domain, DomainStatus, Scope};
use tuna_protocol::wire::{Binding, BoundTarget, TunnelToken};

/// An authoritative server for `example.test.` whose records tests add live.
struct DnsServer {
    addr: SocketAddr,
    zone: Arc<InMemoryZoneHandler>,
    server: Server<Catalog>,
    serial: u32,
}

impl DnsServer {
    async fn start() -> Self {
        let origin = Name::from_ascii("example.test.").unwrap();
        let zone = InMemoryZoneHandler::empty(origin.clone(), ZoneType::Primary, AxfrPolicy::Deny);
        let soa = SOA::new(
            Name::from_ascii("ns.example.test.").unwrap(),
            Name::from_ascii("admin.example.test.").unwrap(),
            1,
            3600,
            600,
            86400,
            60,
        );
        assert!(
            zone.upsert(Record::from_rdata(origin.clone(), 60, RData::SOA(soa)), 1)
                .await
        );
        let zone = Arc::new(zone);
        let mut catalog = Catalog::new();
        catalog.upsert(
            LowerName::new(&origin),
            vec![zone.clone() as Arc<dyn ZoneHandler>],
        );
        let mut server = Server::new(catalog);
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        server.register_socket(udp);
        // TCP on the same port, for truncated answers (the port is almost
        // surely free; UDP and TCP ports are separate namespaces).
        if let Ok(tcp) = TcpListener::bind(addr).await {
            server.register_listener(tcp, std::time::Duration::from_secs(5), 64);
        }
        Self {
            addr,
            zone,
            server,
            serial: 1,
        }
    }

    async fn add(&mut self, name: &str, data: RData) {
        self.serial += 1;
        let record = Record::from_rdata(Name::from_ascii(name).unwrap(), 60, data);
        assert!(self.zone.upsert(record, self.serial).await);
    }

    async fn stop(mut self) {
        self.server.shutdown_gracefully().await.unwrap();
    }
}

#[tokio::test]
async fn custom_domain_verifies_once_both_records_resolve() {
    let mut dns = DnsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.dns_nameservers = vec![dns.addr];
    let edge = TestEdge::start(config).await;
    let client = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));

    let domain = client
        .create_domain(&CreateDomain {
            subdomain: None,
            domain: Some("shop.example.test".into()),
        })
        .await
        .unwrap();
    let txt_value = domain.dns_records[1].value.clone();

    // Nothing published yet: still pending, and the message names what is missing.
    let pending = client.verify_domain("shop.example.test").await.unwrap();
    assert_eq!(pending.status, DomainStatus::Pending);
    let message = pending.verification_message.clone().unwrap();
    assert!(
        message.contains("_tuna-challenge.shop.example.test"),
        "{message}"
    );
    assert!(message.contains("CNAME"), "{message}");
    // Plain words, not the resolver's debug output: which record, and what to create.
    assert!(
        message.contains("not found (create it") && !message.contains("Query {"),
        "{message}"
    );

    // Wrong TXT value, right CNAME: still pending, only the TXT is reported.
    dns.add(
        "_tuna-challenge.shop.example.test.",
        RData::TXT(TXT::new(vec!["tuna-verify=wrong".into()])),
    )
    .await;
    dns.add(
        "shop.example.test.",
        RData::CNAME(CNAME(Name::from_ascii("edge.tuna.test.").unwrap())),
    )
    .await;
    let wrong = client.verify_domain("shop.example.test").await.unwrap();
    assert_eq!(wrong.status, DomainStatus::Pending);
    let message = wrong.verification_message.unwrap();
    assert!(
        message.contains("TXT") && !message.contains("CNAME"),
        "{message}"
    );

    // A session cannot bind the host yet.
    let token = client
        .create_token(&tuna_protocol::api::CreateToken {
            bindings: tuna_protocol::api::Bindings {
                hosts: vec!["shop.example.test".into()],
                tcp_endpoints: vec![],
                addresses: Vec::new(),
            },
            ..Default::default()
        })
        .await
        .unwrap();
    let grant = edge
        .plane
        .authenticate(&TunnelToken::new(token.token.expose()))
        .await
        .unwrap();
    assert!(
        edge.plane
            .check_binding(&grant, &Binding::http("shop.example.test"))
            .await
            .is_err()
    );

    dns.add(
        "_tuna-challenge.shop.example.test.",
        RData::TXT(TXT::new(vec![txt_value])),
    )
    .await;
    let verified: Domain = client.verify_domain("shop.example.test").await.unwrap();
    assert_eq!(verified.status, DomainStatus::Verified);
    assert!(verified.verified_at.is_some());
    assert_eq!(verified.verification_message, None);
    assert_eq!(
        client.get_domain("shop.example.test").await.unwrap(),
        verified
    );
    assert_eq!(
        edge.plane
            .check_binding(&grant, &Binding::http("shop.example.test"))
            .await
            .unwrap(),
        BoundTarget::Http {
            host: "shop.example.test".into()
        }
    );

    edge.stop().await;
    dns.stop().await;
}

#[tokio::test]
async fn cname_to_another_host_fails_verification() {
    let mut dns = DnsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.dns_nameservers = vec![dns.addr];
    let edge = TestEdge::start(config).await;
    let client = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    let domain = client
        .create_domain(&CreateDomain {
            subdomain: None,
            domain: Some("blog.example.test".into()),
        })
        .await
        .unwrap();
    dns.add(
        "_tuna-challenge.blog.example.test.",
        RData::TXT(TXT::new(vec![domain.dns_records[1].value.clone()])),
    )
    .await;
    dns.add(
        "blog.example.test.",
        RData::CNAME(CNAME(Name::from_ascii("elsewhere.example.test.").unwrap())),
    )
    .await;
    let result = client.verify_domain("blog.example.test").await.unwrap();
    assert_eq!(result.status, DomainStatus::Pending);
    let message = result.verification_message.unwrap();
    assert!(
        message.contains("elsewhere.example.test") && message.contains("edge.tuna.test"),
        "{message}"
    );
    edge.stop().await;
    dns.stop().await;
}

#[tokio::test]
async fn an_unverified_claim_yields_to_the_account_that_verifies() {
    let mut dns = DnsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.dns_nameservers = vec![dns.addr];
    let edge = TestEdge::start(config).await;
    let squatter = edge.client(&edge.key("squatter", &[Scope::TunnelsWrite]));
    let owner = edge.client(&edge.key("owner", &[Scope::TunnelsWrite]));
    let shop = || CreateDomain {
        subdomain: None,
        domain: Some("shop.example.test".into()),
    };

    // The squatter claims first and never verifies.
    let squatted = squatter.create_domain(&shop()).await.unwrap();
    assert_eq!(squatted.status, DomainStatus::Pending);
    // The owner can claim it too, with a challenge of its own.
    let claim = owner.create_domain(&shop()).await.unwrap();
    assert_eq!(claim.status, DomainStatus::Pending);
    assert_ne!(claim.dns_records[1].value, squatted.dns_records[1].value);

    dns.add(
        "_tuna-challenge.shop.example.test.",
        RData::TXT(TXT::new(vec![claim.dns_records[1].value.clone()])),
    )
    .await;
    dns.add(
        "shop.example.test.",
        RData::CNAME(CNAME(Name::from_ascii("edge.tuna.test.").unwrap())),
    )
    .await;
    // The squatter's challenge is not published: it stays pending.
    assert_eq!(
        squatter
            .verify_domain("shop.example.test")
            .await
            .unwrap()
            .status,
        DomainStatus::Pending
    );
    assert_eq!(
        owner
            .verify_domain("shop.example.test")
            .await
            .unwrap()
            .status,
        DomainStatus::Verified
    );
    // The verified claim holds the name; the other claim is gone.
    assert_eq!(
        squatter
            .get_domain("shop.example.test")
            .await
            .unwrap_err()
            .code(),
        Some("not_found")
    );
    assert_eq!(
        squatter.create_domain(&shop()).await.unwrap_err().code(),
        Some("held_by_other_account")
    );
    let held: Domain = owner.get_domain("shop.example.test").await.unwrap();
    assert_eq!(held.status, DomainStatus::Verified);
    edge.stop().await;
    dns.stop().await;
}

#[tokio::test]
async fn an_unverified_claim_expires() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.pending_domain_ttl = std::time::Duration::from_secs(1);
    let edge = TestEdge::start(config).await;
    let client = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    client
        .create_domain(&CreateDomain {
            subdomain: None,
            domain: Some("stale.example.test".into()),
        })
        .await
        .unwrap();
    // The expiry watcher drops it within its next turns (500 ms each).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while client.get_domain("stale.example.test").await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "an unverified custom domain outlived its pending TTL"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    edge.stop().await;
}
