//! Label selectors (equality- and set-based) and field selectors, as in list/watch queries.

use serde_json::Value;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` query parameter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses (`a in (x,y),b`).
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

fn set_values(s: &str) -> Result<Vec<String>, ApiError> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: expected '(' ... ')' in {s:?}"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            if let Some(k) = p.strip_prefix('!') {
                reqs.push(Requirement::NotExists(k.trim().into()));
            } else if let Some((k, v)) = p.split_once("!=") {
                reqs.push(Requirement::NotEq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = p.split_once("==") {
                reqs.push(Requirement::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = p.split_once('=') {
                reqs.push(Requirement::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = p.split_once(" notin ") {
                reqs.push(Requirement::NotIn(k.trim().into(), set_values(v)?));
            } else if let Some((k, v)) = p.split_once(" in ") {
                reqs.push(Requirement::In(k.trim().into(), set_values(v)?));
            } else if p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                reqs.push(Requirement::Exists(p.into()));
            } else {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: {p:?}"
                )));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj["metadata"]["labels"].as_object();
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(|v| v.as_str());
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `path=value` / `path!=value` terms, ANDed.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses and checks the fields against what the resource supports (as the apiserver does:
    /// an unsupported field is a 400, not an empty result).
    pub fn parse(s: &str, resource: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, neg, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            let k = k.trim();
            let supported = matches!(k, "metadata.name" | "metadata.namespace")
                || (resource == "events"
                    && (k.starts_with("involvedObject.")
                        || k.starts_with("regarding.")
                        || matches!(k, "reason" | "type" | "source" | "reportingController")))
                || (resource == "secrets" && k == "type")
                || (resource == "namespaces" && k == "status.phase");
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            terms.push((k.to_string(), neg, v.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, neg, want)| {
            // events.k8s.io's `regarding` is stored as core's `involvedObject`.
            let path = path
                .strip_prefix("regarding.")
                .map(|p| format!("involvedObject.{p}"))
                .unwrap_or(path.clone());
            let path = if path == "source" {
                "source.component".to_string()
            } else {
                path
            };
            let mut cur = obj;
            for seg in path.split('.') {
                cur = &cur[seg];
            }
            let got = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (got == *want) != *neg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_table() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,api)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing", false),
            ("!missing", true),
            ("app in (api),tier", false),
            ("app=web,tier in (front, back)", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&obj),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn field_selector_events() {
        let ev = json!({"metadata": {"name": "e", "namespace": "default"}, "involvedObject": {"name": "w", "kind": "Widget", "uid": "u1"}});
        let sel = FieldSelector::parse(
            "involvedObject.name=w,involvedObject.kind=Widget,metadata.namespace=default",
            "events",
        )
        .unwrap();
        assert!(sel.matches(&ev));
        assert!(
            !FieldSelector::parse("involvedObject.uid=u2", "events")
                .unwrap()
                .matches(&ev)
        );
        assert!(
            FieldSelector::parse("regarding.name=w", "events")
                .unwrap()
                .matches(&ev)
        );
        assert!(FieldSelector::parse("spec.x=1", "widgets").is_err());
    }
}
