//! HTTP/1.1 message framing for the edge's byte relay ([`super::relay`]).
//!
//! The relay forwards request and response bytes verbatim, so it has to know
//! exactly where each message ends: a request's end is where the next
//! request (possibly for another host, another tenant) begins, and a
//! response's end is where the edge may answer the next request. Everything
//! here is strict on purpose: where two HTTP parsers could disagree about a
//! message boundary (request smuggling), the message is refused instead of
//! guessed at. Pure functions only; the I/O lives in the relay.

use std::mem::MaybeUninit;

/// Most header fields in a request or response head (hyper's default).
pub(crate) const MAX_HEADERS: usize = 100;
/// Largest request or response head.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Longest chunk-size line (with extensions) of a chunked body.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Largest trailer section of a chunked body.
const MAX_TRAILERS: usize = 16 * 1024;

/// How a message body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (requests without framing headers; HEAD, 1xx, 204, 304 responses).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

/// A request head the relay can forward as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestHead {
    /// Bytes of the head, blank line included.
    pub(crate) len: usize,
    /// Routing key: the `Host` header's host, lower case, without port or
    /// trailing dot; `None` when the request names no host.
    pub(crate) host: Option<String>,
    pub(crate) framing: Framing,
    /// `HEAD` request: its response has no body whatever its headers say.
    pub(crate) is_head: bool,
    /// The client asked to close the connection after this exchange.
    pub(crate) close: bool,
}

/// What to do with the bytes at the start of a connection's read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RequestParse {
    /// The head is not complete yet.
    Partial,
    /// A plain HTTP/1.1 request in origin form.
    Relay(RequestHead),
    /// Valid HTTP, but not for the byte relay: HTTP/1.0, upgrades
    /// (WebSocket), `CONNECT`, absolute-form targets, an HTTP/2 preface.
    /// The full HTTP server takes the connection over.
    Handoff,
    /// Refuse with this status and close.
    Reject(Reject),
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reject {
    /// 400: malformed head or ambiguous body framing.
    BadRequest(&'static str),
    /// 431: head too large or too many header fields.
    HeadTooLarge,
}

/// Parses the request head at the start of `buf`.
pub(crate) fn parse_request(buf: &[u8]) -> RequestParse {
    let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut storage,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return RequestParse::Reject(Reject::HeadTooLarge);
        }
        Ok(httparse::Status::Partial) => return RequestParse::Partial,
        // "PRI * HTTP/2.0" (h2 with prior knowledge) and other versions.
        Err(httparse::Error::Version) => return RequestParse::Handoff,
        Err(httparse::Error::TooManyHeaders) => return RequestParse::Reject(Reject::HeadTooLarge),
        Err(_) => return RequestParse::Reject(Reject::BadRequest("malformed request head")),
    };
    if len > MAX_HEAD {
        return RequestParse::Reject(Reject::HeadTooLarge);
    }
    let method = req.method.unwrap_or_default();
    let path = req.path.unwrap_or_default();
    if req.version != Some(1) || method == "CONNECT" || !(path.starts_with('/') || path == "*") {
        return RequestParse::Handoff;
    }
    let fields = match Fields::collect(req.headers) {
        Ok(f) => f,
        Err(reason) => return RequestParse::Reject(Reject::BadRequest(reason)),
    };
    if fields.upgrade && fields.connection_upgrade {
        return RequestParse::Handoff;
    }
    let framing = match (fields.transfer_encoding, fields.content_length) {
        (Some(_), Some(_)) => {
            return RequestParse::Reject(Reject::BadRequest(
                "both Transfer-Encoding and Content-Length",
            ));
        }
        (Some(TransferCoding::Chunked), None) => Framing::Chunked,
        (Some(TransferCoding::Other), None) => {
            return RequestParse::Reject(Reject::BadRequest(
                "a Transfer-Encoding other than chunked",
            ));
        }
        (None, Some(0)) | (None, None) => Framing::Empty,
        (None, Some(n)) => Framing::Length(n),
    };
    RequestParse::Relay(RequestHead {
        len,
        host: fields.host,
        framing,
        is_head: method == "HEAD",
        close: fields.connection_close,
    })
}

