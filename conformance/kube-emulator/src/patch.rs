//! The four PATCH flavours: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge
//! patch (the subset kubectl produces for built-in kinds), and server-side apply.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// RFC 7386 merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// RFC 6902 JSON patch, `test` included; a failed `test` or a bad path is a 422 as on the apiserver.
///
/// As on the apiserver, a `test` for `null` passes when the path is absent (kube-runtime's
/// `finalizer` helper relies on this to add the first finalizer).
pub fn json(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let mut ops = patch
        .as_array()
        .cloned()
        .ok_or_else(|| ApiError::bad_request("a JSON patch must be an array of operations"))?;
    for op in &ops {
        if op["op"] == "test" && op["value"].is_null() {
            let path = op["path"].as_str().unwrap_or_default();
            if !target.pointer(path).is_none_or(Value::is_null) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "the server rejected our request due to an error in our request: test failed: {path} is not null"
                    ),
                ));
            }
        }
    }
    ops.retain(|op| !(op["op"] == "test" && op["value"].is_null()));
    let p: json_patch::Patch = serde_json::from_value(Value::Array(ops))
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    json_patch::patch(target, &p).map_err(|e| {
        ApiError::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {e}"),
        )
    })
}

/// The merge key of a list field in the built-in kinds (what `patchMergeKey` declares upstream).
fn merge_key(field: &str, sample: &Value) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "ports" if sample.get("containerPort").is_some() => Some("containerPort"),
        "ports" => Some("port"),
        _ => None,
    }
}

/// Lists of scalars that strategic merge unions instead of replacing.
fn is_primitive_merge_list(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge patch for built-in kinds: keyed lists merge by their merge key, `$patch`
/// (`replace`/`delete`), `$retainKeys`, `$deleteFromPrimitiveList/…` and `$setElementOrder/…`
/// (ordering hint, ignored) directives are honoured.
pub fn strategic(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = p.clone();
        p.remove("$patch");
        *target = Value::Object(p);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("just made an object");
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(list), Some(del)) =
                (t.get_mut(field).and_then(Value::as_array_mut), v.as_array())
            {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(_) => {
                if v.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                } else {
                    strategic(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
            Value::Array(items) => {
                let sample = items
                    .iter()
                    .find(|x| x.is_object())
                    .cloned()
                    .unwrap_or(Value::Null);
                if let Some(key) = merge_key(k, &sample).filter(|_| sample.is_object()) {
                    let list = t.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                    if !list.is_array() {
                        *list = Value::Array(vec![]);
                    }
                    let list = list.as_array_mut().expect("array");
                    for item in items {
                        let id = item.get(key).cloned().unwrap_or(Value::Null);
                        let pos = list.iter().position(|x| x.get(key) == Some(&id));
                        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                        match (pos, delete) {
                            (Some(i), true) => {
                                list.remove(i);
                            }
                            (None, true) => {}
                            (Some(i), false) => strategic(&mut list[i], item),
                            (None, false) => {
                                let mut fresh = Value::Null;
                                strategic(&mut fresh, item);
                                list.push(fresh);
                            }
                        }
                    }
                } else if is_primitive_merge_list(k) {
                    let list = t.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                    if let Some(list) = list.as_array_mut() {
                        for item in items {
                            if !list.contains(item) {
                                list.push(item.clone());
                            }
                        }
                    }
                } else {
                    t.insert(k.clone(), v.clone());
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        t.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
}

/// A field path used for server-side apply ownership, e.g. `["spec", "replicas"]`.
pub type FieldPath = Vec<String>;

/// Leaf paths of an applied configuration. Maps are walked; lists are atomic (owned whole),
/// as for CRD lists without `x-kubernetes-list-type: map`.
pub fn leaf_paths(v: &Value) -> Vec<FieldPath> {
    fn walk(v: &Value, cur: &mut FieldPath, out: &mut Vec<FieldPath>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    cur.push(k.clone());
                    walk(x, cur, out);
                    cur.pop();
                }
            }
            _ => out.push(cur.clone()),
        }
    }
    let mut out = Vec::new();
    let mut cur = Vec::new();
    if let Some(m) = v.as_object() {
        for (k, x) in m {
            // Identity fields are not "owned": every applier sends them.
            if k == "apiVersion" || k == "kind" {
                continue;
            }
            if k == "metadata" {
                for mk in ["labels", "annotations"] {
                    if let Some(sub) = x.get(mk) {
                        cur.extend(["metadata".to_string(), mk.to_string()]);
                        walk(sub, &mut cur, &mut out);
                        cur.clear();
                    }
                }
                continue;
            }
            cur.push(k.clone());
            walk(x, &mut cur, &mut out);
            cur.pop();
        }
    }
    out
}

pub fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = cur.as_object()?.get(seg)?;
    }
    Some(cur)
}

