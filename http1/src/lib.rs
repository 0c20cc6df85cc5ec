//! The HTTP/1.1 codec that every hop of a request shares: the edge's byte
//! relay (`tuna-edge`) and the proxy core's fast path (`tuna-proxy`).
//!
//! A request crosses two relays before it reaches a backend. Where two HTTP
//! parsers disagree about a message — where it ends, which host it names,
//! which fields belong to the hop — a client can smuggle a second request
//! past the first parser, or into a stream that belongs to another tenant.
//! So both relays take every such decision here, with one set of rules and
//! limits, and refuse what these rules do not accept instead of guessing.
//!
//! # Contract
//!
//! - **Heads** ([`parse_request`], [`parse_response`]): parsed with
//!   `httparse` into a caller-provided array ([`HeaderBuf`], at most
//!   [`MAX_HEADERS`] fields), borrowing the read buffer: no allocation.
//!   A head larger than the caller's limit (at most [`MAX_HEAD`]) or with
//!   more fields is [`Error::HeadTooLarge`] / [`Error::TooManyHeaders`].
//! - **Framing** (RFC 9112 §6): a request with both `Transfer-Encoding`
//!   and `Content-Length`, a transfer coding other than one `chunked`,
//!   `Transfer-Encoding` in HTTP/1.0, more than one `Content-Length` field
//!   or a list in one (`5, 5`), a length that is not plain digits — all
//!   [`Error::Invalid`]. A response's `Transfer-Encoding` decides its
//!   framing; a `Content-Length` beside it is flagged
//!   ([`Response::conflicting_length`]): a relay must not forward it, nor
//!   reuse that connection.
//! - **Host**: at most one `Host` field; its value must be a DNS name
//!   (`[A-Za-z0-9._-]`, labels of 1–63 characters) or a bracketed IP
//!   literal, optionally with a port —
//!   no userinfo (`user@host`), no other characters ([`parse_host`]).
//! - **Hop-by-hop** ([`HOP_BY_HOP`], [`Request::is_hop_by_hop`]): the nine
//!   fixed names plus what `Connection` names; a `Connection` that names
//!   `Host`, `Content-Length` or `Transfer-Encoding` is refused (a hop that
//!   dropped them would change the message's meaning for the next one).
//! - **Client-address fields** ([`FORWARDING`]): the fields through which a
//!   client could claim another address or identity; a trust boundary
//!   removes them ([`is_forwarding`]).
//! - **Bodies** ([`BodyTracker`]): finds the exact end of a body as its
//!   bytes go by, in pieces of any size, without buffering it. Chunked
//!   bodies: lines end in CRLF only, no control characters, chunk-size
//!   lines up to [`MAX_CHUNK_LINE`], trailer sections up to
//!   [`MAX_TRAILERS`], trailer lines must be fields (no folding).
//!
//! Everything here is pure (no I/O, no tokio) and fuzzed (`fuzz/`).

mod body;
mod error;
mod fields;
mod head;
mod limits;

pub use body::BodyTracker;
pub use error::Error;
pub use fields::{
    FORWARDING, HOP_BY_HOP, Host, is_forwarding, is_idempotent, parse_content_length, parse_host,
    tokens,
};
pub use head::{Framing, HeaderBuf, Request, Response, header_buf, parse_request, parse_response};
pub use limits::{MAX_CHUNK_LINE, MAX_HEAD, MAX_HEADERS, MAX_TRAILERS};
