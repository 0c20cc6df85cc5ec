//! The segment trie of one host pattern, how a rule's path keys it, and
//! what a build decided for each spec. Both kinds of host use it: an
//! Ingress host holds a spec index in each slot, a Gateway host the index
//! of a list of candidates (`gateway.rs`). It knows neither kind.

use std::collections::{BTreeMap, HashMap};

use crate::PathType;
use crate::normalize::{self, MAX_PATH_LEN};

/// The hash map of the lookup path (see the `foldhash` note in Cargo.toml).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Marks an empty slot in a [`Node`] (smaller than `Option<u32>`).
pub(crate) const NONE: u32 = u32::MAX;

/// Above this many children a node switches from a scan to a hash map.
const FEW_CHILDREN: usize = 8;

/// A trie node: one path segment. Kept small and index-based so that a
/// lookup touches few cache lines.
///
/// On an Ingress host the three slots hold the index of the spec that owns
/// the rule; on a Gateway host they hold the index of a list of specs (see
/// `gateway.rs`).
#[derive(Debug)]
struct Node {
    /// This node's children are `edges[first_edge..first_edge + edge_count]`
    /// when they are few.
    first_edge: u32,
    edge_count: u32,
    /// The parent node (the root is its own parent): Gateway lookups walk
    /// back up from the deepest node. Fits in the padding of `many`.
    parent: u32,
    /// `Exact` route ending here, without a trailing slash (`/a/b`).
    exact: u32,
    /// `Exact` route ending here with a trailing slash (`/a/b/`).
    exact_slash: u32,
    /// Prefix-like route covering this node and everything below.
    prefix: u32,
    /// Children by segment when there are more than [`FEW_CHILDREN`].
    many: Option<Box<FastMap<Box<str>, u32>>>,
}

/// A link to a child node, labelled by a segment stored in `labels`.
#[derive(Debug, Clone, Copy)]
struct Edge {
    /// The label's first 8 bytes, little-endian, zero-padded: most labels
    /// are decided by one integer comparison instead of a `memcmp` call.
    tag: u64,
    label_start: u32,
    label_len: u32,
    node: u32,
}

/// The first 8 bytes of a segment as an integer (see [`Edge::tag`]).
#[inline]
fn tag_of(segment: &[u8]) -> u64 {
    let mut tag = 0u64;
    for (i, &b) in segment.iter().take(8).enumerate() {
        tag |= u64::from(b) << (8 * i);
    }
    tag
}

fn slot(value: u32) -> Option<u32> {
    (value != NONE).then_some(value)
}

/// All routes of one host pattern: nodes, the edges of nodes with few
/// children, and every edge label in one string.
#[derive(Debug)]
pub(crate) struct HostRoutes {
    /// `nodes[0]` is the root (`/`).
    nodes: Box<[Node]>,
    edges: Box<[Edge]>,
    labels: Box<str>,
}

impl HostRoutes {
    #[inline]
    fn child(&self, node: &Node, segment: &str) -> Option<u32> {
        if let Some(map) = &node.many {
            return map.get(segment).copied();
        }
        let start = node.first_edge as usize;
        let edges = &self.edges[start..start + node.edge_count as usize];
        let segment = segment.as_bytes();
        let tag = tag_of(segment);
        edges
            .iter()
            .find(|e| {
                e.tag == tag
                    && e.label_len as usize == segment.len()
                    && (segment.len() <= 8
                        || self.labels.as_bytes()[e.label_start as usize + 8..]
                            [..segment.len() - 8]
                            == segment[8..])
            })
            .map(|e| e.node)
    }

