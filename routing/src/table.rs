//! The compiled table: hosts in hash maps, paths in a segment trie per host.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gateway::GatewayRoutes;
use crate::normalize::{self, MAX_HOST_LEN, RouteHost};
use crate::request::{Conditions, PlainGet, RequestView};
use crate::spec::{BuildIssue, Match, Matcher, PathType, RouteSpec};
use crate::trie::{BuildHost, HostRoutes, NONE, Slot, SpecState, find_path, rule_key};

/// The hosts of a table: a persistent hash map (a HAMT), so that a table
/// with one host changed shares every other host's slot with the table it
/// came from — a change costs O(log n), not a copy of every host.
type HostMap<B> = imbl::GenericHashMap<
    Arc<str>,
    Arc<HostTable<B>>,
    foldhash::fast::RandomState,
    imbl::shared_ptr::DefaultSharedPtr,
>;

/// How a host matches requests.
#[derive(Debug)]
enum Routes {
    /// Every spec is [`Matcher::Ingress`]: one spec per rule in one trie.
    Ingress(HostRoutes),
    /// Some spec is [`Matcher::Gateway`]: ordered candidates (`gateway.rs`).
    Gateway(GatewayRoutes),
}

/// The compiled routes of one host pattern (`example.com` or
/// `*.example.com`): its specs, what the build decided for each, and the
/// path trie.
///
/// Rules of different host patterns never interact (a request selects one
/// pattern, then a path within it), so a host compiles alone: a change to
/// one host compiles that host once, and [`RouteTable::from_hosts`]
/// assembles the table from the compiled hosts without compiling any again.
#[derive(Debug)]
pub struct HostTable<B> {
    /// The pattern as a request would name it: `example.com`, `*.example.com`.
    name: Box<str>,
    host: RouteHost,
    /// The key of the table's maps: the exact host, or the wildcard's
    /// suffix; shared, so that assembling a table allocates no key.
    key: Arc<str>,
    specs: Vec<RouteSpec<B>>,
    pub(crate) states: Vec<SpecState>,
    /// Each spec's position in the input it came from, so that issues and
    /// explanations follow the caller's order across hosts.
    seq: Vec<usize>,
    routes: Routes,
}

impl<B> HostTable<B> {
    /// Compiles the specs of one host pattern. Every spec must name `host`
    /// (compared in canonical form); invalid paths and losers of equal rules
    /// are returned as issues, in input order, and left out.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tuna_routing::{HostTable, Origin, PathType, RouteSpec, RouteTable, TieBreak};
    ///
    /// let spec = |host: &str, path: &str, backend| RouteSpec {
    ///     host: host.into(),
    ///     path: path.into(),
    ///     path_type: PathType::Prefix,
    ///     backend,
    ///     origin: Origin::default(),
    ///     tie_break: TieBreak::default(),
    ///     matcher: tuna_routing::Matcher::Ingress,
    /// };
    /// let (shop, issues) = HostTable::build("shop.example.com", vec![spec("Shop.example.com", "/", 1)]).unwrap();
    /// assert!(issues.is_empty());
    /// assert_eq!(shop.name(), "shop.example.com");
    /// let (any, _) = HostTable::build("*.example.com", vec![spec("*.example.com", "/", 2)]).unwrap();
    /// let table = RouteTable::from_hosts([Arc::new(shop), Arc::new(any)]);
    /// assert_eq!(table.lookup("shop.example.com", "/x").map(|m| *m.backend), Some(1));
    /// assert_eq!(table.lookup("blog.example.com", "/x").map(|m| *m.backend), Some(2));
    /// assert!(HostTable::build("a.example.com", vec![spec("b.example.com", "/", 3)]).is_err());
    /// ```
    pub fn build(host: &str, specs: Vec<RouteSpec<B>>) -> Result<(Self, Vec<BuildIssue>)> {
        let parsed = normalize::parse_route_host(host).map_err(|reason| Error::InvalidHost {
            host: host.to_owned(),
            reason,
        })?;
        for spec in &specs {
            if normalize::parse_route_host(&spec.host).ok().as_ref() != Some(&parsed) {
                return Err(Error::OtherHost {
                    host: host.to_owned(),
                    spec: spec.host.clone(),
                });
            }
        }
        let seq = (0..specs.len()).collect();
        Self::compile(parsed, specs, seq)
    }

