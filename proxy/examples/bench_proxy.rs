//! A standalone proxy core for `benches/proxy.sh`: routes one host to one
//! or more HTTP/1.1 backends and serves until killed.
//!
//! ```text
//! bench_proxy <listen addr> <host> <backend addr>[,<backend addr>…] [worker threads]
//! ```

use std::net::SocketAddr;

use tuna_proxy::{HttpBackend, HttpRoute, Origin, PathType, ProxyConfig, ProxyCore, TieBreak};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let usage = "usage: bench_proxy <listen> <host> <backend>[,<backend>…] [threads]";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let host = args.next().ok_or(usage)?;
    let backends = args
        .next()
        .ok_or(usage)?
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<SocketAddr>, _>>()?;
    let threads: usize = args.next().map(|t| t.parse()).transpose()?.unwrap_or(2);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let core = ProxyCore::new(ProxyConfig::default());
        core.set_host_routes(
            &host,
            vec![HttpRoute {
                path: "/".into(),
                path_type: PathType::Prefix,
                backend: HttpBackend::http1(backends),
                origin: Origin::default(),
                tie_break: TieBreak::default(),
            }],
        )?;
        let bound = core.listen(listen).await?;
        println!("listening on {bound}");
        tokio::signal::ctrl_c().await?;
        core.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
