//! Domain: reserves `<subdomain>.<base domain>` or a custom domain at the edge.
//!
//! - observe: the Domain, and every Domain of the cluster (a reflector store)
//!   for duplicates;
//! - desired ([`desired`], pure): the reservation to hold, or why not
//!   (invalid spec, `DuplicateDomain` — the oldest Domain of a host wins);
//! - apply: reserve (or adopt) at the edge; for a custom domain, ask the edge
//!   to verify its DNS records until it is verified, every
//!   `--dns-recheck-interval`; status (`fqdn`, `dnsRecords`, `adopted`,
//!   `Ready`) and events.
//!
//! The finalizer releases the reservation when the Domain is deleted, unless
//! it was adopted (it existed before: made by hand, or by another cluster) or
//! `reclaimPolicy: Retain`. A reservation already gone (404) releases the
//! finalizer at once, so uninstalling never hangs on the edge.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use tuna_agent::client::Reserved;
use tuna_crds::{ConditionStatus, DnsRecord, Domain, DomainStatus};
use tuna_protocol::api::{self, CreateDomain};

use crate::Error;
use crate::edge::api::ErrorClass;
use crate::plan::domain::DesiredDomain;
use crate::plan::service::ServiceIndex;
use crate::plan::{Inputs, Kind, ObjectRef, PlanOptions, Refusal, plan};
use crate::reconcile::kit::{self, Deletion, KitContext, Reconciler};
use crate::reconcile::{
    Context, RESERVATION_FINALIZER, apply_status, kept_because, ready, ready_of, reason_of,
    release_reservation, resync,
};

/// What to reserve for `domain`, given every Domain of the cluster (pure).
pub fn desired(
    domain: &Domain,
    all: &[Arc<Domain>],
    base_domain: &str,
) -> Result<(DesiredDomain, CreateDomain), Box<Refusal>> {
    let me = ObjectRef::of(Kind::Domain, &domain.metadata);
    let inputs = Inputs {
        domains: all,
        ..Inputs::default()
    };
    let plan = plan(
        &inputs,
        &ServiceIndex::default(),
        &PlanOptions::cluster(base_domain),
    );
    if let Some(refusal) = plan.refusals_of(&me).next() {
        return Err(Box::new(refusal.clone()));
    }
    let desired = plan
        .domains
        .into_iter()
        .find(|d| d.namespace == me.namespace && d.name == me.name)
        .ok_or_else(|| {
            Box::new(Refusal {
                object: me.clone(),
                rule: None,
                path: None,
                reason: crate::plan::Reason::Domain(
                    crate::plan::domain::DomainReason::SubdomainOrDomainRequired,
                ),
                message: "set exactly one of spec.subdomain or spec.domain".into(),
            })
        })?;
    let request = if desired.custom {
        CreateDomain {
            subdomain: None,
            domain: Some(desired.fqdn.clone()),
        }
    } else {
        CreateDomain {
            subdomain: domain.spec.subdomain.clone(),
            domain: None,
        }
    };
    Ok((desired, request))
}

/// The status after the edge answered (pure). Adoption is decided once: a
/// Domain that already recorded its reservation keeps its `adopted` flag, so a
/// reservation the operator made (or re-made after it was deleted elsewhere)
/// is never mistaken for an adopted one, and vice versa.
pub fn status_after(
    domain: &Domain,
    reserved: &Reserved<api::Domain>,
    verified: &api::Domain,
) -> (DomainStatus, ConditionStatus, &'static str, String) {
    let previous = domain.status.clone().unwrap_or_default();
    let adopted = if previous.fqdn.is_some() {
        previous.adopted
    } else {
        reserved.adopted
    };
    let (status, reason, message) = match verified.status {
        api::DomainStatus::Verified if verified.kind == api::DomainKind::Custom => (
            ConditionStatus::True,
            "Verified",
            format!(
                "{} is reserved and its DNS records are verified",
                verified.name
            ),
        ),
        api::DomainStatus::Verified => (
            ConditionStatus::True,
            if adopted { "Adopted" } else { "Reserved" },
            if adopted {
                format!(
                    "{} already existed in the account and was adopted; the operator never releases it",
                    verified.name
                )
            } else {
                format!("{} is reserved", verified.name)
            },
        ),
        api::DomainStatus::Pending => (
            ConditionStatus::False,
            "DnsNotVerified",
            format!(
                "DNS is not verified yet: {}; create the records of status.dnsRecords at your DNS provider (re-checked automatically)",
                verified
                    .verification_message
                    .clone()
                    .unwrap_or_else(|| "the records were not found".into())
            ),
        ),
    };
    let conditions = ready(
        &previous.conditions,
        status,
        reason,
        &message,
        domain.metadata.generation,
    );
    (
        DomainStatus {
            conditions,
            observed_generation: domain.metadata.generation,
            fqdn: Some(verified.name.clone()),
            dns_records: verified
                .dns_records
                .iter()
                .map(|r| DnsRecord {
                    type_: r.record_type.clone(),
                    name: r.name.clone(),
                    value: r.value.clone(),
                })
                .collect(),
            adopted,
        },
        status,
        reason,
        message,
    )
}

