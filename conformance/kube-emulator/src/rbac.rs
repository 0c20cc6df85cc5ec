//! RBAC authorization: Role/ClusterRole rules bound by (Cluster)RoleBindings decide every request.
//! Aggregated ClusterRoles (`aggregationRule`) are expanded when a request is authorized.

use serde_json::Value;

use std::collections::HashMap;

use crate::selector::LabelSelector;
use crate::store::{Identity, State};

/// Where RBAC reads Roles, ClusterRoles and their bindings from: the live
/// store, or a [`Snapshot`] of it (for admission policies' `authorizer`,
/// whose CEL functions must own what they read).
pub trait RbacObjects {
    /// The object of RBAC resource `resource` (`roles`, `clusterroles`, …).
    fn object(&self, resource: &str, ns: &str, name: &str) -> Option<&Value>;
    /// Every object of `resource` (in `ns` when given).
    fn objects(&self, resource: &str, ns: Option<&str>) -> Vec<&Value>;
}

fn storage(resource: &str) -> String {
    format!("rbac.authorization.k8s.io/{resource}")
}

impl RbacObjects for State {
    fn object(&self, resource: &str, ns: &str, name: &str) -> Option<&Value> {
        self.get_opt(&storage(resource), ns, name)
    }
    fn objects(&self, resource: &str, ns: Option<&str>) -> Vec<&Value> {
        self.list_storage(&storage(resource))
            .filter(|o| {
                ns.is_none_or(|n| o["metadata"]["namespace"].as_str().unwrap_or_default() == n)
            })
            .collect()
    }
}

/// A copy of the RBAC objects of a store at one moment.
#[derive(Debug, Default)]
pub struct Snapshot(HashMap<&'static str, Vec<Value>>);

impl Snapshot {
    pub fn of(state: &State) -> Self {
        Snapshot(
            [
                "roles",
                "clusterroles",
                "rolebindings",
                "clusterrolebindings",
            ]
            .into_iter()
            .map(|r| (r, state.objects(r, None).into_iter().cloned().collect()))
            .collect(),
        )
    }
}

impl RbacObjects for Snapshot {
    fn object(&self, resource: &str, ns: &str, name: &str) -> Option<&Value> {
        self.0.get(resource)?.iter().find(|o| {
            o["metadata"]["name"].as_str() == Some(name)
                && o["metadata"]["namespace"].as_str().unwrap_or_default() == ns
        })
    }
    fn objects(&self, resource: &str, ns: Option<&str>) -> Vec<&Value> {
        self.0
            .get(resource)
            .into_iter()
            .flatten()
            .filter(|o| {
                ns.is_none_or(|n| o["metadata"]["namespace"].as_str().unwrap_or_default() == n)
            })
            .collect()
    }
}

/// What a request wants to do, in RBAC terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    /// `None` for non-resource requests (then `path` is used).
    pub resource: Option<ResourceAttributes>,
    pub path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl Attributes {
    /// The apiserver's denial message, naming the missing permission.
    pub fn denial(&self, user: &str) -> String {
        match &self.resource {
            Some(r) => {
                let res = if r.subresource.is_empty() {
                    r.resource.clone()
                } else {
                    format!("{}/{}", r.resource, r.subresource)
                };
                let gr = if r.group.is_empty() {
                    r.resource.clone()
                } else {
                    format!("{}.{}", r.resource, r.group)
                };
                let subject = if r.name.is_empty() {
                    gr
                } else {
                    format!("{gr} \"{}\"", r.name)
                };
                let scope = if r.namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace \"{}\"", r.namespace)
                };
                format!(
                    "{subject} is forbidden: User \"{user}\" cannot {} resource \"{res}\" in API group \"{}\" {scope}",
                    self.verb, r.group
                )
            }
            None => format!(
                "forbidden: User \"{user}\" cannot {} path \"{}\"",
                self.verb, self.path
            ),
        }
    }
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn subject_matches(subject: &Value, binding_ns: &str, user: &Identity) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str().unwrap_or_default() {
        "User" => name == user.username,
        "Group" => user.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = subject["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            user.service_account
                .as_ref()
                .is_some_and(|(sns, sname)| sns == ns && sname == name)
        }
        _ => false,
    }
}

fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    let verbs = strs(&rule["verbs"]);
    if !verbs.iter().any(|v| *v == "*" || *v == attrs.verb) {
        return false;
    }
    match &attrs.resource {
        Some(r) => {
            let groups = strs(&rule["apiGroups"]);
            if !groups.iter().any(|g| *g == "*" || *g == r.group) {
                return false;
            }
            let full = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            let resources = strs(&rule["resources"]);
            let res_ok = resources.iter().any(|x| {
                *x == "*"
                    || *x == full
                    || (!r.subresource.is_empty() && *x == format!("*/{}", r.subresource))
            });
            if !res_ok {
                return false;
            }
            let names = strs(&rule["resourceNames"]);
            names.is_empty() || (!r.name.is_empty() && names.contains(&r.name.as_str()))
        }
        None => strs(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == "*"
                || *u == attrs.path
                || u.strip_suffix('*')
                    .is_some_and(|p| attrs.path.starts_with(p))
        }),
    }
}

/// Paths any authenticated user may read (the `system:discovery` / `system:public-info-viewer` roles).
fn public_path(path: &str) -> bool {
    path == "/version"
        || path == "/api"
        || path == "/apis"
        || path.starts_with("/api/")
        || path.starts_with("/apis/")
        || path.starts_with("/openapi/")
        || matches!(path, "/healthz" | "/livez" | "/readyz")
}

/// Whether `user` may do `attrs`. Admins (group `system:masters`) bypass RBAC.
pub fn allowed(state: &State, user: &Identity, attrs: &Attributes) -> bool {
    allowed_in(state, user, attrs)
}

/// [`allowed`], reading RBAC objects from `state`.
pub fn allowed_in(state: &dyn RbacObjects, user: &Identity, attrs: &Attributes) -> bool {
    if user.is_admin() {
        return true;
    }
    let authenticated = user.groups.iter().any(|g| g == "system:authenticated");
    if attrs.resource.is_none() && attrs.verb == "get" && public_path(&attrs.path) && authenticated
    {
        return true;
    }
    // The `system:basic-user` role: anyone may ask what they themselves may do.
    if let Some(r) = &attrs.resource
        && authenticated
        && attrs.verb == "create"
        && matches!(
            (r.group.as_str(), r.resource.as_str()),
            (
                "authorization.k8s.io",
                "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
            ) | ("authentication.k8s.io", "selfsubjectreviews")
        )
    {
        return true;
    }
    let namespace = attrs
        .resource
        .as_ref()
        .map(|r| r.namespace.as_str())
        .unwrap_or_default();
    let (cluster, namespaced) = rules_in(state, user, namespace);
    cluster.iter().any(|r| rule_allows(r, attrs))
        || (attrs.resource.is_some() && namespaced.iter().any(|r| rule_allows(r, attrs)))
}

/// The rules bound to `user`: cluster-wide (ClusterRoleBindings) and, when `namespace` is not
/// empty, those RoleBindings grant in it. Also answers SelfSubjectRulesReview.
pub fn rules_for(state: &State, user: &Identity, namespace: &str) -> (Vec<Value>, Vec<Value>) {
    rules_in(state, user, namespace)
}

