//! Host and path canonicalisation, shared by table building and lookup.
//!
//! Both sides of a comparison go through the same functions, so a route and a
//! request that mean the same resource compare equal byte for byte. The
//! lookup side writes into caller-provided stack buffers and never allocates.

use std::borrow::Cow;

/// Longest host name accepted (RFC 1035 presentation form, without the
/// trailing dot). Longer `Host` headers never match.
pub const MAX_HOST_LEN: usize = 253;

/// Size of the stack buffer a non-canonical request path is rewritten into.
/// A request path that needs rewriting and does not fit (percent-encoding can
/// triple its length) matches no route: no request is worth a heap allocation.
pub const MAX_PATH_LEN: usize = 4096;

/// Returns the canonical form of a `Host` header value, or `None` when it
/// cannot name a host (empty, bad port, unbalanced IPv6 brackets, too long).
///
/// Canonical means: ASCII-lowercased, without `:port`, without one trailing
/// dot. It allocates only when the value contains upper-case letters.
///
/// ```
/// use tuna_routing::normalize_host;
/// assert_eq!(normalize_host("WWW.Example.COM.:8443").as_deref(), Some("www.example.com"));
/// assert_eq!(normalize_host("[::1]:80").as_deref(), Some("[::1]"));
/// assert_eq!(normalize_host("example.com:http"), None);
/// ```
pub fn normalize_host(raw: &str) -> Option<Cow<'_, str>> {
    let host = strip_host(raw)?;
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Some(Cow::Owned(host.to_ascii_lowercase()))
    } else {
        Some(Cow::Borrowed(host))
    }
}

/// The zero-allocation variant used by lookups: lower-cases into `buf` only
/// when needed.
pub(crate) fn normalize_host_into<'a>(
    raw: &'a str,
    buf: &'a mut [u8; MAX_HOST_LEN],
) -> Option<&'a str> {
    let host = strip_host(raw)?;
    if !host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(host);
    }
    let out = &mut buf[..host.len()];
    out.copy_from_slice(host.as_bytes());
    out.make_ascii_lowercase();
    // Lower-casing ASCII bytes of a `str` keeps it valid UTF-8.
    std::str::from_utf8(out).ok()
}

/// Removes the port and one trailing dot; checks the length.
pub(crate) fn strip_host(raw: &str) -> Option<&str> {
    let host = if let Some(rest) = raw.strip_prefix('[') {
        // IPv6 literal: `[addr]` optionally followed by `:port`.
        let close = rest.find(']')?;
        let after = &rest[close + 1..];
        if !after.is_empty() && !is_port(after.strip_prefix(':')?) {
            return None;
        }
        &raw[..close + 2]
    } else {
        match raw.find(':') {
            Some(colon) => {
                if !is_port(&raw[colon + 1..]) {
                    return None;
                }
                &raw[..colon]
            }
            None => raw,
        }
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > MAX_HOST_LEN {
        return None;
    }
    Some(host)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

/// Why a route's host was rejected when the table was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidHost {
    /// The host is empty (rules without a host are not routable here).
    Empty,
    /// Longer than 253 characters.
    TooLong,
    /// Contains a port; route hosts are names only.
    HasPort,
    /// A label is empty, longer than 63 characters, or contains a character
    /// other than a-z, 0-9 and `-` (or starts/ends with `-`).
    BadLabel,
    /// `*` appears other than as the whole first label (`*.example.com`), or
    /// the wildcard has fewer than two labels after it.
    BadWildcard,
}

impl InvalidHost {
    /// Stable machine-readable name.
    ///
    /// ```
    /// assert_eq!(tuna_routing::InvalidHost::BadWildcard.as_str(), "HostBadWildcard");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Empty => "HostEmpty",
            Self::TooLong => "HostTooLong",
            Self::HasPort => "HostHasPort",
            Self::BadLabel => "HostBadLabel",
            Self::BadWildcard => "HostBadWildcard",
        }
    }
}