    /// Compiles specs known to name `host`; `seq` gives their input positions.
    pub(crate) fn compile(
        host: RouteHost,
        specs: Vec<RouteSpec<B>>,
        seq: Vec<usize>,
    ) -> Result<(Self, Vec<BuildIssue>)> {
        if specs.len() >= NONE as usize {
            return Err(Error::TooManySpecs {
                count: specs.len(),
                max: NONE as usize - 1,
            });
        }
        // Edge labels are addressed with 32-bit offsets.
        let label_bytes: usize = specs.iter().map(|s| s.path.len()).sum();
        if label_bytes >= NONE as usize {
            return Err(Error::TooManySpecs {
                count: specs.len(),
                max: specs.len() * (NONE as usize) / label_bytes,
            });
        }
        let (name, key): (Box<str>, Arc<str>) = match &host {
            RouteHost::Exact(h) => (h.as_str().into(), h.as_str().into()),
            RouteHost::Wildcard(s) => (format!("*.{s}").into(), s.as_str().into()),
        };
        let (routes, states) = if specs
            .iter()
            .any(|s| matches!(s.matcher, Matcher::Gateway(_)))
        {
            let (routes, states) = GatewayRoutes::compile(&name, &specs, &seq);
            (Routes::Gateway(routes), states)
        } else {
            let (routes, states) = compile_ingress(&specs, &seq);
            (Routes::Ingress(routes), states)
        };
        let table = HostTable {
            name,
            key,
            host,
            specs,
            states,
            seq,
            routes,
        };
        let issues = table.issues().map(|(_, issue)| issue).collect();
        Ok((table, issues))
    }
}

/// Compiles an Ingress-only host: one spec per rule, in one trie.
fn compile_ingress<B>(specs: &[RouteSpec<B>], seq: &[usize]) -> (HostRoutes, Vec<SpecState>) {
    let mut states = Vec::with_capacity(specs.len());
    let mut build = BuildHost::default();
    // Losers of equal rules, with the slot they lost; the final holder of
    // the slot is known only once every spec has been placed.
    let mut losers: Vec<(usize, usize, Slot)> = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        let path = match normalize::parse_route_path(&spec.path) {
            Ok(path) => path,
            Err(_) => {
                states.push(SpecState::InvalidPath);
                continue;
            }
        };
        let (key_path, slot) = rule_key(&path, spec.path_type);
        let node = build.node_for(key_path.trim_start_matches('/').trim_end_matches('/'));
        let current = build.slot(node, slot);
        match *current {
            None => *current = Some(index as u32),
            Some(holder) => {
                let holder = holder as usize;
                if precedes(spec, seq[index], &specs[holder], seq[holder]) {
                    *current = Some(index as u32);
                    losers.push((holder, node, slot));
                } else {
                    losers.push((index, node, slot));
                }
            }
        }
        states.push(SpecState::Active { path });
    }
    for (loser, node, slot) in losers {
        let winner = build
            .slot(node, slot)
            .expect("a conflict slot has a holder") as usize;
        let SpecState::Active { path } = states[loser].clone() else {
            unreachable!("a spec loses a conflict only once")
        };
        states[loser] = SpecState::Conflict { path, winner };
    }
    (build.freeze(), states)
}

impl<B> HostTable<B> {
    /// The host pattern in canonical form: `example.com`, `*.example.com`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The specs given to [`HostTable::build`], in input order, including
    /// the ones that are not routed.
    pub fn specs(&self) -> &[RouteSpec<B>] {
        &self.specs
    }

