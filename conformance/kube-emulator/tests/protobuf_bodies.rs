//! Protobuf request bodies encoded by the reference types (`k8s-pb` + prost)
//! are stored as the JSON the apiserver would hold: the types with their own
//! JSON form (MicroTime, Time, IntOrString, Quantity, the apiextensions JSON
//! and JSONSchemaPropsOr*), inlined Go members (`Volume.volumeSource`), and a
//! protobuf `DeleteOptions` body that changes what a DELETE does.

use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use kube_emulator::{Emulator, Options};
use prost::Message;
use serde_json::{Value, json};

/// `k8s\0` + runtime.Unknown, as client-go's protobuf serializer writes it.
fn envelope(api_version: &str, kind: &str, object: &impl Message) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(object.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [b"k8s\0".to_vec(), unknown.encode_to_vec()].concat()
}

async fn send(client: &kube::Client, method: &str, path: &str, body: Vec<u8>) -> Value {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .header("accept", "application/json")
        .body(body)
        .unwrap();
    let text = client.request_text(req).await.expect("request accepted");
    serde_json::from_str(&text).unwrap()
}

fn meta(name: &str) -> Option<meta::ObjectMeta> {
    Some(meta::ObjectMeta {
        name: Some(name.into()),
        namespace: Some(String::new()), // Go writes empty strings: left out
        creation_timestamp: Some(meta::Time::default()), // the zero time: left out
        ..Default::default()
    })
}

fn int_or_string(v: Result<i32, &str>) -> Option<IntOrString> {
    Some(match v {
        Ok(i) => IntOrString {
            r#type: Some(0),
            int_val: Some(i),
            str_val: Some(String::new()),
        },
        Err(s) => IntOrString {
            r#type: Some(1),
            int_val: Some(0),
            str_val: Some(s.into()),
        },
    })
}

