//! The tunnel wire protocol, version 2: everything an agent and an edge say
//! to each other, in one module. `docs/tunnel-protocol.md` is the prose spec.
//!
//! One agent connection carries many *tunnels*; each is attached with its own
//! tunnel token and bindings, and revoking one token closes only its tunnel.
//!
//! # Connection life cycle
//!
//! 1. The agent dials the edge's agent listener over TLS (ALPN [`ALPN`]).
//! 2. The agent writes the 8-byte [`Preamble`] (`TUNA`, protocol version as
//!    big-endian `u16`, two zero bytes) and a [`Frame::Hello`] carrying up to
//!    [`MAX_HELLO_TUNNELS`] [`Attach`]es (tunnel id, token, bindings), at most
//!    [`MAX_HELLO_LEN`] bytes.
//! 3. The edge judges each: if at least one tunnel's token is valid (and, if
//!    it names bindings, one of them is allowed), it answers
//!    [`Frame::Welcome`]; otherwise it sends a [`Frame::Refused`] per tunnel,
//!    then [`Frame::Reject`] and closes. `Reject` is frozen across protocol
//!    versions so that a version mismatch is always reported legibly.
//! 4. The same TLS stream then carries HTTP/2 with reversed roles: the edge is
//!    the h2 *client*, the agent the h2 *server*. Only the framed handshake is
//!    read with exact-length reads, so no h2 byte is swallowed by a buffer.
//! 5. The edge's first h2 stream is the control stream (header
//!    `tuna-kind: control`). The edge first answers each tunnel of the hello
//!    ([`Frame::Attached`] or [`Frame::Refused`]); from then on both sides
//!    send frames on it: [`Frame::Attach`] / [`Frame::Detach`] /
//!    [`Frame::UpdateBindings`] (agent → edge, answered by `Attached`,
//!    `Refused`, [`Frame::BindingsUpdated`]), [`Frame::TunnelClosed`] (edge →
//!    agent: one tunnel ends, the session goes on), [`Frame::Heartbeat`] and
//!    [`Frame::GoAway`].
//! 6. Every other h2 stream is one public connection for one tunnel: the
//!    request headers carry its [`StreamMeta`] (see
//!    [`StreamMeta::write_headers`]), the request body is client→agent bytes,
//!    the response body agent→client bytes.
//!
//! # Frames
//!
//! A frame is a big-endian `u32` length followed by that many bytes of JSON
//! (an object tagged by `"type"`). Lengths above [`MAX_FRAME_LEN`] (or
//! [`MAX_HELLO_LEN`] before authentication) are refused before anything is
//! allocated, and the buffer grows with the bytes that actually arrive.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};

/// The protocol version this build speaks (the edge accepts only this one).
pub const PROTOCOL_VERSION: u16 = 2;
/// First bytes of every agent connection.
pub const MAGIC: [u8; 4] = *b"TUNA";
/// TLS ALPN protocol id of the agent listener. It names the framing family,
/// not the version (the preamble carries that): an agent of another version
/// still completes TLS and gets a legible `version_mismatch`.
pub const ALPN: &[u8] = b"tuna-tunnel/1";
pub use crate::limits::{MAX_FRAME_LEN, MAX_HELLO_LEN};
/// Most tunnels one `Hello` may attach; the rest follow as `Attach` frames.
pub const MAX_HELLO_TUNNELS: usize = 16;
/// Largest encoded `Attach` frame of one tunnel (token and bindings), so that
/// any tunnel fits into a `Hello`.
pub const MAX_ATTACH_LEN: usize = 48 * 1024;
/// Time allowed from dial to `Welcome` and the h2 preface (agent side) and
/// from `Welcome` to the control stream (edge side).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time an unauthenticated connection gets on the edge, from TCP accept to a
/// judged `Hello` (TLS handshake, preamble, hello frame).
pub const PRE_AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Default heartbeat interval the edge announces in `Welcome`.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Missed heartbeat intervals after which a peer is declared dead.
pub const HEARTBEAT_MISSES: u32 = 3;
/// Longest accepted host name (RFC 1035) and endpoint alias.
pub const MAX_HOST_LEN: usize = 253;
/// Most bindings one tunnel may have (and one frame may add or remove).
pub const MAX_BINDINGS: usize = 1024;
/// Longest tunnel id (printable ASCII without spaces).
pub const MAX_TUNNEL_ID_LEN: usize = 128;

