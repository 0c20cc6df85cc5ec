//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), as client-go's typed
//! clients send them (`kubectl create role|rolebinding|deployment|…`, `create token`,
//! `auth can-i`, Helm's release Secrets and their `DeleteOptions`), decoded into the JSON
//! object they stand for.
//!
//! A body is the `k8s\0` magic and a `runtime.Unknown` envelope (`typeMeta` = apiVersion and
//! kind, `raw` = the typed message). Every message is described by `protobuf_schema.txt`:
//! field numbers, wire types, JSON names and the Go structs' inlined members, generated
//! from the `k8s-pb` and `k8s-openapi` sources (see `tests/protobuf_schema.rs`). The types
//! with their own JSON form are converted as the apiserver marshals them: `Time`,
//! `MicroTime`, `Duration`, `Quantity`, `IntOrString`, `RawExtension`, `FieldsV1`, the
//! apiextensions `JSON` and `JSONSchemaPropsOr*`, and the one-field list wrappers
//! (`Verbs`, `ExtraValue`).
//!
//! Go's protobuf encoder writes every non-pointer field, set or not; its JSON encoder
//! omits most of them (`omitempty`). So empty strings and zero timestamps are left out, as
//! the JSON of the same object would leave them out; other zeros (`replicas: 0`) are kept.

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::Engine;
use serde_json::{Map, Value, json};

/// The generated description of every built-in message.
const SCHEMA: &str = include_str!("protobuf_schema.txt");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Card {
    One,
    Many,
    Map,
    /// A Go struct member whose fields appear in the parent's JSON.
    Inline,
}

#[derive(Debug)]
struct FieldDesc {
    json: &'static str,
    card: Card,
    /// `string`, `bytes`, `bool`, `int32`, `int64`, `double`, or `msg:<message>`.
    ty: &'static str,
}

struct Schema {
    messages: HashMap<&'static str, HashMap<u64, FieldDesc>>,
    kinds: HashMap<(&'static str, &'static str), &'static str>,
}

fn schema() -> &'static Schema {
    static PARSED: OnceLock<Schema> = OnceLock::new();
    PARSED.get_or_init(|| {
        let mut messages: HashMap<&'static str, HashMap<u64, FieldDesc>> = HashMap::new();
        let mut kinds = HashMap::new();
        let mut current: Option<&'static str> = None;
        for line in SCHEMA.lines().filter(|l| !l.starts_with('#')) {
            let parts: Vec<&'static str> = line.split(' ').collect();
            match parts.as_slice() {
                ["kind", version, kind, message] => {
                    kinds.insert((*version, *kind), *message);
                }
                ["message", name] => {
                    messages.entry(name).or_default();
                    current = Some(name);
                }
                [tag, json, card, ty] => {
                    let card = match *card {
                        "one" => Card::One,
                        "many" => Card::Many,
                        "map" => Card::Map,
                        _ => Card::Inline,
                    };
                    if let (Some(m), Ok(tag)) = (current, tag.parse()) {
                        messages
                            .entry(m)
                            .or_default()
                            .insert(tag, FieldDesc { json, card, ty });
                    }
                }
                _ => {}
            }
        }
        Schema { messages, kinds }
    })
}

/// One decoded field value.
#[derive(Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
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
            1 => {
                let b = buf.get(pos..pos.checked_add(8)?)?;
                pos += 8;
                Wire::Fixed64(u64::from_le_bytes(b.try_into().ok()?))
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let b = buf.get(pos..pos.checked_add(len)?)?;
                pos += len;
                Wire::Bytes(b)
            }
            5 => {
                let b = buf.get(pos..pos.checked_add(4)?)?;
                pos += 4;
                Wire::Fixed32(u32::from_le_bytes(b.try_into().ok()?))
            }
            _ => return None,
        };
        out.push((key >> 3, wire));
    }
    (pos == buf.len()).then_some(out)
}

fn text(b: &[u8]) -> Option<String> {
    std::str::from_utf8(b).ok().map(str::to_owned)
}