impl std::fmt::Display for InvalidHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Empty => "host is empty",
            Self::TooLong => "host is longer than 253 characters",
            Self::HasPort => "host must not contain a port",
            Self::BadLabel => "host is not a valid DNS name (labels of a-z, 0-9 and '-', at most 63 characters)",
            Self::BadWildcard => "a wildcard must be the whole first label of a host with at least two more labels, as in *.example.com",
        })
    }
}

/// A validated route host: exact, or a wildcard over exactly one label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum RouteHost {
    Exact(String),
    /// The suffix after `*.`, e.g. `example.com` for `*.example.com`.
    Wildcard(String),
}

/// Validates and canonicalises the host of a route spec.
pub(crate) fn parse_route_host(raw: &str) -> Result<RouteHost, InvalidHost> {
    if raw.is_empty() {
        return Err(InvalidHost::Empty);
    }
    if raw.contains(':') {
        return Err(InvalidHost::HasPort);
    }
    let lower = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    if lower.len() > MAX_HOST_LEN {
        return Err(InvalidHost::TooLong);
    }
    let (wildcard, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, lower.as_str()),
    };
    if name.contains('*') {
        return Err(InvalidHost::BadWildcard);
    }
    if wildcard && !name.contains('.') {
        return Err(InvalidHost::BadWildcard);
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(InvalidHost::BadLabel);
        }
    }
    Ok(if wildcard {
        RouteHost::Wildcard(name.to_owned())
    } else {
        RouteHost::Exact(lower)
    })
}

/// Why a route's path was rejected when the table was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidPath {
    /// Does not start with `/`.
    NotAbsolute,
    /// Contains `?` or `#`: the query and fragment are never part of a path.
    QueryOrFragment,
    /// Contains `//`; requests are matched after merging repeated slashes, so
    /// this route could never match as written.
    RepeatedSlash,
    /// Contains a `.` or `..` segment (also when written as `%2E`); requests
    /// are matched after resolving dot segments.
    DotSegment,
    /// Contains `%2F` (an encoded `/`), which is never treated as a separator.
    EncodedSlash,
    /// Longer than [`MAX_PATH_LEN`] once canonical.
    TooLong,
}

impl InvalidPath {
    /// Stable machine-readable name.
    ///
    /// ```
    /// assert_eq!(tuna_routing::InvalidPath::EncodedSlash.as_str(), "PathEncodedSlash");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotAbsolute => "PathNotAbsolute",
            Self::QueryOrFragment => "PathHasQueryOrFragment",
            Self::RepeatedSlash => "PathRepeatedSlash",
            Self::DotSegment => "PathDotSegment",
            Self::EncodedSlash => "PathEncodedSlash",
            Self::TooLong => "PathTooLong",
        }
    }
}

impl std::fmt::Display for InvalidPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotAbsolute => "path must start with '/'",
            Self::QueryOrFragment => "path must not contain '?' or '#'",
            Self::RepeatedSlash => "path must not contain '//' (requests are matched with repeated slashes merged)",
            Self::DotSegment => "path must not contain '.' or '..' segments (requests are matched with dot segments resolved)",
            Self::EncodedSlash => "path must not contain %2F (an encoded '/' is never a separator)",
            Self::TooLong => "path is too long",
        })
    }
}

/// Validates a route path and returns its canonical form (see the crate docs
/// for the canonical form; Prefix trailing-slash handling is the caller's).
pub(crate) fn parse_route_path(raw: &str) -> Result<String, InvalidPath> {
    if !raw.starts_with('/') {
        return Err(InvalidPath::NotAbsolute);
    }
    if raw.contains(['?', '#']) {
        return Err(InvalidPath::QueryOrFragment);
    }
    if raw.contains("//") {
        return Err(InvalidPath::RepeatedSlash);
    }
    let lower = raw.to_ascii_lowercase();
    if lower.contains("%2f") {
        return Err(InvalidPath::EncodedSlash);
    }
    let mut buf = vec![0u8; raw.len() * 3 + 1];
    let len = canonicalize(raw.as_bytes(), &mut buf).ok_or(InvalidPath::TooLong)?;
    buf.truncate(len);
    // `%2E` is an encoded unreserved `.`, so `/%2e%2E` is a dot segment too.
    if lower
        .split('/')
        .any(|seg| matches!(seg.replace("%2e", ".").as_str(), "." | ".."))
    {
        return Err(InvalidPath::DotSegment);
    }
    if len > MAX_PATH_LEN {
        return Err(InvalidPath::TooLong);
    }
    String::from_utf8(buf).map_err(|_| InvalidPath::TooLong)
}

