//! Who holds each public host and each TCP endpoint: **one decision, over the
//! claims of every kind** (Tunnel, Ingress, HTTPRoute for hosts; tcp Tunnel
//! and TCPRoute for TCP endpoints), made here and nowhere else.
//!
//! A host (or a TCP endpoint) belongs to **one namespace**:
//!
//! 1. the namespace of the `Domain` that reserves the host (of the
//!    `TCPEndpoint` that declares the alias, or whose reserved port it is);
//! 2. else the namespace the agent **recorded** as its holder in the
//!    [`ClaimBook`], as long as that namespace still claims it (with the
//!    strongest kind of claim present, see 3);
//! 3. else its first claimant's: an **explicit** claim (a name: an Ingress
//!    rule's host, a Tunnel's subdomain, an HTTPRoute hostname, a port or an
//!    alias) always beats a **covering** one (an HTTPRoute wildcard, or no
//!    hostname at all), and among claims of one strength the oldest object
//!    wins (`creationTimestamp`, then namespace, then name).
//!
//! The record is what keeps a host where it is: once a namespace holds a
//! host, an older object of another namespace that names it later does not
//! take it (editing an old object is not "claiming first"), and neither does
//! anyone while the holder's objects are briefly not serving (a Service
//! deleted for a redeploy): a claim is an object that *names* the host, not
//! one that serves it. The record is written by the agent alone, in a
//! ConfigMap of its own namespace that no tenant can write
//! ([`ClaimBook::to_data`]); nothing a tenant writes on its objects is read.
//!
//! Which kind serves a host *inside* its namespace is decided afterwards by
//! the kinds' own rules (a Tunnel before Ingresses before HTTPRoutes); kinds
//! never outrank namespaces.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tuna_operator::plan::claims::{Claim, ClaimBook, Strength, settle};
//!
//! let claims = [
//!     Claim::new("shop.example.com", "team-a", "HTTPRoute/steal", 100, Strength::Explicit),
//!     Claim::new("shop.example.com", "team-b", "HTTPRoute/shop", 200, Strength::Explicit),
//! ];
//! // team-b served it first and the agent recorded it: the older object of
//! // team-a that names the host later does not take it.
//! let mut book = ClaimBook::default();
//! book.hosts.insert("shop.example.com".into(), ClaimBook::held("team-b", 150));
//! let owners = settle(&claims, &BTreeMap::new(), &book.hosts);
//! assert_eq!(owners["shop.example.com"].namespace, "team-b");
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// How a claim names what it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Strength {
    /// By name: a host, a subdomain, a port or an alias.
    Explicit,
    /// By a wildcard hostname, or by naming no hostname at all.
    Covering,
}

/// One object's claim on a host or a TCP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The host (lower case) or the TCP endpoint key ([`tcp_key`]).
    pub key: String,
    /// The claiming object's namespace.
    pub namespace: String,
    /// `Kind/name` of the claiming object (messages, ties).
    pub object: String,
    /// The object's `creationTimestamp` (Unix seconds; `i64::MAX` unknown).
    pub created: i64,
    /// Explicit or covering.
    pub strength: Strength,
}

impl Claim {
    /// A claim from parts.
    pub fn new(
        key: impl Into<String>,
        namespace: impl Into<String>,
        object: impl Into<String>,
        created: i64,
        strength: Strength,
    ) -> Self {
        Self {
            key: key.into(),
            namespace: namespace.into(),
            object: object.into(),
            created,
            strength,
        }
    }
}

/// Why a namespace holds a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// A Domain (hosts) or a TCPEndpoint (TCP) of the namespace reserves it.
    Reserved,
    /// The agent recorded the namespace as its holder (Unix seconds since).
    Recorded(i64),
    /// Its first claimant (`Kind/name`) is of the namespace; nothing recorded yet.
    FirstClaimant(String),
}

/// The holder of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The namespace that holds it.
    pub namespace: String,
    /// Why.
    pub held: Held,
}

impl Owner {
    /// Why, in words, for the message of a refusal ("belongs to namespace
    /// "team-b", …"). Names no object of the holder's namespace.
    pub fn why(&self) -> &'static str {
        match self.held {
            Held::Reserved => "which reserves it",
            Held::Recorded(_) => "which has held it since before this claim",
            Held::FirstClaimant(_) => "whose claim is the oldest",
        }
    }
}

/// A recorded holder: its namespace and since when (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The namespace holding the key.
    pub namespace: String,
    /// When the agent first recorded it (Unix seconds).
    pub since: i64,
}

/// The agent's record of who holds what (see the module docs): host → its
/// holder, TCP endpoint key ([`tcp_key`]) → its holder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimBook {
    /// Hosts (lower case).
    pub hosts: BTreeMap<String, Record>,
    /// TCP endpoints: a port number in decimal, or an alias.
    pub tcp: BTreeMap<String, Record>,
}

