//! What the emulator serves: built-in kinds plus the kinds of the stored CRDs.

use serde_json::Value;

/// A printer column (`additionalPrinterColumns`) used to answer `Table` requests.
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// How a resource is handled beyond plain storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// Stored like everything else.
    None,
    /// `tokenreviews`: create-only, answered from the token table, never stored.
    TokenReview,
    /// `subjectaccessreviews`: create-only, answered by the RBAC evaluator, never stored.
    SubjectAccessReview,
    /// `selfsubjectaccessreviews`: like SubjectAccessReview, for the caller.
    SelfSubjectAccessReview,
    /// `selfsubjectreviews`: who the caller is (`kubectl auth whoami`).
    SelfSubjectReview,
    /// `selfsubjectrulesreviews`: what the caller may do in a namespace (`kubectl auth can-i --list`).
    SelfSubjectRulesReview,
}

/// One served resource (group, version, plural name) and its behaviour.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource: the main resource ignores `.status` and vice versa.
    pub status_subresource: bool,
    /// `metadata.generation` is maintained (bumped on spec changes).
    pub has_generation: bool,
    /// Storage key: two resource types sharing it see the same objects (core and events.k8s.io events).
    pub storage: String,
    pub special: Special,
    /// Accepts `strategic-merge-patch+json` (built-in kinds only, as on a real apiserver).
    pub strategic: bool,
    pub printer_columns: Vec<PrinterColumn>,
    /// The CRD's `openAPIV3Schema` for this version.
    pub schema: Option<Value>,
    /// Served by a CRD (drives validation, openapi, and discovery categories).
    pub crd: bool,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    /// `widgets.example.com` or `configmaps`: how error messages name a resource.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
    /// `Widget.example.com`: how validation errors name a kind.
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
    pub fn verbs(&self) -> Vec<&'static str> {
        match self.special {
            Special::None => vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ],
            _ => vec!["create"],
        }
    }
    pub fn subresources(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.status_subresource {
            v.push("status");
        }
        if self.group.is_empty() && self.resource == "serviceaccounts" {
            v.push("token");
        }
        v
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    resource: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
    generation: bool,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        version: version.into(),
        resource: resource.into(),
        kind: kind.into(),
        singular: kind.to_lowercase(),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: Vec::new(),
        status_subresource: status,
        has_generation: generation,
        storage: format!("{group}/{resource}"),
        special: Special::None,
        strategic: true,
        printer_columns: Vec::new(),
        schema: None,
        crd: false,
    }
}

/// The built-in kinds the issue asks for (and a few kubectl touches).
pub fn builtins() -> Vec<ResourceType> {
    let rbac = "rbac.authorization.k8s.io";
    let mut v = vec![
        builtin(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            true,
            false,
        ),
        builtin("", "v1", "services", "Service", true, &["svc"], true, false),
        builtin("", "v1", "secrets", "Secret", true, &[], false, false),
        builtin(
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            false,
            false,
        ),
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
            false,
        ),
        builtin("", "v1", "events", "Event", true, &["ev"], false, false),
        builtin(
            "",
            "v1",
            "endpoints",
            "Endpoints",
            true,
            &["ep"],
            false,
            false,
        ),
        builtin("", "v1", "pods", "Pod", true, &["po"], true, false),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            false,
            false,
        ),
        builtin(
            "networking.k8s.io",
            "v1",
            "ingresses",
            "Ingress",
            true,
            &["ing"],
            true,
            true,
        ),
        builtin(
            "networking.k8s.io",
            "v1",
            "ingressclasses",
            "IngressClass",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "daemonsets",
            "DaemonSet",
            true,
            &["ds"],
            true,
            true,
        ),
        builtin(
            "storage.k8s.io",
            "v1",
            "csidrivers",
            "CSIDriver",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            &["pdb"],
            true,
            true,
        ),
        builtin(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy",
            false,
            &[],
            true,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            false,
            &[],
            false,
            true,
        ),
        builtin(rbac, "v1", "roles", "Role", true, &[], false, false),
        builtin(
            rbac,
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            rbac,
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            rbac,
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            false,
            false,
        ),
    ];
    for r in v
        .iter_mut()
        .filter(|r| matches!(r.resource.as_str(), "services" | "pods" | "deployments"))
    {
        r.categories = vec!["all".into()];
    }
    // Both event APIs read and write one storage, so `kubectl describe` (core v1) shows what
    // kube-rs's `Recorder` (events.k8s.io/v1) published.
    for r in v.iter_mut().filter(|r| r.resource == "events") {
        r.storage = "/events".into();
    }
    for (group, resource, kind, special) in [
        (
            "authentication.k8s.io",
            "tokenreviews",
            "TokenReview",
            Special::TokenReview,
        ),
        (
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
            Special::SubjectAccessReview,
        ),
        (
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
            Special::SelfSubjectAccessReview,
        ),
        (
            "authentication.k8s.io",
            "selfsubjectreviews",
            "SelfSubjectReview",
            Special::SelfSubjectReview,
        ),
        (
            "authorization.k8s.io",
            "selfsubjectrulesreviews",
            "SelfSubjectRulesReview",
            Special::SelfSubjectRulesReview,
        ),
    ] {
        let mut r = builtin(group, "v1", resource, kind, false, &[], false, false);
        r.special = special;
        v.push(r);
    }
    v
}

