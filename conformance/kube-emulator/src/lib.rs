//! # kube-emulator
//!
//! An in-memory, Kubernetes-API-compatible server for end-to-end tests. The real `kubectl`
//! (1.32) and kube-rs (client and runtime) work against it; RBAC is enforced for every request
//! that is not made with the admin token, and every request is audited.
//!
//! ## Use from tests
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use kube_emulator::{Emulator, Options};
//!
//! let emu = Emulator::start(Options::default()).await?;
//! // Admin kubeconfig (written at start, deleted with the handle) for kubectl/the operator:
//! let kubeconfig = emu.kubeconfig_path();
//! // kube-rs client as admin:
//! let client = emu.client().await?;
//! // Load CRDs, RBAC, … (multi-document YAML):
//! emu.apply_yaml("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: op, namespace: default}\n")?;
//! // A token / kubeconfig / client acting as a ServiceAccount, subject to RBAC:
//! let token = emu.token_for_service_account("default", "op");
//! let sa_client = emu.client_for_token(&token).await?;
//! emu.write_kubeconfig(std::path::Path::new("/tmp/op.kubeconfig"), &token)?;
//! // What happened, for assertions such as "the operator only ever used get on secrets":
//! let secrets_verbs: Vec<String> = emu.audit_entries().into_iter()
//!     .filter(|e| e.resource == "secrets").map(|e| e.verb).collect();
//! // A readiness signal instead of a sleep: wait until something has started watching widgets.
//! emu.wait_for_audit(|e| e.resource == "widgets" && e.verb == "watch").await;
//! # let _ = (kubeconfig, client, sa_client, secrets_verbs); Ok(()) }
//! ```
//!
//! ## Command line
//!
//! ```text
//! kube-emulator --kubeconfig-out admin.kubeconfig [--port 6443] [--audit-log audit.jsonl] \
//!     [-f crds/ -f rbac.yaml …] [--sa-kubeconfig tuna-system/operator=operator.kubeconfig] \
//!     [--plain-http]
//! kubectl --kubeconfig admin.kubeconfig get namespaces
//! ```
//!
//! It serves HTTPS on 127.0.0.1 with a throw-away CA embedded in the kubeconfigs it writes,
//! prints where it listens, and runs until Ctrl-C. `-f` takes files or directories of
//! multi-document YAML (loaded in name order, as admin); `--sa-kubeconfig` (repeatable) writes
//! a kubeconfig whose token acts as that ServiceAccount (created if absent), subject to RBAC.
//!
//! ## Contract
//!
//! - **Storage**: one global resourceVersion; `uid`, `creationTimestamp`, `generation` (for
//!   CRs, ingresses, ingressclasses, deployments, daemonsets, csidrivers, poddisruptionbudgets and CRDs: bumped when anything outside
//!   metadata changes, status excluded when a status subresource exists); optimistic concurrency (409 on a stale `metadata.resourceVersion`); a write that
//!   changes nothing keeps the resourceVersion and emits no watch event.
//! - **Kinds**: core v1 namespaces, services, secrets, configmaps, serviceaccounts (+`token`),
//!   events, endpoints, pods (stored only); events.k8s.io/v1 events (same storage as core events);
//!   networking.k8s.io/v1 ingresses (+status), ingressclasses; coordination.k8s.io/v1 leases;
//!   apps/v1 deployments and daemonsets (+status, stored only; nothing runs);
//!   storage.k8s.io/v1 csidrivers (stored only); policy/v1 poddisruptionbudgets (+status,
//!   stored only); discovery.k8s.io/v1 endpointslices;
//!   apiextensions.k8s.io/v1 CRDs (served immediately, discovery and OpenAPI included);
//!   rbac.authorization.k8s.io/v1; admissionregistration.k8s.io/v1
//!   validatingadmissionpolicies (+status) and validatingadmissionpolicybindings,
//!   enforced (see below); authentication.k8s.io/v1 tokenreviews;
//!   authentication.k8s.io/v1 selfsubjectreviews; authorization.k8s.io/v1 subjectaccessreviews,
//!   selfsubjectaccessreviews and selfsubjectrulesreviews.
//! - **Verbs**: get, list (label selectors incl. set-based, field selectors `metadata.name`,
//!   `metadata.namespace`, `involvedObject.*`/`regarding.*` for events, `limit`/`continue`:
//!   every page from one snapshot at the first page's resourceVersion, rebuilt from the watch
//!   history, else 410 Gone),
//!   watch (`resourceVersion` resumption from a 20 000-event history, else 410 Gone; bookmarks;
//!   `timeoutSeconds`; `sendInitialEvents`), create, update, patch (merge, JSON patch incl.
//!   `test`, strategic merge for built-in kinds, server-side apply), delete (finalizers →
//!   deletionTimestamp; propagationPolicy Background/Foreground/Orphan; ownerReference GC;
//!   namespace deletion empties the namespace), deletecollection; `dryRun=All`.
//! - **Server-side apply** tracks field ownership in `managedFields` for Apply operations only;
//!   a changed field owned by another applier is a 409 conflict unless `force=true`; fields a
//!   manager stops applying are removed unless another manager owns them. Updates by
//!   PUT/merge/JSON/strategic patch take no ownership (they never cause apply conflicts). Lists
//!   are owned atomically.
//! - **Custom resources** are pruned, defaulted and validated against `openAPIV3Schema`
//!   (types, required, enum, pattern, bounds, lengths, nullable, preserve-unknown-fields,
//!   allOf/anyOf/oneOf/not) and their CEL `x-kubernetes-validations` (transition rules
//!   included) via `kube-cel`. `fieldValidation=Strict` rejects unknown fields (400);
//!   the default (Warn) drops them with a `Warning` header.
//! - **Built-in kinds** are decoded into their k8s-openapi types: wrong types are 422, unknown
//!   fields are handled as for custom resources. No other built-in validation (required
//!   fields, immutability, value formats) is done.
//! - **Encodings**: JSON in and out (YAML bodies accepted), `Table` and
//!   `PartialObjectMetadata` answers when the `Accept` header asks for them (kube-rs's
//!   `metadata_watcher`). Protobuf request bodies: see kubectl below.
//! - **kubectl**: `/version`, legacy and aggregated discovery, `/openapi/v3` (per group-version
//!   documents from CRD schemas; built-in kinds get untyped schemas, so `explain` only
//!   describes custom kinds), `Table` answers with CRD printer columns and apiserver-like
//!   columns for services, ingresses, configmaps, secrets, events, leases, namespaces and CRDs
//!   (NAME/AGE otherwise). `/openapi/v2` is 404 (kubectl tolerates it). client-go's typed
//!   clients (`kubectl create …`, `create token`, `auth can-i`, Helm's release storage) send
//!   protobuf bodies: those of every built-in kind and of `DeleteOptions` are decoded (the
//!   schema in `src/protobuf_schema.txt` is generated from the `k8s-pb` and `k8s-openapi`
//!   sources; see `src/protobuf.rs` for how empty and zero values are read).
//! - **Auth**: bearer tokens only (TLS by default, since kubectl sends no token over plain
//!   HTTP; with `tls: false` tokenless requests act as admin). The admin token (group
//!   `system:masters`) bypasses RBAC; ServiceAccount tokens (from
//!   [`EmulatorHandle::token_for_service_account`] or the TokenRequest API) are opaque and die
//!   with their ServiceAccount or at their expiry ([`EmulatorHandle::expire_token`] ends one
//!   early); static users come from [`EmulatorHandle::token_for_user`]. Tokens carry
//!   audiences as on the API server: a TokenRequest's `spec.audiences` (default: the API
//!   server's own, [`API_AUDIENCE`]); only tokens for the API audience authenticate API
//!   requests; a TokenReview authenticates a token whose audiences meet `spec.audiences`
//!   (default: the API audience) and answers the intersection; static tokens count as
//!   API-audience tokens. TokenRequest refuses `expirationSeconds` under 600 or over 2³²
//!   (422, as the API server). A TokenRequest may bind the token to a Pod
//!   (`spec.boundObjectRef`, kind `Pod`, as the API server documents it): the Pod must exist
//!   (404), match the reference's `uid` (409) and run as that ServiceAccount (400); the token
//!   stops authenticating once that Pod is gone or replaced, and a TokenReview of it names
//!   the Pod in `user.extra` (`authentication.kubernetes.io/pod-name`, `…/pod-uid`). Other
//!   kinds of bound objects (Secret, Node) are refused with 400.
//!   Aggregated ClusterRoles (`aggregationRule`) are expanded; of the default roles only
//!   `cluster-admin` exists. Discovery, OpenAPI and the self reviews are open to every
//!   authenticated user. A list/watch with `fieldSelector=metadata.name=X` is authorized as a
//!   request for X (so `resourceNames` rules apply).
//! - **Admission**: ValidatingAdmissionPolicies and their bindings judge every create,
//!   update, patch, server-side apply and delete a client asks for (manifests loaded with
//!   [`EmulatorHandle::apply_yaml`] count as the admin's), after defaulting and schema
//!   validation, with the CEL variables the API server binds, `authorizer` checks answered
//!   by the emulator's RBAC for the requesting user, and the API server's wording of a
//!   denial (`<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with
//!   binding '<binding>' denied request: <message>`); `Warn` gives `Warning` headers,
//!   `Audit` the audit entry's `annotations`. Policy parameters (`paramKind`, `paramRef`)
//!   are refused with 422; `auditAnnotations` are not evaluated (see `src/admission.rs`).
//! - Not implemented: impersonation, protobuf answers, CRD version conversion (all versions share storage), the
//!   `scale` subresource, admission webhooks, pods actually running, `exec`/`logs`/`port-forward`.

