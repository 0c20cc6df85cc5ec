//! The reconciler kit and the conventions every kind shares.
//!
//! [`kit`] holds the [`kit::Reconciler`] trait and [`kit::run`]: all five
//! kinds run on it (the families own their reconcilers):
//!
//! | kind | family | deletion | status | events |
//! |---|---|---|---|---|
//! | Tunnel | [`crate::agent::tunnel`] | forget: the tunnel stops, its token is revoked | `Ready`, `url`, by server-side apply | `TunnelConnected`/`TunnelStopped`, refusals as warnings |
//! | Ingress | [`crate::agent::ingress`] | forget: its hosts are planned again without it | `loadBalancer.ingress` hostnames, by server-side apply | `RoutesUpdated`, `RuleSkipped`/`BackendSkipped`, `TunnelConnected`/`TunnelStopped` per host |
//! | Domain | [`crate::reservations::domain`] | finalizer [`RESERVATION_FINALIZER`]: released unless adopted or `Retain` | `Ready`, `fqdn`, DNS records | the reservation's outcome (`Reserved`, `Adopted`, refusals), `Released`/`Retained`/`ReleaseFailed` |
//! | TCPEndpoint | [`crate::reservations::tcpendpoint`] | finalizer [`RESERVATION_FINALIZER`], the same | `Ready`, `port`, `url` | the same |
//! | Connector | [`crate::connectors::reconciler`] | forget: the proxy drops its target | per-check conditions, `Ready` | `Ready` turning, with the failing check's reason |
//!
//! ```text
//! observe (the object, reflector stores, Services by `get`)
//!   → desired state (the pure plan, crate::plan, table-tested)
//!   → apply (edge API calls, proxy registrations, status by server-side
//!     apply, events)
//! ```
//!
//! Shared conventions (this module):
//! - **Status** is written by server-side apply on the status subresource
//!   ([`apply_status`]), with a `Ready` condition in the `metav1.Condition`
//!   shape (`observedGeneration`, a CamelCase reason, a message a person can act
//!   on) and `status.observedGeneration`; an unchanged status is not written.
//! - **Events** go through kube's `Recorder` (`events.k8s.io/v1`: it creates,
//!   then patches repeats), shown by `kubectl describe`.
//! - **Errors**: [`Backoff`] gives each object its own exponential backoff
//!   with jitter, reset by a success; a 429 waits its `Retry-After`; a 4xx only
//!   a change can fix sets `Ready=False` with the edge's message and waits for
//!   a change of the object; 5xx and network errors back off. Every success
//!   requeues after the resync interval, so every object is re-checked.
//!
//! It knows the edge API's error classes and the metrics; it must not know a
//! family.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tuna_crds::{ConditionStatus, READY, set_condition};

use tuna_protocol::api::WhoAmI;

use crate::Error;
use crate::edge::api::{EdgeApi, ErrorClass};
use crate::metrics::Metrics;

pub mod kit;

/// Reconciles of one kind running at once: bounds the requests in flight to
/// the API server and the edge (and the connections they hold) when
/// thousands of objects arrive together.
pub const CONCURRENCY: u16 = 32;

/// The kube-runtime controller settings every kind uses.
pub fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(CONCURRENCY)
}

/// Waits until `store` is filled (false if its writer went away).
/// kube-runtime's `Store::wait_until_ready` keeps the waker of one waiter
/// only (a oneshot receiver behind a mutex), and a Controller waits on its
/// own store too: a second waiter may never be woken (the connectors role
/// never became ready). Asking again now and then reads the memoized answer.
pub async fn store_ready<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: Clone + kube::Resource + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(200), store.wait_until_ready()).await {
            Ok(result) => return result.is_ok(),
            Err(_) => continue,
        }
    }
}

/// Field manager of every status the operator writes.
pub const FIELD_MANAGER: &str = "tuna-operator";
/// `reportingController` of events (the `From` column of `kubectl describe`).
pub const REPORTER: &str = "tuna-operator";