/// Request header naming what an h2 stream carries: `control`, `http`, `tcp`
/// or `address`.
pub const HEADER_KIND: &str = "tuna-kind";
/// Request header: the id the agent gave the tunnel this stream belongs to.
pub const HEADER_TUNNEL: &str = "tuna-tunnel";
/// Request header: the public client's `ip:port`.
pub const HEADER_CLIENT: &str = "tuna-client-addr";
/// Request header: `http` or `https`, as the client reached the edge.
pub const HEADER_SCHEME: &str = "tuna-scheme";
/// Request header: the public host (HTTP streams).
pub const HEADER_HOST: &str = "tuna-host";
/// Request header: the TCP endpoint as the agent declared it (alias or port).
pub const HEADER_ENDPOINT: &str = "tuna-endpoint";
/// Request header: the public TCP port (TCP streams).
pub const HEADER_PORT: &str = "tuna-port";
/// Request header: the held address and port the client connected to
/// (`ip:port`, `[ip]:port` for IPv6; address streams).
pub const HEADER_ADDRESS: &str = "tuna-address";

/// A tunnel token in clear text; `Debug`/`Display` print a mask.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TunnelToken(String);

impl TunnelToken {
    /// Wraps a clear-text token.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The clear text; use it only to compare or to send.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TunnelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TunnelToken(***)")
    }
}

impl fmt::Display for TunnelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// What an agent asks to serve.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Binding {
    /// Public HTTP(S) requests for this host name.
    Http {
        /// Host name, compared case-insensitively, no port.
        host: String,
    },
    /// Public TCP connections of a TCP endpoint.
    Tcp {
        /// The endpoint's alias, or its port number as text.
        endpoint: String,
    },
    /// Every connection to one port of an address the account holds (a
    /// Gateway's address, `POST /v1/gateway-addresses`): the stream is
    /// carried raw, whatever it holds (HTTP with any `Host`, TLS, TCP).
    Address {
        /// The held address.
        address: IpAddr,
        /// Any port on it (1-65535).
        port: u16,
    },
}

impl Binding {
    /// A binding of `port` on the held `address`.
    pub fn address(address: IpAddr, port: u16) -> Self {
        Self::Address { address, port }
    }
    /// An HTTP binding for `host`.
    pub fn http(host: impl Into<String>) -> Self {
        Self::Http { host: host.into() }
    }
    /// A TCP binding for an endpoint alias or port.
    pub fn tcp(endpoint: impl Into<String>) -> Self {
        Self::Tcp {
            endpoint: endpoint.into(),
        }
    }

    /// Refuses empty or oversized names before they reach the authority.
    pub fn validate(&self) -> Result<(), Rejection> {
        let (what, value) = match self {
            Binding::Http { host } => ("host", host),
            Binding::Tcp { endpoint } => ("endpoint", endpoint),
            Binding::Address { address, port } => {
                return if *port == 0 || address.is_unspecified() || address.is_multicast() {
                    Err(Rejection::new(
                        ErrorCode::BadRequest,
                        format!("{address} port {port} is not an address and port to listen on"),
                    ))
                } else {
                    Ok(())
                };
            }
        };
        let ok = !value.is_empty()
            && value.len() <= MAX_HOST_LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        if ok {
            Ok(())
        } else {
            Err(Rejection::new(
                ErrorCode::BadRequest,
                format!(
                    "{what} {value:?} is not a valid name (1-{MAX_HOST_LEN} chars of [A-Za-z0-9._-])"
                ),
            ))
        }
    }
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Binding::Http { host } => write!(f, "http host {host}"),
            Binding::Tcp { endpoint } => write!(f, "tcp endpoint {endpoint}"),
            Binding::Address { address, port } => {
                write!(f, "address {}", SocketAddr::new(*address, *port))
            }
        }
    }
}

/// A binding resolved by the edge: where the public traffic comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BoundTarget {
    /// Requests whose `Host` is this (lower-case) name.
    Http {
        /// Lower-case host name.
        host: String,
    },
    /// Connections to this public TCP port.
    Tcp {
        /// Public port on the edge.
        port: u16,
    },
    /// Connections to this port of a held address.
    Address {
        /// The address.
        address: IpAddr,
        /// The port.
        port: u16,
    },
}

