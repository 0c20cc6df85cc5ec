//! The HTTP layer: routing of Kubernetes API paths, authentication, RBAC, audit, and the
//! encodings kubectl and kube-rs ask for (JSON, Table, watch streams, discovery, OpenAPI).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::discovery;
use crate::error::ApiError;
use crate::rbac::{self, Attributes, ResourceAttributes};
use crate::registry::{ResourceType, Special};
use crate::schema::FieldValidation;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{
    self, EventKind, Identity, PatchType, Propagation, State, WatchEvent, WriteOptions,
    from_stored, meta_str, to_stored,
};
use crate::table;

/// One audited request (also written as a JSON line to the audit log file, if any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The authenticated user's name (`system:serviceaccount:ns:name`, …).
    pub user: String,
    /// The user's groups.
    pub groups: Vec<String>,
    /// The RBAC verb (`get`, `list`, `watch`, `create`, `patch`, …).
    pub verb: String,
    /// The API group; empty for the core group.
    pub group: String,
    /// The resource (`pods`); empty for non-resource requests.
    pub resource: String,
    /// The subresource (`status`, `token`); empty when none.
    pub subresource: String,
    /// The namespace; empty for cluster-scoped requests.
    pub namespace: String,
    /// The object's name as RBAC sees it: from the path, or from a list or
    /// watch's `metadata.name=` field selector; empty otherwise.
    pub name: String,
    /// Path of non-resource requests (`/version`, `/apis`, …); empty for resource requests.
    pub path: String,
    /// HTTP status code of the answer.
    pub code: u16,
    /// `User-Agent` of the client, to tell apart components sharing a token.
    #[serde(default)]
    pub user_agent: String,
    /// Annotations of the request (admission policies bound with `Audit`:
    /// `validation.policy.admission.k8s.io/validation_failure`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// Audit annotations a response carries to [`handle`]'s audit entry.
#[derive(Debug, Clone)]
struct AuditAnnotations(std::collections::BTreeMap<String, String>);

/// State shared by every connection.
pub struct Shared {
    pub state: Mutex<State>,
    pub admin_token: String,
    pub audit: Mutex<Vec<AuditEntry>>,
    pub audit_file: Option<Mutex<std::fs::File>>,
    pub bookmark_interval: Duration,
    /// Plain-HTTP mode: kubectl sends no token there, so tokenless requests act as admin.
    pub anonymous_is_admin: bool,
    /// Bumped on every audit entry, so tests can wait for a request instead of sleeping.
    pub audit_seq: tokio::sync::watch::Sender<usize>,
}

impl Shared {
    pub fn new(
        admin_token: String,
        audit_file: Option<std::fs::File>,
        bookmark_interval: Duration,
        anonymous_is_admin: bool,
        watch_history: usize,
    ) -> Self {
        let (tx, _) = broadcast::channel(8192);
        Shared {
            state: Mutex::new(State::new(tx, watch_history)),
            admin_token,
            audit: Mutex::new(Vec::new()),
            audit_file: audit_file.map(Mutex::new),
            bookmark_interval,
            anonymous_is_admin,
            audit_seq: tokio::sync::watch::Sender::new(0),
        }
    }

    pub fn admin_identity() -> Identity {
        Identity {
            username: "kube-emulator-admin".into(),
            uid: "admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            service_account: None,
        }
    }

    fn authenticate(&self, headers: &HeaderMap) -> Option<Identity> {
        let Some(auth) = headers.get(header::AUTHORIZATION) else {
            return self.anonymous_is_admin.then(Self::admin_identity);
        };
        let token = auth.to_str().ok()?.strip_prefix("Bearer ")?.trim();
        if token == self.admin_token {
            return Some(Self::admin_identity());
        }
        self.state.lock().authenticate(token)
    }

    /// Resolves `token` for `audiences` (a TokenReview's; empty: the API
    /// server's): the identity and the audiences it is valid for, or why not.
    fn review(
        &self,
        st: &State,
        token: &str,
        audiences: &[String],
    ) -> Result<(Identity, Vec<String>), String> {
        let api = [store::API_AUDIENCE.to_owned()];
        let wanted: &[String] = if audiences.is_empty() {
            &api
        } else {
            audiences
        };
        if token == self.admin_token {
            // A static token knows no audience: valid for the API server's own.
            return if wanted.iter().any(|a| a == store::API_AUDIENCE) {
                Ok((Self::admin_identity(), vec![store::API_AUDIENCE.to_owned()]))
            } else {
                Err(format!(
                    "token audiences {api:?} is invalid for the target audiences {wanted:?}"
                ))
            };
        }
        st.authenticate_for(token, wanted)
    }

    fn record(&self, entry: AuditEntry) {
        if let Some(f) = &self.audit_file {
            let mut f = f.lock();
            let _ = writeln!(f, "{}", serde_json::to_string(&entry).unwrap_or_default());
        }
        self.audit.lock().push(entry);
        self.audit_seq.send_modify(|n| *n += 1);
    }
}

