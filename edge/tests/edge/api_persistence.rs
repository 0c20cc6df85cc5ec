//! A restart from the same data dir keeps keys, reservations and tokens;
//! the `edge keys` commands work on that data dir.

use crate::api_support;

use api_support::{TestEdge, config};
use clap::Parser;
use tuna_edge::Error;
use tuna_edge::authority::SessionAuthority;
use tuna_edge::control::cli::{KeysArgs, run};
use tuna_protocol::api::{Bindings, CreateDomain, CreateTcpEndpoint, CreateToken, Scope, Secret};
use tuna_protocol::wire::{Binding, BoundTarget, TunnelToken};

#[tokio::test]
async fn restart_keeps_keys_reservations_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let edge = TestEdge::start(config(dir.path())).await;
    let key = edge.key("default", &[Scope::TunnelsWrite]);
    let client = edge.client(&key);
    let domain = client
        .create_domain(&CreateDomain {
            subdomain: Some("app".into()),
            domain: None,
        })
        .await
        .unwrap();
    let endpoint = client
        .create_tcp_endpoint(&CreateTcpEndpoint {
            alias: "db".into(),
            port: None,
        })
        .await
        .unwrap();
    let token = client
        .create_token(&CreateToken {
            labels: [("owner".to_owned(), "web".to_owned())].into(),
            bindings: Bindings {
                hosts: vec!["app.tuna.test".into()],
                tcp_endpoints: vec!["db".into()],
                addresses: Vec::new(),
            },
            ttl_seconds: Some(600),
        })
        .await
        .unwrap();
    let first_ca = std::fs::read(&edge.ca_file).unwrap();
    edge.stop().await;

    let edge = TestEdge::start(config(dir.path())).await;
    // Same CA: clients configured with the CA file keep working.
    assert_eq!(std::fs::read(&edge.ca_file).unwrap(), first_ca);
    let client = edge.client(&key);
    assert_eq!(client.get_domain("app.tuna.test").await.unwrap(), domain);
    assert_eq!(client.get_tcp_endpoint("db").await.unwrap(), endpoint);
    let listed = client.list_tokens("owner=web").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, token.id);
    assert_eq!(listed[0].expires_at, token.expires_at);
    // The token still authenticates and binds after the restart.
    let grant = edge
        .plane
        .authenticate(&TunnelToken::new(token.token.expose()))
        .await
        .unwrap();
    assert_eq!(
        edge.plane
            .check_binding(&grant, &Binding::tcp("db"))
            .await
            .unwrap(),
        BoundTarget::Tcp {
            port: endpoint.port
        }
    );
    // Reservations still conflict as before.
    let again = client
        .create_domain(&CreateDomain {
            subdomain: Some("app".into()),
            domain: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(again, tuna_agent::Error::ApiAlreadyExists { .. }));
    edge.stop().await;
}

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Keys(KeysArgs),
}

fn keys(args: &[&str]) -> Result<(String, String), Error> {
    let Cli {
        command: Command::Keys(keys),
    } = Cli::try_parse_from(
        std::iter::once("edge")
            .chain(std::iter::once("keys"))
            .chain(args.iter().copied()),
    )
    .expect("arguments parse");
    let (mut out, mut note) = (Vec::new(), Vec::new());
    run(&keys, &mut out, &mut note)?;
    Ok((
        String::from_utf8(out).unwrap(),
        String::from_utf8(note).unwrap(),
    ))
}