/// Why a handshake, tunnel, binding or session was refused or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The agent speaks a protocol version the edge does not.
    VersionMismatch,
    /// Unknown, malformed or revoked tunnel token.
    BadToken,
    /// The token's lifetime is over; renew it.
    TokenExpired,
    /// The token was revoked while the tunnel was open.
    TokenRevoked,
    /// The token (its account) may not serve this binding.
    BindingNotAllowed,
    /// The binding is allowed but cannot be served now (e.g. port in use).
    BindingUnavailable,
    /// Another tunnel (newer, of this or another session) took a binding over.
    BindingTakenOver,
    /// The domain or TCP endpoint was released (deleted) at the edge.
    BindingReleased,
    /// A quota of the account or token is spent (tunnels, sessions).
    QuotaExceeded,
    /// Too many failed attempts from this address; wait and retry.
    RateLimited,
    /// The session carries no tunnel any more.
    NoTunnels,
    /// A frame that is well-formed but makes no sense.
    BadRequest,
    /// The peer took too long to complete the handshake.
    HandshakeTimeout,
    /// No heartbeat within the allowed misses.
    HeartbeatTimeout,
    /// The edge is shutting down; reconnect later.
    ShuttingDown,
    /// The edge cannot judge sessions now (a fleet replica cut off from
    /// its store); reconnect later, or to another replica.
    Unavailable,
    /// Anything else; the message explains.
    Internal,
    /// A code this build does not know (sent by a newer peer).
    #[serde(other)]
    Unknown,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self).ok();
        f.write_str(s.as_ref().and_then(|v| v.as_str()).unwrap_or("unknown"))
    }
}

/// A refusal: machine-readable code plus a message meant for a human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// What went wrong.
    pub code: ErrorCode,
    /// What to do about it.
    pub message: String,
}

impl Rejection {
    /// A rejection with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// A binding and what the edge made of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingOutcome {
    /// The binding as the agent sent it.
    pub binding: Binding,
    /// The public target, when accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<BoundTarget>,
    /// The reason, when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Rejection>,
}

/// One tunnel an agent asks to open: in `Hello`, or later as
/// [`Frame::Attach`]. Attaching an id that is already attached replaces its
/// token and bindings (a renewed or re-minted token, a retry after a refusal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attach {
    /// The agent's id of the tunnel; every stream of it carries this id.
    pub tunnel: String,
    /// The agent's request number, echoed in the answer.
    pub seq: u64,
    /// The tunnel token (or an API key with `tunnels:connect`).
    pub token: TunnelToken,
    /// What the tunnel serves from the start.
    pub bindings: Vec<Binding>,
}

/// Every message of the protocol. See the module docs for who sends what when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Frame {
    /// Agent → edge, right after the preamble: the first tunnels.
    Hello {
        /// Free-form agent identity for logs (e.g. `tuna-operator/0.1.0`).
        agent: String,
        /// Up to [`MAX_HELLO_TUNNELS`] tunnels; at least one must be accepted.
        tunnels: Vec<Attach>,
    },
    /// Edge → agent: the session is open; h2 starts after this frame. The
    /// hello's tunnels are answered on the control stream.
    Welcome {
        /// Identifies the session in logs and status; stable until it ends.
        session_id: String,
        /// Interval at which both sides send [`Frame::Heartbeat`].
        heartbeat_ms: u64,
    },
    /// Edge → agent: handshake refused; the edge closes the connection.
    Reject(Rejection),
    /// Agent → edge (control): open a tunnel, or replace an open one's token
    /// and bindings.
    Attach(Attach),
    /// Edge → agent: the tunnel is open; one outcome per binding.
    Attached {
        /// The tunnel id.
        tunnel: String,
        /// The `seq` of the attach answered.
        seq: u64,
        /// Per binding: accepted (with target) or refused (with reason).
        bound: Vec<BindingOutcome>,
    },
    /// Edge → agent: the attach was refused; the tunnel is not open.
    Refused {
        /// The tunnel id.
        tunnel: String,
        /// The `seq` of the attach answered.
        seq: u64,
        /// Why.
        reason: Rejection,
    },
    /// Agent → edge (control): close a tunnel. Not answered.
    Detach {
        /// The tunnel id.
        tunnel: String,
    },
    /// Agent → edge (control): change one tunnel's bindings live.
    UpdateBindings {
        /// The tunnel id.
        tunnel: String,
        /// Echoed in the answer.
        seq: u64,
        /// Bindings to start serving.
        add: Vec<Binding>,
        /// Bindings to stop serving.
        remove: Vec<Binding>,
    },
    /// Edge → agent: the outcome of an `UpdateBindings` (one entry per `add`).
    BindingsUpdated {
        /// The tunnel id.
        tunnel: String,
        /// The request's `seq`.
        seq: u64,
        /// Per added binding: accepted (with target) or refused (with reason).
        results: Vec<BindingOutcome>,
    },
    /// Edge → agent: the edge closed one tunnel (token revoked or expired,
    /// binding taken over or released); the session and its other tunnels go on.
    TunnelClosed {
        /// The tunnel id.
        tunnel: String,
        /// Why.
        reason: Rejection,
    },
    /// Either way, every heartbeat interval: proof of life.
    Heartbeat {
        /// Sender's counter, for logs.
        seq: u64,
    },
    /// Edge → agent: the session ends now, and why (e.g. the edge stops).
    GoAway(Rejection),
}

