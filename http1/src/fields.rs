//! Header-field rules: values, lists, hosts, and which fields stay on one hop.

/// Connection-scoped fields (RFC 9110 §7.6.1) and their customary company.
/// Besides these, every field that `Connection` names is hop-by-hop.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Fields through which a client claims an address, a scheme, a host or a
/// request identity on behalf of earlier hops. Only a trusted hop may set
/// them; a trust boundary removes what anyone else sent.
pub const FORWARDING: [&str; 6] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
    "x-real-ip",
    "x-request-id",
];

/// Whether `name` is one of [`FORWARDING`].
pub fn is_forwarding(name: &str) -> bool {
    FORWARDING.iter().any(|f| name.eq_ignore_ascii_case(f))
}

/// Whether a method is idempotent (RFC 9110 §9.2.2): a request with it may
/// be sent again when a connection fails before any response byte.
pub fn is_idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "TRACE"
    )
}

/// Fields a `Connection` header may not name: dropping them at one hop
/// would change the framing or the target of the message for the next.
const NOT_NAMEABLE: [&str; 3] = ["host", "content-length", "transfer-encoding"];

pub(crate) fn is_not_nameable(token: &[u8]) -> bool {
    NOT_NAMEABLE
        .iter()
        .any(|n| token.eq_ignore_ascii_case(n.as_bytes()))
}

/// The comma-separated tokens of a header value, trimmed, empty ones
/// skipped (RFC 9110 §5.6.1).
pub fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|b| *b == b',').map(trim).filter(|t| !t.is_empty())
}

pub(crate) fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Parses a `Content-Length` value: plain decimal digits, surrounding
/// whitespace allowed; no sign, no list (`5, 5`), no overflow.
///
/// ```
/// use tuna_http1::parse_content_length;
/// assert_eq!(parse_content_length(b" 42 "), Some(42));
/// assert_eq!(parse_content_length(b"5, 5"), None);
/// assert_eq!(parse_content_length(b"+5"), None);
/// ```
pub fn parse_content_length(v: &[u8]) -> Option<u64> {
    let v = trim(v);
    if v.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for d in v {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(n)
}

/// A valid `Host` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host<'b> {
    /// The whole value, trimmed (port included): what is forwarded.
    pub value: &'b str,
    /// The host alone: without port and without one trailing dot, case as
    /// sent. Compare it with `eq_ignore_ascii_case`.
    pub name: &'b str,
}

impl Host<'_> {
    /// Whether this names `host` (a lower-case or mixed-case DNS name).
    pub fn is(&self, host: &str) -> bool {
        self.name
            .eq_ignore_ascii_case(host.strip_suffix('.').unwrap_or(host))
    }
}

/// Longest host name (RFC 1035 presentation form without the final dot).
const MAX_HOST_NAME: usize = 253;

/// Parses a `Host` value (or the authority of an absolute-form target):
/// a DNS name of `[A-Za-z0-9._-]` or a bracketed IP literal, optionally
/// `:port` (1–5 digits, at most 65535); DNS labels of 1–63 characters
/// (one trailing dot allowed). Userinfo (`user@host`), empty values, empty
/// labels and any other character are refused.
///
/// ```
/// use tuna_http1::parse_host;
/// let h = parse_host(b"App.Example.:8080").unwrap();
/// assert_eq!((h.value, h.name), ("App.Example.:8080", "App.Example"));
/// assert!(parse_host(b"hidden.example@pub.example").is_none());
/// assert_eq!(parse_host(b"[::1]:80").unwrap().name, "[::1]");
/// ```
pub fn parse_host(value: &[u8]) -> Option<Host<'_>> {
    let value = trim(value);
    let (name, port) = if value.first() == Some(&b'[') {
        let close = value.iter().position(|b| *b == b']')?;
        let inside = &value[1..close];
        if inside.is_empty()
            || !inside
                .iter()
                .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
        {
            return None;
        }
        (&value[..=close], &value[close + 1..])
    } else {
        match value.iter().position(|b| *b == b':') {
            Some(colon) => (&value[..colon], &value[colon..]),
            None => (value, &value[value.len()..]),
        }
    };
    if !port.is_empty() {
        let digits = port.strip_prefix(b":")?;
        if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        if parse_content_length(digits)? > 65535 {
            return None;
        }
    }
    let name = if name.first() == Some(&b'[') {
        name
    } else {
        let name = name.strip_suffix(b".").unwrap_or(name);
        if !name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        {
            return None;
        }
        // Labels of 1–63 characters: `a..b` or `app..` name nothing, and
        // two hops must not disagree about which trailing dot is the one.
        if !name
            .split(|b| *b == b'.')
            .all(|l| (1..=63).contains(&l.len()))
        {
            return None;
        }
        name
    };
    if name.is_empty() || name.len() > MAX_HOST_NAME {
        return None;
    }
    // Only ASCII got this far.
    Some(Host {
        value: std::str::from_utf8(value).ok()?,
        name: std::str::from_utf8(name).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_table() {
        let ok: &[(&str, &str)] = &[
            ("a.example", "a.example"),
            (" A.Example.:8080\t", "A.Example"),
            ("a_b-c.example", "a_b-c.example"),
            ("127.0.0.1:1", "127.0.0.1"),
            ("[::1]", "[::1]"),
            ("[2001:db8::1]:65535", "[2001:db8::1]"),
        ];
        for (value, name) in ok {
            assert_eq!(
                parse_host(value.as_bytes()).map(|h| h.name),
                Some(*name),
                "{value:?}"
            );
        }
        let bad = [
            "",
            ".",
            "user@a.example",
            "a.example@b.example",
            "a.example:",
            "a.example:65536",
            "a.example:123456",
            "a.example:http",
            "a.example:80:80",
            "a b",
            "a/b",
            "a%2eb",
            "[]",
            "[::1",
            "[::1]x",
            "[zz::1]",
            "a\u{e9}.example",
            // empty or long labels (found by fuzzing: `app..` compared
            // unequal to itself once one trailing dot was stripped)
            "a..b",
            ".a",
            "a..",
            "app.....",
            "a.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.c",
        ];
        for value in bad {
            assert_eq!(parse_host(value.as_bytes()), None, "{value:?}");
        }
        let long = "a".repeat(254);
        assert_eq!(parse_host(long.as_bytes()), None);
        assert!(parse_host(b"A.Example.:80").unwrap().is("a.example"));
        assert!(!parse_host(b"a.example").unwrap().is("b.example"));
    }

    #[test]
    fn content_lengths_table() {
        let cases: &[(&[u8], Option<u64>)] = &[
            (b"0", Some(0)),
            (b" 12 ", Some(12)),
            (b"18446744073709551615", Some(u64::MAX)),
            (b"18446744073709551616", None),
            (b"", None),
            (b" ", None),
            (b"+1", None),
            (b"-1", None),
            (b"1 2", None),
            (b"0x10", None),
            (b"5, 5", None),
            (b"5,", None),
        ];
        for (v, want) in cases {
            assert_eq!(
                parse_content_length(v),
                *want,
                "{:?}",
                String::from_utf8_lossy(v)
            );
        }
    }
}
