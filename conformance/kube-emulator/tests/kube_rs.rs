//! The emulator driven by kube-rs: API semantics, watch, runtime helpers, RBAC and auth.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Widget, emulator, emulator_with, widget};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy, WatchEvent,
    WatchParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use kube_emulator::Options;
use serde_json::json;

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_generation_and_status_separation() {
    let emu = emulator().await;
    let api: Api<Widget> = Api::namespaced(emu.client().await.unwrap(), "default");
    let created = api
        .create(&PostParams::default(), &widget("w1", "m", 3))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));

    // A status write leaves generation alone and ignores spec changes.
    let mut st = created.clone();
    st.spec.replicas = Some(9);
    st.status = Some(common::WidgetStatus {
        conditions: vec![common::Condition {
            type_: "Ready".into(),
            status: "True".into(),
        }],
    });
    let after_status = api
        .replace_status("w1", &PostParams::default(), &st)
        .await
        .unwrap();
    assert_eq!(after_status.metadata.generation, Some(1));
    assert_eq!(after_status.spec.replicas, Some(3));
    assert_eq!(
        after_status.status.as_ref().unwrap().conditions[0].status,
        "True"
    );
    assert_ne!(
        after_status.metadata.resource_version,
        created.metadata.resource_version
    );

    // A spec write bumps generation and ignores status changes.
    let mut sp = after_status.clone();
    sp.spec.replicas = Some(4);
    sp.status = None;
    let after_spec = api
        .replace("w1", &PostParams::default(), &sp)
        .await
        .unwrap();
    assert_eq!(after_spec.metadata.generation, Some(2));
    assert_eq!(after_spec.status, after_status.status);

    // A stale resourceVersion is a 409 Conflict.
    let err = api_err(
        api.replace("w1", &PostParams::default(), &sp)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(err.reason, "Conflict");

    // Not found / already exists are proper Status objects.
    let err = api_err(api.get("nope").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    let err = api_err(
        api.create(&PostParams::default(), &widget("w1", "m", 1))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
}

#[tokio::test]
async fn no_op_writes_keep_resource_version_and_emit_no_event() {
    let emu = emulator().await;
    let api: Api<Widget> = Api::namespaced(emu.client().await.unwrap(), "default");
    let w = api
        .create(&PostParams::default(), &widget("w", "m", 3))
        .await
        .unwrap();
    let rv = w.resource_version().unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    let same_spec = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(same_spec.resource_version().unwrap(), rv);
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let s1 = api
        .patch_status("w", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let s2 = api
        .patch_status("w", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_ne!(s1.resource_version(), Some(rv.clone()));
    assert_eq!(s2.resource_version(), s1.resource_version());
    let ssa = PatchParams::apply("ctl").force();
    let a1 = api.patch_status("w", &ssa, &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "status": {"conditions": [{"type": "Ready", "status": "False"}]}}))).await.unwrap();
    let a2 = api.patch_status("w", &ssa, &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "status": {"conditions": [{"type": "Ready", "status": "False"}]}}))).await.unwrap();
    assert_eq!(a1.resource_version(), a2.resource_version());

    // The watch sees exactly the two real changes, then the marker change.
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = stream.try_next().await.unwrap() {
        match ev {
            WatchEvent::Modified(o) => {
                let r = o.spec.replicas;
                seen.push(o.resource_version().unwrap());
                if r == Some(5) {
                    break;
                }
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0], s1.resource_version().unwrap());
    assert_eq!(seen[1], a1.resource_version().unwrap());
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_and_sends_bookmarks() {
    let emu = emulator_with(Options {
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client().await.unwrap(), "default");
    let cm = |n: &str, v: &str| {
        serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": n}, "data": {"v": v}}))
            .unwrap()
    };
    api.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &cm("b", "1"))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();

    let mut stream = api
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let mut got = Vec::new();
    while got.len() < 4 {
        match stream.try_next().await.unwrap().expect("stream open") {
            WatchEvent::Added(o) => got.push(format!("ADDED {}", o.name_any())),
            WatchEvent::Modified(o) => got.push(format!("MODIFIED {}", o.name_any())),
            WatchEvent::Deleted(o) => got.push(format!("DELETED {}", o.name_any())),
            WatchEvent::Bookmark(b) => got.push(format!(
                "BOOKMARK {}",
                !b.metadata.resource_version.is_empty()
            )),
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        got,
        vec!["ADDED b", "MODIFIED a", "DELETED b", "BOOKMARK true"]
    );
}

#[tokio::test]
async fn selectors_filter_lists_and_watches() {
    let emu = emulator().await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client().await.unwrap(), "default");
    for (n, tier) in [("a", "front"), ("b", "back"), ("c", "db")] {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": n, "labels": {"tier": tier}}}))
                .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    };
    for (sel, want) in [
        ("tier in (front,back)", vec!["a", "b"]),
        ("tier!=db", vec!["a", "b"]),
        ("tier notin (front)", vec!["b", "c"]),
        ("!tier", vec![]),
    ] {
        assert_eq!(
            names(api.list(&ListParams::default().labels(sel)).await.unwrap()),
            want,
            "{sel}"
        );
    }
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=c"))
                .await
                .unwrap()
        ),
        vec!["c"]
    );
    let page = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(page.clone()), vec!["a", "b"]);
    let rest = api
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(rest), vec!["c"]);

    // Relabelling out of a watched selector is a DELETED for that watch.
    let list = api.list(&ListParams::default()).await.unwrap();
    let mut stream = api
        .watch(
            &WatchParams::default().labels("tier=front"),
            &list.metadata.resource_version.unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}})),
    )
    .await
    .unwrap();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Deleted(o) => assert_eq!(o.name_any(), "a"),
        other => panic!("expected DELETED, got {other:?}"),
    }
}

