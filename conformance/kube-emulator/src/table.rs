//! `meta.k8s.io/v1` `Table` answers (what `kubectl get` prints), with CRD printer columns
//! evaluated by a small JSONPath subset: `.a.b`, `[n]`, `[*]`, `[?(@.k=="v")]`.

use serde_json::{Value, json};

use crate::registry::{PrinterColumn, ResourceType};

/// Evaluates a printer-column JSONPath against an object.
pub fn jsonpath(obj: &Value, path: &str) -> Vec<Value> {
    let mut cur = vec![obj.clone()];
    let mut rest = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            cur = cur.iter().filter_map(|v| v.get(key).cloned()).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return vec![];
            };
            // A filter may contain ']' inside quotes only in odd cases; kubectl's columns do not.
            let inner = &r[..end];
            rest = &r[end + 1..];
            if inner == "*" {
                cur = cur
                    .iter()
                    .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                    .collect();
            } else if let Ok(i) = inner.parse::<usize>() {
                cur = cur.iter().filter_map(|v| v.get(i).cloned()).collect();
            } else if let Some(f) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')')) {
                let Some((lhs, rhs)) = f.split_once("==") else {
                    return vec![];
                };
                let field = lhs.trim().trim_start_matches('@');
                let want = rhs.trim().trim_matches(|c| c == '"' || c == '\'');
                cur = cur
                    .iter()
                    .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                    .filter(|item| {
                        jsonpath(item, field).first().map(|x| match x {
                            Value::String(s) => s == want,
                            other => *other == want,
                        }) == Some(true)
                    })
                    .collect();
            } else {
                let key = inner.trim_matches(|c| c == '"' || c == '\'');
                cur = cur.iter().filter_map(|v| v.get(key).cloned()).collect();
            }
        } else {
            return vec![];
        }
    }
    cur
}

/// kubectl's `HumanDuration`: how ages are printed.
pub fn human_age(created: &str) -> String {
    let Ok(ts) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = jiff::Timestamp::now().as_second() - ts.as_second();
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let (m, h) = (s / 60, s / 3600);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{}h", h / 24, h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else {
        format!("{}y", h / (24 * 365))
    }
}

fn col(name: &str, type_: &str, priority: i64, json_path: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: if name == "Name" {
            "name".into()
        } else {
            String::new()
        },
        description: String::new(),
        priority,
        json_path: json_path.into(),
    }
}

/// Columns of built-in kinds, like the apiserver's (paths starting with `@` are computed).
fn builtin_columns(rt: &ResourceType) -> Vec<PrinterColumn> {
    let name = col("Name", "string", 0, ".metadata.name");
    let age = col("Age", "date", 0, ".metadata.creationTimestamp");
    let mut cols = match (rt.group.as_str(), rt.resource.as_str()) {
        (_, "events") => vec![
            col("Last Seen", "string", 0, "@event-last-seen"),
            col("Type", "string", 0, ".type"),
            col("Reason", "string", 0, ".reason"),
            col("Object", "string", 0, "@event-object"),
            col("Source", "string", 1, "@event-source"),
            col("Message", "string", 0, ".message"),
            col("Count", "integer", 1, "@event-count"),
            col("Name", "string", 1, ".metadata.name"),
        ],
        ("", "namespaces") => vec![name, col("Status", "string", 0, ".status.phase"), age],
        ("", "services") => vec![
            name,
            col("Type", "string", 0, ".spec.type"),
            col("Cluster-IP", "string", 0, ".spec.clusterIP"),
            col("External-IP", "string", 0, "@lb-address"),
            col("Port(s)", "string", 0, "@service-ports"),
            age,
            col("Selector", "string", 1, "@selector"),
        ],
        ("", "secrets") => vec![
            name,
            col("Type", "string", 0, ".type"),
            col("Data", "integer", 0, "@data-count"),
            age,
        ],
        ("", "configmaps") => vec![name, col("Data", "integer", 0, "@data-count"), age],
        ("networking.k8s.io", "ingresses") => vec![
            name,
            col("Class", "string", 0, "@ingress-class"),
            col("Hosts", "string", 0, "@ingress-hosts"),
            col("Address", "string", 0, "@lb-address"),
            col("Ports", "string", 0, "@ingress-ports"),
            age,
        ],
        ("networking.k8s.io", "ingressclasses") => vec![
            name,
            col("Controller", "string", 0, ".spec.controller"),
            age,
        ],
        ("coordination.k8s.io", "leases") => vec![
            name,
            col("Holder", "string", 0, ".spec.holderIdentity"),
            age,
        ],
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            vec![name, col("Created At", "string", 0, "@created-at")]
        }
        ("admissionregistration.k8s.io", "validatingadmissionpolicies") => vec![
            name,
            col("Validations", "integer", 0, "@validations-count"),
            col("ParamKind", "string", 0, "@param-kind"),
            age,
        ],
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings") => vec![
            name,
            col("PolicyName", "string", 0, ".spec.policyName"),
            col("ParamRef", "string", 0, "@param-ref"),
            age,
        ],
        _ => vec![name, age],
    };
    for c in &mut cols {
        if c.name == "Name" {
            c.description = "Name must be unique within a namespace.".into();
        }
    }
    cols
}

