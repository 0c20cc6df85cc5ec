//! The store's contract, run against both backends: the embedded redb file
//! and a real PostgreSQL server (started by the test, see `pg_support`).
//!
//! Each contract test takes two control planes on one store. With
//! PostgreSQL they are two independent `ControlPlane`s (two replicas); a redb
//! file is open by one process, so there the second is a clone of the first.
//! Tests only for PostgreSQL follow (migrations, an unreachable store, the
//! schema's constraints, `edge keys create --store`).

use crate::pg_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use pg_support::PgServer;
use tuna_edge::Error;
use tuna_edge::control::{Caller, ControlConfig, ControlPlane, StoreUrl};
use tuna_edge::{Revocation, TokenId};
use tuna_protocol::api::{
    Bindings, CreateDomain, CreateGatewayAddress, CreateTcpEndpoint, CreateToken, Scope,
};

/// One store and a way to open control planes on it.
enum Fixture {
    Redb {
        dir: tempfile::TempDir,
    },
    Postgres {
        server: PgServer,
        url: String,
        dir: tempfile::TempDir,
    },
}

impl Fixture {
    fn redb() -> Self {
        Self::Redb {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn postgres() -> Self {
        let server = PgServer::start();
        let url = server.create_database();
        Self::Postgres {
            server,
            url,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self) -> ControlConfig {
        let (dir, store) = match self {
            Self::Redb { dir } => (dir.path(), None),
            Self::Postgres { url, dir, .. } => (dir.path(), Some(url.parse().unwrap())),
        };
        let mut config = ControlConfig::new(dir, "tuna.test", "edge.tuna.test");
        config.store = store;
        config.tcp_port_range = 31000..=31099;
        config.gateway_addresses = "203.0.113.0/29,2001:db8::10".parse().unwrap();
        config
    }

    fn open(&self) -> ControlPlane {
        ControlPlane::open(self.config()).unwrap()
    }

    /// Two planes on the store: two replicas, or one plane twice (redb).
    fn pair(&self) -> (ControlPlane, ControlPlane) {
        let a = self.open();
        let b = match self {
            Self::Redb { .. } => a.clone(),
            Self::Postgres { .. } => self.open(),
        };
        (a, b)
    }

    /// Simulates a crash of the store's host where it can (PostgreSQL: an
    /// immediate stop and a restart, which replays the WAL).
    fn crash_store(&self) {
        if let Self::Postgres { server, .. } = self {
            server.kill();
            server.restart();
        }
    }
}

/// Runs a contract test against both backends.
macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        $(mod $test {
            #[test]
            fn redb() {
                super::$test(super::Fixture::redb());
            }
            #[test]
            fn postgres() {
                super::$test(super::Fixture::postgres());
            }
        })*
    };
}

contract!(
    acknowledged_writes_survive_a_crash,
    racing_creates_have_one_winner_across_replicas,
    adoption_and_conflicts_hold_across_replicas,
    revocations_reach_every_replica,
    what_one_replica_made_the_other_finds_at_once,
    a_tunnel_may_attach_at_once_to_a_replica_that_did_not_mint_its_token,
);

fn caller(account: &str) -> Caller {
    Caller {
        key_id: format!("key-of-{account}"),
        account: account.to_owned(),
        scopes: vec![Scope::Full],
    }
}

fn subdomain(name: &str) -> CreateDomain {
    CreateDomain {
        subdomain: Some(name.to_owned()),
        domain: None,
    }
}

fn tcp(alias: &str) -> CreateTcpEndpoint {
    CreateTcpEndpoint {
        alias: alias.to_owned(),
        port: None,
    }
}

fn gateway(name: &str, address: Option<&str>) -> CreateGatewayAddress {
    CreateGatewayAddress {
        name: name.to_owned(),
        address: address.map(|a| a.parse().unwrap()),
    }
}

fn acknowledged_writes_survive_a_crash(store: Fixture) {
    let owner = caller("acme");
    let (key, token) = {
        let plane = store.open();
        let (key, _) = plane
            .create_key("acme", Some("ci".into()), vec![Scope::TunnelsWrite])
            .unwrap();
        plane.create_domain(&owner, &subdomain("app")).unwrap();
        plane.create_tcp_endpoint(&owner, &tcp("db")).unwrap();
        plane
            .create_gateway_address(&owner, &gateway("shop/gw", None))
            .unwrap();
        plane
            .create_gateway_address(&owner, &gateway("shop/v6", Some("2001:db8::10")))
            .unwrap();
        plane
            .create_gateway_address(&owner, &gateway("shop/gone", None))
            .unwrap();
        plane.delete_gateway_address(&owner, "203.0.113.2").unwrap();
        let token = plane
            .create_token(
                &owner,
                &CreateToken {
                    labels: BTreeMap::from([("team".into(), "a".into())]),
                    bindings: Bindings {
                        hosts: vec!["app.tuna.test".into()],
                        tcp_endpoints: vec!["db".into()],
                        addresses: Vec::new(),
                    },
                    ttl_seconds: None,
                },
            )
            .unwrap();
        (key, token)
        // The plane is dropped here, without any shutdown step.
    };
    store.crash_store();
    let plane = store.open();
    assert_eq!(plane.list_keys(), vec![key]);
    let domains: Vec<String> = plane
        .list_domains(&owner)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(domains, ["app.tuna.test"]);
    assert_eq!(plane.get_tcp_endpoint(&owner, "db").unwrap().port, 31000);
    let addresses: Vec<(String, String)> = plane
        .list_gateway_addresses(&owner)
        .unwrap()
        .into_iter()
        .map(|a| (a.address.to_string(), a.name))
        .collect();
    assert_eq!(
        addresses,
        [
            ("203.0.113.1".to_owned(), "shop/gw".to_owned()),
            ("2001:db8::10".to_owned(), "shop/v6".to_owned()),
        ]
    );
    // The address given back before the crash is free again.
    assert_eq!(
        plane
            .create_gateway_address(&caller("rival"), &gateway("x", None))
            .unwrap()
            .address
            .to_string(),
        "203.0.113.2"
    );
    let kept = plane.get_token(&owner, &token.id).unwrap();
    assert_eq!(kept.info.labels["team"], "a");
    assert_eq!(kept.info.bindings.tcp_endpoints, ["db"]);
    assert!(plane.authenticate_tunnel(token.token.expose()).is_ok());
}

fn racing_creates_have_one_winner_across_replicas(store: Fixture) {
    let (a, b) = store.pair();
    let planes = [&a, &b];
    const RACERS: usize = 8;

    // One subdomain, eight accounts, two replicas: exactly one holder.
    let barrier = Barrier::new(RACERS);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..RACERS)
            .map(|i| {
                let (plane, barrier) = (planes[i % 2], &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    plane.create_domain(&caller(&format!("account-{i}")), &subdomain("race"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        outcomes.iter().filter(|o| o.is_ok()).count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .filter_map(|o| o.as_ref().err())
            .all(|e| matches!(e, Error::HeldByOtherAccount(_))),
        "{outcomes:?}"
    );

    // One account racing itself: one create, the others adopt (409 + the object).
    let barrier = Barrier::new(RACERS);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..RACERS)
            .map(|i| {
                let (plane, barrier) = (planes[i % 2], &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    plane.create_tcp_endpoint(&caller("solo"), &tcp("same"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winner = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .collect::<Vec<_>>();
    assert_eq!(winner.len(), 1, "{outcomes:?}");
    for outcome in &outcomes {
        if let Err(e) = outcome {
            let Error::AlreadyExists { existing, .. } = e else {
                panic!("expected 409, got {e:?}");
            };
            assert_eq!(existing["port"], winner[0].port, "{existing}");
        }
    }

    // Distinct aliases on both replicas at once: every port handed out once.
    let barrier = Barrier::new(RACERS);
    let ports: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..RACERS)
            .map(|i| {
                let (plane, barrier) = (planes[i % 2], &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    plane
                        .create_tcp_endpoint(&caller(&format!("port-{i}")), &tcp(&format!("p{i}")))
                        .unwrap()
                        .port
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let distinct: BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), RACERS, "{ports:?}");
    assert!(!distinct.contains(&winner[0].port), "{ports:?}");
}

fn adoption_and_conflicts_hold_across_replicas(store: Fixture) {
    let (a, b) = store.pair();
    let created = a
        .create_domain(&caller("acme"), &subdomain("shop"))
        .unwrap();
    // The other replica sees it at once: its commit catches up first.
    match b.create_domain(&caller("acme"), &subdomain("shop")) {
        Err(Error::AlreadyExists { existing, .. }) => {
            assert_eq!(existing["name"], created.name);
            assert_eq!(existing["account"], "acme");
        }
        other => panic!("expected 409 with the existing domain, got {other:?}"),
    }
    assert!(matches!(
        b.create_domain(&caller("rival"), &subdomain("shop")),
        Err(Error::HeldByOtherAccount(_))
    ));
    let endpoint = b.create_tcp_endpoint(&caller("acme"), &tcp("db")).unwrap();
    // The port is held under another alias: 409, not an adoption.
    let taken = a.create_tcp_endpoint(
        &caller("acme"),
        &CreateTcpEndpoint {
            alias: "other".into(),
            port: Some(endpoint.port),
        },
    );
    assert!(
        matches!(taken, Err(Error::AlreadyExists { .. })),
        "{taken:?}"
    );
    assert!(matches!(
        a.create_tcp_endpoint(
            &caller("rival"),
            &CreateTcpEndpoint {
                alias: "theirs".into(),
                port: Some(endpoint.port),
            },
        ),
        Err(Error::HeldByOtherAccount(_))
    ));
    // Deleting on one replica frees the name for another account on the other.
    a.delete_domain(&caller("acme"), "shop.tuna.test").unwrap();
    b.create_domain(&caller("rival"), &subdomain("shop"))
        .unwrap();
}

/// Waits (bounded) for `wanted` on `revocations`; how long it took.
fn await_revocation(
    revocations: &mut tokio::sync::broadcast::Receiver<Revocation>,
    wanted: &Revocation,
) -> Duration {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let start = Instant::now();
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match revocations.recv().await {
                    Ok(got) if &got == wanted => return,
                    Ok(_) => {}
                    Err(e) => panic!("revocations channel: {e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{wanted:?} never reached the other replica"));
    });
    start.elapsed()
}

fn revocations_reach_every_replica(store: Fixture) {
    let (a, b) = store.pair();
    let owner = caller("acme");
    a.create_domain(&owner, &subdomain("app")).unwrap();
    let token = a
        .create_token(
            &owner,
            &CreateToken {
                bindings: Bindings {
                    hosts: vec!["app.tuna.test".into()],
                    tcp_endpoints: Vec::new(),
                    addresses: Vec::new(),
                },
                ..CreateToken::default()
            },
        )
        .unwrap();
    let (key, secret) = a.create_key("acme", None, vec![Scope::Full]).unwrap();
    let mut revocations = b.subscribe_revocations();

    a.revoke_token(&owner, &token.id).unwrap();
    let took = await_revocation(
        &mut revocations,
        &Revocation::Token(TokenId(token.id.clone())),
    );
    eprintln!("token revocation reached the other replica in {took:?}");
    assert!(b.authenticate_tunnel(token.token.expose()).is_err());

    assert!(b.authenticate_key(secret.expose()).is_ok());
    a.revoke_key(&key.id).unwrap();
    let took = await_revocation(
        &mut revocations,
        &Revocation::Token(TokenId(format!(
            "{}{}",
            tuna_edge::control::KEY_GRANT_PREFIX,
            key.id
        ))),
    );
    eprintln!("key revocation reached the other replica in {took:?}");
    assert!(matches!(
        b.authenticate_key(secret.expose()),
        Err(Error::Unauthorized(_))
    ));

    // A released TCP endpoint closes its tunnels on the other replica too.
    let endpoint = a.create_tcp_endpoint(&owner, &tcp("db")).unwrap();
    a.delete_tcp_endpoint(&owner, "db").unwrap();
    await_revocation(
        &mut revocations,
        &Revocation::Target(tuna_protocol::wire::BoundTarget::Tcp {
            port: endpoint.port,
        }),
    );

    // So does a Gateway address given back.
    let address = a
        .create_gateway_address(&owner, &gateway("shop/gw", None))
        .unwrap()
        .address;
    a.delete_gateway_address(&owner, &address.to_string())
        .unwrap();
    await_revocation(&mut revocations, &Revocation::Address(address));
}

fn what_one_replica_made_the_other_finds_at_once(store: Fixture) {
    let (a, b) = store.pair();
    let owner = caller("acme");
    // No waiting between the two: the second replica's operation must not
    // answer 404 from a copy a notification has not reached yet.
    for i in 0..20 {
        let token = b.create_token(&owner, &CreateToken::default()).unwrap();
        a.revoke_token(&owner, &token.id).unwrap();
        let domain = format!("d{i}");
        b.create_domain(&owner, &subdomain(&domain)).unwrap();
        a.delete_domain(&owner, &format!("{domain}.tuna.test"))
            .unwrap();
        b.create_tcp_endpoint(&owner, &tcp(&domain)).unwrap();
        a.delete_tcp_endpoint(&owner, &domain).unwrap();
        let (key, _) = b.create_key("acme", None, vec![Scope::Full]).unwrap();
        a.revoke_key_for(&owner, &key.id).unwrap();
    }
}

fn a_tunnel_may_attach_at_once_to_a_replica_that_did_not_mint_its_token(store: Fixture) {
    use tuna_edge::SessionAuthority;
    use tuna_protocol::wire::{Binding, TunnelToken};
    let (a, b) = store.pair();
    let owner = caller("acme");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for i in 0..20 {
        // Reserved and minted through A; attached through B with no pause.
        a.create_domain(&owner, &subdomain(&format!("t{i}")))
            .unwrap();
        let token = a
            .create_token(
                &owner,
                &CreateToken {
                    bindings: Bindings {
                        hosts: vec![format!("t{i}.tuna.test")],
                        tcp_endpoints: Vec::new(),
                        addresses: Vec::new(),
                    },
                    ..CreateToken::default()
                },
            )
            .unwrap();
        runtime.block_on(async {
            // What the edge does with a refused token of the right shape
            // (its catch-up charged to the source's failure budget first).
            let presented = TunnelToken::new(token.token.expose());
            let grant = match b.authenticate(&presented).await {
                Ok(grant) => grant,
                Err(_) => {
                    assert!(b.may_catch_up(&presented));
                    assert!(b.catch_up().await, "attempt {i}: the catch-up failed");
                    b.authenticate(&presented)
                        .await
                        .unwrap_or_else(|e| panic!("attempt {i}: {e:?}"))
                }
            };
            b.check_binding(&grant, &Binding::http(format!("t{i}.tuna.test")))
                .await
                .unwrap_or_else(|e| panic!("attempt {i}: {e:?}"));
        });
    }
}

// ---- PostgreSQL only ----

#[test]
fn two_replicas_migrate_an_empty_database_at_once() {
    let store = Fixture::postgres();
    let Fixture::Postgres { server, url, .. } = &store else {
        unreachable!()
    };
    const REPLICAS: usize = 4;
    let barrier = Barrier::new(REPLICAS);
    let planes: Vec<ControlPlane> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..REPLICAS)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    ControlPlane::open(store.config())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().expect("every replica opens"))
            .collect()
    });
    let db = url.rsplit('/').next().unwrap();
    assert_eq!(
        server.psql(
            db,
            "SELECT string_agg(version::text, ',' ORDER BY version) FROM schema_migrations"
        ),
        "1,2,3"
    );
    assert_eq!(server.psql(db, "SELECT count(*) FROM store_head"), "1");
    // And they work as one store.
    planes[0]
        .create_domain(&caller("acme"), &subdomain("one"))
        .unwrap();
    assert!(matches!(
        planes[REPLICAS - 1].create_domain(&caller("rival"), &subdomain("one")),
        Err(Error::HeldByOtherAccount(_))
    ));
}

#[test]
fn a_store_down_answers_503_and_loses_nothing() {
    let store = Fixture::postgres();
    let Fixture::Postgres { server, .. } = &store else {
        unreachable!()
    };
    let plane = store.open();
    let owner = caller("acme");
    plane.create_domain(&owner, &subdomain("before")).unwrap();

    server.kill();
    let refused = plane
        .create_domain(&owner, &subdomain("during"))
        .unwrap_err();
    assert!(
        matches!(refused, Error::StoreUnavailable { .. }),
        "{refused:?}"
    );
    let response = refused.into_response();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    // Reads answer from the mirror meanwhile (tunnels keep their grants).
    assert_eq!(plane.list_domains(&owner).unwrap().len(), 1);

    server.restart();
    // The next write reconnects.
    plane.create_domain(&owner, &subdomain("after")).unwrap();
    drop(plane);
    let reopened = store.open();
    let names: Vec<String> = reopened
        .list_domains(&owner)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, ["after.tuna.test", "before.tuna.test"]);
}

#[test]
fn an_unreachable_store_at_start_is_a_clear_error_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url: StoreUrl = format!("postgres://edge:hunter2@127.0.0.1:{port}/tuna")
        .parse()
        .unwrap();
    assert!(!format!("{url:?} {url}").contains("hunter2"));
    let dir = tempfile::tempdir().unwrap();
    let mut config = ControlConfig::new(dir.path(), "tuna.test", "edge.tuna.test");
    config.store = Some(url);
    assert!(!format!("{config:?}").contains("hunter2"));
    let error = ControlPlane::open(config).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, Error::StoreUnreachable { .. }), "{error:?}");
    assert!(
        message.contains(&format!("postgres://edge:***@127.0.0.1:{port}/tuna")),
        "{message}"
    );
    assert!(!message.contains("hunter2") && !format!("{error:?}").contains("hunter2"));

    // A URL that does not parse is refused without being echoed.
    let mut config = ControlConfig::new(dir.path(), "tuna.test", "edge.tuna.test");
    config.store = Some(
        "postgres://edge:hunter2@host:notaport/tuna"
            .parse()
            .unwrap(),
    );
    let error = ControlPlane::open(config).unwrap_err().to_string();
    assert!(
        error.contains("does not parse") && !error.contains("hunter2"),
        "{error}"
    );
}

