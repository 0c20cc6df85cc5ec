//! JSON bodies of the REST API, exactly as `docs/tuna-api.md` describes them.
//!
//! Field names are camelCase on the wire. Every type derives both `Serialize`
//! and `Deserialize` so the edge's server and `tuna-agent`'s `TunaClient`
//! share one definition and cannot drift apart.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::secret::Secret;

/// What an API key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Manage domains, TCP endpoints and tunnel tokens.
    #[serde(rename = "tunnels:write")]
    TunnelsWrite,
    /// Open tunnels (and mint the tunnel tokens that open them).
    #[serde(rename = "tunnels:connect")]
    TunnelsConnect,
    /// Everything, including what later scopes will cover.
    #[serde(rename = "full")]
    Full,
}

impl Scope {
    /// The wire spelling (`tunnels:write`, `tunnels:connect`, `full`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TunnelsWrite => "tunnels:write",
            Self::TunnelsConnect => "tunnels:connect",
            Self::Full => "full",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tunnels:write" => Ok(Self::TunnelsWrite),
            "tunnels:connect" => Ok(Self::TunnelsConnect),
            "full" | "*" => Ok(Self::Full),
            other => Err(format!(
                "unknown scope {other:?}: expected tunnels:write, tunnels:connect or full"
            )),
        }
    }
}

/// A point in time, RFC 3339 in UTC on the wire (`2026-11-29T23:59:00Z`),
/// whole seconds since the Unix epoch in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The current time, truncated to seconds.
    pub fn now() -> Self {
        Self(time::OffsetDateTime::now_utc().unix_timestamp())
    }

    /// Seconds since the Unix epoch.
    pub fn unix_seconds(self) -> i64 {
        self.0
    }

    /// This instant plus `seconds`.
    pub fn plus_seconds(self, seconds: u64) -> Self {
        Self(
            self.0
                .saturating_add(i64::try_from(seconds).unwrap_or(i64::MAX)),
        )
    }

    /// RFC 3339 text.
    pub fn to_rfc3339(self) -> String {
        time::OffsetDateTime::from_unix_timestamp(self.0)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| self.0.to_string())
    }

    /// Parses RFC 3339 text.
    pub fn parse_rfc3339(text: &str) -> Result<Self, String> {
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .map(|t| Self(t.unix_timestamp()))
            .map_err(|e| format!("invalid RFC 3339 timestamp {text:?}: {e}"))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

/// The error body of every non-2xx answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// Machine-readable code, stable across releases (see [`error_code`]).
    pub code: String,
    /// Human-readable explanation of what went wrong and what to do.
    pub message: String,
    /// On `409 already_exists`: the reservation the caller's account already
    /// holds, so the caller may adopt it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing: Option<serde_json::Value>,
}

