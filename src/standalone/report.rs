//! The table printed on start and on every change: what is published (public URL
//! or TCP address → upstream) and what is skipped, with the reason.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;

use super::desired::DesiredState;

/// How public addresses look, known only once listeners are bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicAddresses {
    /// `http://` URL prefix format: the port of the public HTTP listener (omitted
    /// when 80).
    pub http_port: Option<u16>,
    /// Tunnel `namespace/name` → public TCP address.
    pub tcp: BTreeMap<String, SocketAddr>,
}

impl PublicAddresses {
    /// The public URL of `host` + `path`.
    pub fn http_url(&self, host: &str, path: &str) -> String {
        match self.http_port {
            Some(80) | None => format!("http://{host}{path}"),
            Some(port) => format!("http://{host}:{port}{path}"),
        }
    }
}

fn table(out: &mut String, header: [&str; 3], rows: &[[String; 3]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: [&str; 3]| {
        let _ = writeln!(
            out,
            "  {:w0$}  {:w1$}  {}",
            cells[0],
            cells[1],
            cells[2],
            w0 = widths[0],
            w1 = widths[1]
        );
    };
    line(out, header);
    for row in rows {
        line(out, [&row[0], &row[1], &row[2]]);
    }
}

/// Renders the report.
pub fn render(state: &DesiredState, addresses: &PublicAddresses) -> String {
    let mut out = String::new();
    let mut published: Vec<[String; 3]> = Vec::new();
    for (host, p) in &state.hosts {
        let mut routes: Vec<_> = p.routes.iter().collect();
        routes.sort_by(|a, b| {
            (a.path.as_str(), a.path_type.as_str()).cmp(&(b.path.as_str(), b.path_type.as_str()))
        });
        for r in routes {
            let path = if r.path_type == tuna_routing::PathType::Exact {
                format!("{} (Exact)", r.path)
            } else {
                r.path.clone()
            };
            published.push([
                addresses.http_url(host, &path),
                r.backend.to_string(),
                format!("{}/{}", r.origin.namespace, r.origin.name),
            ]);
        }
    }
    for (tunnel, t) in &state.tcp {
        let public = match addresses.tcp.get(tunnel) {
            Some(addr) => format!("tcp://{addr}"),
            None => format!("tcp ({}, not bound)", t.endpoint),
        };
        published.push([public, t.upstream.to_string(), tunnel.clone()]);
    }
    if published.is_empty() {
        out.push_str("Published: nothing\n");
    } else {
        let _ = writeln!(out, "Published ({}):", published.len());
        table(&mut out, ["PUBLIC", "UPSTREAM", "FROM"], &published);
    }
    if !state.skipped.is_empty() {
        let _ = writeln!(out, "Skipped ({}):", state.skipped.len());
        let rows: Vec<[String; 3]> = state
            .skipped
            .iter()
            .map(|s| {
                let mut what = s.object.clone();
                if let Some(source) = s.source.as_ref().map(ToString::to_string)
                    && source != what
                {
                    what = format!("{what} [{source}]");
                }
                // Parser errors carry a multi-line snippet; the first line says it.
                let message = s.message.lines().next().unwrap_or_default().to_owned();
                [what, s.reason.clone(), message]
            })
            .collect();
        table(&mut out, ["OBJECT", "REASON", "MESSAGE"], &rows);
    }
    out
}
