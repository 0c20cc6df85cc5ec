//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`): the
//! policies and their bindings decide every create, update (PUT, every patch
//! type, server-side apply) and delete of the resources they match, as the
//! API server's `ValidatingAdmissionPolicy` plugin does (after defaulting and
//! schema validation, before the object is stored; dry runs included).
//!
//! - **Matching**: `matchConstraints.resourceRules` / `excludeResourceRules`
//!   (`apiGroups`, `apiVersions`, `operations`, `resources` with `*`, `*/*`,
//!   `r/*`, `*/sub`, `resourceNames`, `scope`), `namespaceSelector` and
//!   `objectSelector` (label selectors: for a Namespace its own labels; a
//!   cluster-scoped object always matches the namespace selector), intersected
//!   with the binding's `matchResources`; then `matchConditions` (any false
//!   skips the policy; an error rejects under `failurePolicy: Fail`, skips
//!   under `Ignore`).
//! - **CEL** (the `cel` crate with kube-cel's Kubernetes functions):
//!   `object` (null on DELETE), `oldObject` (null on CREATE), `request`
//!   (`operation`, `namespace`, `name`, `userInfo{username, uid, groups,
//!   extra}`, `kind`, `resource`, `subResource`, `dryRun`, …),
//!   `namespaceObject` (null for cluster-scoped objects), `variables`
//!   (evaluated in order; one that fails is absent, so an expression using it
//!   fails), and `authorizer`: `group(g).resource(r)[.subresource(s)]
//!   .namespace(n).name(x).check(verb)` and `path(p).check(verb)` give a
//!   decision with `allowed()`, `reason()`, `errored()`, `error()`;
//!   `serviceAccount(ns, name)` checks as that ServiceAccount. Checks are
//!   answered by the emulator's RBAC for the requesting user.
//!   `messageExpression` sees everything but `authorizer`.
//! - **Verdicts**: a false validation (or, under `Fail`, one that errs) is a
//!   violation with the validation's `message`, else its `messageExpression`
//!   if that gives a non-empty string, else `failed expression: <expr>`. The
//!   binding's `validationActions`: `Deny` refuses the request with the first
//!   violation (`reason` Forbidden 403, Unauthorized 401,
//!   RequestEntityTooLarge 413, default Invalid 422), worded as the API
//!   server words it; `Warn` adds a `Warning: 299` header; `Audit` adds the
//!   `validation.policy.admission.k8s.io/validation_failure` annotation to
//!   the request's audit entry.
//! - **Not implemented**: `paramKind` / `paramRef` (such a policy or binding is
//!   refused with 422 saying so), `auditAnnotations` (accepted, not
//!   evaluated), type checking (`status.typeChecking`), CEL cost limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube_cel::KubeCelExt;
use kube_cel::cel::objects::{Key, Map, Opaque};
use kube_cel::cel::{self, Context, ExecutionError, Program};
use serde_json::{Value, json};

use crate::error::{ApiError, FieldError};
use crate::rbac::{self, Attributes, ResourceAttributes, Snapshot};
use crate::registry::ResourceType;
use crate::store::{Identity, State, meta_str};

/// Storage of ValidatingAdmissionPolicies.
pub const POLICIES: &str = "admissionregistration.k8s.io/validatingadmissionpolicies";
/// Storage of ValidatingAdmissionPolicyBindings.
pub const BINDINGS: &str = "admissionregistration.k8s.io/validatingadmissionpolicybindings";
/// Audit annotation of failed validations bound with `Audit`.
pub const AUDIT_KEY: &str = "validation.policy.admission.k8s.io/validation_failure";

/// The admission operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// One request as admission sees it (objects in the form the client sees).
pub struct Request<'a> {
    pub operation: Operation,
    pub rt: &'a ResourceType,
    /// `""` for the main resource.
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    pub user: &'a Identity,
    pub dry_run: bool,
}