fn previous_ready(domain: &Domain) -> Option<Condition> {
    domain
        .status
        .as_ref()
        .and_then(|s| ready_of(&s.conditions).cloned())
}

/// Writes `Ready=False` with `reason`/`message` (keeping what else the status says).
async fn not_ready(
    api: &Api<Domain>,
    domain: &Domain,
    reason: &str,
    message: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let previous = domain.status.clone().unwrap_or_default();
    let was = previous_ready(domain);
    let status = DomainStatus {
        conditions: ready(
            &previous.conditions,
            ConditionStatus::False,
            reason,
            message,
            domain.metadata.generation,
        ),
        observed_generation: domain.metadata.generation,
        ..previous.clone()
    };
    apply_status(api, domain, domain.status.as_ref(), &status).await?;
    if was
        .as_ref()
        .is_none_or(|c| c.reason != reason || c.message != message)
    {
        ctx.event(
            domain,
            EventType::Warning,
            reason,
            "Reserve",
            message.to_owned(),
        )
        .await;
    }
    Ok(())
}

async fn apply(domain: Arc<Domain>, ctx: &Context, store: &Store<Domain>) -> Result<Action, Error> {
    let api: Api<Domain> = Api::namespaced(
        ctx.client.clone(),
        domain.namespace().as_deref().unwrap_or("default"),
    );
    let base_domain = match ctx.edge_info().await {
        Ok(who) => who.base_domain.clone(),
        Err(e) => return edge_failure(&api, &domain, e, ctx).await,
    };
    let (_, request) = match desired(&domain, &store.state(), &base_domain) {
        Ok(d) => d,
        Err(refusal) => {
            not_ready(
                &api,
                &domain,
                refusal.reason.as_str(),
                &refusal.message,
                ctx,
            )
            .await?;
            return Ok(resync(ctx.resync_interval));
        }
    };
    let reserved = match ctx.edge.ensure_domain(&request).await {
        Ok(r) => r,
        Err(e) => return edge_failure(&api, &domain, e, ctx).await,
    };
    let verified = if reserved.object.status == api::DomainStatus::Pending {
        match ctx.edge.verify_domain(&reserved.object.name).await {
            Ok(d) => d,
            Err(e) => return edge_failure(&api, &domain, e, ctx).await,
        }
    } else {
        reserved.object.clone()
    };
    let was = previous_ready(&domain);
    let (status, ready_status, reason, message) = status_after(&domain, &reserved, &verified);
    apply_status(&api, &domain, domain.status.as_ref(), &status).await?;
    if was.as_ref().is_none_or(|c| c.reason != reason) {
        let type_ = if ready_status == ConditionStatus::True {
            EventType::Normal
        } else {
            EventType::Warning
        };
        ctx.event(domain.as_ref(), type_, reason, "Reserve", message)
            .await;
    }
    if ready_status == ConditionStatus::True {
        Ok(resync(ctx.resync_interval))
    } else {
        Ok(Action::requeue(ctx.dns_recheck_interval))
    }
}

/// Reports an edge failure on the Domain and returns what the error policy needs.
async fn edge_failure(
    api: &Api<Domain>,
    domain: &Domain,
    e: crate::Error,
    ctx: &Context,
) -> Result<Action, Error> {
    match e.class() {
        ErrorClass::NeedsChange | ErrorClass::Gone => {
            not_ready(
                api,
                domain,
                &reason_of(&e, "ReservationRefused"),
                &e.edge_message(),
                ctx,
            )
            .await?;
            Ok(resync(ctx.resync_interval))
        }
        ErrorClass::Retryable | ErrorClass::RateLimited(_) => {
            // A reservation that was Ready stays Ready: the edge being
            // unreachable does not mean the name is gone.
            let ready_now = previous_ready(domain).is_some_and(|c| c.status == "True");
            if !ready_now {
                not_ready(
                    api,
                    domain,
                    &reason_of(&e, "EdgeUnavailable"),
                    &format!("{e}; retrying with backoff"),
                    ctx,
                )
                .await?;
            }
            Err(e)
        }
    }
}

async fn cleanup(domain: Arc<Domain>, ctx: &Context) -> Result<Action, Error> {
    let status = domain.status.clone().unwrap_or_default();
    let Some(fqdn) = status.fqdn.clone() else {
        // Never reserved by this Domain (invalid, or a duplicate): nothing to release.
        return Ok(Action::await_change());
    };
    let kept = kept_because(status.adopted, domain.spec.reclaim_policy);
    release_reservation(
        ctx,
        domain.as_ref(),
        &fqdn,
        kept,
        ctx.edge.delete_domain(&fqdn),
    )
    .await
}

