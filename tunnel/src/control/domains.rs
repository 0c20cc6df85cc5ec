//! Domains: subdomains of the edge's base domain (usable at once) and custom
//! domains (usable once their DNS records are verified).

use super::dns::challenge_record_name;
use super::error::{ControlError, Result};
use super::store::{DomainRecord, Write};
use super::{Caller, ControlPlane, names, secrets};
use crate::api::{CreateDomain, DnsRecord, Domain, DomainKind, DomainStatus, Scope, Timestamp};

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

    /// Reserves a subdomain or a custom domain for the caller's account.
    pub fn create_domain(&self, caller: &Caller, request: &CreateDomain) -> Result<Domain> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        let (name, kind) = match (&request.subdomain, &request.domain) {
            (Some(label), None) => (
                names::subdomain_host(label, self.base_domain())?,
                DomainKind::Subdomain,
            ),
            (None, Some(domain)) => (
                names::custom_domain(domain, self.base_domain(), self.public_host())?,
                DomainKind::Custom,
            ),
            _ => {
                return Err(ControlError::InvalidRequest(
                    "give exactly one of `subdomain` and `domain`".into(),
                ));
            }
        };
        let now = Timestamp::now().unix_seconds();
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
            Ok((self.domain_view(&record), vec![Write::PutDomain(record)]))
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
    ) -> ControlError {
        if holder == caller.account {
            let (message, existing) = same_account();
            ControlError::AlreadyExists {
                message,
                existing: Box::new(existing.unwrap_or(serde_json::Value::Null)),
            }
        } else {
            ControlError::HeldByOtherAccount(format!(
                "{what} is held by another account; choose another name"
            ))
        }
    }

    /// The caller's domains, sorted by name.
    pub fn list_domains(&self, caller: &Caller) -> Result<Vec<Domain>> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        Ok(self
            .store()
            .read()
            .domains
            .values()
            .filter(|d| d.account == caller.account)
            .map(|d| self.domain_view(d))
            .collect())
    }

    fn own_domain(&self, caller: &Caller, name: &str) -> Result<DomainRecord> {
        let name = names::normalize_host(name);
        self.store()
            .read()
            .domains
            .get(&name)
            .filter(|d| d.account == caller.account)
            .cloned()
            .ok_or_else(|| ControlError::NotFound(format!("your account holds no domain {name:?}")))
    }

    /// One of the caller's domains.
    pub fn get_domain(&self, caller: &Caller, name: &str) -> Result<Domain> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        Ok(self.domain_view(&self.own_domain(caller, name)?))
    }

    /// Releases one of the caller's domains.
    pub fn delete_domain(&self, caller: &Caller, name: &str) -> Result<()> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        let record = self.own_domain(caller, name)?;
        self.store().commit(|state| {
            // Gone already (a concurrent delete): deleting is idempotent.
            let writes = if state
                .domains
                .get(&record.name)
                .is_some_and(|d| d.account == caller.account)
            {
                vec![Write::DeleteDomain(record.name.clone())]
            } else {
                Vec::new()
            };
            Ok(((), writes))
        })
    }

    /// Looks the custom domain's DNS records up now and records the result.
    /// Answers the domain either way: `status` says whether it is verified
    /// and `verificationMessage` what is missing.
    pub async fn verify_domain(&self, caller: &Caller, name: &str) -> Result<Domain> {
        caller.require_any(&[Scope::TunnelsWrite])?;
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
        self.store().commit(|state| {
            let Some(current) = state
                .domains
                .get(&record.name)
                .filter(|d| d.account == caller.account && d.challenge == record.challenge)
            else {
                return Err(ControlError::NotFound(format!(
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
            let writes = if updated == *current {
                Vec::new()
            } else {
                vec![Write::PutDomain(updated)]
            };
            Ok((view, writes))
        })
    }
}
