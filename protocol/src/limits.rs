//! The protocol's size limits, below both the frames ([`crate::wire`]) and
//! the error that reports a frame above them ([`crate::Error`]).

/// Largest frame payload accepted (bytes of JSON after the length prefix).
pub const MAX_FRAME_LEN: usize = 256 * 1024;
/// Largest `Hello` payload: what an unauthenticated peer may make the edge
/// read. The buffer grows with the bytes that arrive, never to the claimed
/// length at once.
pub const MAX_HELLO_LEN: usize = 64 * 1024;