impl Frame {
    /// The frame's `type`, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "hello",
            Frame::Welcome { .. } => "welcome",
            Frame::Reject(_) => "reject",
            Frame::Attach(_) => "attach",
            Frame::Attached { .. } => "attached",
            Frame::Refused { .. } => "refused",
            Frame::Detach { .. } => "detach",
            Frame::UpdateBindings { .. } => "update_bindings",
            Frame::BindingsUpdated { .. } => "bindings_updated",
            Frame::TunnelClosed { .. } => "tunnel_closed",
            Frame::Heartbeat { .. } => "heartbeat",
            Frame::GoAway(_) => "go_away",
        }
    }
}

/// Refuses tunnel ids that could not travel in a header or name nothing.
pub fn validate_tunnel_id(id: &str) -> Result<(), Rejection> {
    let ok =
        !id.is_empty() && id.len() <= MAX_TUNNEL_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(Rejection::new(
            ErrorCode::BadRequest,
            format!(
                "tunnel id {id:?} is not 1-{MAX_TUNNEL_ID_LEN} printable ASCII characters without spaces"
            ),
        ))
    }
}

/// The fixed first bytes an agent sends: magic, version, two reserved zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// The agent's protocol version.
    pub version: u16,
}

impl Preamble {
    /// Encoded size.
    pub const LEN: usize = 8;

    /// The bytes on the wire.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let v = self.version.to_be_bytes();
        [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], v[0], v[1], 0, 0]
    }

    /// Parses the bytes; anything without the magic is not a tuna agent.
    pub fn decode(bytes: &[u8; Self::LEN]) -> Result<Self> {
        if bytes[..4] != MAGIC {
            return Err(Error::Protocol(
                "connection does not start with the TUNA preamble".into(),
            ));
        }
        Ok(Self {
            version: u16::from_be_bytes([bytes[4], bytes[5]]),
        })
    }
}

impl Frame {
    /// Encodes the frame with its length prefix.
    pub fn encode(&self) -> Result<Bytes> {
        let json =
            serde_json::to_vec(self).map_err(|e| Error::Protocol(format!("encode frame: {e}")))?;
        if json.len() > MAX_FRAME_LEN {
            return Err(Error::FrameTooLarge(json.len()));
        }
        let mut buf = BytesMut::with_capacity(4 + json.len());
        buf.put_u32(json.len() as u32);
        buf.put_slice(&json);
        Ok(buf.freeze())
    }

    /// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes
    /// are needed, otherwise the frame and how many bytes it used. Never
    /// panics, whatever `buf` holds (fuzzed).
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>> {
        let Some(len_bytes) = buf.get(..4) else {
            return Ok(None);
        };
        let len =
            u32::from_be_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        if len > MAX_FRAME_LEN {
            return Err(Error::FrameTooLarge(len));
        }
        let Some(payload) = buf.get(4..4 + len) else {
            return Ok(None);
        };
        let frame = Self::decode_payload(payload)?;
        Ok(Some((frame, 4 + len)))
    }

    fn decode_payload(payload: &[u8]) -> Result<Frame> {
        let frame: Frame = serde_json::from_slice(payload)
            .map_err(|e| Error::Protocol(format!("malformed frame: {e}")))?;
        frame.check_bounds()?;
        Ok(frame)
    }

