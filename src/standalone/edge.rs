//! The edge of a standalone process: embedded, or a remote one.
//!
//! - **Embedded** ([`Embedded`]): this process is its own edge. The files are
//!   the only source of reservations, so the edge's session authority is the
//!   in-memory one of `tuna-edge`: every tunnel gets its own random token,
//!   renewed while the process runs, revoked (sessions closed at once) when its
//!   resource leaves the files. TCP endpoint ports are allocated from
//!   `--tcp-port-range` and remembered in `<data-dir>/tcp-endpoints.json`
//!   (written atomically), so an alias keeps its port across restarts. A custom
//!   `domain:` is taken as verified (a plain host has no DNS to check). The
//!   control plane with its REST API is not used here: its base domain must have
//!   two labels, and standalone defaults to `localhost`.
//! - **Remote**: [`crate::edge::api::RemoteEdge`] over another edge's REST API —
//!   domains and TCP endpoints are reserved there (409 means the account already
//!   holds them: adopted, never released), tokens carry owner labels and this
//!   instance's id ([`INSTANCE_LABEL`], from `<data-dir>/instance-id`), so that
//!   [`revoke_orphans`] finds what an earlier run left.
//!
//! Both are an [`EdgeApi`]: the runtime does not know which one it talks to.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use rand::Rng;
use tuna_agent::client::Reserved;
use tuna_edge::MemoryAuthority;
use tuna_protocol::api::{
    CreateDomain, CreateTcpEndpoint, Domain, DomainKind, DomainStatus, Scope, TcpEndpoint,
    Timestamp, Token, TokenInfo, WhoAmI,
};
use tuna_protocol::wire::{Binding, TunnelToken};

use crate::Error;
use crate::edge::api::{EdgeApi, MintedToken, bindings_of, gone_is_ok};

/// Label naming the object a token was made for (finds orphans at the edge).
pub const OWNER_LABEL: &str = "tuna.am/owner";
/// Label naming the standalone instance that minted a token.
pub const INSTANCE_LABEL: &str = "tuna.am/instance";
/// File in the data dir holding the instance id.
pub const INSTANCE_FILE: &str = "instance-id";
/// Account name of the embedded edge.
const EMBEDDED_ACCOUNT: &str = "standalone";
/// File of the embedded edge's TCP endpoint allocations.
pub const TCP_ENDPOINTS_FILE: &str = "tcp-endpoints.json";

struct LiveToken {
    token: TunnelToken,
    bindings: Vec<Binding>,
    labels: BTreeMap<String, String>,
    expires_at: SystemTime,
}

/// The embedded edge's bookkeeping (see the module docs).
pub struct Embedded {
    authority: MemoryAuthority,
    base_domain: String,
    public_host: String,
    ports: RangeInclusive<u16>,
    file: PathBuf,
    allocated: Mutex<BTreeMap<String, u16>>,
    live: Mutex<BTreeMap<String, LiveToken>>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("base_domain", &self.base_domain)
            .field("ports", &self.ports)
            .field("file", &self.file)
            .field("allocated", &self.allocated)
            .field(
                "live_tokens",
                &self.live.lock().map(|l| l.len()).unwrap_or_default(),
            )
            .finish()
    }
}

fn embedded_error(
    what: impl Into<String>,
    message: impl Into<String>,
    retryable: bool,
) -> crate::Error {
    Error::EmbeddedEdge {
        what: what.into(),
        message: message.into(),
        retryable,
    }
}

impl Embedded {
    /// Opens the allocations in `data_dir`; the authority is shared with the edge.
    pub fn open(
        authority: MemoryAuthority,
        base_domain: &str,
        ports: RangeInclusive<u16>,
        data_dir: &Path,
    ) -> Result<Self, Error> {
        let file = data_dir.join(TCP_ENDPOINTS_FILE);
        let allocated: BTreeMap<String, u16> = match std::fs::read_to_string(&file) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| Error::StateFile {
                path: file.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(Error::file("read", &file)(source)),
        };
        let embedded = Self {
            authority,
            base_domain: base_domain.to_ascii_lowercase(),
            public_host: base_domain.to_ascii_lowercase(),
            ports,
            file,
            allocated: Mutex::new(BTreeMap::new()),
            live: Mutex::new(BTreeMap::new()),
        };
        // Only allocations inside the current range are kept.
        for (alias, port) in allocated {
            if embedded.ports.contains(&port) {
                embedded.authority.add_tcp_alias(&alias, port);
                embedded
                    .allocated
                    .lock()
                    .expect("allocations lock")
                    .insert(alias, port);
            }
        }
        Ok(embedded)
    }

    fn save(&self, allocated: &BTreeMap<String, u16>) -> crate::Result<()> {
        let text =
            serde_json::to_string_pretty(allocated).expect("a map of strings to ports serializes");
        tuna_edge::fsutil::write_atomically(&self.file, text.as_bytes()).map_err(|e| {
            embedded_error(
                format!("writing {}", self.file.display()),
                e.to_string(),
                true,
            )
        })
    }