/// What admitted requests carry besides being admitted.
#[derive(Debug, Default)]
pub struct Verdict {
    /// `Warn` actions: `Warning` headers.
    pub warnings: Vec<String>,
    /// `Audit` actions: audit annotations.
    pub audit_annotations: BTreeMap<String, String>,
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn rule_matches(rule: &Value, req: &Request) -> bool {
    let any = |list: Vec<&str>, want: &str| list.iter().any(|x| *x == "*" || *x == want);
    if !any(strs(&rule["operations"]), req.operation.as_str())
        || !any(strs(&rule["apiGroups"]), &req.rt.group)
        || !any(strs(&rule["apiVersions"]), &req.rt.version)
    {
        return false;
    }
    // `*` is every resource, `*/*` every resource and subresource, `r/*`
    // every subresource of r, `*/s` subresource s of every resource.
    let resource_ok = strs(&rule["resources"])
        .iter()
        .any(|r| match r.split_once('/') {
            _ if *r == "*/*" => true,
            None => req.subresource.is_empty() && (*r == "*" || *r == req.rt.resource),
            Some((res, sub)) => {
                !req.subresource.is_empty()
                    && (res == "*" || res == req.rt.resource)
                    && (sub == "*" || sub == req.subresource)
            }
        });
    if !resource_ok {
        return false;
    }
    let names = strs(&rule["resourceNames"]);
    if !names.is_empty() && !names.contains(&req.name) {
        return false;
    }
    match rule["scope"].as_str().unwrap_or("*") {
        "Cluster" => !req.rt.namespaced,
        "Namespaced" => req.rt.namespaced,
        _ => true,
    }
}

fn labels_match(selector: &Value, obj: Option<&Value>) -> bool {
    if selector.is_null() {
        return true;
    }
    let sel = rbac::label_selector_of(selector);
    obj.is_some_and(|o| sel.matches(o))
}

/// Whether `matchConstraints` / `matchResources` select the request.
/// `require_rules`: the policy's constraints need a matching rule; a
/// binding's `matchResources` without rules does not narrow by resource.
fn resources_match(m: &Value, req: &Request, state: &State, require_rules: bool) -> bool {
    let rules = m["resourceRules"].as_array().cloned().unwrap_or_default();
    if (require_rules || !rules.is_empty()) && !rules.iter().any(|r| rule_matches(r, req)) {
        return false;
    }
    if m["excludeResourceRules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| rule_matches(r, req))
    {
        return false;
    }
    let ns_selector = &m["namespaceSelector"];
    let ns_ok = if req.rt.group.is_empty() && req.rt.resource == "namespaces" {
        labels_match(ns_selector, req.object.or(req.old_object))
    } else if !req.rt.namespaced {
        true
    } else {
        labels_match(ns_selector, state.get_opt("/namespaces", "", req.namespace))
    };
    let obj_selector = &m["objectSelector"];
    ns_ok && (labels_match(obj_selector, req.object) || labels_match(obj_selector, req.old_object))
}

/// JSON to a CEL value (numbers as int, uint or double, as the API server's).
pub fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (_, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(o) => cel::Value::Map(Map {
            map: Arc::new(
                o.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                    .collect(),
            ),
        }),
    }
}

/// What an `authorizer` value has been narrowed to so far.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Root,
    Group(String),
    Resource(ResourceAttributes),
    Path(String),
}

/// The `authorizer` variable and the builders it returns: checks against the
/// emulator's RBAC (a snapshot taken for this request) as `user`.
struct Authorizer {
    rbac: Arc<Snapshot>,
    user: Identity,
    target: Target,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Authorizer({}, {:?})", self.user.username, self.target)
    }
}

impl PartialEq for Authorizer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.rbac, &other.rbac)
            && self.user == other.user
            && self.target == other.target
    }
}
impl Eq for Authorizer {}

impl Opaque for Authorizer {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.authorization.Authorizer"
    }
}

/// The result of `check()`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decision {
    allowed: bool,
    reason: String,
    error: String,
}

impl Opaque for Decision {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.authorization.Decision"
    }
}

fn this_authorizer<'a>(v: &'a cel::Value, f: &str) -> Result<&'a Authorizer, ExecutionError> {
    match v {
        cel::Value::Opaque(o) => o
            .downcast_ref::<Authorizer>()
            .ok_or_else(|| ExecutionError::function_error(f, "not called on an authorizer")),
        _ => Err(ExecutionError::function_error(
            f,
            "not called on an authorizer",
        )),
    }
}

