//! The controller role end to end: a real control plane, the real
//! `tuna-operator edge` and `tuna-operator controller` processes, the real
//! `kubectl`. Readiness comes from watches of the objects' conditions.

use crate::support;

use std::time::Duration;

use support::{
    Cluster, DnsServer, Edge, EdgeOptions, controller, events_of, ready_of, wait_for, wait_gone,
};
use tuna_crds::{Domain, TcpEndpoint};

fn is_ready<S>(
    status: &Option<S>,
    conditions: impl Fn(&S) -> &Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> Option<(String, String, String)> {
    status.as_ref().and_then(|s| ready_of(conditions(s)))
}

fn domain_ready(d: &Domain) -> Option<(String, String, String)> {
    is_ready(&d.status, |s| &s.conditions)
}

fn endpoint_ready(e: &TcpEndpoint) -> Option<(String, String, String)> {
    is_ready(&e.status, |s| &s.conditions)
}

fn ready_true(c: Option<(String, String, String)>) -> bool {
    c.is_some_and(|(s, _, _)| s == "True")
}

fn reason_is(c: Option<(String, String, String)>, reason: &str) -> bool {
    c.is_some_and(|(s, r, _)| s == "False" && r == reason)
}

async fn domain_names(edge: &Edge) -> Vec<String> {
    let mut names: Vec<String> = edge
        .client()
        .list_domains()
        .await
        .expect("list domains")
        .into_iter()
        .map(|d| d.name)
        .collect();
    names.sort();
    names
}

async fn tcp_aliases(edge: &Edge) -> Vec<(String, u16)> {
    edge.client()
        .list_tcp_endpoints()
        .await
        .expect("list tcp endpoints")
        .into_iter()
        .map(|e| (e.alias, e.port))
        .collect()
}

/// The documentation's Domain and TCPEndpoint: reserved, shown by `kubectl
/// get` with their printer columns and by `kubectl describe` with the Ready
/// condition and events; deleting them releases the reservations (finalizer),
/// and a controller restart loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_and_tcp_endpoints_are_reserved_shown_and_released() {
    let cluster = Cluster::start().await;
    let edge = Edge::start(cluster.dir.path(), EdgeOptions::default()).await;
    let mut ctl = controller(&cluster, &edge, "controller-a", &[]);
    cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: my-app}\nspec: {subdomain: my-app}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: TCPEndpoint\nmetadata: {name: postgres}\nspec: {alias: postgres}\n",
    );
    let client = cluster.client().await;
    let procs = [&ctl, edge.process.as_ref().unwrap()];
    let d: Domain = wait_for(
        &client,
        "default",
        "my-app",
        "Ready",
        &procs,
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    let status = d.status.unwrap();
    assert_eq!(status.fqdn.as_deref(), Some("my-app.tuna.test"));
    assert!(!status.adopted);
    assert_eq!(status.observed_generation, d.metadata.generation);
    assert_eq!(
        status.conditions[0].observed_generation,
        d.metadata.generation
    );
    let e: TcpEndpoint = wait_for(
        &client,
        "default",
        "postgres",
        "Ready",
        &procs,
        |e: &TcpEndpoint| ready_true(endpoint_ready(e)),
    )
    .await;
    let port = e.status.as_ref().unwrap().port.unwrap() as u16;
    assert!((edge.tcp_ports.0..=edge.tcp_ports.1).contains(&port));
    assert_eq!(
        e.status.as_ref().unwrap().address.as_deref(),
        Some(format!("tuna.test:{port}").as_str())
    );
    assert!(
        e.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"k8s.tuna.am/reservation".to_owned())
    );

    // Printer columns, as the documentation shows them.
    let get = cluster.kubectl_ok(&["get", "domain", "my-app"]);
    let mut lines = get.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "FQDN", "READY", "ADOPTED", "AGE"], "{get}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["my-app", "my-app.tuna.test", "True", "false"],
        "{get}"
    );
    let get = cluster.kubectl_ok(&["get", "tcpendpoint", "postgres"]);
    let mut lines = get.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "ALIAS", "ADDRESS", "READY", "AGE"],
        "{get}"
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["postgres", "postgres", &format!("tuna.test:{port}"), "True"],
        "{get}"
    );

    // describe: the Ready condition and the events.
    let describe = cluster.kubectl_ok(&["describe", "domain", "my-app"]);
    for needle in [
        "Type:                  Ready",
        "Reason:                Reserved",
        "Normal  Reserved",
        "tuna-operator",
        "my-app.tuna.test is reserved",
    ] {
        assert!(describe.contains(needle), "{needle:?} in\n{describe}");
    }
    assert_eq!(domain_names(&edge).await, ["my-app.tuna.test"]);
    assert_eq!(tcp_aliases(&edge).await, [("postgres".to_owned(), port)]);

    // A crash and restart of the controller loses nothing and makes no duplicate.
    ctl.kill().await;
    let ctl = controller(&cluster, &edge, "controller-b", &[]);
    let procs = [&ctl, edge.process.as_ref().unwrap()];
    cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: second}\nspec: {subdomain: second}\n");
    wait_for(
        &client,
        "default",
        "second",
        "Ready",
        &procs,
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    let again: TcpEndpoint = wait_for(
        &client,
        "default",
        "postgres",
        "still Ready",
        &procs,
        |e: &TcpEndpoint| ready_true(endpoint_ready(e)),
    )
    .await;
    assert_eq!(again.status.unwrap().port, Some(i32::from(port)));
    assert_eq!(tcp_aliases(&edge).await, [("postgres".to_owned(), port)]);

    // Deleting releases (the finalizer waits for the edge).
    cluster.kubectl_ok(&["delete", "domain", "my-app", "second"]);
    cluster.kubectl_ok(&["delete", "tcpendpoint", "postgres"]);
    wait_gone::<Domain>(&client, "default", "my-app", &procs).await;
    wait_gone::<TcpEndpoint>(&client, "default", "postgres", &procs).await;
    assert!(domain_names(&edge).await.is_empty());
    assert!(tcp_aliases(&edge).await.is_empty());
    let events = events_of(&cluster, "default", "TCPEndpoint", "postgres");
    assert!(events.contains_key("Released"), "{events:?}");
}

