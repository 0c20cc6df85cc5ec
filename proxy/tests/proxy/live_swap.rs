//! Many concurrent clients while the route table is swapped hundreds of
//! times: no request fails, and every response comes from a backend that
//! is valid for its path in every configuration the test installs.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::*;
use reqwest::header::HOST;
use tokio::sync::Notify;
use tuna_proxy::{PathType, ProxyConfig};

const CLIENTS: usize = 16;
const SWAPS: usize = 150;
const MIN_REQUESTS_PER_CLIENT: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_swap_live_without_failed_requests() {
    let a = [echo_backend("a1").await, echo_backend("a2").await];
    let b = [echo_backend("b1").await, echo_backend("b2").await];
    let (core, addr) = proxy(ProxyConfig::default()).await;
    let config_for = |host: &str, i: usize| {
        vec![
            // Group A serves /a in every configuration, B serves /b; which
            // member (or both) changes with each swap, and so does the
            // route shape (Prefix vs an extra Exact rule).
            route(host, "/a", PathType::Prefix, &[a[i % 2]]),
            if i.is_multiple_of(3) {
                route(host, "/b", PathType::Prefix, &[b[0], b[1]])
            } else {
                route(host, "/b", PathType::Prefix, &[b[(i + 1) % 2]])
            },
            route(host, "/b/exact", PathType::Exact, &[b[i % 2]]),
        ]
    };
    core.set_host_routes("swap.example.com", config_for("swap.example.com", 0))
        .unwrap();

    let swaps_done = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(Notify::new());

    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let swaps_done = swaps_done.clone();
        let completed = completed.clone();
        let progress = progress.clone();
        clients.push(tokio::spawn(async move {
            let client = client();
            let mut sent = 0;
            let mut failures = Vec::new();
            while sent < MIN_REQUESTS_PER_CLIENT || swaps_done.load(SeqCst) < SWAPS {
                let (path, valid): (&str, &[&str]) = match (c + sent) % 3 {
                    0 => ("/a/x", &["a1", "a2"]),
                    1 => ("/b/y", &["b1", "b2"]),
                    _ => ("/b/exact", &["b1", "b2"]),
                };
                match client
                    .get(format!("http://{addr}{path}"))
                    .header(HOST, "swap.example.com")
                    .send()
                    .await
                {
                    Ok(resp) => {
                        let status = resp.status();
                        let backend = resp
                            .headers()
                            .get("x-backend")
                            .map(|v| v.to_str().unwrap().to_owned());
                        let body = resp.text().await;
                        match (status.as_u16(), backend, body) {
                            (200, Some(be), Ok(body)) if valid.contains(&be.as_str()) => {
                                assert!(body.contains(&format!("path: {path}\n")));
                            }
                            other => failures.push(format!("{path}: {other:?}")),
                        }
                    }
                    Err(e) => failures.push(format!("{path}: {e}")),
                }
                sent += 1;
                completed.fetch_add(1, SeqCst);
                progress.notify_one();
            }
            (sent, failures)
        }));
    }

    // Swap, then wait for a few responses to complete, so swaps interleave
    // with traffic instead of all happening before the first request.
    for i in 1..=SWAPS {
        core.set_host_routes("swap.example.com", config_for("swap.example.com", i))
            .unwrap();
        // Churn an unrelated host too: a new table each time.
        if i.is_multiple_of(2) {
            let churn = format!("churn{i}.example.com");
            core.set_host_routes(&churn, config_for(&churn, i)).unwrap();
        } else {
            core.remove_host(&format!("churn{}.example.com", i - 1))
                .unwrap();
        }
        // Read progress before publishing the last swap: clients stop once
        // they see it, so nothing may be awaited after that.
        let target = completed.load(SeqCst) + 2;
        if i == SWAPS {
            swaps_done.store(i, SeqCst);
            break;
        }
        swaps_done.store(i, SeqCst);
        while completed.load(SeqCst) < target {
            progress.notified().await;
        }
    }

    let mut total = 0;
    for c in clients {
        let (sent, failures) = c.await.unwrap();
        assert!(failures.is_empty(), "{failures:#?}");
        total += sent;
    }
    assert!(total >= CLIENTS * MIN_REQUESTS_PER_CLIENT);
    assert!(swaps_done.load(SeqCst) >= 100);
}

/// Hundreds of hosts set at once (as the agent does when thousands of
/// Tunnels arrive): each host serves the moment its call returns, each
/// change makes one table live, and `remove_host` takes each host away by
/// the time it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_are_live_on_return() {
    const HOSTS: usize = 300;
    let backend = echo_backend("many").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    let get = move |host: String| {
        let client = client();
        async move {
            let resp = client
                .get(format!("http://{addr}/"))
                .header(HOST, host)
                .send()
                .await
                .unwrap();
            resp.status().as_u16()
        }
    };
    let builds_before = metric(&core, "tuna_proxy_route_table_builds_total");
    let tasks: Vec<_> = (0..HOSTS)
        .map(|i| {
            let core = core.clone();
            tokio::spawn(async move {
                let host = format!("h{i}.example.com");
                let issues = core
                    .set_host_routes(&host, vec![route(&host, "/", PathType::Prefix, &[backend])])
                    .unwrap();
                assert!(issues.is_empty(), "{issues:?}");
                assert_eq!(get(host.clone()).await, 200, "{host} not live on return");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let builds = metric(&core, "tuna_proxy_route_table_builds_total") - builds_before;
    assert_eq!(builds, HOSTS as i64, "one live table per change");
    assert_eq!(core.hosts().len(), HOSTS);

    let tasks: Vec<_> = (0..HOSTS)
        .map(|i| {
            let core = core.clone();
            tokio::spawn(async move {
                let host = format!("h{i}.example.com");
                assert!(core.remove_host(&host).unwrap());
                assert_eq!(get(host.clone()).await, 404, "{host} still served");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(core.hosts().is_empty());
}

/// Every route of a host must name it: a route of another host fails the
/// whole call, and the host keeps serving what it had.
#[tokio::test]
async fn a_route_naming_another_host_changes_nothing() {
    let backend = echo_backend("kept").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "kept.example.com",
        vec![route("kept.example.com", "/", PathType::Prefix, &[backend])],
    )
    .unwrap();
    let err = core
        .set_host_routes(
            "kept.example.com",
            vec![
                route("KEPT.example.com", "/a", PathType::Prefix, &[backend]),
                route("other.example.com", "/b", PathType::Prefix, &[backend]),
            ],
        )
        .unwrap_err();
    assert!(err.to_string().contains("other.example.com"), "{err}");
    let resp = client()
        .get(format!("http://{addr}/b"))
        .header(HOST, "kept.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the host lost its routes");
    assert_eq!(core.hosts(), ["kept.example.com"]);
}