#[tokio::test]
async fn patch_flavours() {
    let emu = emulator().await;
    let api: Api<Widget> = Api::namespaced(emu.client().await.unwrap(), "default");
    api.create(&PostParams::default(), &widget("w", "m", 3))
        .await
        .unwrap();
    let jp = |v: serde_json::Value| Patch::<()>::Json(serde_json::from_value(v).unwrap());
    let err = api_err(api.patch("w", &PatchParams::default(), &jp(json!([{"op": "test", "path": "/spec/replicas", "value": 4}, {"op": "replace", "path": "/spec/replicas", "value": 5}]))).await.unwrap_err());
    assert_eq!(err.code, 422);
    let ok = api.patch("w", &PatchParams::default(), &jp(json!([{"op": "test", "path": "/spec/replicas", "value": 3}, {"op": "replace", "path": "/spec/replicas", "value": 5}]))).await.unwrap();
    assert_eq!(ok.spec.replicas, Some(5));

    // Server-side apply creates when absent, detects conflicts between appliers, and `force` takes over.
    let applied = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"size": "s", "replicas": 1}});
    let created = api
        .patch("w2", &PatchParams::apply("alice"), &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(created.spec.size, "s");
    let bob = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"size": "s", "replicas": 2}});
    let err = api_err(
        api.patch("w2", &PatchParams::apply("bob"), &Patch::Apply(&bob))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert!(err.message.contains("alice"), "{}", err.message);
    let forced = api
        .patch(
            "w2",
            &PatchParams::apply("bob").force(),
            &Patch::Apply(&bob),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.replicas, Some(2));
    // A field its only applier stops applying is removed.
    let fewer = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"size": "s", "replicas": 2, "color": "blue"}});
    api.patch("w2", &PatchParams::apply("bob"), &Patch::Apply(&fewer))
        .await
        .unwrap();
    let without = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"size": "s", "replicas": 2}});
    let out = api
        .patch("w2", &PatchParams::apply("bob"), &Patch::Apply(&without))
        .await
        .unwrap();
    assert_eq!(out.spec.color, None);

    // Strategic merge patch is for built-in kinds only.
    let err = api_err(
        api.patch(
            "w",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 415);
}

