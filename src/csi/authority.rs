//! An HTTP/2 front for the registration socket, which gives every request the
//! `:authority` `localhost`.
//!
//! The kubelet's plugin-registration client
//! (`pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`,
//! `dial`) dials the bare socket path, so grpc-go sends that path
//! (`/var/lib/kubelet/plugins_registry/….sock`) as the request's
//! `:authority`. `h2`, tonic's HTTP/2, resets every stream whose authority is
//! not a URI authority (a path is not), before any handler runs: the kubelet
//! never registered the plugin (found on the real node). Its CSI client sends
//! `localhost`, and that works. So between the kubelet and tonic this front
//! relays the connection's bytes unchanged in both directions, except the
//! client's header blocks (`HEADERS` and their `CONTINUATION`s). Each one is
//! decoded with an HPACK decoder that follows the client's encoder, its
//! `:authority` replaced by `localhost`, and encoded again. Every field is
//! encoded as a literal *without indexing*, so tonic's decoder table stays
//! empty and nothing has to be kept in step. The registration handlers read
//! no authority.
//!
//! Once `h2` accepts path authorities on Unix sockets (hyperium/h2 PR #487),
//! this module can go and tonic can serve the socket directly.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// The client connection preface (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The authority every request gets.
const AUTHORITY: &[u8] = b"localhost";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload tonic accepts unless it says otherwise
/// (`SETTINGS_MAX_FRAME_SIZE`'s initial value): rewritten blocks are cut to it.
const MAX_FRAME: usize = 16_384;
/// The most a client's header block may grow to before the connection is
/// dropped (the kubelet's are a few hundred bytes).
const MAX_BLOCK: usize = 64 * 1024;

