//! A deliberately naive reference router: linear scans over every spec,
//! string operations, allocations everywhere. It restates the crate-doc rules
//! as directly as possible so the compiled table can be checked against it.

#![allow(dead_code)]

use std::cmp::Reverse;

use tuna_routing::{Matcher, PathType, RouteSpec};

pub fn naive_host(raw: &str) -> Option<String> {
    let without_port = if raw.starts_with('[') {
        let end = raw.find(']')?;
        let rest = &raw[end + 1..];
        if !(rest.is_empty()
            || (rest.len() > 1
                && rest.len() <= 6
                && rest[1..].chars().all(|c| c.is_ascii_digit())
                && rest.starts_with(':')))
        {
            return None;
        }
        raw[..=end].to_string()
    } else {
        let parts: Vec<&str> = raw.split(':').collect();
        match parts.as_slice() {
            [h] => h.to_string(),
            [h, port]
                if !port.is_empty()
                    && port.len() <= 5
                    && port.chars().all(|c| c.is_ascii_digit()) =>
            {
                h.to_string()
            }
            _ => return None,
        }
    };
    let host = without_port
        .strip_suffix('.')
        .unwrap_or(&without_port)
        .to_lowercase();
    if host.is_empty() || host.len() > 253 {
        None
    } else {
        Some(host)
    }
}

fn unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-._~".contains(&c)
}

fn canon_segment(seg: &str) -> String {
    let b = seg.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && b[i + 1].is_ascii_hexdigit()
            && b[i + 2].is_ascii_hexdigit()
        {
            let v = u8::from_str_radix(&seg[i + 1..i + 3], 16).unwrap();
            if unreserved(v) {
                out.push(v as char);
            } else {
                out.push_str(&format!("%{v:02X}"));
            }
            i += 3;
        } else if b[i] == b'%' {
            out.push_str("%25");
            i += 1;
        } else if unreserved(b[i]) || b"!$&'()*+,;=:@".contains(&b[i]) {
            out.push(b[i] as char);
            i += 1;
        } else {
            out.push_str(&format!("%{:02X}", b[i]));
            i += 1;
        }
    }
    out
}

/// The canonical path, or None when it cannot be routed. Only for paths
/// short enough that no length limit applies.
pub fn naive_path(raw: &str) -> Option<String> {
    let path = raw.split(['?', '#']).next().unwrap();
    if path.is_empty() {
        return Some("/".into());
    }
    if !path.starts_with('/') {
        return None;
    }
    let raw_segments: Vec<String> = path[1..].split('/').map(canon_segment).collect();
    let mut stack: Vec<&str> = Vec::new();
    for seg in &raw_segments {
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                stack.pop();
            }
            s => stack.push(s),
        }
    }
    let trailing = matches!(
        raw_segments.last().map(String::as_str),
        Some("" | "." | "..")
    );
    if stack.is_empty() {
        return Some("/".into());
    }
    let mut out = format!("/{}", stack.join("/"));
    if trailing {
        out.push('/');
    }
    Some(out)
}

/// Host pattern of a spec: (is_wildcard, lower-case name or suffix).
fn spec_host(spec: &RouteSpec<u32>) -> (bool, String) {
    let h = spec.host.trim_end_matches('.').to_lowercase();
    match h.strip_prefix("*.") {
        Some(s) => (true, s.to_string()),
        None => (false, h),
    }
}

fn key(spec: &RouteSpec<u32>) -> String {
    let p = canon_path_of_route(&spec.path);
    if spec.path_type == PathType::Exact {
        p
    } else {
        p.trim_end_matches('/').to_string()
    }
}

fn canon_path_of_route(p: &str) -> String {
    naive_path(p).unwrap()
}

fn matches(spec: &RouteSpec<u32>, request: &str) -> bool {
    let k = key(spec);
    if spec.path_type == PathType::Exact {
        k == request
    } else {
        // Compare segment lists: the route's segments must be a prefix.
        let route_segs: Vec<&str> = k.split('/').filter(|s| !s.is_empty()).collect();
        let req_segs: Vec<&str> = request.split('/').filter(|s| !s.is_empty()).collect();
        req_segs.len() >= route_segs.len() && route_segs.iter().zip(&req_segs).all(|(a, b)| a == b)
    }
}

/// The index of the spec that should serve the request. Specs must be valid.
pub fn naive_lookup(specs: &[RouteSpec<u32>], host: &str, path: &str) -> Option<usize> {
    naive_lookup_request(specs, host, path, "GET", &[])
}

/// The specs of the host pattern a request host selects: its exact host
/// if any spec names it, else the one-label wildcard over it.
fn host_pool(specs: &[RouteSpec<u32>], host: &str) -> Vec<usize> {
    let exact: Vec<usize> = (0..specs.len())
        .filter(|&i| spec_host(&specs[i]) == (false, host.to_string()))
        .collect();
    if !exact.is_empty() {
        return exact;
    }
    (0..specs.len())
        .filter(|&i| {
            let (wild, suffix) = spec_host(&specs[i]);
            wild && host
                .split_once('.')
                .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix)
        })
        .collect()
}