#[tokio::test]
async fn schema_validation_defaults_strictness_and_cel() {
    let emu = emulator().await;
    let client = emu.client().await.unwrap();
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client,
        "default",
        &kube::api::ApiResource::erase::<Widget>(&()),
    );
    let obj = |spec: serde_json::Value| {
        serde_json::from_value::<kube::api::DynamicObject>(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "v"}, "spec": spec})).unwrap()
    };
    let cases = [
        (json!({}), "spec.size: Required value"),
        (json!({"size": "huge"}), "Unsupported value: \"huge\""),
        (
            json!({"size": "m", "replicas": 11}),
            "should be less than or equal to 10",
        ),
        (
            json!({"size": "m", "replicas": "x"}),
            "must be of type integer",
        ),
        (
            json!({"size": "xl", "replicas": 3}),
            "xl widgets are limited to 2 replicas",
        ),
    ];
    for (spec, want) in cases {
        let err = api_err(
            dynamic
                .create(&PostParams::default(), &obj(spec.clone()))
                .await
                .unwrap_err(),
        );
        assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"), "{spec}");
        assert!(err.message.contains(want), "{spec}: {}", err.message);
    }
    // Defaults are applied and unknown fields pruned (Warn is the default).
    let created = dynamic
        .create(
            &PostParams::default(),
            &obj(json!({"size": "m", "bogus": true})),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"], json!({"size": "m", "replicas": 1}));
    // Unknown metadata fields are pruned too; label values must be strings.
    let mut meta_typo = obj(json!({"size": "s"}));
    meta_typo.metadata.name = Some("v2".into());
    let mut raw = serde_json::to_value(&meta_typo).unwrap();
    raw["metadata"]["lables"] = json!({"a": "b"});
    let created2 = dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(raw.clone()).unwrap(),
        )
        .await
        .unwrap();
    assert!(created2.metadata.labels.is_none());
    raw["metadata"]["name"] = json!("v3");
    raw["metadata"]["labels"] = json!({"a": 1});
    let req = http::Request::post("/apis/example.com/v1/namespaces/default/widgets")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&raw).unwrap())
        .unwrap();
    let err = api_err(
        emu.client()
            .await
            .unwrap()
            .request::<serde_json::Value>(req)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422, "{}", err.message);
    // Strict field validation rejects unknown fields.
    let strict = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..Default::default()
    };
    let err = api_err(
        dynamic
            .patch("v", &strict, &Patch::Merge(json!({"spec": {"bogus": 1}})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    assert!(
        err.message.contains("unknown field \"spec.bogus\""),
        "{}",
        err.message
    );
    // Transition rule: color is immutable once set.
    api.patch(
        "v",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"color": "red"}})),
    )
    .await
    .unwrap();
    let err = api_err(
        api.patch(
            "v",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"color": "blue"}})),
        )
        .await
        .unwrap_err(),
    );
    assert!(
        err.message.contains("color is immutable"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn finalizers_owner_references_and_namespace_deletion() {
    let emu = emulator().await;
    let client = emu.client().await.unwrap();
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut w = widget("owner", "m", 1);
    w.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    let owner = api.create(&PostParams::default(), &w).await.unwrap();
    let oref: OwnerReference = owner.controller_owner_ref(&()).unwrap();
    for n in ["dep1", "dep2"] {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": n, "ownerReferences": [oref.clone()]}}),
        )
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    // Finalizer pending: deletionTimestamp set, object stays, dependents stay.
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    let pending = api.get("owner").await.unwrap();
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert!(cms.get("dep1").await.is_ok());
    // New finalizers cannot be added while terminating.
    let err = api_err(
        api.patch(
            "owner",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/cleanup", "x/y"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    // Removing the last finalizer removes the object and collects its dependents.
    api.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(api.get("owner").await.unwrap_err()).code, 404);
    assert!(
        cms.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Orphan propagation keeps dependents and strips the owner reference.
    let owner = api
        .create(&PostParams::default(), &widget("owner2", "m", 1))
        .await
        .unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "kept", "ownerReferences": [owner.controller_owner_ref(&()).unwrap()]}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    api.delete(
        "owner2",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let kept = cms.get("kept").await.unwrap();
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // Deleting a namespace deletes its content, then the namespace.
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "tmp"}})).unwrap(),
    )
    .await
    .unwrap();
    let tmp: Api<ConfigMap> = Api::namespaced(client.clone(), "tmp");
    tmp.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
    )
    .await
    .unwrap();
    nss.delete("tmp", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(nss.get("tmp").await.unwrap_err()).code, 404);
    // …and nothing can be created in a namespace that does not exist.
    assert_eq!(
        api_err(
            tmp.create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "y"}})).unwrap()
            )
            .await
            .unwrap_err()
        )
        .code,
        404
    );
}