    /// The wildcard suffix (`example.com` of `*.example.com`), if a wildcard.
    pub(crate) fn wildcard_suffix(&self) -> Option<&str> {
        match &self.host {
            RouteHost::Exact(_) => None,
            RouteHost::Wildcard(s) => Some(s),
        }
    }

    /// The input position of spec `index`.
    pub(crate) fn seq(&self, index: usize) -> usize {
        self.seq[index]
    }

    /// The winning spec for a raw request target (path and query).
    #[inline]
    pub(crate) fn find(&self, raw_target: &str, request: &impl RequestView) -> Option<usize> {
        match &self.routes {
            Routes::Ingress(routes) => find_path(routes, raw_target),
            Routes::Gateway(routes) => routes.find(raw_target, request),
        }
        .map(|i| i as usize)
    }

    /// The compiled conditions of spec `index` when this host is matched
    /// by Gateway API precedence, `None` on an Ingress host.
    pub(crate) fn gateway_conditions(&self, index: usize) -> Option<&Conditions> {
        match &self.routes {
            Routes::Ingress(_) => None,
            Routes::Gateway(routes) => Some(routes.conditions(index)),
        }
    }

    /// The issues of this host with their input positions.
    pub(crate) fn issues(&self) -> impl Iterator<Item = (usize, BuildIssue)> + '_ {
        self.specs
            .iter()
            .zip(&self.states)
            .zip(&self.seq)
            .filter_map(|((spec, state), &seq)| {
                let issue = match state {
                    SpecState::Active { .. } => return None,
                    SpecState::InvalidPath => BuildIssue::InvalidPath {
                        origin: spec.origin.clone(),
                        path: spec.path.clone(),
                        reason: normalize::parse_route_path(&spec.path)
                            .expect_err("recorded as invalid"),
                    },
                    SpecState::Conflict { winner, .. } => BuildIssue::Conflict {
                        loser: spec.origin.clone(),
                        winner: self.specs[*winner].origin.clone(),
                        host: self.name.to_string(),
                        path: spec.path.clone(),
                        path_type: if spec.path_type.is_prefix() {
                            PathType::Prefix
                        } else {
                            PathType::Exact
                        },
                    },
                };
                Some((seq, issue))
            })
    }
}

/// An immutable, compiled route table: the compiled hosts by pattern. Cheap
/// to share (`Send + Sync` when the backend is) and to clone (O(1)); a
/// clone with one host set or removed ([`Self::set_host`],
/// [`Self::remove_host`]) shares every other host with the original.
pub struct RouteTable<B> {
    exact_hosts: HostMap<B>,
    /// Keyed by the suffix after `*.`.
    wildcard_hosts: HostMap<B>,
}

impl<B> Default for RouteTable<B> {
    fn default() -> Self {
        Self {
            exact_hosts: HostMap::default(),
            wildcard_hosts: HostMap::default(),
        }
    }
}

