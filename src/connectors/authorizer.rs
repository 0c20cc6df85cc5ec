//! Who may use a connector's proxy, decided with the operator's own cluster:
//! the proxy password is a ServiceAccount token checked with a
//! `TokenReview` (for the proxy's audience), and the caller may use
//! `<namespace>/<connector>` when it is a ServiceAccount of that namespace,
//! or when a `SubjectAccessReview` says it may `get` that Connector.
//!
//! | CONNECT | answer |
//! |---|---|
//! | user not `<namespace>/<connector>`; token unknown, expired or for another audience | `407` |
//! | the caller may not use the connector; no such connector; target not its address | `403` |
//! | the connector is not usable (its Secret, class or address); a review failed | `503` |
//! | else | `200`, with the connector's `Authorization: Bearer <token>` |
//!
//! Reviews are cached briefly (as the API server caches webhook reviews),
//! keyed by a SHA-256 of the token: a kubectl command opens a handful of
//! connections, each one CONNECT, and they should not cost two API calls
//! each. The cache is bounded and never holds a token.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use tuna_proxy::{ConnectAuthorizer, ConnectGrant, ConnectRefusal, ConnectRequest, Credential};

use super::targets::ProxyTargets;

/// How long a review answer is reused.
const POSITIVE_TTL: Duration = Duration::from_secs(10);
/// How long a refusal is reused (a client retrying a bad token does not
/// reach the API server each time).
const NEGATIVE_TTL: Duration = Duration::from_secs(3);
/// Most cached answers of each kind; the cache is emptied when full.
const MAX_CACHED: usize = 10_000;

/// Who a token is.
#[derive(Debug, Clone, PartialEq)]
struct Caller {
    username: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

struct Cached<T> {
    value: T,
    until: Instant,
}

struct TtlCache<K, T> {
    entries: Mutex<HashMap<K, Cached<T>>>,
}

impl<K: std::hash::Hash + Eq, T: Clone> TtlCache<K, T> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<T> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|c| c.until > Instant::now())
            .map(|c| c.value.clone())
    }

    fn put(&self, key: K, value: T, ttl: Duration) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= MAX_CACHED {
            entries.clear();
        }
        entries.insert(
            key,
            Cached {
                value,
                until: Instant::now() + ttl,
            },
        );
    }
}

/// The [`ConnectAuthorizer`] of the connector proxy.
pub struct KubeAuthorizer {
    client: Client,
    targets: Arc<ProxyTargets>,
    audience: String,
    tokens: TtlCache<[u8; 32], Result<Caller, String>>,
    access: TtlCache<(String, String, String), bool>,
}

impl KubeAuthorizer {
    /// Checks tokens (meant for `audience`) and rights with `client` (the
    /// operator's own cluster) and hands out `targets`.
    pub fn new(client: Client, targets: Arc<ProxyTargets>, audience: String) -> Self {
        Self {
            client,
            targets,
            audience,
            tokens: TtlCache::new(),
            access: TtlCache::new(),
        }
    }

    async fn authenticate(&self, token: &Credential) -> Result<Caller, ConnectRefusal> {
        let digest: [u8; 32] =
            ring::digest::digest(&ring::digest::SHA256, token.expose().as_bytes())
                .as_ref()
                .try_into()
                .expect("SHA-256 is 32 bytes");
        let answer = match self.tokens.get(&digest) {
            Some(answer) => answer,
            None => {
                let answer = self.review_token(token).await?;
                let ttl = if answer.is_ok() {
                    POSITIVE_TTL
                } else {
                    NEGATIVE_TTL
                };
                self.tokens.put(digest, answer.clone(), ttl);
                answer
            }
        };
        answer.map_err(ConnectRefusal::Unauthenticated)
    }

    /// `Ok(Err(why))`: the token names no one.
    async fn review_token(
        &self,
        token: &Credential,
    ) -> Result<Result<Caller, String>, ConnectRefusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.expose().to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                ConnectRefusal::Unavailable(format!(
                    "the proxy cannot check tokens now (TokenReview failed: {e}); try again"
                ))
            })?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(Err(format!(
                "the proxy password is not a valid token for audience {} (expired, revoked or unknown): mint a new kubeconfig",
                self.audience
            )));
        }
        let UserInfo {
            username,
            uid,
            groups,
            extra,
        } = status.user.unwrap_or_default();
        let Some(username) = username.filter(|u| !u.is_empty()) else {
            return Ok(Err("the token names no user".into()));
        };
        Ok(Ok(Caller {
            username,
            uid,
            groups: groups.unwrap_or_default(),
            extra: extra.unwrap_or_default(),
        }))
    }

    /// A ServiceAccount of the connector's namespace may use it; anyone else
    /// needs `get` on the Connector.
    async fn may_use(
        &self,
        caller: &Caller,
        namespace: &str,
        name: &str,
    ) -> Result<(), ConnectRefusal> {
        if is_service_account_of(&caller.username, namespace) {
            return Ok(());
        }
        let key = (
            caller.username.clone(),
            namespace.to_owned(),
            name.to_owned(),
        );
        let allowed = match self.access.get(&key) {
            Some(allowed) => allowed,
            None => {
                let subject = Subject {
                    username: caller.username.clone(),
                    uid: caller.uid.clone(),
                    groups: caller.groups.clone(),
                    extra: caller.extra.clone(),
                };
                let allowed = may_get_connector(&self.client, &subject, namespace, name)
                    .await
                    .map_err(|e| {
                        tracing::warn!(error = %e, "SubjectAccessReview failed");
                        ConnectRefusal::Unavailable(format!(
                            "the proxy cannot check rights now (SubjectAccessReview failed: {e}); try again"
                        ))
                    })?;
                self.access.put(
                    key,
                    allowed,
                    if allowed { POSITIVE_TTL } else { NEGATIVE_TTL },
                );
                allowed
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(ConnectRefusal::Forbidden(refusal(
                &caller.username,
                namespace,
                name,
            )))
        }
    }
}

