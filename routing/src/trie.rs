//! The segment trie of one host pattern, how a rule's path keys it, and
//! what a build decided for each spec. Both kinds of host use it: an
//! Ingress host holds a spec index in each slot, a Gateway host the index
//! of a list of candidates (`gateway.rs`). It knows neither kind.

use std::collections::{BTreeMap, HashMap};

use crate::normalize::{self, MAX_PATH_LEN};
use crate::request::split_target;
use crate::spec::PathType;

/// The hash map of the lookup path (see the `foldhash` note in Cargo.toml).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Marks an empty slot in a [`Node`] (smaller than `Option<u32>`).
pub(crate) const NONE: u32 = u32::MAX;

/// Above this many children a node switches from a scan to a hash map.
const FEW_CHILDREN: usize = 8;

/// A frozen trie lives in one array of words ([`HostRoutes::words`]), so
/// that a lookup reads one allocation (on a Gateway host, the candidate
/// lists sit in front of the trie, in the same array): at 10 000 hosts the
/// cost of a lookup is mostly the pages it touches, not its instructions.
///
/// A node is [`NODE_WORDS`] words at a word offset, which is its id:
/// the offset of its first edge and its edge count (when it has few
/// children), its parent (the root is its own parent: Gateway lookups walk
/// back up from the deepest node), its three slots — `Exact` without a
/// trailing slash (`/a/b`), `Exact` with one (`/a/b/`), Prefix-like
/// covering the node and everything below, [`NONE`] when empty — and the
/// index of its child map in [`HostRoutes::many`] when it has more than
/// [`FEW_CHILDREN`] children, else [`NONE`].
///
/// On an Ingress host the three slots hold the index of the spec that owns
/// the rule; on a Gateway host they hold the offset of a list of specs (see
/// `gateway.rs`).
const NODE_WORDS: usize = 8;
const FIRST_EDGE: usize = 0;
const EDGE_COUNT: usize = 1;
const PARENT: usize = 2;
const EXACT: usize = 3;
const EXACT_SLASH: usize = 4;
const PREFIX: usize = 5;
const MANY: usize = 6;

/// An edge (a link to a child node) is [`EDGE_WORDS`] words: the label's
/// first 8 bytes, little-endian, zero-padded, as two words (most labels are
/// decided by integer comparisons instead of a `memcmp` call), the label's
/// byte offset in the array and its length, and the child node.
const EDGE_WORDS: usize = 5;

/// The first 8 bytes of a segment as an integer (see [`EDGE_WORDS`]).
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

/// All routes of one host pattern: its nodes, the edges of nodes with few
/// children and every edge label, in one array of words; the child maps of
/// nodes with many children beside it.
#[derive(Debug)]
pub(crate) struct HostRoutes {
    words: Box<[u32]>,
    /// The root node (`/`): the words before it belong to the caller
    /// ([`BuildHost::freeze_after`]).
    root: u32,
    many: Box<[FastMap<Box<str>, u32>]>,
}

impl HostRoutes {
    /// The words the caller placed in front of the trie.
    #[inline]
    pub(crate) fn words(&self) -> &[u32] {
        &self.words
    }

    #[inline]
    fn field(&self, node: u32, field: usize) -> u32 {
        self.words[node as usize + field]
    }

    #[inline]
    fn child(&self, node: u32, segment: &str) -> Option<u32> {
        let many = self.field(node, MANY);
        if many != NONE {
            return self.many[many as usize].get(segment).copied();
        }
        let start = self.field(node, FIRST_EDGE) as usize;
        let count = self.field(node, EDGE_COUNT) as usize;
        let edges = &self.words[start..start + count * EDGE_WORDS];
        let segment = segment.as_bytes();
        let tag = tag_of(segment);
        let (lo, hi) = (tag as u32, (tag >> 32) as u32);
        edges
            .chunks_exact(EDGE_WORDS)
            .find(|e| {
                e[0] == lo
                    && e[1] == hi
                    && e[3] as usize == segment.len()
                    && (segment.len() <= 8 || {
                        let bytes: &[u8] = bytemuck::cast_slice(&self.words);
                        bytes[e[2] as usize + 8..][..segment.len() - 8] == segment[8..]
                    })
            })
            .map(|e| e[4])
    }