/// A custom domain is Ready=False until its DNS records resolve, naming the
/// missing record; the controller re-checks on its own every
/// --dns-recheck-interval and turns Ready once a loopback DNS server has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_domain_is_verified_through_dns_after_failing_first() {
    let cluster = Cluster::start().await;
    let mut dns = DnsServer::start("example.test.").await;
    let edge = Edge::start(
        cluster.dir.path(),
        EdgeOptions {
            base_domain: "tuna.test".into(),
            extra: vec![
                "--public-host".into(),
                "edge.tuna.test".into(),
                "--dns-nameserver".into(),
                dns.addr.to_string(),
            ],
        },
    )
    .await;
    let ctl = controller(&cluster, &edge, "controller", &[]);
    cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: shop}\nspec: {domain: shop.example.test, reclaimPolicy: Retain}\n");
    let client = cluster.client().await;
    let procs = [&ctl, edge.process.as_ref().unwrap()];
    let pending: Domain = wait_for(
        &client,
        "default",
        "shop",
        "DnsNotVerified",
        &procs,
        |d: &Domain| reason_is(domain_ready(d), "DnsNotVerified"),
    )
    .await;
    let (_, _, message) = domain_ready(&pending).unwrap();
    assert!(
        message.contains("_tuna-challenge.shop.example.test"),
        "{message}"
    );
    let records = pending.status.unwrap().dns_records;
    let txt = records
        .iter()
        .find(|r| r.type_ == "TXT")
        .expect("TXT record to create");
    let cname = records
        .iter()
        .find(|r| r.type_ == "CNAME")
        .expect("CNAME record to create");
    assert_eq!(cname.value, "edge.tuna.test");
    let events = events_of(&cluster, "default", "Domain", "shop");
    assert!(events.contains_key("DnsNotVerified"), "{events:?}");

    dns.add_txt(&format!("{}.", txt.name), &txt.value).await;
    dns.add_cname("shop.example.test.", "edge.tuna.test.").await;
    let verified: Domain = wait_for(
        &client,
        "default",
        "shop",
        "Verified",
        &procs,
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    assert_eq!(domain_ready(&verified).unwrap().1, "Verified");
    let describe = cluster.kubectl_ok(&["describe", "domain", "shop"]);
    assert!(
        describe.contains("Normal   Verified") || describe.contains("Normal  Verified"),
        "{describe}"
    );
    // Retain: deleting the Domain keeps the reservation.
    cluster.kubectl_ok(&["delete", "domain", "shop"]);
    wait_gone::<Domain>(&client, "default", "shop", &procs).await;
    assert_eq!(domain_names(&edge).await, ["shop.example.test"]);
    dns.stop().await;
}