fn this_decision<'a>(v: &'a cel::Value, f: &str) -> Result<&'a Decision, ExecutionError> {
    match v {
        cel::Value::Opaque(o) => o
            .downcast_ref::<Decision>()
            .ok_or_else(|| ExecutionError::function_error(f, "not called on a decision")),
        _ => Err(ExecutionError::function_error(
            f,
            "not called on a decision",
        )),
    }
}

fn narrowed(a: &Authorizer, target: Target) -> cel::Value {
    cel::Value::Opaque(Arc::new(Authorizer {
        rbac: Arc::clone(&a.rbac),
        user: a.user.clone(),
        target,
    }))
}

/// `.namespace()`, `.name()`, `.subresource()` of a resource check.
fn set_field(
    f: &'static str,
) -> impl Fn(cel::extractors::This<cel::Value>, Arc<String>) -> Result<cel::Value, ExecutionError>
+ Send
+ Sync
+ 'static {
    move |cel::extractors::This(this), value| {
        let a = this_authorizer(&this, f)?;
        let Target::Resource(mut r) = a.target.clone() else {
            return Err(ExecutionError::function_error(
                f,
                "call resource() first: authorizer.group(g).resource(r)",
            ));
        };
        match f {
            "namespace" => r.namespace = value.to_string(),
            "name" => r.name = value.to_string(),
            _ => r.subresource = value.to_string(),
        }
        Ok(narrowed(a, Target::Resource(r)))
    }
}

fn register_authorizer(ctx: &mut Context) {
    use cel::extractors::This;
    ctx.add_function(
        "group",
        |This(this): This<cel::Value>, g: Arc<String>| -> Result<cel::Value, ExecutionError> {
            let a = this_authorizer(&this, "group")?;
            Ok(narrowed(a, Target::Group(g.to_string())))
        },
    );
    ctx.add_function(
        "resource",
        |This(this): This<cel::Value>, r: Arc<String>| -> Result<cel::Value, ExecutionError> {
            let a = this_authorizer(&this, "resource")?;
            let Target::Group(group) = &a.target else {
                return Err(ExecutionError::function_error(
                    "resource",
                    "call group() first: authorizer.group(g).resource(r)",
                ));
            };
            Ok(narrowed(
                a,
                Target::Resource(ResourceAttributes {
                    group: group.clone(),
                    resource: r.to_string(),
                    ..Default::default()
                }),
            ))
        },
    );
    ctx.add_function("namespace", set_field("namespace"));
    ctx.add_function("name", set_field("name"));
    ctx.add_function("subresource", set_field("subresource"));
    // RBAC ignores selectors; the builders accept them as the API server's do.
    for f in ["fieldSelector", "labelSelector"] {
        ctx.add_function(
            f,
            |This(this): This<cel::Value>, _s: Arc<String>| -> Result<cel::Value, ExecutionError> {
                this_authorizer(&this, "selector")?;
                Ok(this)
            },
        );
    }
    ctx.add_function(
        "path",
        |This(this): This<cel::Value>, p: Arc<String>| -> Result<cel::Value, ExecutionError> {
            let a = this_authorizer(&this, "path")?;
            Ok(narrowed(a, Target::Path(p.to_string())))
        },
    );
    ctx.add_function(
        "serviceAccount",
        |This(this): This<cel::Value>,
         ns: Arc<String>,
         name: Arc<String>|
         -> Result<cel::Value, ExecutionError> {
            let a = this_authorizer(&this, "serviceAccount")?;
            Ok(cel::Value::Opaque(Arc::new(Authorizer {
                rbac: Arc::clone(&a.rbac),
                user: Identity {
                    username: format!("system:serviceaccount:{ns}:{name}"),
                    uid: String::new(),
                    groups: vec![
                        "system:serviceaccounts".into(),
                        format!("system:serviceaccounts:{ns}"),
                        "system:authenticated".into(),
                    ],
                    service_account: Some((ns.to_string(), name.to_string())),
                },
                target: Target::Root,
            })))
        },
    );
    ctx.add_function(
        "check",
        |This(this): This<cel::Value>, verb: Arc<String>| -> Result<cel::Value, ExecutionError> {
            let a = this_authorizer(&this, "check")?;
            let attrs = match &a.target {
                Target::Resource(r) => Attributes {
                    verb: verb.to_string(),
                    resource: Some(r.clone()),
                    path: String::new(),
                },
                Target::Path(p) => Attributes {
                    verb: verb.to_string(),
                    resource: None,
                    path: p.clone(),
                },
                _ => {
                    return Err(ExecutionError::function_error(
                        "check",
                        "call resource() or path() first",
                    ));
                }
            };
            let allowed = rbac::allowed_in(a.rbac.as_ref(), &a.user, &attrs);
            Ok(cel::Value::Opaque(Arc::new(Decision {
                allowed,
                // RBAC has no opinion on what it does not grant.
                reason: if allowed {
                    "allowed by RBAC".into()
                } else {
                    String::new()
                },
                error: String::new(),
            })))
        },
    );
    ctx.add_function(
        "allowed",
        |This(this): This<cel::Value>| -> Result<cel::Value, ExecutionError> {
            Ok(cel::Value::Bool(this_decision(&this, "allowed")?.allowed))
        },
    );
    ctx.add_function(
        "reason",
        |This(this): This<cel::Value>| -> Result<cel::Value, ExecutionError> {
            Ok(cel::Value::String(Arc::new(
                this_decision(&this, "reason")?.reason.clone(),
            )))
        },
    );
    ctx.add_function(
        "errored",
        |This(this): This<cel::Value>| -> Result<cel::Value, ExecutionError> {
            Ok(cel::Value::Bool(
                !this_decision(&this, "errored")?.error.is_empty(),
            ))
        },
    );
    ctx.add_function(
        "error",
        |This(this): This<cel::Value>| -> Result<cel::Value, ExecutionError> {
            Ok(cel::Value::String(Arc::new(
                this_decision(&this, "error")?.error.clone(),
            )))
        },
    );
}