/// Returns the canonical form of a request path, or `None` when it cannot be
/// routed (not starting with `/`, or too long once rewritten). The query
/// string and fragment are removed. Allocates only when rewriting is needed.
///
/// ```
/// use tuna_routing::normalize_path;
/// assert_eq!(normalize_path("/a//b/./c/../d?x=1").as_deref(), Some("/a/b/d"));
/// assert_eq!(normalize_path("/%7euser/%2fetc").as_deref(), Some("/~user/%2Fetc"));
/// assert_eq!(normalize_path("").as_deref(), Some("/"));
/// assert_eq!(normalize_path("*"), None);
/// ```
pub fn normalize_path(raw: &str) -> Option<Cow<'_, str>> {
    let path = strip_query(raw);
    if path.is_empty() {
        return Some(Cow::Borrowed("/"));
    }
    if is_canonical(path.as_bytes()) {
        return Some(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return None;
    }
    let mut buf = vec![0u8; path.len() * 3 + 1];
    let len = canonicalize(path.as_bytes(), &mut buf)?;
    if len > MAX_PATH_LEN {
        return None;
    }
    buf.truncate(len);
    String::from_utf8(buf).ok().map(Cow::Owned)
}

/// The zero-allocation variant used by lookups.
pub(crate) fn normalize_path_into<'a>(
    raw: &'a str,
    buf: &'a mut [u8; MAX_PATH_LEN],
) -> Option<&'a str> {
    let path = strip_query(raw);
    if path.is_empty() {
        return Some("/");
    }
    if is_canonical(path.as_bytes()) {
        return Some(path);
    }
    if !path.starts_with('/') {
        return None;
    }
    let len = canonicalize(path.as_bytes(), buf)?;
    std::str::from_utf8(&buf[..len]).ok()
}

fn strip_query(raw: &str) -> &str {
    match raw.find(['?', '#']) {
        Some(i) => &raw[..i],
        None => raw,
    }
}

/// RFC 3986 unreserved characters: their percent-encoded and literal forms
/// are equivalent (RFC 3986 §6.2.2.2).
const fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters allowed literally in a path segment (RFC 3986 `pchar` minus
/// the percent sign, which is handled separately).
const fn is_pchar(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Bytes allowed literally in a canonical path segment, as a table: this
/// check runs on every byte of every request path.
static PCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = is_pchar(i as u8);
        i += 1;
    }
    table
};

/// True when `path` is already canonical: starts with `/`, no `//`, no dot
/// segments, every byte a pchar or `/`, every `%` followed by two upper-case
/// hex digits that do not encode an unreserved character.
pub(crate) fn is_canonical(path: &[u8]) -> bool {
    canonical_path_end(path) == Some(path.len())
}

/// The fast path of every lookup, in one pass: if the path part of a raw
/// request target (up to `?` or `#`) is canonical, returns where it ends.
#[inline]
pub(crate) fn canonical_path_end(raw: &[u8]) -> Option<usize> {
    if raw.first() != Some(&b'/') {
        return None;
    }
    let mut seg_start = 1;
    let mut i = 1;
    while i < raw.len() {
        let b = raw[i];
        if PCHAR[b as usize] {
            i += 1;
            continue;
        }
        match b {
            b'/' => {
                if i == seg_start || is_dot_segment(&raw[seg_start..i]) {
                    return None;
                }
                i += 1;
                seg_start = i;
            }
            b'?' | b'#' => break,
            b'%' => {
                let (Some(&h), Some(&l)) = (raw.get(i + 1), raw.get(i + 2)) else {
                    return None;
                };
                let (Some(hv), Some(lv)) = (hex_val(h), hex_val(l)) else {
                    return None;
                };
                if h.is_ascii_lowercase() || l.is_ascii_lowercase() || is_unreserved(hv * 16 + lv) {
                    return None;
                }
                i += 3;
            }
            _ => return None,
        }
    }
    // The last segment may be empty (a trailing slash), never a dot segment.
    if is_dot_segment(&raw[seg_start..i]) {
        return None;
    }
    Some(i)
}

