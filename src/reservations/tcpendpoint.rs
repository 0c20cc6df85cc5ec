//! TCPEndpoint: reserves a public TCP port at the edge under an alias.
//!
//! - observe: the TCPEndpoint and every TCPEndpoint (a reflector store) for
//!   duplicate aliases;
//! - desired ([`desired`], pure): the alias to reserve, or why not;
//! - apply: reserve (or adopt) at the edge; status (`port`, `address`,
//!   `adopted`, `Ready`) and events.
//!
//! The finalizer (shared with Domain) releases the port when the resource is
//! deleted, unless adopted or `reclaimPolicy: Retain`; a 404 releases it at once.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use tuna_agent::client::Reserved;
use tuna_crds::{ConditionStatus, TcpEndpoint, TcpEndpointStatus};
use tuna_protocol::api::{self, CreateTcpEndpoint};

use crate::Error;
use crate::edge::api::ErrorClass;
use crate::plan::service::ServiceIndex;
use crate::plan::{Inputs, Kind, ObjectRef, PlanOptions, Refusal, plan};
use crate::reconcile::kit::{self, Deletion, KitContext, Reconciler};
use crate::reconcile::{
    Context, RESERVATION_FINALIZER, apply_status, kept_because, ready, ready_of, reason_of,
    release_reservation, resync,
};

/// What to reserve for `endpoint`, given every TCPEndpoint (pure).
pub fn desired(
    endpoint: &TcpEndpoint,
    all: &[Arc<TcpEndpoint>],
) -> Result<CreateTcpEndpoint, Box<Refusal>> {
    let me = ObjectRef::of(Kind::TcpEndpoint, &endpoint.metadata);
    let inputs = Inputs {
        tcp_endpoints: all,
        ..Inputs::default()
    };
    let plan = plan(
        &inputs,
        &ServiceIndex::default(),
        &PlanOptions::cluster("unused"),
    );
    if let Some(refusal) = plan.refusals_of(&me).next() {
        return Err(Box::new(refusal.clone()));
    }
    Ok(CreateTcpEndpoint {
        alias: endpoint.spec.alias.clone(),
        port: None,
    })
}

/// The status after the edge answered (pure); adoption is decided once, as
/// for Domains.
pub fn status_after(
    endpoint: &TcpEndpoint,
    reserved: &Reserved<api::TcpEndpoint>,
) -> (TcpEndpointStatus, &'static str, String) {
    let previous = endpoint.status.clone().unwrap_or_default();
    let adopted = if previous.port.is_some() {
        previous.adopted
    } else {
        reserved.adopted
    };
    let (reason, message) = if adopted {
        (
            "Adopted",
            format!(
                "alias {} already existed in the account (port {}) and was adopted; the operator never releases it",
                reserved.object.alias, reserved.object.port
            ),
        )
    } else {
        (
            "Reserved",
            format!(
                "alias {} reserves {}",
                reserved.object.alias, reserved.object.address
            ),
        )
    };
    let status = TcpEndpointStatus {
        conditions: ready(
            &previous.conditions,
            ConditionStatus::True,
            reason,
            &message,
            endpoint.metadata.generation,
        ),
        observed_generation: endpoint.metadata.generation,
        port: Some(i32::from(reserved.object.port)),
        address: Some(reserved.object.address.clone()),
        adopted,
    };
    (status, reason, message)
}

fn previous_ready(endpoint: &TcpEndpoint) -> Option<Condition> {
    endpoint
        .status
        .as_ref()
        .and_then(|s| ready_of(&s.conditions).cloned())
}

async fn not_ready(
    api: &Api<TcpEndpoint>,
    endpoint: &TcpEndpoint,
    reason: &str,
    message: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let previous = endpoint.status.clone().unwrap_or_default();
    let was = previous_ready(endpoint);
    let status = TcpEndpointStatus {
        conditions: ready(
            &previous.conditions,
            ConditionStatus::False,
            reason,
            message,
            endpoint.metadata.generation,
        ),
        observed_generation: endpoint.metadata.generation,
        ..previous.clone()
    };
    apply_status(api, endpoint, endpoint.status.as_ref(), &status).await?;
    if was
        .as_ref()
        .is_none_or(|c| c.reason != reason || c.message != message)
    {
        ctx.event(
            endpoint,
            EventType::Warning,
            reason,
            "Reserve",
            message.to_owned(),
        )
        .await;
    }
    Ok(())
}

