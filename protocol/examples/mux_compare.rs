//! Measures the two multiplexing candidates over one loopback TCP connection:
//! HTTP/2 with reversed roles (this crate's `mux`) and `tokio-yamux`.
//! `cargo run --release -p tuna-protocol --example mux_compare`
//! The figures and the decision are in `docs/tunnel-protocol.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tuna_protocol::mux;

/// Bytes of the bulk phase (`BULK_KIB`, default 1 GiB).
fn bulk_bytes() -> usize {
    std::env::var("BULK_KIB")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1024 * 1024usize)
        * 1024
}
const EXCHANGES: usize = 20_000;
const CONCURRENCY: usize = 64;
const PHASE_LIMIT: Duration = Duration::from_secs(20);

type Boxed = Box<dyn Io>;
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Opens streams from the "edge"; the "agent" side hands accepted streams to `serve`.
#[derive(Clone)]
enum Opener {
    H2(h2::client::SendRequest<bytes::Bytes>),
    Yamux(tokio_yamux::Control),
}

impl Opener {
    async fn open(&self) -> Boxed {
        match self {
            Opener::H2(s) => {
                let meta = tuna_protocol::wire::StreamMeta {
                    client_addr: "127.0.0.1:1".parse().unwrap(),
                    kind: tuna_protocol::wire::StreamKind::Tcp {
                        endpoint: "bench".into(),
                        port: 1,
                    },
                    tunnel: "bench".into(),
                };
                Box::new(mux::open_stream(s, &meta, mux::Gate::new()).await.unwrap())
            }
            Opener::Yamux(c) => Box::new(c.clone().open_stream().await.unwrap()),
        }
    }
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    (a, b)
}

async fn setup_h2(serve: mpsc::UnboundedSender<Boxed>) -> Opener {
    let (edge, agent) = pair().await;
    tokio::spawn(async move {
        let mut conn = mux::server_builder()
            .handshake::<_, bytes::Bytes>(agent)
            .await
            .unwrap();
        while let Some(Ok((req, resp))) = conn.accept().await {
            let (_, s) = mux::accept_stream(req, resp).unwrap();
            let _ = serve.send(Box::new(s));
        }
    });
    let (sender, conn) = mux::client_builder().handshake(edge).await.unwrap();
    tokio::spawn(conn);
    Opener::H2(sender)
}

async fn setup_yamux(serve: mpsc::UnboundedSender<Boxed>, window: u32) -> Opener {
    let (edge, agent) = pair().await;
    let config = tokio_yamux::Config {
        max_stream_window_size: window,
        ..Default::default()
    };
    tokio::spawn(async move {
        let mut session = tokio_yamux::Session::new_server(agent, config);
        while let Some(Ok(s)) = session.next().await {
            let _ = serve.send(Box::new(s));
        }
    });
    let mut session = tokio_yamux::Session::new_client(edge, config);
    let control = session.control();
    tokio::spawn(async move { while session.next().await.is_some() {} });
    Opener::Yamux(control)
}

/// Agent side: bulk streams are drained; exchange streams echo until EOF.
fn spawn_server(mut incoming: mpsc::UnboundedReceiver<Boxed>) {
    tokio::spawn(async move {
        while let Some(mut s) = incoming.recv().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) if n <= 64 => {
                            let _ = s.write_all(&buf[..n]).await;
                        }
                        Ok(_) => {}
                    }
                }
                let _ = s.shutdown().await;
            });
        }
    });
}

/// Write size of the bulk phase (`CHUNK` bytes, default 64 KiB).
fn chunk_size() -> usize {
    std::env::var("CHUNK")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64 * 1024)
}

async fn bulk(opener: &Opener, streams: usize) -> f64 {
    let start = Instant::now();
    let per = bulk_bytes() / streams;
    let tasks: Vec<_> = (0..streams)
        .map(|_| {
            let opener = opener.clone();
            tokio::spawn(async move {
                let mut s = opener.open().await;
                let chunk = vec![0xa5u8; chunk_size()];
                let mut sent = 0;
                while sent < per {
                    s.write_all(&chunk).await.unwrap();
                    sent += chunk.len();
                }
                s.shutdown().await.unwrap();
                let mut rest = Vec::new();
                s.read_to_end(&mut rest).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (bulk_bytes() as f64 * 8.0) / start.elapsed().as_secs_f64() / 1e9
}

async fn exchanges(opener: &Opener) -> f64 {
    let start = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let opener = opener.clone();
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < EXCHANGES {
                    let mut s = opener.open().await;
                    s.write_all(&[1u8; 64]).await.unwrap();
                    let mut back = [0u8; 64];
                    s.read_exact(&mut back).await.unwrap();
                    s.shutdown().await.unwrap();
                    let mut rest = Vec::new();
                    let _ = s.read_to_end(&mut rest).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    EXCHANGES as f64 / start.elapsed().as_secs_f64()
}

async fn cpu_seconds() -> f64 {
    let stat = tokio::fs::read_to_string("/proc/self/stat").await.unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// A phase that stalls is reported as 0 instead of hanging the comparison.
async fn phase(name: &str, what: &str, f: impl std::future::Future<Output = f64>) -> f64 {
    match tokio::time::timeout(PHASE_LIMIT, f).await {
        Ok(v) => v,
        Err(_) => {
            println!("{name}: {what} stalled for {PHASE_LIMIT:?}; counted as 0");
            0.0
        }
    }
}

async fn measure(name: &str, opener: Opener) {
    let cpu0 = cpu_seconds().await;
    let t0 = Instant::now();
    let one = phase(name, "1-stream bulk", bulk(&opener, 1)).await;
    let cpu1 = cpu_seconds().await;
    let t1 = Instant::now();
    let eight = phase(name, "8-stream bulk", bulk(&opener, 8)).await;
    let cpu2 = cpu_seconds().await;
    let rps = phase(name, "exchanges", exchanges(&opener)).await;
    let cpu3 = cpu_seconds().await;
    println!(
        "{name:<22} 1 stream {one:6.2} Gbit/s (cpu {:.2}s/GiB) | 8 streams {eight:6.2} Gbit/s (cpu {:.2}s/GiB) | {rps:8.0} stream exchanges/s (cpu {:.1}µs each)",
        cpu1 - cpu0,
        cpu2 - cpu1,
        (cpu3 - cpu2) * 1e6 / EXCHANGES as f64
    );
    let _ = (t0, t1);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (tx, rx) = mpsc::unbounded_channel();
    spawn_server(rx);
    if std::env::var("MUX").map_or(true, |m| m == "h2") {
        measure("h2 (reversed roles)", setup_h2(tx).await).await;
    }
    for window in [256 * 1024, 8 * 1024 * 1024] {
        let (tx, rx) = mpsc::unbounded_channel();
        spawn_server(rx);
        measure(
            &format!("yamux window {}KiB", window / 1024),
            setup_yamux(tx, window).await,
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}
