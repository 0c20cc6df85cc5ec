//! Body framing: where a body ends, found as its bytes go by.

use crate::error::Error;
use crate::head::Framing;
use crate::limits::{MAX_CHUNK_LINE, MAX_TRAILERS};

/// Follows a body as its bytes go by, in pieces of any size, and finds its
/// exact end without buffering it (only a chunk-size or trailer line is
/// held, bounded).
#[derive(Debug)]
pub struct BodyTracker {
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
    /// A tracker at the start of a body framed as `framing`.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => Body::Done,
            Framing::Length(n) => Body::Length(n),
            Framing::Chunked => Body::Chunked(Chunked::default()),
            Framing::UntilClose => Body::UntilClose,
        };
        Self { state }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        matches!(self.state, Body::Done)
    }

    /// Takes the body bytes at the start of `input`: returns how many belong
    /// to the body (the rest is the next message). After the end it takes 0.
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, Error> {
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
    fn feed(&mut self, input: &[u8]) -> Result<usize, Error> {
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
                        return Err(Error::Body("chunk data not followed by CRLF"));
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
    fn hold(&mut self, part: &[u8]) -> Result<(), Error> {
        let limit = match self.state {
            ChunkState::SizeLine => MAX_CHUNK_LINE,
            _ => MAX_TRAILERS.saturating_sub(self.trailers),
        };
        if self.line.len() + part.len() > limit {
            return Err(Error::Body("chunk-size or trailer line too long"));
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    /// A complete line, LF included.
    fn line_done(&mut self, line: &[u8]) -> Result<(), Error> {
        // CRLF only, and no other control character: a bare CR or LF is
        // where lenient parsers split lines differently.
        let [content @ .., b'\r', b'\n'] = line else {
            return Err(Error::Body("line not ended by CRLF"));
        };
        if content
            .iter()
            .any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f)
        {
            return Err(Error::Body("control character in a chunk line"));
        }
        match self.state {
            ChunkState::SizeLine => {
                if line.len() > MAX_CHUNK_LINE {
                    return Err(Error::Body("chunk-size line too long"));
                }
                if !content.first().is_some_and(u8::is_ascii_hexdigit) {
                    return Err(Error::Body("chunk size missing"));
                }
                let size = match httparse::parse_chunk_size(line) {
                    Ok(httparse::Status::Complete((used, size))) if used == line.len() => size,
                    _ => return Err(Error::Body("invalid chunk size")),
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
                    return Err(Error::Body("trailer section too large"));
                }
                if content.is_empty() {
                    self.state = ChunkState::Done;
                } else if matches!(content.first(), Some(b' ' | b'\t')) {
                    return Err(Error::Body("folded trailer line"));
                } else {
                    let Some(colon) = content.iter().position(|b| *b == b':') else {
                        return Err(Error::Body("trailer line without a colon"));
                    };
                    if colon == 0 || !content[..colon].iter().all(|b| is_tchar(*b)) {
                        return Err(Error::Body("invalid trailer field name"));
                    }
                }
            }
            _ => unreachable!("lines only in size and trailer states"),
        }
        Ok(())
    }
}

/// A token character of a field name (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn feed_all(framing: Framing, input: &[u8]) -> Result<Option<usize>, Error> {
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
            "0\r\n: x\r\n\r\n",         // empty trailer name
            "0\r\nx y: z\r\n\r\n",      // space in a trailer name
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
    ) -> Result<Option<usize>, Error> {
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