#[test]
fn the_schema_rejects_duplicates_on_its_own() {
    let store = Fixture::postgres();
    let Fixture::Postgres { server, url, .. } = &store else {
        unreachable!()
    };
    let _plane = store.open();
    let db = url.rsplit('/').next().unwrap();
    server.psql(
        db,
        "INSERT INTO tcp_endpoints (alias, port, account, created_at) VALUES ('a', 31000, 'x', 0)",
    );
    for duplicate in [
        "INSERT INTO tcp_endpoints (alias, port, account, created_at) VALUES ('b', 31000, 'y', 0)",
        "INSERT INTO tcp_endpoints (alias, port, account, created_at) VALUES ('a', 31001, 'y', 0)",
        "INSERT INTO tcp_endpoints (alias, port, account, created_at) VALUES ('c', 70000, 'y', 0)",
    ] {
        let output = server.psql_output(db, duplicate);
        assert!(!output.status.success(), "{duplicate} was accepted");
    }
}

#[test]
fn keys_created_by_the_command_line_are_accepted_by_a_running_replica() {
    use tuna_edge::control::cli::{CreateKeyArgs, DataDirArgs, KeysArgs, KeysCommand};
    let store = Fixture::postgres();
    let Fixture::Postgres { url, .. } = &store else {
        unreachable!()
    };
    let running = store.open();
    let args = KeysArgs {
        command: KeysCommand::Create(CreateKeyArgs {
            data_dir: DataDirArgs {
                data_dir: None,
                store: Some(url.parse().unwrap()),
                store_insecure_tls: false,
            },
            scopes: vec![Scope::TunnelsWrite],
            full_access: false,
            name: Some("ci".into()),
            account: "acme".into(),
        }),
    };
    let (mut out, mut note) = (Vec::new(), Vec::new());
    tuna_edge::control::cli::run(&args, &mut out, &mut note).unwrap();
    let secret = String::from_utf8(out).unwrap().trim().to_owned();
    // The running replica hears of it by notification or by its poll.
    let deadline = Instant::now() + Duration::from_secs(10);
    let start = Instant::now();
    loop {
        match running.authenticate_key(&secret) {
            Ok(who) => {
                assert_eq!(who.account, "acme");
                break;
            }
            Err(e) if Instant::now() > deadline => {
                panic!("the running replica never accepted the key: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    eprintln!(
        "the running replica accepted the new key after {:?}",
        start.elapsed()
    );
}

#[test]
fn commits_without_a_notification_arrive_by_the_poll_and_a_pruned_log_by_a_reload() {
    let store = Fixture::postgres();
    let Fixture::Postgres { server, url, .. } = &store else {
        unreachable!()
    };
    let db = url.rsplit('/').next().unwrap();
    let plane = store.open();
    let owner = caller("acme");
    let token_of = |plane: &ControlPlane| {
        plane
            .create_token(&owner, &CreateToken::default())
            .unwrap()
            .id
    };
    let (first, second) = (token_of(&plane), token_of(&plane));
    let mut revocations = plane.subscribe_revocations();

    // A commit of another writer that sent no NOTIFY (a lost notification,
    // or a store without LISTEN/NOTIFY): the poll of store_head finds it.
    server.psql(
        db,
        &format!(
            "BEGIN; DELETE FROM tunnel_tokens WHERE id = '{first}'; \
             INSERT INTO store_changes (seq, writes) \
               SELECT seq + 1, '[{{\"DeleteToken\": \"{first}\"}}]' FROM store_head; \
             UPDATE store_head SET seq = seq + 1; COMMIT;"
        ),
    );
    let took = await_revocation(&mut revocations, &Revocation::Token(TokenId(first.clone())));
    eprintln!("a commit without NOTIFY arrived after {took:?}");

    // The change log lacks the commit (pruned): the replica reloads the
    // tables and hears what disappeared.
    server.psql(
        db,
        &format!(
            "BEGIN; DELETE FROM tunnel_tokens WHERE id = '{second}'; \
             UPDATE store_head SET seq = seq + 1; COMMIT;"
        ),
    );
    await_revocation(
        &mut revocations,
        &Revocation::Token(TokenId(second.clone())),
    );
    assert!(plane.get_token(&owner, &second).is_err());
    assert!(plane.get_token(&owner, &first).is_err());

    // A Gateway address gone in such a reload is heard as given back.
    let address = plane
        .create_gateway_address(&owner, &gateway("shop/gw", None))
        .unwrap()
        .address;
    server.psql(
        db,
        &format!(
            "BEGIN; DELETE FROM gateway_addresses WHERE address = '{address}'; \
             UPDATE store_head SET seq = seq + 1; COMMIT;"
        ),
    );
    await_revocation(&mut revocations, &Revocation::Address(address));
    assert!(plane.list_gateway_addresses(&owner).unwrap().is_empty());
}
