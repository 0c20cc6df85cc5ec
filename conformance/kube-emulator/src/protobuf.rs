//! Just enough of the Kubernetes protobuf encoding to read the request bodies kubectl's typed
//! clients send (`kubectl create namespace|configmap|secret|serviceaccount`, `create token`,
//! `auth can-i [--list]`, `auth whoami`). Each body is the `k8s\0` magic and a `runtime.Unknown`
//! envelope whose `raw` bytes are the typed object; the field numbers below are those of the
//! upstream `generated.proto` files. Fields not listed are skipped.

use base64::Engine;
use serde_json::{Map, Value, json};

#[derive(Clone, Copy)]
enum Field {
    Str(&'static str),
    Int(&'static str),
    Bool(&'static str),
    RepStr(&'static str),
    MapStr(&'static str),
    /// `map<string, bytes>`, base64 in JSON.
    MapBytes(&'static str),
    Msg(&'static str, &'static [(u64, Field)]),
    RepMsg(&'static str, &'static [(u64, Field)]),
}

use Field::*;

const OWNER_REF: &[(u64, Field)] = &[
    (5, Str("apiVersion")),
    (1, Str("kind")),
    (3, Str("name")),
    (4, Str("uid")),
    (6, Bool("controller")),
    (7, Bool("blockOwnerDeletion")),
];
const OBJECT_META: &[(u64, Field)] = &[
    (1, Str("name")),
    (2, Str("generateName")),
    (3, Str("namespace")),
    (5, Str("uid")),
    (6, Str("resourceVersion")),
    (7, Int("generation")),
    (11, MapStr("labels")),
    (12, MapStr("annotations")),
    (13, RepMsg("ownerReferences", OWNER_REF)),
    (14, RepStr("finalizers")),
];
const NAMESPACE: &[(u64, Field)] = &[(1, Msg("metadata", OBJECT_META))];
const CONFIG_MAP: &[(u64, Field)] = &[
    (1, Msg("metadata", OBJECT_META)),
    (2, MapStr("data")),
    (3, MapBytes("binaryData")),
    (4, Bool("immutable")),
];
const SECRET: &[(u64, Field)] = &[
    (1, Msg("metadata", OBJECT_META)),
    (2, MapBytes("data")),
    (3, Str("type")),
    (4, MapStr("stringData")),
    (5, Bool("immutable")),
];
const SERVICE_ACCOUNT: &[(u64, Field)] = &[
    (1, Msg("metadata", OBJECT_META)),
    (4, Bool("automountServiceAccountToken")),
];
const RESOURCE_ATTRIBUTES: &[(u64, Field)] = &[
    (1, Str("namespace")),
    (2, Str("verb")),
    (3, Str("group")),
    (4, Str("version")),
    (5, Str("resource")),
    (6, Str("subresource")),
    (7, Str("name")),
];
const NON_RESOURCE_ATTRIBUTES: &[(u64, Field)] = &[(1, Str("path")), (2, Str("verb"))];
const SSAR: &[(u64, Field)] = &[
    (1, Msg("metadata", OBJECT_META)),
    (
        2,
        Msg(
            "spec",
            &[
                (1, Msg("resourceAttributes", RESOURCE_ATTRIBUTES)),
                (2, Msg("nonResourceAttributes", NON_RESOURCE_ATTRIBUTES)),
            ],
        ),
    ),
];
const BOUND_OBJECT_REF: &[(u64, Field)] = &[
    (1, Str("kind")),
    (2, Str("apiVersion")),
    (3, Str("name")),
    (4, Str("uid")),
];
const TOKEN_REQUEST: &[(u64, Field)] = &[
    (1, Msg("metadata", OBJECT_META)),
    (
        2,
        Msg(
            "spec",
            &[
                (1, RepStr("audiences")),
                (4, Int("expirationSeconds")),
                (3, Msg("boundObjectRef", BOUND_OBJECT_REF)),
            ],
        ),
    ),
];
const SSRR: &[(u64, Field)] = &[
    (1, Msg("metadata", OBJECT_META)),
    (2, Msg("spec", &[(1, Str("namespace"))])),
];
const METADATA_ONLY: &[(u64, Field)] = &[(1, Msg("metadata", OBJECT_META))];

/// One decoded field: its number and raw value.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

fn fields(buf: &[u8]) -> Option<Vec<(u64, Wire<'_>)>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let wire = match key & 7 {
            0 => Wire::Varint(varint(buf, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let b = buf.get(pos..pos.checked_add(len)?)?;
                pos += len;
                Wire::Bytes(b)
            }
            1 => {
                pos += 8;
                Wire::Varint(0)
            }
            5 => {
                pos += 4;
                Wire::Varint(0)
            }
            _ => return None,
        };
        out.push((key >> 3, wire));
    }
    (pos == buf.len()).then_some(out)
}

fn text(b: &[u8]) -> Option<Value> {
    std::str::from_utf8(b).ok().map(|s| json!(s))
}

fn decode_message(buf: &[u8], schema: &[(u64, Field)]) -> Option<Value> {
    let mut obj = Map::new();
    for (num, wire) in fields(buf)? {
        let Some((_, field)) = schema.iter().find(|(n, _)| *n == num) else {
            continue;
        };
        match (*field, wire) {
            (Str(name), Wire::Bytes(b)) => {
                obj.insert(name.into(), text(b)?);
            }
            (Int(name), Wire::Varint(v)) => {
                obj.insert(name.into(), json!(v as i64));
            }
            (Bool(name), Wire::Varint(v)) => {
                obj.insert(name.into(), json!(v != 0));
            }
            (RepStr(name), Wire::Bytes(b)) => {
                let list = obj.entry(name).or_insert_with(|| json!([]));
                list.as_array_mut()?.push(text(b)?);
            }
            (MapStr(name) | MapBytes(name), Wire::Bytes(b)) => {
                let (mut k, mut v) = (String::new(), Value::Null);
                for (n, w) in fields(b)? {
                    match (n, w) {
                        (1, Wire::Bytes(x)) => k = std::str::from_utf8(x).ok()?.to_string(),
                        (2, Wire::Bytes(x)) if matches!(field, MapBytes(_)) => {
                            v = json!(base64::engine::general_purpose::STANDARD.encode(x))
                        }
                        (2, Wire::Bytes(x)) => v = text(x)?,
                        _ => {}
                    }
                }
                if v.is_null() {
                    v = json!("");
                }
                obj.entry(name)
                    .or_insert_with(|| json!({}))
                    .as_object_mut()?
                    .insert(k, v);
            }
            (Msg(name, sub), Wire::Bytes(b)) => {
                obj.insert(name.into(), decode_message(b, sub)?);
            }
            (RepMsg(name, sub), Wire::Bytes(b)) => {
                let item = decode_message(b, sub)?;
                obj.entry(name)
                    .or_insert_with(|| json!([]))
                    .as_array_mut()?
                    .push(item);
            }
            _ => return None,
        }
    }
    Some(Value::Object(obj))
}

/// Decodes a protobuf request body into the JSON object it stands for, when its kind is one
/// kubectl's typed clients send. `None` when the body is not understood.
pub fn decode(body: &[u8]) -> Option<Value> {
    let envelope = body.strip_prefix(b"k8s\0")?;
    let mut type_meta = (String::new(), String::new());
    let mut raw: &[u8] = &[];
    for (num, wire) in fields(envelope)? {
        match (num, wire) {
            (1, Wire::Bytes(tm)) => {
                for (n, w) in fields(tm)? {
                    if let (1 | 2, Wire::Bytes(x)) = (n, w) {
                        let s = std::str::from_utf8(x).ok()?.to_string();
                        if n == 1 {
                            type_meta.0 = s
                        } else {
                            type_meta.1 = s
                        }
                    }
                }
            }
            (2, Wire::Bytes(r)) => raw = r,
            _ => {}
        }
    }
    let (api_version, kind) = type_meta;
    let schema = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview" | "SubjectAccessReview") => SSAR,
        ("authentication.k8s.io/v1", "TokenRequest") => TOKEN_REQUEST,
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => SSRR,
        ("authentication.k8s.io/v1", "SelfSubjectReview") => METADATA_ONLY,
        _ => return None,
    };
    let mut obj = decode_message(raw, schema)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Some(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_field(num: u64, b: &[u8]) -> Vec<u8> {
        let mut out = vec![(num << 3 | 2) as u8, b.len() as u8];
        out.extend_from_slice(b);
        out
    }

    #[test]
    fn decodes_a_configmap_envelope() {
        let meta = [
            bytes_field(1, b"cfg"),
            bytes_field(
                11,
                &[bytes_field(1, b"app"), bytes_field(2, b"web")].concat(),
            ),
        ]
        .concat();
        let raw = [
            bytes_field(1, &meta),
            bytes_field(2, &[bytes_field(1, b"a"), bytes_field(2, b"1")].concat()),
        ]
        .concat();
        let tm = [bytes_field(1, b"v1"), bytes_field(2, b"ConfigMap")].concat();
        let body = [b"k8s\0".to_vec(), bytes_field(1, &tm), bytes_field(2, &raw)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "labels": {"app": "web"}}, "data": {"a": "1"}})
        );
        assert!(decode(b"k8s\0\x0a").is_none());
        assert!(decode(b"{}").is_none());
    }
}
