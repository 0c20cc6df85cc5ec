//! HTTPS listeners on a port of a Gateway's own address
//! (`ListenerRoutes::certificate`): the port's tunnel streams are the
//! client's TLS, terminated by the proxy with the certificate of the
//! listener the SNI selects (most specific first, as requests choose
//! listeners), then routed by the port's listeners as `https`. Real rustls
//! clients (HTTP/1.1 and h2 by ALPN) on duplex tunnel streams, real echo
//! backends, certificates made by rcgen.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_rustls::client::TlsStream;
use tuna_proxy::{ListenerRoutes, ProxyConfig, ProxyCore, ServerCertificate};

use super::gateway_address::{through, tunnel_client};
use crate::common::*;

/// A self-signed certificate for `names`: as the proxy takes it, and as a
/// client trusts it.
fn certificate(names: &[&str]) -> (ServerCertificate, CertificateDer<'static>) {
    let c = rcgen::generate_simple_self_signed(
        names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
    )
    .unwrap();
    let served = ServerCertificate::from_pem(
        c.cert.pem().as_bytes(),
        c.signing_key.serialize_pem().as_bytes(),
    )
    .unwrap();
    (served, c.cert.der().clone())
}

/// Opens a tunnel stream to `at` and shakes hands as a client trusting
/// `roots`, naming `sni` (`None`: no SNI, verifying `fallback.test`).
async fn connect(
    core: &ProxyCore,
    at: SocketAddr,
    sni: Option<&str>,
    roots: &[CertificateDer<'static>],
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<DuplexStream>> {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let info = tunnel_client();
    let core = core.clone();
    tokio::spawn(async move { core.serve_port_stream(server, info, at).await });
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.enable_sni = sni.is_some();
    let name = ServerName::try_from(sni.unwrap_or("fallback.test").to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, client)
        .await
}

/// The leaf certificate the server presented.
fn presented(tls: &TlsStream<DuplexStream>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// One HTTP/1.1 exchange on the TLS stream: (status, echoed headers).
async fn get(mut tls: TlsStream<DuplexStream>, host: &str) -> (String, String) {
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tls.read_to_end(&mut out),
    )
    .await
    .expect("the proxy closes after a Connection: close exchange")
    .unwrap();
    let out = String::from_utf8_lossy(&out).into_owned();
    let status = out.split(' ').nth(1).unwrap_or("").to_owned();
    (status, out)
}

fn echoed<'a>(answer: &'a str, header: &str) -> Option<&'a str> {
    answer
        .lines()
        .find_map(|l| l.strip_prefix(header)?.strip_prefix(": "))
}

#[tokio::test]
async fn https_listeners_terminate_tls_with_the_certificate_sni_selects_and_route_as_https() {
    let wild = echo_backend("wild").await;
    let shop = echo_backend("shop").await;
    let any = echo_backend("any").await;
    let (wild_cert, wild_der) = certificate(&["*.example.com", "*.b.example.com"]);
    let (shop_cert, shop_der) = certificate(&["shop.example.com"]);
    let (any_cert, any_der) = certificate(&["fallback.test", "other.org"]);
    let roots = [wild_der.clone(), shop_der.clone(), any_der.clone()];
    let core = ProxyCore::new(ProxyConfig::default());
    let at: SocketAddr = "127.0.100.50:443".parse().unwrap();
    let issues = core
        .set_port_routes(
            at,
            vec![
                ListenerRoutes {
                    hostname: Some("*.example.com".into()),
                    routes: vec![through(Some("*.example.com"), "/", wild)],
                    certificate: Some(wild_cert),
                },
                ListenerRoutes {
                    hostname: Some("shop.example.com".into()),
                    routes: vec![through(Some("shop.example.com"), "/", shop)],
                    certificate: Some(shop_cert),
                },
                ListenerRoutes {
                    hostname: None,
                    routes: vec![through(None, "/", any)],
                    certificate: Some(any_cert),
                },
            ],
        )
        .unwrap();
    assert!(issues.is_empty(), "{issues:?}");

    // (SNI, the certificate presented, the Host sent, the backend).
    let cases = [
        (
            Some("shop.example.com"),
            &shop_der,
            "shop.example.com",
            "shop",
        ),
        // A wildcard spans labels: the most specific listener of the name.
        (
            Some("a.b.example.com"),
            &wild_der,
            "a.b.example.com",
            "wild",
        ),
        (Some("other.org"), &any_der, "other.org", "any"),
        // No SNI: the listener without a hostname.
        (None, &any_der, "fallback.test", "any"),
    ];
    for (sni, cert, host, backend) in cases {
        let tls = connect(&core, at, sni, &roots, &[b"http/1.1"])
            .await
            .unwrap_or_else(|e| panic!("handshake for {sni:?}: {e}"));
        assert_eq!(&presented(&tls), cert, "certificate for {sni:?}");
        let (status, answer) = get(tls, host).await;
        assert_eq!(status, "200", "{sni:?}: {answer}");
        assert_eq!(echoed(&answer, "backend"), Some(backend), "{answer}");
        // The request arrived over TLS: the backend is told so.
        assert_eq!(
            echoed(&answer, "x-forwarded-proto"),
            Some("https"),
            "{answer}"
        );
    }

    // A request must be for a host of the listener whose certificate was
    // presented: else 421, as the specification's misdirected requests
    // (`GatewayHTTPSListenerDetectMisdirectedRequests`) say.
    let misdirected = [
        // (SNI, Host, status, backend)
        ("shop.example.com", "a.example.com", "421", None),
        ("a.example.com", "shop.example.com", "421", None),
        ("other.org", "shop.example.com", "421", None),
        // One listener for both: served.
        ("a.example.com", "b.c.example.com:443", "200", Some("wild")),
        ("other.org", "another.org", "200", Some("any")),
    ];
    for (sni, host, want, backend) in misdirected {
        let tls = connect(&core, at, Some(sni), &roots, &[b"http/1.1"])
            .await
            .unwrap();
        let (status, answer) = get(tls, host).await;
        assert_eq!(status, want, "SNI {sni}, Host {host}: {answer}");
        assert_eq!(echoed(&answer, "backend"), backend, "{answer}");
    }

    // h2 by ALPN (gRPC clients need it): served as HTTP/1.1 is.
    let tls = connect(
        &core,
        at,
        Some("shop.example.com"),
        &roots,
        &[b"h2", b"http/1.1"],
    )
    .await
    .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .uri("https://shop.example.com/")
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), response)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-backend"], "shop");
    // Another listener's host on the same h2 connection: 421.
    let request = http::Request::builder()
        .uri("https://a.example.com/")
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    assert_eq!(response.await.unwrap().status(), 421);

    // Plain HTTP on an HTTPS port is no handshake: closed, never answered.
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let info = tunnel_client();
    let serving = tokio::spawn({
        let core = core.clone();
        async move { core.serve_port_stream(server, info, at).await }
    });
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read_to_end(&mut out),
    )
    .await
    .expect("the stream is closed");
    assert!(!String::from_utf8_lossy(&out).contains("HTTP/1"), "{out:?}");
    serving.await.unwrap();
    // Every handshake above succeeded but this one.
    assert_eq!(metric(&core, HANDSHAKE_FAILURES), 1);
}