pub fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for seg in parents {
        match cur.as_object_mut().and_then(|m| m.get_mut(seg)) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

/// Paths to the `fieldsV1` form of `managedFields` (`{"f:spec":{"f:replicas":{}}}`).
pub fn paths_to_fields_v1(paths: &[FieldPath]) -> Value {
    let mut root = Value::Object(Map::new());
    for p in paths {
        let mut cur = &mut root;
        for seg in p {
            cur = cur
                .as_object_mut()
                .expect("object")
                .entry(format!("f:{seg}"))
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
    root
}

/// The inverse of [`paths_to_fields_v1`].
pub fn fields_v1_to_paths(v: &Value) -> Vec<FieldPath> {
    fn walk(v: &Value, cur: &mut FieldPath, out: &mut Vec<FieldPath>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, x) in m {
                    let Some(seg) = k.strip_prefix("f:") else {
                        continue;
                    };
                    cur.push(seg.to_string());
                    walk(x, cur, out);
                    cur.pop();
                }
            }
            _ => {
                if !cur.is_empty() {
                    out.push(cur.clone())
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// Merges an applied configuration into the live object: maps merge recursively, everything
/// else (scalars, lists) is replaced by the applied value.
pub fn apply_merge(live: &mut Value, applied: &Value) {
    match (live.as_object_mut(), applied.as_object()) {
        (Some(l), Some(a)) => {
            for (k, v) in a {
                if v.is_object() && l.get(k).is_some_and(Value::is_object) {
                    apply_merge(l.get_mut(k).expect("present"), v);
                } else {
                    l.insert(k.clone(), v.clone());
                }
            }
        }
        _ => *live = applied.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_keyed_lists_and_directives() {
        let mut t = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}], "selector": {"app": "a"}},
                           "metadata": {"finalizers": ["a"]}});
        strategic(
            &mut t,
            &json!({
                "spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "$patch": "delete"}, {"port": 9000}],
                         "$setElementOrder/ports": [{"port": 80}], "selector": {"app": null, "tier": "x"}},
                "metadata": {"finalizers": ["b"]}
            }),
        );
        assert_eq!(
            t,
            json!({"spec": {"ports": [{"port": 80, "name": "http", "targetPort": 8080}, {"port": 9000}], "selector": {"tier": "x"}},
                             "metadata": {"finalizers": ["a", "b"]}})
        );
    }

    #[test]
    fn fields_v1_round_trip() {
        let paths = leaf_paths(
            &json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "n", "labels": {"a": "b"}}, "spec": {"x": 1, "y": {"z": [1]}}}),
        );
        let mut back = fields_v1_to_paths(&paths_to_fields_v1(&paths));
        back.sort();
        let mut want = paths.clone();
        want.sort();
        assert_eq!(back, want);
        assert!(want.contains(&vec!["spec".into(), "y".into(), "z".into()]));
        assert!(want.contains(&vec!["metadata".into(), "labels".into(), "a".into()]));
    }

    #[test]
    fn json_patch_test_op_fails_with_422() {
        let mut v = json!({"spec": {"x": 1}});
        let err = json(&mut v, &json!([{"op": "test", "path": "/spec/x", "value": 2}, {"op": "replace", "path": "/spec/x", "value": 3}])).unwrap_err();
        assert_eq!(err.code, 422);
        json(&mut v, &json!([{"op": "test", "path": "/spec/x", "value": 1}, {"op": "replace", "path": "/spec/x", "value": 3}])).unwrap();
        assert_eq!(v, json!({"spec": {"x": 3}}));
    }
}
