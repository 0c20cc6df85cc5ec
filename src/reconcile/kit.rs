//! The reconciler kit: one trait every kind implements and one [`run`] that
//! drives it, in the spirit of Pingora's `ProxyHttp` — the kind writes
//! [`Reconciler::apply`] and overrides a hook where it differs; the kit owns
//! the rest, the same for all five kinds:
//!
//! - the kube-runtime `Controller` settings ([`super::controller_config`]:
//!   the concurrency limit), graceful shutdown, and the extra watches and
//!   triggers a kind adds to the `Controller` it hands in;
//! - deletion ([`Deletion`]): a finalizer that holds the object until
//!   [`Reconciler::cleanup`] succeeds, or forgetting what was published once
//!   the object is gone ([`Reconciler::forget`]);
//! - timing every reconcile into the metrics, resetting the object's backoff
//!   after a success, and the error policy by error class
//!   ([`super::error_policy`]: rate limited → `Retry-After`, needs a spec
//!   change → the resync, retryable → per-object exponential backoff).
//!
//! Status is the kind's (written with [`super::apply_status`], server-side
//! apply on the status subresource), and so are its events
//! ([`super::publish_event`]): what a person reads depends on the kind.
//!
//! This module knows kube-runtime and the metrics; it must not know any kind.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::Api;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Error as ControllerError};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Backoff, Context, controller_config, error_policy_with, key_of};
use crate::Error;
use crate::metrics::{Metrics, ReconcileTimer};

/// How a kind's deleted objects are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The finalizer of this name holds the object until
    /// [`Reconciler::cleanup`] succeeds: for what outlives the process at the
    /// edge (reservations of names and ports).
    Finalizer(&'static str),
    /// No finalizer: once the object is gone, [`Reconciler::forget`] drops
    /// what this process published for it (tunnels, routes, proxy targets:
    /// the process that holds them is the only place they live).
    Forget,
}

/// One kind's reconciler. `apply` is required; every other hook has a default.
pub trait Reconciler: Send + Sync + 'static {
    /// The kind reconciled.
    type Object: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + Send
        + Sync
        + 'static;

    /// The kind's name in metrics and logs (`Tunnel`, `TCPEndpoint`, …).
    const KIND: &'static str;

    /// How deleted objects are handled.
    const DELETION: Deletion;

    /// The parts of the context the kit uses.
    fn kit(&self) -> KitContext<'_>;

    /// Makes the world match `obj` (edge, proxy, status, events); the action
    /// says when to look again (usually [`super::resync`]).
    fn apply(
        self: Arc<Self>,
        obj: Arc<Self::Object>,
    ) -> impl Future<Output = Result<Action, Error>> + Send;

    /// [`Deletion::Finalizer`]: releases what `obj` holds before it goes; the
    /// finalizer is removed once this succeeds.
    fn cleanup(
        self: Arc<Self>,
        obj: Arc<Self::Object>,
    ) -> impl Future<Output = Result<Action, Error>> + Send {
        let _ = obj;
        async { Ok(Action::await_change()) }
    }

    /// [`Deletion::Forget`]: the object `namespace/name` is gone.
    fn forget(self: Arc<Self>, namespace: String, name: String) -> impl Future<Output = ()> + Send {
        let _ = (namespace, name);
        async {}
    }
}

/// What the kit needs of a reconciler's context.
#[derive(Clone, Copy)]
pub struct KitContext<'a> {
    /// The Kubernetes client (the finalizer's patches).
    pub client: &'a Client,
    /// Reconcile timings and errors go here.
    pub metrics: &'a Metrics,
    /// Per-object backoff of the retryable errors.
    pub backoff: &'a Backoff,
    /// A needs-change error waits for a change, with this as a safety net.
    pub resync_interval: Duration,
}

// Here rather than beside `Context`: the kit stands above the conventions it
// runs on, and only it knows what of the context it needs.
impl Context {
    /// The parts of this context the reconciler kit uses.
    pub fn kit(&self) -> KitContext<'_> {
        KitContext {
            client: &self.client,
            metrics: &self.metrics,
            backoff: &self.backoff,
            resync_interval: self.resync_interval,
        }
    }
}

/// Runs `controller` (built by the kind, with its own watches and triggers)
/// with `reconciler` until `shutdown` resolves.
pub async fn run<R: Reconciler>(
    reconciler: Arc<R>,
    controller: Controller<R::Object>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) where
    R::Object: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let forgetter = Arc::clone(&reconciler);
    controller
        .with_config(controller_config())
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<R>, policy::<R>, reconciler)
        .for_each(move |result| {
            let forgetter = Arc::clone(&forgetter);
            async move {
                match result {
                    Ok(_) => {}
                    Err(ControllerError::ObjectNotFound(obj))
                        if R::DELETION == Deletion::Forget =>
                    {
                        let namespace = obj.namespace.unwrap_or_else(|| "default".to_owned());
                        forgetter.forget(namespace, obj.name).await;
                    }
                    Err(e) => tracing::debug!(error = %e, kind = R::KIND, "controller"),
                }
            }
        })
        .await;
}

/// One reconcile: timed, through the finalizer when the kind has one, the
/// backoff reset on success.
async fn reconcile<R: Reconciler>(obj: Arc<R::Object>, reconciler: Arc<R>) -> Result<Action, Error>
where
    R::Object: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let key = key_of(obj.as_ref());
    let timer = ReconcileTimer::start(reconciler.kit().metrics, R::KIND);
    let result = match R::DELETION {
        Deletion::Forget => Arc::clone(&reconciler).apply(obj).await,
        Deletion::Finalizer(name) => {
            let client = reconciler.kit().client.clone();
            let api: Api<R::Object> =
                Api::namespaced(client, obj.namespace().as_deref().unwrap_or("default"));
            let r = Arc::clone(&reconciler);
            finalizer(&api, name, obj, |event| async move {
                match event {
                    Finalizer::Apply(o) => r.apply(o).await,
                    Finalizer::Cleanup(o) => r.cleanup(o).await,
                }
            })
            .await
            .map_err(|e| Error::Finalizer(Box::new(e)))
        }
    };
    timer.finish(result.is_ok());
    if result.is_ok() {
        reconciler.kit().backoff.reset(&key);
    }
    result
}

fn policy<R: Reconciler>(obj: Arc<R::Object>, error: &Error, reconciler: Arc<R>) -> Action {
    let kit = reconciler.kit();
    error_policy_with(
        R::KIND,
        &key_of(obj.as_ref()),
        error,
        kit.metrics,
        kit.backoff,
        kit.resync_interval,
    )
}
