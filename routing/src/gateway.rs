//! Hosts matched by the Gateway API's precedence (`HTTPRoute` v1.6.1).
//!
//! The precedence is a total order on specs; a lookup answers with the
//! first spec in that order whose path and conditions hold. Scanning every
//! spec would make a lookup linear in the host's routes, so the order is
//! laid out along the segment trie instead: specs are grouped by the rank
//! of their hostname (the order's first keys), and within a group every
//! path that can match a request lies on the one branch the request's path
//! walks. On that branch, the order is the trie's own: the Exact slot of
//! the deepest node first (Exact beats every Prefix), then the Prefix
//! slots from the deepest node up (a deeper node is a longer prefix). Each
//! slot holds a list of the specs on that path sorted by the rest of the
//! order (method, header count, query count, age, rule and match index),
//! so the first spec of the first list whose conditions hold is the first
//! matching spec of the whole order.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::normalize;
use crate::request::{self, ConditionSet, Conditions, ConditionsKey, RequestView, Seen};
use crate::spec::{Matcher, RouteSpec};
use crate::trie::{BuildHost, HostRoutes, NONE, SpecState, rule_key, with_canonical_path};

/// The compiled routes of a Gateway host.
///
/// A lookup touches as few cache lines as on an Ingress host plus the
/// candidate list it reaches: the first group is inline, a trie slot is the
/// offset of its list in `lists` (or, where the first candidate has no
/// condition, that spec itself: no list is read, as on an Ingress host),
/// and each list is laid out with the conditions and strings of its
/// candidates right after it, in the same allocation (see [`Lists`]).
#[derive(Debug)]
pub(crate) struct GatewayRoutes {
    /// The trie of the highest hostname rank, with every candidate list
    /// ([`Lists`]) in front of it in its array of words; then the tries of
    /// the other ranks, highest first. Their node slots are offsets of
    /// lists in `first`'s words.
    first: HostRoutes,
    more: Box<[HostRoutes]>,
    /// Every spec's conditions, by spec index (for `explain`).
    conditions: Box<[Conditions]>,
}

/// A trie slot with this bit set holds a spec index (the one candidate
/// that always matches there), without it the offset of a candidate list.
const INLINE: u32 = 1 << 31;

/// The candidate lists of a host in one array of words.
///
/// A list at offset `l` is `words[l]` = its length `n`, then `n` pairs
/// `(spec, condition)`, in precedence order. `condition` is [`NONE`] for a
/// candidate without conditions (it always matches), else the offset of a
/// condition record of [`RECORD_WORDS`] words: the method's code
/// ([`request::method_code`]; [`NONE`] for any method) and text (offset,
/// length), the number of header and of query pairs; then for each pair
/// its name's and value's text (offset, length). Texts are bytes of the
/// same array (byte offsets). A list's records and texts follow the list,
/// so that one lookup reads one short run of memory.
#[derive(Clone, Copy)]
struct Lists<'a> {
    words: &'a [u32],
}

impl<'a> Lists<'a> {
    #[inline]
    fn text(self, offset: u32, len: u32) -> &'a [u8] {
        let bytes: &[u8] = bytemuck::cast_slice(self.words);
        &bytes[offset as usize..(offset + len) as usize]
    }

    /// The name of a header or query pair: text the build wrote from a
    /// `str`, so always UTF-8.
    #[inline]
    fn name(self, offset: u32, len: u32) -> &'a str {
        std::str::from_utf8(self.text(offset, len)).unwrap_or_default()
    }

    /// The first spec of list `list` whose conditions hold.
    #[inline]
    fn first<R: RequestView + ?Sized>(self, list: u32, seen: &Seen<'_, R>) -> Option<u32> {
        let w = self.words;
        let list = list as usize;
        let len = w[list] as usize;
        (0..len).find_map(|k| {
            let (spec, condition) = (w[list + 1 + 2 * k], w[list + 2 + 2 * k]);
            (condition == NONE || self.holds(condition as usize, seen)).then_some(spec)
        })
    }

    #[inline]
    fn holds<R: RequestView + ?Sized>(self, at: usize, seen: &Seen<'_, R>) -> bool {
        request::check(Record { lists: self, at }, seen).is_ok()
    }
}

/// The condition record at word `at` of a host's [`Lists`].
#[derive(Clone, Copy)]
struct Record<'a> {
    lists: Lists<'a>,
    at: usize,
}

impl Record<'_> {
    #[inline]
    fn pair(&self, i: usize) -> usize {
        self.at + RECORD_WORDS + 4 * i
    }
}