async fn apply(
    endpoint: Arc<TcpEndpoint>,
    ctx: &Context,
    store: &Store<TcpEndpoint>,
) -> Result<Action, Error> {
    let api: Api<TcpEndpoint> = Api::namespaced(
        ctx.client.clone(),
        endpoint.namespace().as_deref().unwrap_or("default"),
    );
    let request = match desired(&endpoint, &store.state()) {
        Ok(r) => r,
        Err(refusal) => {
            not_ready(
                &api,
                &endpoint,
                refusal.reason.as_str(),
                &refusal.message,
                ctx,
            )
            .await?;
            return Ok(resync(ctx.resync_interval));
        }
    };
    let reserved = match ctx.edge.ensure_tcp_endpoint(&request).await {
        Ok(r) => r,
        Err(e) => {
            return match e.class() {
                ErrorClass::NeedsChange | ErrorClass::Gone => {
                    not_ready(
                        &api,
                        &endpoint,
                        &reason_of(&e, "ReservationRefused"),
                        &e.edge_message(),
                        ctx,
                    )
                    .await?;
                    Ok(resync(ctx.resync_interval))
                }
                ErrorClass::Retryable | ErrorClass::RateLimited(_) => {
                    let ready_now = previous_ready(&endpoint).is_some_and(|c| c.status == "True");
                    if !ready_now {
                        not_ready(
                            &api,
                            &endpoint,
                            &reason_of(&e, "EdgeUnavailable"),
                            &format!("{e}; retrying with backoff"),
                            ctx,
                        )
                        .await?;
                    }
                    Err(e)
                }
            };
        }
    };
    let was = previous_ready(&endpoint);
    let (status, reason, message) = status_after(&endpoint, &reserved);
    apply_status(&api, &endpoint, endpoint.status.as_ref(), &status).await?;
    if was
        .as_ref()
        .is_none_or(|c| c.reason != reason || c.status != "True")
    {
        ctx.event(
            endpoint.as_ref(),
            EventType::Normal,
            reason,
            "Reserve",
            message,
        )
        .await;
    }
    Ok(resync(ctx.resync_interval))
}

async fn cleanup(endpoint: Arc<TcpEndpoint>, ctx: &Context) -> Result<Action, Error> {
    let status = endpoint.status.clone().unwrap_or_default();
    if status.port.is_none() {
        return Ok(Action::await_change());
    }
    let alias = &endpoint.spec.alias;
    let kept = kept_because(status.adopted, endpoint.spec.reclaim_policy);
    let what = format!("alias {alias}");
    release_reservation(
        ctx,
        endpoint.as_ref(),
        &what,
        kept,
        ctx.edge.delete_tcp_endpoint(alias),
    )
    .await
}

/// The TCPEndpoint reconciler: reservations released through
/// [`RESERVATION_FINALIZER`]; the kind's own store serves the cross-object
/// rules (duplicates, the oldest wins).
pub struct TcpEndpoints {
    ctx: Arc<Context>,
    store: Store<TcpEndpoint>,
}

impl Reconciler for TcpEndpoints {
    type Object = TcpEndpoint;
    const KIND: &'static str = "TCPEndpoint";
    const DELETION: Deletion = Deletion::Finalizer(RESERVATION_FINALIZER);

    fn kit(&self) -> KitContext<'_> {
        self.ctx.kit()
    }

    async fn apply(self: Arc<Self>, endpoint: Arc<TcpEndpoint>) -> Result<Action, Error> {
        apply(endpoint, &self.ctx, &self.store).await
    }

    async fn cleanup(self: Arc<Self>, endpoint: Arc<TcpEndpoint>) -> Result<Action, Error> {
        cleanup(endpoint, &self.ctx).await
    }
}

/// Runs the TCPEndpoint controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let controller = Controller::new(
        Api::<TcpEndpoint>::all(ctx.client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    kit::run(Arc::new(TcpEndpoints { ctx, store }), controller, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tuna_protocol::api::Timestamp;

    fn endpoint(yaml: &str) -> TcpEndpoint {
        serde_saphyr::from_str(yaml).expect("test TCPEndpoint")
    }

    #[test]
    fn duplicates_and_sticky_adoption() {
        let old = Arc::new(endpoint(
            "metadata: {name: a, namespace: one, creationTimestamp: '2026-01-01T00:00:00Z'}\nspec: {alias: pg}",
        ));
        let young = Arc::new(endpoint(
            "metadata: {name: b, namespace: two, creationTimestamp: '2026-02-01T00:00:00Z'}\nspec: {alias: pg}",
        ));
        let all = vec![old.clone(), young.clone()];
        assert_eq!(desired(&old, &all).unwrap().alias, "pg");
        assert_eq!(
            desired(&young, &all).unwrap_err().reason.as_str(),
            "DuplicateAlias"
        );
        let edge = api::TcpEndpoint {
            alias: "pg".into(),
            port: 30001,
            address: "edge.tuna.test:30001".into(),
            account: "a".into(),
            created_at: Timestamp(0),
        };
        let (status, reason, _) = status_after(
            &old,
            &Reserved {
                object: edge.clone(),
                adopted: true,
            },
        );
        assert!(status.adopted);
        assert_eq!(reason, "Adopted");
        assert_eq!(status.address.as_deref(), Some("edge.tuna.test:30001"));
        let mut ours = (*old).clone();
        ours.status = Some(TcpEndpointStatus {
            port: Some(30001),
            ..Default::default()
        });
        let (status, reason, _) = status_after(
            &ours,
            &Reserved {
                object: edge,
                adopted: true,
            },
        );
        assert!(!status.adopted);
        assert_eq!(reason, "Reserved");
    }
}
