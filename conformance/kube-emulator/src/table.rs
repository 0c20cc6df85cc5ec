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

fn columns(rt: &ResourceType) -> Vec<PrinterColumn> {
    let name = PrinterColumn {
        name: "Name".into(),
        type_: "string".into(),
        format: "name".into(),
        description: "Name must be unique within a namespace.".into(),
        priority: 0,
        json_path: ".metadata.name".into(),
    };
    let age = PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    };
    let mut cols = vec![name];
    if rt.crd {
        cols.extend(rt.printer_columns.iter().cloned());
    } else {
        if rt.group.is_empty() && rt.resource == "namespaces" {
            cols.push(PrinterColumn {
                name: "Status".into(),
                type_: "string".into(),
                format: String::new(),
                description: "The phase of the namespace.".into(),
                priority: 0,
                json_path: ".status.phase".into(),
            });
        }
        cols.push(age);
    }
    cols
}

fn cell(col: &PrinterColumn, obj: &Value) -> Value {
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
