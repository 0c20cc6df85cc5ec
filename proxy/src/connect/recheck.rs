//! The grant of one open CONNECT connection, checked again once it is due:
//! before a request ([`LiveGrant::current`], from the request path) and at
//! its deadline even when no request comes ([`LiveGrant::until_refused`],
//! beside the connection), so that neither a kept-alive connection nor a
//! long watch outlives a revocation by more than the authorizer's
//! `valid_until` allows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use http::HeaderValue;

use super::grant::{ConnectAuthorizer, ConnectGrant, ConnectRefusal, ConnectRequest, MIN_RECHECK};
use crate::http::{Pinned, PinnedGrant, PinnedRefusal};
use crate::metrics::{ConnectOutcome, HostStats};
use crate::routes::{CompiledBackend, UpstreamTarget};
use crate::shared::Shared;

/// What the connection may do now.
struct Current {
    pinned: Arc<Pinned>,
    /// The grant's upstream, to tell whether a new grant changed it.
    target: Arc<UpstreamTarget>,
    recheck_at: Instant,
}

/// The grant of one connection, and how to ask for it again.
pub(crate) struct LiveGrant {
    authorizer: Arc<dyn ConnectAuthorizer>,
    /// The CONNECT as it was asked (its credentials stay in memory, masked
    /// in `Debug`, for as long as the connection lives).
    request: ConnectRequest,
    authorize_timeout: Duration,
    upstream_idle: Duration,
    stats: Arc<HostStats>,
    shared: Arc<Shared>,
    state: tokio::sync::Mutex<Result<Current, ConnectRefusal>>,
    /// A request was answered with the refusal: its response is under way.
    answered: AtomicBool,
    /// Requests waiting for the grant (for a re-check under way).
    waiting: AtomicUsize,
}

impl LiveGrant {
    /// The connection's first grant, checked by the CONNECT; `Err` when its
    /// credentials cannot be sent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        grant: ConnectGrant,
        authorizer: Arc<dyn ConnectAuthorizer>,
        request: ConnectRequest,
        authorize_timeout: Duration,
        upstream_idle: Duration,
        stats: Arc<HostStats>,
        shared: Arc<Shared>,
    ) -> Result<Self, ConnectRefusal> {
        let mut live = Self {
            authorizer,
            request,
            authorize_timeout,
            upstream_idle,
            stats,
            shared,
            state: tokio::sync::Mutex::new(Err(ConnectRefusal::Unavailable(String::new()))),
            answered: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
        };
        let current = live.pin(grant, None)?;
        *live.state.get_mut() = Ok(current);
        Ok(live)
    }

    /// The grant's label, for logs.
    pub(crate) fn label(&self) -> String {
        self.state
            .try_lock()
            .ok()
            .and_then(|s| s.as_ref().ok().map(|c| c.pinned.label.to_string()))
            .unwrap_or_default()
    }

    fn pin(
        &self,
        grant: ConnectGrant,
        before: Option<&Current>,
    ) -> Result<Current, ConnectRefusal> {
        let mut authorization =
            HeaderValue::from_str(grant.authorization.expose()).map_err(|_| {
                ConnectRefusal::Unavailable(
                    "the connector's credentials cannot be sent in a header".into(),
                )
            })?;
        authorization.set_sensitive(true);
        // The same upstream keeps its compiled backend (and its pool).
        let backend = match before {
            Some(b) if Arc::ptr_eq(&b.target, &grant.target) => b.pinned.backend.clone(),
            _ => Arc::new(CompiledBackend::pinned(
                &grant.target,
                self.upstream_idle,
                self.stats.clone(),
                &self.shared.config,
            )),
        };
        Ok(Current {
            pinned: Arc::new(Pinned {
                backend,
                authorization,
                label: grant.label.into(),
            }),
            target: grant.target,
            recheck_at: grant.valid_until.max(Instant::now() + MIN_RECHECK),
        })
    }

    /// What a request may use now: the grant, checked again first if it is
    /// due. A refusal is final for the connection.
    pub(crate) async fn current(&self) -> Result<Arc<Pinned>, ConnectRefusal> {
        let mut state = self.state.lock().await;
        match &*state {
            Err(refusal) => return Err(refusal.clone()),
            Ok(c) if Instant::now() < c.recheck_at => return Ok(c.pinned.clone()),
            Ok(_) => {}
        }
        let answer = tokio::time::timeout(
            self.authorize_timeout,
            self.authorizer.reauthorize(self.request.clone()),
        )
        .await
        .unwrap_or_else(|_| {
            // Unknown is not allowed: a connection that cannot be checked
            // again is closed, and a new CONNECT may try.
            Err(ConnectRefusal::Unavailable(
                "the proxy could not check the credentials again in time; reconnect".into(),
            ))
        });
        let next = answer.and_then(|grant| self.pin(grant, state.as_ref().ok()));
        match next {
            Ok(current) => {
                let pinned = current.pinned.clone();
                *state = Ok(current);
                Ok(pinned)
            }
            Err(refusal) => {
                self.shared.metrics.connect_outcome(ConnectOutcome::Revoked);
                tracing::debug!(
                    client = %self.request.client_addr,
                    target = %self.request.authority,
                    status = refusal.status(),
                    reason = refusal.message(),
                    "open CONNECT connection refused on its re-check; closing it"
                );
                *state = Err(refusal.clone());
                Err(refusal)
            }
        }
    }

    /// [`Self::current`] for a request: a refusal is the request's to
    /// answer, and the connection is given a moment to send it before it
    /// is closed.
    pub(crate) async fn for_request(&self) -> Result<Arc<Pinned>, ConnectRefusal> {
        self.waiting.fetch_add(1, Relaxed);
        let answer = self.current().await;
        if answer.is_err() {
            self.answered.store(true, Relaxed);
        }
        self.waiting.fetch_sub(1, Relaxed);
        answer
    }

    /// Whether a request is answering the refusal, or about to.
    pub(crate) fn answering(&self) -> bool {
        self.answered.load(Relaxed) || self.waiting.load(Relaxed) > 0
    }

    /// Re-checks at every deadline, requests or not; returns the refusal
    /// that ends the connection.
    pub(crate) async fn until_refused(&self) -> ConnectRefusal {
        loop {
            let due = match &*self.state.lock().await {
                Err(refusal) => return refusal.clone(),
                Ok(c) => c.recheck_at,
            };
            tokio::time::sleep_until(due.into()).await;
            if let Err(refusal) = self.current().await {
                return refusal;
            }
        }
    }
}

#[async_trait::async_trait]
impl PinnedGrant for LiveGrant {
    async fn for_request(&self) -> Result<Arc<Pinned>, PinnedRefusal> {
        LiveGrant::for_request(self)
            .await
            .map_err(|refusal| PinnedRefusal {
                status: refusal.status(),
                message: refusal.message().to_owned(),
            })
    }
}
