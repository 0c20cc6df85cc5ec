//! Who may use a connector's proxy, decided with the operator's own cluster:
//! the proxy password is a ServiceAccount token checked with a
//! `TokenReview` (for the proxy's audience, which the review's
//! `status.audiences` must name), and the caller may use
//! `<namespace>/<connector>` when it is a ServiceAccount of that namespace,
//! or when a `SubjectAccessReview` says it may `get` that Connector.
//!
//! | CONNECT | answer |
//! |---|---|
//! | user not `<namespace>/<connector>`; token unknown, expired or for another audience | `407` |
//! | the caller may not use the connector; no such connector; target not its address | `403` |
//! | an unknown token while the budget of reviews is spent | `429`, `Retry-After` |
//! | the connector is not usable (its Secret, class or address); a review failed | `503` |
//! | else | `200`, with the connector's `Authorization: Bearer <token>` |
//!
//! # Caches, and how long a decision holds
//!
//! Reviews are cached (as the API server caches webhook reviews), keyed by
//! a SHA-256 of the token, never the token: a kubectl command opens a
//! handful of connections, each one CONNECT, and they should not cost two
//! API calls each. Concurrent CONNECTs with one token share one review,
//! refusals included (a client hammering with a wrong password costs one
//! review per [`AuthorizerOptions::negative_ttl`]).
//!
//! A grant holds for [`AuthorizerOptions::recheck_interval`] after the
//! reviews it rests on were made (a positive answer is cached exactly that
//! long), and never past the token's own expiry: the token is a JWT, and
//! once the TokenReview has validated it, its `exp` claim is read (only
//! that: the review is what is trusted). The listener then asks again, on
//! open connections too — so a deleted ServiceAccount, an expired or
//! revoked token, a removed RoleBinding or a deleted Connector reaches an
//! open connection within the interval. An opaque token (no JWT) is bound
//! by the interval alone: its next review refuses it.
//!
//! # Strangers
//!
//! Tokens never seen valid are reviewed within two budgets (token buckets):
//! one per source — the client's IPv4 address, or its IPv6 /64, which one
//! host usually holds whole — ([`AuthorizerOptions::reviews_per_second_per_source`],
//! [`AuthorizerOptions::review_burst_per_source`]), and the proxy's whole
//! ceiling ([`AuthorizerOptions::reviews_per_second`],
//! [`AuthorizerOptions::review_burst`]). Past either they are answered `429`
//! without a review. So a source sending garbage passwords spends its own
//! budget, not the budget of new callers elsewhere; only many sources
//! together reach the ceiling. Tokens that were valid in the last hour are
//! exempt, so the connections of known callers are re-checked whatever
//! strangers do.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::authentication::v1::{
    TokenReview, TokenReviewSpec, TokenReviewStatus, UserInfo,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use tuna_proxy::{ConnectAuthorizer, ConnectGrant, ConnectRefusal, ConnectRequest, Credential};

use super::targets::ProxyTargets;

/// Most cached answers of each kind.
const MAX_CACHED: u64 = 10_000;
/// How long a token that was valid stays exempt from the review budget.
const KNOWN_FOR: Duration = Duration::from_secs(3600);

/// How the authorizer caches and limits its reviews.
#[derive(Debug, Clone)]
pub struct AuthorizerOptions {
    /// The audience proxy passwords must be meant for.
    pub audience: String,
    /// How long a decision holds: a positive review is reused this long,
    /// and an open connection is checked again after it (the revocation
    /// bound). Default 10 s.
    pub recheck_interval: Duration,
    /// How long a refusal is reused. Default 3 s.
    pub negative_ttl: Duration,
    /// TokenReviews of tokens never seen valid, per second, from all
    /// sources together: the ceiling. Default 20.
    pub reviews_per_second: NonZeroU32,
    /// How many such reviews may come at once, from all sources. Default 40.
    pub review_burst: NonZeroU32,
    /// TokenReviews of tokens never seen valid, per second, from one source
    /// (an IPv4 address, an IPv6 /64). Default 1.
    pub reviews_per_second_per_source: NonZeroU32,
    /// How many such reviews one source may have at once. Default 10.
    pub review_burst_per_source: NonZeroU32,
}

impl AuthorizerOptions {
    /// The defaults, for `audience`.
    pub fn new(audience: impl Into<String>) -> Self {
        Self {
            audience: audience.into(),
            recheck_interval: Duration::from_secs(10),
            negative_ttl: Duration::from_secs(3),
            reviews_per_second: NonZeroU32::new(20).expect("not zero"),
            review_burst: NonZeroU32::new(40).expect("not zero"),
            reviews_per_second_per_source: NonZeroU32::new(1).expect("not zero"),
            review_burst_per_source: NonZeroU32::new(10).expect("not zero"),
        }
    }
}

