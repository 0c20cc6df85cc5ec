//! The control plane as the edge's `SessionAuthority`: tokens and keys made
//! through the REST API authenticate sessions, bindings are judged against
//! reservations, revocations are broadcast.

use crate::api_support;

use std::time::Duration;

use api_support::{TestEdge, config};
use tuna_edge::authority::{Revocation, SessionAuthority, TokenId};
use tuna_protocol::api::{Bindings, CreateDomain, CreateTcpEndpoint, CreateToken, Scope};
use tuna_protocol::wire::{Binding, BoundTarget, ErrorCode, TunnelToken};

fn token_request(hosts: &[&str], tcp: &[&str], ttl: u64) -> CreateToken {
    CreateToken {
        labels: Default::default(),
        bindings: Bindings {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            tcp_endpoints: tcp.iter().map(|t| (*t).to_owned()).collect(),
            addresses: Vec::new(),
        },
        ttl_seconds: Some(ttl),
    }
}

#[tokio::test]
async fn tokens_authenticate_and_bindings_follow_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let ours = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    let theirs = edge.client(&edge.key("other", &[Scope::TunnelsWrite]));
    for label in ["app", "unlisted"] {
        ours.create_domain(&CreateDomain {
            subdomain: Some(label.into()),
            domain: None,
        })
        .await
        .unwrap();
    }
    theirs
        .create_domain(&CreateDomain {
            subdomain: Some("foreign".into()),
            domain: None,
        })
        .await
        .unwrap();
    ours.create_domain(&CreateDomain {
        subdomain: None,
        domain: Some("shop.example.test".into()),
    })
    .await
    .unwrap();
    let db = ours
        .create_tcp_endpoint(&CreateTcpEndpoint {
            alias: "db".into(),
            port: None,
        })
        .await
        .unwrap();
    let foreign_tcp = theirs
        .create_tcp_endpoint(&CreateTcpEndpoint {
            alias: "theirs".into(),
            port: None,
        })
        .await
        .unwrap();

    let created = ours
        .create_token(&token_request(
            &["app.tuna.test", "foreign.tuna.test", "shop.example.test"],
            &["db", &foreign_tcp.port.to_string()],
            600,
        ))
        .await
        .unwrap();
    let token = TunnelToken::new(created.token.expose());
    let grant = edge.plane.authenticate(&token).await.unwrap();
    assert_eq!(grant.token_id, TokenId(created.id.clone()));
    assert_eq!(grant.account, "default");
    assert!(grant.expires_at > std::time::SystemTime::now());

    let check = |binding: Binding| {
        let plane = edge.plane.clone();
        let grant = grant.clone();
        async move { plane.check_binding(&grant, &binding).await }
    };
    assert_eq!(
        check(Binding::http("APP.tuna.test")).await.unwrap(),
        BoundTarget::Http {
            host: "app.tuna.test".into()
        }
    );
    assert_eq!(
        check(Binding::tcp("db")).await.unwrap(),
        BoundTarget::Tcp { port: db.port }
    );
    assert_eq!(
        check(Binding::tcp(db.port.to_string())).await.unwrap(),
        BoundTarget::Tcp { port: db.port }
    );
    // Refused: held by the account but not in the token; allowed by the token
    // but held by another account; a custom domain not verified yet; unknown.
    for binding in [
        Binding::http("unlisted.tuna.test"),
        Binding::http("foreign.tuna.test"),
        Binding::http("shop.example.test"),
        Binding::http("nobody.tuna.test"),
        Binding::tcp(foreign_tcp.port.to_string()),
        Binding::tcp("theirs"),
        Binding::tcp("nope"),
    ] {
        let rejection = check(binding.clone()).await.unwrap_err();
        assert_eq!(
            rejection.code,
            ErrorCode::BindingNotAllowed,
            "{binding:?}: {rejection}"
        );
    }

    // Releasing the domain takes the binding away.
    ours.delete_domain("app.tuna.test").await.unwrap();
    assert_eq!(
        check(Binding::http("app.tuna.test"))
            .await
            .unwrap_err()
            .code,
        ErrorCode::BindingNotAllowed
    );

    // Bad tokens: garbage, a tampered secret, a well-formed unknown one.
    let tampered = {
        let text = created.token.expose();
        let last = if text.ends_with('0') { '1' } else { '0' };
        format!("{}{last}", &text[..text.len() - 1])
    };
    for bad in [
        "garbage".to_owned(),
        tampered,
        "tunat_0123456789abcdef_0000000000000000000000000000000000000000000000000000000000000000"
            .to_owned(),
    ] {
        let rejection = edge
            .plane
            .authenticate(&TunnelToken::new(bad))
            .await
            .unwrap_err();
        assert_eq!(rejection.code, ErrorCode::BadToken);
    }

    edge.stop().await;
}