mod admission;
mod builtin;
mod discovery;
mod error;
mod patch;
mod protobuf;
mod rbac;
mod registry;
mod schema;
mod selector;
mod server;
mod store;
mod table;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use error::{ApiError, Error, Result};
pub use server::AuditEntry;
use server::Shared;
pub use store::API_AUDIENCE;
use store::WriteOptions;

/// How to start an emulator. `Options::default()` is what tests want: 127.0.0.1, a free port,
/// HTTPS with a generated CA, no audit file.
#[derive(Debug, Clone)]
pub struct Options {
    /// Address to bind (port 0 picks a free port).
    pub bind: SocketAddr,
    /// Serve HTTPS with a freshly generated CA (embedded in written kubeconfigs). Default: on.
    ///
    /// kubectl (client-go) never sends a bearer token over plain HTTP, so with `tls: false`
    /// requests without a token act as admin: RBAC then only applies to clients that do send
    /// tokens over HTTP (kube-rs does). Keep TLS on to check RBAC with kubectl.
    pub tls: bool,
    /// Append audit entries as JSON lines to this file.
    pub audit_log: Option<PathBuf>,
    /// Write the admin kubeconfig here (default: a temporary file owned by the handle).
    pub kubeconfig_out: Option<PathBuf>,
    /// Manifests (files or directories of `.yaml`/`.yml`/`.json`) loaded at start, as admin.
    pub manifests: Vec<PathBuf>,
    /// Fixed admin token (default: random).
    pub admin_token: Option<String>,
    /// How often an idle watch with `allowWatchBookmarks=true` gets a BOOKMARK.
    pub bookmark_interval: Duration,
    /// How many past changes are kept for watches resuming from an old resourceVersion
    /// (older ones get `410 Gone`, and clients relist).
    pub watch_history: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: true,
            audit_log: None,
            kubeconfig_out: None,
            manifests: Vec::new(),
            admin_token: None,
            bookmark_interval: Duration::from_secs(5),
            watch_history: 20_000,
        }
    }
}