fn columns(rt: &ResourceType) -> Vec<PrinterColumn> {
    if rt.crd {
        let mut cols = vec![col("Name", "string", 0, ".metadata.name")];
        cols[0].description = "Name must be unique within a namespace.".into();
        cols.extend(rt.printer_columns.iter().cloned());
        cols
    } else {
        builtin_columns(rt)
    }
}

fn none_if_empty(s: String) -> Value {
    if s.is_empty() {
        json!("<none>")
    } else {
        json!(s)
    }
}

/// Computed cells of built-in kinds.
fn computed(key: &str, o: &Value) -> Value {
    match key {
        "@validations-count" => json!(o["spec"]["validations"].as_array().map_or(0, Vec::len)),
        "@param-kind" => match o["spec"]["paramKind"]["kind"].as_str() {
            Some(k) => json!(format!(
                "{}/{k}",
                o["spec"]["paramKind"]["apiVersion"]
                    .as_str()
                    .unwrap_or_default()
            )),
            None => json!("<unset>"),
        },
        "@param-ref" => match o["spec"]["paramRef"]["name"].as_str() {
            Some(n) => json!(n),
            None => json!("<unset>"),
        },
        "@data-count" => {
            let n = |k: &str| o[k].as_object().map(|m| m.len()).unwrap_or(0);
            json!(n("data") + n("binaryData"))
        }
        "@lb-address" => none_if_empty(
            o["status"]["loadBalancer"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                .collect::<Vec<_>>()
                .join(","),
        ),
        "@service-ports" => none_if_empty(
            o["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let node = p["nodePort"]
                        .as_i64()
                        .map(|n| format!(":{n}"))
                        .unwrap_or_default();
                    format!(
                        "{}{node}/{}",
                        p["port"],
                        p["protocol"].as_str().unwrap_or("TCP")
                    )
                })
                .collect::<Vec<_>>()
                .join(","),
        ),
        "@selector" => none_if_empty(
            o["spec"]["selector"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default(),
        ),
        "@ingress-class" => none_if_empty(
            o["spec"]["ingressClassName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ),
        "@ingress-hosts" => {
            let hosts: Vec<String> = o["spec"]["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r["host"].as_str().unwrap_or("*").to_string())
                .collect();
            json!(if hosts.is_empty() {
                "*".to_string()
            } else {
                hosts.join(",")
            })
        }
        "@ingress-ports" => json!(
            if o["spec"]["tls"].as_array().is_some_and(|t| !t.is_empty()) {
                "80, 443"
            } else {
                "80"
            }
        ),
        "@created-at" => o["metadata"]["creationTimestamp"].clone(),
        "@event-object" => {
            let io = &o["involvedObject"];
            json!(format!(
                "{}/{}",
                io["kind"].as_str().unwrap_or_default().to_lowercase(),
                io["name"].as_str().unwrap_or_default()
            ))
        }
        "@event-source" => none_if_empty(
            o["source"]["component"]
                .as_str()
                .or(o["reportingComponent"].as_str())
                .unwrap_or_default()
                .to_string(),
        ),
        "@event-count" => json!(
            o["series"]["count"]
                .as_i64()
                .or(o["count"].as_i64())
                .unwrap_or(1)
        ),
        "@event-last-seen" => {
            let t = o["series"]["lastObservedTime"]
                .as_str()
                .or(o["lastTimestamp"].as_str())
                .or(o["eventTime"].as_str())
                .or(o["metadata"]["creationTimestamp"].as_str());
            json!(t.map(human_age).unwrap_or_else(|| "<unknown>".into()))
        }
        _ => Value::Null,
    }
}

fn cell(col: &PrinterColumn, obj: &Value) -> Value {
    if col.json_path.starts_with('@') {
        return computed(&col.json_path, obj);
    }
    let vals = jsonpath(obj, &col.json_path);
    if vals.is_empty() {
        return Value::Null;
    }
    if col.type_ == "date" {
        return json!(vals[0].as_str().map(human_age).unwrap_or_default());
    }
    if vals.len() == 1 {
        return match (&vals[0], col.type_.as_str()) {
            (Value::String(s), _) => json!(s),
            (v @ (Value::Number(_) | Value::Bool(_)), _) => v.clone(),
            (v, _) => json!(v.to_string()),
        };
    }
    json!(
        vals.iter()
            .map(|v| v
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| v.to_string()))
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// A Table of `objects` (client form). `include_object` is the `includeObject` query parameter.
pub fn table(
    rt: &ResourceType,
    objects: &[Value],
    resource_version: &str,
    include_object: Option<&str>,
    with_columns: bool,
) -> Value {
    let cols = columns(rt);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let object = match include_object {
                Some("None") => Value::Null,
                Some("Object") => o.clone(),
                _ => json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}),
            };
            json!({"cells": cols.iter().map(|c| cell(c, o)).collect::<Vec<_>>(), "object": object})
        })
        .collect();
    let mut t = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version}, "rows": rows});
    if with_columns {
        t["columnDefinitions"] = json!(cols
            .iter()
            .map(|c| json!({"name": c.name, "type": if c.type_ == "date" { "string" } else { c.type_.as_str() }, "format": c.format, "description": c.description, "priority": c.priority}))
            .collect::<Vec<_>>());
    } else {
        t["columnDefinitions"] = json!([]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_table() {
        let obj = json!({"spec": {"size": "m", "ports": [{"port": 80}, {"port": 443}]},
            "status": {"conditions": [{"type": "Progressing", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        for (path, want) in [
            (".spec.size", vec![json!("m")]),
            (".spec.ports[1].port", vec![json!(443)]),
            (".spec.ports[*].port", vec![json!(80), json!(443)]),
            (
                ".status.conditions[?(@.type==\"Ready\")].status",
                vec![json!("True")],
            ),
            (".status.missing", vec![]),
        ] {
            assert_eq!(jsonpath(&obj, path), want, "{path}");
        }
    }

    #[test]
    fn builtin_columns_table() {
        let reg = crate::registry::Registry::new(std::iter::empty());
        let svc = reg.lookup("", "v1", "services").unwrap();
        let obj = json!({"metadata": {"name": "s", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.2", "ports": [{"port": 80, "protocol": "TCP"}, {"port": 443, "protocol": "TCP", "nodePort": 30443}]}});
        let t = table(svc, &[obj], "1", None, true);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec![
                "Name",
                "Type",
                "Cluster-IP",
                "External-IP",
                "Port(s)",
                "Age",
                "Selector"
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"].as_array().unwrap()[..5],
            [
                json!("s"),
                json!("ClusterIP"),
                json!("10.96.0.2"),
                json!("<none>"),
                json!("80/TCP,443:30443/TCP")
            ]
        );
        let cm = reg.lookup("", "v1", "configmaps").unwrap();
        let t = table(
            cm,
            &[json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})],
            "1",
            None,
            true,
        );
        assert_eq!(t["rows"][0]["cells"][1], json!(2));
    }

    #[test]
    fn ages_like_kubectl() {
        let ago = |s: i64| {
            jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() - s)
                .unwrap()
                .to_string()
        };
        assert_eq!(human_age(&ago(5)), "5s");
        assert_eq!(human_age(&ago(190)), "3m10s");
        assert_eq!(human_age(&ago(3600 * 3 + 60)), "3h1m");
        assert_eq!(human_age(&ago(86400 * 3)), "3d");
    }
}