/// Accepts connections on `listener` until `shutdown`; each is relayed
/// through the front to one end of an in-process pipe, whose other end is
/// what the returned stream yields, for tonic's `serve_with_incoming`.
pub fn incoming(
    listener: UnixListener,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<DuplexStream>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let client = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let client = match client {
                Ok((client, _)) => client,
                Err(e) => {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let (front, server) = tokio::io::duplex(MAX_BLOCK);
            if tx.send(Ok(server)).await.is_err() {
                return;
            }
            tokio::spawn(async move {
                if let Err(e) = relay(client, front).await {
                    tracing::debug!(error = %e, "registration connection ended");
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Relays one connection: server to client as it comes, client to server
/// frame by frame with its header blocks rewritten.
async fn relay(client: UnixStream, server: DuplexStream) -> io::Result<()> {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = tokio::io::split(server);
    let down = async move {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    let up = rewrite_client_frames(client_read, server_write);
    tokio::try_join!(up, down).map(|_| ())
}

/// Copies the client's preface and frames to `to`, every header block with
/// its `:authority` replaced (see the module's doc).
pub async fn rewrite_client_frames(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> io::Result<()> {
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;
    let mut decoder = loona_hpack::Decoder::new();
    // A header block still waiting for its CONTINUATION frames: the HEADERS
    // frame's flags, its priority fields and the fragments so far.
    let mut pending: Option<(u32, u8, Vec<u8>, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        match (kind, pending.take()) {
            (HEADERS, None) => {
                let (priority, fragment) = headers_payload(flags, &payload)?;
                if fragment.len() > MAX_BLOCK {
                    return Err(invalid("header block too large"));
                }
                let started = (stream, flags, priority, fragment);
                if flags & END_HEADERS == 0 {
                    pending = Some(started);
                } else {
                    send_block(&mut to, &mut decoder, started).await?;
                }
            }
            (CONTINUATION, Some((first, flags0, priority, mut block))) if first == stream => {
                block.extend_from_slice(&payload);
                if block.len() > MAX_BLOCK {
                    return Err(invalid("header block too large"));
                }
                let started = (stream, flags0, priority, block);
                if flags & END_HEADERS == 0 {
                    pending = Some(started);
                } else {
                    send_block(&mut to, &mut decoder, started).await?;
                }
            }
            (_, Some(_)) | (CONTINUATION, None) => {
                // RFC 9113, 6.10: only the block's CONTINUATIONs may follow.
                return Err(invalid("a header block was interrupted"));
            }
            (_, None) => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
            }
        }
    }
    to.shutdown().await
}

/// A HEADERS payload's priority fields (empty without `PRIORITY`) and its
/// header block fragment, padding removed.
fn headers_payload(flags: u8, payload: &[u8]) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut rest = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, tail) = rest.split_first().ok_or_else(|| invalid("short frame"))?;
        pad = usize::from(n);
        rest = tail;
    }
    let mut priority = Vec::new();
    if flags & PRIORITY != 0 {
        if rest.len() < 5 {
            return Err(invalid("short frame"));
        }
        priority.extend_from_slice(&rest[..5]);
        rest = &rest[5..];
    }
    if pad > rest.len() {
        return Err(invalid("padding longer than the frame"));
    }
    Ok((priority, rest[..rest.len() - pad].to_vec()))
}

/// Decodes a whole header block, gives it the authority, and writes it as a
/// HEADERS frame (and CONTINUATIONs when longer than a frame).
async fn send_block(
    to: &mut (impl AsyncWrite + Unpin),
    decoder: &mut loona_hpack::Decoder<'_>,
    (stream, flags, priority, block): (u32, u8, Vec<u8>, Vec<u8>),
) -> io::Result<()> {
    let fields = decoder
        .decode(&block)
        .map_err(|e| invalid(&format!("header block: {e}")))?;
    let mut encoded = priority;
    let with_priority = !encoded.is_empty();
    for (name, value) in &fields {
        let value = if name.as_slice() == b":authority" {
            AUTHORITY
        } else {
            value.as_slice()
        };
        literal_without_indexing(name, value, &mut encoded)?;
    }
    let mut chunks = encoded.chunks(MAX_FRAME).peekable();
    let mut first = true;
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        let (kind, mut out_flags) = if first {
            let kept = flags & END_STREAM | if with_priority { PRIORITY } else { 0 };
            (HEADERS, kept)
        } else {
            (CONTINUATION, 0)
        };
        if last {
            out_flags |= END_HEADERS;
        }
        let len = chunk.len();
        let id = stream.to_be_bytes();
        to.write_all(&[
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            out_flags,
            id[0],
            id[1],
            id[2],
            id[3],
        ])
        .await?;
        to.write_all(chunk).await?;
        first = false;
    }
    Ok(())
}

/// RFC 7541, 6.2.2: a literal field without indexing, with a literal name.
fn literal_without_indexing(name: &[u8], value: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    use loona_hpack::encoder::encode_integer_into;
    out.push(0x00);
    encode_integer_into(name.len(), 7, 0, &mut *out)?;
    out.extend_from_slice(name);
    encode_integer_into(value.len(), 7, 0, &mut *out)?;
    out.extend_from_slice(value);
    Ok(())
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// Reads the frames of `bytes` after the preface: (kind, flags, stream, payload).
    fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&bytes[..24], PREFACE);
        let mut rest = &bytes[24..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            out.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        out
    }

    async fn run(input: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        rewrite_client_frames(input.as_slice(), &mut out).await?;
        Ok(out)
    }

    /// Two requests as grpc-go sends them (the second reusing the first's
    /// dynamic-table entries), split over a CONTINUATION and padded: both come
    /// out with `localhost`, every other field and frame as sent, and no
    /// field indexed.
    #[tokio::test]
    async fn authorities_are_replaced_and_everything_else_kept() {
        let path_authority: &[u8] = b"/var/lib/kubelet/plugins_registry/connectors-csi-reg.sock";
        let request: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", path_authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ];
        let mut encoder = loona_hpack::Encoder::new();
        let first = encoder.encode(request.iter().copied());
        let second = encoder.encode(request.iter().copied());
        assert!(
            second.len() < first.len(),
            "the second uses the dynamic table"
        );

        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        let (a, b) = first.split_at(10);
        let mut padded = vec![3u8];
        padded.extend_from_slice(a);
        padded.extend_from_slice(&[0, 0, 0]);
        input.extend(frame(HEADERS, PADDED, 1, &padded));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\0")); // DATA
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));

        let out = frames(&run(input).await.unwrap());
        assert_eq!(out.len(), 4, "{out:?}");
        assert_eq!((out[0].0, out[0].3.len()), (0x4, 0));
        assert_eq!(
            (out[2].0, out[2].1, out[2].3.as_slice()),
            (0x0, END_STREAM, &b"\0\0\0\0\0"[..])
        );
        for (i, flags, stream) in [(1, END_HEADERS, 1), (3, END_HEADERS | END_STREAM, 3)] {
            let (kind, got_flags, got_stream, block) = &out[i];
            assert_eq!((*kind, *got_flags, *got_stream), (HEADERS, flags, stream));
            // Every field is a literal without indexing (0000 prefix, new name).
            let mut server = loona_hpack::Decoder::new();
            let fields = server.decode(block).unwrap();
            let want: Vec<(Vec<u8>, Vec<u8>)> = request
                .iter()
                .map(|(n, v)| {
                    let v: &[u8] = if *n == b":authority" { b"localhost" } else { v };
                    (n.to_vec(), v.to_vec())
                })
                .collect();
            assert_eq!(fields, want);
            assert_eq!(block[0], 0x00);
        }
    }

    #[tokio::test]
    async fn an_interrupted_header_block_or_another_protocol_is_refused() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encoder.encode([(&b":method"[..], &b"POST"[..])]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &block));
        input.extend(frame(0x0, 0, 1, b"x"));
        assert!(run(input).await.is_err());
        assert!(
            run(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())
                .await
                .is_err()
        );
    }
}