    /// Refuses frames that parse but exceed the protocol's limits.
    fn check_bounds(&self) -> Result<()> {
        let too_many = |n: usize| n > MAX_BINDINGS;
        let bad = match self {
            Frame::Hello { tunnels, .. } => {
                tunnels.len() > MAX_HELLO_TUNNELS
                    || tunnels.iter().any(|t| too_many(t.bindings.len()))
            }
            Frame::Attach(a) => too_many(a.bindings.len()),
            Frame::Attached { bound, .. } => too_many(bound.len()),
            Frame::UpdateBindings { add, remove, .. } => {
                too_many(add.len()) || too_many(remove.len())
            }
            Frame::BindingsUpdated { results, .. } => too_many(results.len()),
            Frame::Welcome { .. }
            | Frame::Reject(_)
            | Frame::Refused { .. }
            | Frame::Detach { .. }
            | Frame::TunnelClosed { .. }
            | Frame::Heartbeat { .. }
            | Frame::GoAway(_) => false,
        };
        if bad {
            return Err(Error::Protocol(format!(
                "more than {MAX_BINDINGS} bindings (or {MAX_HELLO_TUNNELS} hello tunnels) in one frame"
            )));
        }
        Ok(())
    }

    /// Reads exactly one frame, never more bytes than it spans (so a protocol
    /// switch after it loses nothing).
    pub async fn read_from<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Frame> {
        Self::read_limited(reader, MAX_FRAME_LEN).await
    }

    /// Like [`Frame::read_from`] with a tighter length limit (`Hello`:
    /// [`MAX_HELLO_LEN`]). The buffer grows with the bytes that arrive, so a
    /// peer that announces a large frame and sends it slowly holds only what
    /// it sent.
    pub async fn read_limited<R: AsyncRead + Unpin>(reader: &mut R, max: usize) -> Result<Frame> {
        let mut len = [0u8; 4];
        reader.read_exact(&mut len).await.map_err(eof_as_closed)?;
        let len = u32::from_be_bytes(len) as usize;
        if len > max.min(MAX_FRAME_LEN) {
            return Err(Error::FrameTooLarge(len));
        }
        let mut payload = Vec::with_capacity(len.min(4096));
        (&mut *reader)
            .take(len as u64)
            .read_to_end(&mut payload)
            .await?;
        if payload.len() < len {
            return Err(Error::Closed("peer closed the connection mid-frame".into()));
        }
        Self::decode_payload(&payload)
    }

    /// Writes and flushes one frame.
    pub async fn write_to<W: AsyncWrite + Unpin>(&self, writer: &mut W) -> Result<()> {
        let bytes = self.encode()?;
        writer.write_all(&bytes).await?;
        writer.flush().await?;
        Ok(())
    }
}

/// Reads frames one after another into `frames` until one fails (the error
/// is the last thing sent) or the receiver is gone. Both ends run their
/// control stream's reader as this task and `select!` on the channel, because
/// a `read_from` future dropped by `select!` would lose a half-read frame.
pub async fn read_frames<R: AsyncRead + Unpin>(
    mut reader: R,
    frames: tokio::sync::mpsc::Sender<Result<Frame>>,
) {
    loop {
        let frame = Frame::read_from(&mut reader).await;
        let failed = frame.is_err();
        if frames.send(frame).await.is_err() || failed {
            return;
        }
    }
}

fn eof_as_closed(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Error::Closed("peer closed the connection".into())
    } else {
        Error::Io(e)
    }
}

/// How the public client reached the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP listener.
    Http,
    /// HTTPS listener (TLS terminated at the edge).
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// What a data stream carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// An HTTP/1.1 connection (the edge speaks HTTP/1.1 on the stream, one
    /// public client and one host per stream).
    Http {
        /// Public host (lower case, no port).
        host: String,
        /// How the client reached the edge (for `X-Forwarded-Proto`).
        scheme: Scheme,
    },
    /// Raw bytes of one public TCP connection.
    Tcp {
        /// The endpoint as the agent declared it (alias or port text).
        endpoint: String,
        /// The public port the client connected to.
        port: u16,
    },
    /// Raw bytes of one connection to a held address (a Gateway's).
    Address {
        /// The address and port the client connected to.
        address: SocketAddr,
    },
}