#[derive(Debug, thiserror::Error)]
#[error("reconcile failed: {0}")]
struct ReconcileError(String);

#[tokio::test]
async fn controller_finalizer_helper_reflector_and_recorder() {
    let emu = emulator().await;
    let client = emu.client().await.unwrap();
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let cleaned = Arc::new(AtomicUsize::new(0));

    struct Ctx {
        client: kube::Client,
        recorder: Recorder,
        cleaned: Arc<AtomicUsize>,
    }
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), Reporter::from("widget-controller")),
        cleaned: cleaned.clone(),
    });
    async fn reconcile(
        w: Arc<Widget>,
        ctx: Arc<Ctx>,
    ) -> Result<Action, kube::runtime::finalizer::Error<ReconcileError>> {
        let api: Api<Widget> = Api::namespaced(ctx.client.clone(), &w.namespace().unwrap());
        finalizer(&api, "example.com/cleanup", w, |ev| async {
            match ev {
                FinalizerEvent::Apply(w) => {
                    let status =
                        json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
                    api.patch_status(
                        &w.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(status),
                    )
                    .await
                    .map_err(|e| ReconcileError(e.to_string()))?;
                    let ev = Event {
                        type_: EventType::Normal,
                        reason: "Reconciled".into(),
                        note: Some("ready".into()),
                        action: "Reconcile".into(),
                        secondary: None,
                    };
                    ctx.recorder
                        .publish(&ev, &w.object_ref(&()))
                        .await
                        .map_err(|e| ReconcileError(e.to_string()))?;
                    Ok(Action::await_change())
                }
                FinalizerEvent::Cleanup(_) => {
                    ctx.cleaned.fetch_add(1, Ordering::SeqCst);
                    Ok(Action::await_change())
                }
            }
        })
        .await
    }
    fn error_policy(
        _: Arc<Widget>,
        _: &kube::runtime::finalizer::Error<ReconcileError>,
        _: Arc<Ctx>,
    ) -> Action {
        Action::requeue(Duration::from_millis(200))
    }
    let controller = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {}),
    );

    // A reflector sees the controller's status write.
    let (reader, writer) = reflector::store::<Widget>();
    let refl =
        reflector(writer, watcher(api.clone(), watcher::Config::default())).applied_objects();
    let mut refl = Box::pin(refl);
    api.create(&PostParams::default(), &widget("w", "m", 2))
        .await
        .unwrap();
    loop {
        let w = refl.try_next().await.unwrap().unwrap();
        if w.status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.status == "True"))
        {
            break;
        }
    }
    let cached = reader
        .get(&reflector::ObjectRef::new("w").within("default"))
        .unwrap();
    assert!(
        cached
            .finalizers()
            .contains(&"example.com/cleanup".to_string())
    );

    // The Recorder's events.k8s.io event is visible as a core v1 event (what kubectl describe reads).
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let uid = cached.uid().unwrap();
    let mut found = Vec::new();
    let mut stream = Box::pin(
        watcher(
            events,
            watcher::Config::default()
                .fields(&format!("involvedObject.name=w,involvedObject.uid={uid}")),
        )
        .applied_objects(),
    );
    while found.is_empty() {
        let e = stream.try_next().await.unwrap().unwrap();
        found.push((
            e.reason.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default(),
            e.involved_object.kind.clone().unwrap_or_default(),
        ));
    }
    assert_eq!(
        found[0],
        (
            "Reconciled".to_string(),
            "ready".to_string(),
            "Widget".to_string()
        )
    );

    // Deleting runs the cleanup branch, then the object goes away.
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let uid = cached.uid().unwrap();
    kube::runtime::wait::await_condition(
        api.clone(),
        "w",
        kube::runtime::wait::conditions::is_deleted(&uid),
    )
    .await
    .unwrap();
    assert_eq!(cleaned.load(Ordering::SeqCst), 1);
    controller.abort();
}

