//! Request and response heads.

use std::mem::MaybeUninit;

use crate::error::Error;
use crate::fields::{HOP_BY_HOP, Host, is_not_nameable, parse_content_length, parse_host, tokens};
use crate::limits::{MAX_HEAD, MAX_HEADERS};

/// Storage for the header fields of one head, on the caller's stack.
pub type HeaderBuf<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

/// Fresh [`HeaderBuf`].
pub const fn header_buf<'b>() -> HeaderBuf<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// How a message body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (requests without framing fields; HEAD, 1xx, 204, 304
    /// responses).
    Empty,
    /// Exactly this many bytes (never 0: that is [`Framing::Empty`]).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

/// A request head that follows the rules of this crate.
#[derive(Debug)]
pub struct Request<'b, 'h> {
    /// Bytes of the head, blank line included.
    pub len: usize,
    /// As sent (case-sensitive).
    pub method: &'b str,
    /// The request target as sent.
    pub target: &'b str,
    /// HTTP/1.`minor` (0 or 1).
    pub minor: u8,
    /// Every field, in order.
    pub headers: &'h [httparse::Header<'b>],
    /// The `Host` field, if any.
    pub host: Option<Host<'b>>,
    /// Body framing.
    pub framing: Framing,
    /// The client closes after this exchange (`Connection: close`, or
    /// HTTP/1.0 without `keep-alive`).
    pub close: bool,
    /// An `Upgrade` request (`Upgrade` named in `Connection`).
    pub upgrade: bool,
    /// The request carries `Expect`.
    pub expect: bool,
    /// `TE` asks for trailers (kept end to end: gRPC needs it).
    pub te_trailers: bool,
    connection_tokens: usize,
}

impl Request<'_, '_> {
    /// Origin-form target (`/path?query`).
    pub fn is_origin_form(&self) -> bool {
        self.target.starts_with('/')
    }

    /// `HEAD`: its response has no body whatever its fields say.
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }

    /// Whether sending this request twice is safe (RFC 9110 §9.2.2).
    pub fn is_idempotent(&self) -> bool {
        crate::fields::is_idempotent(self.method)
    }

    /// How many header-name tokens `Connection` carries besides `close`,
    /// `keep-alive` and `upgrade`.
    pub fn connection_tokens(&self) -> usize {
        self.connection_tokens
    }

    /// Whether the field `name` ends at this hop when the request is
    /// forwarded with its body framing unchanged: [`HOP_BY_HOP`] except
    /// `Transfer-Encoding` (the body keeps its coding) and except `TE`
    /// when it asks for trailers, plus what `Connection` names.
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        hop_by_hop(self.headers, name, self.te_trailers, self.connection_tokens)
    }
}

/// A response head that follows the rules of this crate.
#[derive(Debug)]
pub struct Response<'b, 'h> {
    /// Bytes of the head, blank line included.
    pub len: usize,
    /// HTTP/1.`minor` (0 or 1).
    pub minor: u8,
    /// Status code (100–999 as `httparse` accepts it).
    pub status: u16,
    /// Reason phrase as sent.
    pub reason: &'b str,
    /// Every field, in order.
    pub headers: &'h [httparse::Header<'b>],
    /// Body framing (HEAD, 1xx, 204 and 304 have none).
    pub framing: Framing,
    /// The sender closes after this response: `Connection: close`,
    /// HTTP/1.0 without `keep-alive`, or a close-delimited body.
    pub close: bool,
    /// `Content-Length` beside `Transfer-Encoding`: the coding decides the
    /// framing (RFC 9112 §6.3), the length must not be forwarded, and the
    /// connection must not be reused.
    pub conflicting_length: bool,
    connection_tokens: usize,
}

impl Response<'_, '_> {
    /// 1xx other than 101: the final response follows.
    pub fn is_informational(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }

    /// Like [`Request::is_hop_by_hop`]; `Content-Length` is also dropped
    /// when [`Self::conflicting_length`] is set.
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        (self.conflicting_length && name.eq_ignore_ascii_case("content-length"))
            || hop_by_hop(self.headers, name, false, self.connection_tokens)
    }
}

