//! The agent's claim book ([`crate::plan::claims::ClaimBook`]): who holds
//! which host and TCP endpoint, kept in a ConfigMap of the agent's own
//! namespace (`--claims-configmap`, default `tuna-operator-claims`) that
//! only the agent may write (its Role names the ConfigMap; tenants have no
//! rights in the operator's namespace). Nothing a tenant or another
//! controller writes on its own objects is read as a claim record.
//!
//! Every plan the agent makes reads the book ([`ClaimStore::load`]); the
//! decisions of the keys it planned with all their claimants in view go
//! back into it ([`ClaimStore::absorb`]), written before anything is
//! published, so that a crash never leaves a holder unrecorded that a
//! restarted agent would decide otherwise. The book is written by
//! server-side apply (the agent's field manager owns `data`).
//!
//! At the first start against a cluster without the ConfigMap, the holders
//! that earlier agents recorded in the annotation
//! [`crate::plan::ingress::HOSTS_CLAIMED_AT`] of Ingresses and Tunnels are
//! carried over once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use tuna_crds::Tunnel;

use crate::plan::claims::{BOOK_LABEL, ClaimBook, Record};
use crate::plan::ingress::{recorded_claims, rule_hosts};
use crate::plan::{Plan, tunnel_host};

/// The field manager of the book's writes.
const MANAGER: &str = "tuna-operator-agent-claims";

/// The book in memory and where it is kept.
pub struct ClaimStore {
    api: Api<ConfigMap>,
    name: String,
    book: Mutex<Option<ClaimBook>>,
    /// Serialises loading and writing.
    write: tokio::sync::Mutex<()>,
}

impl ClaimStore {
    /// A store of the ConfigMap `namespace/name`, not yet loaded.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            book: Mutex::new(None),
            write: tokio::sync::Mutex::new(()),
        }
    }

    /// Loads the book once (`legacy` gives the annotations' records when
    /// the ConfigMap does not exist yet). Returns it.
    pub async fn load(&self, legacy: impl FnOnce() -> ClaimBook) -> Result<ClaimBook, kube::Error> {
        if let Some(book) = self.book.lock().expect("claim book").clone() {
            return Ok(book);
        }
        let _guard = self.write.lock().await;
        if let Some(book) = self.book.lock().expect("claim book").clone() {
            return Ok(book);
        }
        // The chart creates the ConfigMap empty: a book an agent never wrote
        // (no `hosts.json`) is carried over from the legacy records too.
        let written = self
            .api
            .get_opt(&self.name)
            .await?
            .and_then(|cm| cm.data)
            .filter(|d| d.contains_key(crate::plan::claims::HOSTS_KEY));
        let book = match written {
            Some(data) => ClaimBook::from_data(&data),
            None => {
                let book = legacy();
                self.persist(&book).await?;
                tracing::info!(
                    configmap = %self.name,
                    hosts = book.hosts.len(),
                    "claim book created (holders carried over from the hosts-claimed-at annotations)"
                );
                book
            }
        };
        *self.book.lock().expect("claim book") = Some(book.clone());
        Ok(book)
    }

    /// The book as loaded and updated, once [`Self::load`] ran.
    pub fn snapshot_if_loaded(&self) -> Option<ClaimBook> {
        self.book.lock().expect("claim book").clone()
    }

    /// Takes the holders `plan` settled for `hosts` and `tcp` keys (planned
    /// with every claimant in view) into the book, and writes it when it
    /// changed. A failed write leaves the book as it was.
    pub async fn absorb(
        &self,
        plan: &Plan,
        hosts: &BTreeSet<String>,
        tcp: &BTreeSet<String>,
    ) -> Result<(), kube::Error> {
        let _guard = self.write.lock().await;
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let (before, next) = {
            let mut slot = self.book.lock().expect("claim book");
            let book = slot.get_or_insert_with(ClaimBook::default);
            let before = book.clone();
            if !book.absorb(hosts, tcp, &plan.decided(), now) {
                return Ok(());
            }
            (before, book.clone())
        };
        if let Err(e) = self.persist(&next).await {
            // Not stored, so not decided: the book in memory goes back, and
            // the next plan (the caller's retry) writes it again before it
            // publishes anything. Kept, a retry would find "no change" and
            // publish a holder the API server never recorded.
            *self.book.lock().expect("claim book") = Some(before);
            return Err(e);
        }
        for (what, old, new) in [
            ("host", &before.hosts, &next.hosts),
            ("TCP endpoint", &before.tcp, &next.tcp),
        ] {
            for key in old.keys().chain(new.keys()).collect::<BTreeSet<_>>() {
                match (old.get(key), new.get(key)) {
                    (a, b) if a == b => {}
                    (_, Some(r)) => {
                        tracing::info!(%key, namespace = %r.namespace, "{what} recorded as held by its namespace")
                    }
                    (Some(r), None) => {
                        tracing::info!(%key, namespace = %r.namespace, "{what} no longer recorded: nobody of its namespace claims it, or a reservation decides it")
                    }
                    (None, None) => {}
                }
            }
        }
        Ok(())
    }

    async fn persist(&self, book: &ClaimBook) -> Result<(), kube::Error> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(BTreeMap::from([(BOOK_LABEL.to_owned(), "true".to_owned())])),
                annotations: Some(BTreeMap::from([(
                    "k8s.tuna.am/description".to_owned(),
                    "Which namespace holds which public host and TCP endpoint, recorded by the tuna agent. Do not edit.".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(book.to_data()),
            ..ConfigMap::default()
        };
        let mut value = serde_json::to_value(&cm).unwrap_or_default();
        value["apiVersion"] = "v1".into();
        value["kind"] = "ConfigMap".into();
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(value),
            )
            .await?;
        Ok(())
    }
}

