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
use crate::request::{Conditions, ConditionsKey, RequestView, query_of};
use crate::trie::{BuildHost, HostRoutes, NONE, SpecState, rule_key, with_canonical_path};
use crate::{Matcher, RouteSpec};

/// The compiled routes of a Gateway host.
#[derive(Debug)]
pub(crate) struct GatewayRoutes {
    /// One trie per hostname rank, highest rank first. Its node slots index
    /// `lists`.
    groups: Box<[HostRoutes]>,
    /// Each list is `entries[start..end]`.
    lists: Box<[(u32, u32)]>,
    /// Spec indexes; each list in precedence order, without conflict losers.
    entries: Box<[u32]>,
    /// Every spec's conditions, by spec index.
    conditions: Box<[Conditions]>,
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
        let mut ranges = Vec::with_capacity(lists.len());
        let mut entries = Vec::new();
        // The first spec of the list with each (hostname, conditions): one
        // hash per spec, where a scan of the earlier specs made a host of L
        // specs on one path cost L² comparisons (issue 37, G9).
        let mut first: HashMap<(Option<&str>, ConditionsKey<'_>), usize> = HashMap::new();
        for mut list in lists {
            list.sort_by(|a, b| order(a).cmp(&order(b)));
            let start = entries.len();
            first.clear();
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
                    None => entries.push(i as u32),
                }
            }
            ranges.push((start as u32, entries.len() as u32));
        }
        drop(first);
        let routes = GatewayRoutes {
            groups: builds.into_iter().map(BuildHost::freeze).collect(),
            lists: ranges.into(),
            entries: entries.into(),
            conditions: conditions.into(),
        };
        (routes, states)
    }

    /// The first spec in precedence order that matches a raw request target.
    #[inline]
    pub(crate) fn find(&self, raw_target: &str, request: &impl RequestView) -> Option<u32> {
        let query = query_of(raw_target);
        with_canonical_path(raw_target, |path| {
            self.groups.iter().find_map(|group| {
                let (node, exact) = group.walk(path);
                let exact = if exact == NONE {
                    None
                } else {
                    self.first(exact, query, request)
                };
                exact.or_else(|| {
                    group
                        .prefixes_up(node)
                        .find_map(|list| self.first(list, query, request))
                })
            })
        })
    }

    /// The first spec of a list whose conditions hold.
    #[inline]
    fn first(&self, list: u32, query: &str, request: &impl RequestView) -> Option<u32> {
        let (start, end) = self.lists[list as usize];
        self.entries[start as usize..end as usize]
            .iter()
            .copied()
            .find(|&i| self.conditions[i as usize].check(query, request).is_ok())
    }

    /// The conditions of spec `index`.
    pub(crate) fn conditions(&self, index: usize) -> &Conditions {
        &self.conditions[index]
    }
}
