//! What a Gateway API match needs of a request besides host and path, and
//! the conditions it is checked against. Lookup and explain share these
//! functions, so an explanation cannot judge a condition differently from
//! routing. Nothing here allocates.

use std::cell::Cell;

/// What a lookup needs of a request besides host and path.
///
/// The proxy implements it over its own request type; the routing crate
/// never sees HTTP types.
pub trait RequestView {
    /// The request method, as sent (methods are case-sensitive).
    fn method(&self) -> &str;
    /// The first value of a header; `name` is lower case.
    fn header(&self, name: &str) -> Option<&str>;
}

/// A request given by its method and headers, for tests, tools and
/// [`crate::RouteTable::explain_request`].
///
/// ```
/// use tuna_routing::{RequestView, SimpleRequest};
///
/// let request = SimpleRequest::new("POST").with_header("X-Version", "2").with_header("x-version", "3");
/// assert_eq!(request.method(), "POST");
/// assert_eq!(request.header("x-version"), Some("2")); // the first value
/// assert_eq!(SimpleRequest::get().header("x-version"), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SimpleRequest {
    /// The method, e.g. `GET`.
    pub method: String,
    /// Headers in request order; names in any case.
    pub headers: Vec<(String, String)>,
}

impl SimpleRequest {
    /// A request with this method and no headers.
    pub fn new(method: impl Into<String>) -> Self {
        Self {
            method: method.into(),
            headers: Vec::new(),
        }
    }

    /// A `GET` without headers: what [`crate::RouteTable::lookup`] assumes.
    pub fn get() -> Self {
        Self::new("GET")
    }

    /// The same request with one more header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

impl RequestView for SimpleRequest {
    fn method(&self) -> &str {
        &self.method
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The request [`crate::RouteTable::lookup`] stands for on a Gateway host.
pub(crate) struct PlainGet;

impl RequestView for PlainGet {
    fn method(&self) -> &str {
        "GET"
    }

    fn header(&self, _: &str) -> Option<&str> {
        None
    }
}

/// A spec's conditions in the form lookups check them: header names lower
/// case. An Ingress spec on a Gateway host has none.
#[derive(Debug, Default)]
pub(crate) struct Conditions {
    pub(crate) method: Option<Box<str>>,
    pub(crate) headers: Box<[(Box<str>, Box<str>)]>,
    pub(crate) query: Box<[(Box<str>, Box<str>)]>,
}

/// [`Conditions::key`]: equal keys, equal conditions.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConditionsKey<'a> {
    method: Option<&'a str>,
    headers: Vec<(&'a str, &'a str)>,
    query: Vec<(&'a str, &'a str)>,
}

/// The first condition a request fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mismatch<'a> {
    Method,
    Header(&'a str),
    Query(&'a str),
}

/// A method as one small number, so that a condition compares numbers, not
/// text: the methods the Gateway API names (`HTTPMethod`) have codes 1–9;
/// any other method is [`OTHER_METHOD`] and compared as text.
#[inline]
pub(crate) fn method_code(method: &[u8]) -> u32 {
    match method {
        b"GET" => 1,
        b"HEAD" => 2,
        b"POST" => 3,
        b"PUT" => 4,
        b"DELETE" => 5,
        b"CONNECT" => 6,
        b"OPTIONS" => 7,
        b"TRACE" => 8,
        b"PATCH" => 9,
        _ => OTHER_METHOD,
    }
}

/// [`method_code`] of a method the Gateway API does not name.
pub(crate) const OTHER_METHOD: u32 = 0;

/// What conditions read of one request, each part found at most once per
/// lookup however many candidates ask: the method's code, and the query,
/// which the path's canonical form already located (a lookup never
/// searches the target for it again).
pub(crate) struct Seen<'r, R: ?Sized> {
    request: &'r R,
    /// The target from the end of its path: empty, or `?…` / `#…`.
    after_path: &'r str,
    /// [`method_code`] of the request's method, once read.
    method: Cell<Option<u32>>,
}

impl<'r, R: RequestView + ?Sized> Seen<'r, R> {
    /// `after_path`: what follows the path in the request target (see
    /// [`split_target`]).
    #[inline]
    pub(crate) fn new(request: &'r R, after_path: &'r str) -> Self {
        Self {
            request,
            after_path,
            method: Cell::new(None),
        }
    }