/// The holders earlier agents recorded in the annotations of Ingresses and
/// Tunnels (pure): per host, the namespace of the earliest record among
/// the objects that still name the host.
pub fn legacy_book(
    ingresses: &[std::sync::Arc<Ingress>],
    tunnels: &[std::sync::Arc<Tunnel>],
    base_domain: &str,
) -> ClaimBook {
    let mut book = ClaimBook::default();
    let mut note = |meta: &ObjectMeta, named: BTreeSet<String>| {
        let ns = meta.namespace.as_deref().unwrap_or("default");
        for (host, at) in recorded_claims(meta) {
            if !named.contains(&host) {
                continue;
            }
            let earlier = book.hosts.get(&host).is_none_or(|r: &Record| at < r.since);
            if earlier {
                book.hosts.insert(host, ClaimBook::held(ns, at));
            }
        }
    };
    for i in ingresses {
        note(&i.metadata, rule_hosts(i));
    }
    for t in tunnels {
        note(
            &t.metadata,
            tunnel_host(t, base_domain).into_iter().collect(),
        );
    }
    book
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_annotations_of_earlier_agents_are_carried_over_once() {
        let objects = |yaml: &str| -> Vec<Arc<Ingress>> {
            yaml.split("\n---\n")
                .map(|d| Arc::new(serde_saphyr::from_str(d).expect("manifest")))
                .collect()
        };
        let ingresses = objects(
            r#"
metadata:
  name: old
  namespace: team-a
  annotations: {k8s.tuna.am/hosts-claimed-at: '{"shop.example.com":"2026-02-01T00:00:00Z","gone.example.com":"2020-01-01T00:00:00Z"}'}
spec:
  rules: [{host: shop.example.com}]
---
metadata:
  name: first
  namespace: team-b
  annotations: {k8s.tuna.am/hosts-claimed-at: '{"shop.example.com":"2026-01-01T00:00:00Z"}'}
spec:
  rules: [{host: shop.example.com}]
"#,
        );
        let book = legacy_book(&ingresses, &[], "a.2na.am");
        // The earliest record wins; a record of a host the object no longer
        // names is not carried.
        assert_eq!(book.hosts.len(), 1, "{book:?}");
        assert_eq!(book.hosts["shop.example.com"].namespace, "team-b");
    }
}
