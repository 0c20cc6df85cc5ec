//! The Tunnels by what they compete for — an http Tunnel's subdomain, a tcp
//! Tunnel's port or alias — kept beside the reflector store from the same
//! watch events, so that a Tunnel's reconcile reads its few competitors
//! instead of copying the whole store (with 10 000 Tunnels that copy, once per
//! reconcile, made the agent quadratic).
//!
//! It follows the watcher's events as kube-runtime's reflector does: `Apply`
//! and `Delete` change one entry; a (re)list (`Init`, `InitApply`…,
//! `InitDone`) builds a fresh index and swaps it in whole, so objects deleted
//! while the watch was down are dropped as the store drops them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tuna_crds::{Tunnel, TunnelProtocol};

/// What a Tunnel competes for: Tunnels with the same claim are competitors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Claim {
    /// An http Tunnel's subdomain (none: the Tunnel is refused for it).
    Http(Option<String>),
    /// A tcp Tunnel's TCP endpoint by its one key
    /// ([`crate::plan::claims::tcp_key`]): `portOrAlias: 30001` and
    /// `"30001"` are the same port, so the same claim (none: refused).
    Tcp(Option<String>),
}

impl Claim {
    fn of(tunnel: &Tunnel) -> Self {
        match tunnel.spec.protocol {
            TunnelProtocol::Http => Self::Http(tunnel.spec.subdomain.clone()),
            TunnelProtocol::Tcp => Self::Tcp(crate::plan::tunnel_tcp_key(tunnel)),
        }
    }
}

/// `namespace/name`, the reflector's key.
type Key = (String, String);

fn key_of(tunnel: &Tunnel) -> Key {
    (
        tunnel.metadata.namespace.clone().unwrap_or_default(),
        tunnel.metadata.name.clone().unwrap_or_default(),
    )
}

#[derive(Default)]
struct Index {
    by_claim: HashMap<Claim, HashSet<Key>>,
    claim_of: HashMap<Key, Claim>,
}

impl Index {
    fn upsert(&mut self, tunnel: &Tunnel) {
        let key = key_of(tunnel);
        let claim = Claim::of(tunnel);
        if let Some(old) = self.claim_of.insert(key.clone(), claim.clone())
            && old != claim
        {
            self.remove_from(&old, &key);
        }
        self.by_claim.entry(claim).or_default().insert(key);
    }

    fn remove(&mut self, tunnel: &Tunnel) {
        let key = key_of(tunnel);
        if let Some(claim) = self.claim_of.remove(&key) {
            self.remove_from(&claim, &key);
        }
    }

    fn remove_from(&mut self, claim: &Claim, key: &Key) {
        if let Some(set) = self.by_claim.get_mut(claim) {
            set.remove(key);
            if set.is_empty() {
                self.by_claim.remove(claim);
            }
        }
    }
}

/// The index; see the module docs.
#[derive(Default)]
pub struct TunnelIndex {
    live: Mutex<Index>,
    /// The index being built by a relist, swapped in at `InitDone`.
    relist: Mutex<Option<Index>>,
}

impl TunnelIndex {
    /// Applies one watch event (before the reflector applies it to the store).
    pub fn observe(&self, event: &watcher::Event<Tunnel>) {
        match event {
            watcher::Event::Apply(t) => self.live.lock().expect("index").upsert(t),
            watcher::Event::Delete(t) => self.live.lock().expect("index").remove(t),
            watcher::Event::Init => *self.relist.lock().expect("relist") = Some(Index::default()),
            watcher::Event::InitApply(t) => {
                let mut relist = self.relist.lock().expect("relist");
                relist.get_or_insert_with(Index::default).upsert(t);
            }
            watcher::Event::InitDone => {
                if let Some(fresh) = self.relist.lock().expect("relist").take() {
                    *self.live.lock().expect("index") = fresh;
                }
            }
        }
    }

    /// The Tunnels of `store` competing with `tunnel` for its subdomain, port
    /// or alias (itself included, once the watch has seen it). The index holds
    /// keys only: the objects are the store's.
    pub fn competitors(&self, tunnel: &Tunnel, store: &Store<Tunnel>) -> Vec<Arc<Tunnel>> {
        let keys: Vec<Key> = self
            .live
            .lock()
            .expect("index")
            .by_claim
            .get(&Claim::of(tunnel))
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        keys.into_iter()
            .filter_map(|(namespace, name)| store.get(&ObjectRef::new(&name).within(&namespace)))
            .collect()
    }