/// Who a token is.
#[derive(Debug, Clone, PartialEq)]
struct Caller {
    username: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

/// A cached answer and when it stops holding.
#[derive(Debug, Clone)]
struct Timed<T> {
    value: T,
    until: Instant,
}

/// Entries live until their own `until`.
struct UntilExpiry;

impl<K, T> moka::Expiry<K, Timed<T>> for UntilExpiry {
    fn expire_after_create(
        &self,
        _key: &K,
        value: &Timed<T>,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(value.until.saturating_duration_since(created_at))
    }
}

fn timed_cache<K, T>() -> moka::future::Cache<K, Timed<T>>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    moka::future::Cache::builder()
        .max_capacity(MAX_CACHED)
        .expire_after(UntilExpiry)
        .build()
}

/// The [`ConnectAuthorizer`] of the connector proxy.
pub struct KubeAuthorizer {
    client: Client,
    targets: Arc<ProxyTargets>,
    options: AuthorizerOptions,
    /// By SHA-256 of the token: who it is, or why it names no one.
    tokens: moka::future::Cache<[u8; 32], Timed<Result<Caller, String>>>,
    /// Digests of tokens that were valid lately: exempt from `reviews`.
    known: moka::sync::Cache<[u8; 32], ()>,
    /// (user, namespace, connector): may get it.
    access: moka::future::Cache<(String, String, String), Timed<bool>>,
    /// The budget of reviews of tokens never seen valid: the ceiling.
    reviews: DefaultDirectRateLimiter,
    /// The same, per source ([`source_of`]); a bucket idle long enough to
    /// have filled again is dropped (a new one is the same).
    sources: moka::sync::Cache<IpAddr, Arc<DefaultDirectRateLimiter>>,
    /// The quota of each of `sources`.
    source_quota: Quota,
}

impl KubeAuthorizer {
    /// Checks tokens (meant for `audience`) and rights with `client` (the
    /// operator's own cluster) and hands out `targets`, with the default
    /// [`AuthorizerOptions`].
    pub fn new(client: Client, targets: Arc<ProxyTargets>, audience: String) -> Self {
        Self::with_options(client, targets, AuthorizerOptions::new(audience))
    }

    /// [`Self::new`] with `options`.
    pub fn with_options(
        client: Client,
        targets: Arc<ProxyTargets>,
        options: AuthorizerOptions,
    ) -> Self {
        let quota = Quota::per_second(options.reviews_per_second).allow_burst(options.review_burst);
        let source_quota = Quota::per_second(options.reviews_per_second_per_source)
            .allow_burst(options.review_burst_per_source);
        // A bucket is full again after burst / rate: idle that long, it can go.
        let refilled = Duration::from_secs(
            u64::from(options.review_burst_per_source.get())
                .div_ceil(u64::from(options.reviews_per_second_per_source.get())),
        );
        Self {
            client,
            targets,
            tokens: timed_cache(),
            known: moka::sync::Cache::builder()
                .max_capacity(MAX_CACHED)
                .time_to_live(KNOWN_FOR)
                .build(),
            access: timed_cache(),
            reviews: RateLimiter::direct(quota),
            sources: moka::sync::Cache::builder()
                .max_capacity(MAX_CACHED)
                .time_to_idle(refilled.max(Duration::from_secs(1)))
                .build(),
            source_quota,
            options,
        }
    }