/// A scalar of type `ty` (one element of a packed list too).
fn scalar(ty: &str, wire: Wire<'_>) -> Option<Value> {
    Some(match (ty, wire) {
        ("string", Wire::Bytes(b)) => json!(text(b)?),
        ("bytes", Wire::Bytes(b)) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
        ("bool", Wire::Varint(v)) => json!(v != 0),
        ("int32", Wire::Varint(v)) => json!(v as i64 as i32),
        ("int64", Wire::Varint(v)) => json!(v as i64),
        ("double", Wire::Fixed64(v)) => json!(f64::from_bits(v)),
        ("float", Wire::Fixed32(v)) => json!(f32::from_bits(v)),
        _ => return None,
    })
}

/// The elements of a repeated scalar field: one value, or a packed run.
fn repeated_scalars(ty: &str, wire: Wire<'_>) -> Option<Vec<Value>> {
    match (ty, wire) {
        ("int32" | "int64" | "bool", Wire::Bytes(b)) => {
            let mut pos = 0;
            let mut out = Vec::new();
            while pos < b.len() {
                out.push(scalar(ty, Wire::Varint(varint(b, &mut pos)?))?);
            }
            Some(out)
        }
        ("double", Wire::Bytes(b)) => b
            .chunks(8)
            .map(|c| scalar(ty, Wire::Fixed64(u64::from_le_bytes(c.try_into().ok()?))))
            .collect(),
        _ => Some(vec![scalar(ty, wire)?]),
    }
}

/// RFC 3339 in UTC, as Go's `metav1.Time` (seconds) and `MicroTime` (microseconds) marshal.
fn timestamp(seconds: i64, nanos: i64, micro: bool) -> Option<Value> {
    let t = jiff::Timestamp::new(seconds, nanos as i32).ok()?;
    let utc = t.to_zoned(jiff::tz::TimeZone::UTC);
    Some(json!(if micro {
        utc.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
    } else {
        utc.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }))
}

/// Go's `time.Duration.String()` (`1h2m3.5s`, `150ms`, `0s`), as `metav1.Duration` marshals.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (unit, div) = if n < 1_000 {
            ("ns", 1)
        } else if n < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{sign}{}{unit}", trim_fraction(n, div));
    }
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let mut out = String::from(sign);
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&format!("{}s", trim_fraction(rest, 1_000_000_000)));
    out
}

