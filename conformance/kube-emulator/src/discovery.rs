//! Discovery documents (legacy and aggregated) and the OpenAPI v3 documents kubectl needs for
//! `explain` and for server-side field validation during `apply`.

use std::hash::{Hash, Hasher};

use serde_json::{Value, json};

use crate::registry::{Registry, ResourceType};

/// `Content-Type` of an aggregated discovery answer.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

fn scope(t: &ResourceType) -> &'static str {
    if t.namespaced {
        "Namespaced"
    } else {
        "Cluster"
    }
}

fn token_request_kind() -> Value {
    json!({"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"})
}

/// `GET /api/v1`, `GET /apis/<g>/<v>`: an `APIResourceList`.
pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = reg.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in types {
        let mut r = json!({"name": t.resource, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind, "verbs": t.verbs()});
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        for s in t.subresources() {
            let mut sr = json!({"name": format!("{}/{s}", t.resource), "singularName": "", "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"]});
            if s == "token" {
                sr = json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]});
            }
            resources.push(sr);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
}

/// `GET /apis`: an `APIGroupList`.
pub fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_doc(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<g>`: an `APIGroup`.
pub fn group(reg: &Registry, name: &str) -> Option<Value> {
    reg.groups()
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())
        .map(|(g, vs)| {
            let mut d = group_doc(&g, &vs);
            d["kind"] = json!("APIGroup");
            d["apiVersion"] = json!("v1");
            d
        })
}

/// `GET /api` or `/apis` with an aggregated-discovery `Accept`: an `APIGroupDiscoveryList`.
pub fn aggregated(reg: &Registry, legacy: bool) -> Value {
    let items: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _)| g.is_empty() == legacy)
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = reg
                        .in_group_version(&g, v)
                        .into_iter()
                        .map(|t| {
                            let kind = json!({"group": t.group, "version": t.version, "kind": t.kind});
                            let subs: Vec<Value> = t
                                .subresources()
                                .into_iter()
                                .map(|s| {
                                    if s == "token" {
                                        json!({"subresource": "token", "responseKind": token_request_kind(), "verbs": ["create"]})
                                    } else {
                                        json!({"subresource": s, "responseKind": kind, "verbs": ["get", "patch", "update"]})
                                    }
                                })
                                .collect();
                            let mut r = json!({"resource": t.resource, "responseKind": kind, "scope": scope(t), "singularResource": t.singular, "verbs": t.verbs()});
                            if !t.short_names.is_empty() {
                                r["shortNames"] = json!(t.short_names);
                            }
                            if !t.categories.is_empty() {
                                r["categories"] = json!(t.categories);
                            }
                            if !subs.is_empty() {
                                r["subresources"] = json!(subs);
                            }
                            r
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

fn schema_name(t: &ResourceType) -> String {
    if t.group.is_empty() {
        return format!("io.k8s.api.core.v1.{}", t.kind);
    }
    let rev: Vec<&str> = t.group.split('.').rev().collect();
    format!("{}.{}.{}", rev.join("."), t.version, t.kind)
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

fn object_meta_schema() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    json!({
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "type": "object",
        "properties": {
            "name": s("Name must be unique within a namespace."),
            "generateName": s("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
            "namespace": s("Namespace defines the space within which each name must be unique."),
            "uid": s("UID is the unique in time and space value for this object."),
            "resourceVersion": s("An opaque value that represents the internal version of this object."),
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
            "creationTimestamp": s("CreationTimestamp is a timestamp representing the server time when this object was created."),
            "deletionTimestamp": s("DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted."),
            "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Map of string keys and values that can be used to organize and categorize objects."},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Annotations is an unstructured key value map stored with a resource."},
            "finalizers": {"type": "array", "items": {"type": "string"}, "description": "Must be empty before the object is deleted from the registry."},
            "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "List of objects depended by this object."},
            "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow."}
        }
    })
}

fn kind_schema(t: &ResourceType) -> Value {
    let mut s = match &t.schema {
        Some(s) => s.clone(),
        None => {
            json!({"type": "object", "description": format!("{} (built-in kind; kube-emulator does not describe its fields)", t.kind), "x-kubernetes-preserve-unknown-fields": true})
        }
    };
    if !s["properties"].is_object() {
        s["properties"] = json!({});
    }
    s["properties"]["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
    s["properties"]["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
    s["properties"]["metadata"] = json!({"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}], "description": "Standard object's metadata."});
    s["x-kubernetes-group-version-kind"] =
        json!([{"group": t.group, "version": t.version, "kind": t.kind}]);
    s
}

fn operation(t: &ResourceType, action: &str, extra_params: &[&str]) -> Value {
    let mut params: Vec<Value> = vec![
        json!({"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}}),
    ];
    for p in extra_params {
        params.push(
            json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}),
        );
    }
    let reference = json!({"$ref": format!("#/components/schemas/{}", schema_name(t))});
    json!({
        "operationId": format!("{action}{}", t.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": t.group, "version": t.version, "kind": t.kind},
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}},
    })
}

/// The OpenAPI v3 document of one group-version (`/openapi/v3/api/v1`, `/openapi/v3/apis/<g>/<v>`).
pub fn openapi_group_version(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let types: Vec<&ResourceType> = reg
        .in_group_version(group, version)
        .into_iter()
        .filter(|t| t.special == crate::registry::Special::None)
        .collect();
    if types.is_empty() && reg.in_group_version(group, version).is_empty() {
        return None;
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    schemas.insert(OBJECT_META.into(), object_meta_schema());
    for t in types {
        let base = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", t.resource)
        } else {
            format!("{prefix}/{}", t.resource)
        };
        let write = ["fieldManager", "fieldValidation"];
        let mut patch = operation(t, "patch", &["fieldManager", "fieldValidation", "force"]);
        patch["requestBody"] = json!({"content": {
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
            "application/apply-patch+yaml": {"schema": {"type": "object"}}}});
        paths.insert(
            base.clone(),
            json!({"get": operation(t, "list", &[]), "post": operation(t, "post", &write)}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": operation(t, "get", &[]), "put": operation(t, "put", &write), "patch": patch, "delete": operation(t, "delete", &[])}),
        );
        if t.status_subresource {
            let mut sp = operation(t, "patch", &["fieldManager", "fieldValidation", "force"]);
            sp["requestBody"] = json!({"content": {"application/merge-patch+json": {"schema": {"type": "object"}}}});
            paths.insert(format!("{base}/{{name}}/status"), json!({"get": operation(t, "get", &[]), "put": operation(t, "put", &write), "patch": sp}));
        }
        schemas.insert(schema_name(t), kind_schema(t));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// A content hash for the `?hash=` of an OpenAPI v3 document (changes when a CRD changes).
pub fn hash(doc: &Value) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    doc.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `GET /openapi/v3`: the index of per-group-version documents.
pub fn openapi_index(reg: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, vs) in reg.groups() {
        for v in vs {
            let key = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            if let Some(doc) = openapi_group_version(reg, &g, &v) {
                paths.insert(
                    key.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", hash(&doc))}),
                );
            }
        }
    }
    json!({"paths": paths})
}