impl<B> Clone for RouteTable<B> {
    fn clone(&self) -> Self {
        Self {
            exact_hosts: self.exact_hosts.clone(),
            wildcard_hosts: self.wildcard_hosts.clone(),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for RouteTable<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("exact_hosts", &self.exact_hosts)
            .field("wildcard_hosts", &self.wildcard_hosts)
            .finish()
    }
}

impl<B> RouteTable<B> {
    /// Compiles specs into a table. Invalid specs and losers of conflicts are
    /// returned as issues (in input order) and left out; all other specs are
    /// routed.
    ///
    /// ```
    /// use tuna_routing::{BuildIssue, Origin, PathType, RouteSpec, RouteTable, TieBreak};
    ///
    /// let spec = |name: &str, created, path: &str| RouteSpec {
    ///     host: "example.com".into(),
    ///     path: path.into(),
    ///     path_type: PathType::Prefix,
    ///     backend: name.to_owned(),
    ///     origin: Origin { namespace: "ns".into(), name: name.into(), rule: 0, path: 0 },
    ///     tie_break: TieBreak { created, namespace: "ns".into(), name: name.into() },
    ///     matcher: tuna_routing::Matcher::Ingress,
    /// };
    /// let (table, issues) = RouteTable::build(vec![
    ///     spec("newer", 200, "/app"),
    ///     spec("older", 100, "/app/"), // same rule: a Prefix's trailing slash is ignored
    ///     spec("broken", 100, "/a/../b"),
    /// ])
    /// .unwrap();
    /// assert_eq!(table.lookup("example.com", "/app/x").unwrap().backend, "older");
    /// assert!(matches!(&issues[0], BuildIssue::Conflict { loser, .. } if loser.name == "newer"));
    /// assert_eq!(issues[1].reason(), "PathDotSegment");
    /// ```
    pub fn build(specs: Vec<RouteSpec<B>>) -> Result<(Self, Vec<BuildIssue>)> {
        let mut issues: Vec<(usize, BuildIssue)> = Vec::new();
        // Specs grouped by host pattern, in input order within each.
        let mut groups: HashMap<RouteHost, (Vec<RouteSpec<B>>, Vec<usize>)> = HashMap::new();
        for (seq, spec) in specs.into_iter().enumerate() {
            match normalize::parse_route_host(&spec.host) {
                Ok(host) => {
                    let group = groups.entry(host).or_default();
                    group.0.push(spec);
                    group.1.push(seq);
                }
                Err(reason) => issues.push((
                    seq,
                    BuildIssue::InvalidHost {
                        origin: spec.origin.clone(),
                        host: spec.host.clone(),
                        reason,
                    },
                )),
            }
        }
        let mut hosts = Vec::with_capacity(groups.len());
        for (host, (specs, seq)) in groups {
            let (table, _) = HostTable::compile(host, specs, seq)?;
            issues.extend(table.issues());
            hosts.push(Arc::new(table));
        }
        issues.sort_by_key(|(seq, _)| *seq);
        Ok((
            Self::from_hosts(hosts),
            issues.into_iter().map(|(_, i)| i).collect(),
        ))
    }

    /// Assembles a table from hosts compiled alone, compiling nothing: the
    /// cost is one map insert per host. A pattern given twice keeps the
    /// last one.
    pub fn from_hosts(hosts: impl IntoIterator<Item = Arc<HostTable<B>>>) -> Self {
        let mut table = Self::default();
        for host in hosts {
            table.set_host(host);
        }
        table
    }

    /// Sets one compiled host, replacing the table of the same pattern, and
    /// returns the replaced one. O(log n), compiling nothing: the usual way
    /// to change a table is to clone it, set the changed host and swap the
    /// clone in, which leaves every other host shared.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tuna_routing::{HostTable, Origin, PathType, RouteSpec, RouteTable, TieBreak};
    ///
    /// let spec = |host: &str, backend| RouteSpec {
    ///     host: host.into(),
    ///     path: "/".into(),
    ///     path_type: PathType::Prefix,
    ///     backend,
    ///     origin: Origin::default(),
    ///     tie_break: TieBreak::default(),
    ///     matcher: tuna_routing::Matcher::Ingress,
    /// };
    /// let host = |name: &str, backend| Arc::new(HostTable::build(name, vec![spec(name, backend)]).unwrap().0);
    /// let live = RouteTable::from_hosts([host("a.example.com", 1), host("*.example.com", 2)]);
    /// let mut next = live.clone();
    /// next.set_host(host("a.example.com", 3));
    /// assert_eq!(next.lookup("a.example.com", "/").map(|m| *m.backend), Some(3));
    /// assert_eq!(live.lookup("a.example.com", "/").map(|m| *m.backend), Some(1));
    /// assert!(next.remove_host("*.example.com").is_some());
    /// assert_eq!(next.lookup("b.example.com", "/").map(|m| *m.backend), None);
    /// assert_eq!(live.lookup("b.example.com", "/").map(|m| *m.backend), Some(2));
    /// ```
    pub fn set_host(&mut self, host: Arc<HostTable<B>>) -> Option<Arc<HostTable<B>>> {
        let key = host.key.clone();
        match host.host {
            RouteHost::Exact(_) => self.exact_hosts.insert(key, host),
            RouteHost::Wildcard(_) => self.wildcard_hosts.insert(key, host),
        }
    }

