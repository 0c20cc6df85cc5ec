//! Every REST endpoint and every error code, against the real server over
//! real TLS, through `TunaClient` and through raw reqwest for error shapes.

use crate::api_support;

use std::collections::BTreeMap;
use std::time::Duration;

use api_support::{TestEdge, config};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tuna_agent::Error;
use tuna_edge::control::{ROUTES, RateLimit};
use tuna_protocol::api::{
    Bindings, CreateApiKey, CreateDomain, CreateTcpEndpoint, CreateToken, Domain, DomainKind,
    DomainStatus, RenewToken, Scope, TcpEndpoint, Timestamp,
};

fn subdomain(label: &str) -> CreateDomain {
    CreateDomain {
        subdomain: Some(label.into()),
        domain: None,
    }
}

fn custom(domain: &str) -> CreateDomain {
    CreateDomain {
        subdomain: None,
        domain: Some(domain.into()),
    }
}

fn tcp(alias: &str, port: Option<u16>) -> CreateTcpEndpoint {
    CreateTcpEndpoint {
        alias: alias.into(),
        port,
    }
}

fn code(result: Result<impl std::fmt::Debug, Error>) -> String {
    result
        .expect_err("the call should fail")
        .code()
        .unwrap_or("<none>")
        .to_owned()
}

#[tokio::test]
async fn domains_lifecycle_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let ours = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    let theirs = edge.client(&edge.key("other", &[Scope::TunnelsWrite]));

    let me = ours.whoami().await.unwrap();
    assert_eq!(me.account, "default");
    assert_eq!(me.scopes, [Scope::TunnelsWrite]);
    assert_eq!(me.base_domain, "tuna.test");
    assert_eq!(me.public_host, "edge.tuna.test");

    let app = ours.create_domain(&subdomain("App")).await.unwrap();
    assert_eq!(app.name, "app.tuna.test");
    assert_eq!(app.kind, DomainKind::Subdomain);
    assert_eq!(app.status, DomainStatus::Verified);
    assert!(app.dns_records.is_empty());

    // Same account again: 409 carrying the existing object, ready to adopt.
    let again = ours.create_domain(&subdomain("app")).await.unwrap_err();
    assert!(matches!(again, Error::ApiAlreadyExists { .. }), "{again:?}");
    assert_eq!(again.existing::<Domain>(), Some(app.clone()));

    // Another account: 403, and it cannot even see ours.
    assert_eq!(
        code(theirs.create_domain(&subdomain("app")).await),
        "held_by_other_account"
    );
    assert_eq!(code(theirs.get_domain("app.tuna.test").await), "not_found");
    assert_eq!(
        code(theirs.delete_domain("app.tuna.test").await),
        "not_found"
    );

    let shop = ours
        .create_domain(&custom("Shop.Example.test"))
        .await
        .unwrap();
    assert_eq!(shop.name, "shop.example.test");
    assert_eq!(shop.kind, DomainKind::Custom);
    assert_eq!(shop.status, DomainStatus::Pending);
    let records: Vec<(&str, &str)> = shop
        .dns_records
        .iter()
        .map(|r| (r.record_type.as_str(), r.name.as_str()))
        .collect();
    assert_eq!(
        records,
        [
            ("CNAME", "shop.example.test"),
            ("TXT", "_tuna-challenge.shop.example.test")
        ]
    );
    assert_eq!(shop.dns_records[0].value, "edge.tuna.test");
    assert!(shop.dns_records[1].value.starts_with("tuna-verify="));

    // 422: invalid and reserved names, both or neither field, custom under the base domain.
    for (request, expected) in [
        (subdomain("www"), "invalid_name"),
        (subdomain("api"), "invalid_name"),
        (subdomain("edge"), "invalid_name"),
        (subdomain("bad_label"), "invalid_name"),
        (subdomain("-x"), "invalid_name"),
        (subdomain("a.b"), "invalid_name"),
        (custom("x.tuna.test"), "invalid_name"),
        (custom("*.example.test"), "invalid_name"),
        (custom("localhost"), "invalid_name"),
        (
            CreateDomain {
                subdomain: Some("a".into()),
                domain: Some("b.example.test".into()),
            },
            "invalid_request",
        ),
        (CreateDomain::default(), "invalid_request"),
    ] {
        assert_eq!(
            code(ours.create_domain(&request).await),
            expected,
            "{request:?}"
        );
    }

    // Create-or-adopt: adopts what the account holds, refuses what another holds.
    let adopted = ours.ensure_domain(&subdomain("app")).await.unwrap();
    assert!(adopted.adopted);
    assert_eq!(adopted.object, app);
    let fresh = ours.ensure_domain(&subdomain("fresh")).await.unwrap();
    assert!(!fresh.adopted);
    ours.delete_domain("fresh.tuna.test").await.unwrap();
    assert_eq!(
        code(theirs.ensure_domain(&subdomain("app")).await),
        "held_by_other_account"
    );
    // Verifying a subdomain is a no-op that answers it.
    assert_eq!(ours.verify_domain("app.tuna.test").await.unwrap(), app);

    let names: Vec<String> = ours
        .list_domains()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, ["app.tuna.test", "shop.example.test"]);
    assert!(theirs.list_domains().await.unwrap().is_empty());
    assert_eq!(ours.get_domain("SHOP.example.test").await.unwrap(), shop);

    ours.delete_domain("app.tuna.test").await.unwrap();
    assert_eq!(code(ours.get_domain("app.tuna.test").await), "not_found");
    assert_eq!(code(ours.delete_domain("app.tuna.test").await), "not_found");
    // Released: another account may take it now.
    let taken = theirs.create_domain(&subdomain("app")).await.unwrap();
    assert_eq!(taken.account, "other");

    edge.stop().await;
}