/// The `code` values of [`ErrorBody`].
pub mod error_code {
    /// 401: no key, a malformed key, an unknown or revoked key.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// 403: the key lacks the scope the endpoint needs.
    pub const MISSING_SCOPE: &str = "missing_scope";
    /// 403: another account holds the name or port.
    pub const HELD_BY_OTHER_ACCOUNT: &str = "held_by_other_account";
    /// 403: the account's quota for this kind of object is spent.
    pub const QUOTA_EXCEEDED: &str = "quota_exceeded";
    /// 404: no such object in the caller's account.
    pub const NOT_FOUND: &str = "not_found";
    /// 409: the caller's account already holds it; `existing` carries it.
    pub const ALREADY_EXISTS: &str = "already_exists";
    /// 422: a name is not an RFC 1123 label/host name, or is reserved.
    pub const INVALID_NAME: &str = "invalid_name";
    /// 422: a requested port lies outside the edge's TCP port range.
    pub const PORT_OUT_OF_RANGE: &str = "port_out_of_range";
    /// 422: the body is malformed or a field value is out of bounds.
    pub const INVALID_REQUEST: &str = "invalid_request";
    /// 422: the token has expired and can no longer be renewed.
    pub const TOKEN_EXPIRED: &str = "token_expired";
    /// 429: the key's request budget is spent; see `Retry-After`.
    pub const RATE_LIMITED: &str = "rate_limited";
    /// 503: every port of the TCP range is taken.
    pub const PORTS_EXHAUSTED: &str = "ports_exhausted";
    /// 422: a requested Gateway address is not in the edge's pool
    /// (`--gateway-addresses`).
    pub const ADDRESS_OUT_OF_POOL: &str = "address_out_of_pool";
    /// 503: every address of the edge's Gateway pool is reserved.
    pub const ADDRESSES_EXHAUSTED: &str = "addresses_exhausted";
    /// 501: the edge has no Gateway address pool (`--gateway-addresses`).
    pub const NO_ADDRESS_POOL: &str = "no_address_pool";
    /// 503: the edge's shared store (PostgreSQL) is unreachable; the write
    /// was not acknowledged (absent, or made if the connection died during
    /// its commit); see `Retry-After`.
    pub const STORE_UNAVAILABLE: &str = "store_unavailable";
    /// 500: a server-side failure (storage); retry later.
    pub const INTERNAL: &str = "internal";
}

/// `GET /v1/account`: who the key is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// The account the key belongs to; every reservation belongs to one.
    pub account: String,
    /// The id of the key that made the request.
    pub key_id: String,
    /// The key's scopes.
    pub scopes: Vec<Scope>,
    /// The edge's base domain (subdomains are reserved under it).
    pub base_domain: String,
    /// The host name custom domains must point to with a CNAME.
    pub public_host: String,
    /// The edge gives each Gateway an address of its own
    /// (`POST /v1/gateway-addresses`); absent (an older edge, the hosted
    /// service): Gateways share the edge's ports.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gateway_addresses: bool,
}

/// `POST /v1/domains`: exactly one of `subdomain` and `domain`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateDomain {
    /// One DNS label; the reserved name is `<subdomain>.<base domain>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    /// A custom host name the caller owns; it must be verified through DNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// Whether the domain is a subdomain of the edge or a custom domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DomainKind {
    /// `<label>.<base domain>`: usable at once.
    Subdomain,
    /// A host name outside the base domain: usable once verified.
    Custom,
}

/// Whether tunnels may serve the domain yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DomainStatus {
    /// The DNS records have not been seen yet.
    Pending,
    /// Tunnels may bind the host.
    Verified,
}

/// A DNS record the owner of a custom domain must create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DnsRecord {
    /// `CNAME` or `TXT`.
    #[serde(rename = "type")]
    pub record_type: String,
    /// The fully qualified name of the record (no trailing dot).
    pub name: String,
    /// The record's value.
    pub value: String,
}

/// A reserved host name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    /// The full host name, lower case; the id used in paths.
    pub name: String,
    /// Subdomain or custom.
    pub kind: DomainKind,
    /// The account that holds it.
    pub account: String,
    /// Pending until verified; subdomains are verified at creation.
    pub status: DomainStatus,
    /// For custom domains: the records to create. Empty for subdomains.
    #[serde(default)]
    pub dns_records: Vec<DnsRecord>,
    /// When it was reserved.
    pub created_at: Timestamp,
    /// When it was verified, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<Timestamp>,
    /// What the last verification found, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_message: Option<String>,
}

/// `POST /v1/tcp-endpoints`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateTcpEndpoint {
    /// A DNS label starting with a letter, unique on the edge.
    pub alias: String,
    /// A specific port of the edge's range; absent: the edge picks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// A reserved public TCP port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpEndpoint {
    /// The alias, the id used in paths (a port number works there too).
    pub alias: String,
    /// The public port.
    pub port: u16,
    /// `<public host>:<port>`, what clients connect to.
    pub address: String,
    /// The account that holds it.
    pub account: String,
    /// When it was reserved.
    pub created_at: Timestamp,
}