impl State {
    /// Resolves a bearer token of an API request: only tokens meant for the API
    /// server's audience do.
    pub fn authenticate(&self, token: &str) -> Option<Identity> {
        self.authenticate_for(token, &[store::API_AUDIENCE.to_owned()])
            .ok()
            .map(|(id, _)| id)
    }

    /// Resolves a bearer token meant for one of `audiences`; ServiceAccount tokens die with
    /// their ServiceAccount or at expiry. Answers the audiences it is valid for.
    pub fn authenticate_for(
        &self,
        token: &str,
        audiences: &[String],
    ) -> Result<(Identity, Vec<String>), String> {
        let invalid = || "invalid bearer token".to_owned();
        let issued = self.tokens.get(token).ok_or_else(invalid)?;
        if issued.expires.is_some_and(|e| e < jiff::Timestamp::now()) {
            return Err("invalid bearer token, token has expired".into());
        }
        let id = &issued.identity;
        if let Some((ns, name)) = &id.service_account {
            let sa = self
                .get_opt("/serviceaccounts", ns, name)
                .ok_or_else(invalid)?;
            if meta_str(sa, "uid") != id.uid {
                return Err(invalid());
            }
            if let Some((pod, uid)) = &issued.bound_pod {
                let alive = self
                    .get_opt("/pods", ns, pod)
                    .is_some_and(|p| meta_str(p, "uid") == uid);
                if !alive {
                    return Err("invalid bearer token, service account token has been invalidated (its pod is gone)".into());
                }
            }
        }
        let has: Vec<String> = issued
            .audiences
            .clone()
            .unwrap_or_else(|| vec![store::API_AUDIENCE.to_owned()]);
        let common: Vec<String> = audiences
            .iter()
            .filter(|a| has.contains(a))
            .cloned()
            .collect();
        if common.is_empty() {
            return Err(format!(
                "token audiences {has:?} is invalid for the target audiences {audiences:?}"
            ));
        }
        Ok((id.clone(), common))
    }

    /// Issues an opaque token for a ServiceAccount (which must exist).
    pub fn issue_sa_token(
        &mut self,
        ns: &str,
        name: &str,
        expiration_seconds: Option<i64>,
        audiences: Vec<String>,
        bound_pod: Option<(String, String)>,
    ) -> Option<(String, Option<jiff::Timestamp>)> {
        let sa = self.get_opt("/serviceaccounts", ns, name)?;
        let uid = meta_str(sa, "uid").to_string();
        let token = format!("kube-emulator-sa-{}", uuid::Uuid::new_v4().simple());
        let exp =
            expiration_seconds.map(|s| jiff::Timestamp::now() + jiff::SignedDuration::from_secs(s));
        let id = Identity {
            username: format!("system:serviceaccount:{ns}:{name}"),
            uid,
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            service_account: Some((ns.into(), name.into())),
        };
        self.tokens.insert(
            token.clone(),
            store::IssuedToken {
                identity: id,
                expires: exp,
                audiences: Some(audiences),
                bound_pod,
            },
        );
        Some((token, exp))
    }
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq)]
enum Route {
    Version,
    Health,
    Api,
    Apis,
    ApiGroup(String),
    GroupVersion(String, String),
    OpenApiIndex,
    OpenApiGroupVersion(String, String),
    Resource(ResourcePath),
    NotFound,
}

#[derive(Debug, Clone, PartialEq, Default)]
struct ResourcePath {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    subresource: Option<String>,
}

fn route(path: &str) -> Route {
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    let (group, version, rest) = match parts.as_slice() {
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["api"] => return Route::Api,
        ["apis"] => return Route::Apis,
        ["apis", g] => return Route::ApiGroup(g.to_string()),
        ["openapi", "v3"] => return Route::OpenApiIndex,
        ["openapi", "v3", "api", v] => {
            return Route::OpenApiGroupVersion(String::new(), v.to_string());
        }
        ["openapi", "v3", "apis", g, v] => {
            return Route::OpenApiGroupVersion(g.to_string(), v.to_string());
        }
        ["api", v] => return Route::GroupVersion(String::new(), v.to_string()),
        ["apis", g, v] => return Route::GroupVersion(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest),
        _ => return Route::NotFound,
    };
    let mut rp = ResourcePath {
        group,
        version,
        ..Default::default()
    };
    let rest: Vec<&str> = match rest {
        ["namespaces", ns, r, tail @ ..]
            if !matches!(*r, "status" | "finalize") || !tail.is_empty() =>
        {
            rp.namespace = Some(ns.to_string());
            std::iter::once(*r).chain(tail.iter().copied()).collect()
        }
        other => other.to_vec(),
    };
    match rest.as_slice() {
        [r] => rp.resource = r.to_string(),
        [r, n] => {
            rp.resource = r.to_string();
            rp.name = Some(n.to_string());
        }
        [r, n, s] => {
            rp.resource = r.to_string();
            rp.name = Some(n.to_string());
            rp.subresource = Some(s.to_string());
        }
        _ => return Route::NotFound,
    }
    Route::Resource(rp)
}

fn user_agent(headers: &HeaderMap) -> String {
    headers
        .get(header::USER_AGENT)
        .and_then(|u| u.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap_or_default()))
        .expect("valid response")
}