    /// Removes the host `pattern` (canonical form: `example.com`,
    /// `*.example.com`) and returns its table. O(log n).
    pub fn remove_host(&mut self, pattern: &str) -> Option<Arc<HostTable<B>>> {
        match pattern.strip_prefix("*.") {
            Some(suffix) => self.wildcard_hosts.remove(suffix),
            None => self.exact_hosts.remove(pattern),
        }
    }

    /// Finds the route for a request. `host` is the raw `Host` header (any
    /// case, optional port, optional trailing dot); `path` is the raw request
    /// target path, query allowed. Allocates nothing.
    ///
    /// On a host matched by Gateway API precedence (see the crate docs),
    /// the request is taken to be a `GET` without headers; the proxy calls
    /// [`Self::lookup_request`] instead.
    ///
    /// ```
    /// use tuna_routing::{Origin, PathType, RouteSpec, RouteTable, TieBreak};
    ///
    /// let spec = |host: &str, path: &str, backend| RouteSpec {
    ///     host: host.into(),
    ///     path: path.into(),
    ///     path_type: PathType::Prefix,
    ///     backend,
    ///     origin: Origin::default(),
    ///     tie_break: TieBreak::default(),
    ///     matcher: tuna_routing::Matcher::Ingress,
    /// };
    /// let (table, _) = RouteTable::build(vec![
    ///     spec("*.example.com", "/", 1),
    ///     spec("www.example.com", "/docs", 2),
    /// ])
    /// .unwrap();
    /// assert_eq!(table.lookup("any.example.com", "/x").map(|m| *m.backend), Some(1));
    /// assert_eq!(table.lookup("a.b.example.com", "/x").map(|m| *m.backend), None);
    /// assert_eq!(table.lookup("WWW.example.com.:80", "/docs/%2e%2e/docs/a").map(|m| *m.backend), Some(2));
    /// // The exact host is selected first; its routes do not cover `/x`.
    /// assert_eq!(table.lookup("www.example.com", "/x").map(|m| *m.backend), None);
    /// ```
    #[inline]
    pub fn lookup(&self, host: &str, path: &str) -> Option<Match<'_, B>> {
        self.lookup_request(host, path, &PlainGet)
    }