fn hop_by_hop(
    headers: &[httparse::Header<'_>],
    name: &str,
    te_trailers: bool,
    connection_tokens: usize,
) -> bool {
    if name.eq_ignore_ascii_case("transfer-encoding") {
        return false;
    }
    if name.eq_ignore_ascii_case("te") {
        return !te_trailers;
    }
    if HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h)) {
        return true;
    }
    connection_tokens > 0
        && headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .flat_map(|h| tokens(h.value))
            .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
}

fn head_len(
    parsed: Result<httparse::Status<usize>, httparse::Error>,
    buf_len: usize,
    max_head: usize,
) -> Result<Option<usize>, Error> {
    match parsed {
        Ok(httparse::Status::Complete(len)) if len > max_head => Err(Error::HeadTooLarge),
        Ok(httparse::Status::Complete(len)) => Ok(Some(len)),
        Ok(httparse::Status::Partial) if buf_len >= max_head => Err(Error::HeadTooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(Error::TooManyHeaders),
        Err(httparse::Error::Version) => Err(Error::Version),
        Err(_) => Err(Error::Malformed),
    }
}

/// What the framing and connection fields of a head say.
#[derive(Default)]
struct Fields<'b> {
    host: Option<Host<'b>>,
    hosts: usize,
    content_length: Option<u64>,
    /// `Transfer-Encoding` fields seen.
    te_fields: usize,
    /// The single `Transfer-Encoding` value is exactly `chunked`.
    te_exactly_chunked: bool,
    /// The last transfer coding over all fields is `chunked`.
    te_ends_chunked: bool,
    /// `chunked` appears before another coding.
    te_chunked_not_last: bool,
    close: bool,
    keep_alive: bool,
    connection_upgrade: bool,
    connection_tokens: usize,
    upgrade: bool,
    expect: bool,
    te_trailers: bool,
}

fn collect<'b>(headers: &[httparse::Header<'b>]) -> Result<Fields<'b>, Error> {
    let mut f = Fields::default();
    for h in headers {
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            f.hosts += 1;
            if f.hosts > 1 {
                return Err(Error::Invalid("more than one Host field"));
            }
            f.host = Some(parse_host(h.value).ok_or(Error::Invalid("invalid Host"))?);
        } else if name.eq_ignore_ascii_case("content-length") {
            if f.content_length.is_some() {
                return Err(Error::Invalid("more than one Content-Length field"));
            }
            f.content_length = Some(
                parse_content_length(h.value).ok_or(Error::Invalid("invalid Content-Length"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            f.te_fields += 1;
            f.te_exactly_chunked =
                f.te_fields == 1 && crate::fields::trim(h.value).eq_ignore_ascii_case(b"chunked");
            for t in tokens(h.value) {
                if f.te_ends_chunked {
                    f.te_chunked_not_last = true;
                }
                f.te_ends_chunked = t.eq_ignore_ascii_case(b"chunked");
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for t in tokens(h.value) {
                if t.eq_ignore_ascii_case(b"close") {
                    f.close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    f.keep_alive = true;
                } else if t.eq_ignore_ascii_case(b"upgrade") {
                    f.connection_upgrade = true;
                } else if is_not_nameable(t) {
                    return Err(Error::Invalid("Connection names a framing or Host field"));
                } else {
                    f.connection_tokens += 1;
                }
            }
        } else if name.eq_ignore_ascii_case("upgrade") {
            f.upgrade = true;
        } else if name.eq_ignore_ascii_case("expect") {
            f.expect = true;
        } else if name.eq_ignore_ascii_case("te") {
            f.te_trailers |= tokens(h.value).any(|t| t.eq_ignore_ascii_case(b"trailers"));
        }
    }
    Ok(f)
}

/// Parses the request head at the start of `buf`; `Ok(None)` while it is
/// incomplete. `max_head` (at most [`MAX_HEAD`]) bounds the head's size:
/// a longer head, complete or not, is [`Error::HeadTooLarge`].
pub fn parse_request<'b, 'h>(
    buf: &'b [u8],
    storage: &'h mut HeaderBuf<'b>,
    max_head: usize,
) -> Result<Option<Request<'b, 'h>>, Error> {
    let max_head = max_head.min(MAX_HEAD);
    let mut req = httparse::Request::new(&mut []);
    let parsed =
        httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut req, buf, storage);
    let Some(len) = head_len(parsed, buf.len(), max_head)? else {
        return Ok(None);
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(Error::Malformed);
    };
    let headers: &'h [httparse::Header<'b>] = req.headers;
    let f = collect(headers)?;
    let framing = match (f.te_fields, f.content_length) {
        (0, None | Some(0)) => Framing::Empty,
        (0, Some(n)) => Framing::Length(n),
        (_, Some(_)) => {
            return Err(Error::Invalid("both Transfer-Encoding and Content-Length"));
        }
        (_, None) if minor == 0 => return Err(Error::Invalid("Transfer-Encoding in HTTP/1.0")),
        (_, None) if f.te_exactly_chunked => Framing::Chunked,
        (_, None) => return Err(Error::Invalid("a Transfer-Encoding other than chunked")),
    };
    Ok(Some(Request {
        len,
        method,
        target,
        minor,
        headers,
        host: f.host,
        framing,
        close: f.close || (minor == 0 && !f.keep_alive),
        upgrade: f.upgrade && f.connection_upgrade,
        expect: f.expect,
        te_trailers: f.te_trailers,
        connection_tokens: f.connection_tokens,
    }))
}