    fn domain(&self, name: String, kind: DomainKind) -> Domain {
        Domain {
            name,
            kind,
            account: EMBEDDED_ACCOUNT.to_owned(),
            status: DomainStatus::Verified,
            dns_records: Vec::new(),
            created_at: Timestamp::now(),
            verified_at: Some(Timestamp::now()),
            verification_message: None,
        }
    }

    fn endpoint(&self, alias: String, port: u16) -> TcpEndpoint {
        TcpEndpoint {
            address: format!("{}:{port}", self.public_host),
            alias,
            port,
            account: EMBEDDED_ACCOUNT.to_owned(),
            created_at: Timestamp::now(),
        }
    }

    fn reserve_tcp(&self, request: &CreateTcpEndpoint) -> crate::Result<Reserved<TcpEndpoint>> {
        let what = format!("reserving TCP endpoint {}", request.alias);
        let mut allocated = self.allocated.lock().expect("allocations lock");
        if let Some(existing) = allocated.get(&request.alias) {
            return Ok(Reserved {
                object: self.endpoint(request.alias.clone(), *existing),
                adopted: true,
            });
        }
        let port = match request.port {
            Some(p) if !self.ports.contains(&p) => {
                return Err(embedded_error(
                    what,
                    format!(
                        "port {p} is outside --tcp-port-range {}-{}",
                        self.ports.start(),
                        self.ports.end()
                    ),
                    false,
                ));
            }
            Some(p) => p,
            None => {
                let used: std::collections::BTreeSet<u16> = allocated.values().copied().collect();
                self.ports
                    .clone()
                    .find(|p| !used.contains(p))
                    .ok_or_else(|| {
                        embedded_error(
                            what.clone(),
                            format!(
                                "no free port left in --tcp-port-range {}-{}",
                                self.ports.start(),
                                self.ports.end()
                            ),
                            true,
                        )
                    })?
            }
        };
        allocated.insert(request.alias.clone(), port);
        self.save(&allocated)?;
        self.authority.add_tcp_alias(&request.alias, port);
        Ok(Reserved {
            object: self.endpoint(request.alias.clone(), port),
            adopted: false,
        })
    }
}