/// `POST /v1/gateway-addresses`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateGatewayAddress {
    /// The caller's label for the Gateway it is for (e.g.
    /// `namespace/gateway`): 1–253 printable ASCII characters, no spaces;
    /// unique within the account (a second reservation under one name is
    /// `409 already_exists` with the first).
    pub name: String,
    /// A specific address of the edge's pool; absent: the edge picks the
    /// lowest free one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
}

/// An address of the edge's Gateway pool reserved by an account: its
/// tunnels may bind any port on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// The address, the id used in paths.
    pub address: IpAddr,
    /// The label given at creation.
    pub name: String,
    /// The account that holds it.
    pub account: String,
    /// When it was reserved.
    pub created_at: Timestamp,
}

/// What a tunnel token allows its session to serve.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bindings {
    /// HTTP host names (domains the account holds).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// TCP endpoints by alias or by port number (as a string, e.g. `"30001"`).
    #[serde(default)]
    pub tcp_endpoints: Vec<String>,
    /// Gateway addresses the account holds (`POST /v1/gateway-addresses`):
    /// the session may bind any port on each.
    #[serde(
        rename = "gatewayAddresses",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub addresses: Vec<IpAddr>,
}

/// The token labels that name a tunnel's owner (its tenant): two tunnels of
/// one account whose tokens differ in any of them belong to different owners,
/// and the edge never moves a live TCP port from one owner to another
/// (`docs/tuna-api.md`, "Owners"). A label absent on both is equal.
pub const OWNER_LABELS: [&str; 2] = ["k8s.tuna.am/cluster", "k8s.tuna.am/namespace"];

/// `POST /v1/tokens`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateToken {
    /// Owner labels (`k8s.tuna.am/namespace=…`), used to find orphans.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What the token's session may bind.
    #[serde(default)]
    pub bindings: Bindings,
    /// Lifetime in seconds; default 86400, at most 30 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// `POST /v1/tokens`' answer: the only time the clear-text token is shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedToken {
    /// The token id.
    pub id: String,
    /// The clear-text tunnel token; the edge keeps only its hash.
    pub token: Secret,
    /// When it stops working unless renewed.
    pub expires_at: Timestamp,
    /// The rest of the token's description.
    #[serde(flatten)]
    pub info: TokenInfo,
}

/// A tunnel token without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    /// The owner labels.
    pub labels: BTreeMap<String, String>,
    /// What its session may bind.
    pub bindings: Bindings,
    /// The account it belongs to.
    pub account: String,
    /// When it was created.
    pub created_at: Timestamp,
}

/// A tunnel token as listed (never with its secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Token {
    /// The token id, used in paths.
    pub id: String,
    /// When it stops working unless renewed.
    pub expires_at: Timestamp,
    /// True once `expiresAt` has passed.
    pub expired: bool,
    /// The rest of the description.
    #[serde(flatten)]
    pub info: TokenInfo,
}

/// `POST /v1/tokens/{id}/renew`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewToken {
    /// New lifetime in seconds from now; default 86400, at most 30 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// Every list answer: `{"items": [...]}` (room for paging later).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct List<T> {
    /// The objects, sorted by id.
    pub items: Vec<T>,
}

/// An API key as listed (never with its secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKey {
    /// The key id (the part after `tunak_`).
    pub id: String,
    /// Free-form name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The account it acts for.
    pub account: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// When it was created.
    pub created_at: Timestamp,
}

/// `POST /v1/keys`: a key for the caller's own account.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateApiKey {
    /// Free-form name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// At least one scope.
    #[serde(default)]
    pub scopes: Vec<Scope>,
}

/// `POST /v1/keys`' answer: the only time the clear-text key is shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedApiKey {
    /// The clear-text API key; the edge keeps only its hash.
    pub key: Secret,
    /// The key's description.
    #[serde(flatten)]
    pub info: ApiKey,
}