/// Reservations that exist in the account are adopted (status.adopted, the
/// ADOPTED column) and never released; the operator's own reservations are
/// re-created when deleted at the edge, and released on delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_retain_delete_and_recreation() {
    let cluster = Cluster::start().await;
    let edge = Edge::start(cluster.dir.path(), EdgeOptions::default()).await;
    let api = edge.client();
    api.create_domain(&tuna_protocol::api::CreateDomain {
        subdomain: Some("existing".into()),
        domain: None,
    })
    .await
    .unwrap();
    let db = api
        .create_tcp_endpoint(&tuna_protocol::api::CreateTcpEndpoint {
            alias: "db".into(),
            port: None,
        })
        .await
        .unwrap();
    let ctl = controller(&cluster, &edge, "controller", &[]);
    cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: existing}\nspec: {subdomain: existing}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: TCPEndpoint\nmetadata: {name: db}\nspec: {alias: db}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: kept}\nspec: {subdomain: kept, reclaimPolicy: Retain}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: ours}\nspec: {subdomain: ours}\n",
    );
    let client = cluster.client().await;
    let procs = [&ctl, edge.process.as_ref().unwrap()];
    let adopted: Domain = wait_for(
        &client,
        "default",
        "existing",
        "Ready",
        &procs,
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    assert!(adopted.status.as_ref().unwrap().adopted);
    assert_eq!(domain_ready(&adopted).unwrap().1, "Adopted");
    let endpoint: TcpEndpoint = wait_for(
        &client,
        "default",
        "db",
        "Ready",
        &procs,
        |e: &TcpEndpoint| ready_true(endpoint_ready(e)),
    )
    .await;
    assert!(endpoint.status.as_ref().unwrap().adopted);
    assert_eq!(
        endpoint.status.as_ref().unwrap().port,
        Some(i32::from(db.port))
    );
    wait_for(&client, "default", "kept", "Ready", &procs, |d: &Domain| {
        ready_true(domain_ready(d))
    })
    .await;
    wait_for(&client, "default", "ours", "Ready", &procs, |d: &Domain| {
        ready_true(domain_ready(d))
    })
    .await;
    let get = cluster.kubectl_ok(&["get", "domain", "existing"]);
    assert!(
        get.lines().nth(1).unwrap().split_whitespace().nth(3) == Some("true"),
        "{get}"
    );

    // Deleted at the edge: the next resync re-creates it, still not adopted.
    api.delete_domain("ours.tuna.test").await.unwrap();
    let recreated = tokio::time::timeout(support::WAIT, async {
        loop {
            if domain_names(&edge)
                .await
                .contains(&"ours.tuna.test".to_owned())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(recreated.is_ok(), "not re-created: {}", ctl.log());
    let ours: Domain = client_get(&client, "ours").await;
    assert!(!ours.status.unwrap().adopted);

    // Delete: adopted and Retain stay, ours goes.
    cluster.kubectl_ok(&["delete", "domains", "--all"]);
    cluster.kubectl_ok(&["delete", "tcpendpoints", "--all"]);
    for name in ["existing", "kept", "ours"] {
        wait_gone::<Domain>(&client, "default", name, &procs).await;
    }
    wait_gone::<TcpEndpoint>(&client, "default", "db", &procs).await;
    assert_eq!(
        domain_names(&edge).await,
        ["existing.tuna.test", "kept.tuna.test"]
    );
    assert_eq!(tcp_aliases(&edge).await, [("db".to_owned(), db.port)]);
    let events = events_of(&cluster, "default", "Domain", "existing");
    assert!(events["Retained"][0].contains("adopted"), "{events:?}");
}

async fn client_get(client: &kube::Client, name: &str) -> Domain {
    kube::Api::<Domain>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .unwrap()
}

/// Two controller processes: only the holder of the Lease reconciles; when it
/// dies (SIGKILL, no release), the standby takes over within the lease
/// duration and reconciles what was created meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_leader_dies() {
    let cluster = Cluster::start().await;
    let edge = Edge::start(cluster.dir.path(), EdgeOptions::default()).await;
    let mut first = controller(&cluster, &edge, "controller-1", &[]);
    let client = cluster.client().await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "default");
    let holder = |lease: Option<&k8s_openapi::api::coordination::v1::Lease>| {
        lease.and_then(|l| l.spec.as_ref()?.holder_identity.clone())
    };
    tokio::time::timeout(
        support::WAIT,
        kube::runtime::wait::await_condition(
            leases.clone(),
            "tuna-operator-controller",
            |l: Option<&_>| holder(l).as_deref() == Some("controller-1"),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("controller-1 never led: {}", first.log()))
    .unwrap();
    let second = controller(&cluster, &edge, "controller-2", &[]);
    cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: one}\nspec: {subdomain: one}\n");
    wait_for(
        &client,
        "default",
        "one",
        "Ready",
        &[&first, &second],
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    // The standby never reconciled.
    assert!(
        !second.log().contains("became the leader"),
        "{}",
        second.log()
    );

    first.kill().await;
    cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: two}\nspec: {subdomain: two}\n");
    let started = std::time::Instant::now();
    wait_for(
        &client,
        "default",
        "two",
        "Ready after failover",
        &[&second],
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    let lease = leases.get("tuna-operator-controller").await.unwrap();
    assert_eq!(holder(Some(&lease)).as_deref(), Some("controller-2"));
    // Within the lease duration (3 s) plus a reconcile.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "failover took {:?}",
        started.elapsed()
    );
}

/// `kubectl delete tunnels,domains,tcpendpoints --all --all-namespaces`
/// completes: including a Domain the edge refused, one whose reservation was
/// already deleted at the edge (404), in several namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_everything_completes() {
    let cluster = Cluster::start().await;
    let edge = Edge::start(cluster.dir.path(), EdgeOptions::default()).await;
    let ctl = controller(&cluster, &edge, "controller", &[]);
    cluster.kubectl_ok(&["create", "namespace", "team-a"]);
    cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: a, namespace: team-a}\nspec: {subdomain: team-a}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: refused}\nspec: {subdomain: www}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: TCPEndpoint\nmetadata: {name: gone, namespace: team-a}\nspec: {alias: gone}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {name: web}\nspec: {subdomain: web, upstream: {url: 'http://web:80'}}\n",
    );
    let client = cluster.client().await;
    let procs = [&ctl, edge.process.as_ref().unwrap()];
    wait_for(&client, "team-a", "a", "Ready", &procs, |d: &Domain| {
        ready_true(domain_ready(d))
    })
    .await;
    wait_for(
        &client,
        "team-a",
        "gone",
        "Ready",
        &procs,
        |e: &TcpEndpoint| ready_true(endpoint_ready(e)),
    )
    .await;
    wait_for(
        &client,
        "default",
        "refused",
        "InvalidName",
        &procs,
        |d: &Domain| reason_is(domain_ready(d), "InvalidName"),
    )
    .await;
    edge.client().delete_tcp_endpoint("gone").await.unwrap();
    let out = tokio::time::timeout(support::WAIT, async {
        tokio::task::spawn_blocking({
            let kubeconfig = cluster.kubeconfig.clone();
            let home = cluster.dir.path().to_owned();
            move || {
                std::process::Command::new("kubectl")
                    .args([
                        "delete",
                        "tunnels,domains,tcpendpoints",
                        "--all",
                        "--all-namespaces",
                    ])
                    .env("KUBECONFIG", kubeconfig)
                    .env("HOME", home)
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("kubectl delete hung: {}", ctl.log()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = cluster.kubectl_ok(&[
        "get",
        "tunnels,domains,tcpendpoints",
        "--all-namespaces",
        "-o",
        "name",
    ]);
    assert!(left.trim().is_empty(), "{left}");
    assert!(domain_names(&edge).await.is_empty());
}

/// Bad input gives a clear status and event and loses nothing: a spec the API
/// server's CEL rules reject, a name the edge refuses (422), a name another
/// account holds (403), a wrong key (401), an edge that is down, and a 429
/// that is waited out; each recovers once fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_refusals_and_outages_are_reported_and_recovered() {
    let cluster = Cluster::start().await;
    let mut edge = Edge::start(
        cluster.dir.path(),
        EdgeOptions {
            base_domain: "tuna.test".into(),
            extra: vec![
                "--api-rate-burst".into(),
                "3".into(),
                "--api-rate-per-second".into(),
                "1".into(),
            ],
        },
    )
    .await;
    // Another account holds `theirs`.
    edge.stop().await;
    let other = Edge::create_key(&edge.data_dir, "other", &["tunnels:write"]);
    edge.run().await;
    edge.client_with(&other)
        .create_domain(&tuna_protocol::api::CreateDomain {
            subdomain: Some("theirs".into()),
            domain: None,
        })
        .await
        .unwrap();

    // The API server refuses what the CEL rules forbid, with their message.
    let out = cluster.kubectl_stdin(&["apply", "-f", "-"], Some("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: both}\nspec: {subdomain: a, domain: a.example.com}\n"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("set exactly one of spec.subdomain or spec.domain"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A resync slower than the 2 s of the other tests: at 1 request/s every
    // 2 s resync of ten objects alone would spend more than the budget, and
    // the rate-limited part would only converge on an idle machine.
    let ctl = controller(&cluster, &edge, "controller", &["--resync-interval", "20s"]);
    cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: reserved-label}\nspec: {subdomain: api}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: theirs}\nspec: {subdomain: theirs}\n",
    );
    for i in 0..6 {
        cluster.apply(&format!("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {{name: many-{i}}}\nspec: {{subdomain: many-{i}}}\n"));
    }
    let client = cluster.client().await;
    let procs = [&ctl, edge.process.as_ref().unwrap()];
    let invalid: Domain = wait_for(
        &client,
        "default",
        "reserved-label",
        "InvalidName",
        &procs,
        |d: &Domain| reason_is(domain_ready(d), "InvalidName"),
    )
    .await;
    assert!(
        domain_ready(&invalid).unwrap().2.contains("api"),
        "{invalid:?}"
    );
    assert!(events_of(&cluster, "default", "Domain", "reserved-label").contains_key("InvalidName"));
    wait_for(
        &client,
        "default",
        "theirs",
        "HeldByOtherAccount",
        &procs,
        |d: &Domain| reason_is(domain_ready(d), "HeldByOtherAccount"),
    )
    .await;
    // Rate-limited reservations are waited out (Retry-After), none is lost.
    for i in 0..6 {
        wait_for(
            &client,
            "default",
            &format!("many-{i}"),
            "Ready despite 429s",
            &procs,
            |d: &Domain| ready_true(domain_ready(d)),
        )
        .await;
    }
    let audit_429 = edge.log().contains("429") || ctl.log().contains("rate limit");
    assert!(
        audit_429,
        "the burst of 8 reservations should have met the rate limit of 3\n{}",
        ctl.log()
    );

    // The edge goes down: a new Domain says so; it recovers when the edge is back.
    edge.stop().await;
    cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: during-outage}\nspec: {subdomain: during-outage}\n");
    let down: Domain = wait_for(
        &client,
        "default",
        "during-outage",
        "EdgeUnavailable",
        &[&ctl],
        |d: &Domain| reason_is(domain_ready(d), "EdgeUnavailable"),
    )
    .await;
    assert!(
        domain_ready(&down).unwrap().2.contains("retrying"),
        "{down:?}"
    );
    // Ready reservations stay Ready through the outage.
    let still: Domain = client_get(&client, "many-0").await;
    assert!(ready_true(domain_ready(&still)));
    // Back with the default request budget.
    edge.options.extra.clear();
    edge.run().await;
    wait_for(
        &client,
        "default",
        "during-outage",
        "Ready after the outage",
        &[&ctl],
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    drop(ctl);

    // A wrong key: Unauthorized, with the edge's message.
    std::fs::write(
        &edge.key_file,
        "tunak_0000000000000000_00000000000000000000000000000000000000000000000000000000000000ff\n",
    )
    .unwrap();
    let bad = controller(&cluster, &edge, "controller-badkey", &[]);
    cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: bad-key}\nspec: {subdomain: bad-key}\n");
    let unauthorized: Domain = wait_for(
        &client,
        "default",
        "bad-key",
        "Unauthorized",
        &[&bad],
        |d: &Domain| reason_is(domain_ready(d), "Unauthorized"),
    )
    .await;
    assert!(!domain_ready(&unauthorized).unwrap().2.is_empty());
    assert!(
        !bad.log().contains("tunak_0000000000000000_0000"),
        "the key must never be logged"
    );
}

/// 5xx from the edge (through a fault-injecting proxy: a real edge answers
/// 5xx only when its storage fails): Ready=False EdgeUnavailable with an
/// event, backed off, then Ready once the edge answers; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_of_the_edge_through_a_fault_injecting_proxy_back_off_and_recover() {
    let cluster = Cluster::start().await;
    let mut edge = Edge::start(
        cluster.dir.path(),
        EdgeOptions {
            base_domain: "tuna.test".into(),
            extra: vec!["--insecure-plaintext-api".into()],
        },
    )
    .await;
    let proxy = support::fault_injecting_proxy(edge.addrs.api.unwrap(), 4).await;
    // The controller talks to the proxy instead of the edge.
    edge.addrs.api = Some(proxy);
    let ctl = controller(&cluster, &edge, "controller", &[]);
    cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: flaky}\nspec: {subdomain: flaky}\n");
    let client = cluster.client().await;
    let failing: Domain = wait_for(
        &client,
        "default",
        "flaky",
        "EdgeUnavailable",
        &[&ctl],
        |d: &Domain| reason_is(domain_ready(d), "EdgeUnavailable"),
    )
    .await;
    assert!(
        domain_ready(&failing)
            .unwrap()
            .2
            .contains("injected storage failure"),
        "{failing:?}"
    );
    assert!(events_of(&cluster, "default", "Domain", "flaky").contains_key("EdgeUnavailable"));
    wait_for(
        &client,
        "default",
        "flaky",
        "Ready after the 5xx",
        &[&ctl],
        |d: &Domain| ready_true(domain_ready(d)),
    )
    .await;
    assert_eq!(domain_names(&edge).await, ["flaky.tuna.test"]);
}