#[tokio::test]
async fn lease_based_leader_election() {
    let emu = emulator().await;
    let client = emu.client().await.unwrap();
    let build = |id: &str| {
        kube_lease_manager::LeaseManagerBuilder::new(client.clone(), "leader")
            .with_namespace("default")
            .with_identity(id)
            .with_duration(2)
            .with_grace(1)
            .build()
    };
    let a = build("a").await.unwrap();
    let (mut a_rx, a_task) = a.watch().await;
    while !*a_rx.borrow_and_update() {
        a_rx.changed().await.unwrap();
    }
    let b = build("b").await.unwrap();
    let (mut b_rx, _b_task) = b.watch().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = leases.get("leader").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("a"));
    assert!(!*b_rx.borrow());
    // a steps down (closing its channel releases the lease); b takes over.
    drop(a_rx);
    a_task.await.unwrap().unwrap();
    while !*b_rx.borrow_and_update() {
        b_rx.changed().await.unwrap();
    }
    let lease = leases.get("leader").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn rbac_allows_and_denies_service_accounts() {
    let emu = emulator().await;
    emu.apply_yaml(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: op, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: widget-reader, namespace: default}
rules:
- apiGroups: [example.com]
  resources: [widgets]
  verbs: [get, list, watch]
- apiGroups: [example.com]
  resources: [widgets/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [op-token]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: op-widgets, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: widget-reader}
subjects: [{kind: ServiceAccount, name: op, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ns-reader}
rules:
- {apiGroups: [""], resources: [namespaces], verbs: [list]}
- {nonResourceURLs: [/metrics], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: op-ns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ns-reader}
subjects: [{kind: ServiceAccount, name: op, namespace: default}]
---
apiVersion: v1
kind: Secret
metadata: {name: op-token, namespace: default}
stringData: {token: abc}
---
apiVersion: v1
kind: Secret
metadata: {name: other, namespace: default}
stringData: {token: xyz}
"#,
    )
    .unwrap();
    let admin = emu.client().await.unwrap();
    Api::<Widget>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &widget("w", "m", 1))
        .await
        .unwrap();
    let token = emu.token_for_service_account("default", "op");
    let sa = emu.client_for_token(&token).await.unwrap();
    let widgets: Api<Widget> = Api::namespaced(sa.clone(), "default");
    assert_eq!(
        widgets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": []}})),
        )
        .await
        .unwrap();
    let err = api_err(
        widgets
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 2}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403);
    assert_eq!(
        err.message,
        "widgets.example.com \"w\" is forbidden: User \"system:serviceaccount:default:op\" cannot patch resource \"widgets\" in API group \"example.com\" in the namespace \"default\""
    );
    let err = api_err(
        widgets
            .delete("w", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403);
    // Namespaced Role does not reach other namespaces; ClusterRoleBinding reaches cluster scope.
    assert_eq!(
        api_err(
            Api::<Widget>::namespaced(sa.clone(), "kube-system")
                .list(&ListParams::default())
                .await
                .unwrap_err()
        )
        .code,
        403
    );
    assert!(
        Api::<Namespace>::all(sa.clone())
            .list(&ListParams::default())
            .await
            .is_ok()
    );
    // resourceNames.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(sa.clone(), "default");
    assert!(secrets.get("op-token").await.is_ok());
    assert_eq!(api_err(secrets.get("other").await.unwrap_err()).code, 403);
    assert_eq!(
        api_err(secrets.list(&ListParams::default()).await.unwrap_err()).code,
        403
    );
    // …but listing one named object by field selector is authorized by name, as on the apiserver.
    let one = secrets
        .list(&ListParams::default().fields("metadata.name=op-token"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    // Non-resource URLs.
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = sa.request_text(req).await;
    assert!(
        !matches!(metrics, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{metrics:?}"
    );

    // SubjectAccessReview and TokenReview (as admin).
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some("system:serviceaccount:default:op".into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            resource_attributes: Some(ResourceAttributes {
                group: Some("example.com".into()),
                resource: Some("widgets".into()),
                verb: Some("delete".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let res = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &sar)
        .await
        .unwrap();
    assert!(!res.status.unwrap().allowed);
    let mut allowed = sar.clone();
    allowed.spec.resource_attributes.as_mut().unwrap().verb = Some("watch".into());
    assert!(
        Api::<SubjectAccessReview>::all(admin.clone())
            .create(&PostParams::default(), &allowed)
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed
    );
    let tr = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let res = Api::<TokenReview>::all(admin.clone())
        .create(&PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(res.authenticated, Some(true));
    assert_eq!(
        res.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:default:op")
    );

    // TokenRequest through the API gives a working token (for the API
    // server's audience: a token for another is no API credential, as on a
    // real API server); deleting the SA invalidates tokens.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let treq = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![kube_emulator::API_AUDIENCE.into()],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued: TokenRequest = sas
        .create_subresource("token", "op", &PostParams::default(), &treq)
        .await
        .unwrap();
    let t2 = issued.status.unwrap().token;
    let sa2 = emu.client_for_token(&t2).await.unwrap();
    assert!(
        Api::<Widget>::namespaced(sa2.clone(), "default")
            .get("w")
            .await
            .is_ok()
    );
    sas.delete("op", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api_err(
            Api::<Widget>::namespaced(sa2, "default")
                .get("w")
                .await
                .unwrap_err()
        )
        .code,
        401
    );

    // The audit log shows who did what, with response codes.
    let audit = emu.audit_entries();
    let op: Vec<_> = audit
        .iter()
        .filter(|e| e.user == "system:serviceaccount:default:op" && e.resource == "secrets")
        .map(|e| (e.verb.as_str(), e.name.as_str(), e.code))
        .collect();
    assert_eq!(
        op,
        vec![
            ("get", "op-token", 200),
            ("get", "other", 403),
            ("list", "", 403),
            ("list", "op-token", 200)
        ]
    );
    assert!(audit.iter().any(|e| e.resource == "widgets"
        && e.subresource == "status"
        && e.verb == "patch"
        && e.code == 200));
}

#[tokio::test]
async fn crd_registration_serves_the_kind_with_discovery() {
    let emu = kube_emulator::Emulator::start(Options::default())
        .await
        .unwrap();
    let client = emu.client().await.unwrap();
    let before = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    assert!(!before.has_group("example.com"));
    emu.apply_yaml(common::WIDGET_CRD).unwrap();
    let after = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let (ar, caps) = after
        .resolve_gvk(&kube::api::GroupVersionKind::gvk(
            "example.com",
            "v1",
            "Widget",
        ))
        .unwrap();
    assert_eq!(ar.plural, "widgets");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(
        caps.subresources
            .iter()
            .any(|(s, _)| s.plural == "widgets/status" || s.plural == "status"),
        "{:?}",
        caps.subresources
    );
    let agg = kube::discovery::Discovery::new(client.clone())
        .run_aggregated()
        .await
        .unwrap();
    assert!(agg.has_group("example.com"));
    assert!(agg.has_group("events.k8s.io") && agg.has_group("coordination.k8s.io"));
    Api::<Widget>::namespaced(client, "default")
        .create(&PostParams::default(), &widget("w", "s", 1))
        .await
        .unwrap();
}

#[tokio::test]
async fn too_old_resource_version_is_gone_and_watchers_relist() {
    let emu = emulator_with(Options {
        watch_history: 3,
        ..Options::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client().await.unwrap(), "default");
    let cm =
        |n: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": n}})).unwrap();
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let old_rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for n in ["b", "c", "d", "e"] {
        api.create(&PostParams::default(), &cm(n)).await.unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    // kube-runtime's watcher recovers by relisting.
    let names: Vec<String> = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .take(5)
        .map_ok(|c| c.name_any())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(names, vec!["a", "b", "c", "d", "e"]);
}

#[tokio::test]
async fn foreground_deletion_deletecollection_and_metadata_watches() {
    let emu = emulator().await;
    let client = emu.client().await.unwrap();
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = api
        .create(&PostParams::default(), &widget("owner", "m", 1))
        .await
        .unwrap();
    let mut dep: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dep", "finalizers": ["example.com/hold"], "labels": {"app": "x"}}})).unwrap();
    dep.metadata.owner_references = Some(vec![owner.controller_owner_ref(&()).unwrap()]);
    cms.create(&PostParams::default(), &dep).await.unwrap();
    // Foreground: the owner waits (foregroundDeletion finalizer) until its dependent is gone.
    api.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    let waiting = api.get("owner").await.unwrap();
    assert!(
        waiting
            .finalizers()
            .contains(&"foregroundDeletion".to_string())
    );
    assert!(
        cms.get("dep")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    cms.patch(
        "dep",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(api.get("owner").await.unwrap_err()).code, 404);

    // Metadata-only list/watch (PartialObjectMetadata) and deletecollection by label.
    for n in ["m1", "m2"] {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": n, "labels": {"app": "x"}}, "data": {"secret": "s"}}),
        )
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let meta = cms
        .list_metadata(&ListParams::default().labels("app=x"))
        .await
        .unwrap();
    assert_eq!(
        meta.items.iter().map(|m| m.name_any()).collect::<Vec<_>>(),
        vec!["m1", "m2"]
    );
    let mut mw = Box::pin(
        watcher(
            Api::<kube::core::PartialObjectMeta<ConfigMap>>::namespaced(client.clone(), "default"),
            watcher::Config::default().labels("app=x"),
        )
        .applied_objects(),
    );
    assert_eq!(mw.try_next().await.unwrap().unwrap().name_any(), "m1");
    let deleted = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=x"),
        )
        .await
        .unwrap();
    assert_eq!(deleted.left().map(|l| l.items.len()), Some(2));
    assert!(
        cms.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn recorder_series_updates_the_same_event() {
    let emu = emulator().await;
    let client = emu.client().await.unwrap();
    let w = Api::<Widget>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &widget("w", "m", 1))
        .await
        .unwrap();
    let recorder = Recorder::new(client.clone(), Reporter::from("ctl"));
    let ev = Event {
        type_: EventType::Normal,
        reason: "Synced".into(),
        note: Some("ok".into()),
        action: "Sync".into(),
        secondary: None,
    };
    recorder.publish(&ev, &w.object_ref(&())).await.unwrap();
    recorder.publish(&ev, &w.object_ref(&())).await.unwrap();
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(events.items.len(), 1);
    let e = &events.items[0];
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("w")
    );
    let core = Api::<CoreEvent>::namespaced(client, "default")
        .list(&ListParams::default().fields("involvedObject.kind=Widget,reason=Synced"))
        .await
        .unwrap();
    assert_eq!(core.items.len(), 1);
    assert_eq!(core.items[0].message.as_deref(), Some("ok"));
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_then_changes() {
    let emu = emulator().await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client().await.unwrap(), "default");
    let cm =
        |n: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": n}})).unwrap();
    api.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    let mut events = Box::pin(watcher(
        api.clone(),
        watcher::Config::default().streaming_lists(),
    ));
    let mut initial = Vec::new();
    loop {
        match events.try_next().await.unwrap().unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => initial.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, vec!["before"]);
    api.create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    match events.try_next().await.unwrap().unwrap() {
        watcher::Event::Apply(o) => assert_eq!(o.name_any(), "after"),
        other => panic!("unexpected {other:?}"),
    }
    let streamed = emu
        .wait_for_audit(|e| e.resource == "configmaps" && e.verb == "watch")
        .await;
    assert_eq!(streamed.code, 200);
    assert!(
        !emu.audit_entries()
            .iter()
            .any(|e| e.resource == "configmaps" && e.verb == "list"),
        "a streaming list must not LIST"
    );
}

#[tokio::test]
async fn aggregated_cluster_roles_grant_the_rules_they_select() {
    let emu = emulator().await;
    emu.apply_yaml(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: widget-viewer}
aggregationRule:
  clusterRoleSelectors: [{matchLabels: {example.com/aggregate-to-viewer: "true"}}]
rules: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: widget-get, labels: {example.com/aggregate-to-viewer: "true"}}
rules: [{apiGroups: [example.com], resources: [widgets], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: dev-view, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: widget-viewer}
subjects: [{kind: User, name: dev}]
"#,
    )
    .unwrap();
    emu.apply_yaml("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: default}\nspec: {size: s}\n").unwrap();
    let dev = emu
        .client_for_token(&emu.token_for_user("dev", &[]))
        .await
        .unwrap();
    let api: Api<Widget> = Api::namespaced(dev, "default");
    assert!(api.get("w").await.is_ok());
    assert_eq!(
        api_err(api.list(&ListParams::default()).await.unwrap_err()).code,
        403
    );
}