fn error_response(e: &ApiError) -> Response<Body> {
    with_warnings(json_response(e.code, &e.to_status()), &e.warnings)
}

fn query_map(q: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// `Accept: application/json;as=PartialObjectMetadata…` (kube-rs `metadata_watcher`, `list_metadata`).
fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

/// Parses a request body as JSON, or as YAML when it is not JSON.
fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).or_else(|_| {
        let s = std::str::from_utf8(body)
            .map_err(|e| ApiError::bad_request(format!("body is not UTF-8: {e}")))?;
        serde_saphyr::from_str::<Value>(s)
            .map_err(|e| ApiError::bad_request(format!("body is neither JSON nor YAML: {e}")))
    })
}

/// The whole API: one function because Kubernetes paths are regular enough to route by hand.
pub async fn handle(shared: Arc<Shared>, req: Request<Body>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(b) => b,
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let path = parts.uri.path().to_string();
    let query = query_map(parts.uri.query());
    let Some(user) = shared.authenticate(&parts.headers) else {
        let resp = error_response(&ApiError::new(401, "Unauthorized", "Unauthorized"));
        shared.record(AuditEntry {
            user: "system:anonymous".into(),
            groups: vec![],
            verb: parts.method.as_str().to_lowercase(),
            group: String::new(),
            resource: String::new(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            path,
            code: 401,
            user_agent: user_agent(&parts.headers),
            annotations: Default::default(),
        });
        return resp;
    };
    let protobuf = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.contains("protobuf"));
    let body = if protobuf && !body.is_empty() {
        // client-go's typed clients (kubectl create …, Helm's release storage) send protobuf.
        match crate::protobuf::decode(&body) {
            Some(v) => Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
            None => {
                return error_response(&ApiError::unsupported_media(
                    "kube-emulator could not decode this protobuf body (not a Kubernetes protobuf envelope of a built-in kind); send JSON",
                ));
            }
        }
    } else {
        body
    };
    let r = route(&path);
    let verb = match (&parts.method, &r) {
        (&Method::GET, Route::Resource(rp))
            if rp.name.is_none() && query.get("watch").is_some_and(|w| w == "true" || w == "1") =>
        {
            "watch"
        }
        (&Method::GET, Route::Resource(rp)) if rp.name.is_none() => "list",
        (&Method::GET | &Method::HEAD, _) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, Route::Resource(rp)) if rp.name.is_none() => "deletecollection",
        (&Method::DELETE, _) => "delete",
        _ => "unknown",
    };
    let attrs = match &r {
        Route::Resource(rp) => Attributes {
            verb: verb.into(),
            resource: Some(ResourceAttributes {
                group: rp.group.clone(),
                resource: rp.resource.clone(),
                subresource: rp.subresource.clone().unwrap_or_default(),
                namespace: rp.namespace.clone().unwrap_or_default(),
                // As on the apiserver, a list/watch narrowed to one name by a field selector is
                // authorized like a request for that name (so resourceNames rules apply).
                name: rp.name.clone().unwrap_or_else(|| {
                    query
                        .get("fieldSelector")
                        .filter(|_| matches!(verb, "list" | "watch"))
                        .and_then(|f| {
                            f.split(',').find_map(|t| {
                                t.trim().strip_prefix("metadata.name=").map(String::from)
                            })
                        })
                        .unwrap_or_default()
                }),
            }),
            path: path.clone(),
        },
        _ => Attributes {
            verb: verb.into(),
            resource: None,
            path: path.clone(),
        },
    };
    let allowed = {
        let st = shared.state.lock();
        rbac::allowed(&st, &user, &attrs)
    };
    let resp = if !allowed {
        error_response(
            &ApiError::forbidden(attrs.denial(&user.username)).with_details(
                match &attrs.resource {
                    Some(ra) => json!({"name": ra.name, "group": ra.group, "kind": ra.resource}),
                    None => json!({}),
                },
            ),
        )
    } else {
        match r {
            Route::Resource(rp) => {
                match resource_request(&shared, &user, verb, rp, &query, &parts.headers, &body) {
                    Ok(resp) => resp,
                    Err(e) => error_response(&e),
                }
            }
            other => non_resource(&shared, other, &parts.headers, &query),
        }
    };
    let ra = attrs.resource.clone().unwrap_or_default();
    shared.record(AuditEntry {
        user: user.username.clone(),
        groups: user.groups.clone(),
        verb: verb.into(),
        group: ra.group,
        resource: ra.resource,
        subresource: ra.subresource,
        namespace: ra.namespace,
        name: ra.name,
        path: if attrs.resource.is_none() {
            path
        } else {
            String::new()
        },
        code: resp.status().as_u16(),
        user_agent: user_agent(&parts.headers),
        annotations: resp
            .extensions()
            .get::<AuditAnnotations>()
            .map(|a| a.0.clone())
            .unwrap_or_default(),
    });
    resp
}