/// The resource types a CRD object declares (one per served version).
pub fn from_crd(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default();
    let kind = names["kind"].as_str().unwrap_or_default();
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let mut out = Vec::new();
    for ver in spec["versions"].as_array().into_iter().flatten() {
        if ver["served"].as_bool() == Some(false) {
            continue;
        }
        let printer_columns = match ver["additionalPrinterColumns"].as_array() {
            Some(cols) => cols
                .iter()
                .map(|c| PrinterColumn {
                    name: c["name"].as_str().unwrap_or_default().into(),
                    type_: c["type"].as_str().unwrap_or("string").into(),
                    format: c["format"].as_str().unwrap_or_default().into(),
                    description: c["description"].as_str().unwrap_or_default().into(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                    json_path: c["jsonPath"].as_str().unwrap_or_default().into(),
                })
                .collect(),
            // A CRD without printer columns shows Age, like the apiserver's default.
            None => vec![PrinterColumn {
                name: "Age".into(),
                type_: "date".into(),
                format: String::new(),
                description: String::new(),
                priority: 0,
                json_path: ".metadata.creationTimestamp".into(),
            }],
        };
        out.push(ResourceType {
            group: group.into(),
            version: ver["name"].as_str().unwrap_or_default().into(),
            resource: plural.into(),
            kind: kind.into(),
            singular: names["singular"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| kind.to_lowercase()),
            namespaced,
            short_names: strs(&names["shortNames"]),
            categories: strs(&names["categories"]),
            status_subresource: ver["subresources"].get("status").is_some(),
            has_generation: true,
            storage: format!("{group}/{plural}"),
            special: Special::None,
            strategic: false,
            printer_columns,
            schema: ver["schema"].get("openAPIV3Schema").cloned(),
            crd: true,
        });
    }
    out
}

/// All served resource types, rebuilt whenever a CRD changes.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub types: Vec<ResourceType>,
}

impl Registry {
    pub fn new<'a>(crds: impl Iterator<Item = &'a Value>) -> Self {
        let mut types = builtins();
        for crd in crds {
            for t in from_crd(crd) {
                if !types.iter().any(|x| {
                    x.group == t.group && x.version == t.version && x.resource == t.resource
                }) {
                    types.push(t);
                }
            }
        }
        Registry { types }
    }
    pub fn lookup(&self, group: &str, version: &str, resource: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.resource == resource)
    }
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.api_version() == api_version && t.kind == kind)
    }
    /// Groups in discovery order (core first, then by first appearance), each with its versions.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for t in &self.types {
            match out.iter_mut().find(|(g, _)| *g == t.group) {
                Some((_, vs)) => {
                    if !vs.contains(&t.version) {
                        vs.push(t.version.clone())
                    }
                }
                None => out.push((t.group.clone(), vec![t.version.clone()])),
            }
        }
        out
    }
    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<&ResourceType> {
        self.types
            .iter()
            .filter(|t| t.group == group && t.version == version)
            .collect()
    }
}