impl<'a> ConditionSet<'a> for Record<'a> {
    #[inline]
    fn method(&self) -> Option<(u32, &'a [u8])> {
        let w = self.lists.words;
        let at = self.at;
        (w[at] != NONE).then(|| (w[at], self.lists.text(w[at + 1], w[at + 2])))
    }
    #[inline]
    fn counts(&self) -> (usize, usize) {
        let w = self.lists.words;
        (w[self.at + 3] as usize, w[self.at + 4] as usize)
    }
    #[inline]
    fn header(&self, i: usize) -> (&'a str, &'a [u8]) {
        let (w, p) = (self.lists.words, self.pair(i));
        (
            self.lists.name(w[p], w[p + 1]),
            self.lists.text(w[p + 2], w[p + 3]),
        )
    }
    #[inline]
    fn query(&self, i: usize) -> (&'a str, &'a [u8]) {
        self.header(self.counts().0 + i)
    }
}

/// The words of a condition record before its pairs (see [`Lists`]).
const RECORD_WORDS: usize = 5;

/// Builds [`Lists`]: words, with texts packed into them.
#[derive(Default)]
struct ListsBuilder {
    words: Vec<u32>,
}

impl ListsBuilder {
    /// Appends a list of `(spec, conditions)` candidates and returns its
    /// offset.
    fn push(&mut self, candidates: &[(u32, &Conditions)]) -> u32 {
        let list = self.words.len();
        self.words.push(candidates.len() as u32);
        let slots = self.words.len();
        self.words
            .extend(std::iter::repeat_n(NONE, 2 * candidates.len()));
        let mut texts: Vec<(usize, &str)> = Vec::new();
        for (k, (spec, conditions)) in candidates.iter().enumerate() {
            self.words[slots + 2 * k] = *spec;
            if conditions.is_empty() {
                continue;
            }
            let at = self.words.len();
            self.words[slots + 2 * k + 1] = at as u32;
            let code = conditions
                .method
                .as_deref()
                .map_or(NONE, |m| request::method_code(m.as_bytes()));
            self.words.extend([
                code,
                NONE,
                0,
                conditions.headers.len() as u32,
                conditions.query.len() as u32,
            ]);
            if let Some(method) = &conditions.method {
                texts.push((at + 1, method));
            }
            for (name, value) in conditions.headers.iter().chain(conditions.query.iter()) {
                let p = self.words.len();
                self.words.extend([0; 4]);
                texts.push((p, name));
                texts.push((p + 2, value));
            }
        }
        // The texts, packed after the records: (offset, length) in bytes.
        let mut bytes = Vec::new();
        let start = self.words.len() * 4;
        for (slot, text) in texts {
            self.words[slot] = (start + bytes.len()) as u32;
            self.words[slot + 1] = text.len() as u32;
            bytes.extend_from_slice(text.as_bytes());
        }
        bytes.resize(bytes.len().div_ceil(4) * 4, 0);
        self.words.extend(
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
        );
        list as u32
    }

    fn finish(self) -> Vec<u32> {
        self.words
    }
}

/// The first keys of the order: the most non-wildcard characters of the
/// hostname, then the most characters. No hostname ranks last.
fn hostname_rank(hostname: Option<&str>) -> (Reverse<usize>, Reverse<usize>) {
    let hostname = hostname.unwrap_or("");
    let non_wildcard = if hostname.starts_with('*') {
        0
    } else {
        hostname.len()
    };
    (Reverse(non_wildcard), Reverse(hostname.len()))
}