/// Per-object exponential backoff with full jitter; kube-runtime has none built in.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// Delays start at `initial` and double up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a failure of `key` and returns how long to wait: uniform in
    /// [d/2, d] with d = min(initial·2^failures, max).
    pub fn fail(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().expect("backoff lock");
        let n = failures.entry(key.to_owned()).or_insert(0);
        let exp = self.initial.saturating_mul(1u32 << (*n).min(16));
        *n = n.saturating_add(1);
        jitter(exp.min(self.max))
    }

    /// Forgets the failures of `key` (it succeeded).
    pub fn reset(&self, key: &str) {
        self.failures.lock().expect("backoff lock").remove(key);
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .expect("backoff lock")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// Uniform in [d/2, d].
pub fn jitter(d: Duration) -> Duration {
    use rand::Rng;
    let half = d / 2;
    half + Duration::from_millis(rand::rng().random_range(0..=half.as_millis() as u64))
}

/// The resync requeue: the interval with up to 10 % jitter, so that objects
/// created together do not all come back at the same moment.
pub fn resync(interval: Duration) -> Action {
    use rand::Rng;
    let spread = interval.as_millis() as u64 / 10;
    Action::requeue(interval + Duration::from_millis(rand::rng().random_range(0..=spread)))
}

/// What every reconciler shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Publishes events as [`REPORTER`].
    pub recorder: Events,
    /// The edge's REST API (with the operator's key).
    pub edge: Arc<dyn EdgeApi>,
    /// Metrics of this process.
    pub metrics: Arc<Metrics>,
    /// Per-object backoff.
    pub backoff: Backoff,
    /// Who the key is at the edge (base domain, public host), asked once it
    /// answers: an edge that is down at start is reported on each object.
    edge_info: tokio::sync::OnceCell<WhoAmI>,
    /// Every object is re-checked this often.
    pub resync_interval: Duration,
    /// Unverified custom domains are re-checked this often.
    pub dns_recheck_interval: Duration,
}

impl Context {
    /// A context; `instance` names this process in events (the pod name).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        instance: Option<String>,
        edge: Arc<dyn EdgeApi>,
        metrics: Arc<Metrics>,
        resync_interval: Duration,
        dns_recheck_interval: Duration,
    ) -> Self {
        let recorder = Events::new(
            client.clone(),
            Reporter {
                controller: REPORTER.to_owned(),
                instance,
            },
        );
        Self {
            client,
            recorder,
            edge,
            metrics,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(300)),
            edge_info: tokio::sync::OnceCell::new(),
            resync_interval,
            dns_recheck_interval,
        }
    }

    /// The edge's account, base domain and public host (asked until it answers).
    pub async fn edge_info(&self) -> crate::Result<&WhoAmI> {
        self.edge_info
            .get_or_try_init(|| async {
                let who = self.edge.whoami().await?;
                tracing::info!(account = %who.account, base_domain = %who.base_domain, public_host = %who.public_host, "connected to the edge API");
                Ok(who)
            })
            .await
    }

    /// The edge's account, base domain and public host if it answered already.
    pub fn edge_info_now(&self) -> Option<&WhoAmI> {
        self.edge_info.get()
    }

    /// Publishes an event about `obj`; a failure is logged, never fatal.
    pub async fn event<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        publish_event(&self.recorder, obj, type_, reason, action, note).await;
    }

    /// Publishes the events a reconcile collected about `obj`, in order; a
    /// failure is logged, never fatal.
    pub async fn write_events<K>(&self, obj: &K, events: PendingEvents)
    where
        K: Resource<DynamicType = ()>,
    {
        for e in events.0 {
            publish_event(&self.recorder, obj, e.type_, e.reason, e.action, e.note).await;
        }
    }
}

/// The events one reconcile decided to publish, in order: collected while
/// it works out what happened, then written together by
/// [`Context::write_events`], so that a reconcile decides first and writes
/// once instead of stepping out to publish each event as it finds it.
#[derive(Default)]
pub struct PendingEvents(Vec<PendingEvent>);

struct PendingEvent {
    type_: EventType,
    reason: &'static str,
    action: &'static str,
    note: String,
}

impl PendingEvents {
    /// Adds an event to publish.
    pub fn push(
        &mut self,
        type_: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) {
        self.0.push(PendingEvent {
            type_,
            reason,
            action,
            note,
        });
    }
}

/// kube's event [`Recorder`], sharded by the object the events are about.
///
/// A `Recorder` keeps the events it published in the last minutes, to fold
/// repeats into a series; kube-runtime 5's `publish` sweeps that whole cache
/// on every call, under its write lock. One recorder for a process made N
/// events cost O(N²): at 10 000 Tunnels the sweep was the agent's busiest
/// function, and every reconcile in flight queued on the lock. An event's key
/// names the object it is about, so events of one object never fold with
/// another's: a shard per object hash keeps every series exactly as one
/// recorder would, and each sweep sees a 1/[`Self::SHARDS`] of the cache.
#[derive(Clone)]
pub struct Events {
    shards: Arc<[Recorder]>,
}

