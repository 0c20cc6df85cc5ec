//! Structural checks of built-in kinds: the object is decoded into its k8s-openapi type (as
//! the apiserver decodes into Go structs), so wrong types are rejected and fields the type
//! does not have are reported as unknown (and dropped). k8s-openapi defaults missing required
//! fields, so those are not detected.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::registry::ResourceType;

/// What decoding found.
#[derive(Debug)]
pub struct Decoded {
    /// Paths present in the object but not in the typed form (`spec.bogus`).
    pub unknown_fields: Vec<String>,
}

fn roundtrip<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

fn unknown(orig: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (orig, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, v) in o {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match t.get(k) {
                    Some(tv) => unknown(v, tv, &p, out),
                    None if v.is_null() => {}
                    // Free-form maps (labels, data, selector…) keep every key, so a missing key
                    // here really is a field the type does not have.
                    None => out.push(p),
                }
            }
        }
        (Value::Array(o), Value::Array(t)) => {
            for (i, (a, b)) in o.iter().zip(t).enumerate() {
                unknown(a, b, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Removes a field given as `spec.ports[0].prot`.
pub fn remove_dotted(obj: &mut Value, path: &str) {
    let mut segs: Vec<(String, Option<usize>)> = Vec::new();
    for seg in path.split('.') {
        match seg.split_once('[') {
            Some((k, rest)) => {
                segs.push((k.to_string(), None));
                for idx in rest.split('[') {
                    if let Ok(i) = idx.trim_end_matches(']').parse() {
                        segs.push((String::new(), Some(i)));
                    }
                }
            }
            None => segs.push((seg.to_string(), None)),
        }
    }
    let Some(((last, _), parents)) = segs.split_last() else {
        return;
    };
    let mut cur = obj;
    for (k, i) in parents {
        let next = match i {
            Some(i) => cur.get_mut(*i),
            None => cur.get_mut(k.as_str()),
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

/// Decodes `metadata` of a custom resource as `ObjectMeta`; returns its unknown fields.
pub fn decode_metadata(obj: &Value) -> Result<Vec<String>, String> {
    let meta = &obj["metadata"];
    let typed = roundtrip::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(meta)?;
    let mut out = Vec::new();
    unknown(meta, &typed, "metadata", &mut out);
    Ok(out)
}

/// Decodes a stored-form object of a built-in kind. `Ok(None)` for kinds without a typed check.
pub fn decode(rt: &ResourceType, obj: &Value) -> Result<Option<Decoded>, String> {
    use k8s_openapi::api::{
        admissionregistration, apps, coordination, core, discovery, networking, policy, rbac,
        storage,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    let typed = match (rt.group.as_str(), rt.resource.as_str()) {
        // Both event APIs are stored in the core form.
        (_, "events") => roundtrip::<core::v1::Event>(obj),
        ("", "namespaces") => roundtrip::<core::v1::Namespace>(obj),
        ("", "services") => roundtrip::<core::v1::Service>(obj),
        ("", "secrets") => roundtrip::<core::v1::Secret>(obj),
        ("", "configmaps") => roundtrip::<core::v1::ConfigMap>(obj),
        ("", "serviceaccounts") => roundtrip::<core::v1::ServiceAccount>(obj),
        ("", "endpoints") => roundtrip::<core::v1::Endpoints>(obj),
        ("", "pods") => roundtrip::<core::v1::Pod>(obj),
        ("networking.k8s.io", "ingresses") => roundtrip::<networking::v1::Ingress>(obj),
        ("networking.k8s.io", "ingressclasses") => roundtrip::<networking::v1::IngressClass>(obj),
        ("coordination.k8s.io", "leases") => roundtrip::<coordination::v1::Lease>(obj),
        ("apps", "deployments") => roundtrip::<apps::v1::Deployment>(obj),
        ("apps", "daemonsets") => roundtrip::<apps::v1::DaemonSet>(obj),
        ("storage.k8s.io", "csidrivers") => roundtrip::<storage::v1::CSIDriver>(obj),
        ("policy", "poddisruptionbudgets") => roundtrip::<policy::v1::PodDisruptionBudget>(obj),
        ("discovery.k8s.io", "endpointslices") => roundtrip::<discovery::v1::EndpointSlice>(obj),
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            roundtrip::<apiext::CustomResourceDefinition>(obj)
        }
        ("admissionregistration.k8s.io", "validatingadmissionpolicies") => {
            roundtrip::<admissionregistration::v1::ValidatingAdmissionPolicy>(obj)
        }
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings") => {
            roundtrip::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(obj)
        }
        ("rbac.authorization.k8s.io", "roles") => roundtrip::<rbac::v1::Role>(obj),
        ("rbac.authorization.k8s.io", "clusterroles") => roundtrip::<rbac::v1::ClusterRole>(obj),
        ("rbac.authorization.k8s.io", "rolebindings") => roundtrip::<rbac::v1::RoleBinding>(obj),
        ("rbac.authorization.k8s.io", "clusterrolebindings") => {
            roundtrip::<rbac::v1::ClusterRoleBinding>(obj)
        }
        _ => return Ok(None),
    }?;
    let mut unknown_fields = Vec::new();
    unknown(obj, &typed, "", &mut unknown_fields);
    Ok(Some(Decoded { unknown_fields }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decoding_table() {
        let reg = crate::registry::Registry::new(std::iter::empty());
        let svc = reg.lookup("", "v1", "services").unwrap();
        let ok = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "labels": {"a": "b"}}, "spec": {"ports": [{"port": 80}], "selector": {"x": "y"}}});
        assert!(decode(svc, &ok).unwrap().unwrap().unknown_fields.is_empty());
        let typo = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "lables": {}}, "spec": {"ports": [{"port": 80, "prot": "TCP"}]}});
        assert_eq!(
            decode(svc, &typo).unwrap().unwrap().unknown_fields,
            vec!["metadata.lables", "spec.ports[0].prot"]
        );
        let wrong = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": "80"}});
        assert!(decode(svc, &wrong).is_err());
        let mut t = typo.clone();
        remove_dotted(&mut t, "spec.ports[0].prot");
        remove_dotted(&mut t, "metadata.lables");
        assert_eq!(t["spec"]["ports"], json!([{"port": 80}]));
        assert!(t["metadata"].get("lables").is_none());
        let rb = reg
            .lookup("rbac.authorization.k8s.io", "v1", "rolebindings")
            .unwrap();
        let wrong = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "r"}, "subjects": {"kind": "User"}});
        assert!(decode(rb, &wrong).is_err());
    }
}
