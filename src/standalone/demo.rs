//! `standalone --demo`: a tiny built-in backend and a generated Tunnel for it, so
//! one command on a fresh machine shows a public URL answering real content.
//!
//! The backends are minimal HTTP/1.1 responders (one request per connection):
//! they answer every request with a short page naming the backend and echoing
//! what it received — method, path, `Host` and the `X-Forwarded-*` headers the
//! proxy core adds — so the user sees the whole path work. `--demo` also starts
//! the `web` (3000), `api` (3001) and TCP `echo` (7000) services that
//! `examples/standalone/` points at, so `--demo -f examples/standalone` serves
//! the whole quickstart with nothing else installed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// Subdomain the demo is published at.
pub const DEMO_SUBDOMAIN: &str = "demo";

/// Largest request head the demo reads.
const MAX_HEAD: usize = 16 * 1024;

/// Ports the quickstart manifests in `examples/standalone/` point at: the
/// `web` and `api` HTTP backends and the `echo` TCP service.
pub const EXAMPLE_PORTS: [(&str, u16); 3] = [("web", 3000), ("api", 3001), ("echo", 7000)];

async fn bind(preferred: u16) -> Result<TcpListener, Error> {
    match TcpListener::bind(("127.0.0.1", preferred)).await {
        Ok(l) => Ok(l),
        Err(e) => {
            tracing::warn!(port = preferred, error = %e, "demo port busy; using another one");
            let addr = SocketAddr::from(([127, 0, 0, 1], 0));
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Listen {
                    flag: "the demo's backends",
                    addr,
                    source,
                })
        }
    }
}

fn local(listener: &TcpListener) -> Result<SocketAddr, Error> {
    listener.local_addr().map_err(|source| Error::Listen {
        flag: "the demo's backends",
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        source,
    })
}

/// Starts a demo HTTP backend called `name` on `127.0.0.1:preferred` (another
/// port if that one is busy; 0 for any); it stops when `stop` is cancelled.
pub async fn start_backend(
    name: &'static str,
    preferred: u16,
    stop: CancellationToken,
) -> Result<SocketAddr, Error> {
    let listener = bind(preferred).await?;
    let addr = local(&listener)?;
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(c) => c,
                    Err(_) => continue,
                },
            };
            tokio::spawn(async move {
                let mut head = Vec::with_capacity(1024);
                let mut buf = [0u8; 2048];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = page(name, &String::from_utf8_lossy(&head));
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(addr)
}

/// Starts a TCP echo service on `127.0.0.1:preferred` (another port if busy).
pub async fn start_echo(preferred: u16, stop: CancellationToken) -> Result<SocketAddr, Error> {
    let listener = bind(preferred).await?;
    let addr = local(&listener)?;
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(c) => c,
                    Err(_) => continue,
                },
            };
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    Ok(addr)
}

/// The page the demo answers with, from the request head it received.
pub fn page(name: &str, head: &str) -> String {
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut out = format!(
        "Hello from tuna-operator standalone!\n\nThis page comes from the built-in demo backend {name:?}, through the edge, the tunnel and the proxy core.\n\n"
    );
    out.push_str(&format!("request: {request_line}\n"));
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let lower = name.trim().to_ascii_lowercase();
        if lower == "host" || lower.starts_with("x-forwarded-") {
            out.push_str(&format!("{lower}: {}\n", value.trim()));
        }
    }
    out
}

/// Writes the manifests of the demo (a Tunnel to the backend) into `dir` and
/// returns the file.
pub fn write_manifests(dir: &Path, backend: SocketAddr) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(dir).map_err(Error::file("create", dir))?;
    let file = dir.join("demo.yaml");
    let yaml = format!(
        "# Generated by `tuna-operator standalone --demo`: publishes the built-in demo backend.\n\
         apiVersion: k8s.tuna.am/v1alpha1\n\
         kind: Tunnel\n\
         metadata:\n  name: demo\n\
         spec:\n  protocol: http\n  subdomain: {DEMO_SUBDOMAIN}\n  upstream:\n    url: http://{backend}\n"
    );
    std::fs::write(&file, yaml).map_err(Error::file("write", &file))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_echoes_request_line_host_and_forwarded_headers() {
        let page = super::page(
            "web",
            "GET /hi HTTP/1.1\r\nHost: demo.localhost\r\nX-Forwarded-Proto: http\r\nCookie: secret\r\n\r\n",
        );
        assert!(page.contains("request: GET /hi HTTP/1.1"));
        assert!(page.contains("backend \"web\""));
        assert!(page.contains("host: demo.localhost"));
        assert!(page.contains("x-forwarded-proto: http"));
        assert!(!page.contains("secret"), "other headers are not echoed");
    }
}