impl Events {
    /// How many recorders the events are spread over.
    pub const SHARDS: usize = 64;

    /// Recorders publishing as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            shards: (0..Self::SHARDS)
                .map(|_| Recorder::new(client.clone(), reporter.clone()))
                .collect(),
        }
    }

    /// The shard of the object `reference` names (stable for an object).
    fn shard(reference: &ObjectReference) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&reference.namespace, &reference.name, &reference.uid).hash(&mut h);
        (h.finish() % Self::SHARDS as u64) as usize
    }

    /// Publishes `event` about the object `reference` names (see
    /// [`Recorder::publish`]).
    pub async fn publish(
        &self,
        event: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.shards[Self::shard(reference)]
            .publish(event, reference)
            .await
    }
}

/// Publishes an event about `obj` with `recorder`; a failure is logged, never fatal.
pub async fn publish_event<K>(
    recorder: &Events,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) where
    K: Resource<DynamicType = ()>,
{
    // kube's Recorder (like client-go's) folds events of one (type,
    // reason, action) into a series that keeps the first note; the action
    // carries a digest of the note so that a different message is a new
    // event and only true repeats count up.
    let note = truncate(note, 1024);
    let digest = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        note.hash(&mut h);
        h.finish() as u32
    };
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: format!("{action}-{digest:08x}"),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &obj.object_ref(&())).await {
        tracing::warn!(object = %obj.name_any(), reason, error = %e, "could not publish an event");
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// The finalizer of the reserving kinds (Domain, TCPEndpoint): the
/// reservation is released (or kept) before the object goes.
pub const RESERVATION_FINALIZER: &str = "k8s.tuna.am/reservation";

/// Why a deleted object's reservation stays at the edge, if it does.
pub fn kept_because(adopted: bool, policy: tuna_crds::ReclaimPolicy) -> Option<&'static str> {
    if adopted {
        Some("it was adopted")
    } else if policy == tuna_crds::ReclaimPolicy::Retain {
        Some("reclaimPolicy is Retain")
    } else {
        None
    }
}

/// The cleanup of a reserving kind: `what` (e.g. `alias pg`) stays reserved
/// when `kept` says why, else `delete` releases it (gone counts as
/// released); an event either way, and a failure retries with backoff.
pub async fn release_reservation<K>(
    ctx: &Context,
    obj: &K,
    what: &str,
    kept: Option<&str>,
    delete: impl std::future::Future<Output = crate::Result<()>>,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()>,
{
    if let Some(why) = kept {
        let note = format!("{what} stays reserved at the edge: {why}");
        ctx.event(obj, EventType::Normal, "Retained", "Release", note)
            .await;
        return Ok(Action::await_change());
    }
    match crate::edge::api::gone_is_ok(delete.await) {
        Ok(()) => {
            let note = format!("{what} was released at the edge");
            ctx.event(obj, EventType::Normal, "Released", "Release", note)
                .await;
            Ok(Action::await_change())
        }
        Err(e) => {
            let note = format!(
                "{e}; retrying with backoff (to give up, remove the finalizer {RESERVATION_FINALIZER}: see the README)"
            );
            ctx.event(obj, EventType::Warning, "ReleaseFailed", "Release", note)
                .await;
            Err(e)
        }
    }
}

/// The object's key for backoff and logs: `namespace/name`.
pub fn key_of<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        obj.meta().name.as_deref().unwrap_or("")
    )
}

/// The kube-runtime error policy of every kind: see the module docs. (A
/// needs-change error has already set `Ready=False`; it waits for a change of
/// the object, with the resync as a safety net.)
pub fn error_policy<K: Resource>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    let kind = std::any::type_name::<K>()
        .rsplit("::")
        .next()
        .unwrap_or("?");
    error_policy_with(
        kind,
        &key_of(obj.as_ref()),
        error,
        &ctx.metrics,
        &ctx.backoff,
        ctx.resync_interval,
    )
}