    #[inline]
    fn method_is(&self, code: u32, text: &[u8]) -> bool {
        let seen = match self.method.get() {
            Some(seen) => seen,
            None => {
                let seen = method_code(self.request.method().as_bytes());
                self.method.set(Some(seen));
                seen
            }
        };
        seen == code && (code != OTHER_METHOD || same(self.request.method().as_bytes(), text))
    }

    /// The query: after `?`, running on into the fragment if there is one
    /// ([`query_param`] stops at its `#`).
    #[inline]
    fn query(&self) -> &'r str {
        self.after_path.strip_prefix('?').unwrap_or("")
    }
}

impl Conditions {
    /// No method, header or query condition: every request matches.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.method.is_none() && self.headers.is_empty() && self.query.is_empty()
    }

    pub(crate) fn from_match(m: &crate::spec::GatewayMatch) -> Self {
        Self {
            method: m.method.as_deref().map(Into::into),
            headers: m
                .headers
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase().into(), v.as_str().into()))
                .collect(),
            query: m
                .query
                .iter()
                .map(|(n, v)| (n.as_str().into(), v.as_str().into()))
                .collect(),
        }
    }

    /// Checks method, then headers, then query parameters, in that order.
    pub(crate) fn check(
        &self,
        target: &str,
        request: &impl RequestView,
    ) -> Result<(), Mismatch<'_>> {
        check(self, &Seen::new(request, split_target(target).1))
    }

    /// The equality that makes two specs the same rule (conflict), as a
    /// hashable key: equal keys, equal conditions (the method, and the
    /// header and query pairs as sets).
    pub(crate) fn key(&self) -> ConditionsKey<'_> {
        fn set(pairs: &[(Box<str>, Box<str>)]) -> Vec<(&str, &str)> {
            let mut out: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (&**n, &**v)).collect();
            out.sort_unstable();
            out.dedup();
            out
        }
        ConditionsKey {
            method: self.method.as_deref(),
            headers: set(&self.headers),
            query: set(&self.query),
        }
    }
}

/// A match's conditions as the judge ([`check`]) reads them: the
/// readable form of a spec ([`Conditions`]) and a Gateway host's compiled
/// records (`gateway.rs`) both are one.
pub(crate) trait ConditionSet<'a> {
    /// The method's [`method_code`] and text; `None`: any method.
    fn method(&self) -> Option<(u32, &'a [u8])>;
    /// How many header pairs, then query pairs.
    fn counts(&self) -> (usize, usize);
    /// Header pair `i` (name lower case, value).
    fn header(&self, i: usize) -> (&'a str, &'a [u8]);
    /// Query pair `i` (name, value).
    fn query(&self, i: usize) -> (&'a str, &'a [u8]);
}

impl<'a> ConditionSet<'a> for &'a Conditions {
    fn method(&self) -> Option<(u32, &'a [u8])> {
        self.method
            .as_deref()
            .map(|m| (method_code(m.as_bytes()), m.as_bytes()))
    }
    fn counts(&self) -> (usize, usize) {
        (self.headers.len(), self.query.len())
    }
    fn header(&self, i: usize) -> (&'a str, &'a [u8]) {
        let (n, v) = &self.headers[i];
        (n, v.as_bytes())
    }
    fn query(&self, i: usize) -> (&'a str, &'a [u8]) {
        let (n, v) = &self.query[i];
        (n, v.as_bytes())
    }
}

/// Checks a match's conditions against a request: the method (its
/// [`method_code`] and text), then the headers (names lower case), then the
/// query parameters, in that order. The one judge of conditions:
/// [`Conditions::check`] and the compiled candidates of a Gateway host
/// (`gateway.rs`) both call it.
#[inline]
pub(crate) fn check<'a, R: RequestView + ?Sized>(
    conditions: impl ConditionSet<'a>,
    seen: &Seen<'_, R>,
) -> Result<(), Mismatch<'a>> {
    if let Some((code, text)) = conditions.method()
        && !seen.method_is(code, text)
    {
        return Err(Mismatch::Method);
    }
    let (headers, queries) = conditions.counts();
    for i in 0..headers {
        let (name, value) = conditions.header(i);
        if !seen
            .request
            .header(name)
            .is_some_and(|found| same(found.as_bytes(), value))
        {
            return Err(Mismatch::Header(name));
        }
    }
    if queries > 0 {
        let query = seen.query();
        for i in 0..queries {
            let (name, value) = conditions.query(i);
            if !query_param(query, name.as_bytes()).is_some_and(|raw| decoded_eq(raw, value)) {
                return Err(Mismatch::Query(name));
            }
        }
    }
    Ok(())
}