fn is_dot_segment(segment: &[u8]) -> bool {
    matches!(segment, b"." | b"..")
}

/// Writes the canonical form of the byte(s) at `input[i]`; returns how many
/// input bytes were consumed, or `None` when `out` is full.
fn write_canonical_byte(input: &[u8], i: usize, out: &mut [u8], len: &mut usize) -> Option<usize> {
    let b = input[i];
    if b == b'%' {
        if let (Some(&h), Some(&l)) = (input.get(i + 1), input.get(i + 2))
            && let (Some(hv), Some(lv)) = (hex_val(h), hex_val(l))
        {
            {
                let decoded = hv * 16 + lv;
                if is_unreserved(decoded) {
                    push(out, len, decoded)?;
                } else {
                    push(out, len, b'%')?;
                    push(out, len, HEX[hv as usize])?;
                    push(out, len, HEX[lv as usize])?;
                }
                return Some(3);
            }
        }
        // A `%` that starts no valid escape is a literal percent sign.
        push(out, len, b'%')?;
        push(out, len, b'2')?;
        push(out, len, b'5')?;
        return Some(1);
    }
    if is_pchar(b) {
        push(out, len, b)?;
    } else {
        push(out, len, b'%')?;
        push(out, len, HEX[(b >> 4) as usize])?;
        push(out, len, HEX[(b & 15) as usize])?;
    }
    Some(1)
}

fn push(out: &mut [u8], len: &mut usize, b: u8) -> Option<()> {
    *out.get_mut(*len)? = b;
    *len += 1;
    Some(())
}

