//! HTTP/1.1 message framing for the fast path: which bytes of a stream
//! belong to the current message, found without decoding or copying them
//! (RFC 9112 §6). Parsing itself is `httparse`'s; this module only adds the
//! rules a relay needs on top of it.

use std::fmt;

/// How the body of a message is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// No body (HEAD responses, 1xx, 204, 304, requests without length).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`, relayed as is.
    Chunked,
    /// Everything until the sender closes (responses only).
    UntilClose,
}

/// The stream does not follow HTTP/1.1 framing; the connection cannot be
/// trusted any further and is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FramingError(&'static str);

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Longest chunk-size line or trailer line we buffer while waiting for its
/// end; a peer that sends longer lines is broken or hostile.
const MAX_LINE: usize = 8 * 1024;

/// Parses a `Content-Length` value. With `lists`, a comma-separated list of
/// identical values is accepted (RFC 9110 §8.6 lets a recipient do so; we
/// allow it from upstreams only). Anything else — signs, spaces inside
/// digits, differing values, overflow — is `None`.
pub(crate) fn parse_content_length(v: &[u8], lists: bool) -> Option<u64> {
    let mut value: Option<u64> = None;
    let mut parts = 0;
    for part in v.split(|b| *b == b',') {
        parts += 1;
        if parts > 1 && !lists {
            return None;
        }
        let part = part.trim_ascii();
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let mut n: u64 = 0;
        for d in part {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        }
        match value {
            Some(prev) if prev != n => return None,
            _ => value = Some(n),
        }
    }
    value
}

/// The comma-separated tokens of a header value, trimmed, empty ones
/// skipped (RFC 9110 §5.6.1).
pub(crate) fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether the last transfer coding of a `Transfer-Encoding` value is
/// `chunked`, the only case in which a response's length is known from it.
pub(crate) fn ends_chunked(v: &[u8]) -> bool {
    tokens(v)
        .last()
        .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data; this many bytes left.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last chunk: trailer fields until an empty line.
    Trailers,
    Done,
}

/// Follows a chunked body as it passes through, to find its end.
#[derive(Debug, Clone)]
pub(crate) struct Chunked {
    state: State,
}

impl Default for Chunked {
    fn default() -> Self {
        Self { state: State::Size }
    }
}