fn random_hex(bytes: usize) -> String {
    let mut rng = rand::rng();
    (0..bytes)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Why the embedded edge reserves no Gateway address.
const NO_ADDRESSES: &str =
    "the embedded edge has no Gateway address pool: Gateways share its ports";

impl EdgeApi for Embedded {
    fn whoami(&self) -> BoxFuture<'_, crate::Result<WhoAmI>> {
        Box::pin(async move {
            Ok(WhoAmI {
                account: EMBEDDED_ACCOUNT.to_owned(),
                key_id: "embedded".to_owned(),
                scopes: vec![Scope::Full],
                base_domain: self.base_domain.clone(),
                public_host: self.public_host.clone(),
                gateway_addresses: false,
            })
        })
    }

    fn ensure_domain<'a>(
        &'a self,
        request: &'a CreateDomain,
    ) -> BoxFuture<'a, crate::Result<Reserved<Domain>>> {
        Box::pin(async move {
            let domain = match (&request.subdomain, &request.domain) {
                (Some(sub), None) => self.domain(
                    format!("{}.{}", sub.to_ascii_lowercase(), self.base_domain),
                    DomainKind::Subdomain,
                ),
                (None, Some(custom)) => {
                    self.domain(custom.to_ascii_lowercase(), DomainKind::Custom)
                }
                _ => {
                    return Err(embedded_error(
                        "reserving a domain",
                        "give exactly one of subdomain and domain",
                        false,
                    ));
                }
            };
            Ok(Reserved {
                object: domain,
                adopted: false,
            })
        })
    }

    fn verify_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<Domain>> {
        Box::pin(async move { Ok(self.domain(name.to_owned(), DomainKind::Custom)) })
    }

    fn list_domains(&self) -> BoxFuture<'_, crate::Result<Vec<Domain>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn delete_domain<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn ensure_tcp_endpoint<'a>(
        &'a self,
        request: &'a CreateTcpEndpoint,
    ) -> BoxFuture<'a, crate::Result<Reserved<TcpEndpoint>>> {
        Box::pin(async move { self.reserve_tcp(request) })
    }

    fn delete_tcp_endpoint<'a>(&'a self, alias: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move {
            let mut allocated = self.allocated.lock().expect("allocations lock");
            if allocated.remove(alias).is_some() {
                self.save(&allocated)?;
            }
            Ok(())
        })
    }

    fn ensure_gateway_address<'a>(
        &'a self,
        request: &'a tuna_protocol::api::CreateGatewayAddress,
    ) -> BoxFuture<
        'a,
        crate::Result<tuna_agent::client::Reserved<tuna_protocol::api::GatewayAddress>>,
    > {
        Box::pin(async move {
            Err(embedded_error(
                format!("reserving an address for {}", request.name),
                NO_ADDRESSES,
                false,
            ))
        })
    }

    fn delete_gateway_address(
        &self,
        address: std::net::IpAddr,
    ) -> BoxFuture<'_, crate::Result<()>> {
        Box::pin(async move {
            Err(embedded_error(
                format!("giving back the Gateway address {address}"),
                NO_ADDRESSES,
                false,
            ))
        })
    }

    fn list_gateway_addresses(
        &self,
    ) -> BoxFuture<'_, crate::Result<Vec<tuna_protocol::api::GatewayAddress>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn create_token<'a>(
        &'a self,
        labels: &'a BTreeMap<String, String>,
        bindings: &'a [Binding],
        ttl: Duration,
    ) -> BoxFuture<'a, crate::Result<MintedToken>> {
        Box::pin(async move {
            let id = format!("tok_{}", random_hex(8));
            let token = TunnelToken::new(format!("tt_{}", random_hex(24)));
            let expires_at = SystemTime::now() + ttl;
            self.authority
                .add_token(&id, &token, EMBEDDED_ACCOUNT, expires_at, bindings.to_vec());
            self.live.lock().expect("token lock").insert(
                id.clone(),
                LiveToken {
                    token: token.clone(),
                    bindings: bindings.to_vec(),
                    labels: labels.clone(),
                    expires_at,
                },
            );
            Ok(MintedToken {
                id,
                token,
                expires_at: unix(expires_at),
            })
        })
    }

    fn renew_token<'a>(&'a self, id: &'a str, ttl: Duration) -> BoxFuture<'a, crate::Result<i64>> {
        Box::pin(async move {
            let mut live = self.live.lock().expect("token lock");
            let Some(entry) = live.get_mut(id) else {
                return Err(embedded_error(
                    format!("renewing tunnel token {id}"),
                    "no such token",
                    false,
                ));
            };
            entry.expires_at = SystemTime::now() + ttl;
            self.authority.add_token(
                id,
                &entry.token,
                EMBEDDED_ACCOUNT,
                entry.expires_at,
                entry.bindings.clone(),
            );
            Ok(unix(entry.expires_at))
        })
    }

    fn revoke_token<'a>(&'a self, id: &'a str) -> BoxFuture<'a, crate::Result<()>> {
        Box::pin(async move {
            self.live.lock().expect("token lock").remove(id);
            self.authority.revoke(id);
            Ok(())
        })
    }

    fn list_tokens<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, crate::Result<Vec<Token>>> {
        Box::pin(async move {
            let terms: Vec<(&str, &str)> = selector
                .split(',')
                .filter(|t| !t.is_empty())
                .filter_map(|t| t.split_once('='))
                .collect();
            let now = SystemTime::now();
            let live = self.live.lock().expect("token lock");
            Ok(live
                .iter()
                .filter(|(_, t)| {
                    terms
                        .iter()
                        .all(|(k, v)| t.labels.get(*k).is_some_and(|x| x == v))
                })
                .map(|(id, t)| Token {
                    id: id.clone(),
                    expires_at: Timestamp(unix(t.expires_at)),
                    expired: t.expires_at <= now,
                    info: TokenInfo {
                        labels: t.labels.clone(),
                        bindings: bindings_of(&t.bindings),
                        account: EMBEDDED_ACCOUNT.to_owned(),
                        created_at: Timestamp::now(),
                    },
                })
                .collect())
        })
    }
}

/// The id of the standalone instance using `data_dir`, created on first use
/// (`standalone-<16 hex>`, written atomically), so a restart recognises the
/// tokens it minted before.
pub fn instance_id(data_dir: &Path) -> Result<String, Error> {
    let file = data_dir.join(INSTANCE_FILE);
    match std::fs::read_to_string(&file) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(Error::file("read", file)(source)),
    }
    let id = format!("standalone-{}", random_hex(8));
    tuna_edge::fsutil::write_atomically(&file, id.as_bytes())
        .map_err(Error::file("write", file))?;
    Ok(id)
}

/// Revokes the tokens an earlier run of `instance` left at the edge (it was
/// killed, or files changed while it was down): every run mints its own.
pub async fn revoke_orphans(edge: &dyn EdgeApi, instance: &str) -> crate::Result<usize> {
    let selector = format!("{INSTANCE_LABEL}={instance}");
    let tokens = edge.list_tokens(&selector).await?;
    let mut revoked = 0;
    for t in tokens.into_iter().filter(|t| !t.expired) {
        gone_is_ok(edge.revoke_token(&t.id).await)?;
        revoked += 1;
    }
    Ok(revoked)
}

/// Label values are at most 63 characters of `A-Za-z0-9-_.`: `Ingress
/// default/shop` becomes `Ingress.default.shop`.
pub fn owner_label(owner: &str) -> String {
    let clean: String = owner
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                c
            } else {
                '.'
            }
        })
        .take(63)
        .collect();
    clean.trim_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn owner_labels_are_valid_label_values() {
        assert_eq!(
            super::owner_label("Ingress default/shop"),
            "Ingress.default.shop"
        );
        let long = super::owner_label(&format!("Tunnel default/{}", "x".repeat(100)));
        assert_eq!(long.len(), 63);
    }
}