/// Who asks to use a connector (a TokenReview's user, or a pod's
/// ServiceAccount as the CSI driver knows it).
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// `system:serviceaccount:<ns>:<name>` for ServiceAccounts.
    pub username: String,
    /// The user's UID, when known.
    pub uid: Option<String>,
    /// The user's groups.
    pub groups: Vec<String>,
    /// The user's extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Subject {
    /// ServiceAccount `namespace/name`, with the groups the API server gives
    /// every ServiceAccount.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            ..Self::default()
        }
    }
}

/// The rule of the first half: `username` is a ServiceAccount of `namespace`.
pub fn is_service_account_of(username: &str, namespace: &str) -> bool {
    let own = format!("system:serviceaccount:{namespace}:");
    username
        .strip_prefix(&own)
        .is_some_and(|sa| !sa.is_empty() && !sa.contains(':'))
}

/// What a refused user is told.
pub fn refusal(username: &str, namespace: &str, name: &str) -> String {
    format!(
        "{username} may not use connector {namespace}/{name}: only ServiceAccounts of namespace {namespace}, and whoever may get the Connector, may"
    )
}

/// The whole rule: a ServiceAccount of the connector's namespace, or anyone a
/// `SubjectAccessReview` allows to `get` the Connector (no cache).
pub async fn may_use_connector(
    client: &Client,
    subject: &Subject,
    namespace: &str,
    name: &str,
) -> Result<bool, kube::Error> {
    if is_service_account_of(&subject.username, namespace) {
        return Ok(true);
    }
    may_get_connector(client, subject, namespace, name).await
}

/// Whether `subject` may `get` Connector `namespace/name` (SubjectAccessReview).
async fn may_get_connector(
    client: &Client,
    subject: &Subject,
    namespace: &str,
    name: &str,
) -> Result<bool, kube::Error> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(subject.username.clone()),
            uid: subject.uid.clone(),
            groups: Some(subject.groups.clone()),
            extra: Some(subject.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(tuna_crds::CONNECTORS_GROUP.to_owned()),
                resource: Some("connectors".into()),
                verb: Some("get".into()),
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// `<namespace>/<connector>` of the proxy user name.
fn connector_of(username: &str) -> Option<(&str, &str)> {
    let (namespace, name) = username.split_once('/')?;
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    (label(namespace) && label(name)).then_some((namespace, name))
}

#[async_trait::async_trait]
impl ConnectAuthorizer for KubeAuthorizer {
    async fn authorize(&self, request: ConnectRequest) -> Result<ConnectGrant, ConnectRefusal> {
        let Some((namespace, name)) = connector_of(&request.credentials.username) else {
            return Err(ConnectRefusal::Unauthenticated(
                "the proxy user must be <namespace>/<connector>".into(),
            ));
        };
        let caller = self.authenticate(&request.credentials.password).await?;
        self.may_use(&caller, namespace, name).await?;
        let target = match self.targets.get(namespace, name) {
            None => {
                return Err(ConnectRefusal::Forbidden(format!(
                    "there is no connector {namespace}/{name}"
                )));
            }
            Some(Err(why)) => {
                return Err(ConnectRefusal::Unavailable(format!(
                    "connector {namespace}/{name} is not ready: {why}"
                )));
            }
            Some(Ok(target)) => target,
        };
        if !target.authorities.contains(&request.authority) {
            let allowed: Vec<String> = target.authorities.iter().map(|a| a.to_string()).collect();
            return Err(ConnectRefusal::Forbidden(format!(
                "connector {namespace}/{name} leads to {}, not to {}",
                allowed.join(", "),
                request.authority
            )));
        }
        tracing::debug!(connector = %format!("{namespace}/{name}"), caller = %caller.username, "CONNECT allowed");
        Ok(ConnectGrant {
            target: target.upstream.clone(),
            authorization: target.authorization.clone(),
            label: format!("{namespace}/{name} for {}", caller.username),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_users_name_a_connector() {
        assert_eq!(
            connector_of("k8s-connector-demo/k8s-connector"),
            Some(("k8s-connector-demo", "k8s-connector"))
        );
        for bad in [
            "", "/", "ns/", "/name", "ns", "NS/name", "ns/na me", "ns/a/b",
        ] {
            assert_eq!(connector_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn cached_answers_expire() {
        let cache: TtlCache<u8, bool> = TtlCache::new();
        cache.put(1, true, Duration::from_secs(60));
        cache.put(2, false, Duration::ZERO);
        assert_eq!(cache.get(&1), Some(true));
        assert_eq!(cache.get(&2), None, "expired");
        assert_eq!(cache.get(&3), None);
    }
}
