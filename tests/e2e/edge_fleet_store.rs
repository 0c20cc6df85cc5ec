//! Two `tuna-operator edge --store postgres://…` processes on one real
//! PostgreSQL server (started by the test): a key made by
//! `edge keys create --store` works on both, a reservation made through one
//! replica's REST API is read at once and adopted (409) through the
//! other's, a key revoked by
//! `edge keys revoke --store` is refused by both, and the database password
//! never reaches their logs.

use crate::pg_support;
use crate::support;

use std::time::{Duration, Instant};

use support::{Edge, EdgeOptions, operator_bin};
use tuna_agent::Error;
use tuna_protocol::api::CreateDomain;

/// `tuna-operator edge keys …` against the store; its standard output.
fn keys(store: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(operator_bin())
        .args(["edge", "keys"])
        .args(args)
        .env("TUNA_EDGE_STORE", store)
        .output()
        .expect("edge keys");
    assert!(
        out.status.success(),
        "edge keys {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_edge_replicas_share_one_postgresql_store() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = tokio::task::spawn_blocking(pg_support::PgServer::start)
        .await
        .unwrap();
    let plain = server.create_database();
    // The server trusts local connections, so the password is not checked:
    // it is there to show that it never reaches a log.
    let store = plain.replacen("postgres@", "postgres:hunter2@", 1);
    let key = keys(
        &store,
        &[
            "create",
            "--scope",
            "tunnels:write",
            "--scope",
            "tunnels:connect",
        ],
    );

    let options = EdgeOptions {
        extra: vec!["--store".into(), store.clone()],
        ..EdgeOptions::default()
    };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = Edge::start(dir_a.path(), options.clone()).await;
    let mut b = Edge::start(dir_b.path(), options).await;
    // `Edge::start` made its own key in a redb data dir these edges do not
    // use; the store's key is the one that counts.
    a.key = key.clone();
    b.key = key.clone();

    let shop = CreateDomain {
        subdomain: Some("shop".into()),
        domain: None,
    };
    let created = a.client().create_domain(&shop).await.unwrap();
    // B answers with A's write at once: each API request catches up first.
    assert_eq!(
        b.client()
            .get_domain("shop.tuna.test")
            .await
            .unwrap()
            .account,
        "default"
    );
    match b.client().create_domain(&shop).await {
        Err(e @ Error::ApiAlreadyExists { .. }) => {
            let existing: tuna_protocol::api::Domain = e.existing().unwrap();
            assert_eq!(existing.name, created.name);
        }
        other => panic!("replica B should answer 409 with A's domain: {other:?}"),
    }

    // Revoked by the command line while both serve: both refuse it.
    let id = b.client().whoami().await.unwrap().key_id;
    keys(&store, &["revoke", &id]);
    let start = Instant::now();
    for edge in [&a, &b] {
        loop {
            match edge.client().whoami().await {
                Err(Error::ApiUnauthorized { .. }) => break,
                Ok(_) if start.elapsed() < support::WAIT => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                other => panic!("the revoked key still answers: {other:?}\n{}", edge.log()),
            }
        }
    }
    eprintln!(
        "both replicas refused the revoked key after {:?}",
        start.elapsed()
    );

    for edge in [&mut a, &mut b] {
        let log = edge.log();
        edge.stop().await;
        assert!(log.contains("postgres://postgres:***@127.0.0.1:"), "{log}");
        assert!(!log.contains("hunter2"), "{log}");
    }
}

/// `edge keys create --store …` at `RUST_LOG=trace` with its standard
/// error on a pipe, or on a terminal (`script` gives it one): its stderr.
fn keys_create_stderr(store: &str, terminal: bool, no_color: Option<&str>) -> String {
    let mut command = if terminal {
        let mut c = std::process::Command::new("script");
        // -e: its exit code; -q: no banner; the typescript goes nowhere.
        let line = format!(
            "{} edge keys create --scope tunnels:write >/dev/null",
            operator_bin().display()
        );
        c.args(["-qec", &line, "/dev/null"]);
        c
    } else {
        let mut c = std::process::Command::new(operator_bin());
        c.args(["edge", "keys", "create", "--scope", "tunnels:write"]);
        c
    };
    command
        .env("TUNA_EDGE_STORE", store)
        .env("RUST_LOG", "trace")
        .env_remove("NO_COLOR");
    if let Some(value) = no_color {
        command.env("NO_COLOR", value);
    }
    let out = command.output().expect("edge keys create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Through `script`, the terminal's output arrives on its stdout.
    let text = if terminal { out.stdout } else { out.stderr };
    String::from_utf8_lossy(&text).into_owned()
}

/// At `RUST_LOG=trace` tokio-postgres logged every statement with its
/// parameters (the store's key hashes and change log), and text lines on a
/// pipe carried colour codes. Now the store's driver logs at `info` at
/// most, and colour needs a terminal and no `NO_COLOR`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_statements_and_colour_codes_stay_out_of_logs() {
    let server = tokio::task::spawn_blocking(pg_support::PgServer::start)
        .await
        .unwrap();
    const ESC: char = '\u{1b}';
    // A new database each time: each run logs the store's migrations.
    let piped = keys_create_stderr(&server.create_database(), false, None);
    assert!(piped.contains("applied a store migration"), "{piped}");
    assert!(!piped.contains("tokio_postgres"), "{piped}");
    assert!(!piped.contains("with parameters"), "{piped}");
    assert!(!piped.contains(ESC), "colour on a pipe: {piped:?}");

    let terminal = keys_create_stderr(&server.create_database(), true, None);
    assert!(
        terminal.contains(ESC),
        "no colour on a terminal: {terminal:?}"
    );
    assert!(!terminal.contains("tokio_postgres"), "{terminal}");
    for value in ["1", "true"] {
        let plain = keys_create_stderr(&server.create_database(), true, Some(value));
        assert!(plain.contains("applied a store migration"), "{plain}");
        assert!(!plain.contains(ESC), "NO_COLOR={value}: {plain:?}");
    }
}

/// `edge keys create --store URL`: whether it succeeded, and its stderr.
fn try_keys_create(store: &str) -> (bool, String) {
    let out = std::process::Command::new(operator_bin())
        .args(["edge", "keys", "create", "--scope", "tunnels:write"])
        .env("TUNA_EDGE_STORE", store)
        .output()
        .expect("edge keys create");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The store took only plain TCP (`NoTls`: `sslmode=require` failed), so an
/// attacker on the database path could feed every replica keys of their
/// choosing. Now libpq's `sslmode`/`sslrootcert` work: `verify-full`
/// connects to a server that takes only TLS, and a certificate that does
/// not verify — another CA, another name — is refused before any
/// statement is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_connection_is_tls_verified_as_libpq_says() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let server = tokio::task::spawn_blocking(pg_support::PgServer::start)
        .await
        .unwrap();
    let ca = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        (pem, Issuer::new(params, key))
    };
    let (ca_pem, issuer) = ca("database CA");
    let (other_ca_pem, _) = ca("another CA");
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    server.require_tls(&cert.pem(), &key.serialize_pem());
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, other_ca_file) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
    std::fs::write(&ca_file, &ca_pem).unwrap();
    std::fs::write(&other_ca_file, &other_ca_pem).unwrap();
    let tables = |url: &str| {
        let db = url.rsplit('/').next().unwrap();
        server.psql(
            db,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
        )
    };

    let url = server.create_database();
    let (ok, log) = try_keys_create(&format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        ca_file.display()
    ));
    assert!(ok, "verify-full: {log}");
    assert_ne!(tables(&url), "0", "migrated over TLS");

    // Without TLS the server refuses: what was used above was TLS.
    let (ok, log) = try_keys_create(&format!("{}?sslmode=disable", server.create_database()));
    assert!(!ok && log.contains("no encryption"), "{log}");

    // Another CA: refused in the handshake, nothing run.
    let url = server.create_database();
    let (ok, log) = try_keys_create(&format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        other_ca_file.display()
    ));
    assert!(!ok && log.contains("certificate"), "{log}");
    assert_eq!(tables(&url), "0", "a statement ran before the refusal");

    // Another name: verify-full refuses it, verify-ca (the chain only) not.
    let by_name = server
        .create_database()
        .replacen("127.0.0.1", "localhost", 1);
    let root = format!("sslrootcert={}", ca_file.display());
    let (ok, log) = try_keys_create(&format!("{by_name}?sslmode=verify-full&{root}"));
    assert!(!ok && log.contains("certificate"), "{log}");
    let (ok, log) = try_keys_create(&format!("{by_name}?sslmode=verify-ca&{root}"));
    assert!(ok, "verify-ca: {log}");
}