fn non_resource(
    shared: &Shared,
    r: Route,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let _ = query;
    let st = shared.state.lock();
    let aggregated = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("apidiscovery.k8s.io"));
    let agg = |v: Value| {
        Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, discovery::AGGREGATED_CONTENT_TYPE)
            .body(Body::from(serde_json::to_vec(&v).unwrap_or_default()))
            .expect("valid response")
    };
    match r {
        Route::Version => json_response(
            200,
            &json!({
            "major": "1", "minor": "32", "gitVersion": "v1.32.0-kube-emulator", "gitCommit": "", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "n/a", "compiler": "rustc", "platform": "linux/amd64"}),
        ),
        Route::Health => Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::from("ok"))
            .expect("valid"),
        Route::Api if aggregated => agg(discovery::aggregated(&st.registry, true)),
        Route::Apis if aggregated => agg(discovery::aggregated(&st.registry, false)),
        Route::Api => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:0"}]}),
        ),
        Route::Apis => json_response(200, &discovery::group_list(&st.registry)),
        Route::ApiGroup(g) => match discovery::group(&st.registry, &g) {
            Some(d) => json_response(200, &d),
            None => error_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        },
        Route::GroupVersion(g, v) => match discovery::resource_list(&st.registry, &g, &v) {
            Some(d) => json_response(200, &d),
            None => error_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        },
        Route::OpenApiIndex => json_response(200, &discovery::openapi_index(&st.registry)),
        Route::OpenApiGroupVersion(g, v) => {
            match discovery::openapi_group_version(&st.registry, &g, &v) {
                Some(d) => json_response(200, &d),
                None => error_response(&ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )),
            }
        }
        Route::Resource(_) | Route::NotFound => error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

fn write_options(
    query: &HashMap<String, String>,
    sub: Option<&str>,
    user: &Identity,
) -> WriteOptions {
    WriteOptions {
        user: Some(user.clone()),
        subresource: sub.map(String::from),
        dry_run: query.get("dryRun").is_some_and(|d| d == "All"),
        field_validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str)),
        field_manager: query.get("fieldManager").cloned(),
        force: query.get("force").is_some_and(|f| f == "true"),
        applying: false,
    }
}

/// A write's answer with its warnings and audit annotations.
fn written(resp: Response<Body>, st: &State) -> Response<Body> {
    let mut resp = with_warnings(resp, &st.warnings);
    if !st.audit_annotations.is_empty() {
        resp.extensions_mut()
            .insert(AuditAnnotations(st.audit_annotations.clone()));
    }
    resp
}

fn with_warnings(mut resp: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let v = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(h) = HeaderValue::from_str(&v) {
            resp.headers_mut().append("Warning", h);
        }
    }
    resp
}

fn list_kind(rt: &ResourceType) -> String {
    format!("{}List", rt.kind)
}