/// Metadata of one data stream: enough for `X-Forwarded-*` and routing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamMeta {
    /// The public client's address as the edge saw it.
    pub client_addr: SocketAddr,
    /// HTTP or TCP, with its key.
    pub kind: StreamKind,
    /// The tunnel the stream belongs to: the id the agent attached it with.
    /// The agent serves on the stream only what that tunnel declared.
    pub tunnel: String,
}

impl StreamMeta {
    /// Puts the metadata into h2 request headers (edge side).
    pub fn write_headers(&self, headers: &mut HeaderMap) -> Result<()> {
        let value = |s: &str| {
            HeaderValue::from_str(s).map_err(|_| Error::Protocol(format!("bad header value {s:?}")))
        };
        headers.insert(HEADER_CLIENT, value(&self.client_addr.to_string())?);
        headers.insert(HEADER_TUNNEL, value(&self.tunnel)?);
        match &self.kind {
            StreamKind::Http { host, scheme } => {
                headers.insert(HEADER_KIND, HeaderValue::from_static("http"));
                headers.insert(HEADER_HOST, value(host)?);
                headers.insert(HEADER_SCHEME, HeaderValue::from_static(scheme.as_str()));
            }
            StreamKind::Tcp { endpoint, port } => {
                headers.insert(HEADER_KIND, HeaderValue::from_static("tcp"));
                headers.insert(HEADER_ENDPOINT, value(endpoint)?);
                headers.insert(HEADER_PORT, value(&port.to_string())?);
            }
            StreamKind::Address { address } => {
                headers.insert(HEADER_KIND, HeaderValue::from_static("address"));
                headers.insert(HEADER_ADDRESS, value(&address.to_string())?);
            }
        }
        Ok(())
    }