#[tokio::test]
async fn tcp_endpoints_lifecycle_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let ours = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    let theirs = edge.client(&edge.key("other", &[Scope::TunnelsWrite]));

    let db = ours.create_tcp_endpoint(&tcp("db", None)).await.unwrap();
    assert_eq!((db.alias.as_str(), db.port), ("db", 40000));
    assert_eq!(db.address, "edge.tuna.test:40000");

    let again = ours
        .create_tcp_endpoint(&tcp("DB", None))
        .await
        .unwrap_err();
    assert_eq!(again.existing::<TcpEndpoint>(), Some(db.clone()));

    let cache = ours
        .create_tcp_endpoint(&tcp("cache", Some(40002)))
        .await
        .unwrap();
    assert_eq!(cache.port, 40002);
    // Allocation takes the lowest free port: the gap first, then past the taken one.
    let mid = ours.create_tcp_endpoint(&tcp("mid", None)).await.unwrap();
    let top = ours.create_tcp_endpoint(&tcp("top", None)).await.unwrap();
    assert_eq!((mid.port, top.port), (40001, 40003));
    ours.delete_tcp_endpoint("mid").await.unwrap();
    ours.delete_tcp_endpoint("top").await.unwrap();

    // The port is taken by our own alias: 409 with that endpoint.
    let port_taken = ours
        .create_tcp_endpoint(&tcp("other", Some(40002)))
        .await
        .unwrap_err();
    assert_eq!(port_taken.existing::<TcpEndpoint>(), Some(cache.clone()));

    // Create-or-adopt by alias; a port held under another alias is not adopted.
    let adopted = ours.ensure_tcp_endpoint(&tcp("db", None)).await.unwrap();
    assert!(adopted.adopted);
    assert_eq!(adopted.object, db);
    assert!(
        ours.ensure_tcp_endpoint(&tcp("db", Some(40000)))
            .await
            .unwrap()
            .adopted
    );
    assert!(matches!(
        ours.ensure_tcp_endpoint(&tcp("db", Some(40001))).await,
        Err(Error::ApiAlreadyExists { .. })
    ));
    assert!(matches!(
        ours.ensure_tcp_endpoint(&tcp("other", Some(40002))).await,
        Err(Error::ApiAlreadyExists { .. })
    ));

    assert_eq!(
        code(theirs.create_tcp_endpoint(&tcp("db", None)).await),
        "held_by_other_account"
    );
    assert_eq!(
        code(theirs.create_tcp_endpoint(&tcp("mine", Some(40002))).await),
        "held_by_other_account"
    );
    assert_eq!(
        code(ours.create_tcp_endpoint(&tcp("far", Some(50000))).await),
        "port_out_of_range"
    );
    assert_eq!(
        code(ours.create_tcp_endpoint(&tcp("far", Some(39999))).await),
        "port_out_of_range"
    );
    assert_eq!(
        code(ours.create_tcp_endpoint(&tcp("9db", None)).await),
        "invalid_name"
    );
    assert_eq!(
        code(ours.create_tcp_endpoint(&tcp("db_1", None)).await),
        "invalid_name"
    );

    assert_eq!(ours.get_tcp_endpoint("cache").await.unwrap(), cache);
    assert_eq!(ours.get_tcp_endpoint("40002").await.unwrap(), cache);
    assert_eq!(code(theirs.get_tcp_endpoint("40002").await), "not_found");
    let aliases: Vec<String> = ours
        .list_tcp_endpoints()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.alias)
        .collect();
    assert_eq!(aliases, ["cache", "db"]);
    assert!(theirs.list_tcp_endpoints().await.unwrap().is_empty());

    ours.delete_tcp_endpoint("40002").await.unwrap();
    assert_eq!(code(ours.get_tcp_endpoint("cache").await), "not_found");
    assert_eq!(code(ours.delete_tcp_endpoint("cache").await), "not_found");

    // Fill the range (4 ports, db holds one): the next allocation is refused with 503.
    for (alias, port) in [("e1", 40001), ("e2", 40002), ("e3", 40003)] {
        let created = ours.create_tcp_endpoint(&tcp(alias, None)).await.unwrap();
        assert_eq!(created.port, port, "{alias}");
    }
    let exhausted = ours
        .create_tcp_endpoint(&tcp("e4", None))
        .await
        .unwrap_err();
    assert!(
        matches!(&exhausted, Error::ApiTransient { status: Some(503), message } if message.contains("ports_exhausted")),
        "{exhausted:?}"
    );

    edge.stop().await;
}