const HANDSHAKE_FAILURES: &str = "tuna_proxy_tls_handshake_failures_total";

#[tokio::test]
async fn a_name_no_https_listener_claims_gets_no_handshake_and_the_certificate_follows_the_routes()
{
    let shop = echo_backend("shop").await;
    let (shop_cert, shop_der) = certificate(&["shop.example.com", "other.org"]);
    let core = ProxyCore::new(ProxyConfig::default());
    let at: SocketAddr = "127.0.100.50:8443".parse().unwrap();
    let listeners = |certificate| {
        vec![ListenerRoutes {
            hostname: Some("shop.example.com".into()),
            routes: vec![through(Some("shop.example.com"), "/", shop)],
            certificate,
        }]
    };
    core.set_port_routes(at, listeners(Some(shop_cert.clone())))
        .unwrap();
    let roots = [shop_der.clone()];
    // The certificate would verify for other.org, but no listener of the
    // port claims that name: no certificate is presented at all.
    let refused = connect(&core, at, Some("other.org"), &roots, &[]).await;
    assert!(
        refused.is_err(),
        "a handshake for a name no listener claims"
    );
    // Counted once the proxy's side has ended.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while metric(&core, HANDSHAKE_FAILURES) != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed handshake was not counted"
        );
        tokio::task::yield_now().await;
    }
    let tls = connect(&core, at, Some("shop.example.com"), &roots, &[])
        .await
        .unwrap();
    assert_eq!(get(tls, "shop.example.com").await.0, "200");

    // A new certificate replaces the old one for the next handshake.
    let (renewed, renewed_der) = certificate(&["shop.example.com"]);
    assert_ne!(renewed, shop_cert);
    core.set_port_routes(at, listeners(Some(renewed))).unwrap();
    let tls = connect(
        &core,
        at,
        Some("shop.example.com"),
        &[shop_der, renewed_der.clone()],
        &[],
    )
    .await
    .unwrap();
    assert_eq!(presented(&tls), renewed_der);

    // The port becomes plain HTTP when its listener has no certificate.
    core.set_port_routes(at, listeners(None)).unwrap();
    assert!(
        connect(&core, at, Some("shop.example.com"), &roots, &[])
            .await
            .is_err()
    );
}

#[test]
fn a_certificate_needs_its_own_key_and_debug_shows_neither() {
    let a = rcgen::generate_simple_self_signed(vec!["a.example".to_owned()]).unwrap();
    let b = rcgen::generate_simple_self_signed(vec!["b.example".to_owned()]).unwrap();
    let crt = a.cert.pem();
    let key = a.signing_key.serialize_pem();
    let other_key = b.signing_key.serialize_pem();
    let ok = ServerCertificate::from_pem(crt.as_bytes(), key.as_bytes()).unwrap();
    let shown = format!("{ok:?}");
    assert!(
        !shown.contains("PRIVATE") && !shown.contains("MII"),
        "{shown}"
    );
    let cases: [(&str, &str, &str); 4] = [
        (
            &crt,
            &other_key,
            "tls.key is not the key of the certificate in tls.crt",
        ),
        ("Hello world\n", &key, "tls.crt holds no PEM certificate"),
        (&key, &key, "tls.crt holds no PEM certificate"),
        (&crt, &crt, "tls.key holds no PEM private key"),
    ];
    for (crt, key, why) in cases {
        let e = ServerCertificate::from_pem(crt.as_bytes(), key.as_bytes()).unwrap_err();
        assert_eq!(e.to_string(), format!("certificate: {why}"));
    }
}