impl GatewayRoutes {
    /// Compiles the specs of host `host` (canonical name). Invalid paths
    /// and the specs that can never match because an equal one precedes
    /// them (a conflict) are left out, as on an Ingress host.
    pub(crate) fn compile<B>(
        host: &str,
        specs: &[RouteSpec<B>],
        seq: &[usize],
    ) -> (Self, Vec<SpecState>) {
        let conditions: Vec<Conditions> = specs
            .iter()
            .map(|spec| match &spec.matcher {
                Matcher::Gateway(m) => Conditions::from_match(m),
                Matcher::Ingress => Conditions::default(),
            })
            .collect();
        // An Ingress spec serves its host through the host itself.
        let hostnames: Vec<Option<String>> = specs
            .iter()
            .map(|spec| match &spec.matcher {
                Matcher::Gateway(m) => m
                    .hostname
                    .as_deref()
                    .map(|h| h.trim_end_matches('.').to_ascii_lowercase()),
                Matcher::Ingress => Some(host.to_owned()),
            })
            .collect();
        let mut ranks: Vec<_> = hostnames
            .iter()
            .map(|h| hostname_rank(h.as_deref()))
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let mut builds: Vec<BuildHost> = ranks.iter().map(|_| BuildHost::default()).collect();
        let mut lists: Vec<Vec<usize>> = Vec::new();
        let mut states = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let Ok(path) = normalize::parse_route_path(&spec.path) else {
                states.push(SpecState::InvalidPath);
                continue;
            };
            let (key_path, slot) = rule_key(&path, spec.path_type);
            let group = ranks
                .binary_search(&hostname_rank(hostnames[index].as_deref()))
                .expect("every rank has a group");
            let build = &mut builds[group];
            let node = build.node_for(key_path.trim_start_matches('/').trim_end_matches('/'));
            let list = *build.slot(node, slot).get_or_insert_with(|| {
                lists.push(Vec::new());
                (lists.len() - 1) as u32
            });
            lists[list as usize].push(index);
            states.push(SpecState::Active { path });
        }
        let order = |&i: &usize| {
            let c = &conditions[i];
            (
                Reverse(c.method.is_some()),
                Reverse(c.headers.len()),
                Reverse(c.query.len()),
                &specs[i].tie_break,
                specs[i].origin.rule,
                specs[i].origin.path,
                seq[i],
            )
        };
        // Lists are laid out first and the trie slots then point at them.
        let mut words = ListsBuilder::default();
        let mut offsets = Vec::with_capacity(lists.len());
        let mut kept: Vec<(u32, &Conditions)> = Vec::new();
        // The first spec of the list with each (hostname, conditions): one
        // hash per spec, where a scan of the earlier specs made a host of L
        // specs on one path cost L² comparisons (issue 37, G9).
        let mut first: HashMap<(Option<&str>, ConditionsKey<'_>), usize> = HashMap::new();
        for mut list in lists {
            list.sort_by(|a, b| order(a).cmp(&order(b)));
            first.clear();
            kept.clear();
            for i in list {
                // Equal conditions on the same path and hostname: the first
                // in the order always matches when this one would.
                let winner = match first.entry((hostnames[i].as_deref(), conditions[i].key())) {
                    Entry::Occupied(w) => Some(*w.get()),
                    Entry::Vacant(v) => {
                        v.insert(i);
                        None
                    }
                };
                match winner {
                    Some(winner) => {
                        let SpecState::Active { path } = states[i].clone() else {
                            unreachable!("only active specs are placed")
                        };
                        states[i] = SpecState::Conflict { path, winner };
                    }
                    None => kept.push((i as u32, &conditions[i])),
                }
            }
            // A list whose first candidate has no condition always answers
            // with it: the slot holds that spec itself, as on an Ingress
            // host, and the lookup reads no list.
            offsets.push(match kept[0] {
                (spec, conditions) if conditions.is_empty() => {
                    assert!(
                        INLINE | spec != NONE,
                        "spec index {spec} above the slot's range"
                    );
                    INLINE | spec
                }
                _ => words.push(&kept),
            });
        }
        drop(first);
        let lists = words.finish();
        for build in &mut builds {
            build.map_slots(|list| offsets[list as usize]);
        }
        let mut groups = builds.into_iter();
        let first = groups.next().unwrap_or_default().freeze_after(lists);
        let more = groups.map(BuildHost::freeze).collect();
        drop(kept);
        let routes = GatewayRoutes {
            first,
            more,
            conditions: conditions.into(),
        };
        (routes, states)
    }

    /// The first spec in precedence order that matches a raw request target.
    #[inline]
    pub(crate) fn find(&self, raw_target: &str, request: &impl RequestView) -> Option<u32> {
        with_canonical_path(raw_target, |path, after_path| {
            let seen = Seen::new(request, after_path);
            std::iter::once(&self.first)
                .chain(self.more.iter())
                .find_map(|group| self.find_in(group, path, &seen))
        })
    }

    #[inline]
    fn find_in<R: RequestView + ?Sized>(
        &self,
        group: &HostRoutes,
        path: &str,
        seen: &Seen<'_, R>,
    ) -> Option<u32> {
        let lists = Lists {
            words: self.first.words(),
        };
        let (node, exact) = group.walk(path);
        let slot = |slot: u32| {
            if slot & INLINE != 0 {
                Some(slot & !INLINE)
            } else {
                lists.first(slot, seen)
            }
        };
        let exact = if exact == NONE { None } else { slot(exact) };
        exact.or_else(|| group.prefixes_up(node).find_map(slot))
    }

    /// The conditions of spec `index`.
    pub(crate) fn conditions(&self, index: usize) -> &Conditions {
        &self.conditions[index]
    }
}