/// The data keys of the ConfigMap that holds a [`ClaimBook`].
pub const HOSTS_KEY: &str = "hosts.json";
/// See [`HOSTS_KEY`].
pub const TCP_KEY: &str = "tcp.json";
/// The label that marks the ConfigMap holding the agent's [`ClaimBook`]
/// (`route explain` finds it by this label).
pub const BOOK_LABEL: &str = "k8s.tuna.am/claims";

impl ClaimBook {
    /// A record from parts.
    pub fn held(namespace: &str, since: i64) -> Record {
        Record {
            namespace: namespace.to_owned(),
            since,
        }
    }

    /// The book from a ConfigMap's `data` (missing or unreadable keys are
    /// empty: the claims are then decided by age, as before any record).
    pub fn from_data(data: &BTreeMap<String, String>) -> Self {
        let read = |key: &str| {
            data.get(key)
                .and_then(|raw| serde_json::from_str(raw).ok())
                .unwrap_or_default()
        };
        Self {
            hosts: read(HOSTS_KEY),
            tcp: read(TCP_KEY),
        }
    }

    /// The ConfigMap `data` of the book.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let write = |map: &BTreeMap<String, Record>| {
            serde_json::to_string(map).unwrap_or_else(|_| "{}".into())
        };
        BTreeMap::from([
            (HOSTS_KEY.to_owned(), write(&self.hosts)),
            (TCP_KEY.to_owned(), write(&self.tcp)),
        ])
    }

    /// Takes the decisions of a plan into the book, for the `hosts` (and
    /// `tcp` keys) the plan decided with every claimant in view: a holder
    /// decided by claims is recorded (keeping its time when it is the
    /// recorded one); a key reserved by a Domain or TCPEndpoint is dropped
    /// (the reservation decides); a key no claim counted for keeps its record
    /// while the recorded namespace still names it (its claim may not count
    /// for a moment — the account's hosts not yet listed — and must not be
    /// lost for that), else it is dropped. Keys outside the sets are left as
    /// they are. Returns whether anything changed.
    pub fn absorb(
        &mut self,
        hosts: &BTreeSet<String>,
        tcp: &BTreeSet<String>,
        decided: &Decided<'_>,
        now: i64,
    ) -> bool {
        let before = self.clone();
        absorb_into(
            &mut self.hosts,
            hosts,
            decided.host_owners,
            decided.host_names,
            now,
        );
        absorb_into(
            &mut self.tcp,
            tcp,
            decided.tcp_owners,
            decided.tcp_names,
            now,
        );
        *self != before
    }
}

/// What a plan decided, as [`ClaimBook::absorb`] reads it.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'a> {
    /// The holder of each claimed host.
    pub host_owners: &'a BTreeMap<String, Owner>,
    /// The namespaces that name each host (every kind, reserved or not).
    pub host_names: &'a BTreeMap<String, BTreeSet<String>>,
    /// The holder of each claimed TCP endpoint.
    pub tcp_owners: &'a BTreeMap<String, Owner>,
    /// The namespaces that name each TCP endpoint.
    pub tcp_names: &'a BTreeMap<String, BTreeSet<String>>,
}

fn absorb_into(
    book: &mut BTreeMap<String, Record>,
    keys: &BTreeSet<String>,
    owners: &BTreeMap<String, Owner>,
    names: &BTreeMap<String, BTreeSet<String>>,
    now: i64,
) {
    for key in keys {
        match owners.get(key) {
            Some(Owner {
                namespace,
                held: Held::Recorded(_) | Held::FirstClaimant(_),
            }) => {
                let keep = book.get(key).is_some_and(|r| &r.namespace == namespace);
                if !keep {
                    book.insert(key.clone(), ClaimBook::held(namespace, now));
                }
            }
            Some(Owner {
                held: Held::Reserved,
                ..
            }) => {
                book.remove(key);
            }
            None => {
                let still_named = book
                    .get(key)
                    .is_some_and(|r| names.get(key).is_some_and(|n| n.contains(&r.namespace)));
                if !still_named {
                    book.remove(key);
                }
            }
        }
    }
}

/// The key of a TCP endpoint: a port number in decimal (an all-digit alias
/// *is* a port, wherever it comes from: `portOrAlias: 30001`, `"30001"`, a
/// Gateway listener named `30001`), else the alias.
pub fn tcp_key(port_or_alias: &str) -> String {
    match port_or_alias.parse::<u16>() {
        Ok(port) if port_or_alias.bytes().all(|b| b.is_ascii_digit()) => port.to_string(),
        _ => port_or_alias.to_owned(),
    }
}

