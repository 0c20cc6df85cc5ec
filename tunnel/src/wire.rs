//! The tunnel wire protocol, version 1: everything an agent and an edge say
//! to each other, in one module. `docs/tunnel-protocol.md` is the prose spec.
//!
//! # Connection life cycle
//!
//! 1. The agent dials the edge's agent listener over TLS (ALPN [`ALPN`]).
//! 2. The agent writes the 8-byte [`Preamble`] (`TUNA`, protocol version as
//!    big-endian `u16`, two zero bytes) and a [`Frame::Hello`] carrying its
//!    tunnel token and declared bindings.
//! 3. The edge answers with [`Frame::Welcome`] (session id, heartbeat
//!    interval, resolved bindings) or [`Frame::Reject`] (an [`ErrorCode`] and a
//!    message) and closes. Both sides give up after [`HANDSHAKE_TIMEOUT`].
//!    `Reject` is frozen across protocol versions so that a version mismatch
//!    is always reported legibly.
//! 4. The same TLS stream then carries HTTP/2 with reversed roles: the edge is
//!    the h2 *client*, the agent the h2 *server*. Only the framed handshake is
//!    read with exact-length reads, so no h2 byte is swallowed by a buffer.
//! 5. The edge's first h2 stream is the control stream (header
//!    `tuna-kind: control`); it carries [`Frame`]s both ways:
//!    [`Frame::UpdateBindings`] / [`Frame::BindingsUpdated`] (live binding
//!    changes: never a reconnect), [`Frame::Heartbeat`] and [`Frame::GoAway`].
//! 6. Every other h2 stream is one public connection: the request headers
//!    carry its [`StreamMeta`] (see [`StreamMeta::write_headers`]), the request
//!    body is client→agent bytes, the response body agent→client bytes.
//!
//! # Frames
//!
//! A frame is a big-endian `u32` length followed by that many bytes of JSON
//! (an object tagged by `"type"`). Lengths above [`MAX_FRAME_LEN`] are refused
//! before anything is allocated.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// First bytes of every agent connection.
pub const MAGIC: [u8; 4] = *b"TUNA";
/// TLS ALPN protocol id of the agent listener.
pub const ALPN: &[u8] = b"tuna-tunnel/1";
/// Largest frame payload accepted (bytes of JSON after the length prefix).
pub const MAX_FRAME_LEN: usize = 256 * 1024;
/// Time allowed from TCP accept (edge) or dial (agent) to `Welcome`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default heartbeat interval the edge announces in `Welcome`.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Missed heartbeat intervals after which a peer is declared dead.
pub const HEARTBEAT_MISSES: u32 = 3;
/// Longest accepted host name (RFC 1035) and endpoint alias.
pub const MAX_HOST_LEN: usize = 253;
/// Most bindings one `Hello` or `UpdateBindings` may carry.
pub const MAX_BINDINGS: usize = 1024;

/// Request header naming what an h2 stream carries: `control`, `http` or `tcp`.
pub const HEADER_KIND: &str = "tuna-kind";
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

/// The data plane's error type (the control plane has its own in `control`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The peer sent bytes that are not this protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A frame longer than [`MAX_FRAME_LEN`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte limit")]
    FrameTooLarge(usize),
    /// The peer refused us, with its reason.
    #[error("rejected by the peer: {0}")]
    Rejected(Rejection),
    /// The handshake did not finish within its time limit.
    #[error("handshake timed out after {0:?}")]
    HandshakeTimeout(Duration),
    /// The connection ended.
    #[error("connection closed: {0}")]
    Closed(String),
    /// A configuration value is unusable; the message says which.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// TLS setup failed (certificate, key, trust anchors).
    #[error("TLS: {0}")]
    Tls(String),
    /// Socket I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP/2 multiplexing layer.
    #[error("HTTP/2 mux: {0}")]
    Mux(#[from] h2::Error),
}

/// `Result` with the data plane's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
}

impl Binding {
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
}

/// Why a handshake, binding or session was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The agent speaks a protocol version the edge does not.
    VersionMismatch,
    /// Unknown, malformed or revoked tunnel token.
    BadToken,
    /// The token's lifetime is over; renew it.
    TokenExpired,
    /// The token was revoked while the session was open.
    TokenRevoked,
    /// The token (its account) may not serve this binding.
    BindingNotAllowed,
    /// The binding is allowed but cannot be served now (e.g. port in use).
    BindingUnavailable,
    /// A frame that is well-formed but makes no sense.
    BadRequest,
    /// The peer took too long to complete the handshake.
    HandshakeTimeout,
    /// No heartbeat within the allowed misses.
    HeartbeatTimeout,
    /// The edge is shutting down; reconnect later.
    ShuttingDown,
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

