//! Validation of custom resources against their CRD's `openAPIV3Schema`, in the apiserver's
//! order: prune unknown fields (or reject them under `fieldValidation=Strict`), apply defaults,
//! validate the structural constraints, then run the CEL `x-kubernetes-validations` rules
//! (with `oldSelf` on updates) through `kube-cel`.

use serde_json::Value;

use crate::error::FieldError;

/// How unknown fields are treated (`fieldValidation` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            _ => FieldValidation::Warn,
        }
    }
}

/// The outcome of admitting a custom resource.
#[derive(Debug, Default)]
pub struct Admission {
    /// Unknown fields that were dropped (Strict turns them into an error).
    pub unknown_fields: Vec<String>,
    pub errors: Vec<FieldError>,
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn preserves(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

/// Drops fields the schema does not declare (and nulls of non-nullable fields), recording them.
fn prune(schema: &Value, v: &mut Value, path: &str, root: bool, unknown: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let props = schema["properties"].as_object();
            let additional = schema.get("additionalProperties");
            let embedded = schema["x-kubernetes-embedded-resource"].as_bool() == Some(true);
            let keep_unknown =
                preserves(schema) || additional.is_some_and(|a| a.as_bool() == Some(true));
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let p = join(path, &k);
                if (root || embedded) && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let sub = props
                    .and_then(|p| p.get(&k))
                    .or_else(|| additional.filter(|a| a.is_object()));
                match sub {
                    Some(s) => {
                        let child = m.get_mut(&k).expect("key exists");
                        if child.is_null() && s["nullable"].as_bool() != Some(true) {
                            m.remove(&k);
                            continue;
                        }
                        prune(s, child, &p, false, unknown);
                    }
                    None if keep_unknown => {}
                    None => {
                        unknown.push(p);
                        m.remove(&k);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, it) in items.iter_mut().enumerate() {
                    prune(s, it, &format!("{path}[{i}]"), false, unknown);
                }
            }
        }
        _ => {}
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Structural checks: types, required, enum, pattern, bounds, lengths, nullable, junctors.
fn check(schema: &Value, v: &Value, path: &str, root: bool, errs: &mut Vec<FieldError>) {
    let shown = if path.is_empty() {
        "<root>".to_string()
    } else {
        path.to_string()
    };
    if v.is_null() {
        if schema["nullable"].as_bool() != Some(true) && schema.get("type").is_some() && !root {
            errs.push(FieldError::invalid(
                &shown,
                v,
                format!(
                    "{shown} in body must be of type {}",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if let Some(t) = schema["type"].as_str() {
        let got = type_name(v);
        let ok = got == t
            || (t == "number" && got == "integer")
            || (int_or_string && matches!(got, "integer" | "string"));
        if !ok {
            errs.push(FieldError::invalid(
                &shown,
                v,
                format!("{shown} in body must be of type {t}: \"{got}\""),
            ));
            return;
        }
    } else if int_or_string && !matches!(type_name(v), "integer" | "string") {
        errs.push(FieldError::invalid(
            &shown,
            v,
            format!("{shown} in body must be of type integer or string"),
        ));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(v)
    {
        errs.push(FieldError::unsupported(&shown, v, allowed));
    }
    match v {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = schema["maxLength"].as_u64().filter(|m| len > *m) {
                errs.push(FieldError::invalid(
                    &shown,
                    v,
                    format!("{shown} in body should be at most {max} chars long"),
                ));
            }
            if let Some(min) = schema["minLength"].as_u64().filter(|m| len < *m) {
                errs.push(FieldError::invalid(
                    &shown,
                    v,
                    format!("{shown} in body should be at least {min} chars long"),
                ));
            }
            if let Some(p) = schema["pattern"].as_str() {
                match regex::Regex::new(p) {
                    Ok(re) if !re.is_match(s) => errs.push(FieldError::invalid(
                        &shown,
                        v,
                        format!("{shown} in body should match '{p}'"),
                    )),
                    Ok(_) => {}
                    Err(e) => errs.push(FieldError::invalid(
                        &shown,
                        v,
                        format!("invalid pattern {p:?} in schema: {e}"),
                    )),
                }
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(max) = schema["maximum"].as_f64() {
                let excl = schema["exclusiveMaximum"].as_bool() == Some(true);
                if x > max || (excl && x == max) {
                    let rel = if excl {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        &shown,
                        v,
                        format!("{shown} in body should be {rel} {}", schema["maximum"]),
                    ));
                }
            }
            if let Some(min) = schema["minimum"].as_f64() {
                let excl = schema["exclusiveMinimum"].as_bool() == Some(true);
                if x < min || (excl && x == min) {
                    let rel = if excl {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        &shown,
                        v,
                        format!("{shown} in body should be {rel} {}", schema["minimum"]),
                    ));
                }
            }
        }
        Value::Array(items) => {
            let len = items.len() as u64;
            if let Some(max) = schema["maxItems"].as_u64().filter(|m| len > *m) {
                errs.push(FieldError {
                    field: shown.clone(),
                    reason: "FieldValueTooMany",
                    message: format!("Too many: {len}: must have at most {max} items"),
                });
            }
            if let Some(min) = schema["minItems"].as_u64().filter(|m| len < *m) {
                errs.push(FieldError::invalid(
                    &shown,
                    v,
                    format!("{shown} in body should have at least {min} items"),
                ));
            }
            if let Some(s) = schema.get("items") {
                for (i, it) in items.iter().enumerate() {
                    check(s, it, &format!("{path}[{i}]"), false, errs);
                }
            }
        }
        Value::Object(m) => {
            for r in schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !m.contains_key(r) {
                    errs.push(FieldError::required(join(path, r)));
                }
            }
            let len = m.len() as u64;
            if let Some(max) = schema["maxProperties"].as_u64().filter(|x| len > *x) {
                errs.push(FieldError::invalid(
                    &shown,
                    v,
                    format!("{shown} in body should have at most {max} properties"),
                ));
            }
            if let Some(min) = schema["minProperties"].as_u64().filter(|x| len < *x) {
                errs.push(FieldError::invalid(
                    &shown,
                    v,
                    format!("{shown} in body should have at least {min} properties"),
                ));
            }
            let props = schema["properties"].as_object();
            for (k, x) in m {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(s) = props
                    .and_then(|p| p.get(k))
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
                {
                    check(s, x, &join(path, k), false, errs);
                }
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
    if let Some(all) = schema["allOf"].as_array() {
        for s in all {
            check(s, v, path, root, errs);
        }
    }
    let passes = |s: &Value| {
        let mut e = Vec::new();
        check(s, v, path, root, &mut e);
        e.is_empty()
    };
    if let Some(any) = schema["anyOf"].as_array()
        && !any.iter().any(passes)
    {
        errs.push(FieldError::invalid(
            &shown,
            v,
            format!("{shown} in body must match at least one schema (anyOf)"),
        ));
    }
    if let Some(one) = schema["oneOf"].as_array()
        && one.iter().filter(|s| passes(s)).count() != 1
    {
        errs.push(FieldError::invalid(
            &shown,
            v,
            format!("{shown} in body must match exactly one schema (oneOf)"),
        ));
    }
    if let Some(not) = schema.get("not")
        && passes(not)
    {
        errs.push(FieldError::invalid(
            &shown,
            v,
            format!("{shown} in body must not match the schema (not)"),
        ));
    }
}

/// Admits `obj` (in place: pruned and defaulted) against `schema`; `old` enables transition rules.
pub fn admit(
    schema: &Value,
    obj: &mut Value,
    old: Option<&Value>,
    validator: &kube_cel::Validator,
) -> Admission {
    let mut out = Admission::default();
    prune(schema, obj, "", true, &mut out.unknown_fields);
    *obj = kube_cel::apply_defaults(schema, obj);
    check(schema, obj, "", true, &mut out.errors);
    if out.errors.is_empty()
        && let Err(errs) = validator.validate(schema, obj, old)
    {
        for e in errs.into_vec() {
            let field = if e.field_path.is_empty() {
                "<root>".to_string()
            } else {
                e.field_path.clone()
            };
            let value = crate::patch::get_path(
                obj,
                &e.field_path
                    .split('.')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect::<Vec<_>>(),
            )
            .cloned()
            .unwrap_or(Value::String("object".into()));
            let value = if value.is_object() || value.is_array() {
                Value::String("object".into())
            } else {
                value
            };
            out.errors
                .push(FieldError::invalid(field, &value, e.message));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
        "spec": {"type": "object", "required": ["size"],
            "x-kubernetes-validations": [{"rule": "self.size != 'xl' || self.replicas <= 2", "message": "xl widgets are limited to 2 replicas"}],
            "properties": {
                "size": {"type": "string", "enum": ["s", "m", "xl"]},
                "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                "note": {"type": "string", "nullable": true},
                "color": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "color is immutable"}]},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }}}})
    }

    fn run(obj: Value, old: Option<Value>) -> (Value, Admission) {
        let mut obj = obj;
        let a = admit(
            &schema(),
            &mut obj,
            old.as_ref(),
            &kube_cel::Validator::new(),
        );
        (obj, a)
    }

    #[test]
    fn table() {
        let base = json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a"}});
        let with = |spec: Value| {
            let mut o = base.clone();
            o["spec"] = spec;
            o
        };
        // (spec, expected error substrings)
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (json!({"size": "s"}), vec![]),
            (json!({}), vec!["spec.size: Required value"]),
            (json!({"size": "q"}), vec!["Unsupported value: \"q\""]),
            (
                json!({"size": "s", "replicas": 11}),
                vec!["less than or equal to 10"],
            ),
            (
                json!({"size": "s", "replicas": "3"}),
                vec!["must be of type integer"],
            ),
            (json!({"size": "s", "name": "ABC"}), vec!["should match"]),
            (
                json!({"size": "s", "name": "abcdef"}),
                vec!["at most 5 chars"],
            ),
            (
                json!({"size": "xl", "replicas": 3}),
                vec!["xl widgets are limited to 2 replicas"],
            ),
            (
                json!({"size": "s", "note": null, "extra": {"any": {"thing": 1}}}),
                vec![],
            ),
        ];
        for (spec, want) in cases {
            let (_, a) = run(with(spec.clone()), None);
            let msgs: Vec<String> = a.errors.iter().map(|e| e.to_string()).collect();
            assert_eq!(msgs.len(), want.len(), "{spec}: {msgs:?}");
            for (m, w) in msgs.iter().zip(&want) {
                assert!(m.contains(w), "{spec}: {m} lacks {w}");
            }
        }
    }

    #[test]
    fn defaults_pruning_and_transition_rules() {
        let (obj, a) = run(
            json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a"}, "spec": {"size": "s", "bogus": 1, "color": "red"}}),
            None,
        );
        assert_eq!(a.unknown_fields, vec!["spec.bogus".to_string()]);
        assert_eq!(obj["spec"]["replicas"], 1);
        assert!(obj["spec"].get("bogus").is_none());
        let (_, a) = run(
            json!({"metadata": {}, "spec": {"size": "s", "color": "blue"}}),
            Some(obj.clone()),
        );
        assert_eq!(a.errors.len(), 1, "{:?}", a.errors);
        assert!(a.errors[0].to_string().contains("color is immutable"));
        let (_, a) = run(
            json!({"metadata": {}, "spec": {"size": "s", "color": "red", "replicas": 4}}),
            Some(obj),
        );
        assert!(a.errors.is_empty(), "{:?}", a.errors);
    }
}