/// The Domain reconciler: reservations released through
/// [`RESERVATION_FINALIZER`]; the kind's own store serves the cross-object
/// rules (duplicates, the oldest wins).
pub struct Domains {
    ctx: Arc<Context>,
    store: Store<Domain>,
}

impl Reconciler for Domains {
    type Object = Domain;
    const KIND: &'static str = "Domain";
    const DELETION: Deletion = Deletion::Finalizer(RESERVATION_FINALIZER);

    fn kit(&self) -> KitContext<'_> {
        self.ctx.kit()
    }

    async fn apply(self: Arc<Self>, domain: Arc<Domain>) -> Result<Action, Error> {
        apply(domain, &self.ctx, &self.store).await
    }

    async fn cleanup(self: Arc<Self>, domain: Arc<Domain>) -> Result<Action, Error> {
        cleanup(domain, &self.ctx).await
    }
}

/// Runs the Domain controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let controller = Controller::new(
        Api::<Domain>::all(ctx.client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    kit::run(Arc::new(Domains { ctx, store }), controller, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tuna_protocol::api::{DomainKind, DomainStatus as EdgeStatus, Timestamp};

    fn domain(yaml: &str) -> Domain {
        serde_saphyr::from_str(yaml).expect("test Domain")
    }

    fn edge_domain(name: &str, kind: DomainKind, status: EdgeStatus) -> api::Domain {
        api::Domain {
            name: name.into(),
            kind,
            account: "a".into(),
            status,
            dns_records: vec![api::DnsRecord {
                record_type: "TXT".into(),
                name: format!("_tuna-challenge.{name}"),
                value: "tuna-verify=x".into(),
            }],
            created_at: Timestamp(0),
            verified_at: None,
            verification_message: Some("TXT record not found".into()),
        }
    }

    #[test]
    fn desired_refuses_invalid_specs_and_younger_duplicates() {
        let old = Arc::new(domain(
            "metadata: {name: a, namespace: one, creationTimestamp: '2026-01-01T00:00:00Z'}\nspec: {subdomain: shop}",
        ));
        let young = Arc::new(domain(
            "metadata: {name: b, namespace: two, creationTimestamp: '2026-02-01T00:00:00Z'}\nspec: {subdomain: shop}",
        ));
        let both = Arc::new(domain(
            "metadata: {name: c, namespace: one}\nspec: {subdomain: x, domain: x.example.com}",
        ));
        let all = vec![old.clone(), young.clone(), both.clone()];
        let (d, request) = desired(&old, &all, "tuna.test").unwrap();
        assert_eq!(d.fqdn, "shop.tuna.test");
        assert_eq!(request.subdomain.as_deref(), Some("shop"));
        let dup = desired(&young, &all, "tuna.test").unwrap_err();
        assert_eq!(dup.reason.as_str(), "DuplicateDomain");
        assert!(dup.message.contains("one/a"), "{}", dup.message);
        let invalid = desired(&both, &all, "tuna.test").unwrap_err();
        assert_eq!(invalid.reason.as_str(), "SubdomainOrDomainRequired");
    }

    /// Adoption is decided once and then sticks, whatever later 201/409s say.
    #[test]
    fn adoption_is_sticky_and_custom_domains_wait_for_dns() {
        let fresh = domain(
            "metadata: {name: a, namespace: n, generation: 3}\nspec: {domain: shop.example.com}",
        );
        let pending = edge_domain("shop.example.com", DomainKind::Custom, EdgeStatus::Pending);
        let (status, ready, reason, message) = status_after(
            &fresh,
            &Reserved {
                object: pending.clone(),
                adopted: true,
            },
            &pending,
        );
        assert!(status.adopted, "the first answer decides");
        assert_eq!((ready, reason), (ConditionStatus::False, "DnsNotVerified"));
        assert!(message.contains("TXT record not found"), "{message}");
        assert_eq!(status.dns_records.len(), 1);
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.conditions[0].observed_generation, Some(3));

        let mut ours = fresh.clone();
        ours.status = Some(DomainStatus {
            fqdn: Some("shop.example.com".into()),
            adopted: false,
            ..Default::default()
        });
        let verified = edge_domain("shop.example.com", DomainKind::Custom, EdgeStatus::Verified);
        // Our own reservation answers 409 on the next pass: still ours.
        let (status, ready, reason, _) = status_after(
            &ours,
            &Reserved {
                object: verified.clone(),
                adopted: true,
            },
            &verified,
        );
        assert!(!status.adopted);
        assert_eq!((ready, reason), (ConditionStatus::True, "Verified"));
    }
}