fn rules_in(state: &dyn RbacObjects, user: &Identity, namespace: &str) -> (Vec<Value>, Vec<Value>) {
    let rules_of = |kind: &str, name: &str, ns: &str| -> Vec<Value> {
        let (t, n) = if kind == "ClusterRole" {
            ("clusterroles", "")
        } else {
            ("roles", ns)
        };
        let Some(r) = state.object(t, n, name) else {
            return Vec::new();
        };
        let mut rules = r["rules"].as_array().cloned().unwrap_or_default();
        // An aggregated ClusterRole has the rules of every ClusterRole its selectors match.
        for sel in r["aggregationRule"]["clusterRoleSelectors"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let selector = label_selector_of(sel);
            for other in state.objects("clusterroles", None) {
                if other["metadata"]["name"] != r["metadata"]["name"] && selector.matches(other) {
                    rules.extend(other["rules"].as_array().cloned().unwrap_or_default());
                }
            }
        }
        rules
    };
    let mut cluster = Vec::new();
    for b in state.objects("clusterrolebindings", None) {
        if strs_obj(&b["subjects"])
            .iter()
            .any(|s| subject_matches(s, "", user))
        {
            cluster.extend(rules_of(
                "ClusterRole",
                b["roleRef"]["name"].as_str().unwrap_or_default(),
                "",
            ));
        }
    }
    let mut namespaced = Vec::new();
    if !namespace.is_empty() {
        for b in state.objects("rolebindings", Some(namespace)) {
            if strs_obj(&b["subjects"])
                .iter()
                .any(|s| subject_matches(s, namespace, user))
            {
                let kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
                namespaced.extend(rules_of(
                    kind,
                    b["roleRef"]["name"].as_str().unwrap_or_default(),
                    namespace,
                ));
            }
        }
    }
    (cluster, namespaced)
}

/// A `metav1.LabelSelector` object as a parsed selector.
pub fn label_selector_of(sel: &Value) -> LabelSelector {
    let mut terms: Vec<String> = sel["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values = strs(&e["values"]).join(",");
        terms.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        });
    }
    // A selector that fails to parse matches nothing.
    LabelSelector::parse(&terms.join(","))
        .unwrap_or_else(|_| LabelSelector::parse("kube-emulator/never-matches").expect("valid"))
}

fn strs_obj(v: &Value) -> Vec<&Value> {
    v.as_array().map(|a| a.iter().collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource: Some(ResourceAttributes {
                group: group.into(),
                resource: resource.into(),
                subresource: sub.into(),
                namespace: "ns".into(),
                name: name.into(),
            }),
            path: String::new(),
        }
    }

    #[test]
    fn rule_matching_table() {
        let rule = json!({"apiGroups": ["k8s.tuna.am"], "resources": ["tunnels", "tunnels/status"], "verbs": ["get", "patch"]});
        let named = json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["token"], "verbs": ["get"]});
        for (r, a, want) in [
            (&rule, attrs("get", "k8s.tuna.am", "tunnels", "", "x"), true),
            (
                &rule,
                attrs("patch", "k8s.tuna.am", "tunnels", "status", "x"),
                true,
            ),
            (
                &rule,
                attrs("delete", "k8s.tuna.am", "tunnels", "", "x"),
                false,
            ),
            (&rule, attrs("get", "", "tunnels", "", "x"), false),
            (
                &rule,
                attrs("get", "k8s.tuna.am", "tunnels", "finalizers", "x"),
                false,
            ),
            (&named, attrs("get", "", "secrets", "", "token"), true),
            (&named, attrs("get", "", "secrets", "", "other"), false),
            (&named, attrs("get", "", "secrets", "", ""), false),
        ] {
            assert_eq!(rule_allows(r, &a), want, "{r} {a:?}");
        }
        let nr = json!({"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]});
        let path = |p: &str| Attributes {
            verb: "get".into(),
            resource: None,
            path: p.into(),
        };
        assert!(rule_allows(&nr, &path("/metrics")));
        assert!(rule_allows(&nr, &path("/debug/pprof")));
        assert!(!rule_allows(&nr, &path("/healthz")));
    }

    #[test]
    fn denial_names_the_permission() {
        let a = attrs("get", "", "secrets", "", "s1");
        assert_eq!(
            a.denial("system:serviceaccount:ns:sa"),
            "secrets \"s1\" is forbidden: User \"system:serviceaccount:ns:sa\" cannot get resource \"secrets\" in API group \"\" in the namespace \"ns\""
        );
    }
}