    /// Returns the winning spec index for a canonical path.
    #[inline]
    fn find(&self, path: &str) -> Option<u32> {
        let mut node = &self.nodes[0];
        let mut best = node.prefix;
        let rest = &path[1..];
        if rest.is_empty() {
            return slot(node.exact).or(slot(best));
        }
        let (body, trailing) = match rest.strip_suffix('/') {
            Some(body) => (body, true),
            None => (rest, false),
        };
        // Segments are split by hand: `str::split` costs a searcher per call.
        let mut rest = body;
        loop {
            let (segment, more) = match rest.bytes().position(|b| b == b'/') {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            match self.child(node, segment) {
                Some(i) => {
                    node = &self.nodes[i as usize];
                    if node.prefix != NONE {
                        best = node.prefix;
                    }
                }
                // No exact route can lie below a missing child.
                None => return slot(best),
            }
            match more {
                Some(next) => rest = next,
                None => break,
            }
        }
        let exact = if trailing {
            node.exact_slash
        } else {
            node.exact
        };
        slot(exact).or(slot(best))
    }

    /// Walks a canonical path as deep as the trie goes: returns the deepest
    /// node reached and, if the whole path was consumed, the Exact slot
    /// that matches it (else [`NONE`]).
    #[inline]
    pub(crate) fn walk(&self, path: &str) -> (u32, u32) {
        let rest = &path[1..];
        if rest.is_empty() {
            return (0, self.nodes[0].exact);
        }
        let (body, trailing) = match rest.strip_suffix('/') {
            Some(body) => (body, true),
            None => (rest, false),
        };
        let mut at = 0u32;
        let mut rest = body;
        loop {
            let (segment, more) = match rest.bytes().position(|b| b == b'/') {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            match self.child(&self.nodes[at as usize], segment) {
                Some(i) => at = i,
                None => return (at, NONE),
            }
            match more {
                Some(next) => rest = next,
                None => break,
            }
        }
        let node = &self.nodes[at as usize];
        (
            at,
            if trailing {
                node.exact_slash
            } else {
                node.exact
            },
        )
    }

    /// The Prefix slots of `node` and of every ancestor, deepest first, the
    /// empty ones skipped.
    #[inline]
    pub(crate) fn prefixes_up(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let mut next = Some(node);
        std::iter::from_fn(move || {
            loop {
                let here = next?;
                let node = &self.nodes[here as usize];
                next = (here != 0).then_some(node.parent);
                if node.prefix != NONE {
                    return Some(node.prefix);
                }
            }
        })
    }
}

/// A trie node while the table is being built.
#[derive(Default)]
struct BuildNode {
    parent: u32,
    children: BTreeMap<Box<str>, u32>,
    exact: Option<u32>,
    exact_slash: Option<u32>,
    prefix: Option<u32>,
}

pub(crate) struct BuildHost {
    nodes: Vec<BuildNode>,
}

impl Default for BuildHost {
    /// A host starts with its root node.
    fn default() -> Self {
        Self {
            nodes: vec![BuildNode::default()],
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Slot {
    Exact,
    ExactSlash,
    Prefix,
}

impl BuildHost {
    /// Returns the node for the segments of `body` (no leading slash),
    /// creating it as needed.
    pub(crate) fn node_for(&mut self, body: &str) -> usize {
        let mut at = 0usize;
        if body.is_empty() {
            return at;
        }
        for segment in body.split('/') {
            at = match self.nodes[at].children.get(segment) {
                Some(&i) => i as usize,
                None => {
                    let i = self.nodes.len();
                    self.nodes.push(BuildNode {
                        parent: at as u32,
                        ..BuildNode::default()
                    });
                    self.nodes[at].children.insert(segment.into(), i as u32);
                    i
                }
            };
        }
        at
    }

    pub(crate) fn slot(&mut self, node: usize, slot: Slot) -> &mut Option<u32> {
        let n = &mut self.nodes[node];
        match slot {
            Slot::Exact => &mut n.exact,
            Slot::ExactSlash => &mut n.exact_slash,
            Slot::Prefix => &mut n.prefix,
        }
    }

    pub(crate) fn freeze(self) -> HostRoutes {
        let mut nodes = Vec::with_capacity(self.nodes.len());
        let mut edges = Vec::new();
        let mut labels = String::new();
        for n in self.nodes {
            let mut node = Node {
                first_edge: edges.len() as u32,
                edge_count: 0,
                parent: n.parent,
                exact: n.exact.unwrap_or(NONE),
                exact_slash: n.exact_slash.unwrap_or(NONE),
                prefix: n.prefix.unwrap_or(NONE),
                many: None,
            };
            if n.children.len() <= FEW_CHILDREN {
                node.edge_count = n.children.len() as u32;
                for (label, child) in n.children {
                    edges.push(Edge {
                        tag: tag_of(label.as_bytes()),
                        label_start: labels.len() as u32,
                        label_len: label.len() as u32,
                        node: child,
                    });
                    labels.push_str(&label);
                }
            } else {
                node.many = Some(Box::new(n.children.into_iter().collect()));
            }
            nodes.push(node);
        }
        HostRoutes {
            nodes: nodes.into(),
            edges: edges.into(),
            labels: labels.into(),
        }
    }
}

/// What the build decided for one spec of a host, kept for `explain`.
#[derive(Debug, Clone)]
pub(crate) enum SpecState {
    /// Routed (it may still lose to longer or Exact routes, or routes of
    /// higher precedence, at lookup), with its canonical path.
    Active { path: String },
    /// Not routed: its path is invalid.
    InvalidPath,
    /// Not routed: an equal rule (spec `winner` of the same host) won the
    /// tie-break.
    Conflict { path: String, winner: usize },
}

/// Canonicalises the path (on the stack, only when needed) and walks the trie.
#[inline]
pub(crate) fn find_path(routes: &HostRoutes, raw: &str) -> Option<u32> {
    match normalize::canonical_path_end(raw.as_bytes()) {
        Some(end) => routes.find(&raw[..end]),
        None => find_path_slow(routes, raw),
    }
}

/// Calls `f` with the canonical form of a raw request target's path,
/// rewritten on the stack only when needed.
#[inline]
pub(crate) fn with_canonical_path<R>(raw: &str, f: impl FnOnce(&str) -> Option<R>) -> Option<R> {
    match normalize::canonical_path_end(raw.as_bytes()) {
        Some(end) => f(&raw[..end]),
        None => with_rewritten_path(raw, f),
    }
}

#[cold]
fn with_rewritten_path<R>(raw: &str, f: impl FnOnce(&str) -> Option<R>) -> Option<R> {
    let mut buf = [0u8; MAX_PATH_LEN];
    f(normalize::normalize_path_into(raw, &mut buf)?)
}

#[cold]
fn find_path_slow(routes: &HostRoutes, path: &str) -> Option<u32> {
    let mut buf = [0u8; MAX_PATH_LEN];
    let path = normalize::normalize_path_into(path, &mut buf)?;
    routes.find(path)
}

/// The trie key and slot of a rule: Prefix drops its trailing slash.
pub(crate) fn rule_key(path: &str, path_type: PathType) -> (&str, Slot) {
    if path_type.is_prefix() {
        (path.trim_end_matches('/'), Slot::Prefix)
    } else if path.len() > 1 && path.ends_with('/') {
        (path, Slot::ExactSlash)
    } else {
        (path, Slot::Exact)
    }
}