    /// Takes one review of an unknown token from `client`'s budget and the
    /// ceiling, or says when to try again.
    fn spend_review(&self, client: IpAddr) -> Result<(), ConnectRefusal> {
        let too_many = |not_until: governor::NotUntil<_>, whose: &str| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            ConnectRefusal::TooManyRequests {
                message: format!(
                    "the proxy is checking too many unknown tokens {whose}; try again"
                ),
                retry_after: wait,
            }
        };
        let source = self.sources.get_with(source_of(client), || {
            Arc::new(RateLimiter::direct(self.source_quota))
        });
        source
            .check()
            .map_err(|n| too_many(n, "from this address"))?;
        self.reviews
            .check()
            .map_err(|n| too_many(n, "at the moment"))
    }

    /// Who `token` is, and until when that answer holds; `client` pays for
    /// the review of a token the proxy has not seen valid.
    async fn authenticate(
        &self,
        token: &Credential,
        client: IpAddr,
    ) -> Result<Timed<Caller>, ConnectRefusal> {
        let digest: [u8; 32] =
            ring::digest::digest(&ring::digest::SHA256, token.expose().as_bytes())
                .as_ref()
                .try_into()
                .expect("SHA-256 is 32 bytes");
        let now = Instant::now();
        // Concurrent CONNECTs with one token wait for one review.
        let answer = self
            .tokens
            .try_get_with(digest, async {
                if !self.known.contains_key(&digest)
                    && let Err(refusal) = self.spend_review(client)
                {
                    return Err(refusal);
                }
                let answer = self.review_token(token).await?;
                let until = match &answer {
                    Ok(_) => {
                        let mut until = Instant::now() + self.options.recheck_interval;
                        if let Some(exp) = jwt_expiry(token.expose()) {
                            until = until.min(instant_of(exp));
                        }
                        until
                    }
                    Err(_) => Instant::now() + self.options.negative_ttl,
                };
                Ok(Timed {
                    value: answer,
                    until,
                })
            })
            .await
            .map_err(|e| (*e).clone())?;
        if answer.until <= now {
            // Expired while it was handed out: the next ask reviews anew.
            self.tokens.invalidate(&digest).await;
        }
        match answer.value {
            Ok(caller) => {
                if answer.until <= Instant::now() {
                    return Err(ConnectRefusal::Unauthenticated(format!(
                        "the proxy password has expired: mint a new kubeconfig (audience {})",
                        self.options.audience
                    )));
                }
                self.known.insert(digest, ());
                Ok(Timed {
                    value: caller,
                    until: answer.until,
                })
            }
            Err(why) => Err(ConnectRefusal::Unauthenticated(why)),
        }
    }

    /// `Ok(Err(why))`: the token names no one.
    async fn review_token(
        &self,
        token: &Credential,
    ) -> Result<Result<Caller, String>, ConnectRefusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.expose().to_owned()),
                audiences: Some(vec![self.options.audience.clone()]),
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
        Ok(caller_of(
            answer.status.unwrap_or_default(),
            &self.options.audience,
        ))
    }

    /// A ServiceAccount of the connector's namespace may use it; anyone else
    /// needs `get` on the Connector. `Some(until)` when a review decided.
    async fn may_use(
        &self,
        caller: &Caller,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Instant>, ConnectRefusal> {
        if is_service_account_of(&caller.username, namespace) {
            return Ok(None);
        }
        let key = (
            caller.username.clone(),
            namespace.to_owned(),
            name.to_owned(),
        );
        let allowed = self
            .access
            .try_get_with(key, async {
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
                let ttl = if allowed {
                    self.options.recheck_interval
                } else {
                    self.options.negative_ttl
                };
                Ok::<_, ConnectRefusal>(Timed {
                    value: allowed,
                    until: Instant::now() + ttl,
                })
            })
            .await
            .map_err(|e| (*e).clone())?;
        if allowed.value && allowed.until > Instant::now() {
            Ok(Some(allowed.until))
        } else if allowed.value {
            // Handed out just as it expired: ask again next time.
            let key = (
                caller.username.clone(),
                namespace.to_owned(),
                name.to_owned(),
            );
            self.access.invalidate(&key).await;
            Ok(Some(Instant::now()))
        } else {
            Err(ConnectRefusal::Forbidden(refusal(
                &caller.username,
                namespace,
                name,
            )))
        }
    }
}

/// The source whose budget a client's reviews come from: its IPv4 address
/// (an IPv4-mapped IPv6 address is one), or its IPv6 /64 — a host is
/// usually given a whole /64, so finer keys would give one host 2^64 budgets.
fn source_of(client: IpAddr) -> IpAddr {
    match client {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !(u128::MAX >> 64)).into()),
        },
    }
}

/// The caller a TokenReview's status names, or why it names no one: it must
/// be authenticated, for `audience` — named in `status.audiences`: an
/// authenticator that is not audience-aware answers none, which means the
/// API server's own audience (a token of the API server is no proxy
/// password) —, and name a user.
fn caller_of(status: TokenReviewStatus, audience: &str) -> Result<Caller, String> {
    if status.authenticated != Some(true) {
        return Err(format!(
            "the proxy password is not a valid token for audience {audience} (expired, revoked or unknown): mint a new kubeconfig"
        ));
    }
    let audiences = status.audiences.unwrap_or_default();
    if !audiences.iter().any(|a| a == audience) {
        return Err(format!(
            "the TokenReview did not confirm audience {audience} (it answered {audiences:?}): the proxy password must be a token for audience {audience}"
        ));
    }
    let UserInfo {
        username,
        uid,
        groups,
        extra,
    } = status.user.unwrap_or_default();
    let Some(username) = username.filter(|u| !u.is_empty()) else {
        return Err("the token names no user".into());
    };
    Ok(Caller {
        username,
        uid,
        groups: groups.unwrap_or_default(),
        extra: extra.unwrap_or_default(),
    })
}