#[tokio::test]
async fn tunnel_tokens_lifecycle_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let ours = edge.client(&edge.key("default", &[Scope::TunnelsConnect]));
    let theirs = edge.client(&edge.key("other", &[Scope::Full]));

    let labels = |owner: &str| -> BTreeMap<String, String> {
        [("k8s.tuna.am/owner", owner), ("ns", "prod")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let before = Timestamp::now();
    let a = ours
        .create_token(&CreateToken {
            labels: labels("tunnel-a"),
            bindings: Bindings {
                hosts: vec!["App.tuna.test".into()],
                tcp_endpoints: vec!["db".into(), "40001".into()],
                addresses: Vec::new(),
            },
            ttl_seconds: Some(3600),
        })
        .await
        .unwrap();
    assert!(a.token.expose().starts_with("tunat_"));
    assert!(
        a.expires_at >= before.plus_seconds(3600)
            && a.expires_at <= Timestamp::now().plus_seconds(3600)
    );
    assert_eq!(a.info.bindings.hosts, ["app.tuna.test"]);
    assert_eq!(a.info.bindings.tcp_endpoints, ["40001", "db"]);
    assert!(
        !format!("{a:?}").contains(a.token.expose()),
        "Debug must mask the token"
    );

    let b = ours
        .create_token(&CreateToken {
            labels: labels("tunnel-b"),
            ..CreateToken::default()
        })
        .await
        .unwrap();
    assert_ne!(a.id, b.id);

    let ids = |tokens: Vec<tuna_protocol::api::Token>| {
        tokens.into_iter().map(|t| t.id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(ours
            .list_tokens("k8s.tuna.am/owner=tunnel-a")
            .await
            .unwrap()),
        [a.id.as_str()]
    );
    assert_eq!(
        ids(ours
            .list_tokens("k8s.tuna.am/owner!=tunnel-a")
            .await
            .unwrap()),
        [b.id.as_str()]
    );
    assert_eq!(ours.list_tokens("ns=prod").await.unwrap().len(), 2);
    assert_eq!(ours.list_tokens("").await.unwrap().len(), 2);
    assert_eq!(
        ours.list_tokens("ns=prod,k8s.tuna.am/owner=tunnel-b")
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(code(ours.list_tokens("owner").await), "invalid_request");
    assert!(theirs.list_tokens("").await.unwrap().is_empty());

    let fetched = ours.get_token(&a.id).await.unwrap();
    assert_eq!(fetched.expires_at, a.expires_at);
    assert!(!fetched.expired);
    assert_eq!(code(theirs.get_token(&a.id).await), "not_found");

    let renewed = ours
        .renew_token(
            &a.id,
            &RenewToken {
                ttl_seconds: Some(7200),
            },
        )
        .await
        .unwrap();
    assert!(renewed.expires_at > a.expires_at);
    assert_eq!(
        code(
            ours.renew_token(
                &a.id,
                &RenewToken {
                    ttl_seconds: Some(0)
                }
            )
            .await
        ),
        "invalid_request"
    );
    assert_eq!(
        code(theirs.renew_token(&a.id, &RenewToken::default()).await),
        "not_found"
    );

    for bad in [
        CreateToken {
            ttl_seconds: Some(31 * 24 * 3600),
            ..CreateToken::default()
        },
        CreateToken {
            labels: [("bad key".to_owned(), "v".to_owned())].into(),
            ..CreateToken::default()
        },
    ] {
        assert_eq!(
            code(ours.create_token(&bad).await),
            "invalid_request",
            "{bad:?}"
        );
    }
    let bad_host = CreateToken {
        bindings: Bindings {
            hosts: vec!["not a host".into()],
            tcp_endpoints: vec![],
            addresses: Vec::new(),
        },
        ..CreateToken::default()
    };
    assert_eq!(code(ours.create_token(&bad_host).await), "invalid_name");

    assert_eq!(code(theirs.revoke_token(&a.id).await), "not_found");
    ours.revoke_token(&a.id).await.unwrap();
    assert_eq!(code(ours.get_token(&a.id).await), "not_found");
    assert_eq!(code(ours.revoke_token(&a.id).await), "not_found");
    assert_eq!(ids(ours.list_tokens("").await.unwrap()), [b.id.as_str()]);

    edge.stop().await;
}

#[tokio::test]
async fn expired_tokens_are_listed_as_expired_and_cannot_be_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let client = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    let token = client
        .create_token(&CreateToken {
            ttl_seconds: Some(1),
            ..CreateToken::default()
        })
        .await
        .unwrap();
    // Wait for the clock to pass the expiry (a deadline, not a readiness signal).
    let deadline = std::time::SystemTime::UNIX_EPOCH
        + Duration::from_secs(token.expires_at.unix_seconds() as u64 + 1);
    if let Ok(wait) = deadline.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
    assert!(client.get_token(&token.id).await.unwrap().expired);
    assert_eq!(
        code(client.renew_token(&token.id, &RenewToken::default()).await),
        "token_expired"
    );
    edge.stop().await;
}

#[tokio::test]
async fn authentication_scopes_and_error_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let raw = edge.raw();
    let url = |path: &str| format!("{}{path}", edge.url);
    let writer = edge.key("default", &[Scope::TunnelsWrite]);
    let connect = edge.key("default", &[Scope::TunnelsConnect]);
    let full = edge.key("default", &[Scope::Full]);

    async fn error_of(response: reqwest::Response) -> (StatusCode, Value) {
        let status = response.status();
        assert_eq!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "errors are JSON"
        );
        let body: Value = response.json().await.unwrap();
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        (status, body)
    }

    // 401: no key, malformed key, unknown key, revoked key.
    let (status, body) = error_of(raw.get(url("/v1/domains")).send().await.unwrap()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    for bad in [
        "nonsense",
        "tunak_0123456789abcdef_0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        let (status, body) = error_of(
            raw.get(url("/v1/domains"))
                .bearer_auth(bad)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthorized"))
        );
    }
    let doomed = edge
        .plane
        .create_key("default", Some("doomed".into()), vec![Scope::Full])
        .unwrap();
    let ok = raw
        .get(url("/v1/domains"))
        .bearer_auth(doomed.1.expose())
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    edge.plane.revoke_key(&doomed.0.id).unwrap();
    let (status, _) = error_of(
        raw.get(url("/v1/domains"))
            .bearer_auth(doomed.1.expose())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let typed = edge.client(&doomed.1).list_domains().await.unwrap_err();
    assert!(matches!(typed, Error::ApiUnauthorized { .. }), "{typed:?}");

    // 403: missing scope, for each scope-guarded family.
    for (method, path, body) in [
        ("POST", "/v1/domains", json!({"subdomain": "x"})),
        ("POST", "/v1/tcp-endpoints", json!({"alias": "x"})),
        ("DELETE", "/v1/domains/x.tuna.test", Value::Null),
    ] {
        let request = raw
            .request(method.parse().unwrap(), url(path))
            .bearer_auth(connect.expose())
            .json(&body);
        let (status, body) = error_of(request.send().await.unwrap()).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("missing_scope")),
            "{method} {path}"
        );
    }
    let typed = edge
        .client(&connect)
        .create_domain(&subdomain("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(&typed, Error::ApiForbidden { code, .. } if code == "missing_scope"),
        "{typed:?}"
    );
    // A connect-only key still reads reservations and mints tokens.
    assert_eq!(
        raw.get(url("/v1/domains"))
            .bearer_auth(connect.expose())
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // Full access does everything.
    let created = raw
        .post(url("/v1/domains"))
        .bearer_auth(full.expose())
        .json(&json!({"subdomain": "full"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);

    // 409 shape: code plus the existing object.
    let (status, body) = error_of(
        raw.post(url("/v1/domains"))
            .bearer_auth(writer.expose())
            .json(&json!({"subdomain": "full"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_exists"))
    );
    assert_eq!(body["existing"]["name"], "full.tuna.test");
    assert_eq!(body["existing"]["account"], "default");

    // 422: malformed JSON and a wrong field type.
    for bad in ["{not json", r#"{"alias": 5}"#] {
        let (status, body) = error_of(
            raw.post(url("/v1/tcp-endpoints"))
                .bearer_auth(writer.expose())
                .header("content-type", "application/json")
                .body(bad)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_request")),
            "{bad}"
        );
    }
    let (status, body) = error_of(
        raw.post(url("/v1/tcp-endpoints"))
            .bearer_auth(writer.expose())
            .json(&json!({"alias": "x", "port": 1}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("port_out_of_range"))
    );

    // 404: unknown object and unknown path, both JSON.
    let (status, body) = error_of(
        raw.get(url("/v1/domains/nope.tuna.test"))
            .bearer_auth(writer.expose())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = error_of(raw.get(url("/v2/whatever")).send().await.unwrap()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // Health needs no key.
    assert_eq!(
        raw.get(url("/healthz")).send().await.unwrap().status(),
        StatusCode::OK
    );

    edge.stop().await;
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.rate_limit = RateLimit {
        burst: 2,
        per_second: 0.1,
    };
    let edge = TestEdge::start(config).await;
    let key = edge.key("default", &[Scope::TunnelsWrite]);
    let raw = edge.raw();
    let url = format!("{}/v1/domains", edge.url);
    for _ in 0..2 {
        assert_eq!(
            raw.get(&url)
                .bearer_auth(key.expose())
                .send()
                .await
                .unwrap()
                .status(),
            StatusCode::OK
        );
    }
    let limited = raw
        .get(&url)
        .bearer_auth(key.expose())
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry_after), "Retry-After {retry_after}");
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited");

    let typed = edge.client(&key).list_domains().await.unwrap_err();
    match typed {
        Error::ApiRateLimited {
            retry_after: Some(wait),
            ..
        } => assert!(wait >= Duration::from_secs(1)),
        other => panic!("expected RateLimited with Retry-After, got {other:?}"),
    }
    // Another key has its own budget.
    let other = edge.key("default", &[Scope::TunnelsWrite]);
    assert_eq!(
        raw.get(&url)
            .bearer_auth(other.expose())
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    edge.stop().await;
}

#[tokio::test]
async fn every_route_is_served_and_documented() {
    let doc_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/tuna-api.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/tuna-api.md");
    // Routes in the document: headings of the form ### `METHOD /path`.
    let documented: std::collections::BTreeSet<(String, String)> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("### `"))
        .filter_map(|l| l.split_once('`').map(|(route, _)| route.to_owned()))
        .filter_map(|route| {
            route
                .split_once(' ')
                .map(|(m, p)| (m.to_owned(), p.to_owned()))
        })
        .collect();
    let served: std::collections::BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        documented, served,
        "docs/tuna-api.md and control::ROUTES differ"
    );

    // Each listed route reaches a handler (not the 404 fallback).
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let key = edge.key("default", &[Scope::Full]);
    let raw = edge.raw();
    for (method, path) in ROUTES {
        let concrete = path
            .replace("{name}", "x.tuna.test")
            .replace("{aliasOrPort}", "x")
            .replace("{address}", "192.0.2.1")
            .replace("{id}", "0123456789abcdef");
        let response = raw
            .request(method.parse().unwrap(), format!("{}{concrete}", edge.url))
            .bearer_auth(key.expose())
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(
            !text.contains("no such endpoint"),
            "{method} {path} is not routed: {status} {text}"
        );
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
    }
    edge.stop().await;
}

#[tokio::test]
async fn keys_are_managed_through_the_api_by_full_access_keys() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let admin = edge.client(&edge.key("default", &[Scope::Full]));
    let writer = edge.client(&edge.key("default", &[Scope::TunnelsWrite]));
    let foreign_admin = edge.client(&edge.key("other", &[Scope::Full]));

    let created = admin
        .create_key(&CreateApiKey {
            name: Some("reconciler".into()),
            scopes: vec![Scope::TunnelsConnect, Scope::TunnelsWrite],
        })
        .await
        .unwrap();
    assert!(created.key.expose().starts_with("tunak_"));
    assert_eq!(created.info.account, "default");
    assert_eq!(
        created.info.scopes,
        [Scope::TunnelsWrite, Scope::TunnelsConnect]
    );
    let minted = edge.client(&created.key);
    assert_eq!(minted.whoami().await.unwrap().key_id, created.info.id);

    assert_eq!(
        code(writer.create_key(&CreateApiKey::default()).await),
        "missing_scope"
    );
    assert_eq!(code(writer.list_keys().await), "missing_scope");
    assert_eq!(
        code(admin.create_key(&CreateApiKey::default()).await),
        "invalid_request"
    );

    let listed = admin.list_keys().await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().all(|k| k.account == "default"));
    assert!(listed.contains(&created.info));
    let listed_json = serde_json::to_string(&listed).unwrap();
    assert!(!listed_json.contains(created.key.expose()));

    // Another account can neither see nor revoke it.
    assert_eq!(foreign_admin.list_keys().await.unwrap().len(), 1);
    assert_eq!(
        code(foreign_admin.revoke_key(&created.info.id).await),
        "not_found"
    );

    admin.revoke_key(&created.info.id).await.unwrap();
    assert_eq!(code(minted.whoami().await), "unauthorized");
    assert_eq!(code(admin.revoke_key(&created.info.id).await), "not_found");
    edge.stop().await;
}

/// The status and JSON body of an error answer.
async fn gateway_error(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    (status, body)
}

#[tokio::test]
async fn gateway_addresses_lifecycle_and_errors() {
    use tuna_protocol::api::{GatewayAddress, List};
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.gateway_addresses = "198.51.100.0/30,2001:db8::10".parse().unwrap();
    let edge = TestEdge::start(config).await;
    let ours = edge.key("default", &[Scope::TunnelsWrite]);
    let theirs = edge.key("other", &[Scope::TunnelsWrite]);
    let reader = edge.key("default", &[Scope::TunnelsConnect]);
    let raw = edge.raw();
    let url = |path: &str| format!("{}{path}", edge.url);
    let create = |key: &tuna_protocol::api::Secret, body: Value| {
        raw.post(url("/v1/gateway-addresses"))
            .bearer_auth(key.expose())
            .json(&body)
            .send()
    };

    let response = create(&ours, json!({"name": "shop/gateway"}))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let first: GatewayAddress = response.json().await.unwrap();
    assert_eq!(first.address.to_string(), "198.51.100.1");
    assert_eq!(
        (first.name.as_str(), first.account.as_str()),
        ("shop/gateway", "default")
    );
    let response = create(&ours, json!({"name": "shop/v6", "address": "2001:db8::10"}))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let v6: GatewayAddress = response.json().await.unwrap();
    let body: Value = serde_json::to_value(&v6).unwrap();
    assert_eq!(
        body,
        json!({"address": "2001:db8::10", "name": "shop/v6", "account": "default", "createdAt": body["createdAt"]})
    );

    // Errors: each with its status and code.
    for (key, body, status, code) in [
        (
            &ours,
            json!({"name": "shop/gateway"}),
            StatusCode::CONFLICT,
            "already_exists",
        ),
        (
            &theirs,
            json!({"name": "x", "address": "198.51.100.1"}),
            StatusCode::FORBIDDEN,
            "held_by_other_account",
        ),
        (
            &ours,
            json!({"name": "x", "address": "198.51.100.3"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "address_out_of_pool",
        ),
        (
            &ours,
            json!({"name": "a b"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_name",
        ),
        (
            &ours,
            json!({"name": "x", "address": "not-an-ip"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            &reader,
            json!({"name": "x"}),
            StatusCode::FORBIDDEN,
            "missing_scope",
        ),
    ] {
        let (got, answer) = gateway_error(create(key, body.clone()).await.unwrap()).await;
        assert_eq!(
            (got, answer["code"].as_str()),
            (status, Some(code)),
            "{body}: {answer}"
        );
        if code == "already_exists" {
            assert_eq!(answer["existing"]["address"], "198.51.100.1");
        }
    }
    let response = create(&theirs, json!({"name": "shop/gateway"}))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let (status, answer) =
        gateway_error(create(&theirs, json!({"name": "more"})).await.unwrap()).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("addresses_exhausted"))
    );

    // Reads: the caller's own, sorted; a reader key may read.
    let listed: List<GatewayAddress> = raw
        .get(url("/v1/gateway-addresses"))
        .bearer_auth(reader.expose())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed.items, [first.clone(), v6.clone()]);
    let got: GatewayAddress = raw
        .get(url("/v1/gateway-addresses/2001:db8::10"))
        .bearer_auth(reader.expose())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got, v6);
    let (status, _) = gateway_error(
        raw.get(url("/v1/gateway-addresses/198.51.100.2"))
            .bearer_auth(ours.expose())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Delete gives the address back: the next reservation gets it.
    let deleted = raw
        .delete(url("/v1/gateway-addresses/198.51.100.1"))
        .bearer_auth(ours.expose())
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let (status, _) = gateway_error(
        raw.delete(url("/v1/gateway-addresses/198.51.100.1"))
            .bearer_auth(ours.expose())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let again: GatewayAddress = create(&theirs, json!({"name": "again"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again.address, first.address);
    edge.stop().await;

    // No pool: 501 naming the flag.
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(api_support::config(dir.path())).await;
    let key = edge.key("default", &[Scope::TunnelsWrite]);
    let (status, answer) = gateway_error(
        edge.raw()
            .post(format!("{}/v1/gateway-addresses", edge.url))
            .bearer_auth(key.expose())
            .json(&json!({"name": "gw"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::NOT_IMPLEMENTED, Some("no_address_pool"))
    );
    assert!(
        answer["message"]
            .as_str()
            .is_some_and(|m| m.contains("--gateway-addresses")),
        "{answer}"
    );
    edge.stop().await;
}