    /// Finds the route for a request, with what Gateway API matches need
    /// besides host and path: the method, the headers (through
    /// `request`) and the query (from `path_and_query`). Hosts are selected
    /// as by [`Self::lookup`]; on an Ingress-only host the answer is the
    /// same as `lookup`'s. Allocates nothing (unless `request` does).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tuna_routing::{GatewayMatch, Matcher, Origin, PathType, RouteSpec, RouteTable, SimpleRequest, TieBreak};
    ///
    /// let spec = |path: &str, m: GatewayMatch, backend| RouteSpec {
    ///     host: "shop.example.com".into(),
    ///     path: path.into(),
    ///     path_type: PathType::Prefix,
    ///     backend,
    ///     origin: Origin::default(),
    ///     tie_break: TieBreak::default(),
    ///     matcher: Matcher::Gateway(Arc::new(m)),
    /// };
    /// let (table, _) = RouteTable::build(vec![
    ///     spec("/", GatewayMatch::default(), "web"),
    ///     spec("/api", GatewayMatch { method: Some("POST".into()), ..Default::default() }, "api-writes"),
    ///     spec("/", GatewayMatch { headers: vec![("x-canary".into(), "on".into())], ..Default::default() }, "canary"),
    ///     spec("/", GatewayMatch { query: vec![("debug".into(), "1 2".into())], ..Default::default() }, "debug"),
    /// ])
    /// .unwrap();
    /// let route = |target, request: &SimpleRequest| {
    ///     table.lookup_request("shop.example.com", target, request).map(|m| *m.backend)
    /// };
    /// let get = SimpleRequest::get();
    /// assert_eq!(route("/api/cart", &SimpleRequest::new("POST")), Some("api-writes"));
    /// // A longer Prefix wins only when its other conditions hold.
    /// assert_eq!(route("/api/cart", &get), Some("web"));
    /// assert_eq!(route("/api/cart", &get.clone().with_header("X-Canary", "on")), Some("canary"));
    /// assert_eq!(route("/?debug=1%202", &get), Some("debug"));
    /// assert_eq!(table.lookup("shop.example.com", "/api/cart").map(|m| *m.backend), Some("web"));
    /// ```
    #[inline]
    pub fn lookup_request(
        &self,
        host: &str,
        path_and_query: &str,
        request: &impl RequestView,
    ) -> Option<Match<'_, B>> {
        let (host, index) = self.lookup_index(host, path_and_query, request)?;
        let spec = &host.specs[index];
        Some(Match {
            backend: &spec.backend,
            spec,
        })
    }

    /// The selected host and the index of the winning spec within it.
    #[inline]
    pub(crate) fn lookup_index(
        &self,
        host: &str,
        path_and_query: &str,
        request: &impl RequestView,
    ) -> Option<(&HostTable<B>, usize)> {
        let host = self.host_routes(host)?.1;
        host.find(path_and_query, request).map(|i| (host, i))
    }

    /// The host patterns that have routes, sorted; wildcards as `*.example.com`.
    ///
    /// ```
    /// # use tuna_routing::*;
    /// let (table, _) = RouteTable::<()>::build(vec![]).unwrap();
    /// assert_eq!(table.hosts().count(), 0);
    /// ```
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        let mut names: Vec<&str> = self
            .exact_hosts
            .values()
            .chain(self.wildcard_hosts.values())
            .map(|h| h.name())
            .collect();
        names.sort_unstable();
        names.into_iter()
    }

    /// The compiled table of the exact host `host` (canonical form) or of
    /// the wildcard over `suffix`, for explanations.
    pub(crate) fn exact_host(&self, host: &str) -> Option<&HostTable<B>> {
        self.exact_hosts.get(host).map(|h| &**h)
    }

    pub(crate) fn wildcard_host(&self, suffix: &str) -> Option<&HostTable<B>> {
        self.wildcard_hosts.get(suffix).map(|h| &**h)
    }

    /// Selects the host routes for a raw host: the exact host if it has
    /// routes, else the one-label wildcard. Returns whether a wildcard was used.
    #[inline]
    fn host_routes(&self, raw_host: &str) -> Option<(bool, &HostTable<B>)> {
        if raw_host.bytes().any(|b| b.is_ascii_uppercase()) {
            return self.host_routes_uppercase(raw_host);
        }
        self.host_routes_canonical(normalize::strip_host(raw_host)?)
    }

    /// Lower-cases into a stack buffer; rare, so kept off the hot path.
    #[cold]
    fn host_routes_uppercase(&self, raw_host: &str) -> Option<(bool, &HostTable<B>)> {
        let mut buf = [0u8; MAX_HOST_LEN];
        let host = normalize::normalize_host_into(raw_host, &mut buf)?;
        self.host_routes_canonical(host)
    }

    #[inline]
    pub(crate) fn host_routes_canonical(&self, host: &str) -> Option<(bool, &HostTable<B>)> {
        if let Some(routes) = self.exact_hosts.get(host) {
            return Some((false, routes));
        }
        if self.wildcard_hosts.is_empty() {
            return None;
        }
        let dot = host.find('.')?;
        if dot == 0 {
            return None;
        }
        self.wildcard_hosts
            .get(&host[dot + 1..])
            .map(|r| (true, &**r))
    }
}

/// True when spec `a` (input position `ai`) wins an equal rule against `b`.
fn precedes<B>(a: &RouteSpec<B>, ai: usize, b: &RouteSpec<B>, bi: usize) -> bool {
    let key = |s: &RouteSpec<B>, i: usize| (s.tie_break.clone(), s.origin.rule, s.origin.path, i);
    key(a, ai) < key(b, bi)
}
