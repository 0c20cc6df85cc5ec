//! PROXY protocol version 2 (HAProxy's binary header) from trusted peers: a
//! TCP load balancer in front of the edge that prepends it gives every
//! listener the real client's address, so that the per-source budgets
//! (pre-auth slots, failed authentications, public connection caps) count
//! clients, not the load balancer.
//!
//! Only peers of `--trusted-proxy` are read for a header, and only when
//! their connection starts with the v2 signature, which no TLS record and
//! no HTTP request starts with: a trusted HTTP proxy that does not speak
//! PROXY keeps working as before. From any other peer the bytes are left
//! alone (a header there is garbage to TLS or HTTP, and refused by them).
//! Parsing is the `ppp` crate's; `LOCAL` headers (a load balancer's own
//! health checks) and non-IP address families keep the peer's address.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::public::IpCidr;

/// The v2 signature every header starts with.
const SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];
/// Signature, version/command, family/protocol, length.
const FIXED: usize = 16;
/// The addresses of an IPv6 header plus generous TLVs; longer is refused.
const MAX_PAYLOAD: usize = 2048;
/// How long a trusted peer's connection may take to show whether it starts
/// with a header (load balancers send it at once, with the connection). A
/// peer that sends nothing by then (a server-first protocol on a TCP
/// endpoint) is served with its own address.
const FIRST_BYTES: Duration = Duration::from_secs(1);
/// The whole header, once it started.
const HEADER_READ: Duration = Duration::from_secs(5);

/// Whether `peer` is one of `trusted` (and so may send a header).
pub(crate) fn is_trusted(trusted: &[IpCidr], peer: SocketAddr) -> bool {
    trusted.iter().any(|c| c.contains(peer.ip()))
}

/// The client `tcp` speaks for: the source address of a PROXY v2 header at
/// its start (consumed), else `peer`. Call only for trusted peers.
/// `Err` (close the connection) for a malformed or truncated header.
pub(crate) async fn client_of(tcp: &mut TcpStream, peer: SocketAddr) -> Result<SocketAddr, String> {
    let mut head = [0u8; FIXED];
    // Peek until the first bytes tell whether a header starts here.
    let started = tokio::time::timeout(FIRST_BYTES, async {
        loop {
            let n = tcp
                .peek(&mut head[..SIGNATURE.len()])
                .await
                .map_err(|e| e.to_string())?;
            if n == 0 || head[..n] != SIGNATURE[..n] {
                return Ok::<_, String>(false);
            }
            if n == SIGNATURE.len() {
                return Ok(true);
            }
            // A partial signature: wait for more bytes.
            tcp.readable().await.map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    match started {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => return Ok(peer),
        Ok(Err(e)) => return Err(e),
    }
    let header = tokio::time::timeout(HEADER_READ, async {
        tcp.read_exact(&mut head).await.map_err(|e| e.to_string())?;
        let len = usize::from(u16::from_be_bytes([head[14], head[15]]));
        if len > MAX_PAYLOAD {
            return Err(format!(
                "a PROXY header of {len} bytes (at most {MAX_PAYLOAD})"
            ));
        }
        let mut whole = Vec::with_capacity(FIXED + len);
        whole.extend_from_slice(&head);
        whole.resize(FIXED + len, 0);
        tcp.read_exact(&mut whole[FIXED..])
            .await
            .map_err(|e| e.to_string())?;
        Ok(whole)
    })
    .await
    .map_err(|_| "the PROXY header did not arrive in time".to_owned())??;
    source_of(&header, peer)
}

/// The source address a complete v2 `header` names (`peer` for `LOCAL` and
/// non-IP families).
fn source_of(header: &[u8], peer: SocketAddr) -> Result<SocketAddr, String> {
    use ppp::v2::{Addresses, Command, Header};
    let parsed = Header::try_from(header).map_err(|e| format!("a malformed PROXY header: {e}"))?;
    if parsed.command == Command::Local {
        return Ok(peer);
    }
    Ok(match parsed.addresses {
        Addresses::IPv4(a) => SocketAddr::from((a.source_address, a.source_port)),
        Addresses::IPv6(a) => SocketAddr::from((a.source_address, a.source_port)),
        Addresses::Unix(_) | Addresses::Unspecified => peer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppp::v2::{Builder, Command, Protocol, Version};

    fn header(command: Command, addresses: impl Into<ppp::v2::Addresses>) -> Vec<u8> {
        Builder::with_addresses(Version::Two | command, Protocol::Stream, addresses)
            .build()
            .unwrap()
    }

    #[test]
    fn sources_are_read_from_proxy_and_ignored_from_local_headers() {
        let peer: SocketAddr = "10.0.0.9:4000".parse().unwrap();
        let v4 = header(
            Command::Proxy,
            (
                "192.0.2.1:1234".parse::<SocketAddr>().unwrap(),
                "10.0.0.1:443".parse::<SocketAddr>().unwrap(),
            ),
        );
        assert_eq!(
            source_of(&v4, peer).unwrap(),
            "192.0.2.1:1234".parse().unwrap()
        );
        let v6 = header(
            Command::Proxy,
            (
                "[2001:db8::7]:99".parse::<SocketAddr>().unwrap(),
                "[2001:db8::1]:443".parse::<SocketAddr>().unwrap(),
            ),
        );
        assert_eq!(
            source_of(&v6, peer).unwrap(),
            "[2001:db8::7]:99".parse().unwrap()
        );
        let local = header(
            Command::Local,
            (
                "192.0.2.1:1234".parse::<SocketAddr>().unwrap(),
                "10.0.0.1:443".parse::<SocketAddr>().unwrap(),
            ),
        );
        assert_eq!(source_of(&local, peer).unwrap(), peer);
        let mut broken = v4.clone();
        broken[12] = 0x31; // version 3
        assert!(source_of(&broken, peer).is_err());
    }
}
