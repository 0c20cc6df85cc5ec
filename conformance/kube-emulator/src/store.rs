//! The in-memory object store and the write pipeline that gives it apiserver semantics:
//! one global resourceVersion, uid/creationTimestamp/generation, optimistic concurrency,
//! status-subresource separation, no-op writes that change nothing, finalizers and
//! deletionTimestamp, ownerReference garbage collection and namespace termination.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::admission;
use crate::error::{ApiError, FieldError};
use crate::patch;
use crate::registry::{Registry, ResourceType};
use crate::schema::{self, FieldValidation};

/// A change to one object, as sent to watchers (objects are in stored form).
#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub rv: u64,
    pub storage: String,
    pub kind: EventKind,
    pub object: Value,
    /// The object before the change (for selector transitions: MODIFIED out of a selector is DELETED).
    pub prev: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// Who is calling: a user or a ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// `(namespace, name)` when this is a ServiceAccount token.
    pub service_account: Option<(String, String)>,
}

impl Identity {
    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// Per-request write options taken from the query string.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    pub subresource: Option<String>,
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    pub field_manager: Option<String>,
    pub force: bool,
    /// Set internally for server-side apply writes (which maintain managedFields themselves).
    pub applying: bool,
    /// Who asks: admission policies judge the write for this user. `None`
    /// for the emulator's own writes (garbage collection, test set-up
    /// helpers), which admission never sees.
    pub user: Option<Identity>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            subresource: None,
            dry_run: false,
            field_validation: FieldValidation::Warn,
            field_manager: None,
            force: false,
            applying: false,
            user: None,
        }
    }
}

/// The patch types of `PATCH` requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

/// The audience of this API server (`--api-audiences`; by default the
/// ServiceAccount issuer): tokens must be meant for it to authenticate API
/// requests, and a TokenReview without audiences asks for it.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// What a bearer token stands for.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub identity: Identity,
    /// When it stops authenticating (None: never).
    pub expires: Option<jiff::Timestamp>,
    /// Who it is meant for (a TokenRequest's `spec.audiences`); `None` for
    /// tokens that know no audience (static users), which the API server
    /// accepts for its own audience only.
    pub audiences: Option<Vec<String>>,
    /// `(name, uid)` of the Pod a TokenRequest bound it to
    /// (`spec.boundObjectRef`): the token dies with that Pod.
    pub bound_pod: Option<(String, String)>,
}

/// The store proper. All access goes through one mutex held by [`crate::server`].
pub struct State {
    pub rv: u64,
    objects: HashMap<String, BTreeMap<(String, String), Value>>,
    history: VecDeque<Arc<WatchEvent>>,
    /// How many past watch events are kept so that a watch can resume from an older resourceVersion.
    history_limit: usize,
    pub registry: Registry,
    /// Opaque bearer tokens → identities (ServiceAccount tokens from TokenRequest, static users).
    pub tokens: HashMap<String, IssuedToken>,
    validator: kube_cel::Validator,
    tx: broadcast::Sender<Arc<WatchEvent>>,
    /// Warnings produced by the last write (unknown fields under `fieldValidation=Warn`,
    /// admission policies bound with `Warn`).
    pub warnings: Vec<String>,
    /// Audit annotations of the last write (admission policies bound with `Audit`).
    pub audit_annotations: BTreeMap<String, String>,
}

pub fn now() -> String {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .expect("valid time")
        .to_string()
}

pub fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj["metadata"][key].as_str().unwrap_or_default()
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn random_suffix(n: usize) -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// The object without `metadata.resourceVersion` and managedFields timestamps: what "changed"
/// compares (a re-apply of identical fields by the same manager is a no-op).
fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        if let Some(entries) = m.get_mut("managedFields").and_then(Value::as_array_mut) {
            for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                e.remove("time");
            }
        }
    }
    v
}

/// The object without metadata and status: what `generation` tracks.
/// The object without metadata (and without status when a status subresource separates it):
/// what `generation` tracks.
fn spec_part(v: &Value, status_separate: bool) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        if status_separate {
            m.remove("status");
        }
    }
    v
}