/// The `request` variable: an AdmissionRequest.
fn request_value(req: &Request) -> Value {
    let rt = req.rt;
    let kind = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
    let resource = json!({"group": rt.group, "version": rt.version, "resource": rt.resource});
    json!({
        "uid": uuid::Uuid::new_v4().to_string(),
        "kind": kind, "resource": resource, "subResource": req.subresource,
        "requestKind": kind, "requestResource": resource, "requestSubResource": req.subresource,
        "name": req.name, "namespace": req.namespace,
        "operation": req.operation.as_str(),
        "userInfo": {"username": req.user.username, "uid": req.user.uid, "groups": req.user.groups, "extra": {}},
        "dryRun": req.dry_run,
        "options": {},
    })
}

/// A failed validation.
struct Violation {
    message: String,
    reason: String,
    index: usize,
}

fn eval(ctx: &Context, expr: &str) -> Result<cel::Value, String> {
    let p = Program::compile(expr).map_err(|e| format!("compilation failed: {e}"))?;
    p.execute(ctx).map_err(|e| e.to_string())
}

fn eval_bool(ctx: &Context, expr: &str) -> Result<bool, String> {
    match eval(ctx, expr)? {
        cel::Value::Bool(b) => Ok(b),
        other => Err(format!(
            "expected a bool, got {:?}",
            other.type_of().to_string()
        )),
    }
}