fn trim_fraction(n: u64, div: u64) -> String {
    let (whole, frac) = (n / div, n % div);
    if frac == 0 {
        return whole.to_string();
    }
    let width = div.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

fn json_bytes(b: &[u8]) -> Option<Value> {
    if b.is_empty() {
        return Some(Value::Null);
    }
    serde_json::from_slice(b).ok()
}

/// A message with its own JSON form; `None` when `name` has none.
fn special(name: &str, buf: &[u8]) -> Option<Option<Value>> {
    let short = name.rsplit('.').next().unwrap_or(name);
    let f = || fields(buf);
    let int = |fs: &[(u64, Wire<'_>)], n: u64| {
        fs.iter()
            .find_map(|(k, w)| match (k, w) {
                (k, Wire::Varint(v)) if *k == n => Some(*v as i64),
                _ => None,
            })
            .unwrap_or(0)
    };
    let bytes = |fs: &[(u64, Wire<'_>)], n: u64| -> Vec<u8> {
        fs.iter()
            .find_map(|(k, w)| match (k, w) {
                (k, Wire::Bytes(b)) if *k == n => Some(b.to_vec()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let value = match (name, short) {
        ("apimachinery.pkg.apis.meta.v1.Time", _) => {
            let fs = f()?;
            let (s, n) = (int(&fs, 1), int(&fs, 2));
            // The zero time marshals as null: leave the field out.
            if s == 0 && n == 0 {
                return Some(None);
            }
            timestamp(s, n, false)
        }
        ("apimachinery.pkg.apis.meta.v1.MicroTime", _) => {
            let fs = f()?;
            let (s, n) = (int(&fs, 1), int(&fs, 2));
            if s == 0 && n == 0 {
                return Some(None);
            }
            timestamp(s, n, true)
        }
        ("apimachinery.pkg.apis.meta.v1.Duration", _) => Some(json!(go_duration(int(&f()?, 1)))),
        ("apimachinery.pkg.api.resource.Quantity", _) => {
            Some(json!(text(&bytes(&f()?, 1)).unwrap_or_default()))
        }
        ("apimachinery.pkg.util.intstr.IntOrString", _) => {
            let fs = f()?;
            if int(&fs, 1) == 1 {
                Some(json!(text(&bytes(&fs, 3)).unwrap_or_default()))
            } else {
                Some(json!(int(&fs, 2) as i32))
            }
        }
        ("apimachinery.pkg.runtime.RawExtension", _)
        | ("apimachinery.pkg.apis.meta.v1.FieldsV1", _)
        | (_, "Json")
            if !name.starts_with("api.") =>
        {
            json_bytes(&bytes(&f()?, 1))
        }
        ("apimachinery.pkg.apis.meta.v1.Verbs", _) | (_, "ExtraValue") => {
            let fs = f()?;
            Some(Value::Array(
                fs.iter()
                    .filter_map(|(k, w)| match (k, w) {
                        (1, Wire::Bytes(b)) => text(b).map(Value::String),
                        _ => None,
                    })
                    .collect(),
            ))
        }
        (_, "JsonSchemaPropsOrArray") => {
            let module = name.rsplit_once('.')?.0;
            let props = format!("{module}.JsonSchemaProps");
            let fs = f()?;
            let many: Vec<Value> = fs
                .iter()
                .filter(|(k, _)| *k == 2)
                .filter_map(|(_, w)| match w {
                    Wire::Bytes(b) => message(&props, b),
                    _ => None,
                })
                .collect();
            if many.is_empty() {
                let one = bytes(&fs, 1);
                message(&props, &one)
            } else {
                Some(Value::Array(many))
            }
        }
        (_, "JsonSchemaPropsOrBool") => {
            let module = name.rsplit_once('.')?.0;
            let fs = f()?;
            let schema_bytes = bytes(&fs, 2);
            if fs.iter().any(|(k, _)| *k == 2) {
                message(&format!("{module}.JsonSchemaProps"), &schema_bytes)
            } else {
                Some(json!(int(&fs, 1) != 0))
            }
        }
        (_, "JsonSchemaPropsOrStringArray") => {
            let module = name.rsplit_once('.')?.0;
            let fs = f()?;
            if fs.iter().any(|(k, _)| *k == 1) {
                message(&format!("{module}.JsonSchemaProps"), &bytes(&fs, 1))
            } else {
                Some(Value::Array(
                    fs.iter()
                        .filter_map(|(k, w)| match (k, w) {
                            (2, Wire::Bytes(b)) => text(b).map(Value::String),
                            _ => None,
                        })
                        .collect(),
                ))
            }
        }
        _ => return None,
    };
    // A special form that does not parse makes the whole body undecodable.
    Some(Some(value?))
}

/// The JSON of message `name` (absent fields stay absent). `None`: not understood.
fn message(name: &str, buf: &[u8]) -> Option<Value> {
    match special(name, buf) {
        Some(Some(v)) => return Some(v),
        Some(None) => return Some(Value::Null),
        None => {}
    }
    let desc = schema().messages.get(name)?;
    let mut obj = Map::new();
    for (num, wire) in fields(buf)? {
        // Fields unknown to this schema (a newer client) are skipped, as in proto2.
        let Some(field) = desc.get(&num) else {
            continue;
        };
        let sub = field.ty.strip_prefix("msg:");
        match field.card {
            Card::One => {
                let value = match (sub, wire) {
                    (Some(m), Wire::Bytes(b)) => message(m, b)?,
                    (None, w) => scalar(field.ty, w)?,
                    _ => return None,
                };
                if value.is_null() || value.as_str() == Some("") {
                    obj.remove(field.json);
                } else {
                    obj.insert(field.json.to_owned(), value);
                }
            }
            Card::Inline => {
                let (Some(m), Wire::Bytes(b)) = (sub, wire) else {
                    return None;
                };
                if let Value::Object(members) = message(m, b)? {
                    obj.extend(members);
                }
            }
            Card::Many => {
                let items = match (sub, wire) {
                    (Some(m), Wire::Bytes(b)) => vec![message(m, b)?],
                    (None, w) => repeated_scalars(field.ty, w)?,
                    _ => return None,
                };
                obj.entry(field.json)
                    .or_insert_with(|| json!([]))
                    .as_array_mut()?
                    .extend(items);
            }
            Card::Map => {
                let Wire::Bytes(entry) = wire else {
                    return None;
                };
                let (mut key, mut value) = (String::new(), None);
                for (n, w) in fields(entry)? {
                    match (n, w, sub) {
                        (1, Wire::Bytes(k), _) => key = text(k)?,
                        (2, Wire::Bytes(b), Some(m)) => value = Some(message(m, b)?),
                        (2, w, None) => value = Some(scalar(field.ty, w)?),
                        _ => {}
                    }
                }
                // An absent value is the type's zero value.
                let value = value.unwrap_or_else(|| match (sub, field.ty) {
                    (Some(_), _) => json!({}),
                    (None, "string" | "bytes") => json!(""),
                    (None, "bool") => json!(false),
                    (None, _) => json!(0),
                });
                obj.entry(field.json)
                    .or_insert_with(|| json!({}))
                    .as_object_mut()?
                    .insert(key, value);
            }
        }
    }
    Some(Value::Object(obj))
}

/// Decodes a protobuf request body into the JSON object it stands for. `None` when the
/// body is not a Kubernetes protobuf envelope of a known kind, or does not parse.
pub fn decode(body: &[u8]) -> Option<Value> {
    let envelope = body.strip_prefix(b"k8s\0")?;
    let (mut api_version, mut kind) = (String::new(), String::new());
    let mut raw: &[u8] = &[];
    for (num, wire) in fields(envelope)? {
        match (num, wire) {
            (1, Wire::Bytes(tm)) => {
                for (n, w) in fields(tm)? {
                    match (n, w) {
                        (1, Wire::Bytes(x)) => api_version = text(x)?,
                        (2, Wire::Bytes(x)) => kind = text(x)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(r)) => raw = r,
            _ => {}
        }
    }
    let name = match kind.as_str() {
        // The options kinds are registered in every group version; one message.
        "DeleteOptions" | "CreateOptions" | "UpdateOptions" | "PatchOptions" => {
            format!("apimachinery.pkg.apis.meta.v1.{kind}")
        }
        _ => (*schema().kinds.get(&(api_version.as_str(), kind.as_str()))?).to_owned(),
    };
    let mut obj = message(&name, raw)?;
    let map = obj.as_object_mut()?;
    map.insert("apiVersion".into(), json!(api_version));
    map.insert("kind".into(), json!(kind));
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

    fn envelope(api_version: &[u8], kind: &[u8], raw: &[u8]) -> Vec<u8> {
        let tm = [bytes_field(1, api_version), bytes_field(2, kind)].concat();
        [b"k8s\0".to_vec(), bytes_field(1, &tm), bytes_field(2, raw)].concat()
    }

    #[test]
    fn decodes_a_configmap_envelope_and_leaves_out_empty_strings() {
        let meta = [
            bytes_field(1, b"cfg"),
            bytes_field(2, b""),
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
        assert_eq!(
            decode(&envelope(b"v1", b"ConfigMap", &raw)).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "labels": {"app": "web"}}, "data": {"a": "1"}})
        );
        assert!(decode(b"k8s\0\x0a").is_none());
        assert!(decode(b"{}").is_none());
        assert!(decode(&envelope(b"example.com/v1", b"Widget", &raw)).is_none());
    }

    #[test]
    fn go_durations() {
        for (nanos, s) in [
            (0, "0s"),
            (1_500_000_000, "1.5s"),
            (3_600_000_000_000, "1h0m0s"),
            (90_000_000_000, "1m30s"),
            (150_000_000, "150ms"),
            (-2_000_000_000, "-2s"),
        ] {
            assert_eq!(go_duration(nanos), s);
        }
    }

    #[test]
    fn the_schema_knows_every_kind_the_emulator_serves() {
        for rt in crate::registry::builtins() {
            assert!(
                schema()
                    .kinds
                    .contains_key(&(rt.api_version().as_str(), rt.kind.as_str())),
                "{} {}",
                rt.api_version(),
                rt.kind
            );
        }
    }
}