#[tokio::test]
async fn revoking_a_token_is_broadcast_and_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let client = edge.client(&edge.key("default", &[Scope::TunnelsConnect]));
    let created = client
        .create_token(&token_request(&[], &[], 600))
        .await
        .unwrap();
    let token = TunnelToken::new(created.token.expose());
    let grant = edge.plane.authenticate(&token).await.unwrap();
    let mut revocations = edge.plane.revocations();

    client.revoke_token(&created.id).await.unwrap();
    let revoked = tokio::time::timeout(Duration::from_secs(1), revocations.recv())
        .await
        .expect("revocation announced within 1 s")
        .unwrap();
    assert_eq!(revoked, Revocation::Token(TokenId(created.id.clone())));
    assert_eq!(
        edge.plane.authenticate(&token).await.unwrap_err().code,
        ErrorCode::BadToken
    );
    // A session still holding the old grant cannot bind anything more.
    assert_eq!(
        edge.plane
            .check_binding(&grant, &Binding::http("x.tuna.test"))
            .await
            .unwrap_err()
            .code,
        ErrorCode::TokenRevoked
    );
    edge.stop().await;
}

#[tokio::test]
async fn expiring_tokens_are_refused_and_announced() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let client = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    // Subscribe first: a 1 s token may expire within milliseconds of its creation.
    let mut revocations = edge.plane.revocations();
    let created = client
        .create_token(&token_request(&[], &[], 1))
        .await
        .unwrap();
    // The expiry watcher announces the token once its lifetime is over.
    let announced = tokio::time::timeout(Duration::from_secs(5), revocations.recv())
        .await
        .expect("expiry announced")
        .unwrap();
    assert_eq!(announced, Revocation::Token(TokenId(created.id.clone())));
    let rejection = edge
        .plane
        .authenticate(&TunnelToken::new(created.token.expose()))
        .await
        .unwrap_err();
    assert_eq!(rejection.code, ErrorCode::TokenExpired);
    edge.stop().await;
}

#[tokio::test]
async fn connect_keys_open_sessions_for_their_account_until_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let writer = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    writer
        .create_domain(&CreateDomain {
            subdomain: Some("app".into()),
            domain: None,
        })
        .await
        .unwrap();
    let (connect_key, connect_secret) = edge
        .plane
        .create_key("default", None, vec![Scope::TunnelsConnect])
        .unwrap();
    let write_only = edge.key("default", &[Scope::TunnelsWrite]);

    let grant = edge
        .plane
        .authenticate(&TunnelToken::new(connect_secret.expose()))
        .await
        .unwrap();
    assert_eq!(grant.token_id, TokenId(format!("key:{}", connect_key.id)));
    assert_eq!(
        edge.plane
            .check_binding(&grant, &Binding::http("app.tuna.test"))
            .await
            .unwrap(),
        BoundTarget::Http {
            host: "app.tuna.test".into()
        }
    );
    assert_eq!(
        edge.plane
            .authenticate(&TunnelToken::new(write_only.expose()))
            .await
            .unwrap_err()
            .code,
        ErrorCode::BadToken
    );

    let mut revocations = edge.plane.revocations();
    edge.plane.revoke_key(&connect_key.id).unwrap();
    let revoked = tokio::time::timeout(Duration::from_secs(1), revocations.recv())
        .await
        .expect("key revocation announced")
        .unwrap();
    assert_eq!(revoked, Revocation::Token(grant.token_id));
    edge.stop().await;
}