/// The error policy by class, for `kind`'s object `key`.
pub fn error_policy_with(
    kind: &str,
    key: &str,
    error: &Error,
    metrics: &Metrics,
    backoff: &Backoff,
    resync_interval: Duration,
) -> Action {
    metrics.reconcile_error(kind);
    match error.class() {
        ErrorClass::RateLimited(after) => {
            tracing::info!(object = %key, ?after, "edge rate limit: waiting Retry-After");
            Action::requeue(after)
        }
        ErrorClass::NeedsChange => {
            tracing::info!(object = %key, %error, "waiting for a change");
            resync(resync_interval)
        }
        ErrorClass::Retryable | ErrorClass::Gone => {
            let delay = backoff.fail(key);
            tracing::warn!(object = %key, %error, ?delay, "reconcile failed; backing off");
            Action::requeue(delay)
        }
    }
}

/// A `Ready` condition list with one condition set (transition time kept
/// unless the status flips).
pub fn ready(
    previous: &[Condition],
    status: ConditionStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Vec<Condition> {
    let mut conditions = previous.to_vec();
    set_condition(
        &mut conditions,
        READY,
        status,
        reason,
        message,
        generation,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    conditions
}

/// The `Ready` condition of a list, if any.
pub fn ready_of(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == READY)
}

/// Writes `status` by server-side apply on the status subresource, unless it
/// equals `current` (no write, no watch event).
pub async fn apply_status<K, S>(
    api: &Api<K>,
    obj: &K,
    current: Option<&S>,
    status: &S,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// A CamelCase reason from an edge error code (`held_by_other_account` →
/// `HeldByOtherAccount`), or `fallback`.
pub fn reason_of(error: &crate::Error, fallback: &str) -> String {
    match error.code() {
        Some(code) => code
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                match c.next() {
                    Some(first) => first.to_ascii_uppercase().to_string() + c.as_str(),
                    None => String::new(),
                }
            })
            .collect(),
        None => fallback.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    /// Events of one object land in one shard (their series fold as with
    /// one recorder); objects spread over the shards.
    #[test]
    fn events_of_one_object_share_a_shard_and_objects_spread() {
        use k8s_openapi::api::core::v1::ObjectReference;
        let reference = |ns: &str, name: &str| ObjectReference {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{ns}-{name}")),
            ..Default::default()
        };
        let a = reference("shop", "web");
        let again = ObjectReference {
            resource_version: Some("42".into()),
            ..a.clone()
        };
        assert_eq!(super::Events::shard(&a), super::Events::shard(&again));
        let used: std::collections::BTreeSet<usize> = (0..1000)
            .map(|i| super::Events::shard(&reference("ns", &format!("t{i}"))))
            .collect();
        assert!(used.len() > super::Events::SHARDS / 2, "{used:?}");
    }

    use super::*;

    /// kube-runtime wakes only the last waiter of a store; ours must still
    /// be answered when another waiter (a Controller) polled after it.
    #[tokio::test]
    async fn store_ready_is_answered_when_another_waiter_polled_last() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::{reflector, watcher};
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        let ours = tokio::spawn({
            let reader = reader.clone();
            async move { store_ready(&reader).await }
        });
        tokio::task::yield_now().await; // ours polls first
        let mut other = Box::pin(reader.wait_until_ready());
        assert!(futures::poll!(&mut other).is_pending());
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let answered = tokio::time::timeout(Duration::from_secs(10), ours).await;
        assert!(matches!(answered, Ok(Ok(true))), "{answered:?}");
    }

    #[test]
    fn backoff_grows_per_object_and_resets() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let first = b.fail("a");
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        for _ in 0..10 {
            b.fail("a");
        }
        let capped = b.fail("a");
        assert!(capped >= Duration::from_millis(500) && capped <= Duration::from_secs(1));
        assert_eq!(b.failures("b"), 0, "other objects are not affected");
        b.reset("a");
        assert_eq!(b.failures("a"), 0);
    }

    #[test]
    fn reasons_from_edge_codes() {
        let e = Error::edge(
            "x",
            tuna_agent::Error::ApiForbidden {
                code: "held_by_other_account".into(),
                message: "m".into(),
            },
        );
        assert_eq!(reason_of(&e, "EdgeError"), "HeldByOtherAccount");
        let t = Error::edge(
            "x",
            tuna_agent::Error::ApiTransient {
                message: "down".into(),
                status: None,
            },
        );
        assert_eq!(reason_of(&t, "EdgeUnavailable"), "EdgeUnavailable");
    }
}