    /// Returns the winning spec index for a canonical path.
    #[inline]
    fn find(&self, path: &str) -> Option<u32> {
        let mut node = self.root;
        let mut best = self.field(node, PREFIX);
        let rest = &path[1..];
        if rest.is_empty() {
            return slot(self.field(node, EXACT)).or(slot(best));
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
                    node = i;
                    let prefix = self.field(node, PREFIX);
                    if prefix != NONE {
                        best = prefix;
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
        let exact = self.field(node, if trailing { EXACT_SLASH } else { EXACT });
        slot(exact).or(slot(best))
    }

    /// Walks a canonical path as deep as the trie goes: returns the deepest
    /// node reached and, if the whole path was consumed, the Exact slot
    /// that matches it (else [`NONE`]).
    #[inline]
    pub(crate) fn walk(&self, path: &str) -> (u32, u32) {
        let rest = &path[1..];
        if rest.is_empty() {
            return (self.root, self.field(self.root, EXACT));
        }
        let (body, trailing) = match rest.strip_suffix('/') {
            Some(body) => (body, true),
            None => (rest, false),
        };
        let mut at = self.root;
        let mut rest = body;
        loop {
            let (segment, more) = match rest.bytes().position(|b| b == b'/') {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            match self.child(at, segment) {
                Some(i) => at = i,
                None => return (at, NONE),
            }
            match more {
                Some(next) => rest = next,
                None => break,
            }
        }
        (
            at,
            self.field(at, if trailing { EXACT_SLASH } else { EXACT }),
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
                next = (here != self.root).then(|| self.field(here, PARENT));
                let prefix = self.field(here, PREFIX);
                if prefix != NONE {
                    return Some(prefix);
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

    /// Replaces the value of every filled slot.
    pub(crate) fn map_slots(&mut self, f: impl Fn(u32) -> u32) {
        for n in &mut self.nodes {
            for v in [&mut n.exact, &mut n.exact_slash, &mut n.prefix]
                .into_iter()
                .flatten()
            {
                *v = f(*v);
            }
        }
    }

    pub(crate) fn freeze(self) -> HostRoutes {
        self.freeze_after(Vec::new())
    }

    /// Freezes the trie into one array of words after `front`, which the
    /// caller reads back with [`HostRoutes::words`] (its offsets stay
    /// valid: the trie goes after it).
    pub(crate) fn freeze_after(self, front: Vec<u32>) -> HostRoutes {
        let mut words = front;
        let root = words.len();
        let node_at = |i: u32| (root + i as usize * NODE_WORDS) as u32;
        let few: usize = self
            .nodes
            .iter()
            .filter(|n| n.children.len() <= FEW_CHILDREN)
            .map(|n| n.children.len())
            .sum();
        let edges_at = root + self.nodes.len() * NODE_WORDS;
        let labels_at = (edges_at + few * EDGE_WORDS) * 4;
        let mut edges: Vec<u32> = Vec::with_capacity(few * EDGE_WORDS);
        let mut labels: Vec<u8> = Vec::new();
        let mut many = Vec::new();
        words.reserve(self.nodes.len() * NODE_WORDS + few * EDGE_WORDS);
        for n in self.nodes {
            let mut node = [NONE; NODE_WORDS];
            node[FIRST_EDGE] = (edges_at + edges.len()) as u32;
            node[EDGE_COUNT] = 0;
            node[PARENT] = node_at(n.parent);
            node[EXACT] = n.exact.unwrap_or(NONE);
            node[EXACT_SLASH] = n.exact_slash.unwrap_or(NONE);
            node[PREFIX] = n.prefix.unwrap_or(NONE);
            if n.children.len() <= FEW_CHILDREN {
                node[EDGE_COUNT] = n.children.len() as u32;
                for (label, child) in n.children {
                    let tag = tag_of(label.as_bytes());
                    edges.extend([
                        tag as u32,
                        (tag >> 32) as u32,
                        (labels_at + labels.len()) as u32,
                        label.len() as u32,
                        node_at(child),
                    ]);
                    labels.extend_from_slice(label.as_bytes());
                }
            } else {
                node[MANY] = many.len() as u32;
                many.push(
                    n.children
                        .into_iter()
                        .map(|(label, child)| (label, node_at(child)))
                        .collect(),
                );
            }
            words.extend(node);
        }
        words.extend(edges);
        labels.resize(labels.len().div_ceil(4) * 4, 0);
        words.extend(
            labels
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
        );
        HostRoutes {
            words: words.into(),
            root: root as u32,
            many: many.into(),
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
/// rewritten on the stack only when needed, and what follows the path in
/// the target (empty, or `?…` / `#…`), found in the same pass.
#[inline]
pub(crate) fn with_canonical_path<'t, R>(
    raw: &'t str,
    f: impl FnOnce(&str, &'t str) -> Option<R>,
) -> Option<R> {
    match normalize::canonical_path_end(raw.as_bytes()) {
        Some(end) => f(&raw[..end], &raw[end..]),
        None => with_rewritten_path(raw, f),
    }
}

#[cold]
fn with_rewritten_path<'t, R>(
    raw: &'t str,
    f: impl FnOnce(&str, &'t str) -> Option<R>,
) -> Option<R> {
    let mut buf = [0u8; MAX_PATH_LEN];
    let after_path = split_target(raw).1;
    f(normalize::normalize_path_into(raw, &mut buf)?, after_path)
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