fn set_meta(obj: &mut Value, key: &str, val: Value) {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"][key] = val;
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// events.k8s.io/v1 ↔ core/v1 Event field renames (the store keeps the core form).
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

fn rename(obj: &mut Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) {
    if let Some(m) = obj.as_object_mut() {
        for (from, to) in pairs {
            if let Some(v) = m.remove(from) {
                m.insert(to.to_string(), v);
            }
        }
    }
}

/// Converts a client-side object of `rt` into the stored form.
pub fn to_stored(rt: &ResourceType, mut obj: Value) -> Value {
    if rt.resource == "events" && rt.group == "events.k8s.io" {
        rename(&mut obj, EVENT_FIELDS.iter().copied());
        obj["apiVersion"] = json!("v1");
        // `kubectl describe` prints the source component in its "From" column.
        if obj.get("source").is_none()
            && let Some(c) = obj.get("reportingComponent").cloned()
        {
            obj["source"] = json!({"component": c});
        }
    }
    obj
}

/// Converts a stored object into what a client of `rt` sees.
pub fn from_stored(rt: &ResourceType, mut obj: Value) -> Value {
    if rt.resource == "events" && rt.group == "events.k8s.io" {
        rename(&mut obj, EVENT_FIELDS.iter().map(|(a, b)| (*b, *a)));
    }
    if obj.is_object() {
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
    }
    obj
}

impl State {
    pub fn new(tx: broadcast::Sender<Arc<WatchEvent>>, history_limit: usize) -> Self {
        let mut s = State {
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            registry: Registry::new(std::iter::empty()),
            tokens: HashMap::new(),
            validator: kube_cel::Validator::new(),
            tx,
            warnings: Vec::new(),
            audit_annotations: BTreeMap::new(),
        };
        let ns_rt = s
            .registry
            .lookup("", "v1", "namespaces")
            .cloned()
            .expect("builtin");
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            s.create(
                &ns_rt,
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                &WriteOptions::default(),
            )
            .expect("fresh store accepts namespaces");
        }
        let crb = s
            .registry
            .lookup("rbac.authorization.k8s.io", "v1", "clusterroles")
            .cloned()
            .expect("builtin");
        s.create(&crb, "", json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "cluster-admin"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]}), &WriteOptions::default())
            .expect("fresh store accepts roles");
        s
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<WatchEvent>> {
        self.tx.subscribe()
    }

    /// Events newer than `rv` for `storage`, or `None` if `rv` is older than the kept history.
    pub fn history_since(&self, storage: &str, rv: u64) -> Option<Vec<Arc<WatchEvent>>> {
        if let Some(first) = self.history.front()
            && rv + 1 < first.rv
        {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|e| e.rv > rv && e.storage == storage)
                .cloned()
                .collect(),
        )
    }

    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&rt.storage)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group_resource(), name))
    }

    pub fn get_opt(&self, storage: &str, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(storage)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
    }

    /// All stored objects of `rt` in `ns` (or every namespace when `ns` is `None`), ordered.
    pub fn list(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .get(&rt.storage)
            .map(|m| {
                m.iter()
                    .filter(|((n, _), _)| ns.is_none_or(|x| x == n))
                    .map(|(_, v)| v.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The objects of `rt` in `ns` as they were at resourceVersion `rv`, the
    /// consistent snapshot a paged list serves every page from (etcd's MVCC
    /// read at the first page's revision): the current objects with every
    /// later change of that resource undone from the watch history. `None`
    /// when the history no longer reaches back to `rv` (the API server's
    /// "continue parameter is too old", after compaction).
    pub fn list_at(&self, rt: &ResourceType, ns: Option<&str>, rv: u64) -> Option<Vec<Value>> {
        if rv >= self.rv {
            return Some(self.list(rt, ns));
        }
        match self.history.front() {
            Some(first) if first.rv <= rv + 1 => {}
            _ => return None,
        }
        let mut objects: BTreeMap<(String, String), Value> = self
            .objects
            .get(&rt.storage)
            .map(|m| {
                m.iter()
                    .filter(|((n, _), _)| ns.is_none_or(|x| x == n))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for ev in self.history.iter().rev().take_while(|e| e.rv > rv) {
            if ev.storage != rt.storage {
                continue;
            }
            let key = (
                meta_str(&ev.object, "namespace").to_string(),
                meta_str(&ev.object, "name").to_string(),
            );
            if ns.is_some_and(|x| x != key.0) {
                continue;
            }
            match (ev.kind, &ev.prev) {
                (EventKind::Added, _) | (_, None) => {
                    objects.remove(&key);
                }
                (_, Some(prev)) => {
                    objects.insert(key, prev.clone());
                }
            }
        }
        Some(objects.into_values().collect())
    }

    pub fn list_storage(&self, storage: &str) -> impl Iterator<Item = &Value> {
        self.objects
            .get(storage)
            .into_iter()
            .flat_map(|m| m.values())
    }

    /// Writes (or removes) an object, bumps the global resourceVersion and notifies watchers.
    fn commit(
        &mut self,
        storage: &str,
        ns: &str,
        name: &str,
        new: Option<Value>,
        kind: EventKind,
    ) -> Value {
        self.rv += 1;
        let key = (ns.to_string(), name.to_string());
        let map = self.objects.entry(storage.to_string()).or_default();
        let prev = map.get(&key).cloned();
        let mut obj = new
            .or_else(|| prev.clone())
            .expect("commit of a removal needs a previous object");
        set_meta(&mut obj, "resourceVersion", json!(self.rv.to_string()));
        match kind {
            EventKind::Deleted => {
                map.remove(&key);
            }
            _ => {
                map.insert(key, obj.clone());
            }
        }
        let ev = Arc::new(WatchEvent {
            rv: self.rv,
            storage: storage.into(),
            kind,
            object: obj.clone(),
            prev,
        });
        if self.history.len() >= self.history_limit {
            self.history.pop_front();
        }
        self.history.push_back(ev.clone());
        let _ = self.tx.send(ev);
        if storage == "apiextensions.k8s.io/customresourcedefinitions" {
            self.refresh_registry();
        }
        obj
    }

    fn refresh_registry(&mut self) {
        let crds: Vec<Value> = self
            .list_storage("apiextensions.k8s.io/customresourcedefinitions")
            .cloned()
            .collect();
        self.registry = Registry::new(crds.iter());
    }

    fn namespace_check(&self, rt: &ResourceType, ns: &str) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        match self.get_opt("/namespaces", "", ns) {
            None => Err(ApiError::not_found("namespaces", ns)),
            Some(n) if n["metadata"].get("deletionTimestamp").is_some() => {
                Err(ApiError::forbidden(format!(
                    "{} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    rt.group_resource()
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// Kind-specific defaulting and validation, for built-in and custom kinds alike.
    fn admit(
        &mut self,
        rt: &ResourceType,
        obj: &mut Value,
        old: Option<&Value>,
        opts: &WriteOptions,
    ) -> Result<(), ApiError> {
        let name = meta_str(obj, "name").to_string();
        let mut errors: Vec<FieldError> = Vec::new();
        let rbac = rt.group == "rbac.authorization.k8s.io";
        if rbac {
            if name.is_empty()
                || name.contains('/')
                || name.contains('%')
                || name == "."
                || name == ".."
            {
                errors.push(FieldError::invalid(
                    "metadata.name",
                    &json!(name),
                    "may not contain '/' or '%'",
                ));
            }
        } else if !is_dns_subdomain(&name) {
            errors.push(FieldError::invalid(
                "metadata.name",
                &json!(name),
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            ));
        }
        if obj.get("metadata").is_some_and(|m| !m.is_object()) {
            errors.push(FieldError::invalid(
                "metadata",
                &obj["metadata"],
                "must be an object",
            ));
        }
        match (rt.group.as_str(), rt.resource.as_str()) {
            ("", "secrets") => {
                use base64::Engine;
                if let Some(sd) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
                    for (k, v) in sd.as_object().into_iter().flatten() {
                        let enc = base64::engine::general_purpose::STANDARD
                            .encode(v.as_str().unwrap_or_default());
                        if !obj["data"].is_object() {
                            obj["data"] = json!({});
                        }
                        obj["data"][k] = json!(enc);
                    }
                }
                if obj.get("type").is_none() {
                    obj["type"] = json!("Opaque");
                }
            }
            ("", "services") => {
                let spec = &mut obj["spec"];
                if !spec.is_object() {
                    *spec = json!({});
                }
                for (k, v) in [
                    ("type", json!("ClusterIP")),
                    ("sessionAffinity", json!("None")),
                    ("internalTrafficPolicy", json!("Cluster")),
                    ("ipFamilies", json!(["IPv4"])),
                    ("ipFamilyPolicy", json!("SingleStack")),
                ] {
                    if spec.get(k).is_none() {
                        spec[k] = v;
                    }
                }
                if spec["type"] != "ExternalName" && spec.get("clusterIP").is_none() {
                    let ip = old
                        .and_then(|o| o["spec"].get("clusterIP").cloned())
                        .unwrap_or_else(|| {
                            json!(format!(
                                "10.96.{}.{}",
                                (self.rv / 250) % 250,
                                self.rv % 250 + 1
                            ))
                        });
                    spec["clusterIPs"] = json!([ip.clone()]);
                    spec["clusterIP"] = ip;
                }
                for p in spec["ports"].as_array_mut().into_iter().flatten() {
                    if p.get("protocol").is_none() {
                        p["protocol"] = json!("TCP");
                    }
                    if p.get("targetPort").is_none() {
                        p["targetPort"] = p["port"].clone();
                    }
                }
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let spec = &obj["spec"];
                let (group, plural) = (
                    spec["group"].as_str().unwrap_or_default(),
                    spec["names"]["plural"].as_str().unwrap_or_default(),
                );
                if name != format!("{plural}.{group}") {
                    errors.push(FieldError::invalid(
                        "metadata.name",
                        &json!(name),
                        "must be spec.names.plural+\".\"+spec.group",
                    ));
                }
                if spec["names"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .is_empty()
                {
                    errors.push(FieldError::required("spec.names.kind"));
                }
                if spec["versions"].as_array().is_none_or(|v| v.is_empty()) {
                    errors.push(FieldError::required("spec.versions"));
                }
                let storage = spec["versions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|v| v["storage"].as_bool() == Some(true));
                let stored = storage.map(|v| v["name"].clone()).unwrap_or(json!("v1"));
                obj["status"] = json!({
                    "acceptedNames": spec["names"].clone(),
                    "storedVersions": [stored],
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now()},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now()},
                    ],
                });
            }
            ("admissionregistration.k8s.io", _) => {
                errors.extend(admission::validate(rt, obj));
            }
            _ => {}
        }
        let mut unknown_fields = Vec::new();
        if let (true, Some(schema)) = (rt.crd, rt.schema.as_ref()) {
            let a = schema::admit(schema, obj, old, &self.validator);
            unknown_fields = a.unknown_fields;
            errors.extend(a.errors);
            match crate::builtin::decode_metadata(obj) {
                Ok(unknown) => {
                    for f in &unknown {
                        crate::builtin::remove_dotted(obj, f);
                    }
                    unknown_fields.extend(unknown);
                }
                Err(e) => errors.push(FieldError::invalid("metadata", &json!("object"), e)),
            }
        } else if !rt.crd {
            match crate::builtin::decode(rt, obj) {
                Ok(Some(d)) => {
                    // Like a Go decoder, the stored object keeps only what its type has.
                    for f in &d.unknown_fields {
                        crate::builtin::remove_dotted(obj, f);
                    }
                    unknown_fields = d.unknown_fields;
                }
                Ok(None) => {}
                Err(e) => errors.push(FieldError {
                    field: "<body>".into(),
                    reason: "FieldValueInvalid",
                    message: format!("cannot decode as {}: {e}", rt.kind),
                }),
            }
        }
        if !unknown_fields.is_empty() {
            match opts.field_validation {
                FieldValidation::Strict => {
                    let list: Vec<String> = unknown_fields
                        .iter()
                        .map(|f| format!("unknown field \"{f}\""))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                FieldValidation::Warn => self.warnings.extend(
                    unknown_fields
                        .iter()
                        .map(|f| format!("unknown field \"{f}\"")),
                ),
                FieldValidation::Ignore => {}
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&rt.group_kind(), &name, errors))
        }
    }

    /// Validating admission policies, for writes a user asks for: the
    /// objects in the form the client sees.
    #[allow(clippy::too_many_arguments)]
    fn admission(
        &mut self,
        rt: &ResourceType,
        operation: admission::Operation,
        subresource: Option<&str>,
        ns: &str,
        name: &str,
        object: Option<&Value>,
        old: Option<&Value>,
        user: Option<&Identity>,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let Some(user) = user else {
            return Ok(());
        };
        // Most clusters have no policy: then a write costs no copy.
        if self.list_storage(admission::BINDINGS).next().is_none() {
            return Ok(());
        }
        let object = object.map(|o| from_stored(rt, o.clone()));
        let old = old.map(|o| from_stored(rt, o.clone()));
        let verdict = admission::admit(
            self,
            &admission::Request {
                operation,
                rt,
                subresource: subresource.unwrap_or_default(),
                namespace: ns,
                name,
                object: object.as_ref(),
                old_object: old.as_ref(),
                user,
                dry_run,
            },
        )?;
        self.warnings.extend(verdict.warnings);
        self.audit_annotations.extend(verdict.audit_annotations);
        Ok(())
    }

    /// POST: creates an object (stored form in, stored form out).
    pub fn create(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        mut obj: Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        self.warnings.clear();
        self.audit_annotations.clear();
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        let body_ns = meta_str(&obj, "namespace").to_string();
        if rt.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            set_meta(&mut obj, "namespace", json!(ns));
        } else if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        if meta_str(&obj, "name").is_empty() {
            let gen_name = meta_str(&obj, "generateName").to_string();
            if gen_name.is_empty() {
                return Err(ApiError::invalid(
                    &rt.group_kind(),
                    "",
                    vec![FieldError {
                        field: "metadata.name".into(),
                        reason: "FieldValueRequired",
                        message: "Required value: name or generateName is required".into(),
                    }],
                ));
            }
            set_meta(
                &mut obj,
                "name",
                json!(format!("{gen_name}{}", random_suffix(5))),
            );
        }
        let name = meta_str(&obj, "name").to_string();
        self.namespace_check(rt, ns)?;
        if self.get_opt(&rt.storage, ns, &name).is_some() {
            return Err(ApiError::already_exists(&rt.group_resource(), &name));
        }
        if let Some(m) = obj["metadata"].as_object_mut() {
            for k in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "selfLink",
            ] {
                m.remove(k);
            }
        }
        if rt.status_subresource
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        if rt.group.is_empty() && rt.resource == "namespaces" {
            obj["status"] = json!({"phase": "Active"});
        }
        self.admit(rt, &mut obj, None, opts)?;
        set_meta(&mut obj, "uid", json!(uuid::Uuid::new_v4().to_string()));
        set_meta(&mut obj, "creationTimestamp", json!(now()));
        if rt.has_generation {
            set_meta(&mut obj, "generation", json!(1));
        } else if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("generation");
        }
        self.admission(
            rt,
            admission::Operation::Create,
            opts.subresource.as_deref(),
            ns,
            &name,
            Some(&obj),
            None,
            opts.user.as_ref(),
            opts.dry_run,
        )?;
        if opts.dry_run {
            return Ok(obj);
        }
        Ok(self.commit(&rt.storage, ns, &name, Some(obj), EventKind::Added))
    }

    /// PUT / PATCH: writes a new version of an existing object.
    ///
    /// `new` is the full proposed object; `check_rv` enables optimistic concurrency on the
    /// `metadata.resourceVersion` it carries.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut new: Value,
        check_rv: bool,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        self.warnings.clear();
        self.audit_annotations.clear();
        let old = self.get(rt, ns, name)?;
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        if !new["metadata"].is_object() {
            new["metadata"] = json!({});
        }
        let body_name = meta_str(&new, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_ns = meta_str(&new, "namespace");
        if rt.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let rv = meta_str(&new, "resourceVersion").to_string();
        if check_rv && !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(
                &rt.group_resource(),
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        if check_rv && rv.is_empty() && rt.crd {
            return Err(ApiError::invalid(
                &rt.group_kind(),
                name,
                vec![FieldError::invalid(
                    "metadata.resourceVersion",
                    &json!("0x0"),
                    "must be specified for an update",
                )],
            ));
        }
        let uid = meta_str(&new, "uid");
        if !uid.is_empty() && uid != meta_str(&old, "uid") {
            return Err(ApiError::conflict(
                &rt.group_resource(),
                name,
                "Precondition failed: UID in precondition does not match the UID in the object",
            ));
        }
        // Status subresource separation, both ways.
        if opts.subresource.as_deref() == Some("status") {
            let status = new.get("status").cloned();
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    new.as_object_mut().expect("object").remove("status");
                }
            }
        } else {
            if rt.status_subresource {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        new.as_object_mut().expect("object").remove("status");
                    }
                }
            }
            let keep = [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "name",
                "namespace",
            ];
            let meta = new["metadata"].as_object_mut().expect("object");
            for k in keep {
                match old["metadata"].get(k) {
                    Some(v) => meta.insert(k.to_string(), v.clone()),
                    None => meta.remove(k),
                };
            }
            if old["metadata"].get("deletionTimestamp").is_some() {
                let before = finalizers(&old);
                if let Some(f) = finalizers(&new).into_iter().find(|f| !before.contains(f)) {
                    return Err(ApiError::invalid(
                        &rt.group_kind(),
                        name,
                        vec![FieldError::forbidden(
                            "metadata.finalizers",
                            format!(
                                "no new finalizers can be added if the object is being deleted, found new finalizers [\"{f}\"]"
                            ),
                        )],
                    ));
                }
            }
        }
        if rt.group.is_empty() && rt.resource == "namespaces" && new.get("status").is_none() {
            new["status"] = old["status"].clone();
        }
        set_meta(
            &mut new,
            "resourceVersion",
            old["metadata"]["resourceVersion"].clone(),
        );
        if new["metadata"].get("managedFields").is_none()
            && let Some(mf) = old["metadata"].get("managedFields")
        {
            set_meta(&mut new, "managedFields", mf.clone());
        }
        self.admit(rt, &mut new, Some(&old), opts)?;
        if !opts.applying {
            release_changed_fields(&mut new, &old);
        }
        self.admission(
            rt,
            admission::Operation::Update,
            opts.subresource.as_deref(),
            ns,
            name,
            Some(&new),
            Some(&old),
            opts.user.as_ref(),
            opts.dry_run,
        )?;
        if comparable(&new) == comparable(&old) {
            // The no-op rule: nothing changed, so no new resourceVersion and no watch event.
            return Ok(old);
        }
        if rt.has_generation
            && spec_part(&new, rt.status_subresource) != spec_part(&old, rt.status_subresource)
        {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
            set_meta(&mut new, "generation", json!(g));
        }
        if opts.dry_run {
            return Ok(new);
        }
        if new["metadata"].get("deletionTimestamp").is_some() && finalizers(&new).is_empty() {
            let out = self.commit(&rt.storage, ns, name, Some(new), EventKind::Modified);
            self.remove(&rt.storage, ns, name, Propagation::Background);
            return Ok(out);
        }
        Ok(self.commit(&rt.storage, ns, name, Some(new), EventKind::Modified))
    }

    /// PATCH of any type, server-side apply included (which creates the object when absent).
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        ptype: PatchType,
        body: &Value,
        opts: &WriteOptions,
    ) -> Result<(Value, bool), ApiError> {
        let existing = self
            .get_opt(&rt.storage, ns, name)
            .cloned()
            .map(|o| from_stored(rt, o));
        let Some(current) = existing else {
            if ptype == PatchType::Apply {
                if opts.subresource.is_some() {
                    return Err(ApiError::not_found(&rt.group_resource(), name));
                }
                let mut obj = body.clone();
                set_meta(&mut obj, "name", json!(name));
                let mut obj = to_stored(rt, obj);
                let manager = opts
                    .field_manager
                    .clone()
                    .unwrap_or_else(|| "unknown".into());
                set_meta(
                    &mut obj,
                    "managedFields",
                    json!([managed_entry(&manager, rt, None, &patch::leaf_paths(body))]),
                );
                return self.create(rt, ns, obj, opts).map(|o| (o, true));
            }
            return Err(ApiError::not_found(&rt.group_resource(), name));
        };
        let mut target = current.clone();
        let mut check_rv = false;
        match ptype {
            PatchType::Merge => {
                patch::merge(&mut target, body);
                check_rv = body["metadata"].get("resourceVersion").is_some();
            }
            PatchType::Json => {
                patch::json(&mut target, body)?;
                check_rv =
                    target["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"];
            }
            PatchType::Strategic => {
                if !rt.strategic {
                    return Err(ApiError::unsupported_media("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".to_string()));
                }
                patch::strategic(&mut target, body);
                check_rv = body["metadata"].get("resourceVersion").is_some();
            }
            PatchType::Apply => {
                target = self.server_side_apply(rt, &current, body, opts)?;
            }
        }
        let new = to_stored(rt, target);
        let opts = WriteOptions {
            applying: ptype == PatchType::Apply,
            ..opts.clone()
        };
        self.update(rt, ns, name, new, check_rv, &opts)
            .map(|o| (o, false))
    }

    /// Server-side apply with field ownership tracked in `metadata.managedFields` (Apply
    /// operations only). A field the applied config sets to a different value than the live
    /// object, and that another Apply manager owns, is a 409 conflict unless `force` is set
    /// (then ownership moves). Fields a manager applied before and omits now are removed when no
    /// other manager owns them. Updates by PUT/merge/JSON patch take no ownership, so they never
    /// cause apply conflicts. Lists are owned atomically.
    fn server_side_apply(
        &self,
        rt: &ResourceType,
        live: &Value,
        applied: &Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let manager = opts
            .field_manager
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let sub = opts.subresource.clone();
        let mut entries: Vec<Value> = live["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mine = |e: &Value| {
            e["manager"] == json!(manager)
                && e["operation"] == "Apply"
                && e.get("subresource").and_then(Value::as_str) == sub.as_deref()
        };
        let new_paths: Vec<patch::FieldPath> = patch::leaf_paths(applied)
            .into_iter()
            .filter(|p| {
                sub.as_deref() != Some("status") || p.first().map(String::as_str) == Some("status")
            })
            .collect();
        let old_paths = entries
            .iter()
            .find(|e| mine(e))
            .map(|e| patch::fields_v1_to_paths(&e["fieldsV1"]))
            .unwrap_or_default();
        let mut conflicts = Vec::new();
        for e in entries
            .iter_mut()
            .filter(|e| !mine(e) && e["operation"] == "Apply")
        {
            let theirs = patch::fields_v1_to_paths(&e["fieldsV1"]);
            let mut keep = Vec::new();
            for p in theirs {
                let clash = new_paths
                    .iter()
                    .any(|n| n.starts_with(&p) || p.starts_with(n))
                    && new_paths.iter().any(|n| {
                        (n.starts_with(&p) || p.starts_with(n))
                            && patch::get_path(applied, n) != patch::get_path(live, n)
                    });
                if clash && !opts.force {
                    conflicts.push(format!(
                        "conflict with \"{}\": .{}",
                        e["manager"].as_str().unwrap_or_default(),
                        p.join(".")
                    ));
                }
                if !clash || !opts.force {
                    keep.push(p);
                }
            }
            e["fieldsV1"] = patch::paths_to_fields_v1(&keep);
        }
        if !conflicts.is_empty() {
            return Err(ApiError::new(409, "Conflict", format!("Apply failed with {} conflict{}: {}", conflicts.len(), if conflicts.len() == 1 { "" } else { "s" }, conflicts.join("\n")))
                .with_details(json!({"name": meta_str(live, "name"), "group": rt.group, "kind": rt.resource,
                    "causes": conflicts.iter().map(|c| json!({"reason": "FieldManagerConflict", "message": c})).collect::<Vec<_>>()})));
        }
        let others: Vec<patch::FieldPath> = entries
            .iter()
            .filter(|e| !mine(e))
            .flat_map(|e| patch::fields_v1_to_paths(&e["fieldsV1"]))
            .collect();
        let mut target = live.clone();
        for p in &old_paths {
            if !new_paths.iter().any(|n| n == p || n.starts_with(p))
                && !others.iter().any(|o| o == p || o.starts_with(p))
            {
                patch::remove_path(&mut target, p);
            }
        }
        let mut to_merge = applied.clone();
        if let Some(m) = to_merge.as_object_mut() {
            // Identity and server-owned metadata are not taken from the applied config.
            if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.retain(|k, _| {
                    matches!(
                        k.as_str(),
                        "labels" | "annotations" | "finalizers" | "ownerReferences"
                    )
                });
            }
        }
        patch::apply_merge(&mut target, &to_merge);
        entries.retain(|e| !mine(e) && !patch::fields_v1_to_paths(&e["fieldsV1"]).is_empty());
        entries.push(managed_entry(&manager, rt, sub.as_deref(), &new_paths));
        set_meta(&mut target, "managedFields", Value::Array(entries));
        Ok(target)
    }

    /// DELETE: with finalizers (or foreground propagation) the object only gets a
    /// deletionTimestamp; otherwise it is removed and its dependents are collected.
    #[allow(clippy::too_many_arguments)]
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        propagation: Propagation,
        precondition_rv: Option<&str>,
        dry_run: bool,
        user: Option<&Identity>,
    ) -> Result<Value, ApiError> {
        self.warnings.clear();
        self.audit_annotations.clear();
        let obj = self.get(rt, ns, name)?;
        if let Some(rv) = precondition_rv.filter(|rv| *rv != meta_str(&obj, "resourceVersion")) {
            return Err(ApiError::conflict(
                &rt.group_resource(),
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&obj, "resourceVersion")
                ),
            ));
        }
        self.admission(
            rt,
            admission::Operation::Delete,
            None,
            ns,
            name,
            None,
            Some(&obj),
            user,
            dry_run,
        )?;
        if dry_run {
            return Ok(obj);
        }
        let is_ns = rt.group.is_empty() && rt.resource == "namespaces";
        let mut fins = finalizers(&obj);
        let has_dependents = self.dependents(meta_str(&obj, "uid")).next().is_some();
        if propagation == Propagation::Foreground
            && has_dependents
            && !fins.iter().any(|f| f == "foregroundDeletion")
        {
            fins.push("foregroundDeletion".into());
        }
        if fins.is_empty() && !is_ns {
            let out = self.remove(&rt.storage, ns, name, propagation);
            return Ok(out.unwrap_or(obj));
        }
        let mut updated = obj.clone();
        if updated["metadata"].get("deletionTimestamp").is_none() {
            set_meta(&mut updated, "deletionTimestamp", json!(now()));
            set_meta(&mut updated, "deletionGracePeriodSeconds", json!(0));
        }
        if !fins.is_empty() {
            set_meta(&mut updated, "finalizers", json!(fins));
        }
        if is_ns {
            updated["status"] = json!({"phase": "Terminating"});
        }
        let out = if comparable(&updated) != comparable(&obj) {
            self.commit(&rt.storage, ns, name, Some(updated), EventKind::Modified)
        } else {
            obj
        };
        if propagation == Propagation::Foreground {
            self.collect_dependents(meta_str(&out, "uid").to_string(), Propagation::Background);
        }
        if is_ns {
            self.terminate_namespace(name);
        }
        Ok(out)
    }

    fn dependents<'a>(
        &'a self,
        uid: &'a str,
    ) -> impl Iterator<Item = (String, String, String)> + 'a {
        self.objects.iter().flat_map(move |(storage, m)| {
            m.iter()
                .filter(move |(_, o)| {
                    o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
                })
                .map(move |((ns, name), _)| (storage.clone(), ns.clone(), name.clone()))
        })
    }

    /// Removes an object for good (DELETED event) and garbage-collects what it owned.
    fn remove(
        &mut self,
        storage: &str,
        ns: &str,
        name: &str,
        propagation: Propagation,
    ) -> Option<Value> {
        let obj = self.get_opt(storage, ns, name)?.clone();
        let out = self.commit(storage, ns, name, None, EventKind::Deleted);
        if storage == "apiextensions.k8s.io/customresourcedefinitions" {
            // Deleting a CRD deletes its custom resources, as the apiserver's cleanup finalizer does.
            let crs = format!(
                "{}/{}",
                obj["spec"]["group"].as_str().unwrap_or_default(),
                obj["spec"]["names"]["plural"].as_str().unwrap_or_default()
            );
            let keys: Vec<(String, String)> = self
                .objects
                .get(&crs)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            for (n, nm) in keys {
                self.delete_by_storage(&crs, &n, &nm);
            }
        }
        let uid = meta_str(&obj, "uid").to_string();
        self.collect_dependents(uid, propagation);
        // An owner waiting in foreground deletion is released when its last dependent goes.
        for r in obj["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let owner_uid = r["uid"].as_str().unwrap_or_default().to_string();
            if self.dependents(&owner_uid).next().is_some() {
                continue;
            }
            let owner = self.objects.iter().find_map(|(s, m)| {
                m.iter()
                    .find(|(_, o)| o["metadata"]["uid"] == json!(owner_uid))
                    .map(|((n, nm), o)| (s.clone(), n.clone(), nm.clone(), o.clone()))
            });
            if let Some((s, n, nm, mut o)) = owner {
                let fins: Vec<String> = finalizers(&o)
                    .into_iter()
                    .filter(|f| f != "foregroundDeletion")
                    .collect();
                if fins.len() != finalizers(&o).len() {
                    set_meta(&mut o, "finalizers", json!(fins));
                    self.commit(&s, &n, &nm, Some(o), EventKind::Modified);
                    if fins.is_empty() {
                        self.remove(&s, &n, &nm, Propagation::Background);
                    }
                }
            }
        }
        if storage != "/namespaces" && !ns.is_empty() {
            let terminating = self
                .get_opt("/namespaces", "", ns)
                .is_some_and(|n| n["metadata"].get("deletionTimestamp").is_some());
            if terminating {
                self.terminate_namespace(ns);
            }
        }
        Some(out)
    }

    fn collect_dependents(&mut self, uid: String, propagation: Propagation) {
        let deps: Vec<(String, String, String)> = self.dependents(&uid).collect();
        for (s, n, nm) in deps {
            if propagation == Propagation::Orphan {
                if let Some(mut o) = self.get_opt(&s, &n, &nm).cloned() {
                    if let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() {
                        refs.retain(|r| r["uid"] != json!(uid));
                    }
                    self.commit(&s, &n, &nm, Some(o), EventKind::Modified);
                }
            } else {
                self.delete_by_storage(&s, &n, &nm);
            }
        }
    }

    /// Background deletion of an object known only by its storage key (GC and namespace cleanup).
    fn delete_by_storage(&mut self, storage: &str, ns: &str, name: &str) {
        let Some(obj) = self.get_opt(storage, ns, name).cloned() else {
            return;
        };
        if finalizers(&obj).is_empty() {
            self.remove(storage, ns, name, Propagation::Background);
        } else if obj["metadata"].get("deletionTimestamp").is_none() {
            let mut o = obj;
            set_meta(&mut o, "deletionTimestamp", json!(now()));
            set_meta(&mut o, "deletionGracePeriodSeconds", json!(0));
            self.commit(storage, ns, name, Some(o), EventKind::Modified);
        }
    }

    /// Deletes everything in a terminating namespace; removes the namespace once it is empty.
    fn terminate_namespace(&mut self, ns: &str) {
        let inside: Vec<(String, String)> = self
            .objects
            .iter()
            .flat_map(|(s, m)| {
                m.keys()
                    .filter(|(n, _)| n == ns)
                    .map(move |(_, name)| (s.clone(), name.clone()))
            })
            .collect();
        for (s, name) in &inside {
            self.delete_by_storage(s, ns, name);
        }
        let empty = !self
            .objects
            .values()
            .any(|m| m.keys().any(|(n, _)| n == ns));
        if empty && self.get_opt("/namespaces", "", ns).is_some() {
            self.remove("/namespaces", "", ns, Propagation::Background);
        }
    }
}