/// Settles the holder of every key the `claims` name (see the module docs).
/// `reserved` maps keys to the namespace of the Domain or TCPEndpoint that
/// reserves them; `book` holds the recorded holders.
pub fn settle(
    claims: &[Claim],
    reserved: &BTreeMap<String, String>,
    book: &BTreeMap<String, Record>,
) -> BTreeMap<String, Owner> {
    let mut by_key: BTreeMap<&str, Vec<&Claim>> = BTreeMap::new();
    for c in claims {
        by_key.entry(c.key.as_str()).or_default().push(c);
    }
    by_key
        .into_iter()
        .map(|(key, list)| (key.to_owned(), decide(key, &list, reserved, book)))
        .collect()
}

fn decide(
    key: &str,
    list: &[&Claim],
    reserved: &BTreeMap<String, String>,
    book: &BTreeMap<String, Record>,
) -> Owner {
    if let Some(ns) = reserved.get(key) {
        return Owner {
            namespace: ns.clone(),
            held: Held::Reserved,
        };
    }
    // Covering claims count only where nobody names the key.
    let strongest = list
        .iter()
        .map(|c| c.strength)
        .min()
        .unwrap_or(Strength::Covering);
    let candidates = list.iter().filter(|c| c.strength == strongest);
    if let Some(record) = book.get(key)
        && candidates.clone().any(|c| c.namespace == record.namespace)
    {
        return Owner {
            namespace: record.namespace.clone(),
            held: Held::Recorded(record.since),
        };
    }
    let first = candidates
        .min_by(|a, b| {
            (a.created, &a.namespace, &a.object).cmp(&(b.created, &b.namespace, &b.object))
        })
        .expect("a key has at least one claim");
    Owner {
        namespace: first.namespace.clone(),
        held: Held::FirstClaimant(first.object.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, ns: &str, object: &str, created: i64, strength: Strength) -> Claim {
        Claim::new(key, ns, object, created, strength)
    }

    fn book(entries: &[(&str, &str, i64)]) -> BTreeMap<String, Record> {
        entries
            .iter()
            .map(|(k, ns, t)| ((*k).to_owned(), ClaimBook::held(ns, *t)))
            .collect()
    }

    const H: &str = "shop.example.com";
    use Strength::{Covering, Explicit};

    #[test]
    fn the_holder_of_a_key_by_table() {
        // (case, claims, reserved, book, holder)
        #[allow(clippy::type_complexity)]
        let cases: &[(
            &str,
            Vec<Claim>,
            &[(&str, &str)],
            &[(&str, &str, i64)],
            &str,
        )] = &[
            (
                "the oldest claimant without a record",
                vec![
                    claim(H, "team-b", "Ingress/b", 200, Explicit),
                    claim(H, "team-a", "HTTPRoute/a", 100, Explicit),
                ],
                &[],
                &[],
                "team-a",
            ),
            (
                "a record beats an older object that names the host later (1b)",
                vec![
                    claim(H, "team-a", "HTTPRoute/old", 100, Explicit),
                    claim(H, "team-b", "HTTPRoute/shop", 200, Explicit),
                ],
                &[],
                &[(H, "team-b", 250)],
                "team-b",
            ),
            (
                "a record holds against every kind (2: an Ingress does not outrank)",
                vec![
                    claim(H, "team-a", "Ingress/steal", 100, Explicit),
                    claim(H, "team-a", "Tunnel/steal", 90, Explicit),
                    claim(H, "team-b", "HTTPRoute/shop", 200, Explicit),
                ],
                &[],
                &[(H, "team-b", 250)],
                "team-b",
            ),
            (
                "a Domain's namespace holds whatever is recorded",
                vec![claim(H, "team-b", "HTTPRoute/shop", 200, Explicit)],
                &[(H, "team-a")],
                &[(H, "team-b", 250)],
                "team-a",
            ),
            (
                "a covering claim never beats an explicit one, however old (1c)",
                vec![
                    claim(H, "team-a", "HTTPRoute/any", 1, Covering),
                    claim(H, "team-b", "HTTPRoute/shop", 200, Explicit),
                ],
                &[],
                &[],
                "team-b",
            ),
            (
                "nor when it is recorded: a record counts with the strongest claims only",
                vec![
                    claim(H, "team-a", "HTTPRoute/any", 1, Covering),
                    claim(H, "team-b", "HTTPRoute/shop", 200, Explicit),
                ],
                &[],
                &[(H, "team-a", 5)],
                "team-b",
            ),
            (
                "covering claims alone: the recorded namespace keeps it",
                vec![
                    claim(H, "team-a", "HTTPRoute/any", 1, Covering),
                    claim(H, "team-b", "HTTPRoute/all", 200, Covering),
                ],
                &[],
                &[(H, "team-b", 300)],
                "team-b",
            ),
            (
                "a record whose namespace no longer claims is void",
                vec![
                    claim(H, "team-a", "Ingress/a", 300, Explicit),
                    claim(H, "team-c", "Ingress/c", 200, Explicit),
                ],
                &[],
                &[(H, "team-b", 5)],
                "team-c",
            ),
            (
                "ties go by namespace, then object",
                vec![
                    claim(H, "team-b", "Ingress/a", 100, Explicit),
                    claim(H, "team-a", "Ingress/z", 100, Explicit),
                ],
                &[],
                &[],
                "team-a",
            ),
        ];
        for (case, claims, reserved, recorded, holder) in cases {
            let reserved: BTreeMap<String, String> = reserved
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let owners = settle(claims, &reserved, &book(recorded));
            assert_eq!(owners[H].namespace, *holder, "{case}");
        }
    }

    #[test]
    fn absorbing_records_claim_holders_keeps_times_and_drops_the_rest() {
        let mut b = ClaimBook::default();
        b.hosts
            .insert("kept.example".into(), ClaimBook::held("team-b", 10));
        b.hosts
            .insert("moved.example".into(), ClaimBook::held("team-b", 10));
        b.hosts
            .insert("gone.example".into(), ClaimBook::held("team-b", 10));
        b.hosts
            .insert("domain.example".into(), ClaimBook::held("team-b", 10));
        b.hosts
            .insert("elsewhere.example".into(), ClaimBook::held("team-z", 10));
        let owner = |ns: &str, held: Held| Owner {
            namespace: ns.into(),
            held,
        };
        let owners = BTreeMap::from([
            (
                "kept.example".to_owned(),
                owner("team-b", Held::Recorded(10)),
            ),
            (
                "moved.example".to_owned(),
                owner("team-a", Held::FirstClaimant("Ingress/a".into())),
            ),
            (
                "new.example".to_owned(),
                owner("team-c", Held::FirstClaimant("Tunnel/c".into())),
            ),
            ("domain.example".to_owned(), owner("team-d", Held::Reserved)),
        ]);
        let planned: BTreeSet<String> = [
            "kept.example",
            "moved.example",
            "new.example",
            "gone.example",
            "domain.example",
        ]
        .map(String::from)
        .into();
        // `kept-named.example`: no claim counted now (its host is not listed
        // as reserved for a moment), but team-b still names it: kept.
        b.hosts
            .insert("kept-named.example".into(), ClaimBook::held("team-b", 10));
        let mut planned = planned;
        planned.insert("kept-named.example".into());
        let names = BTreeMap::from([(
            "kept-named.example".to_owned(),
            BTreeSet::from(["team-b".to_owned()]),
        )]);
        let (none, no_names) = (BTreeMap::new(), BTreeMap::new());
        let absorb = |b: &mut ClaimBook, owners: &BTreeMap<String, Owner>, now| {
            let d = Decided {
                host_owners: owners,
                host_names: &names,
                tcp_owners: &none,
                tcp_names: &no_names,
            };
            b.absorb(&planned, &BTreeSet::new(), &d, now)
        };
        assert!(absorb(&mut b, &owners, 99));
        let expect = book(&[
            ("kept.example", "team-b", 10),
            ("kept-named.example", "team-b", 10),
            ("moved.example", "team-a", 99),
            ("new.example", "team-c", 99),
            ("elsewhere.example", "team-z", 10),
        ]);
        assert_eq!(b.hosts, expect);
        // The same decisions again change nothing.
        let again = owners
            .into_iter()
            .map(|(k, mut o)| {
                if let Held::FirstClaimant(_) = o.held {
                    o.held = Held::Recorded(99);
                }
                (k, o)
            })
            .collect();
        assert!(!absorb(&mut b, &again, 200));
    }

    #[test]
    fn the_book_survives_its_configmap_and_ignores_what_does_not_parse() {
        let mut b = ClaimBook::default();
        b.hosts
            .insert(H.into(), ClaimBook::held("team-b", 1_700_000_000));
        b.tcp
            .insert("30001".into(), ClaimBook::held("team-b", 1_700_000_001));
        assert_eq!(ClaimBook::from_data(&b.to_data()), b);
        let broken = BTreeMap::from([(HOSTS_KEY.to_owned(), "not json".to_owned())]);
        assert_eq!(ClaimBook::from_data(&broken), ClaimBook::default());
    }

    #[test]
    fn an_all_digit_alias_is_a_port() {
        assert_eq!(tcp_key("30001"), "30001");
        assert_eq!(tcp_key("030001"), "30001"); // the same port, however written
        assert_eq!(tcp_key("pg"), "pg");
        assert_eq!(tcp_key("99999"), "99999"); // not a port: stays an (invalid) alias
    }
}