/// Entry point: see the crate documentation.
pub struct Emulator;

impl Emulator {
    /// Binds, loads the manifests, writes the admin kubeconfig and starts serving.
    pub async fn start(opts: Options) -> Result<EmulatorHandle> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = TcpListener::bind(opts.bind)
            .await
            .map_err(|source| Error::Listen {
                addr: opts.bind.to_string(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Listen {
            addr: opts.bind.to_string(),
            source,
        })?;
        let audit_file = match &opts.audit_log {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|source| Error::Io {
                        path: p.display().to_string(),
                        source,
                    })?,
            ),
            None => None,
        };
        let admin_token = opts
            .admin_token
            .clone()
            .unwrap_or_else(|| format!("kube-emulator-admin-{}", uuid::Uuid::new_v4().simple()));
        let shared = Arc::new(Shared::new(
            admin_token.clone(),
            audit_file,
            opts.bookmark_interval,
            !opts.tls,
            opts.watch_history,
        ));
        let tls = if opts.tls {
            Some(tls::generate()?)
        } else {
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        let acceptor = tls.as_ref().map(|t| t.acceptor.clone());
        let serve_shared = shared.clone();
        let task = tokio::spawn(serve(listener, serve_shared, acceptor));
        let temp_dir = tempfile::tempdir().map_err(|source| Error::Io {
            path: "temporary directory".into(),
            source,
        })?;
        let kubeconfig_path = opts
            .kubeconfig_out
            .clone()
            .unwrap_or_else(|| temp_dir.path().join("admin.kubeconfig"));
        let handle = EmulatorHandle {
            url,
            addr,
            admin_token,
            ca_pem: tls.map(|t| t.ca_pem),
            shared,
            task,
            kubeconfig_path,
            _temp_dir: temp_dir,
        };
        handle.write_kubeconfig(&handle.kubeconfig_path, &handle.admin_token.clone())?;
        for m in &opts.manifests {
            handle.apply_path(m)?;
        }
        Ok(handle)
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>, tls: Option<tokio_rustls::TlsAcceptor>) {
    let mut conns = tokio::task::JoinSet::new();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let shared = shared.clone();
        async move { server::handle(shared, req).await }
    });
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let tls = tls.clone();
        conns.spawn(async move {
            let builder = hyper::server::conn::http1::Builder::new();
            match tls {
                Some(acc) => match acc.accept(stream).await {
                    Ok(s) => {
                        let _ = builder
                            .serve_connection(hyper_util::rt::TokioIo::new(s), service)
                            .await;
                    }
                    Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
                },
                None => {
                    let _ = builder
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

/// A running emulator. Dropping it stops the server (and its open watches).
pub struct EmulatorHandle {
    url: String,
    addr: SocketAddr,
    admin_token: String,
    ca_pem: Option<String>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    kubeconfig_path: PathBuf,
    _temp_dir: tempfile::TempDir,
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EmulatorHandle {
    /// `http://127.0.0.1:PORT` (or `https://…` with TLS).
    pub fn url(&self) -> &str {
        &self.url
    }
    /// The bound socket address (the port chosen when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// Bearer token of the admin identity (group `system:masters`, bypasses RBAC).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }
    /// PEM of the generated CA when serving TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }
    /// The admin kubeconfig written at start.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// Writes a kubeconfig for `token` (context `kube-emulator`, namespace `default`).
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        use base64::Engine;
        let mut cluster = json!({"server": self.url});
        if let Some(ca) = &self.ca_pem {
            cluster["certificate-authority-data"] =
                json!(base64::engine::general_purpose::STANDARD.encode(ca));
        }
        let cfg = json!({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "kube-emulator", "cluster": cluster}],
            "users": [{"name": "kube-emulator-user", "user": {"token": token}}],
            "contexts": [{"name": "kube-emulator", "context": {"cluster": "kube-emulator", "user": "kube-emulator-user", "namespace": "default"}}],
            "current-context": "kube-emulator",
        });
        let text = serde_saphyr::to_string(&cfg).map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
        std::fs::write(path, text).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Issues a token for a ServiceAccount, creating the ServiceAccount (and its namespace) if absent.
    pub fn token_for_service_account(&self, namespace: &str, name: &str) -> String {
        let mut st = self.shared.state.lock();
        let ns_rt = st
            .registry
            .lookup("", "v1", "namespaces")
            .cloned()
            .expect("built in");
        if st.get(&ns_rt, "", namespace).is_err() {
            let _ = st.create(
                &ns_rt,
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
                &WriteOptions::default(),
            );
        }
        let sa_rt = st
            .registry
            .lookup("", "v1", "serviceaccounts")
            .cloned()
            .expect("built in");
        if st.get(&sa_rt, namespace, name).is_err() {
            let _ = st.create(
                &sa_rt,
                namespace,
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
                &WriteOptions::default(),
            );
        }
        st.issue_sa_token(
            namespace,
            name,
            None,
            vec![store::API_AUDIENCE.to_owned()],
            None,
        )
        .map(|(t, _)| t)
        .unwrap_or_default()
    }

    /// Writes a kubeconfig acting as a ServiceAccount (see [`Self::token_for_service_account`]).
    pub fn write_service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<String> {
        let token = self.token_for_service_account(namespace, name);
        self.write_kubeconfig(path, &token)?;
        Ok(token)
    }

    /// A static user token (`username`, `groups`), subject to RBAC.
    pub fn token_for_user(&self, username: &str, groups: &[&str]) -> String {
        let token = format!("kube-emulator-user-{}", uuid::Uuid::new_v4().simple());
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        groups.push("system:authenticated".into());
        let id = store::Identity {
            username: username.into(),
            uid: uuid::Uuid::new_v4().to_string(),
            groups,
            service_account: None,
        };
        self.shared.state.lock().tokens.insert(
            token.clone(),
            store::IssuedToken {
                identity: id,
                expires: None,
                audiences: None,
                bound_pod: None,
            },
        );
        token
    }

    /// Makes `token` expire now: the test's stand-in for waiting out a
    /// token's lifetime (TokenRequest refuses lifetimes under ten minutes, as
    /// the API server does). Returns whether the token existed.
    pub fn expire_token(&self, token: &str) -> bool {
        let mut st = self.shared.state.lock();
        match st.tokens.get_mut(token) {
            Some(t) => {
                t.expires = Some(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1));
                true
            }
            None => false,
        }
    }

    /// A kube-rs client acting as admin.
    pub async fn client(&self) -> Result<kube::Client> {
        self.client_for_token(&self.admin_token.clone()).await
    }

    /// A kube-rs client acting with `token`.
    pub async fn client_for_token(&self, token: &str) -> Result<kube::Client> {
        let dir = tempfile::tempdir().map_err(|source| Error::Io {
            path: "temporary directory".into(),
            source,
        })?;
        let path = dir.path().join("kubeconfig");
        self.write_kubeconfig(&path, token)?;
        let kc =
            kube::config::Kubeconfig::read_from(&path).map_err(|e| Error::Client(e.to_string()))?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Client(e.to_string()))?;
        kube::Client::try_from(cfg).map_err(|e| Error::Client(e.to_string()))
    }

    /// Everything audited so far, oldest first.
    pub fn audit_entries(&self) -> Vec<AuditEntry> {
        self.shared.audit.lock().clone()
    }

    /// Waits until a request matching `pred` has been audited (e.g. "the operator has started
    /// watching widgets") and returns its entry; a readiness signal for tests, instead of sleeps.
    pub async fn wait_for_audit(&self, pred: impl Fn(&AuditEntry) -> bool) -> AuditEntry {
        self.wait_for_audit_count(1, pred).await.remove(0)
    }

    /// Waits until at least `n` audited requests match `pred`; returns the matching entries.
    pub async fn wait_for_audit_count(
        &self,
        n: usize,
        pred: impl Fn(&AuditEntry) -> bool,
    ) -> Vec<AuditEntry> {
        let mut rx = self.shared.audit_seq.subscribe();
        loop {
            rx.mark_unchanged();
            let found: Vec<AuditEntry> = self
                .shared
                .audit
                .lock()
                .iter()
                .filter(|e| pred(e))
                .cloned()
                .collect();
            if found.len() >= n {
                return found;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`; this cannot end while we borrow it.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Creates or replaces (as admin) every object of a multi-document YAML/JSON text.
    pub fn apply_yaml(&self, text: &str) -> Result<Vec<Value>> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| Error::Manifest {
            path: "<inline>".into(),
            message: e.to_string(),
        })?;
        let mut out = Vec::new();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let items = if doc["kind"].as_str().is_some_and(|k| k.ends_with("List"))
                && doc["items"].is_array()
            {
                doc["items"].as_array().cloned().unwrap_or_default()
            } else {
                vec![doc]
            };
            for item in items {
                out.push(self.apply_object(item)?);
            }
        }
        Ok(out)
    }

    fn apply_object(&self, obj: Value) -> Result<Value> {
        let what = format!(
            "{} {}",
            obj["kind"].as_str().unwrap_or("?"),
            obj["metadata"]["name"].as_str().unwrap_or("?")
        );
        let mut st = self.shared.state.lock();
        let rt = st
            .registry
            .by_kind(
                obj["apiVersion"].as_str().unwrap_or_default(),
                obj["kind"].as_str().unwrap_or_default(),
            )
            .cloned()
            .ok_or_else(|| Error::Rejected {
                what: what.clone(),
                status: "no such kind is served (is its CRD loaded first?)".into(),
            })?;
        let ns = if rt.namespaced {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let stored = store::to_stored(&rt, obj);
        // Manifests are loaded as admin, admission policies included.
        let opts = WriteOptions {
            user: Some(Shared::admin_identity()),
            ..WriteOptions::default()
        };
        let res = match st.get(&rt, &ns, &name) {
            Ok(cur) => {
                let mut new = stored;
                new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
                st.update(&rt, &ns, &name, new, true, &opts)
            }
            Err(_) => st.create(&rt, &ns, stored, &opts),
        };
        res.map(|o| store::from_stored(&rt, o))
            .map_err(|e| Error::Rejected {
                what,
                status: e.message,
            })
    }

    /// Loads a manifest file, or every `.yaml`/`.yml`/`.json` file of a directory (sorted).
    pub fn apply_path(&self, path: &Path) -> Result<Vec<Value>> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_dir()
                        || p.extension()
                            .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
                })
                .collect();
            files.sort();
            let mut out = Vec::new();
            for f in files {
                out.extend(self.apply_path(&f)?);
            }
            return Ok(out);
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        self.apply_yaml(&text).map_err(|e| match e {
            Error::Manifest { message, .. } => Error::Manifest {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }
}

mod tls {
    //! A throw-away CA and a server certificate for 127.0.0.1/localhost.
    use std::sync::Arc;

    use crate::{Error, Result};

    pub struct Tls {
        pub acceptor: tokio_rustls::TlsAcceptor,
        pub ca_pem: String,
    }

    pub fn generate() -> Result<Tls> {
        let e = |e: rcgen::Error| Error::Tls(e.to_string());
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-emulator CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = rcgen::KeyPair::generate().map_err(e)?;
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(e)?;
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .map_err(e)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-emulator");
        let key = rcgen::KeyPair::generate().map_err(e)?;
        let cert = params.signed_by(&key, &ca).map_err(e)?;
        let key_der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|x| Error::Tls(x.to_string()))?;
        let mut cfg = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), ca.der().clone()], key_der)
            .map_err(|x| Error::Tls(x.to_string()))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(cfg)),
            ca_pem: ca.pem(),
        })
    }
}