/// [`naive_lookup`] with a method, headers (in request order) and the
/// query of `target`. Specs must be valid.
pub fn naive_lookup_request(
    specs: &[RouteSpec<u32>],
    host: &str,
    target: &str,
    method: &str,
    headers: &[(String, String)],
) -> Option<usize> {
    let host = naive_host(host)?;
    let path = naive_path(target)?;
    let pool = host_pool(specs, &host);
    if pool.iter().any(|&i| is_gateway(&specs[i])) {
        let query = target
            .split('#')
            .next()
            .unwrap()
            .split_once('?')
            .map_or("", |(_, q)| q);
        return pool
            .into_iter()
            .filter(|&i| !naive_is_conflict_loser(specs, i))
            .filter(|&i| matches(&specs[i], &path))
            .filter(|&i| conditions_hold(&specs[i], method, headers, query))
            .min_by_key(|&i| gateway_order(specs, i));
    }
    pool.into_iter()
        .filter(|&i| !naive_is_conflict_loser(specs, i))
        .filter(|&i| matches(&specs[i], &path))
        .max_by_key(|&i| (key(&specs[i]).len(), specs[i].path_type == PathType::Exact))
}

fn is_gateway(spec: &RouteSpec<u32>) -> bool {
    matches!(spec.matcher, Matcher::Gateway(_))
}

/// A spec's conditions, as (hostname, method, sorted headers with lower
/// case names, sorted query); an Ingress spec has its host as hostname.
type Conds = (
    String,
    Option<String>,
    Vec<(String, String)>,
    Vec<(String, String)>,
);

fn conds(spec: &RouteSpec<u32>) -> Conds {
    match &spec.matcher {
        Matcher::Ingress => (
            spec.host.trim_end_matches('.').to_lowercase(),
            None,
            vec![],
            vec![],
        ),
        Matcher::Gateway(m) => {
            let mut headers: Vec<_> = m
                .headers
                .iter()
                .map(|(n, v)| (n.to_lowercase(), v.clone()))
                .collect();
            headers.sort();
            let mut query = m.query.clone();
            query.sort();
            (
                m.hostname.clone().unwrap_or_default().to_lowercase(),
                m.method.clone(),
                headers,
                query,
            )
        }
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && b[i + 1].is_ascii_hexdigit()
            && b[i + 2].is_ascii_hexdigit()
        {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn conditions_hold(
    spec: &RouteSpec<u32>,
    method: &str,
    headers: &[(String, String)],
    query: &str,
) -> bool {
    let (_, want_method, want_headers, want_query) = conds(spec);
    let params: Vec<(Vec<u8>, Vec<u8>)> = query
        .split('&')
        .map(|pair| {
            let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(n), percent_decode(v))
        })
        .collect();
    want_method.is_none_or(|m| m == method)
        && want_headers.iter().all(|(name, value)| {
            headers
                .iter()
                .find(|(n, _)| n.to_lowercase() == *name)
                .is_some_and(|(_, v)| v == value)
        })
        && want_query.iter().all(|(name, value)| {
            params
                .iter()
                .find(|(n, _)| n == name.as_bytes())
                .is_some_and(|(_, v)| v == value.as_bytes())
        })
}

/// The Gateway API precedence, written out as one key: smaller first.
#[allow(clippy::type_complexity)]
fn gateway_order(
    specs: &[RouteSpec<u32>],
    i: usize,
) -> (
    Reverse<usize>,
    Reverse<usize>,
    Reverse<bool>,
    Reverse<usize>,
    Reverse<bool>,
    Reverse<usize>,
    Reverse<usize>,
    tuna_routing::TieBreak,
    usize,
    usize,
    usize,
) {
    let spec = &specs[i];
    let (hostname, method, headers, query) = conds(spec);
    let non_wildcard = if hostname.starts_with('*') {
        0
    } else {
        hostname.len()
    };
    let exact = spec.path_type == PathType::Exact;
    (
        Reverse(non_wildcard),
        Reverse(hostname.len()),
        Reverse(exact),
        Reverse(if exact { 0 } else { key(spec).len() }),
        Reverse(method.is_some()),
        Reverse(headers.len()),
        Reverse(query.len()),
        spec.tie_break.clone(),
        spec.origin.rule,
        spec.origin.path,
        i,
    )
}

/// A spec loses when an equal rule has a smaller (tie-break, rule, path,
/// index); on a Gateway host, equal also means the same conditions and
/// hostname.
pub fn naive_is_conflict_loser(specs: &[RouteSpec<u32>], i: usize) -> bool {
    let a = &specs[i];
    let gateway_host = specs
        .iter()
        .any(|s| spec_host(s) == spec_host(a) && is_gateway(s));
    specs.iter().enumerate().any(|(j, b)| {
        j != i
            && spec_host(a) == spec_host(b)
            && (a.path_type == PathType::Exact) == (b.path_type == PathType::Exact)
            && key(a) == key(b)
            && (!gateway_host || conds(a) == conds(b))
            && (b.tie_break.clone(), b.origin.rule, b.origin.path, j)
                < (a.tie_break.clone(), a.origin.rule, a.origin.path, i)
    })
}