/// Runs every binding that selects `req`; `Err` when one whose policy
/// fails it says Deny.
pub fn admit(state: &State, req: &Request) -> Result<Verdict, ApiError> {
    let mut verdict = Verdict::default();
    let bindings: Vec<&Value> = state.list_storage(BINDINGS).collect();
    if bindings.is_empty() {
        return Ok(verdict);
    }
    let mut rbac_snapshot: Option<Arc<Snapshot>> = None;
    let mut denied: Option<(String, String, Violation)> = None;
    let mut audit_failures: Vec<Value> = Vec::new();
    for binding in bindings {
        let spec = &binding["spec"];
        let policy_name = spec["policyName"].as_str().unwrap_or_default();
        let Some(policy) = state.get_opt(POLICIES, "", policy_name) else {
            continue;
        };
        let p = &policy["spec"];
        if !resources_match(&p["matchConstraints"], req, state, true)
            || (spec.get("matchResources").is_some_and(|m| m.is_object())
                && !resources_match(&spec["matchResources"], req, state, false))
        {
            continue;
        }
        let fail = p["failurePolicy"].as_str().unwrap_or("Fail") != "Ignore";
        let rbac = rbac_snapshot
            .get_or_insert_with(|| Arc::new(Snapshot::of(state)))
            .clone();
        let violations = evaluate(state, req, p, rbac, fail);
        let binding_name = meta_str(binding, "name");
        let actions = strs(&spec["validationActions"]);
        for v in violations {
            if actions.contains(&"Warn") {
                verdict.warnings.push(format!(
                    "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {}",
                    v.message
                ));
            }
            if actions.contains(&"Audit") {
                audit_failures.push(json!({
                    "message": v.message, "policy": policy_name, "binding": binding_name,
                    "expressionIndex": v.index, "validationActions": actions,
                }));
            }
            if actions.contains(&"Deny") && denied.is_none() {
                denied = Some((policy_name.to_owned(), binding_name.to_owned(), v));
            }
        }
    }
    if let Some((policy, binding, v)) = denied {
        let message = format!(
            "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {}",
            v.message
        );
        let gr = req.rt.group_resource();
        let full = if req.name.is_empty() {
            format!("{gr} is forbidden: {message}")
        } else {
            format!("{gr} \"{}\" is forbidden: {message}", req.name)
        };
        let (code, reason) = match v.reason.as_str() {
            "Forbidden" => (403, "Forbidden"),
            "Unauthorized" => (401, "Unauthorized"),
            "RequestEntityTooLarge" => (413, "RequestEntityTooLarge"),
            _ => (422, "Invalid"),
        };
        let mut e = ApiError::new(code, reason, full).with_details(json!({
            "name": req.name, "group": req.rt.group, "kind": req.rt.resource,
            "causes": [{"message": message}],
        }));
        // Warnings of other bindings go with the refusal, as on the API server.
        e.warnings = verdict.warnings;
        return Err(e);
    }
    if !audit_failures.is_empty() {
        verdict.audit_annotations.insert(
            AUDIT_KEY.to_owned(),
            serde_json::to_string(&audit_failures).unwrap_or_default(),
        );
    }
    Ok(verdict)
}

/// The violations of one policy (none when its match conditions skip it).
fn evaluate(
    state: &State,
    req: &Request,
    p: &Value,
    rbac: Arc<Snapshot>,
    fail: bool,
) -> Vec<Violation> {
    let mut ctx = Context::default();
    ctx.register_all();
    register_authorizer(&mut ctx);
    ctx.add_variable_from_value("object", req.object.map_or(cel::Value::Null, to_cel));
    ctx.add_variable_from_value("oldObject", req.old_object.map_or(cel::Value::Null, to_cel));
    ctx.add_variable_from_value("request", to_cel(&request_value(req)));
    ctx.add_variable_from_value(
        "namespaceObject",
        if req.rt.namespaced {
            state
                .get_opt("/namespaces", "", req.namespace)
                .map_or(cel::Value::Null, to_cel)
        } else {
            cel::Value::Null
        },
    );
    ctx.add_variable_from_value("params", cel::Value::Null);
    ctx.add_variable_from_value(
        "authorizer",
        cel::Value::Opaque(Arc::new(Authorizer {
            rbac,
            user: req.user.clone(),
            target: Target::Root,
        })),
    );
    // Match conditions: a false one skips the policy, whatever errors others had.
    let mut errors = Vec::new();
    for c in p["matchConditions"].as_array().into_iter().flatten() {
        let name = c["name"].as_str().unwrap_or_default();
        match eval_bool(&ctx, c["expression"].as_str().unwrap_or_default()) {
            Ok(true) => {}
            Ok(false) => return Vec::new(),
            Err(e) => errors.push(format!("matchCondition '{name}': {e}")),
        }
    }
    if let Some(e) = errors.into_iter().next() {
        return if fail {
            vec![Violation {
                message: format!("failed to evaluate {e}"),
                reason: "Invalid".into(),
                index: 0,
            }]
        } else {
            Vec::new()
        };
    }
    let mut values: Vec<(String, cel::Value)> = Vec::new();
    for v in p["variables"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or_default().to_owned();
        let map = cel::Value::Map(Map {
            map: Arc::new(
                values
                    .iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), v.clone()))
                    .collect(),
            ),
        });
        ctx.add_variable_from_value("variables", map);
        if let Ok(value) = eval(&ctx, v["expression"].as_str().unwrap_or_default()) {
            values.push((name, value));
        }
    }
    let map = cel::Value::Map(Map {
        map: Arc::new(
            values
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), v.clone()))
                .collect(),
        ),
    });
    ctx.add_variable_from_value("variables", map);
    let mut out = Vec::new();
    for (index, v) in p["validations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let expr = v["expression"].as_str().unwrap_or_default();
        let reason = v["reason"].as_str().unwrap_or("Invalid").to_owned();
        match eval_bool(&ctx, expr) {
            Ok(true) => {}
            Ok(false) => {
                let message = v["message"]
                    .as_str()
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
                    .or_else(|| {
                        let me = v["messageExpression"].as_str()?;
                        // messageExpression sees everything but the authorizer.
                        let mut inner = ctx.new_inner_scope();
                        inner.add_variable_from_value("authorizer", cel::Value::Null);
                        match eval(&inner, me) {
                            Ok(cel::Value::String(s)) if !s.trim().is_empty() => {
                                Some(s.to_string())
                            }
                            _ => None,
                        }
                    })
                    .unwrap_or_else(|| format!("failed expression: {expr}"));
                out.push(Violation {
                    message,
                    reason,
                    index,
                });
            }
            Err(e) if fail => out.push(Violation {
                message: format!("expression '{expr}' resulted in error: {e}"),
                reason: "Invalid".into(),
                index,
            }),
            Err(_) => {}
        }
    }
    out
}