/// A non-apply write that changes or removes a field takes it away from its appliers (on a real
/// apiserver the updater becomes its owner; here nobody does), so later applies of other
/// managers do not conflict on it.
fn release_changed_fields(new: &mut Value, old: &Value) {
    let Some(entries) = new["metadata"]["managedFields"].as_array().cloned() else {
        return;
    };
    let mut kept = Vec::new();
    for mut e in entries {
        let paths: Vec<patch::FieldPath> = patch::fields_v1_to_paths(&e["fieldsV1"])
            .into_iter()
            .filter(|p| {
                patch::get_path(new, p).is_some()
                    && patch::get_path(new, p) == patch::get_path(old, p)
            })
            .collect();
        if !paths.is_empty() {
            e["fieldsV1"] = patch::paths_to_fields_v1(&paths);
            kept.push(e);
        }
    }
    if kept.is_empty() {
        if let Some(m) = new["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
    } else {
        new["metadata"]["managedFields"] = Value::Array(kept);
    }
}

fn managed_entry(
    manager: &str,
    rt: &ResourceType,
    sub: Option<&str>,
    paths: &[patch::FieldPath],
) -> Value {
    let mut e = json!({
        "manager": manager, "operation": "Apply", "apiVersion": rt.api_version(), "time": now(),
        "fieldsType": "FieldsV1", "fieldsV1": patch::paths_to_fields_v1(paths),
    });
    if let Some(s) = sub {
        e["subresource"] = json!(s);
    }
    e
}

/// `propagationPolicy` of a DELETE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Foreground") => Propagation::Foreground,
            Some("Orphan") => Propagation::Orphan,
            _ => Propagation::Background,
        }
    }
}