/// Rewrites `input` (starting with `/`, without query) into its canonical
/// form in `out`; returns the length, or `None` if `out` is too small.
pub(crate) fn canonicalize(input: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut len = 0;
    push(out, &mut len, b'/')?;
    let mut i = 1;
    while i < input.len() {
        if input[i] == b'/' {
            i += 1;
            continue;
        }
        // Start a segment: make sure the output ends with a separator.
        if out[len - 1] != b'/' {
            push(out, &mut len, b'/')?;
        }
        let start = len;
        while i < input.len() && input[i] != b'/' {
            i += write_canonical_byte(input, i, out, &mut len)?;
        }
        match &out[start..len] {
            b"." => len = start,
            b".." => {
                len = start;
                if start > 1 {
                    // Drop the previous segment, keeping its leading slash.
                    let prev = out[..start - 1]
                        .iter()
                        .rposition(|&c| c == b'/')
                        .unwrap_or(0);
                    len = prev + 1;
                }
            }
            _ => {}
        }
    }
    if input.len() > 1 && input.last() == Some(&b'/') && out[len - 1] != b'/' {
        push(out, &mut len, b'/')?;
    }
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(p: &str) -> String {
        normalize_path(p).unwrap().into_owned()
    }

    #[test]
    fn path_policy_table() {
        let cases = [
            ("/", "/"),
            ("", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b/"),
            ("//a///b//", "/a/b/"),
            ("/a/./b", "/a/b"),
            ("/a/.", "/a/"),
            ("/a/b/..", "/a/"),
            ("/a/b/../c", "/a/c"),
            ("/../../a", "/a"),
            ("/..", "/"),
            ("/%2e%2E/admin", "/admin"),
            ("/a/%2e", "/a/"),
            ("/%61pi", "/api"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%2Fb/..", "/"),
            ("/a%3f", "/a%3F"),
            ("/100%", "/100%25"),
            ("/%zz", "/%25zz"),
            ("/a b", "/a%20b"),
            ("/caf\u{e9}", "/caf%C3%A9"),
            ("/a\\..\\b", "/a%5C..%5Cb"),
            ("/{x}", "/%7Bx%7D"),
            ("/a?b=/../c", "/a"),
            ("/a#frag", "/a"),
            ("/API", "/API"),
            ("/...", "/..."),
        ];
        for (input, want) in cases {
            assert_eq!(canon(input), want, "input {input:?}");
            assert!(
                is_canonical(want.as_bytes()),
                "{want:?} should be canonical"
            );
        }
    }

    #[test]
    fn rewriting_is_bounded_by_the_stack_buffer() {
        // Canonical already: any length is fine, no rewrite happens.
        let long = format!("/{}", "a".repeat(MAX_PATH_LEN * 2));
        assert_eq!(normalize_path(&long).as_deref(), Some(long.as_str()));
        // Needs rewriting to more than the buffer holds: not routable.
        let wide = format!("/{}", "\u{e9}".repeat(MAX_PATH_LEN / 4));
        assert_eq!(normalize_path(&wide), None);
        let mut buf = [0u8; MAX_PATH_LEN];
        assert_eq!(normalize_path_into(&wide, &mut buf), None);
        // Needs rewriting and fits (dot segments shrink it): routable.
        let dotty = format!("/a{}", "/.".repeat(MAX_PATH_LEN));
        assert_eq!(normalize_path_into(&dotty, &mut buf), Some("/a/"));
    }

    #[test]
    fn non_absolute_paths_do_not_route() {
        assert_eq!(normalize_path("*"), None);
        assert_eq!(normalize_path("http://x/a"), None);
    }

    #[test]
    fn host_policy_table() {
        let cases = [
            ("example.com", Some("example.com")),
            ("Example.COM", Some("example.com")),
            ("example.com.", Some("example.com")),
            ("example.com:8080", Some("example.com")),
            ("example.com.:8080", Some("example.com")),
            ("[::1]:8080", Some("[::1]")),
            ("[::1]", Some("[::1]")),
            ("example.com:", None),
            ("example.com:99999999", None),
            ("a:b:c", None),
            ("", None),
            (".", None),
            ("[::1", None),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_host(input).as_deref(), want, "input {input:?}");
            let mut buf = [0u8; MAX_HOST_LEN];
            assert_eq!(
                normalize_host_into(input, &mut buf),
                want,
                "input {input:?}"
            );
        }
    }

    #[test]
    fn route_host_validation() {
        assert_eq!(
            parse_route_host("Foo.Example.com"),
            Ok(RouteHost::Exact("foo.example.com".into()))
        );
        assert_eq!(
            parse_route_host("*.example.com"),
            Ok(RouteHost::Wildcard("example.com".into()))
        );
        assert_eq!(parse_route_host("*.com"), Err(InvalidHost::BadWildcard));
        assert_eq!(parse_route_host("a.*.com"), Err(InvalidHost::BadWildcard));
        assert_eq!(
            parse_route_host("foo*.example.com"),
            Err(InvalidHost::BadWildcard)
        );
        assert_eq!(parse_route_host("a..b"), Err(InvalidHost::BadLabel));
        assert_eq!(parse_route_host("a_b.com"), Err(InvalidHost::BadLabel));
        assert_eq!(parse_route_host("-a.com"), Err(InvalidHost::BadLabel));
        assert_eq!(parse_route_host("a.com:80"), Err(InvalidHost::HasPort));
        assert_eq!(parse_route_host(""), Err(InvalidHost::Empty));
    }

    #[test]
    fn route_path_validation() {
        assert_eq!(parse_route_path("/a/%7Eb"), Ok("/a/~b".into()));
        assert_eq!(parse_route_path("a"), Err(InvalidPath::NotAbsolute));
        assert_eq!(parse_route_path("/a?b"), Err(InvalidPath::QueryOrFragment));
        assert_eq!(parse_route_path("/a//b"), Err(InvalidPath::RepeatedSlash));
        assert_eq!(parse_route_path("/a/../b"), Err(InvalidPath::DotSegment));
        assert_eq!(parse_route_path("/a/%2e"), Err(InvalidPath::DotSegment));
        assert_eq!(parse_route_path("/a/."), Err(InvalidPath::DotSegment));
        assert_eq!(parse_route_path("/a%2fb"), Err(InvalidPath::EncodedSlash));
        assert_eq!(parse_route_path("/..."), Ok("/...".into()));
    }
}