#[tokio::test]
async fn keys_cli_creates_lists_and_revokes() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();

    let (out, note) = keys(&[
        "create",
        "--scope",
        "tunnels:write",
        "--scope",
        "tunnels:connect",
        "--name",
        "ci",
        "--data-dir",
        data_dir,
    ])
    .unwrap();
    let key = out.trim().to_owned();
    assert!(key.starts_with("tunak_"), "{out:?}");
    assert!(note.contains("tunnels:write,tunnels:connect"), "{note}");
    let (full, _) = keys(&[
        "create",
        "--full-access",
        "--account",
        "team-b",
        "--data-dir",
        data_dir,
    ])
    .unwrap();
    assert!(
        keys(&[
            "create",
            "--scope",
            "tunnels:write",
            "--account",
            "Bad_Account",
            "--data-dir",
            data_dir
        ])
        .is_err()
    );

    let (list, _) = keys(&["list", "--data-dir", data_dir]).unwrap();
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert!(lines[0].starts_with("ID"));
    assert!(list.contains("ci") && list.contains("team-b") && list.contains("full"));
    // The listing never shows a secret.
    assert!(!list.contains(&key) && !list.contains(full.trim()));
    assert!(!list.contains(&key[6..]));

    // The edge accepts the created keys, with their accounts.
    let edge = TestEdge::start(config(dir.path())).await;
    // While the edge runs, the CLI refuses to touch its store.
    assert!(matches!(
        keys(&["list", "--data-dir", data_dir]),
        Err(Error::StoreInUse { .. })
    ));
    let me = edge
        .client(&Secret::new(key.clone()))
        .whoami()
        .await
        .unwrap();
    assert_eq!(me.account, "default");
    assert_eq!(me.scopes, [Scope::TunnelsWrite, Scope::TunnelsConnect]);
    let them = edge
        .client(&Secret::new(full.trim()))
        .whoami()
        .await
        .unwrap();
    assert_eq!(
        (them.account.as_str(), them.scopes.as_slice()),
        ("team-b", &[Scope::Full][..])
    );
    let key_id = me.key_id;
    edge.stop().await;

    let (revoked, _) = keys(&["revoke", "--data-dir", data_dir, &key_id]).unwrap();
    assert!(revoked.contains(&key_id));
    assert!(matches!(
        keys(&["revoke", "--data-dir", data_dir, &key_id]),
        Err(Error::NotFound(_))
    ));

    let edge = TestEdge::start(config(dir.path())).await;
    let refused = edge.client(&Secret::new(key)).whoami().await.unwrap_err();
    assert!(
        matches!(refused, tuna_agent::Error::ApiUnauthorized { .. }),
        "{refused:?}"
    );
    edge.stop().await;
}

/// Run only by `a_crash_after_commit_loses_nothing` in a child process:
/// commits a key and a reservation, prints the key, then aborts (no
/// destructors, no orderly close of the store).
#[test]
#[ignore = "helper: run by a_crash_after_commit_loses_nothing in a child process"]
fn crash_child() {
    let dir = std::env::var("TUNA_CRASH_DIR").expect("TUNA_CRASH_DIR");
    let plane = tuna_edge::control::ControlPlane::open(config(std::path::Path::new(&dir))).unwrap();
    let (_, key) = plane
        .create_key("default", None, vec![Scope::TunnelsWrite])
        .unwrap();
    let caller = plane.authenticate_key(key.expose()).unwrap();
    plane
        .create_domain(
            &caller,
            &CreateDomain {
                subdomain: Some("survivor".into()),
                domain: None,
            },
        )
        .unwrap();
    println!("KEY={}", key.expose());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    std::process::abort();
}

#[test]
fn a_crash_after_commit_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The child's test name is its path below the crate root: `crash_child`
    // in a binary of its own, `api_persistence::crash_child` in the folded one.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let child = if module.is_empty() {
        "crash_child".to_owned()
    } else {
        format!("{module}::crash_child")
    };
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            child.as_str(),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TUNA_CRASH_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success(), "the child must have crashed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let key = stdout
        .lines()
        .find_map(|l| l.split_once("KEY=").map(|(_, key)| key.trim()))
        .unwrap_or_else(|| panic!("child printed no key: {stdout}"));

    let plane = tuna_edge::control::ControlPlane::open(config(dir.path())).unwrap();
    let caller = plane
        .authenticate_key(key)
        .expect("the key committed before the crash");
    let domain = plane.get_domain(&caller, "survivor.tuna.test").unwrap();
    assert_eq!(domain.account, "default");
}