#[tokio::test]
async fn reference_encoded_bodies_are_stored_as_the_apiserver_would() {
    let emu = Emulator::start(Options::default()).await.unwrap();
    let client = emu.client().await.unwrap();

    let lease = coordination::Lease {
        metadata: meta("leader"),
        spec: Some(coordination::LeaseSpec {
            holder_identity: Some("pod-a".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(meta::MicroTime {
                seconds: Some(1_700_000_000),
                nanos: Some(123_456_000),
            }),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    };
    let stored = send(
        &client,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        envelope("coordination.k8s.io/v1", "Lease", &lease),
    )
    .await;
    assert_eq!(
        stored["spec"],
        json!({"holderIdentity": "pod-a", "leaseDurationSeconds": 15,
               "acquireTime": "2023-11-14T22:13:20.123456Z", "leaseTransitions": 0})
    );
    assert_eq!(stored["metadata"]["namespace"], "default");
    assert!(stored["metadata"]["creationTimestamp"].is_string());

    let container = core::Container {
        name: Some("web".into()),
        image: Some("web:1".into()),
        resources: Some(core::ResourceRequirements {
            limits: [(
                "memory".to_owned(),
                Quantity {
                    string: Some("128Mi".into()),
                },
            )]
            .into(),
            ..Default::default()
        }),
        readiness_probe: Some(core::Probe {
            handler: Some(core::ProbeHandler {
                http_get: Some(core::HttpGetAction {
                    path: Some("/readyz".into()),
                    port: int_or_string(Err("probes")),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            period_seconds: Some(5),
            ..Default::default()
        }),
        volume_mounts: vec![core::VolumeMount {
            name: Some("ca".into()),
            mount_path: Some("/etc/ca".into()),
            read_only: Some(true),
            ..Default::default()
        }],
        ..Default::default()
    };
    let deployment = apps::Deployment {
        metadata: meta("web"),
        spec: Some(apps::DeploymentSpec {
            replicas: Some(0),
            strategy: Some(apps::DeploymentStrategy {
                r#type: Some("RollingUpdate".into()),
                rolling_update: Some(apps::RollingUpdateDeployment {
                    max_surge: int_or_string(Err("25%")),
                    max_unavailable: int_or_string(Ok(0)),
                }),
            }),
            template: Some(core::PodTemplateSpec {
                metadata: meta(""),
                spec: Some(core::PodSpec {
                    containers: vec![container],
                    volumes: vec![core::Volume {
                        name: Some("ca".into()),
                        volume_source: Some(core::VolumeSource {
                            config_map: Some(core::ConfigMapVolumeSource {
                                local_object_reference: Some(core::LocalObjectReference {
                                    name: Some("edge-ca".into()),
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                    }],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        status: None,
    };
    let stored = send(
        &client,
        "POST",
        "/apis/apps/v1/namespaces/default/deployments",
        envelope("apps/v1", "Deployment", &deployment),
    )
    .await;
    let spec = &stored["spec"];
    assert_eq!(spec["replicas"], 0);
    assert_eq!(
        spec["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}})
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(
        pod["volumes"],
        json!([{"name": "ca", "configMap": {"name": "edge-ca"}}]),
        "VolumeSource and LocalObjectReference are inlined"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["resources"], json!({"limits": {"memory": "128Mi"}}));
    assert_eq!(
        c["readinessProbe"],
        json!({"httpGet": {"path": "/readyz", "port": "probes"}, "periodSeconds": 5})
    );

    let props = |ty: &str| apiext::JsonSchemaProps {
        r#type: Some(ty.into()),
        ..Default::default()
    };
    let schema = apiext::JsonSchemaProps {
        r#type: Some("object".into()),
        properties: [
            (
                "spec".to_owned(),
                apiext::JsonSchemaProps {
                    r#type: Some("object".into()),
                    x_kubernetes_preserve_unknown_fields: Some(true),
                    additional_properties: Some(Box::new(apiext::JsonSchemaPropsOrBool {
                        allows: Some(true),
                        schema: Some(Box::new(props("string"))),
                    })),
                    ..Default::default()
                },
            ),
            (
                "size".to_owned(),
                apiext::JsonSchemaProps {
                    r#type: Some("string".into()),
                    default: Some(apiext::Json {
                        raw: Some(b"\"m\"".to_vec()),
                    }),
                    ..Default::default()
                },
            ),
            (
                "tags".to_owned(),
                apiext::JsonSchemaProps {
                    r#type: Some("array".into()),
                    items: Some(Box::new(apiext::JsonSchemaPropsOrArray {
                        schema: Some(Box::new(props("string"))),
                        j_son_schemas: vec![],
                    })),
                    ..Default::default()
                },
            ),
        ]
        .into(),
        ..Default::default()
    };
    let crd = apiext::CustomResourceDefinition {
        metadata: meta("gadgets.example.com"),
        spec: Some(apiext::CustomResourceDefinitionSpec {
            group: Some("example.com".into()),
            names: Some(apiext::CustomResourceDefinitionNames {
                plural: Some("gadgets".into()),
                singular: Some("gadget".into()),
                kind: Some("Gadget".into()),
                list_kind: Some("GadgetList".into()),
                ..Default::default()
            }),
            scope: Some("Namespaced".into()),
            versions: vec![apiext::CustomResourceDefinitionVersion {
                name: Some("v1".into()),
                served: Some(true),
                storage: Some(true),
                schema: Some(apiext::CustomResourceValidation {
                    open_apiv3_schema: Some(schema),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let stored = send(
        &client,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        envelope("apiextensions.k8s.io/v1", "CustomResourceDefinition", &crd),
    )
    .await;
    let schema = &stored["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert_eq!(
        schema["properties"]["spec"],
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
               "additionalProperties": {"type": "string"}})
    );
    assert_eq!(schema["properties"]["size"]["default"], "m");
    assert_eq!(
        schema["properties"]["tags"]["items"],
        json!({"type": "string"})
    );
    // The CRD is served, and its default applies.
    let req = http::Request::builder()
        .method("POST")
        .uri("/apis/example.com/v1/namespaces/default/gadgets")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}})).unwrap())
        .unwrap();
    let g: Value = serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    assert_eq!(g["size"], "m");

    // DeleteOptions in protobuf (client-go's typed Delete): dryRun keeps the object.
    let options = meta::DeleteOptions {
        dry_run: vec!["All".into()],
        propagation_policy: Some("Background".into()),
        ..Default::default()
    };
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader";
    send(
        &client,
        "DELETE",
        path,
        envelope("v1", "DeleteOptions", &options),
    )
    .await;
    let still: Value = serde_json::from_str(
        &client
            .request_text(http::Request::get(path).body(Vec::new()).unwrap())
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        still["metadata"]["name"], "leader",
        "dryRun=All deleted nothing"
    );
    send(
        &client,
        "DELETE",
        path,
        envelope("v1", "DeleteOptions", &meta::DeleteOptions::default()),
    )
    .await;
    let gone = client
        .request_text(http::Request::get(path).body(Vec::new()).unwrap())
        .await;
    assert!(gone.is_err(), "deleted: {gone:?}");
}