/// Every message of the protocol. See the module docs for who sends what when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Frame {
    /// Agent → edge, right after the preamble.
    Hello {
        /// The tunnel token.
        token: TunnelToken,
        /// Everything the agent wants to serve from the start.
        bindings: Vec<Binding>,
        /// Free-form agent identity for logs (e.g. `tuna-operator/0.1.0`).
        agent: String,
    },
    /// Edge → agent: the session is open; h2 starts after this frame.
    Welcome {
        /// Identifies the session in logs and status; stable until it ends.
        session_id: String,
        /// Interval at which both sides send [`Frame::Heartbeat`].
        heartbeat_ms: u64,
        /// The resolved bindings, in the order of `Hello`.
        bound: Vec<BindingOutcome>,
    },
    /// Edge → agent: handshake refused; the edge closes the connection.
    Reject(Rejection),
    /// Agent → edge over the control stream: change bindings live.
    UpdateBindings {
        /// Echoed in the answer.
        id: u64,
        /// Bindings to start serving.
        add: Vec<Binding>,
        /// Bindings to stop serving.
        remove: Vec<Binding>,
    },
    /// Edge → agent: the outcome of an `UpdateBindings` (one entry per `add`).
    BindingsUpdated {
        /// The request's id.
        id: u64,
        /// Per added binding: accepted (with target) or refused (with reason).
        results: Vec<BindingOutcome>,
    },
    /// Either way, every heartbeat interval: proof of life.
    Heartbeat {
        /// Sender's counter, for logs.
        seq: u64,
    },
    /// Edge → agent: the session ends now, and why (e.g. token revoked).
    GoAway(Rejection),
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
            Frame::Hello { bindings, .. } => too_many(bindings.len()),
            Frame::Welcome { bound, .. } => too_many(bound.len()),
            Frame::UpdateBindings { add, remove, .. } => too_many(add.len() + remove.len()),
            Frame::BindingsUpdated { results, .. } => too_many(results.len()),
            Frame::Reject(_) | Frame::Heartbeat { .. } | Frame::GoAway(_) => false,
        };
        if bad {
            return Err(Error::Protocol(format!(
                "more than {MAX_BINDINGS} bindings in one frame"
            )));
        }
        Ok(())
    }

    /// Reads exactly one frame, never more bytes than it spans (so a protocol
    /// switch after it loses nothing).
    pub async fn read_from<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Frame> {
        let mut len = [0u8; 4];
        reader.read_exact(&mut len).await.map_err(eof_as_closed)?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME_LEN {
            return Err(Error::FrameTooLarge(len));
        }
        let mut payload = vec![0u8; len];
        reader
            .read_exact(&mut payload)
            .await
            .map_err(eof_as_closed)?;
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
}

/// Metadata of one data stream: enough for `X-Forwarded-*` and routing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamMeta {
    /// The public client's address as the edge saw it.
    pub client_addr: SocketAddr,
    /// HTTP or TCP, with its key.
    pub kind: StreamKind,
}

impl StreamMeta {
    /// Puts the metadata into h2 request headers (edge side).
    pub fn write_headers(&self, headers: &mut HeaderMap) -> Result<()> {
        let value = |s: &str| {
            HeaderValue::from_str(s).map_err(|_| Error::Protocol(format!("bad header value {s:?}")))
        };
        headers.insert(HEADER_CLIENT, value(&self.client_addr.to_string())?);
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
            other => return Err(Error::Protocol(format!("unknown stream kind {other:?}"))),
        };
        Ok(Self { client_addr, kind })
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
            name().prop_map(Binding::tcp)
        ]
    }

    fn target() -> impl Strategy<Value = BoundTarget> {
        prop_oneof![
            name().prop_map(|host| BoundTarget::Http { host }),
            any::<u16>().prop_map(|port| BoundTarget::Tcp { port }),
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
            Just(ErrorCode::BadRequest),
            Just(ErrorCode::HandshakeTimeout),
            Just(ErrorCode::HeartbeatTimeout),
            Just(ErrorCode::ShuttingDown),
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

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                ".{0,80}",
                proptest::collection::vec(binding(), 0..8),
                ".{0,20}"
            )
                .prop_map(|(t, bindings, agent)| {
                    Frame::Hello {
                        token: TunnelToken::new(t),
                        bindings,
                        agent,
                    }
                }),
            (
                ".{0,40}",
                any::<u64>(),
                proptest::collection::vec(outcome(), 0..8)
            )
                .prop_map(|(session_id, heartbeat_ms, bound)| Frame::Welcome {
                    session_id,
                    heartbeat_ms,
                    bound
                }),
            rejection().prop_map(Frame::Reject),
            (
                any::<u64>(),
                proptest::collection::vec(binding(), 0..8),
                proptest::collection::vec(binding(), 0..8)
            )
                .prop_map(|(id, add, remove)| Frame::UpdateBindings {
                    id,
                    add,
                    remove
                }),
            (any::<u64>(), proptest::collection::vec(outcome(), 0..8))
                .prop_map(|(id, results)| Frame::BindingsUpdated { id, results }),
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
            tcp in any::<bool>(), port in any::<u16>()
        ) {
            let kind = if tcp {
                StreamKind::Tcp { endpoint: host, port }
            } else {
                StreamKind::Http { host, scheme: if https { Scheme::Https } else { Scheme::Http } }
            };
            let meta = StreamMeta { client_addr: SocketAddr::from((ip, cport)), kind };
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
            token: TunnelToken::new("s3cret"),
            bindings: vec![Binding::http("a.example")],
            agent: "t".into(),
        };
        assert_eq!(
            &h.encode().unwrap()[4..],
            br#"{"type":"hello","token":"s3cret","bindings":[{"kind":"http","host":"a.example"}],"agent":"t"}"#
        );
        assert!(!format!("{h:?}").contains("s3cret"));
    }

    #[test]
    fn unknown_error_codes_from_newer_peers_still_decode() {
        let raw = br#"{"type":"go_away","code":"quota_exceeded","message":"m"}"#;
        let mut bytes = (raw.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(raw);
        let (f, _) = Frame::decode(&bytes).unwrap().unwrap();
        assert_eq!(f, Frame::GoAway(Rejection::new(ErrorCode::Unknown, "m")));
    }
}
