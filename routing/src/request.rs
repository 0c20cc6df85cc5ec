//! What a Gateway API match needs of a request besides host and path, and
//! the conditions it is checked against. Lookup and explain share these
//! functions, so an explanation cannot judge a condition differently from
//! routing. Nothing here allocates.

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

impl Conditions {
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
    #[inline]
    pub(crate) fn check(
        &self,
        query: &str,
        request: &impl RequestView,
    ) -> Result<(), Mismatch<'_>> {
        check(
            self.method.as_deref().map(str::as_bytes),
            self.headers.iter().map(|(n, v)| (&**n, v.as_bytes())),
            self.query.iter().map(|(n, v)| (&**n, v.as_bytes())),
            query,
            request,
        )
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

/// Checks a match's conditions against a request: the method, then the
/// headers (names lower case), then the query parameters, in that order.
/// The one judge of conditions: [`Conditions::check`] and the compiled
/// candidates of a Gateway host (`gateway.rs`) both call it.
#[inline]
pub(crate) fn check<'a>(
    method: Option<&[u8]>,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    query_pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    query: &str,
    request: &impl RequestView,
) -> Result<(), Mismatch<'a>> {
    if let Some(method) = method
        && request.method().as_bytes() != method
    {
        return Err(Mismatch::Method);
    }
    for (name, value) in headers {
        if request.header(name).map(str::as_bytes) != Some(value) {
            return Err(Mismatch::Header(name));
        }
    }
    for (name, value) in query_pairs {
        if !query_param(query, name.as_bytes()).is_some_and(|raw| decoded_eq(raw, value)) {
            return Err(Mismatch::Query(name));
        }
    }
    Ok(())
}

/// The query of a request target: after the first `?`, up to a `#`; empty
/// when there is none.
#[inline]
pub(crate) fn query_of(path_and_query: &str) -> &str {
    match path_and_query.find(['?', '#']) {
        Some(i) if path_and_query.as_bytes()[i] == b'?' => {
            let rest = &path_and_query[i + 1..];
            rest.find('#').map_or(rest, |end| &rest[..end])
        }
        _ => "",
    }
}

/// The raw (still encoded) value of the first parameter whose decoded name
/// is `name`; a parameter without `=` has the empty value.
fn query_param<'q>(query: &'q str, name: &[u8]) -> Option<&'q str> {
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(n, _)| decoded_eq(n, name))
        .map(|(_, v)| v)
}

/// Whether `raw`, percent-decoded, is `want`. A `%` that starts no valid
/// escape stands for itself; `+` is not a space (that is HTML forms, not
/// URIs).
fn decoded_eq(raw: &str, want: &[u8]) -> bool {
    let raw = raw.as_bytes();
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