/// Parses the response head at the start of `buf`; `Ok(None)` while it is
/// incomplete. `request_is_head`: the request was `HEAD`.
pub fn parse_response<'b, 'h>(
    buf: &'b [u8],
    storage: &'h mut HeaderBuf<'b>,
    request_is_head: bool,
) -> Result<Option<Response<'b, 'h>>, Error> {
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, storage);
    let Some(len) = head_len(parsed, buf.len(), MAX_HEAD)? else {
        return Ok(None);
    };
    let (Some(minor), Some(status)) = (resp.version, resp.code) else {
        return Err(Error::Malformed);
    };
    let reason = resp.reason.unwrap_or("");
    let headers: &'h [httparse::Header<'b>] = resp.headers;
    let f = collect(headers)?;
    if f.te_chunked_not_last {
        return Err(Error::Invalid("chunked is not the last transfer coding"));
    }
    let no_body = request_is_head || (100..200).contains(&status) || status == 204 || status == 304;
    let framing = if no_body {
        Framing::Empty
    } else if f.te_fields > 0 {
        if f.te_ends_chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        match f.content_length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    let conflicting_length = f.te_fields > 0 && f.content_length.is_some();
    Ok(Some(Response {
        len,
        minor,
        status,
        reason,
        headers,
        framing,
        close: f.close || (minor == 0 && !f.keep_alive) || framing == Framing::UntilClose,
        conflicting_length,
        connection_tokens: f.connection_tokens,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Summary = (Option<&'static str>, Framing, bool);

    fn request(input: &str) -> Result<Option<(Option<String>, Framing, bool)>, Error> {
        let mut storage = header_buf();
        parse_request(input.as_bytes(), &mut storage, MAX_HEAD)
            .map(|r| r.map(|r| (r.host.map(|h| h.name.to_owned()), r.framing, r.close)))
    }

    #[test]
    fn request_heads_table() {
        let ok: &[(&str, Summary)] = &[
            (
                "GET /x HTTP/1.1\r\nHost: App.Example.:8080\r\n\r\nNEXT",
                (Some("App.Example"), Framing::Empty, false),
            ),
            (
                "HEAD / HTTP/1.1\r\nhost: a\r\nconnection: keep-alive, Close\r\n\r\n",
                (Some("a"), Framing::Empty, true),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
                (Some("a"), Framing::Length(5), false),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
                (Some("a"), Framing::Empty, false),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n",
                (Some("a"), Framing::Chunked, false),
            ),
            ("GET / HTTP/1.1\r\n\r\n", (None, Framing::Empty, false)),
            (
                "GET / HTTP/1.0\r\nHost: a\r\n\r\n",
                (Some("a"), Framing::Empty, true),
            ),
            (
                "GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
                (Some("a"), Framing::Empty, false),
            ),
            (
                "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
                (Some("a"), Framing::Empty, false),
            ),
        ];
        for (input, (host, framing, close)) in ok {
            let want = (host.map(str::to_owned), *framing, *close);
            assert_eq!(request(input), Ok(Some(want)), "{input:?}");
        }
        let bad: &[(&str, Error)] = &[
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Error::Version),
            ("GET / HTTP/1.1\r\nHost : a\r\n\r\n", Error::Malformed),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                Error::Invalid("both Transfer-Encoding and Content-Length"),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                Error::Invalid("more than one Content-Length field"),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
                Error::Invalid("invalid Content-Length"),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
                Error::Invalid("invalid Content-Length"),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                Error::Invalid("a Transfer-Encoding other than chunked"),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                Error::Invalid("a Transfer-Encoding other than chunked"),
            ),
            (
                "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                Error::Invalid("Transfer-Encoding in HTTP/1.0"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                Error::Invalid("more than one Host field"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: hidden.example@pub.example\r\n\r\n",
                Error::Invalid("invalid Host"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: content-length\r\nContent-Length: 1\r\n\r\nx",
                Error::Invalid("Connection names a framing or Host field"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: Host\r\n\r\n",
                Error::Invalid("Connection names a framing or Host field"),
            ),
        ];
        for (input, want) in bad {
            assert_eq!(request(input), Err(*want), "{input:?}");
        }
        assert_eq!(request("GET / HTTP/1.1\r\nHost: a"), Ok(None));
    }

    #[test]
    fn oversized_heads_are_refused() {
        let mut many = String::from("GET / HTTP/1.1\r\n");
        for i in 0..=MAX_HEADERS {
            many.push_str(&format!("x-{i}: y\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(request(&many), Err(Error::TooManyHeaders));
        let long = format!("GET / HTTP/1.1\r\nx: {}", "y".repeat(MAX_HEAD));
        assert_eq!(request(&long), Err(Error::HeadTooLarge));
        let complete = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "y".repeat(1000));
        let mut storage = header_buf();
        assert_eq!(
            parse_request(complete.as_bytes(), &mut storage, 512).map(|r| r.is_some()),
            Err(Error::HeadTooLarge)
        );
    }

    #[test]
    fn hop_by_hop_fields() {
        let input = "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\
                     Keep-Alive: 5\r\nTE: trailers\r\nUpgrade: h2c\r\nX-Other: 2\r\n\r\n";
        let mut storage = header_buf();
        let req = parse_request(input.as_bytes(), &mut storage, MAX_HEAD)
            .unwrap()
            .unwrap();
        let dropped: Vec<&str> = req
            .headers
            .iter()
            .map(|h| h.name)
            .filter(|n| req.is_hop_by_hop(n))
            .collect();
        assert_eq!(dropped, ["Connection", "X-Secret", "Keep-Alive", "Upgrade"]);
        assert!(
            !req.upgrade,
            "Upgrade without Connection: upgrade is no upgrade"
        );
        assert!(!req.is_hop_by_hop("transfer-encoding"));
    }

    fn response(input: &str, head: bool) -> Result<Option<(Framing, bool, bool)>, Error> {
        let mut storage = header_buf();
        parse_response(input.as_bytes(), &mut storage, head)
            .map(|r| r.map(|r| (r.framing, r.close, r.conflicting_length)))
    }

    #[test]
    fn response_heads_table() {
        type Want = Result<Option<(Framing, bool, bool)>, Error>;
        let cases: &[(&str, bool, Want)] = &[
            ("HTTP/1.1 200 OK\r\n", false, Ok(None)),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
                false,
                Ok(Some((Framing::Length(3), false, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
                true,
                Ok(Some((Framing::Empty, false, false))),
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                false,
                Ok(Some((Framing::Empty, false, false))),
            ),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false,
                Ok(Some((Framing::Empty, false, false))),
            ),
            (
                "HTTP/1.1 100 Continue\r\n\r\n",
                false,
                Ok(Some((Framing::Empty, false, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                Ok(Some((Framing::Chunked, false, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                Ok(Some((Framing::Chunked, false, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\n\r\n",
                false,
                Ok(Some((Framing::UntilClose, true, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                false,
                Ok(Some((Framing::UntilClose, true, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\n",
                false,
                Ok(Some((Framing::Length(1), true, false))),
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
                false,
                Ok(Some((Framing::Length(1), true, false))),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                Ok(Some((Framing::Chunked, false, true))),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                false,
                Err(Error::Invalid("chunked is not the last transfer coding")),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                false,
                Err(Error::Invalid("more than one Content-Length field")),
            ),
            ("HTTP/1.1 2000 OK\r\n\r\n", false, Err(Error::Malformed)),
        ];
        for (input, head, want) in cases {
            assert_eq!(&response(input, *head), want, "{input:?}");
        }
        let mut storage = header_buf();
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            &mut storage,
            false,
        )
        .unwrap()
        .unwrap();
        assert!(r.is_hop_by_hop("Content-Length"));
        assert!(!r.is_hop_by_hop("Transfer-Encoding"));
    }

    /// One request line and header fields from a grammar that mixes valid
    /// and hostile pieces (duplicates, lists, codings, userinfo, bad names).
    fn head_strategy() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let line = prop_oneof![
            Just("GET / HTTP/1.1"),
            Just("POST /up?x=1 HTTP/1.1"),
            Just("HEAD / HTTP/1.0"),
            Just("GET http://a.example/ HTTP/1.1"),
            Just("PRI * HTTP/2.0"),
        ];
        let fixed = proptest::sample::select(vec![
            "Host: a.example",
            "Host: b.example:8080",
            "Host: x@a.example",
            "Content-Length: 5",
            "Content-Length: 5, 5",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: gzip",
            "Connection: close",
            "Connection: keep-alive, x-a",
            "Connection: content-length",
            "X-A: 1",
            "Upgrade: websocket",
            "Expect: 100-continue",
            "Bad Name: 1",
        ]);
        let field = prop_oneof![fixed.prop_map(String::from), "[a-z-]{1,12}: [ -~]{0,30}",];
        (line, proptest::collection::vec(field, 0..8)).prop_map(|(line, fields)| {
            let mut s = format!("{line}\r\n");
            for f in fields {
                s.push_str(&f);
                s.push_str("\r\n");
            }
            s.push_str("\r\n");
            s
        })
    }

    fn summary(r: Result<Option<Request<'_, '_>>, Error>) -> Result<Option<String>, Error> {
        r.map(|r| {
            r.map(|r| {
                format!(
                    "{} {} {} {:?} {:?} {} {} {} {}",
                    r.len,
                    r.method,
                    r.target,
                    r.host,
                    r.framing,
                    r.close,
                    r.upgrade,
                    r.expect,
                    r.te_trailers
                )
            })
        })
    }

    proptest::proptest! {
        /// The codec against itself under every read split: a head read in
        /// any two pieces is incomplete until its last byte, never judged
        /// differently from the whole, and bytes after it change nothing.
        #[test]
        fn every_prefix_is_incomplete_or_the_same_verdict(
            head in head_strategy(),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..32),
        ) {
            let mut storage = header_buf();
            let whole = summary(parse_request(head.as_bytes(), &mut storage, MAX_HEAD));
            let mut with_tail = head.clone().into_bytes();
            with_tail.extend_from_slice(&tail);
            let mut storage = header_buf();
            proptest::prop_assert_eq!(
                &summary(parse_request(&with_tail, &mut storage, MAX_HEAD)),
                &whole
            );
            for cut in 0..head.len() {
                let mut storage = header_buf();
                let part = summary(parse_request(&head.as_bytes()[..cut], &mut storage, MAX_HEAD));
                match (&part, &whole) {
                    (Ok(None), _) => {}
                    (Err(e), Err(w)) if e == w => {}
                    _ => proptest::prop_assert!(false, "prefix {cut}: {part:?} vs {whole:?}"),
                }
            }
        }
    }
}
