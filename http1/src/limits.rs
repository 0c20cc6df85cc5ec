//! The size limits of a message head and of a chunked body's framing.

/// Most header fields in a request or response head.
pub const MAX_HEADERS: usize = 100;
/// Largest request or response head, blank line included.
pub const MAX_HEAD: usize = 64 * 1024;
/// Longest chunk-size line of a chunked body (extensions and CRLF included).
pub const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Largest trailer section of a chunked body.
pub const MAX_TRAILERS: usize = 16 * 1024;