/// The `exp` claim of a JWT, read without checking anything else: called
/// only on a token the TokenReview has just validated. `None` for a token
/// that is no JWT or has no `exp`.
fn jwt_expiry(token: &str) -> Option<SystemTime> {
    use base64::Engine as _;
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(exp))
}

/// `at` on the monotonic clock (now, if it has passed).
fn instant_of(at: SystemTime) -> Instant {
    let now = Instant::now();
    at.duration_since(SystemTime::now())
        .map_or(now, |left| now + left)
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
        let caller = self
            .authenticate(&request.credentials.password, request.client_addr.ip())
            .await?;
        let mut valid_until = caller.until;
        let caller = caller.value;
        if let Some(until) = self.may_use(&caller, namespace, name).await? {
            valid_until = valid_until.min(until);
        }
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
            valid_until,
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
    fn reviews_are_budgeted_per_ipv4_address_and_ipv6_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (client, source) in [
            ("10.1.2.3", "10.1.2.3"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"),
            ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::"),
            ("2001:db8:1:3::1", "2001:db8:1:3::"),
            ("::1", "::"),
        ] {
            assert_eq!(source_of(ip(client)), ip(source), "{client}");
        }
    }

    #[tokio::test]
    async fn cached_answers_expire_at_their_own_time() {
        let cache = timed_cache::<u8, bool>();
        let now = Instant::now();
        for (key, until) in [(1, now + Duration::from_secs(60)), (2, now)] {
            cache.insert(key, Timed { value: true, until }).await;
        }
        assert!(cache.get(&1).await.is_some());
        assert!(cache.get(&2).await.is_none(), "expired");
        assert!(cache.get(&3).await.is_none());
    }

    #[test]
    fn the_expiry_of_a_jwt_is_read_from_its_payload() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let jwt = format!(
            "{}.{}.c2ln",
            b64(r#"{"alg":"RS256"}"#),
            b64(r#"{"aud":["connectors.alauda.io"],"exp":1900000000,"sub":"x"}"#)
        );
        assert_eq!(
            jwt_expiry(&jwt),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000))
        );
        for opaque in ["opaque-sa-1234", "a.b", "a.b.c.d", "a.!!.c", ""] {
            assert_eq!(jwt_expiry(opaque), None, "{opaque}");
        }
        let no_exp = format!("{}.{}.c2ln", b64("{}"), b64(r#"{"sub":"x"}"#));
        assert_eq!(jwt_expiry(&no_exp), None);
    }

    fn status(authenticated: bool, audiences: Option<&[&str]>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: audiences.map(|a| a.iter().map(|s| s.to_string()).collect()),
            user: Some(UserInfo {
                username: Some("system:serviceaccount:team:bot".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The review must confirm the proxy's audience: an answer for other
    /// audiences, or for none (an authenticator that is not audience-aware:
    /// the API server's own audience), names no proxy caller.
    #[test]
    fn a_review_must_confirm_the_proxys_audience() {
        let aud = "connectors.alauda.io";
        let ok = caller_of(status(true, Some(&[aud])), aud).unwrap();
        assert_eq!(ok.username, "system:serviceaccount:team:bot");
        assert!(caller_of(status(true, Some(&["other", aud])), aud).is_ok());
        for (answer, what) in [
            (
                status(true, Some(&["https://kubernetes.default.svc"])),
                "other audiences",
            ),
            (status(true, Some(&[])), "no audience"),
            (status(true, None), "no audiences field"),
            (status(false, Some(&[aud])), "not authenticated"),
        ] {
            let why = caller_of(answer, aud).unwrap_err();
            assert!(why.contains(aud), "{what}: {why}");
        }
        let why =
            caller_of(status(true, Some(&["https://kubernetes.default.svc"])), aud).unwrap_err();
        assert!(why.contains("did not confirm audience"), "{why}");
    }
}

/// The whole authorizer against a test API server (a tower service in place
/// of the HTTP client: a mock at the boundary) that answers TokenReviews as
/// the test says and counts them.
#[cfg(test)]
mod with_a_test_api_server {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use tuna_proxy::{Authority, ProxyCredentials, UpstreamTarget};

    use super::*;
    use crate::connectors::targets::ProxyTarget;

    struct Fixture {
        authorizer: Arc<KubeAuthorizer>,
        reviews: Arc<AtomicUsize>,
    }

    fn fixture(status: serde_json::Value, options: AuthorizerOptions) -> Fixture {
        let reviews = Arc::new(AtomicUsize::new(0));
        let counted = reviews.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let status = status.clone();
            let counted = counted.clone();
            async move {
                assert!(req.uri().path().ends_with("/tokenreviews"), "{}", req.uri());
                counted.fetch_add(1, SeqCst);
                let body = serde_json::json!({
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "metadata": {},
                    "spec": {},
                    "status": status,
                });
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(201)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                )
            }
        });
        let targets = Arc::new(ProxyTargets::default());
        targets.set(
            "team",
            "conn",
            Ok(ProxyTarget {
                uid: "u".into(),
                authorities: vec![authority()],
                upstream: Arc::new(
                    UpstreamTarget::new(vec!["127.0.0.1:6443".parse().unwrap()], "127.0.0.1", None)
                        .unwrap(),
                ),
                authorization: Credential::new("Bearer real"),
            }),
        );
        Fixture {
            authorizer: Arc::new(KubeAuthorizer::with_options(
                Client::new(service, "default"),
                targets,
                options,
            )),
            reviews,
        }
    }

    fn authority() -> Authority {
        Authority {
            host: "127.0.0.1".into(),
            port: 6443,
        }
    }

    fn request(password: &str) -> ConnectRequest {
        ConnectRequest {
            authority: authority(),
            credentials: ProxyCredentials {
                username: "team/conn".into(),
                password: Credential::new(password),
            },
            client_addr: "127.0.0.1:40000".parse().unwrap(),
        }
    }

    fn valid_for(audiences: &[&str]) -> serde_json::Value {
        serde_json::json!({
            "authenticated": true,
            "user": {"username": "system:serviceaccount:team:bot"},
            "audiences": audiences,
        })
    }

    #[tokio::test]
    async fn a_token_whose_review_names_other_audiences_is_refused() {
        let aud = "connectors.alauda.io";
        let f = fixture(valid_for(&[aud]), AuthorizerOptions::new(aud));
        let grant = f.authorizer.authorize(request("good")).await.unwrap();
        assert!(grant.valid_until <= Instant::now() + Duration::from_secs(10));
        for answer in [
            valid_for(&["https://kubernetes.default.svc"]),
            valid_for(&[]),
        ] {
            let f = fixture(answer.clone(), AuthorizerOptions::new(aud));
            let refused = f.authorizer.authorize(request("good")).await.unwrap_err();
            match refused {
                ConnectRefusal::Unauthenticated(why) => {
                    assert!(why.contains("did not confirm audience"), "{answer}: {why}")
                }
                other => panic!("{answer}: {other:?}"),
            }
        }
    }

    /// Concurrent CONNECTs with one wrong password cost one review; many
    /// distinct wrong passwords, no more than the budget, the rest `429`.
    #[tokio::test]
    async fn wrong_passwords_cost_one_review_each_within_a_budget() {
        let mut options = AuthorizerOptions::new("connectors.alauda.io");
        options.reviews_per_second = NonZeroU32::new(1).unwrap();
        options.review_burst = NonZeroU32::new(3).unwrap();
        let f = fixture(serde_json::json!({"authenticated": false}), options);
        let same =
            futures::future::join_all((0..20).map(|_| f.authorizer.authorize(request("garbage"))))
                .await;
        assert!(
            same.iter()
                .all(|r| matches!(r, Err(ConnectRefusal::Unauthenticated(_))))
        );
        assert_eq!(f.reviews.load(SeqCst), 1, "one review for 20 CONNECTs");
        let started = Instant::now();
        let distinct = futures::future::join_all(
            (0..20).map(|i| f.authorizer.authorize(request(&format!("garbage-{i}")))),
        )
        .await;
        let elapsed = started.elapsed().as_secs() + 1;
        let reviewed = f.reviews.load(SeqCst) - 1;
        let limited = distinct
            .iter()
            .filter(|r| matches!(r, Err(ConnectRefusal::TooManyRequests { .. })))
            .count();
        assert!(
            reviewed as u64 <= 2 + elapsed,
            "{reviewed} reviews within the burst (3, one spent) and 1/s"
        );
        assert_eq!(reviewed + limited, 20, "each one reviewed or refused 429");
    }
}
