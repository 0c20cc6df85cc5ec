//! Verification of custom domains through real DNS lookups.
//!
//! A custom domain is verified when both records the API asked for are
//! visible: the TXT ownership record `_tuna-challenge.<domain>` carrying the
//! domain's challenge (proves the caller controls the zone) and a CNAME from
//! the domain to the edge's public host (proves traffic will arrive here).

use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::{Resolver, TokioResolver};

use super::names::normalize_host;

/// Name of the TXT ownership record of `domain`.
pub fn challenge_record_name(domain: &str) -> String {
    format!("_tuna-challenge.{domain}")
}

/// What a verification found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Both records are in place.
    pub verified: bool,
    /// What is missing or wrong (empty when verified).
    pub message: String,
}

/// Looks records up on configured name servers (or the system's).
#[derive(Clone, Debug)]
pub struct DnsVerifier {
    nameservers: Vec<SocketAddr>,
    timeout: Duration,
}

impl DnsVerifier {
    /// Uses `nameservers` (UDP, with TCP fallback); the system's resolver
    /// configuration when the list is empty.
    pub fn new(nameservers: Vec<SocketAddr>) -> Self {
        Self {
            nameservers,
            timeout: Duration::from_secs(3),
        }
    }

    fn resolver(&self) -> Result<TokioResolver, String> {
        let mut options = ResolverOpts::default();
        options.timeout = self.timeout;
        options.attempts = 2;
        // A fresh answer each time: the caller retries after fixing records,
        // and a cached NXDOMAIN would hide the fix.
        options.cache_size = 0;
        let builder = if self.nameservers.is_empty() {
            Resolver::builder_tokio().map_err(|e| format!("system DNS configuration: {e}"))?
        } else {
            let servers = self
                .nameservers
                .iter()
                .map(|addr| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = addr.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = addr.port();
                    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
                })
                .collect();
            Resolver::builder_with_config(
                ResolverConfig::from_name_servers(servers),
                TokioRuntimeProvider::default(),
            )
        };
        builder
            .with_options(options)
            .build()
            .map_err(|e| format!("building the DNS resolver: {e}"))
    }

    /// Checks the TXT record carries `challenge` and `domain` is a CNAME of
    /// `public_host`.
    pub async fn verify(&self, domain: &str, challenge: &str, public_host: &str) -> Outcome {
        let resolver = match self.resolver() {
            Ok(r) => r,
            Err(message) => {
                return Outcome {
                    verified: false,
                    message,
                };
            }
        };
        let mut problems = Vec::new();

        let txt_name = challenge_record_name(domain);
        match resolver
            .lookup(format!("{txt_name}."), RecordType::TXT)
            .await
        {
            Ok(lookup) => {
                let found = lookup.answers().iter().any(|record| match &record.data {
                    RData::TXT(txt) => {
                        let joined: Vec<u8> = txt.txt_data.iter().flatten().copied().collect();
                        joined == challenge.as_bytes()
                    }
                    _ => false,
                });
                if !found {
                    problems.push(format!(
                        "TXT {txt_name} does not contain the expected value {challenge:?}"
                    ));
                }
            }
            Err(e) if e.is_no_records_found() => problems.push(format!(
                "TXT {txt_name} not found (create it with the value {challenge:?})"
            )),
            Err(e) => problems.push(format!("TXT {txt_name}: DNS lookup failed: {e}")),
        }

        match resolver
            .lookup(format!("{domain}."), RecordType::CNAME)
            .await
        {
            Ok(lookup) => {
                let targets: Vec<String> = lookup
                    .answers()
                    .iter()
                    .filter_map(|record| match &record.data {
                        RData::CNAME(target) => Some(normalize_host(&target.0.to_ascii())),
                        _ => None,
                    })
                    .collect();
                if !targets.iter().any(|t| t == public_host) {
                    problems.push(format!(
                        "CNAME {domain} points to {targets:?}, expected {public_host:?}"
                    ));
                }
            }
            Err(e) if e.is_no_records_found() => problems.push(format!(
                "CNAME {domain} not found (create it pointing to {public_host})"
            )),
            Err(e) => problems.push(format!("CNAME {domain}: DNS lookup failed: {e}")),
        }

        Outcome {
            verified: problems.is_empty(),
            message: problems.join("; "),
        }
    }
}
