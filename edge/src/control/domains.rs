//! Domains: subdomains of the edge's base domain (usable at once) and custom
//! domains (usable once their DNS records are verified).

use super::dns::challenge_record_name;
use super::keys::Caller;
use super::plane::{ControlPlane, check_quota};
use super::store::{DomainRecord, Write};
use super::{names, secrets};
use tuna_protocol::api::{
    CreateDomain, DnsRecord, Domain, DomainKind, DomainStatus, Scope, Timestamp,
};
use tuna_protocol::wire::BoundTarget;

use crate::authority::Revocation;
use crate::error::{Error, Result};

impl ControlPlane {
    pub(crate) fn domain_view(&self, record: &DomainRecord) -> Domain {
        let dns_records = match record.kind {
            DomainKind::Subdomain => Vec::new(),
            DomainKind::Custom => vec![
                DnsRecord {
                    record_type: "CNAME".into(),
                    name: record.name.clone(),
                    value: self.public_host().to_owned(),
                },
                DnsRecord {
                    record_type: "TXT".into(),
                    name: challenge_record_name(&record.name),
                    value: record.challenge.clone(),
                },
            ],
        };
        Domain {
            name: record.name.clone(),
            kind: record.kind,
            account: record.account.clone(),
            status: if record.verified_at.is_some() {
                DomainStatus::Verified
            } else {
                DomainStatus::Pending
            },
            dns_records,
            created_at: Timestamp(record.created_at),
            verified_at: record.verified_at.map(Timestamp),
            verification_message: record.verification_message.clone(),
        }
    }

