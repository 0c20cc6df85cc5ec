//! The reservations and tunnel tokens a standalone process needs, from the
//! embedded edge or from a remote one.
//!
//! - **Embedded** ([`EdgeControl::Embedded`]): this process is its own edge. The
//!   files are the only source of reservations, so the edge's session authority
//!   is the in-memory one of `tuna-tunnel`: every tunnel gets its own random
//!   token, good for 24 hours and renewed hourly while the process runs, revoked
//!   (sessions closed at once) when its resource leaves the files. TCP endpoint
//!   ports are allocated from `--tcp-port-range` and remembered in
//!   `<data-dir>/tcp-endpoints.json`, so an alias keeps its port across restarts.
//!   A custom `domain:` is taken as verified (a plain host has no DNS to check).
//!   The control plane with its REST API is not used here: its base domain must
//!   have two labels, and standalone defaults to `localhost`.
//! - **Remote** ([`EdgeControl::Remote`]): the Tuna REST API of another edge via
//!   `TunaClient` — domains and TCP endpoints are reserved there (409 means the
//!   account already holds them: adopted, never released), tokens are created
//!   with owner labels and revoked through the API.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rand::Rng;
use tuna_tunnel::api::{Bindings, CreateDomain, CreateTcpEndpoint, CreateToken, RenewToken};
use tuna_tunnel::api::{ClientError, TunaClient};
use tuna_tunnel::edge::MemoryAuthority;
use tuna_tunnel::wire::{Binding, TunnelToken};

use super::Error;

/// Lifetime of a tunnel token; renewed at [`TOKEN_RENEW_EVERY`].
pub const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// How often live tokens are renewed.
pub const TOKEN_RENEW_EVERY: Duration = Duration::from_secs(3600);
/// Label naming the object a token was made for (finds orphans at the edge).
pub const OWNER_LABEL: &str = "tuna.am/owner";
/// Account name of the embedded edge.
const EMBEDDED_ACCOUNT: &str = "standalone";
/// File of the embedded edge's TCP endpoint allocations.
pub const TCP_ENDPOINTS_FILE: &str = "tcp-endpoints.json";

/// A token issued for one tunnel.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// Its id (what revocation names).
    pub id: String,
    /// The secret (masked in `Debug`).
    pub token: TunnelToken,
}