    /// How many Tunnels the index holds.
    pub fn len(&self) -> usize {
        self.live.lock().expect("index").claim_of.len()
    }

    /// Whether the index holds no Tunnel.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tunnel(ns: &str, name: &str, spec: &str) -> Tunnel {
        serde_saphyr::from_str(&format!(
            "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
        ))
        .expect("test Tunnel")
    }

    /// The index and a reflector store fed the same events.
    struct Both {
        index: TunnelIndex,
        store: Store<Tunnel>,
        writer: kube::runtime::reflector::store::Writer<Tunnel>,
    }

    impl Both {
        fn new() -> Self {
            let (store, writer) = kube::runtime::reflector::store();
            Self {
                index: TunnelIndex::default(),
                store,
                writer,
            }
        }
        fn observe(&mut self, event: watcher::Event<Tunnel>) {
            self.index.observe(&event);
            self.writer.apply_watcher_event(&event);
        }
        fn competitors(&self, t: &Tunnel) -> Vec<String> {
            names(self.index.competitors(t, &self.store))
        }
    }

    fn names(mut v: Vec<Arc<Tunnel>>) -> Vec<String> {
        v.sort_by_key(|t| key_of(t));
        v.iter()
            .map(|t| {
                format!(
                    "{}/{}",
                    t.metadata.namespace.as_deref().unwrap(),
                    t.metadata.name.as_deref().unwrap()
                )
            })
            .collect()
    }

    const WEB: &str = "{protocol: http, subdomain: shop, upstream: {url: 'http://web:80'}}";
    const API: &str = "{protocol: http, subdomain: api, upstream: {url: 'http://web:80'}}";
    const PG: &str = "{protocol: tcp, portOrAlias: pg, upstream: {url: 'tcp://db:5432'}}";
    const PORT: &str = "{protocol: tcp, portOrAlias: 30001, upstream: {url: 'tcp://db:5432'}}";
    const PORT_STR: &str =
        "{protocol: tcp, portOrAlias: '30001', upstream: {url: 'tcp://db:5432'}}";

    #[test]
    fn competitors_are_the_tunnels_with_the_same_claim_as_the_store_filter_found_them() {
        let mut both = Both::new();
        for t in [
            tunnel("a", "one", WEB),
            tunnel("b", "two", WEB),
            tunnel("a", "api", API),
            tunnel("a", "pg", PG),
            tunnel("b", "pg", PG),
            tunnel("a", "port", PORT),
            tunnel("a", "port-str", PORT_STR),
        ] {
            both.observe(watcher::Event::Apply(t));
        }
        assert_eq!(both.competitors(&tunnel("x", "y", WEB)), ["a/one", "b/two"]);
        assert_eq!(both.competitors(&tunnel("x", "y", API)), ["a/api"]);
        assert_eq!(both.competitors(&tunnel("x", "y", PG)), ["a/pg", "b/pg"]);
        // An int and the same digits as a string are one port (issue 37,
        // item 3): one claim, so each sees the other.
        assert_eq!(
            both.competitors(&tunnel("x", "y", PORT)),
            ["a/port", "a/port-str"]
        );
        assert_eq!(
            both.competitors(&tunnel("x", "y", PORT_STR)),
            ["a/port", "a/port-str"]
        );
    }

    #[test]
    fn a_changed_claim_moves_and_a_delete_removes() {
        let mut both = Both::new();
        both.observe(watcher::Event::Apply(tunnel("a", "one", WEB)));
        both.observe(watcher::Event::Apply(tunnel("a", "one", API)));
        assert!(both.competitors(&tunnel("x", "y", WEB)).is_empty());
        assert_eq!(both.competitors(&tunnel("x", "y", API)), ["a/one"]);
        both.observe(watcher::Event::Delete(tunnel("a", "one", API)));
        assert!(both.competitors(&tunnel("x", "y", API)).is_empty());
        assert!(both.index.is_empty());
    }

    #[test]
    fn a_relist_replaces_the_index_whole_at_init_done() {
        let mut both = Both::new();
        both.observe(watcher::Event::Apply(tunnel("a", "gone", WEB)));
        both.observe(watcher::Event::Init);
        both.observe(watcher::Event::InitApply(tunnel("a", "kept", WEB)));
        // Until the relist is done, the old index (and store) answer.
        assert_eq!(both.competitors(&tunnel("x", "y", WEB)), ["a/gone"]);
        both.observe(watcher::Event::InitDone);
        assert_eq!(both.competitors(&tunnel("x", "y", WEB)), ["a/kept"]);
        assert_eq!(both.index.len(), 1);
    }
}