fn compiles(field: String, expr: Option<&str>, errors: &mut Vec<FieldError>) {
    match expr.filter(|e| !e.trim().is_empty()) {
        None => errors.push(FieldError::required(field)),
        Some(e) => {
            if let Err(err) = Program::compile(e) {
                errors.push(FieldError::invalid(
                    field,
                    &json!(e),
                    format!("compilation failed: {err}"),
                ));
            }
        }
    }
}

/// The API server's validation of a policy or binding on create and update
/// (what the emulator implements; `paramKind`/`paramRef` are refused).
pub fn validate(rt: &ResourceType, obj: &Value) -> Vec<FieldError> {
    let spec = &obj["spec"];
    let mut errors = Vec::new();
    match rt.resource.as_str() {
        "validatingadmissionpolicies" => {
            if !spec["paramKind"].is_null() {
                errors.push(FieldError::forbidden(
                    "spec.paramKind",
                    "kube-emulator does not implement policy parameters (paramKind/paramRef)",
                ));
            }
            if spec["matchConstraints"]["resourceRules"]
                .as_array()
                .is_none_or(|r| r.is_empty())
            {
                errors.push(FieldError::required("spec.matchConstraints.resourceRules"));
            }
            for (k, rules) in ["resourceRules", "excludeResourceRules"]
                .iter()
                .map(|k| (k, &spec["matchConstraints"][k]))
            {
                for (i, r) in rules.as_array().into_iter().flatten().enumerate() {
                    for op in strs(&r["operations"]) {
                        if !matches!(op, "*" | "CREATE" | "UPDATE" | "DELETE" | "CONNECT") {
                            errors.push(FieldError::unsupported(
                                format!("spec.matchConstraints.{k}[{i}].operations"),
                                &json!(op),
                                &[
                                    json!("*"),
                                    json!("CONNECT"),
                                    json!("CREATE"),
                                    json!("DELETE"),
                                    json!("UPDATE"),
                                ],
                            ));
                        }
                    }
                }
            }
            if let Some(f) = spec["failurePolicy"].as_str()
                && f != "Fail"
                && f != "Ignore"
            {
                errors.push(FieldError::unsupported(
                    "spec.failurePolicy",
                    &json!(f),
                    &[json!("Fail"), json!("Ignore")],
                ));
            }
            let validations = spec["validations"].as_array().cloned().unwrap_or_default();
            if validations.is_empty()
                && spec["auditAnnotations"]
                    .as_array()
                    .is_none_or(|a| a.is_empty())
            {
                errors.push(FieldError::required("spec.validations"));
            }
            for (i, v) in validations.iter().enumerate() {
                compiles(
                    format!("spec.validations[{i}].expression"),
                    v["expression"].as_str(),
                    &mut errors,
                );
                if let Some(me) = v["messageExpression"].as_str() {
                    compiles(
                        format!("spec.validations[{i}].messageExpression"),
                        Some(me),
                        &mut errors,
                    );
                }
                if let Some(r) = v["reason"].as_str()
                    && !matches!(
                        r,
                        "Unauthorized" | "Forbidden" | "Invalid" | "RequestEntityTooLarge"
                    )
                {
                    errors.push(FieldError::unsupported(
                        format!("spec.validations[{i}].reason"),
                        &json!(r),
                        &[
                            json!("Forbidden"),
                            json!("Invalid"),
                            json!("RequestEntityTooLarge"),
                            json!("Unauthorized"),
                        ],
                    ));
                }
            }
            for (i, c) in spec["matchConditions"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if c["name"].as_str().is_none_or(str::is_empty) {
                    errors.push(FieldError::required(format!(
                        "spec.matchConditions[{i}].name"
                    )));
                }
                compiles(
                    format!("spec.matchConditions[{i}].expression"),
                    c["expression"].as_str(),
                    &mut errors,
                );
            }
            for (i, v) in spec["variables"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let name = v["name"].as_str().unwrap_or_default();
                let ident = name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !ident {
                    errors.push(FieldError::invalid(
                        format!("spec.variables[{i}].name"),
                        &json!(name),
                        "must be a valid CEL identifier",
                    ));
                }
                compiles(
                    format!("spec.variables[{i}].expression"),
                    v["expression"].as_str(),
                    &mut errors,
                );
            }
        }
        _ => {
            if spec["policyName"].as_str().is_none_or(str::is_empty) {
                errors.push(FieldError::required("spec.policyName"));
            }
            if !spec["paramRef"].is_null() {
                errors.push(FieldError::forbidden(
                    "spec.paramRef",
                    "kube-emulator does not implement policy parameters (paramKind/paramRef)",
                ));
            }
            let actions = strs(&spec["validationActions"]);
            if actions.is_empty() {
                errors.push(FieldError::required("spec.validationActions"));
            }
            for (i, a) in actions.iter().enumerate() {
                if !matches!(*a, "Deny" | "Warn" | "Audit") {
                    errors.push(FieldError::unsupported(
                        format!("spec.validationActions[{i}]"),
                        &json!(a),
                        &[json!("Audit"), json!("Deny"), json!("Warn")],
                    ));
                } else if actions[..i].contains(a) {
                    errors.push(FieldError {
                        field: format!("spec.validationActions[{i}]"),
                        reason: "FieldValueDuplicate",
                        message: format!("Duplicate value: \"{a}\""),
                    });
                }
            }
            if actions.contains(&"Deny") && actions.contains(&"Warn") {
                errors.push(FieldError::invalid(
                    "spec.validationActions",
                    &json!(actions),
                    "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use crate::store::WriteOptions;

    fn state() -> State {
        let (tx, _) = tokio::sync::broadcast::channel(16);
        State::new(tx, 100)
    }

    fn user(name: &str) -> Identity {
        Identity {
            username: name.into(),
            uid: "u".into(),
            groups: vec!["system:authenticated".into()],
            service_account: None,
        }
    }

    fn request<'a>(
        rt: &'a ResourceType,
        op: Operation,
        sub: &'a str,
        object: Option<&'a Value>,
        user: &'a Identity,
    ) -> Request<'a> {
        Request {
            operation: op,
            rt,
            subresource: sub,
            namespace: "default",
            name: "x",
            object,
            old_object: None,
            user,
            dry_run: false,
        }
    }

    #[test]
    fn resource_rules_match_as_documented() {
        let reg = Registry::new(std::iter::empty());
        let pods = reg.lookup("", "v1", "pods").unwrap();
        let ns = reg.lookup("", "v1", "namespaces").unwrap();
        let u = user("a");
        let rule = |resources: &[&str], ops: &[&str], scope: Option<&str>| {
            let mut r = json!({"apiGroups": [""], "apiVersions": ["*"], "operations": ops, "resources": resources});
            if let Some(s) = scope {
                r["scope"] = json!(s);
            }
            r
        };
        let create = request(pods, Operation::Create, "", None, &u);
        let status = request(pods, Operation::Update, "status", None, &u);
        let namespace = request(ns, Operation::Create, "", None, &u);
        for (r, req, want) in [
            (rule(&["pods"], &["CREATE"], None), &create, true),
            (rule(&["pods"], &["UPDATE"], None), &create, false),
            (rule(&["pods"], &["*"], None), &create, true),
            (rule(&["*"], &["*"], None), &create, true),
            (rule(&["*"], &["*"], None), &status, false),
            (rule(&["pods"], &["*"], None), &status, false),
            (rule(&["pods/status"], &["*"], None), &status, true),
            (rule(&["pods/*"], &["*"], None), &status, true),
            (rule(&["pods/*"], &["*"], None), &create, false),
            (rule(&["*/status"], &["*"], None), &status, true),
            (rule(&["*/*"], &["*"], None), &status, true),
            (rule(&["*/*"], &["*"], None), &create, true),
            (rule(&["*"], &["*"], Some("Cluster")), &create, false),
            (rule(&["*"], &["*"], Some("Cluster")), &namespace, true),
            (rule(&["*"], &["*"], Some("Namespaced")), &create, true),
        ] {
            assert_eq!(
                rule_matches(&r, req),
                want,
                "{r} {:?} {}",
                req.operation,
                req.subresource
            );
        }
        let named = json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": ["pods"], "resourceNames": ["y"]});
        assert!(!rule_matches(&named, &create));
    }

    /// The authorizer library against RBAC: resourceNames, subresources,
    /// paths, `serviceAccount()`, decisions; an error under Fail and Ignore.
    #[test]
    fn the_authorizer_answers_with_rbac_for_the_requester() {
        let mut st = state();
        let reg = st.registry.clone();
        let opts = WriteOptions::default();
        for (res, obj) in [
            (
                "roles",
                json!({"metadata": {"name": "r", "namespace": "default"}, "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["db"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]}),
            ),
            (
                "rolebindings",
                json!({"metadata": {"name": "b", "namespace": "default"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                "subjects": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "sa", "namespace": "default"}]}),
            ),
        ] {
            let rt = reg.lookup("rbac.authorization.k8s.io", "v1", res).unwrap();
            st.create(rt, "default", obj, &opts).unwrap();
        }
        let cm = reg.lookup("", "v1", "configmaps").unwrap();
        let object =
            json!({"metadata": {"name": "x", "namespace": "default"}, "data": {"s": "db"}});
        let check = |who: &str, expr: &str, fail: bool| {
            let u = user(who);
            let req = request(cm, Operation::Create, "", Some(&object), &u);
            let policy = json!({"validations": [{"expression": expr}]});
            evaluate(&st, &req, &policy, Arc::new(Snapshot::of(&st)), fail)
                .into_iter()
                .map(|v| v.message)
                .collect::<Vec<_>>()
        };
        let secret = |name: &str| {
            format!(
                "authorizer.group('').resource('secrets').namespace('default').name('{name}').check('get').allowed()"
            )
        };
        assert!(check("alice", &secret("db"), true).is_empty());
        assert_eq!(
            check("alice", &secret("other"), true),
            [format!("failed expression: {}", secret("other"))]
        );
        assert!(!check("bob", &secret("db"), true).is_empty());
        assert!(check("root", "authorizer.group('').resource('pods').subresource('log').namespace('default').check('get').allowed() == false", true).is_empty());
        assert!(check("alice", "authorizer.group('').resource('pods').subresource('log').namespace('default').check('get').allowed()", true).is_empty());
        assert!(check("alice", "authorizer.group('').resource('pods').namespace('default').check('get').allowed() == false", true).is_empty());
        assert!(check("bob", "authorizer.serviceAccount('default', 'sa').group('').resource('secrets').namespace('default').name(object.data.s).check('get').allowed()", true).is_empty());
        assert!(
            check(
                "alice",
                "authorizer.path('/healthz').check('get').allowed()",
                true
            )
            .is_empty()
        );
        assert!(
            check(
                "alice",
                &format!(
                    "{}.reason() != ''",
                    secret("db").trim_end_matches(".allowed()")
                ),
                true
            )
            .is_empty()
        );
        assert!(
            check(
                "alice",
                &format!("!{}.errored()", secret("db").trim_end_matches(".allowed()")),
                true
            )
            .is_empty()
        );
        // An expression that errs: a violation under Fail, nothing under Ignore.
        let erring = "object.data.missing == 'x'";
        let failed = check("alice", erring, true);
        assert!(
            failed[0].starts_with("expression 'object.data.missing == 'x'' resulted in error"),
            "{failed:?}"
        );
        assert!(check("alice", erring, false).is_empty());
    }
}