    /// Reads the metadata from h2 request headers (agent side).
    pub fn from_headers(headers: &HeaderMap) -> Result<Self> {
        let get = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| Error::Protocol(format!("stream without a valid {name} header")))
        };
        let client_addr = get(HEADER_CLIENT)?
            .parse()
            .map_err(|_| Error::Protocol(format!("{HEADER_CLIENT} is not ip:port")))?;
        let kind = match get(HEADER_KIND)? {
            "http" => StreamKind::Http {
                host: get(HEADER_HOST)?.to_owned(),
                scheme: match get(HEADER_SCHEME)? {
                    "http" => Scheme::Http,
                    "https" => Scheme::Https,
                    other => return Err(Error::Protocol(format!("unknown scheme {other:?}"))),
                },
            },
            "tcp" => StreamKind::Tcp {
                endpoint: get(HEADER_ENDPOINT)?.to_owned(),
                port: get(HEADER_PORT)?
                    .parse()
                    .map_err(|_| Error::Protocol(format!("{HEADER_PORT} is not a port")))?,
            },
            "address" => StreamKind::Address {
                address: get(HEADER_ADDRESS)?
                    .parse()
                    .map_err(|_| Error::Protocol(format!("{HEADER_ADDRESS} is not ip:port")))?,
            },
            other => return Err(Error::Protocol(format!("unknown stream kind {other:?}"))),
        };
        let tunnel = get(HEADER_TUNNEL)?.to_owned();
        Ok(Self {
            client_addr,
            kind,
            tunnel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9][a-z0-9.-]{0,40}"
    }

    fn binding() -> impl Strategy<Value = Binding> {
        prop_oneof![
            name().prop_map(Binding::http),
            name().prop_map(Binding::tcp),
            (any::<IpAddr>(), any::<u16>()).prop_map(|(a, p)| Binding::address(a, p)),
        ]
    }

    fn target() -> impl Strategy<Value = BoundTarget> {
        prop_oneof![
            name().prop_map(|host| BoundTarget::Http { host }),
            any::<u16>().prop_map(|port| BoundTarget::Tcp { port }),
            (any::<IpAddr>(), any::<u16>())
                .prop_map(|(address, port)| BoundTarget::Address { address, port }),
        ]
    }

    fn code() -> impl Strategy<Value = ErrorCode> {
        prop_oneof![
            Just(ErrorCode::VersionMismatch),
            Just(ErrorCode::BadToken),
            Just(ErrorCode::TokenExpired),
            Just(ErrorCode::TokenRevoked),
            Just(ErrorCode::BindingNotAllowed),
            Just(ErrorCode::BindingUnavailable),
            Just(ErrorCode::BindingTakenOver),
            Just(ErrorCode::BindingReleased),
            Just(ErrorCode::QuotaExceeded),
            Just(ErrorCode::RateLimited),
            Just(ErrorCode::NoTunnels),
            Just(ErrorCode::BadRequest),
            Just(ErrorCode::HandshakeTimeout),
            Just(ErrorCode::HeartbeatTimeout),
            Just(ErrorCode::ShuttingDown),
            Just(ErrorCode::Unavailable),
            Just(ErrorCode::Internal),
        ]
    }

    fn rejection() -> impl Strategy<Value = Rejection> {
        (code(), ".{0,64}").prop_map(|(code, message)| Rejection { code, message })
    }

    fn outcome() -> impl Strategy<Value = BindingOutcome> {
        (
            binding(),
            proptest::option::of(target()),
            proptest::option::of(rejection()),
        )
            .prop_map(|(binding, bound, error)| BindingOutcome {
                binding,
                bound,
                error,
            })
    }

    fn attach() -> impl Strategy<Value = Attach> {
        (
            "[!-~]{1,20}",
            any::<u64>(),
            ".{0,80}",
            proptest::collection::vec(binding(), 0..8),
        )
            .prop_map(|(tunnel, seq, token, bindings)| Attach {
                tunnel,
                seq,
                token: TunnelToken::new(token),
                bindings,
            })
    }

    fn frame() -> impl Strategy<Value = Frame> {
        let id = || "[!-~]{1,20}";
        prop_oneof![
            (".{0,20}", proptest::collection::vec(attach(), 0..4))
                .prop_map(|(agent, tunnels)| Frame::Hello { agent, tunnels }),
            (".{0,40}", any::<u64>()).prop_map(|(session_id, heartbeat_ms)| Frame::Welcome {
                session_id,
                heartbeat_ms
            }),
            rejection().prop_map(Frame::Reject),
            attach().prop_map(Frame::Attach),
            (
                id(),
                any::<u64>(),
                proptest::collection::vec(outcome(), 0..8)
            )
                .prop_map(|(tunnel, seq, bound)| Frame::Attached {
                    tunnel,
                    seq,
                    bound
                }),
            (id(), any::<u64>(), rejection()).prop_map(|(tunnel, seq, reason)| Frame::Refused {
                tunnel,
                seq,
                reason
            }),
            id().prop_map(|tunnel| Frame::Detach { tunnel }),
            (
                id(),
                any::<u64>(),
                proptest::collection::vec(binding(), 0..8),
                proptest::collection::vec(binding(), 0..8)
            )
                .prop_map(|(tunnel, seq, add, remove)| Frame::UpdateBindings {
                    tunnel,
                    seq,
                    add,
                    remove
                }),
            (
                id(),
                any::<u64>(),
                proptest::collection::vec(outcome(), 0..8)
            )
                .prop_map(|(tunnel, seq, results)| Frame::BindingsUpdated {
                    tunnel,
                    seq,
                    results
                }),
            (id(), rejection()).prop_map(|(tunnel, reason)| Frame::TunnelClosed { tunnel, reason }),
            any::<u64>().prop_map(|seq| Frame::Heartbeat { seq }),
            rejection().prop_map(Frame::GoAway),
        ]
    }

    proptest! {
        #[test]
        fn every_frame_round_trips(f in frame()) {
            let bytes = f.encode().unwrap();
            let (back, used) = Frame::decode(&bytes).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(back, f);
        }

        #[test]
        fn a_truncated_frame_asks_for_more(f in frame(), cut in 0usize..1000) {
            let bytes = f.encode().unwrap();
            let cut = cut % bytes.len();
            prop_assert!(Frame::decode(&bytes[..cut]).unwrap().is_none());
        }

        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Frame::decode(&bytes);
        }

        #[test]
        fn stream_meta_round_trips(
            ip in any::<[u8; 4]>(), cport in any::<u16>(), host in name(), https in any::<bool>(),
            kind in 0..3u8, port in any::<u16>(), held_ip in any::<IpAddr>(), held_port in any::<u16>(),
            tunnel in "[!-~]{1,40}"
        ) {
            let kind = match kind {
                0 => StreamKind::Tcp { endpoint: host, port },
                // An address as the edge has it: no IPv6 flow label or scope.
                1 => StreamKind::Address { address: SocketAddr::new(held_ip, held_port) },
                _ => StreamKind::Http {
                    host,
                    scheme: if https { Scheme::Https } else { Scheme::Http },
                },
            };
            let meta = StreamMeta { client_addr: SocketAddr::from((ip, cport)), kind, tunnel };
            let mut headers = HeaderMap::new();
            meta.write_headers(&mut headers).unwrap();
            prop_assert_eq!(StreamMeta::from_headers(&headers).unwrap(), meta);
        }
    }

    #[test]
    fn oversized_length_is_refused_before_allocation() {
        let mut bytes = ((MAX_FRAME_LEN + 1) as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        assert!(matches!(
            Frame::decode(&bytes),
            Err(Error::FrameTooLarge(_))
        ));
    }

    #[test]
    fn preamble_round_trips_and_refuses_foreign_bytes() {
        let p = Preamble { version: 7 };
        assert_eq!(Preamble::decode(&p.encode()).unwrap(), p);
        assert!(Preamble::decode(b"GET / HT").is_err());
    }

    #[test]
    fn wire_format_is_pinned() {
        let f = Frame::Reject(Rejection::new(ErrorCode::VersionMismatch, "edge speaks 1"));
        let bytes = f.encode().unwrap();
        assert_eq!(
            &bytes[4..],
            br#"{"type":"reject","code":"version_mismatch","message":"edge speaks 1"}"#
        );
        let h = Frame::Hello {
            agent: "t".into(),
            tunnels: vec![Attach {
                tunnel: "web".into(),
                seq: 1,
                token: TunnelToken::new("s3cret"),
                bindings: vec![Binding::http("a.example")],
            }],
        };
        assert_eq!(
            &h.encode().unwrap()[4..],
            br#"{"type":"hello","agent":"t","tunnels":[{"tunnel":"web","seq":1,"token":"s3cret","bindings":[{"kind":"http","host":"a.example"}]}]}"#
        );
        assert!(!format!("{h:?}").contains("s3cret"));
        let closed = Frame::TunnelClosed {
            tunnel: "web".into(),
            reason: Rejection::new(ErrorCode::TokenRevoked, "m"),
        };
        assert_eq!(
            &closed.encode().unwrap()[4..],
            br#"{"type":"tunnel_closed","tunnel":"web","reason":{"code":"token_revoked","message":"m"}}"#
        );
    }

    #[test]
    fn unknown_error_codes_from_newer_peers_still_decode() {
        let raw = br#"{"type":"go_away","code":"moon_phase","message":"m"}"#;
        let mut bytes = (raw.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(raw);
        let (f, _) = Frame::decode(&bytes).unwrap().unwrap();
        assert_eq!(f, Frame::GoAway(Rejection::new(ErrorCode::Unknown, "m")));
    }

    #[test]
    fn tunnel_ids_must_fit_a_header() {
        for (id, ok) in [
            ("web", true),
            ("shop/web", true),
            ("host:app.example.com", true),
            ("", false),
            ("a b", false),
            ("tab\t", false),
            ("é", false),
        ] {
            assert_eq!(validate_tunnel_id(id).is_ok(), ok, "{id:?}");
        }
        assert!(validate_tunnel_id(&"x".repeat(MAX_TUNNEL_ID_LEN)).is_ok());
        assert!(validate_tunnel_id(&"x".repeat(MAX_TUNNEL_ID_LEN + 1)).is_err());
    }

    #[tokio::test]
    async fn a_slow_large_frame_holds_only_what_arrived() {
        // The length prefix promises the maximum; only a few bytes follow.
        let (mut client, mut server) = tokio::io::duplex(1024);
        let mut bytes = (MAX_HELLO_LEN as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(b"{\"type\"");
        client.write_all(&bytes).await.unwrap();
        drop(client);
        let err = Frame::read_limited(&mut server, MAX_HELLO_LEN)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Closed(_)), "{err}");
        let (mut client, mut server) = tokio::io::duplex(1024);
        client
            .write_all(&((MAX_HELLO_LEN + 1) as u32).to_be_bytes())
            .await
            .unwrap();
        assert!(matches!(
            Frame::read_limited(&mut server, MAX_HELLO_LEN).await,
            Err(Error::FrameTooLarge(_))
        ));
    }
}
