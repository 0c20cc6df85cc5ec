//! A standalone proxy core for `benches/proxy.sh`: routes one host to one
//! or more HTTP/1.1 backends and serves until killed.
//!
//! ```text
//! bench_proxy <listen addr> <host> <backend addr>[,<backend addr>…] [threads] [per-core]
//! ```
//!
//! By default one multi-thread tokio runtime serves the listener. With
//! `per-core`, each thread runs its own current-thread runtime with its own
//! `SO_REUSEPORT` listener on the same address (nginx's worker model); the
//! proxy core — routes, pools, counters — is shared.

use std::net::SocketAddr;

use tuna_proxy::{HttpBackend, HttpRoute, Origin, PathType, ProxyConfig, ProxyCore, TieBreak};

/// glibc's allocator spends a fifth of the proxy's CPU on Pingora's
/// per-request buffers (consolidating free chunks); a production binary
/// would pick a modern allocator too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let usage = "usage: bench_proxy <listen> <host> <backend>[,<backend>…] [threads] [per-core]";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let host = args.next().ok_or(usage)?;
    let backends = args
        .next()
        .ok_or(usage)?
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<SocketAddr>, _>>()?;
    let threads: usize = args.next().map(|t| t.parse()).transpose()?.unwrap_or(2);
    let per_core = args.next().as_deref() == Some("per-core");

    let core = ProxyCore::new(ProxyConfig::default());
    core.set_host_routes(
        &host,
        vec![HttpRoute {
            host: host.clone(),
            path: "/".into(),
            path_type: PathType::Prefix,
            backend: HttpBackend::http1(backends),
            origin: Origin::default(),
            tie_break: TieBreak::default(),
            matcher: tuna_routing::Matcher::Ingress,
        }],
    )?;

    if !per_core {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?;
        return runtime.block_on(async move {
            let bound = core.listen(listen).await?;
            println!("listening on {bound}");
            tokio::signal::ctrl_c().await?;
            core.shutdown().await;
            Ok(())
        });
    }

    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let core = core.clone();
            std::thread::spawn(move || -> Result<(), BoxError> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.set_reuseport(true)?;
                    socket.set_reuseaddr(true)?;
                    socket.bind(listen)?;
                    let bound = core.listen_on(socket.listen(1024)?)?;
                    println!("listening on {bound}");
                    std::future::pending::<()>().await;
                    Ok(())
                })
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "worker panicked")??;
    }
    Ok(())
}