/// The embedded edge's bookkeeping.
pub struct Embedded {
    authority: MemoryAuthority,
    ports: RangeInclusive<u16>,
    file: PathBuf,
    allocated: Mutex<BTreeMap<String, u16>>,
    live: Mutex<BTreeMap<String, (TunnelToken, Vec<Binding>)>>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
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

impl Embedded {
    /// Opens the allocations in `data_dir`; the authority is shared with the edge.
    pub fn open(
        authority: MemoryAuthority,
        ports: RangeInclusive<u16>,
        data_dir: &Path,
    ) -> Result<Self, Error> {
        let file = data_dir.join(TCP_ENDPOINTS_FILE);
        let allocated: BTreeMap<String, u16> = match std::fs::read_to_string(&file) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| Error::State {
                path: file.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => {
                return Err(Error::Io {
                    path: file.clone(),
                    source,
                });
            }
        };
        let embedded = Self {
            authority,
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

    fn save(&self, allocated: &BTreeMap<String, u16>) -> Result<(), Error> {
        let text =
            serde_json::to_string_pretty(allocated).expect("a map of strings to ports serializes");
        std::fs::write(&self.file, text).map_err(|source| Error::Io {
            path: self.file.clone(),
            source,
        })
    }
}

/// A remote edge's REST API.
#[derive(Debug)]
pub struct Remote {
    client: TunaClient,
    instance: String,
}

impl Remote {
    /// Wraps a client. `instance` names this standalone process at the edge
    /// (label [`INSTANCE_LABEL`] on its tokens), so that tokens left behind by a
    /// crash can be found and revoked at the next start.
    pub fn new(client: TunaClient, instance: impl Into<String>) -> Self {
        Self {
            client,
            instance: instance.into(),
        }
    }

    /// Revokes the tokens an earlier run of this instance left at the edge (it
    /// was killed, or files changed while it was down): every run mints its own.
    pub async fn revoke_orphans(&self) -> Result<usize, Error> {
        let selector = format!("{INSTANCE_LABEL}={}", self.instance);
        let tokens = self
            .client
            .list_tokens(&selector)
            .await
            .map_err(|e| remote("listing tunnel tokens", e))?;
        let mut revoked = 0;
        for t in tokens.into_iter().filter(|t| !t.expired) {
            match self.client.revoke_token(&t.id).await {
                Ok(()) | Err(ClientError::NotFound { .. }) => revoked += 1,
                Err(e) => return Err(remote("revoking an orphaned tunnel token", e)),
            }
        }
        Ok(revoked)
    }
}

/// Label naming the standalone instance that minted a token.
pub const INSTANCE_LABEL: &str = "tuna.am/instance";

/// File in the data dir holding the instance id.
pub const INSTANCE_FILE: &str = "instance-id";

/// The id of the standalone instance using `data_dir`, created on first use
/// (`standalone-<16 hex>`), so a restart recognises the tokens it minted before.
pub fn instance_id(data_dir: &Path) -> Result<String, Error> {
    let file = data_dir.join(INSTANCE_FILE);
    match std::fs::read_to_string(&file) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(Error::Io { path: file, source }),
    }
    let id = format!("standalone-{}", random_hex(8));
    std::fs::write(&file, &id).map_err(|source| Error::Io { path: file, source })?;
    Ok(id)
}

/// Where reservations and tokens come from (see the module docs).
#[derive(Debug)]
pub enum EdgeControl {
    /// This process's own edge.
    Embedded(Embedded),
    /// Another edge's REST API.
    Remote(Remote),
}

fn random_hex(bytes: usize) -> String {
    let mut rng = rand::rng();
    (0..bytes)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

fn remote(what: &str, e: ClientError) -> Error {
    Error::Edge(format!("{what}: {e}"))
}

impl EdgeControl {
    /// Reserves a host (remote only: the embedded edge trusts its files). Returns
    /// whether the reservation already existed (adopted).
    pub async fn reserve_host(
        &self,
        subdomain: Option<&str>,
        domain: Option<&str>,
    ) -> Result<bool, Error> {
        match self {
            Self::Embedded(_) => Ok(false),
            Self::Remote(r) => {
                let request = CreateDomain {
                    subdomain: subdomain.map(str::to_owned),
                    domain: domain.map(str::to_owned),
                };
                match r.client.create_domain(&request).await {
                    Ok(_) => Ok(false),
                    Err(ClientError::AlreadyExists { .. }) => Ok(true),
                    Err(e) => Err(remote("reserving a domain", e)),
                }
            }
        }
    }

    /// Releases a host reserved by [`EdgeControl::reserve_host`] (remote only).
    pub async fn release_host(&self, fqdn: &str) -> Result<(), Error> {
        match self {
            Self::Embedded(_) => Ok(()),
            Self::Remote(r) => match r.client.delete_domain(fqdn).await {
                Ok(()) | Err(ClientError::NotFound { .. }) => Ok(()),
                Err(e) => Err(remote("releasing a domain", e)),
            },
        }
    }

    /// Reserves a TCP endpoint by alias (a port is allocated) or by port (an
    /// alias `port-<n>` is made up). Returns the alias, the public port and whether
    /// it already existed.
    pub async fn reserve_tcp(
        &self,
        alias: Option<&str>,
        port: Option<u16>,
    ) -> Result<(String, u16, bool), Error> {
        let alias = match (alias, port) {
            (Some(a), _) => a.to_owned(),
            (None, Some(p)) => format!("port-{p}"),
            (None, None) => {
                return Err(Error::Edge(
                    "a TCP endpoint needs an alias or a port".into(),
                ));
            }
        };
        match self {
            Self::Embedded(e) => {
                let mut allocated = e.allocated.lock().expect("allocations lock");
                if let Some(existing) = allocated.get(&alias) {
                    return Ok((alias.clone(), *existing, true));
                }
                let port = match port {
                    Some(p) if !e.ports.contains(&p) => {
                        return Err(Error::Edge(format!(
                            "port {p} is outside --tcp-port-range {}-{}",
                            e.ports.start(),
                            e.ports.end()
                        )));
                    }
                    Some(p) => p,
                    None => {
                        let used: std::collections::BTreeSet<u16> =
                            allocated.values().copied().collect();
                        e.ports.clone().find(|p| !used.contains(p)).ok_or_else(|| {
                            Error::Edge(format!(
                                "no free port left in --tcp-port-range {}-{}",
                                e.ports.start(),
                                e.ports.end()
                            ))
                        })?
                    }
                };
                allocated.insert(alias.clone(), port);
                e.save(&allocated)?;
                e.authority.add_tcp_alias(&alias, port);
                Ok((alias, port, false))
            }
            Self::Remote(r) => {
                let request = CreateTcpEndpoint {
                    alias: alias.clone(),
                    port,
                };
                match r.client.create_tcp_endpoint(&request).await {
                    Ok(ep) => Ok((ep.alias, ep.port, false)),
                    Err(e @ ClientError::AlreadyExists { .. }) => {
                        let existing: Option<tuna_tunnel::api::TcpEndpoint> = e.existing();
                        match existing {
                            Some(ep) => Ok((ep.alias, ep.port, true)),
                            None => {
                                let ep = r
                                    .client
                                    .get_tcp_endpoint(&alias)
                                    .await
                                    .map_err(|e| remote("reading a TCP endpoint", e))?;
                                Ok((ep.alias, ep.port, true))
                            }
                        }
                    }
                    Err(e) => Err(remote("reserving a TCP endpoint", e)),
                }
            }
        }
    }

    /// Releases a TCP endpoint (its port may be given to another alias later).
    pub async fn release_tcp(&self, alias: &str) -> Result<(), Error> {
        match self {
            Self::Embedded(e) => {
                let mut allocated = e.allocated.lock().expect("allocations lock");
                if allocated.remove(alias).is_some() {
                    e.save(&allocated)?;
                }
                Ok(())
            }
            Self::Remote(r) => match r.client.delete_tcp_endpoint(alias).await {
                Ok(()) | Err(ClientError::NotFound { .. }) => Ok(()),
                Err(e) => Err(remote("releasing a TCP endpoint", e)),
            },
        }
    }

    /// Issues a token for one tunnel, allowed exactly `bindings`.
    pub async fn create_token(
        &self,
        owner: &str,
        bindings: &[Binding],
    ) -> Result<IssuedToken, Error> {
        match self {
            Self::Embedded(e) => {
                let id = format!("tok_{}", random_hex(8));
                let token = TunnelToken::new(format!("tt_{}", random_hex(24)));
                e.authority.add_token(
                    &id,
                    &token,
                    EMBEDDED_ACCOUNT,
                    SystemTime::now() + TOKEN_TTL,
                    bindings.to_vec(),
                );
                e.live
                    .lock()
                    .expect("token lock")
                    .insert(id.clone(), (token.clone(), bindings.to_vec()));
                Ok(IssuedToken { id, token })
            }
            Self::Remote(r) => {
                let mut request = CreateToken::default();
                request
                    .labels
                    .insert(OWNER_LABEL.to_owned(), owner_label(owner));
                request
                    .labels
                    .insert(INSTANCE_LABEL.to_owned(), r.instance.clone());
                for b in bindings {
                    match b {
                        Binding::Http { host } => request.bindings.hosts.push(host.clone()),
                        Binding::Tcp { endpoint } => {
                            request.bindings.tcp_endpoints.push(endpoint.clone())
                        }
                    }
                }
                request.ttl_seconds = Some(TOKEN_TTL.as_secs());
                let created = r
                    .client
                    .create_token(&request)
                    .await
                    .map_err(|e| remote("creating a tunnel token", e))?;
                Ok(IssuedToken {
                    id: created.id,
                    token: TunnelToken::new(created.token.expose()),
                })
            }
        }
    }

    /// Revokes a token: sessions opened with it close at once.
    pub async fn revoke_token(&self, id: &str) -> Result<(), Error> {
        match self {
            Self::Embedded(e) => {
                e.live.lock().expect("token lock").remove(id);
                e.authority.revoke(id);
                Ok(())
            }
            Self::Remote(r) => match r.client.revoke_token(id).await {
                Ok(()) | Err(ClientError::NotFound { .. }) => Ok(()),
                Err(e) => Err(remote("revoking a tunnel token", e)),
            },
        }
    }

    /// Extends the life of live tokens by [`TOKEN_TTL`].
    pub async fn renew_token(&self, id: &str) -> Result<(), Error> {
        match self {
            Self::Embedded(e) => {
                let live = e.live.lock().expect("token lock").get(id).cloned();
                if let Some((token, bindings)) = live {
                    e.authority.add_token(
                        id,
                        &token,
                        EMBEDDED_ACCOUNT,
                        SystemTime::now() + TOKEN_TTL,
                        bindings,
                    );
                }
                Ok(())
            }
            Self::Remote(r) => {
                let request = RenewToken {
                    ttl_seconds: Some(TOKEN_TTL.as_secs()),
                };
                r.client
                    .renew_token(id, &request)
                    .await
                    .map(|_| ())
                    .map_err(|e| remote("renewing a tunnel token", e))
            }
        }
    }
}

/// Label values are at most 63 characters of `A-Za-z0-9-_.`: `Ingress
/// default/shop` becomes `Ingress.default.shop`.
fn owner_label(owner: &str) -> String {
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

/// Bindings helper for tests and callers that build token requests.
pub fn bindings_of(bindings: &[Binding]) -> Bindings {
    let mut out = Bindings::default();
    for b in bindings {
        match b {
            Binding::Http { host } => out.hosts.push(host.clone()),
            Binding::Tcp { endpoint } => out.tcp_endpoints.push(endpoint.clone()),
        }
    }
    out
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