/// A response head as the relay sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ResponseHead {
    /// Bytes of the head, blank line included.
    pub(crate) len: usize,
    pub(crate) status: u16,
    pub(crate) framing: Framing,
    /// The connection (public and tunnel stream) ends after this response:
    /// `Connection: close`, HTTP/1.0, or a body delimited by close.
    pub(crate) close: bool,
}

impl ResponseHead {
    /// 1xx other than 101: the final response follows on the same exchange.
    pub(crate) fn is_informational(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

/// Why a response from the agent cannot be relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadResponse(pub(crate) &'static str);

/// Parses the response head at the start of `buf`; `Ok(None)` when more
/// bytes are needed. `request_is_head` tells whether the request was `HEAD`.
pub(crate) fn parse_response(
    buf: &[u8],
    request_is_head: bool,
) -> Result<Option<ResponseHead>, BadResponse> {
    let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut storage,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(BadResponse("response head too large"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadResponse("malformed response head")),
    };
    if len > MAX_HEAD {
        return Err(BadResponse("response head too large"));
    }
    let status = resp.code.unwrap_or_default();
    let fields = Fields::collect(resp.headers).map_err(BadResponse)?;
    let no_body = request_is_head || (100..200).contains(&status) || status == 204 || status == 304;
    let framing = if no_body {
        Framing::Empty
    } else {
        match (fields.transfer_encoding, fields.content_length) {
            // A client could take either; refuse rather than guess.
            (Some(_), Some(_)) => {
                return Err(BadResponse("both Transfer-Encoding and Content-Length"));
            }
            (Some(TransferCoding::Chunked), None) => Framing::Chunked,
            (Some(TransferCoding::Other), None) => Framing::UntilClose,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::UntilClose,
        }
    };
    let close = fields.connection_close
        || resp.version != Some(1)
        || framing == Framing::UntilClose
        || status == 101;
    Ok(Some(ResponseHead {
        len,
        status,
        framing,
        close,
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TransferCoding {
    /// Exactly `chunked`.
    Chunked,
    /// Anything else (a list, `gzip`, `identity`, ...).
    Other,
}

/// The header fields that decide framing, routing and persistence.
#[derive(Default)]
struct Fields {
    host: Option<String>,
    content_length: Option<u64>,
    transfer_encoding: Option<TransferCoding>,
    connection_close: bool,
    connection_upgrade: bool,
    upgrade: bool,
}

impl Fields {
    fn collect(headers: &[httparse::Header<'_>]) -> Result<Self, &'static str> {
        let mut f = Fields::default();
        let mut hosts = 0;
        for h in headers {
            let name = h.name;
            if name.eq_ignore_ascii_case("host") {
                hosts += 1;
                if hosts > 1 {
                    return Err("more than one Host header");
                }
                f.host = host_of(h.value);
            } else if name.eq_ignore_ascii_case("content-length") {
                for item in h.value.split(|b| *b == b',') {
                    let n = parse_length(trim(item)).ok_or("invalid Content-Length")?;
                    if f.content_length.is_some_and(|m| m != n) {
                        return Err("differing Content-Length values");
                    }
                    f.content_length = Some(n);
                }
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                // Several fields make a list: `chunked` twice is not `chunked`.
                f.transfer_encoding = Some(
                    if f.transfer_encoding.is_none()
                        && trim(h.value).eq_ignore_ascii_case(b"chunked")
                    {
                        TransferCoding::Chunked
                    } else {
                        TransferCoding::Other
                    },
                );
            } else if name.eq_ignore_ascii_case("connection") {
                for token in h.value.split(|b| *b == b',') {
                    let token = trim(token);
                    if token.eq_ignore_ascii_case(b"close") {
                        f.connection_close = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        f.connection_upgrade = true;
                    }
                }
            } else if name.eq_ignore_ascii_case("upgrade") {
                f.upgrade = true;
            }
        }
        Ok(f)
    }
}

/// Digits only (RFC 9110 §8.6): no sign, no spaces inside, no overflow.
fn parse_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// The host part of a `Host` value, normalised like the hyper path does.
fn host_of(value: &[u8]) -> Option<String> {
    let value = std::str::from_utf8(trim(value)).ok()?;
    let authority: http::uri::Authority = value.parse().ok()?;
    let host = authority.host().trim_end_matches('.');
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// Error in a message body's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadBody(pub(crate) &'static str);

/// Follows a body as its bytes go by, in pieces of any size, and finds its
/// exact end without buffering it (only a chunk-size or trailer line is
/// held, bounded).
#[derive(Debug)]
pub(crate) struct BodyTracker {
    state: Body,
}

#[derive(Debug)]
enum Body {
    Length(u64),
    UntilClose,
    Chunked(Chunked),
    Done,
}

impl BodyTracker {
    pub(crate) fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => Body::Done,
            Framing::Length(n) => Body::Length(n),
            Framing::Chunked => Body::Chunked(Chunked::default()),
            Framing::UntilClose => Body::UntilClose,
        };
        Self { state }
    }

    /// Whether the body has ended.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.state, Body::Done)
    }

    /// Takes the body bytes at the start of `input`: returns how many belong
    /// to the body (the rest is the next message). After the end it takes 0.
    pub(crate) fn feed(&mut self, input: &[u8]) -> Result<usize, BadBody> {
        match &mut self.state {
            Body::Done => Ok(0),
            Body::UntilClose => Ok(input.len()),
            Body::Length(remaining) => {
                let n = (*remaining).min(input.len() as u64);
                *remaining -= n;
                if *remaining == 0 {
                    self.state = Body::Done;
                }
                Ok(n as usize)
            }
            Body::Chunked(chunked) => {
                let n = chunked.feed(input)?;
                if matches!(chunked.state, ChunkState::Done) {
                    self.state = Body::Done;
                }
                Ok(n)
            }
        }
    }
}

#[derive(Debug, Default)]
struct Chunked {
    state: ChunkState,
    /// The current chunk-size or trailer line while it spans inputs.
    line: Vec<u8>,
    /// Trailer bytes seen so far.
    trailers: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    SizeLine,
    Data(u64),
    DataCr,
    DataLf,
    TrailerLine,
    Done,
}

impl Chunked {
    fn feed(&mut self, input: &[u8]) -> Result<usize, BadBody> {
        let mut pos = 0;
        while pos < input.len() {
            match self.state {
                ChunkState::Done => break,
                ChunkState::Data(remaining) => {
                    let n = remaining.min((input.len() - pos) as u64);
                    pos += n as usize;
                    self.state = if remaining == n {
                        ChunkState::DataCr
                    } else {
                        ChunkState::Data(remaining - n)
                    };
                }
                ChunkState::DataCr | ChunkState::DataLf => {
                    let want = if self.state == ChunkState::DataCr {
                        b'\r'
                    } else {
                        b'\n'
                    };
                    if input[pos] != want {
                        return Err(BadBody("chunk data not followed by CRLF"));
                    }
                    pos += 1;
                    self.state = if want == b'\r' {
                        ChunkState::DataLf
                    } else {
                        ChunkState::SizeLine
                    };
                }
                ChunkState::SizeLine | ChunkState::TrailerLine => {
                    let rest = &input[pos..];
                    let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
                        self.hold(rest)?;
                        pos = input.len();
                        break;
                    };
                    let line_bytes = &rest[..=nl];
                    pos += nl + 1;
                    if self.line.is_empty() {
                        self.line_done(line_bytes)?;
                    } else {
                        self.hold(line_bytes)?;
                        let line = std::mem::take(&mut self.line);
                        self.line_done(&line)?;
                        self.line = line;
                        self.line.clear();
                    }
                }
            }
        }
        Ok(pos)
    }

    /// Keeps part of a line that continues in the next input.
    fn hold(&mut self, part: &[u8]) -> Result<(), BadBody> {
        let limit = match self.state {
            ChunkState::SizeLine => MAX_CHUNK_LINE,
            _ => MAX_TRAILERS.saturating_sub(self.trailers),
        };
        if self.line.len() + part.len() > limit {
            return Err(BadBody("chunk-size or trailer line too long"));
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    /// A complete line, LF included.
    fn line_done(&mut self, line: &[u8]) -> Result<(), BadBody> {
        // CRLF only, and no other control character: a bare CR or LF is
        // where lenient parsers split lines differently.
        let [content @ .., b'\r', b'\n'] = line else {
            return Err(BadBody("line not ended by CRLF"));
        };
        if content
            .iter()
            .any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f)
        {
            return Err(BadBody("control character in a chunk line"));
        }
        match self.state {
            ChunkState::SizeLine => {
                if line.len() > MAX_CHUNK_LINE {
                    return Err(BadBody("chunk-size line too long"));
                }
                if !content.first().is_some_and(u8::is_ascii_hexdigit) {
                    return Err(BadBody("chunk size missing"));
                }
                let size = match httparse::parse_chunk_size(line) {
                    Ok(httparse::Status::Complete((used, size))) if used == line.len() => size,
                    _ => return Err(BadBody("invalid chunk size")),
                };
                self.state = if size == 0 {
                    ChunkState::TrailerLine
                } else {
                    ChunkState::Data(size)
                };
            }
            ChunkState::TrailerLine => {
                self.trailers += line.len();
                if self.trailers > MAX_TRAILERS {
                    return Err(BadBody("trailer section too large"));
                }
                if content.is_empty() {
                    self.state = ChunkState::Done;
                } else if matches!(content.first(), Some(b' ' | b'\t')) {
                    return Err(BadBody("folded trailer line"));
                } else if !content.contains(&b':') {
                    return Err(BadBody("trailer line without a colon"));
                }
            }
            _ => unreachable!("lines only in size and trailer states"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Stands for "where the blank line ends" in the table below.
    const HEAD_END: usize = usize::MAX;

    #[test]
    fn request_heads_table() {
        let cases: &[(&str, RequestParse)] = &[
            ("GET / HTTP/1.1\r\nHost: a", RequestParse::Partial),
            (
                "GET /x HTTP/1.1\r\nHost: App.Example.:8080\r\n\r\nNEXT",
                RequestParse::Relay(RequestHead {
                    len: HEAD_END,
                    host: Some("app.example".into()),
                    framing: Framing::Empty,
                    is_head: false,
                    close: false,
                }),
            ),
            (
                "HEAD / HTTP/1.1\r\nhost: a\r\nconnection: keep-alive, Close\r\n\r\n",
                RequestParse::Relay(RequestHead {
                    len: HEAD_END,
                    host: Some("a".into()),
                    framing: Framing::Empty,
                    is_head: true,
                    close: true,
                }),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                RequestParse::Relay(RequestHead {
                    len: HEAD_END,
                    host: Some("a".into()),
                    framing: Framing::Length(5),
                    is_head: false,
                    close: false,
                }),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n",
                RequestParse::Relay(RequestHead {
                    len: HEAD_END,
                    host: Some("a".into()),
                    framing: Framing::Chunked,
                    is_head: false,
                    close: false,
                }),
            ),
            (
                "GET / HTTP/1.1\r\n\r\n",
                RequestParse::Relay(RequestHead {
                    len: HEAD_END,
                    host: None,
                    framing: Framing::Empty,
                    is_head: false,
                    close: false,
                }),
            ),
            ("GET / HTTP/1.0\r\nHost: a\r\n\r\n", RequestParse::Handoff),
            (
                "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
                RequestParse::Handoff,
            ),
            (
                "CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
                RequestParse::Handoff,
            ),
            (
                "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                RequestParse::Handoff,
            ),
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", RequestParse::Handoff),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest(
                    "both Transfer-Encoding and Content-Length",
                )),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest("differing Content-Length values")),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest("differing Content-Length values")),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest("invalid Content-Length")),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest("a Transfer-Encoding other than chunked")),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest("a Transfer-Encoding other than chunked")),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest("more than one Host header")),
            ),
            (
                "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
                RequestParse::Reject(Reject::BadRequest("malformed request head")),
            ),
        ];
        for (input, want) in cases {
            let want = match want {
                RequestParse::Relay(h) => RequestParse::Relay(RequestHead {
                    len: input.find("\r\n\r\n").unwrap() + 4,
                    host: h.host.clone(),
                    ..*h
                }),
                other => other.clone(),
            };
            assert_eq!(parse_request(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn oversized_heads_are_refused() {
        let mut many = String::from("GET / HTTP/1.1\r\n");
        for i in 0..=MAX_HEADERS {
            many.push_str(&format!("x-{i}: y\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(
            parse_request(many.as_bytes()),
            RequestParse::Reject(Reject::HeadTooLarge)
        );
        let long = format!("GET / HTTP/1.1\r\nx: {}", "y".repeat(MAX_HEAD));
        assert_eq!(
            parse_request(long.as_bytes()),
            RequestParse::Reject(Reject::HeadTooLarge)
        );
    }

    #[test]
    fn response_heads_table() {
        type Want = Result<Option<(Framing, bool)>, BadResponse>;
        // (head, request was HEAD, (framing, close))
        let cases: &[(&str, bool, Want)] = &[
            ("HTTP/1.1 200 OK\r\n", false, Ok(None)),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
                false,
                Ok(Some((Framing::Length(3), false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
                true,
                Ok(Some((Framing::Empty, false))),
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                false,
                Ok(Some((Framing::Empty, false))),
            ),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false,
                Ok(Some((Framing::Empty, false))),
            ),
            (
                "HTTP/1.1 100 Continue\r\n\r\n",
                false,
                Ok(Some((Framing::Empty, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                Ok(Some((Framing::Chunked, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\n\r\n",
                false,
                Ok(Some((Framing::UntilClose, true))),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                false,
                Ok(Some((Framing::UntilClose, true))),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\n",
                false,
                Ok(Some((Framing::Length(1), true))),
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
                false,
                Ok(Some((Framing::Length(1), true))),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                Err(BadResponse("both Transfer-Encoding and Content-Length")),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                false,
                Err(BadResponse("differing Content-Length values")),
            ),
            (
                "HTTP/1.1 2000 OK\r\n\r\n",
                false,
                Err(BadResponse("malformed response head")),
            ),
        ];
        for (input, head, want) in cases {
            let got =
                parse_response(input.as_bytes(), *head).map(|r| r.map(|r| (r.framing, r.close)));
            assert_eq!(&got, want, "{input:?}");
        }
        let informational =
            parse_response(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", false)
                .unwrap()
                .unwrap();
        assert!(informational.is_informational());
        assert_eq!(informational.len, 40);
    }

    fn feed_all(framing: Framing, input: &[u8]) -> Result<Option<usize>, BadBody> {
        let mut t = BodyTracker::new(framing);
        let n = t.feed(input)?;
        Ok(t.is_done().then_some(n))
    }

    #[test]
    fn chunked_bodies_table() {
        // (body, what follows it)
        let ok: &[(&str, &str)] = &[
            ("0\r\n\r\n", "NEXT"),
            ("5\r\nhello\r\n0\r\n\r\n", ""),
            (
                "5;ext=\"a b\"\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\n",
                "0\r\n\r\n",
            ),
            (
                "3\r\nabc\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
                "GET / HTTP/1.1",
            ),
            ("00000000000000f\r\n0123456789abcde\r\n0\r\n\r\n", ""),
        ];
        for (body, next) in ok {
            let input = format!("{body}{next}");
            assert_eq!(
                feed_all(Framing::Chunked, input.as_bytes()),
                Ok(Some(body.len())),
                "{input:?}"
            );
        }
        let bad = [
            "\r\n",                     // no size
            "5\nhello\r\n0\r\n\r\n",    // bare LF
            "5\r\nhello\n0\r\n\r\n",    // data not followed by CRLF
            "5\r\nhelloX\r\n",          // data longer than its size
            "-5\r\nhello\r\n",          // not hex
            "5;a\nb\r\nhello\r\n",      // bare LF in an extension
            "5;a\rb\r\nhello\r\n",      // bare CR in an extension
            "10000000000000000\r\n",    // overflow
            "0\r\nbad trailer\r\n\r\n", // no colon
            "0\r\n folded: x\r\n\r\n",  // obs-fold
        ];
        for input in bad {
            assert!(
                feed_all(Framing::Chunked, input.as_bytes()).is_err(),
                "{input:?}"
            );
        }
        let long = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert!(feed_all(Framing::Chunked, long.as_bytes()).is_err());
    }

    #[test]
    fn length_and_close_delimited_bodies() {
        assert_eq!(feed_all(Framing::Length(3), b"abcdef"), Ok(Some(3)));
        assert_eq!(feed_all(Framing::Length(0), b"abc"), Ok(Some(0)));
        assert_eq!(feed_all(Framing::Empty, b"abc"), Ok(Some(0)));
        assert_eq!(feed_all(Framing::Length(9), b"abc"), Ok(None));
        assert_eq!(feed_all(Framing::UntilClose, b"abc"), Ok(None));
    }

    /// A chunked encoding of `chunks` with optional extensions and trailers.
    fn encode(chunks: &[Vec<u8>], ext: bool, trailers: &[String]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, c) in chunks.iter().filter(|c| !c.is_empty()).enumerate() {
            out.extend_from_slice(format!("{:x}", c.len()).as_bytes());
            if ext {
                out.extend_from_slice(format!(";n={i}").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n");
        for t in trailers {
            out.extend_from_slice(format!("x-{t}: {t}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    /// Feeds `input` cut at `cuts`, as reads would deliver it; returns where
    /// the tracker saw the end, as an offset into `input`.
    fn feed_in_pieces(
        framing: Framing,
        input: &[u8],
        cuts: &[usize],
    ) -> Result<Option<usize>, BadBody> {
        let mut t = BodyTracker::new(framing);
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        bounds.push(input.len());
        bounds.sort_unstable();
        let mut start = 0;
        for end in bounds {
            let piece = &input[start..end];
            let n = t.feed(piece)?;
            if t.is_done() {
                return Ok(Some(start + n));
            }
            assert_eq!(n, piece.len(), "an unfinished body takes its whole piece");
            start = end;
        }
        Ok(None)
    }

    proptest! {
        #[test]
        fn chunked_end_is_found_exactly_whatever_the_reads(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            ext in any::<bool>(),
            trailers in proptest::collection::vec("[a-z]{1,8}", 0..3),
            next in proptest::collection::vec(any::<u8>(), 0..64),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let body = encode(&chunks, ext, &trailers);
            let mut input = body.clone();
            input.extend_from_slice(&next);
            prop_assert_eq!(feed_in_pieces(Framing::Chunked, &input, &cuts), Ok(Some(body.len())));
            // Any strict prefix is an unfinished body, never a wrong end.
            let prefix = &body[..body.len() - 1];
            prop_assert_eq!(feed_in_pieces(Framing::Chunked, prefix, &cuts), Ok(None));
        }

        #[test]
        fn length_end_is_found_exactly_whatever_the_reads(
            len in 0u64..2000,
            extra in 0usize..100,
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let input = vec![b'x'; len as usize + extra];
            prop_assert_eq!(
                feed_in_pieces(Framing::Length(len), &input, &cuts),
                Ok(Some(len as usize))
            );
        }

        #[test]
        fn corrupting_a_chunk_delimiter_is_an_error_not_an_end(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..100), 1..5),
            which in any::<usize>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let body = encode(&chunks, false, &[]);
            // Replace one CR of the framing (never one inside chunk data) by LF.
            let mut crs = Vec::new();
            let mut pos = 0;
            for c in &chunks {
                let size_line = format!("{:x}\r\n", c.len()).len();
                crs.push(pos + size_line - 2);
                crs.push(pos + size_line + c.len());
                pos += size_line + c.len() + 2;
            }
            let at = crs[which % crs.len()];
            let mut bad = body.clone();
            bad[at] = b'\n';
            prop_assert!(feed_in_pieces(Framing::Chunked, &bad, &cuts).is_err());
        }
    }
}