impl Chunked {
    /// Consumes the bytes at the start of `buf` that belong to the body and
    /// returns how many, and whether the body ended with them. Bytes of an
    /// incomplete chunk-size or trailer line are not consumed: call again
    /// with them at the start of `buf` once more bytes arrived. After the
    /// end, nothing more is consumed.
    pub(crate) fn advance(&mut self, buf: &[u8]) -> Result<(usize, bool), FramingError> {
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            match self.state {
                State::Size => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((n, size))) => {
                        at += n;
                        self.state = if size == 0 {
                            State::Trailers
                        } else {
                            State::Data(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if rest.len() <= MAX_LINE => {
                        return Ok((at, false));
                    }
                    _ => return Err(FramingError("invalid chunk size line")),
                },
                State::Data(left) => {
                    let take = left.min(rest.len() as u64);
                    at += take as usize;
                    if take == left {
                        self.state = State::DataEnd;
                    } else {
                        self.state = State::Data(left - take);
                        return Ok((at, false));
                    }
                }
                State::DataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        at += 2;
                        self.state = State::Size;
                    }
                    [] | [b'\r'] => return Ok((at, false)),
                    _ => return Err(FramingError("chunk data not followed by CRLF")),
                },
                State::Trailers => {
                    if rest.starts_with(b"\r\n") {
                        self.state = State::Done;
                        return Ok((at + 2, true));
                    }
                    match rest.iter().position(|b| *b == b'\n') {
                        Some(i) if i <= MAX_LINE => at += i + 1,
                        None if rest.len() <= MAX_LINE => return Ok((at, false)),
                        _ => return Err(FramingError("trailer line too long")),
                    }
                }
                State::Done => return Ok((at, true)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn content_length_values() {
        let cases: &[(&[u8], bool, Option<u64>)] = &[
            (b"0", false, Some(0)),
            (b"1234", false, Some(1234)),
            (b" 12 ", false, Some(12)),
            (b"", false, None),
            (b"+1", false, None),
            (b"-1", false, None),
            (b"1 2", false, None),
            (b"0x10", false, None),
            (b"18446744073709551616", false, None),
            (b"5, 5", false, None),
            (b"5, 5", true, Some(5)),
            (b"5,6", true, None),
            (b"5,", true, None),
        ];
        for (v, lists, want) in cases {
            assert_eq!(
                parse_content_length(v, *lists),
                *want,
                "{:?} lists={lists}",
                String::from_utf8_lossy(v)
            );
        }
    }

    #[test]
    fn transfer_coding_ends_chunked() {
        assert!(ends_chunked(b"chunked"));
        assert!(ends_chunked(b"gzip, Chunked"));
        assert!(!ends_chunked(b"chunked, gzip"));
        assert!(!ends_chunked(b"identity"));
        assert!(!ends_chunked(b""));
    }

    fn run(body: &[u8], splits: &[usize]) -> Result<Option<usize>, FramingError> {
        // Feeds `body` in pieces the way the relay does: unconsumed bytes
        // stay at the front of the buffer and new bytes are appended.
        let mut tracker = Chunked::default();
        let mut buf = Vec::new();
        let mut fed = 0;
        let mut consumed = 0;
        let mut cuts: Vec<usize> = splits.iter().map(|s| s % (body.len() + 1)).collect();
        cuts.push(body.len());
        cuts.sort_unstable();
        for cut in cuts {
            buf.extend_from_slice(&body[fed..cut]);
            fed = cut;
            let (n, done) = tracker.advance(&buf)?;
            consumed += n;
            buf.drain(..n);
            if done {
                return Ok(Some(consumed));
            }
        }
        Ok(None)
    }

    #[test]
    fn finds_the_end_of_simple_bodies() {
        let body = b"5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        assert_eq!(run(body, &[]), Ok(Some(15)));
        let with_ext_and_trailers = b"3;x=y\r\nabc\r\n0;last\r\nx-sum: 1\r\nx-b: 2\r\n\r\nrest";
        assert_eq!(
            run(with_ext_and_trailers, &[1, 2, 7, 20, 30]),
            Ok(Some(with_ext_and_trailers.len() - 4))
        );
        assert_eq!(run(b"5\r\nhel", &[]), Ok(None));
    }

    #[test]
    fn rejects_broken_framing() {
        assert!(run(b"zz\r\n", &[]).is_err());
        assert!(run(b"3\r\nabcX\r\n", &[]).is_err());
        assert!(run(b"ffffffffffffffffff\r\n", &[]).is_err());
        let long_line = [b"1;".as_slice(), &[b'a'; MAX_LINE + 10]].concat();
        assert!(run(&long_line, &[]).is_err());
    }

    /// A chunked encoding of `chunks` with optional extensions and
    /// trailers, the way a real sender writes it.
    fn encode(chunks: &[Vec<u8>], ext: bool, trailers: &[(String, String)]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks.iter().filter(|c| !c.is_empty()) {
            out.extend_from_slice(format!("{:X}", c.len()).as_bytes());
            if ext {
                out.extend_from_slice(b";name=value");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n");
        for (k, v) in trailers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    proptest! {
        /// Whatever the chunk sizes, extensions, trailers and read
        /// boundaries, the end is found exactly where the encoding ends
        /// and bytes after it are never consumed.
        #[test]
        fn end_is_found_exactly(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            ext in any::<bool>(),
            trailers in proptest::collection::vec(("[a-z]{1,8}", "[ -~]{0,20}"), 0..3),
            tail in proptest::collection::vec(any::<u8>(), 0..40),
            splits in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let encoded = encode(&chunks, ext, &trailers);
            let mut stream = encoded.clone();
            stream.extend_from_slice(&tail);
            prop_assert_eq!(run(&stream, &splits), Ok(Some(encoded.len())));
        }
    }
}