#[allow(clippy::too_many_arguments)]
fn resource_request(
    shared: &Arc<Shared>,
    user: &Identity,
    verb: &str,
    rp: ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response<Body>, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let mut st = shared.state.lock();
    let rt = st
        .registry
        .lookup(&rp.group, &rp.version, &rp.resource)
        .cloned()
        .ok_or_else(not_found)?;
    if rt.namespaced != rp.namespace.is_some()
        && !(rt.namespaced && rp.name.is_none() && matches!(verb, "list" | "watch"))
    {
        return Err(not_found());
    }
    let ns = rp.namespace.clone().unwrap_or_default();
    let sub = rp.subresource.as_deref();
    match sub {
        None | Some("status") if sub.is_none() || rt.status_subresource => {}
        Some("token")
            if rt.group.is_empty() && rt.resource == "serviceaccounts" && verb == "create" =>
        {
            let name = rp.name.clone().unwrap_or_default();
            let req = parse_body(body)?;
            let seconds = req["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
            // As the API server validates a TokenRequest.
            let limit = if seconds < 600 {
                Some("may not specify a duration less than 10 minutes")
            } else if seconds > 1 << 32 {
                Some("may not specify a duration larger than 2^32 seconds")
            } else {
                None
            };
            if let Some(message) = limit {
                return Err(ApiError::invalid(
                    "TokenRequest.authentication.k8s.io",
                    &name,
                    vec![crate::error::FieldError::invalid(
                        "spec.expirationSeconds",
                        &json!(seconds),
                        message,
                    )],
                ));
            }
            let mut audiences: Vec<String> = req["spec"]["audiences"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            if audiences.is_empty() {
                audiences.push(store::API_AUDIENCE.to_owned());
            }
            let bound_pod = bind_to_pod(&st, &ns, &name, &req["spec"]["boundObjectRef"])?;
            let (token, exp) = st
                .issue_sa_token(&ns, &name, Some(seconds), audiences.clone(), bound_pod)
                .ok_or_else(|| ApiError::not_found("serviceaccounts", &name))?;
            let mut out = json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": ns, "creationTimestamp": store::now()},
                "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": req["spec"]["boundObjectRef"].clone()},
                "status": {"token": token, "expirationTimestamp": exp.map(|e| jiff::Timestamp::from_second(e.as_second()).expect("valid").to_string())}});
            if out["spec"]["boundObjectRef"].is_null() {
                out["spec"]
                    .as_object_mut()
                    .expect("object")
                    .remove("boundObjectRef");
            }
            return Ok(json_response(201, &out));
        }
        _ => return Err(not_found()),
    }
    if rt.special != Special::None {
        if verb != "create" {
            return Err(ApiError::method_not_allowed(format!(
                "{} does not support {verb}",
                rt.resource
            )));
        }
        let mut obj = parse_body(body)?;
        let spec = obj["spec"].clone();
        let status = match rt.special {
            Special::TokenReview => {
                let tok = spec["token"].as_str().unwrap_or_default().to_owned();
                let audiences: Vec<String> = spec["audiences"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                match shared.review(&st, &tok, &audiences) {
                    Ok((id, audiences)) => {
                        let mut user =
                            json!({"username": id.username, "uid": id.uid, "groups": id.groups});
                        if let Some((pod, uid)) =
                            st.tokens.get(&tok).and_then(|t| t.bound_pod.clone())
                        {
                            user["extra"] = json!({
                                "authentication.kubernetes.io/pod-name": [pod],
                                "authentication.kubernetes.io/pod-uid": [uid],
                            });
                        }
                        json!({"authenticated": true, "user": user, "audiences": audiences})
                    }
                    Err(error) => json!({"authenticated": false, "error": error}),
                }
            }
            Special::SubjectAccessReview | Special::SelfSubjectAccessReview => {
                let subject = if rt.special == Special::SelfSubjectAccessReview {
                    user.clone()
                } else {
                    let username = spec["user"].as_str().unwrap_or_default().to_string();
                    let service_account = username
                        .strip_prefix("system:serviceaccount:")
                        .and_then(|r| r.split_once(':'))
                        .map(|(a, b)| (a.to_string(), b.to_string()));
                    let groups = spec["groups"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|g| g.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default();
                    Identity {
                        username,
                        uid: spec["uid"].as_str().unwrap_or_default().into(),
                        groups,
                        service_account,
                    }
                };
                let a = match (
                    spec.get("resourceAttributes"),
                    spec.get("nonResourceAttributes"),
                ) {
                    (Some(ra), _) => Attributes {
                        verb: ra["verb"].as_str().unwrap_or_default().into(),
                        resource: Some(ResourceAttributes {
                            group: ra["group"].as_str().unwrap_or_default().into(),
                            resource: ra["resource"].as_str().unwrap_or_default().into(),
                            subresource: ra["subresource"].as_str().unwrap_or_default().into(),
                            namespace: ra["namespace"].as_str().unwrap_or_default().into(),
                            name: ra["name"].as_str().unwrap_or_default().into(),
                        }),
                        path: String::new(),
                    },
                    (None, Some(nr)) => Attributes {
                        verb: nr["verb"].as_str().unwrap_or_default().into(),
                        resource: None,
                        path: nr["path"].as_str().unwrap_or_default().into(),
                    },
                    (None, None) => {
                        return Err(ApiError::invalid(
                            &rt.group_kind(),
                            "",
                            vec![crate::error::FieldError::required(
                                "spec.resourceAttributes",
                            )],
                        ));
                    }
                };
                let allowed = rbac::allowed(&st, &subject, &a);
                if allowed {
                    json!({"allowed": true, "reason": "allowed by RBAC"})
                } else {
                    json!({"allowed": false})
                }
            }
            Special::SelfSubjectReview => {
                json!({"userInfo": {"username": user.username, "uid": user.uid, "groups": user.groups}})
            }
            Special::SelfSubjectRulesReview => {
                let (cluster, namespaced) = if user.is_admin() {
                    (
                        vec![
                            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
                            json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
                        ],
                        vec![],
                    )
                } else {
                    rbac::rules_for(&st, user, spec["namespace"].as_str().unwrap_or_default())
                };
                let (mut resource_rules, mut non_resource_rules) = (Vec::new(), Vec::new());
                for r in cluster.into_iter().chain(namespaced) {
                    if r.get("nonResourceURLs").is_some() {
                        non_resource_rules.push(
                            json!({"verbs": r["verbs"], "nonResourceURLs": r["nonResourceURLs"]}),
                        );
                    }
                    if r.get("resources").is_some() {
                        let mut rr = json!({"verbs": r["verbs"], "apiGroups": r["apiGroups"], "resources": r["resources"]});
                        if let Some(n) = r.get("resourceNames") {
                            rr["resourceNames"] = n.clone();
                        }
                        resource_rules.push(rr);
                    }
                }
                json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": false})
            }
            Special::None => unreachable!("checked above"),
        };
        obj["status"] = status;
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        return Ok(json_response(201, &obj));
    }
    let table = wants_table(headers);
    let metadata_only = wants_metadata(headers);
    let include = query.get("includeObject").map(String::as_str);
    match (verb, rp.name.as_deref()) {
        ("get", Some(name)) => {
            let obj = from_stored(&rt, st.get(&rt, &ns, name)?);
            if table {
                let rv = meta_str(&obj, "resourceVersion").to_string();
                return Ok(json_response(
                    200,
                    &table::table(&rt, &[obj], &rv, include, true),
                ));
            }
            if metadata_only {
                return Ok(json_response(200, &partial(&obj)));
            }
            Ok(json_response(200, &obj))
        }
        ("list", None) => {
            let (labels, fields) = selectors(query, &rt.resource)?;
            // Every page of a paged list comes from one snapshot, at the first
            // page's resourceVersion, which each page reports (the token
            // carries it, as the API server's does).
            let cont = query
                .get("continue")
                .filter(|c| !c.is_empty())
                .map(|c| ContinueToken::decode(c))
                .transpose()?;
            let snapshot_rv = cont.as_ref().map_or(st.rv, |c| c.rv);
            let snapshot = st
                .list_at(&rt, rp.namespace.as_deref(), snapshot_rv)
                .ok_or_else(|| {
                    ApiError::gone(
                        "The provided continue parameter is too old to display a consistent list result. \
                         You can start a new list without the continue parameter.",
                    )
                })?;
            let mut items: Vec<Value> = snapshot
                .into_iter()
                .filter(|o| labels.matches(o) && fields.matches(o))
                .map(|o| from_stored(&rt, o))
                .collect();
            if let Some(c) = &cont {
                // Items are ordered by (namespace, name); namespaces cannot contain '/'.
                let (cns, cname) = c.start.split_once('/').unwrap_or(("", c.start.as_str()));
                items.retain(|o| (meta_str(o, "namespace"), meta_str(o, "name")) > (cns, cname));
            }
            let mut meta = json!({"resourceVersion": snapshot_rv.to_string()});
            if let Some(limit) = query
                .get("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|l| *l > 0 && items.len() > *l)
            {
                let rest = items.len() - limit;
                items.truncate(limit);
                let last = items.last().expect("limit > 0");
                meta["continue"] = json!(
                    ContinueToken {
                        v: "meta.k8s.io/v1".into(),
                        rv: snapshot_rv,
                        start: format!(
                            "{}/{}",
                            meta_str(last, "namespace"),
                            meta_str(last, "name")
                        ),
                    }
                    .encode()
                );
                meta["remainingItemCount"] = json!(rest);
            }
            if table {
                let mut t = table::table(&rt, &items, &snapshot_rv.to_string(), include, true);
                t["metadata"] = meta;
                return Ok(json_response(200, &t));
            }
            if metadata_only {
                let items: Vec<Value> = items.iter().map(partial).collect();
                return Ok(json_response(
                    200,
                    &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
                ));
            }
            Ok(json_response(
                200,
                &json!({"kind": list_kind(&rt), "apiVersion": rt.api_version(), "metadata": meta, "items": items}),
            ))
        }
        ("watch", None) => {
            let (labels, fields) = selectors(query, &rt.resource)?;
            Ok(watch(
                shared,
                &mut st,
                rt,
                rp.namespace.clone(),
                labels,
                fields,
                query,
                (table, metadata_only),
                include,
            ))
        }
        ("create", None) => {
            let obj = parse_body(body)?;
            check_kind(&rt, &obj)?;
            let opts = write_options(query, None, user);
            let out = st.create(&rt, &ns, to_stored(&rt, obj), &opts)?;
            Ok(written(json_response(201, &from_stored(&rt, out)), &st))
        }
        ("update", Some(name)) => {
            let obj = parse_body(body)?;
            check_kind(&rt, &obj)?;
            let opts = write_options(query, sub, user);
            let out = st.update(&rt, &ns, name, to_stored(&rt, obj), true, &opts)?;
            Ok(written(json_response(200, &from_stored(&rt, out)), &st))
        }
        ("patch", Some(name)) => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or_default();
            let ptype = match ct.split(';').next().unwrap_or_default().trim() {
                "application/json-patch+json" => PatchType::Json,
                "application/merge-patch+json" => PatchType::Merge,
                "application/strategic-merge-patch+json" => PatchType::Strategic,
                "application/apply-patch+yaml" => PatchType::Apply,
                other => {
                    return Err(ApiError::unsupported_media(format!(
                        "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                    )));
                }
            };
            let patch = parse_body(body)?;
            let opts = write_options(query, sub, user);
            if ptype == PatchType::Apply {
                if opts.field_manager.as_deref().is_none_or(str::is_empty) {
                    return Err(ApiError::bad_request(
                        "PATCH, application/apply-patch+yaml requires fieldManager to be set",
                    ));
                }
                check_kind(&rt, &patch)?;
            }
            let (out, created) = st.patch(&rt, &ns, name, ptype, &patch, &opts)?;
            Ok(written(
                json_response(if created { 201 } else { 200 }, &from_stored(&rt, out)),
                &st,
            ))
        }
        ("delete", Some(name)) => {
            let opts = parse_body(body)?;
            let policy = opts["propagationPolicy"]
                .as_str()
                .or(query.get("propagationPolicy").map(String::as_str));
            let dry = query.get("dryRun").is_some_and(|d| d == "All")
                || opts["dryRun"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "All"));
            if let Some(uid) = opts["preconditions"]["uid"].as_str() {
                let cur = st.get(&rt, &ns, name)?;
                if meta_str(&cur, "uid") != uid {
                    return Err(ApiError::conflict(
                        &rt.group_resource(),
                        name,
                        "Precondition failed: UID in precondition does not match the UID in the object",
                    ));
                }
            }
            let out = st.delete(
                &rt,
                &ns,
                name,
                Propagation::parse(policy),
                opts["preconditions"]["resourceVersion"].as_str(),
                dry,
                Some(user),
            )?;
            let pending = st.get_opt(&rt.storage, &ns, name).is_some() && !dry;
            Ok(written(
                json_response(if pending { 202 } else { 200 }, &from_stored(&rt, out)),
                &st,
            ))
        }
        ("deletecollection", None) => {
            let (labels, fields) = selectors(query, &rt.resource)?;
            let opts = parse_body(body)?;
            let policy = Propagation::parse(
                opts["propagationPolicy"]
                    .as_str()
                    .or(query.get("propagationPolicy").map(String::as_str)),
            );
            let victims: Vec<Value> = st
                .list(&rt, rp.namespace.as_deref())
                .into_iter()
                .filter(|o| labels.matches(o) && fields.matches(o))
                .collect();
            let mut items = Vec::new();
            for v in victims {
                let out = st.delete(
                    &rt,
                    meta_str(&v, "namespace"),
                    meta_str(&v, "name"),
                    policy,
                    None,
                    false,
                    Some(user),
                )?;
                items.push(from_stored(&rt, out));
            }
            Ok(json_response(
                200,
                &json!({"kind": list_kind(&rt), "apiVersion": rt.api_version(), "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({verb})"
        ))),
    }
}

/// A body whose apiVersion/kind do not match the URL is a 400, as on the apiserver.
/// The `labelSelector` and `fieldSelector` of a list, watch or deletecollection
/// request (absent = match everything).
fn selectors(
    query: &HashMap<String, String>,
    resource: &str,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let param = |name: &str| query.get(name).map(String::as_str).unwrap_or_default();
    Ok((
        LabelSelector::parse(param("labelSelector"))?,
        FieldSelector::parse(param("fieldSelector"), resource)?,
    ))
}

fn check_kind(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let av = obj["apiVersion"].as_str().unwrap_or_default();
    if (!kind.is_empty() && kind != rt.kind) || (!av.is_empty() && av != rt.api_version()) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            rt.api_version()
        )));
    }
    Ok(())
}

struct WatchFilter {
    rt: ResourceType,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    table: bool,
    metadata_only: bool,
    include: Option<String>,
}

impl WatchFilter {
    fn matches(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|n| meta_str(obj, "namespace") == n)
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }

    /// The line for one store event, if this watch sees it (selector transitions included).
    fn line(&self, ev: &WatchEvent) -> Option<Bytes> {
        if ev.storage != self.rt.storage {
            return None;
        }
        let now = self.matches(&ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.matches(p));
        let kind = match ev.kind {
            EventKind::Added if now => "ADDED",
            EventKind::Deleted if now || before => "DELETED",
            EventKind::Modified if now && before => "MODIFIED",
            EventKind::Modified if now => "ADDED",
            EventKind::Modified if before => "DELETED",
            _ => return None,
        };
        Some(self.encode(kind, from_stored(&self.rt, ev.object.clone())))
    }

    fn encode(&self, kind: &str, obj: Value) -> Bytes {
        let object = if self.table && kind != "BOOKMARK" && kind != "ERROR" {
            let rv = meta_str(&obj, "resourceVersion").to_string();
            table::table(&self.rt, &[obj], &rv, self.include.as_deref(), true)
        } else if self.metadata_only && kind != "BOOKMARK" && kind != "ERROR" {
            partial(&obj)
        } else {
            obj
        };
        let mut line =
            serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.encode(
            "BOOKMARK",
            json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": meta}),
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn watch(
    shared: &Arc<Shared>,
    st: &mut State,
    rt: ResourceType,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    query: &HashMap<String, String>,
    (table, metadata_only): (bool, bool),
    include: Option<&str>,
) -> Response<Body> {
    let filter = WatchFilter {
        rt: rt.clone(),
        namespace,
        labels,
        fields,
        table,
        metadata_only,
        include: include.map(String::from),
    };
    let rv_param = query.get("resourceVersion").cloned().unwrap_or_default();
    let send_initial = query.get("sendInitialEvents").is_some_and(|s| s == "true");
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|s| s == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let mut initial: Vec<Bytes> = Vec::new();
    if send_initial || rv_param.is_empty() || rv_param == "0" {
        for o in st.list(&rt, None) {
            if filter.matches(&o) {
                initial.push(filter.encode("ADDED", from_stored(&rt, o)));
            }
        }
        if send_initial {
            initial.push(filter.bookmark(st.rv, true));
        }
    } else {
        let since = rv_param.parse::<u64>().unwrap_or(0);
        match st.history_since(&rt.storage, since) {
            Some(evs) => initial.extend(evs.iter().filter_map(|e| filter.line(e))),
            None => {
                let e = ApiError::gone(format!("too old resource version: {since} ({})", st.rv));
                initial.push(filter.encode("ERROR", e.to_status()));
                let stream = futures::stream::iter(initial.into_iter().map(Ok::<_, Infallible>));
                return stream_response(Body::from_stream(stream));
            }
        }
    }
    let mut last_rv = st.rv;
    let rx = st.subscribe();
    let interval = shared.bookmark_interval;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let live = futures::stream::unfold((rx, filter), move |(mut rx, filter)| async move {
        loop {
            let next = if bookmarks {
                tokio::time::timeout_at(
                    deadline.min(tokio::time::Instant::now() + interval),
                    rx.recv(),
                )
                .await
            } else {
                tokio::time::timeout_at(deadline, rx.recv()).await
            };
            match next {
                Ok(Ok(ev)) => {
                    if ev.rv <= last_rv {
                        continue;
                    }
                    last_rv = ev.rv;
                    if let Some(line) = filter.line(&ev) {
                        return Some((Ok::<_, Infallible>(line), (rx, filter)));
                    }
                }
                // A lagging watcher is cut off; the client re-watches from its last resourceVersion.
                Ok(Err(_)) => return None,
                Err(_) if tokio::time::Instant::now() >= deadline => return None,
                Err(_) => {
                    let b = filter.bookmark(last_rv, false);
                    return Some((Ok(b), (rx, filter)));
                }
            }
        }
    });
    let stream = futures::StreamExt::chain(
        futures::stream::iter(initial.into_iter().map(Ok::<_, Infallible>)),
        live,
    );
    stream_response(Body::from_stream(stream))
}

/// A paged list's `continue` token: the snapshot's resourceVersion and the
/// last key returned, base64 (URL-safe) of JSON as the API server's are.
#[derive(Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

impl ContinueToken {
    fn encode(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(self).expect("a token serialises"))
    }

    fn decode(s: &str) -> Result<Self, ApiError> {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .ok()
            .and_then(|b| serde_json::from_slice::<ContinueToken>(&b).ok())
            .filter(|t| t.v == "meta.k8s.io/v1")
            .ok_or_else(|| ApiError::bad_request(format!("continue key is not valid: {s:?}")))
    }
}

fn stream_response(body: Body) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .expect("valid response")
}

/// `(name, uid)` of the Pod a TokenRequest's `spec.boundObjectRef` binds the
/// token to, checked as the API server checks it; `None` without a reference.
fn bind_to_pod(
    st: &store::State,
    ns: &str,
    service_account: &str,
    reference: &Value,
) -> Result<Option<(String, String)>, ApiError> {
    if reference.is_null() {
        return Ok(None);
    }
    let kind = reference["kind"].as_str().unwrap_or_default();
    let api_version = reference["apiVersion"].as_str().unwrap_or("v1");
    if kind != "Pod" || api_version != "v1" {
        return Err(ApiError::bad_request(format!(
            "cannot bind token to object of type {api_version}, Kind={kind} (the emulator binds to v1 Pods only)"
        )));
    }
    let name = reference["name"].as_str().unwrap_or_default();
    let pod = st
        .get_opt("/pods", ns, name)
        .ok_or_else(|| ApiError::not_found("pods", name))?;
    let uid = meta_str(pod, "uid").to_owned();
    if let Some(want) = reference["uid"].as_str().filter(|u| !u.is_empty())
        && want != uid
    {
        return Err(ApiError::conflict(
            "pods",
            name,
            &format!(
                "the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    let runs_as = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    if runs_as != service_account {
        return Err(ApiError::bad_request(format!(
            "cannot bind token for serviceaccount \"{service_account}\" to pod running with different serviceaccount name."
        )));
    }
    Ok(Some((name.to_owned(), uid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let rp = |g: &str, ns: Option<&str>, r: &str, n: Option<&str>, s: Option<&str>| {
            Route::Resource(ResourcePath {
                group: g.into(),
                version: "v1".into(),
                namespace: ns.map(String::from),
                resource: r.into(),
                name: n.map(String::from),
                subresource: s.map(String::from),
            })
        };
        for (path, want) in [
            ("/api/v1/namespaces", rp("", None, "namespaces", None, None)),
            (
                "/api/v1/namespaces/default",
                rp("", None, "namespaces", Some("default"), None),
            ),
            (
                "/api/v1/namespaces/x/status",
                rp("", None, "namespaces", Some("x"), Some("status")),
            ),
            (
                "/api/v1/namespaces/default/configmaps",
                rp("", Some("default"), "configmaps", None, None),
            ),
            (
                "/api/v1/namespaces/d/serviceaccounts/sa/token",
                rp("", Some("d"), "serviceaccounts", Some("sa"), Some("token")),
            ),
            (
                "/apis/example.com/v1/namespaces/d/widgets/w/status",
                rp(
                    "example.com",
                    Some("d"),
                    "widgets",
                    Some("w"),
                    Some("status"),
                ),
            ),
            (
                "/apis/example.com/v1/widgets",
                rp("example.com", None, "widgets", None, None),
            ),
            (
                "/apis/example.com/v1",
                Route::GroupVersion("example.com".into(), "v1".into()),
            ),
            (
                "/openapi/v3/apis/example.com/v1",
                Route::OpenApiGroupVersion("example.com".into(), "v1".into()),
            ),
            ("/openapi/v2", Route::NotFound),
        ] {
            assert_eq!(route(path), want, "{path}");
        }
    }
}
