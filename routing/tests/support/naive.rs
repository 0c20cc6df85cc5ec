//! A deliberately naive reference router: linear scans over every spec,
//! string operations, allocations everywhere. It restates the crate-doc rules
//! as directly as possible so the compiled table can be checked against it.

#![allow(dead_code)]

use tuna_routing::{PathType, RouteSpec};

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
    let host = naive_host(host)?;
    let path = naive_path(path)?;
    let exact: Vec<usize> = (0..specs.len())
        .filter(|&i| spec_host(&specs[i]) == (false, host.clone()))
        .collect();
    let pool = if !exact.is_empty() {
        exact
    } else {
        (0..specs.len())
            .filter(|&i| {
                let (wild, suffix) = spec_host(&specs[i]);
                wild && host
                    .split_once('.')
                    .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix)
            })
            .collect()
    };
    let winners: Vec<usize> = pool
        .iter()
        .copied()
        .filter(|&i| !naive_is_conflict_loser(specs, i))
        .collect();
    winners
        .into_iter()
        .filter(|&i| matches(&specs[i], &path))
        .max_by_key(|&i| (key(&specs[i]).len(), specs[i].path_type == PathType::Exact))
}

/// A spec loses when an equal rule has a smaller (tie-break, rule, path, index).
pub fn naive_is_conflict_loser(specs: &[RouteSpec<u32>], i: usize) -> bool {
    let a = &specs[i];
    specs.iter().enumerate().any(|(j, b)| {
        j != i
            && spec_host(a) == spec_host(b)
            && (a.path_type == PathType::Exact) == (b.path_type == PathType::Exact)
            && key(a) == key(b)
            && (b.tie_break.clone(), b.origin.rule, b.origin.path, j)
                < (a.tie_break.clone(), a.origin.rule, a.origin.path, i)
    })
}