/// A raw request target split where its path ends: the path, and what
/// follows it (empty, or starting with `?` or `#`).
#[inline]
pub(crate) fn split_target(target: &str) -> (&str, &str) {
    match target.bytes().position(|b| b == b'?' || b == b'#') {
        Some(i) => target.split_at(i),
        None => (target, ""),
    }
}

/// The query of a request target: after the first `?`, up to a `#`; empty
/// when there is none.
#[cfg(test)]
fn query_of(path_and_query: &str) -> &str {
    let query = Seen::new(&PlainGet, split_target(path_and_query).1).query();
    query.split('#').next().unwrap_or_default()
}

/// The raw (still encoded) value of the first parameter whose decoded name
/// is `name`; a parameter without `=` has the empty value. `query` may run
/// on into the fragment: a `#` ends it. One pass over the bytes.
#[inline]
fn query_param<'q>(query: &'q str, name: &[u8]) -> Option<&'q str> {
    let bytes = query.as_bytes();
    let (mut start, mut equals) = (0, None);
    for i in 0..=bytes.len() {
        match bytes.get(i) {
            Some(b'=') if equals.is_none() => equals = Some(i),
            Some(b'&' | b'#') | None => {
                let (name_end, value_start) = equals.map_or((i, i), |e| (e, e + 1));
                if decoded_eq(&bytes[start..name_end], name) {
                    // `=`, `&` and `#` are ASCII: the range lies on
                    // character boundaries.
                    return Some(&query[value_start..i]);
                }
                if bytes.get(i) != Some(&b'&') {
                    return None;
                }
                (start, equals) = (i + 1, None);
            }
            Some(_) => {}
        }
    }
    None
}

/// Whether `raw`, percent-decoded, is `want`. A `%` that starts no valid
/// escape stands for itself; `+` is not a space (that is HTML forms, not
/// URIs).
#[inline]
fn decoded_eq(raw: impl AsRef<[u8]>, want: &[u8]) -> bool {
    let raw = raw.as_ref();
    // Decoding shortens a text to no less than a third.
    if want.len() > raw.len() || want.len() * 3 < raw.len() {
        return false;
    }
    let (mut i, mut j) = (0, 0);
    while i < raw.len() {
        let byte = match (raw[i], raw.get(i + 1), raw.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                i += 3;
                hex(h) * 16 + hex(l)
            }
            (b, _, _) => {
                i += 1;
                b
            }
        };
        if want.get(j) != Some(&byte) {
            return false;
        }
        j += 1;
    }
    j == want.len()
}

/// Byte equality of the short texts conditions hold, compared in line: a
/// `memcmp` call costs more than the few bytes it compares.
#[inline]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

fn hex(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_of_a_target() {
        let cases = [
            ("/a?x=1", "x=1"),
            ("/a?x=1#f", "x=1"),
            ("/a#f?x=1", ""),
            ("/a", ""),
            ("/a?", ""),
            ("?x", "x"),
        ];
        for (target, want) in cases {
            assert_eq!(query_of(target), want, "{target:?}");
        }
    }

    #[test]
    fn query_params_are_decoded_and_first_wins() {
        let cases = [
            ("animal=whale", "animal", Some("whale")),
            ("a%6Eimal=wh%61le", "animal", Some("wh%61le")),
            ("animal=one&animal=two", "animal", Some("one")),
            ("animals=x&animal", "animal", Some("")),
            ("ANIMAL=x", "animal", None),
            ("", "animal", None),
            // A `#` ends the query: the fragment is no parameter.
            ("animal=x#frag", "animal", Some("x")),
            ("a=1#animal=x", "animal", None),
            ("x=1&&animal=2&", "animal", Some("2")),
            ("x=a=b&animal", "x", Some("a=b")),
        ];
        for (query, name, want) in cases {
            assert_eq!(
                query_param(query, name.as_bytes()),
                want,
                "{query:?} {name:?}"
            );
        }
        assert!(decoded_eq("wh%61le", b"whale"));
        assert!(decoded_eq("a%20b", b"a b"));
        assert!(!decoded_eq("a+b", b"a b"));
        assert!(decoded_eq("100%", b"100%"));
        assert!(decoded_eq("%zz", "%zz".as_bytes()));
        assert!(decoded_eq("%C3%A9", "é".as_bytes()));
        assert!(!decoded_eq("whal", "whale".as_bytes()));
        assert!(!decoded_eq("whalee", "whale".as_bytes()));
    }
}
