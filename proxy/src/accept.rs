//! The accept loop every listener of the core runs (HTTP, TCP, CONNECT,
//! admin): accept until told to stop, back off on accept errors, hand each
//! connection on.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::inner::Inner;

/// How long a listener waits after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts connections on `listener` and hands each to `on_accept` until
/// `stop` completes; then the listener is dropped, so its port is free
/// when this returns. A failed accept (EMFILE and friends) is logged as
/// `failed: error` and waited out for [`ACCEPT_BACKOFF`] instead of
/// spinning on a listener that cannot accept.
pub(crate) async fn accept_until(
    listener: TcpListener,
    stop: impl Future<Output = ()>,
    failed: &str,
    mut on_accept: impl FnMut(TcpStream, SocketAddr),
) {
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("{failed}: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        on_accept(tcp, peer);
    }
}

/// Runs one proxied connection on the core's task tracker (so shutdown
/// waits for it) until it ends or shutdown's grace runs out.
pub(crate) fn spawn_connection(inner: &Inner, conn: impl Future<Output = ()> + Send + 'static) {
    let cut = inner.cut.clone();
    inner.tracker.spawn(async move {
        tokio::select! {
            _ = conn => {}
            _ = cut.cancelled() => {}
        }
    });
}