    /// Reserves a subdomain, or claims a custom domain, for the caller's
    /// account. A custom domain is a *claim* until verified: several accounts
    /// may claim one name (each with its own challenge); the first to verify
    /// it holds it and the other claims are dropped. Claims expire after the
    /// pending-domain TTL.
    pub fn create_domain(&self, caller: &Caller, request: &CreateDomain) -> Result<Domain> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        let (name, kind) = match (&request.subdomain, &request.domain) {
            (Some(label), None) => (
                names::subdomain_host(label, self.base_domain(), self.public_host())?,
                DomainKind::Subdomain,
            ),
            (None, Some(domain)) => (
                names::custom_domain(domain, self.base_domain(), self.public_host())?,
                DomainKind::Custom,
            ),
            _ => {
                return Err(Error::InvalidRequest(
                    "give exactly one of `subdomain` and `domain`".into(),
                ));
            }
        };
        let now = Timestamp::now().unix_seconds();
        let quotas = &self.shared.quotas;
        self.store().commit(|state| {
            if let Some(existing) = state.domains.get(&name) {
                return Err(self.reservation_conflict(
                    caller,
                    &existing.account,
                    || {
                        (
                            format!("your account already holds the domain {name:?}"),
                            serde_json::to_value(self.domain_view(existing)),
                        )
                    },
                    &format!("the domain {name:?}"),
                ));
            }
            let key = (name.clone(), caller.account.clone());
            if let Some(claim) = state.claims.get(&key) {
                return Err(Error::AlreadyExists {
                    message: format!("your account already claims the domain {name:?}; verify it"),
                    existing: Box::new(
                        serde_json::to_value(self.domain_view(claim))
                            .unwrap_or(serde_json::Value::Null),
                    ),
                });
            }
            let record = DomainRecord {
                name: name.clone(),
                kind,
                account: caller.account.clone(),
                challenge: match kind {
                    DomainKind::Subdomain => String::new(),
                    DomainKind::Custom => format!(
                        "tuna-verify={}{}",
                        secrets::random_id(),
                        secrets::random_id()
                    ),
                },
                created_at: now,
                verified_at: (kind == DomainKind::Subdomain).then_some(now),
                verification_message: None,
            };
            let write = match kind {
                DomainKind::Subdomain => {
                    check_quota(
                        state.domains_held(&caller.account),
                        quotas.domains,
                        "domains",
                        "--quota-domains",
                    )?;
                    Write::PutDomain(record.clone())
                }
                DomainKind::Custom => {
                    check_quota(
                        state.claims_pending(&caller.account),
                        quotas.pending_domains,
                        "unverified custom domains",
                        "--quota-pending-domains",
                    )?;
                    Write::PutClaim(record.clone())
                }
            };
            Ok((self.domain_view(&record), vec![write]))
        })
    }

    /// 409 (with the existing object) when the caller's account holds it,
    /// 403 when another account does.
    pub(crate) fn reservation_conflict(
        &self,
        caller: &Caller,
        holder: &str,
        same_account: impl FnOnce() -> (String, serde_json::Result<serde_json::Value>),
        what: &str,
    ) -> Error {
        if holder == caller.account {
            let (message, existing) = same_account();
            Error::AlreadyExists {
                message,
                existing: Box::new(existing.unwrap_or(serde_json::Value::Null)),
            }
        } else {
            Error::HeldByOtherAccount(format!(
                "{what} is held by another account; choose another name"
            ))
        }
    }

    /// The caller's domains (held and claimed), sorted by name.
    pub fn list_domains(&self, caller: &Caller) -> Result<Vec<Domain>> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        let state = self.store().read();
        let mut domains: Vec<Domain> = state
            .domains
            .values()
            .chain(state.claims.values())
            .filter(|d| d.account == caller.account)
            .map(|d| self.domain_view(d))
            .collect();
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(domains)
    }

    fn own_domain(&self, caller: &Caller, name: &str) -> Result<DomainRecord> {
        let name = names::normalize_host(name);
        let state = self.store().read();
        state
            .domains
            .get(&name)
            .filter(|d| d.account == caller.account)
            .or_else(|| state.claims.get(&(name.clone(), caller.account.clone())))
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("your account holds no domain {name:?}")))
    }

    /// One of the caller's domains.
    pub fn get_domain(&self, caller: &Caller, name: &str) -> Result<Domain> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        Ok(self.domain_view(&self.own_domain(caller, name)?))
    }

    /// Releases one of the caller's domains (or drops its claim); tunnels
    /// serving it are closed at once (the name may go to another account next).
    pub fn delete_domain(&self, caller: &Caller, name: &str) -> Result<()> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        // Another replica may have made the domain a moment ago.
        self.store().sync()?;
        let record = self.own_domain(caller, name)?;
        let held = self.store().commit(|state| {
            // Gone already (a concurrent delete): deleting is idempotent.
            let key = (record.name.clone(), caller.account.clone());
            let writes = if state
                .domains
                .get(&record.name)
                .is_some_and(|d| d.account == caller.account)
            {
                vec![Write::DeleteDomain(record.name.clone())]
            } else if state.claims.contains_key(&key) {
                vec![Write::DeleteClaim(key.0, key.1)]
            } else {
                Vec::new()
            };
            let held = matches!(writes.first(), Some(Write::DeleteDomain(_)));
            Ok((held, writes))
        })?;
        if held {
            self.announce(Revocation::Target(BoundTarget::Http { host: record.name }));
        }
        Ok(())
    }

    /// Looks the custom domain's DNS records up now and records the result.
    /// Answers the domain either way: `status` says whether it is verified
    /// and `verificationMessage` what is missing.
    pub async fn verify_domain(&self, caller: &Caller, name: &str) -> Result<Domain> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        // Another replica may have claimed the domain a moment ago.
        self.store().sync_async().await?;
        let record = self.own_domain(caller, name)?;
        if record.kind == DomainKind::Subdomain {
            return Ok(self.domain_view(&record));
        }
        let outcome = self
            .shared
            .dns
            .verify(&record.name, &record.challenge, self.public_host())
            .await;
        let now = Timestamp::now().unix_seconds();
        let plane = self.clone();
        let caller = caller.clone();
        // The commit syncs the store file: off the async runtime.
        tokio::task::spawn_blocking(move || {
            plane.record_verification(&caller, &record, &outcome, now)
        })
        .await
        .map_err(|e| Error::Internal(format!("recording a verification did not finish: {e}")))?
    }

    fn record_verification(
        &self,
        caller: &Caller,
        record: &DomainRecord,
        outcome: &super::dns::Outcome,
        now: i64,
    ) -> Result<Domain> {
        let quotas = &self.shared.quotas;
        self.store().commit(|state| {
            let key = (record.name.clone(), caller.account.clone());
            let held = state
                .domains
                .get(&record.name)
                .filter(|d| d.account == caller.account && d.challenge == record.challenge);
            let claimed = state
                .claims
                .get(&key)
                .filter(|d| d.challenge == record.challenge);
            let Some(current) = held.or(claimed) else {
                return Err(Error::NotFound(format!(
                    "the domain {:?} was released during verification",
                    record.name
                )));
            };
            let mut updated = current.clone();
            if outcome.verified {
                updated.verified_at = Some(updated.verified_at.unwrap_or(now));
                updated.verification_message = None;
            } else {
                // A domain verified once stays usable: a DNS hiccup must not
                // cut live traffic. The message still reports the problem.
                updated.verification_message = Some(outcome.message.clone());
            }
            let view = self.domain_view(&updated);
            if held.is_some() {
                let writes = if updated == *current {
                    Vec::new()
                } else {
                    vec![Write::PutDomain(updated)]
                };
                return Ok((view, writes));
            }
            if updated.verified_at.is_none() {
                return Ok((view, vec![Write::PutClaim(updated)]));
            }
            // A verified claim becomes the reservation; the others' claims go.
            if let Some(holder) = state.domains.get(&record.name) {
                return Err(Error::HeldByOtherAccount(format!(
                    "the domain {:?} was verified by another account first (holder {})",
                    record.name,
                    if holder.account == caller.account {
                        "you"
                    } else {
                        "another account"
                    }
                )));
            }
            check_quota(
                state.domains_held(&caller.account),
                quotas.domains,
                "domains",
                "--quota-domains",
            )?;
            let mut writes: Vec<Write> = state
                .claims_of(&record.name)
                .map(|c| Write::DeleteClaim(c.name.clone(), c.account.clone()))
                .collect();
            writes.push(Write::PutDomain(updated));
            Ok((view, writes))
        })
    }
}
