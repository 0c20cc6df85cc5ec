//! The emulator driven by the real kubectl (v1.32): every command the operator's users run.

mod common;

use std::process::Stdio;

use common::{Kubectl, Widget, emulator, emulator_with, write};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use kube_emulator::{Emulator, Options};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const WIDGET: &str = "apiVersion: example.com/v1
kind: Widget
metadata:
  name: web
  namespace: default
spec:
  size: m
  replicas: 3
  color: red
";

/// Reads lines from a child's stdout until one satisfies `pred`.
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    pred: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut seen = Vec::new();
    while let Some(l) = lines.next_line().await.expect("read kubectl output") {
        let hit = pred(&l);
        seen.push(l);
        if hit {
            return seen;
        }
    }
    panic!("kubectl output ended before the expected line: {seen:?}");
}

#[tokio::test]
async fn apply_get_explain_describe_against_a_fresh_crd() {
    let emu = Emulator::start(Options::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(emu.kubeconfig_path());
    let crd = write(dir.path(), "crd.yaml", common::WIDGET_CRD);
    let w = write(dir.path(), "w.yaml", WIDGET);

    assert!(
        k.ok(&["apply", "-f", crd.to_str().unwrap()])
            .await
            .contains("customresourcedefinition.apiextensions.k8s.io/widgets.example.com created")
    );
    assert!(
        k.ok(&[
            "wait",
            "--for=condition=Established",
            "crd/widgets.example.com",
            "--timeout=20s"
        ])
        .await
        .contains("condition met")
    );
    assert!(
        k.ok(&["apply", "-f", w.to_str().unwrap()])
            .await
            .contains("widget.example.com/web created")
    );
    assert!(
        k.ok(&["apply", "-f", w.to_str().unwrap()])
            .await
            .contains("widget.example.com/web unchanged")
    );
    let w4 = write(
        dir.path(),
        "w4.yaml",
        &WIDGET.replace("replicas: 3", "replicas: 4"),
    );
    assert!(
        k.ok(&["apply", "-f", w4.to_str().unwrap()])
            .await
            .contains("widget.example.com/web configured")
    );

    // Server-side validation errors reach the user as the apiserver words them.
    let bad = write(
        dir.path(),
        "bad.yaml",
        &WIDGET.replace("size: m", "size: xl"),
    );
    let unknown = write(
        dir.path(),
        "unknown.yaml",
        &WIDGET.replace("color: red", "color: red\n  bogus: 1"),
    );
    let immutable = write(
        dir.path(),
        "imm.yaml",
        &WIDGET.replace("color: red", "color: blue"),
    );
    let (e1, e2, e3) = tokio::join!(
        k.fails(&["apply", "-f", bad.to_str().unwrap()]),
        k.fails(&["apply", "-f", unknown.to_str().unwrap()]),
        k.fails(&["apply", "-f", immutable.to_str().unwrap()]),
    );
    assert!(e1.contains("xl widgets are limited to 2 replicas"), "{e1}");
    assert!(e2.contains("unknown field \"spec.bogus\""), "{e2}");
    assert!(e3.contains("color is immutable"), "{e3}");

    // Server-side apply, then a conflicting manager.
    let w5 = write(
        dir.path(),
        "w5.yaml",
        &WIDGET.replace("replicas: 3", "replicas: 5"),
    );
    assert!(
        k.ok(&["apply", "--server-side", "-f", w5.to_str().unwrap()])
            .await
            .contains("serverside-applied")
    );
    let w6 = write(
        dir.path(),
        "w6.yaml",
        &WIDGET.replace("replicas: 3", "replicas: 6"),
    );
    let conflict = k
        .fails(&[
            "apply",
            "--server-side",
            "--field-manager",
            "other",
            "-f",
            w6.to_str().unwrap(),
        ])
        .await;
    assert!(conflict.contains("conflict"), "{conflict}");
    assert!(
        k.ok(&[
            "apply",
            "--server-side",
            "--field-manager",
            "other",
            "--force-conflicts",
            "-f",
            w6.to_str().unwrap()
        ])
        .await
        .contains("serverside-applied")
    );

    let (table, yaml, explain) = tokio::join!(
        k.ok(&["get", "widgets"]),
        k.ok(&["get", "widget", "web", "-o", "yaml"]),
        k.ok(&["explain", "widget.spec"]),
    );
    let mut rows = table.lines();
    let header: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    assert_eq!(header, vec!["NAME", "SIZE", "REPLICAS", "READY", "AGE"]);
    let row: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], &["web", "m", "6"]);
    let obj: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(obj["spec"]["replicas"], 6);
    assert_eq!(obj["metadata"]["generation"], 4);
    assert!(
        explain.contains("How big the widget is.") && explain.contains("size\t<string> -required-"),
        "{explain}"
    );

    // describe shows events published by kube-rs's Recorder (events.k8s.io/v1).
    let client = emu.client().await.unwrap();
    let widget = Api::<Widget>::namespaced(client.clone(), "default")
        .get("web")
        .await
        .unwrap();
    let recorder = Recorder::new(client.clone(), Reporter::from("widget-controller"));
    let ev = Event {
        type_: EventType::Warning,
        reason: "Degraded".into(),
        note: Some("backend unreachable".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    recorder
        .publish(&ev, &widget.object_ref(&()))
        .await
        .unwrap();
    let described = k.ok(&["describe", "widget", "web"]).await;
    assert!(described.contains("Name:         web"), "{described}");
    let event_line = described
        .lines()
        .find(|l| l.contains("Degraded"))
        .unwrap_or_else(|| panic!("no event in {described}"));
    assert!(
        event_line.contains("Warning")
            && event_line.contains("widget-controller")
            && event_line.contains("backend unreachable"),
        "{event_line}"
    );
}

#[tokio::test]
async fn get_watch_wait_and_delete_waiting_on_finalizers() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(emu.kubeconfig_path());
    let w = write(dir.path(), "w.yaml", WIDGET);
    k.ok(&["apply", "-f", w.to_str().unwrap()]).await;
    let api: Api<Widget> = Api::namespaced(emu.client().await.unwrap(), "default");

    let mut watch = k
        .command(&["get", "widgets", "-w"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    read_until(&mut lines, |l| l.starts_with("web")).await;

    let wait = k
        .command(&[
            "wait",
            "--for=condition=Ready",
            "widget/web",
            "--timeout=30s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // kubectl wait is waiting once it watches (seen in the audit log).
    // `get -w` watches too: wait for the second watch, kubectl wait's.
    emu.wait_for_audit_count(2, |e| e.resource == "widgets" && e.verb == "watch")
        .await;
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    api.patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let out = wait.wait_with_output().await.unwrap();
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout)
                .contains("widget.example.com/web condition met"),
        "{out:?}"
    );
    let seen = read_until(&mut lines, |l| l.starts_with("web") && l.contains("True")).await;
    assert!(
        seen.last().unwrap().split_whitespace().collect::<Vec<_>>()[..4]
            == ["web", "m", "3", "True"],
        "{seen:?}"
    );
    watch.kill().await.unwrap();

    // delete blocks while a finalizer is pending, and returns once it is removed.
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/cleanup"]}})),
    )
    .await
    .unwrap();
    let mut del = k
        .command(&["delete", "widget", "web"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let w0 = api.get("web").await.unwrap();
    kube::runtime::wait::await_condition(api.clone(), "web", |o: Option<&Widget>| {
        o.is_some_and(|o| o.meta().deletion_timestamp.is_some())
    })
    .await
    .unwrap();
    assert!(
        del.try_wait().unwrap().is_none(),
        "kubectl delete returned while a finalizer was pending"
    );
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let out = del.wait_with_output().await.unwrap();
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("widget.example.com \"web\" deleted"),
        "{out:?}"
    );
    kube::runtime::wait::await_condition(
        api.clone(),
        "web",
        kube::runtime::wait::conditions::is_deleted(&w0.uid().unwrap()),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn built_in_kinds_apply_with_strategic_merge() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(emu.kubeconfig_path());
    let v1 = "apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {a: \"1\"}
---
apiVersion: v1
kind: Service
metadata: {name: svc, labels: {app: web}}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}, {name: https, port: 443, targetPort: 8443}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  rules:
  - host: web.example.com
    http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: svc, port: {number: 80}}}}]
";
    let f = write(dir.path(), "v1.yaml", v1);
    let out = k.ok(&["apply", "-f", f.to_str().unwrap()]).await;
    assert!(
        out.contains("configmap/cfg created")
            && out.contains("service/svc created")
            && out.contains("ingress.networking.k8s.io/web created"),
        "{out}"
    );
    let v2 = v1
        .replace("a: \"1\"", "b: \"2\"")
        .replace(", {name: https, port: 443, targetPort: 8443}", "")
        .replace("targetPort: 8080", "targetPort: 9090");
    let f = write(dir.path(), "v2.yaml", &v2);
    let out = k.ok(&["apply", "-f", f.to_str().unwrap()]).await;
    assert!(
        out.contains("configmap/cfg configured")
            && out.contains("service/svc configured")
            && out.contains("ingress.networking.k8s.io/web unchanged"),
        "{out}"
    );
    let typo = write(
        dir.path(),
        "typo.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: typo}\nspec:\n  prots: [{port: 80}]\n",
    );
    let err = k.fails(&["apply", "-f", typo.to_str().unwrap()]).await;
    assert!(err.contains("unknown field \"spec.prots\""), "{err}");
    let (cm, ports, table) = tokio::join!(
        k.ok(&["get", "cm", "cfg", "-o", "jsonpath={.data}"]),
        k.ok(&["get", "svc", "svc", "-o", "jsonpath={.spec.ports}"]),
        k.ok(&["get", "ingress,svc,cm"]),
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&cm).unwrap(),
        json!({"b": "2"})
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&ports).unwrap(),
        json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 9090}])
    );
    assert!(
        table.contains("ingress.networking.k8s.io/web")
            && table.contains("service/svc")
            && table.contains("configmap/cfg"),
        "{table}"
    );
}

#[tokio::test]
async fn rbac_with_kubectl_as_a_service_account() {
    let emu = emulator().await;
    emu.apply_yaml(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: widget-reader, namespace: default}
rules: [{apiGroups: [example.com], resources: [widgets], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: op, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: widget-reader}
subjects: [{kind: ServiceAccount, name: op, namespace: default}]
",
    )
    .unwrap();
    emu.apply_yaml(WIDGET).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("op.kubeconfig");
    emu.write_service_account_kubeconfig("default", "op", &kc)
        .unwrap();
    let k = Kubectl::new(&kc);
    let (get, del, patch, can_list, can_delete, whoami) = tokio::join!(
        k.ok(&["get", "widgets"]),
        k.fails(&["delete", "widget", "web"]),
        k.fails(&["label", "widget", "web", "x=y"]),
        k.ok(&["auth", "can-i", "list", "widgets.example.com"]),
        k.run(&["auth", "can-i", "delete", "widgets.example.com"]),
        k.ok(&["auth", "whoami"]),
    );
    let list = k.ok(&["auth", "can-i", "--list"]).await;
    let widgets = list
        .lines()
        .find(|l| l.starts_with("widgets.example.com"))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(widgets.contains("[get list watch]"), "{widgets}");
    assert_eq!(can_list.trim(), "yes");
    assert_eq!(String::from_utf8_lossy(&can_delete.stdout).trim(), "no");
    assert!(
        whoami.contains("system:serviceaccount:default:op"),
        "{whoami}"
    );
    assert!(get.contains("web"), "{get}");
    assert!(del.contains("Error from server (Forbidden)") && del.contains("User \"system:serviceaccount:default:op\" cannot delete resource \"widgets\" in API group \"example.com\""), "{del}");
    assert!(
        patch.contains("cannot patch resource \"widgets\""),
        "{patch}"
    );
    assert!(
        emu.audit_entries()
            .iter()
            .any(|e| e.user == "system:serviceaccount:default:op"
                && e.verb == "delete"
                && e.code == 403)
    );
}

#[tokio::test]
async fn cli_loads_manifests_and_writes_kubeconfigs() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    write(&manifests, "00-crd.yaml", common::WIDGET_CRD);
    write(
        &manifests,
        "10-widget.yaml",
        &format!(
            "{WIDGET}---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: op, namespace: default}}\n"
        ),
    );
    let admin_kc = dir.path().join("admin.kubeconfig");
    let sa_kc = dir.path().join("op.kubeconfig");
    let audit = dir.path().join("audit.jsonl");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-emulator"))
        .arg("--kubeconfig-out")
        .arg(&admin_kc)
        .arg("--audit-log")
        .arg(&audit)
        .arg("--sa-kubeconfig")
        .arg(format!("default/op={}", sa_kc.display()))
        .arg("-f")
        .arg(&manifests)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let seen = read_until(&mut lines, |l| {
        l.contains("listening on https://127.0.0.1:")
    })
    .await;
    assert!(seen.iter().any(|l| l.contains("op.kubeconfig")), "{seen:?}");
    let admin = Kubectl::new(&admin_kc);
    let op = Kubectl::new(&sa_kc);
    let (table, denied) =
        tokio::join!(admin.ok(&["get", "widgets"]), op.fails(&["get", "widgets"]));
    assert!(table.contains("web"), "{table}");
    assert!(denied.contains("Forbidden"), "{denied}");
    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&audit).unwrap();
    let entries: Vec<kube_emulator::AuditEntry> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        entries
            .iter()
            .any(|e| e.user == "system:serviceaccount:default:op"
                && e.resource == "widgets"
                && e.verb == "list"
                && e.code == 403)
    );
}

#[tokio::test]
async fn plain_http_mode_serves_tokenless_kubectl_as_admin() {
    let emu = common::emulator_with(Options {
        tls: false,
        ..Options::default()
    })
    .await;
    assert!(emu.url().starts_with("http://"));
    let k = Kubectl::new(emu.kubeconfig_path());
    let out = k.ok(&["get", "namespaces"]).await;
    assert!(out.contains("default") && out.contains("Active"), "{out}");
}

#[tokio::test]
async fn imperative_create_commands_and_tokens() {
    let emu = emulator().await;
    let k = Kubectl::new(emu.kubeconfig_path());
    k.ok(&["create", "namespace", "apps"]).await;
    let (cm, secret, sa) = tokio::join!(
        k.ok(&[
            "-n",
            "apps",
            "create",
            "configmap",
            "cfg",
            "--from-literal=a=1"
        ]),
        k.ok(&[
            "-n",
            "apps",
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=key=s3cr3t"
        ]),
        k.ok(&["-n", "apps", "create", "serviceaccount", "bot"]),
    );
    assert!(
        cm.contains("configmap/cfg created")
            && secret.contains("secret/creds created")
            && sa.contains("serviceaccount/bot created")
    );
    let client = emu.client().await.unwrap();
    let s = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "apps")
        .get("creds")
        .await
        .unwrap();
    assert_eq!(s.data.unwrap()["key"].0, b"s3cr3t");
    // A token from `kubectl create token` authenticates as the ServiceAccount.
    let token = k.ok(&["-n", "apps", "create", "token", "bot"]).await;
    let review = Api::<k8s_openapi::api::authentication::v1::TokenReview>::all(client)
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({"spec": {"token": token.trim()}})).unwrap(),
        )
        .await
        .unwrap();
    let status = review.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(
        status.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:apps:bot")
    );
    k.ok(&["delete", "namespace", "apps"]).await;
    assert!(
        k.fails(&["get", "namespace", "apps"])
            .await
            .contains("NotFound")
    );
}

/// Every `kubectl create` generator of a kind the emulator serves sends a
/// protobuf body; each is decoded into the object kubectl meant (read back as
/// JSON), and the RBAC objects made this way are enforced.
#[tokio::test]
async fn kubectl_create_generators_send_protobuf_bodies_that_are_decoded() {
    let emu = emulator().await;
    let k = Kubectl::new(emu.kubeconfig_path());
    k.ok(&["create", "namespace", "gen"]).await;
    let n = |args: &[&str]| {
        let mut v = vec!["-n", "gen", "create"];
        v.extend_from_slice(args);
        k.ok(&v)
    };
    let created = [
        n(&[
            "role",
            "reader",
            "--verb=get,list",
            "--resource=configmaps,secrets",
            "--resource-name=app",
        ])
        .await,
        n(&[
            "rolebinding",
            "reader",
            "--role=reader",
            "--serviceaccount=gen:bot",
            "--user=alice",
            "--group=devs",
        ])
        .await,
        k.ok(&[
            "create",
            "clusterrole",
            "metrics",
            "--verb=get",
            "--non-resource-url=/metrics",
            "--non-resource-url=/healthz",
        ])
        .await,
        k.ok(&[
            "create",
            "clusterrole",
            "aggregate",
            "--aggregation-rule=rbac.example.com/aggregate-to-x=true",
        ])
        .await,
        k.ok(&[
            "create",
            "clusterrolebinding",
            "metrics",
            "--clusterrole=metrics",
            "--serviceaccount=gen:bot",
        ])
        .await,
        n(&[
            "deployment",
            "web",
            "--image=registry.example/web:1.2",
            "--replicas=0",
            "--port=8080",
            "--",
            "web",
            "--listen=:8080",
        ])
        .await,
        n(&["service", "clusterip", "web", "--tcp=80:8080"]).await,
        n(&[
            "ingress",
            "web",
            "--class=tuna",
            "--rule=web.example.com/api*=web:80",
            "--annotation=example.com/team=web",
        ])
        .await,
        n(&[
            "poddisruptionbudget",
            "web",
            "--selector=app=web",
            "--min-available=50%",
        ])
        .await,
        n(&["serviceaccount", "bot"]).await,
    ];
    for out in &created {
        assert!(out.contains(" created"), "{out}");
    }
    let kubeconfig = emu.kubeconfig_path().to_owned();
    let get = |what: &str| {
        let out = Kubectl::new(&kubeconfig).ok(&["-n", "gen", "get", what, "-o", "json"]);
        async move { serde_json::from_str::<serde_json::Value>(&out.await).unwrap() }
    };
    let role = get("role/reader").await;
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "resourceNames": ["app"], "verbs": ["get", "list"]}])
    );
    assert_eq!(role["metadata"]["namespace"], "gen");
    assert!(role["metadata"]["creationTimestamp"].is_string());
    let binding = get("rolebinding/reader").await;
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
               {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "devs"},
               {"kind": "ServiceAccount", "name": "bot", "namespace": "gen"}])
    );
    let cr = get("clusterrole/metrics").await;
    assert_eq!(
        cr["rules"],
        json!([{"nonResourceURLs": ["/metrics", "/healthz"], "verbs": ["get"]}])
    );
    let aggregate = get("clusterrole/aggregate").await;
    assert_eq!(
        aggregate["aggregationRule"],
        json!({"clusterRoleSelectors": [{"matchLabels": {"rbac.example.com/aggregate-to-x": "true"}}]})
    );
    let deploy = get("deployment/web").await;
    assert_eq!(deploy["spec"]["replicas"], 0, "a set zero is kept");
    assert_eq!(
        deploy["spec"]["selector"],
        json!({"matchLabels": {"app": "web"}})
    );
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/web:1.2");
    assert_eq!(container["command"], json!(["web", "--listen=:8080"]));
    // Go's encoder writes unset non-pointer numbers as 0; a zero is kept, since
    // the wire cannot tell it from a set pointer (`replicas: 0` above).
    assert_eq!(
        container["ports"],
        json!([{"containerPort": 8080, "hostPort": 0}])
    );
    assert!(container.get("terminationMessagePath").is_none());
    let svc = get("service/web").await;
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "80-8080", "nodePort": 0, "port": 80, "protocol": "TCP", "targetPort": 8080}])
    );
    let ing = get("ingress/web").await;
    assert_eq!(ing["metadata"]["annotations"]["example.com/team"], "web");
    assert_eq!(ing["spec"]["ingressClassName"], "tuna");
    assert_eq!(
        ing["spec"]["rules"][0],
        json!({"host": "web.example.com", "http": {"paths": [{"path": "/api", "pathType": "Prefix",
            "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}})
    );
    let pdb = get("pdb/web").await;
    assert_eq!(
        pdb["spec"]["minAvailable"], "50%",
        "IntOrString as a string"
    );

    // The Role and RoleBinding made by kubectl are enforced.
    emu.apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: gen}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: gen}\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("bot.kubeconfig");
    emu.write_service_account_kubeconfig("gen", "bot", &kc)
        .unwrap();
    let bot = Kubectl::new(&kc);
    bot.ok(&["-n", "gen", "get", "configmap", "app"]).await;
    assert!(
        bot.fails(&["-n", "gen", "get", "configmap", "other"])
            .await
            .contains("Forbidden")
    );
    assert!(
        emu.audit_entries()
            .iter()
            .filter(|e| e.user_agent.starts_with("kubectl") && e.verb == "create")
            .all(|e| e.code == 201),
        "every create was accepted"
    );
}

/// Token lifetimes and audiences as the API server has them: `kubectl create
/// token` refuses durations under ten minutes; a token for another audience
/// is no API credential, and a TokenReview authenticates it only for that
/// audience; an expired token authenticates nothing.
#[tokio::test]
async fn token_requests_have_a_floor_and_tokens_an_audience() {
    let emu = emulator().await;
    let k = Kubectl::new(emu.kubeconfig_path());
    k.ok(&["create", "namespace", "apps"]).await;
    k.ok(&["-n", "apps", "create", "serviceaccount", "bot"])
        .await;
    let short = k
        .fails(&["-n", "apps", "create", "token", "bot", "--duration", "5m"])
        .await;
    assert!(
        short.contains("may not specify a duration less than 10 minutes"),
        "{short}"
    );
    let dir = tempfile::tempdir().unwrap();
    let review = |token: &str, audiences: &[&str]| {
        let spec = if audiences.is_empty() {
            json!({"token": token})
        } else {
            json!({"token": token, "audiences": audiences})
        };
        let manifest =
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec});
        write(dir.path(), "review.json", &manifest.to_string())
    };
    let proxy_token = k
        .ok(&[
            "-n",
            "apps",
            "create",
            "token",
            "bot",
            "--audience",
            "connectors.example.com",
            "--duration",
            "30m",
        ])
        .await;
    let proxy_token = proxy_token.trim();
    // Not for the API server: kubectl with it is unauthorized.
    let kc = dir.path().join("bot.kubeconfig");
    emu.write_kubeconfig(&kc, proxy_token).unwrap();
    let as_bot = Kubectl::new(&kc);
    let denied = as_bot.fails(&["auth", "whoami"]).await;
    assert!(denied.contains("Unauthorized"), "{denied}");
    // A review for its audience authenticates it, and says for which.
    let path = review(proxy_token, &["connectors.example.com", "other"]);
    let out = k.create_json(&path).await;
    assert_eq!(out["status"]["authenticated"], true, "{out}");
    assert_eq!(
        out["status"]["user"]["username"],
        "system:serviceaccount:apps:bot"
    );
    assert_eq!(
        out["status"]["audiences"],
        json!(["connectors.example.com"])
    );
    // A review for the API server's audience (the default) does not.
    let path = review(proxy_token, &[]);
    let out = k.create_json(&path).await;
    assert_ne!(out["status"]["authenticated"], true, "{out}");
    assert!(
        out["status"]["error"]
            .as_str()
            .unwrap()
            .contains("audiences"),
        "{out}"
    );
    // A token of the API server reviewed without audiences: authenticated
    // for the API server's own, which status.audiences names (a client that
    // asked for its own audience must find it there).
    let api_token = k
        .ok(&["-n", "apps", "create", "token", "bot", "--duration", "30m"])
        .await;
    let out = k.create_json(&review(api_token.trim(), &[])).await;
    assert_eq!(out["status"]["authenticated"], true, "{out}");
    assert_eq!(
        out["status"]["audiences"],
        json!([kube_emulator::API_AUDIENCE]),
        "{out}"
    );
    // Expired: nothing.
    assert!(emu.expire_token(proxy_token));
    let path = review(proxy_token, &["connectors.example.com"]);
    let out = k.create_json(&path).await;
    assert_ne!(out["status"]["authenticated"], true, "{out}");
    assert!(
        out["status"]["error"].as_str().unwrap().contains("expired"),
        "{out}"
    );
}

/// A paged list is one consistent snapshot, as the API server serves it
/// from etcd at the first page's revision: later pages show the objects as
/// they were then (a change or deletion after the first page is not in
/// them) and every page reports that resourceVersion, so that a client
/// that lists in pages and then watches from the list's resourceVersion
/// (kube-runtime's reflector, client-go's) misses no event. A token older
/// than the kept history is 410 Gone; a malformed one 400; kubectl's own
/// `--chunk-size` paging lists everything.
#[tokio::test]
async fn paged_lists_are_one_snapshot() {
    let emu = emulator_with(Options {
        watch_history: 50,
        ..Options::default()
    })
    .await;
    let k = Kubectl::new(emu.kubeconfig_path());
    for name in ["a", "b", "c"] {
        k.ok(&["create", "configmap", name, "--from-literal=v=1"])
            .await;
    }
    let page = |url: String| {
        let k = &k;
        async move {
            serde_json::from_str::<serde_json::Value>(&k.ok(&["get", "--raw", &url]).await).unwrap()
        }
    };
    let base = "/api/v1/namespaces/default/configmaps?limit=1";
    let first = page(base.to_string()).await;
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(first["items"][0]["metadata"]["name"], "a");
    assert_eq!(first["metadata"]["remainingItemCount"], 2);
    // After the first page: c changes, b goes, d comes.
    k.ok(&["patch", "configmap", "c", "-p", r#"{"data":{"v":"2"}}"#])
        .await;
    k.ok(&["delete", "configmap", "b"]).await;
    k.ok(&["create", "configmap", "d", "--from-literal=v=1"])
        .await;

    let mut names = vec![];
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
    loop {
        let p = page(format!("{base}&continue={token}")).await;
        assert_eq!(p["metadata"]["resourceVersion"], rv.as_str(), "{p}");
        let item = &p["items"][0];
        names.push(item["metadata"]["name"].as_str().unwrap().to_string());
        if item["metadata"]["name"] == "c" {
            assert_eq!(item["data"]["v"], "1", "c as it was at {rv}: {item}");
        }
        match p["metadata"]["continue"].as_str() {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    assert_eq!(names, ["b", "c"], "the snapshot's objects, not today's");
    // A fresh list sees today's objects, at today's resourceVersion.
    let now = page("/api/v1/namespaces/default/configmaps".into()).await;
    let now_names: Vec<_> = now["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(now_names, ["a", "c", "d"]);
    assert_ne!(now["metadata"]["resourceVersion"], rv.as_str());
    // kubectl's own paging.
    let out = k
        .ok(&["get", "configmaps", "--chunk-size=1", "-o", "name"])
        .await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["configmap/a", "configmap/c", "configmap/d"]
    );

    // Once the history has moved past the snapshot, its token is too old.
    for i in 0..60 {
        k.ok(&["label", "configmap", "a", &format!("n={i}"), "--overwrite"])
            .await;
    }
    let gone = k
        .fails(&[
            "get",
            "--raw",
            &format!(
                "{base}&continue={token_a}",
                token_a = first["metadata"]["continue"].as_str().unwrap()
            ),
        ])
        .await;
    assert!(gone.contains("too old"), "{gone}");
    let bad = k
        .fails(&["get", "--raw", &format!("{base}&continue=bm90LWEtdG9rZW4")])
        .await;
    assert!(bad.contains("continue key is not valid"), "{bad}");
}

/// `kubectl create token --bound-object-kind Pod`: as the API server, the
/// Pod must exist, match the uid and run as the ServiceAccount; the token
/// names the Pod in a TokenReview and dies with it.
#[tokio::test]
async fn tokens_bound_to_a_pod_die_with_it() {
    let emu = emulator().await;
    let k = Kubectl::new(emu.kubeconfig_path());
    k.ok(&["create", "namespace", "apps"]).await;
    k.ok(&["-n", "apps", "create", "serviceaccount", "bot"])
        .await;
    let dir = tempfile::tempdir().unwrap();
    let pod = write(
        dir.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: runner, namespace: apps}\nspec:\n  serviceAccountName: bot\n  containers: [{name: c, image: busybox}]\n",
    );
    k.ok(&["apply", "-f", pod.to_str().unwrap()]).await;
    let uid = k
        .ok(&[
            "-n",
            "apps",
            "get",
            "pod",
            "runner",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await;
    let bound = |name: &str, uid: &str| {
        let mut args = vec![
            "-n".to_owned(),
            "apps".into(),
            "create".into(),
            "token".into(),
            "bot".into(),
            "--audience".into(),
            "connectors.example.com".into(),
            "--bound-object-kind".into(),
            "Pod".into(),
            "--bound-object-name".into(),
            name.into(),
        ];
        if !uid.is_empty() {
            args.extend(["--bound-object-uid".into(), uid.to_owned()]);
        }
        args
    };
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let missing = k.fails(&refs(&bound("gone", ""))).await;
    assert!(missing.contains("pods \"gone\" not found"), "{missing}");
    let wrong_uid = k.fails(&refs(&bound("runner", "0000"))).await;
    assert!(
        wrong_uid.contains("does not match the UID in record"),
        "{wrong_uid}"
    );
    k.ok(&["-n", "apps", "create", "serviceaccount", "other"])
        .await;
    let mut other = bound("runner", &uid);
    other[4] = "other".into();
    let other_sa = k.fails(&refs(&other)).await;
    assert!(
        other_sa.contains("different serviceaccount name"),
        "{other_sa}"
    );
    let token = k.ok(&refs(&bound("runner", &uid))).await;
    let token = token.trim().to_owned();
    let review = || {
        let manifest = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": ["connectors.example.com"]}});
        write(dir.path(), "review.json", &manifest.to_string())
    };
    let path = review();
    let out = k.create_json(&path).await;
    assert_eq!(out["status"]["authenticated"], true, "{out}");
    assert_eq!(
        out["status"]["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["runner"])
    );
    assert_eq!(
        out["status"]["user"]["extra"]["authentication.kubernetes.io/pod-uid"],
        json!([uid])
    );
    k.ok(&["-n", "apps", "delete", "pod", "runner", "--wait=false"])
        .await;
    let out = k.create_json(&path).await;
    assert_ne!(
        out["status"]["authenticated"], true,
        "the pod is gone: {out}"
    );
}

/// What a CSI driver's chart installs: a DaemonSet (apps/v1) and a
/// CSIDriver (storage.k8s.io/v1, cluster-scoped), typed like the API server
/// (an unknown field is refused by `kubectl apply`'s strict validation).
#[tokio::test]
async fn daemonsets_and_csidrivers_apply_and_read_back() {
    let emu = emulator().await;
    let k = Kubectl::new(emu.kubeconfig_path());
    let dir = tempfile::tempdir().unwrap();
    let manifest = write(
        dir.path(),
        "driver.yaml",
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: example-csi}\nspec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral], requiresRepublish: true}\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: node-plugin, namespace: default}\nspec:\n  selector: {matchLabels: {app: node-plugin}}\n  template:\n    metadata: {labels: {app: node-plugin}}\n    spec: {containers: [{name: plugin, image: busybox}]}\n",
    );
    k.ok(&["apply", "-f", manifest.to_str().unwrap()]).await;
    let driver: serde_json::Value = serde_json::from_str(
        &k.ok(&["get", "csidriver", "example-csi", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(driver["spec"]["volumeLifecycleModes"], json!(["Ephemeral"]));
    assert_eq!(driver["spec"]["requiresRepublish"], true);
    assert!(driver["metadata"]["namespace"].is_null(), "cluster-scoped");
    let ds = k.ok(&["get", "ds", "-n", "default", "-o", "name"]).await;
    assert_eq!(ds.trim(), "daemonset.apps/node-plugin");
    let typo = write(
        dir.path(),
        "typo.yaml",
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: typo-csi}\nspec: {attachRequird: false}\n",
    );
    let err = k.fails(&["apply", "-f", typo.to_str().unwrap()]).await;
    assert!(err.contains("attachRequird"), "{err}");
}

/// A policy whose CEL asks the authorizer whether the requester may `get`
/// the Secret a ConfigMap names, bound with Deny; one bound with Warn and
/// Audit; what kubectl prints for each, as against a real API server.
const SECRET_REF_POLICY: &str = "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: secret-refs.example.com}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [''], apiVersions: ['*'], operations: [CREATE, UPDATE], resources: [configmaps]}
  matchConditions:
  - name: names-a-secret
    expression: \"has(object.data) && 'secret' in object.data\"
  variables:
  - name: secret
    expression: object.data.secret
  validations:
  - expression: \"authorizer.group('').resource('secrets').namespace(request.namespace).name(variables.secret).check('get').allowed()\"
    reason: Forbidden
    messageExpression: \"request.userInfo.username + ' may not get Secret ' + variables.secret\"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: secret-refs.example.com}
spec: {policyName: secret-refs.example.com, validationActions: [Deny]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: team-label}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: ['*'], apiVersions: ['*'], operations: ['*'], resources: ['*']}
    objectSelector: {}
    namespaceSelector: {matchLabels: {audited: 'yes'}}
  validations:
  - expression: \"has(object.metadata.labels) && 'team' in object.metadata.labels\"
    message: label team is missing
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: team-label-warn}
spec: {policyName: team-label, validationActions: [Warn, Audit]}
";

#[tokio::test]
async fn validating_admission_policies_ask_the_authorizer_about_the_requester() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let admin = Kubectl::new(emu.kubeconfig_path());
    let policy = write(dir.path(), "policy.yaml", SECRET_REF_POLICY);
    let applied = admin.ok(&["apply", "-f", policy.to_str().unwrap()]).await;
    assert!(
        applied.contains(
            "validatingadmissionpolicy.admissionregistration.k8s.io/secret-refs.example.com created"
        ) && applied.contains(
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/team-label-warn created"
        ),
        "{applied}"
    );
    // Served like any built-in kind: discovery, get with columns, apply again.
    let listed = admin.ok(&["get", "validatingadmissionpolicies"]).await;
    let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"],
        "{listed}"
    );
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("secret-refs.example.com")
                && l.split_whitespace().nth(1) == Some("1")
                && l.contains("<unset>")),
        "{listed}"
    );
    let bindings = admin
        .ok(&["get", "validatingadmissionpolicybindings"])
        .await;
    assert!(
        bindings
            .lines()
            .any(|l| l.starts_with("team-label-warn") && l.contains("team-label")),
        "{bindings}"
    );
    assert!(
        admin
            .ok(&["apply", "-f", policy.to_str().unwrap()])
            .await
            .contains("secret-refs.example.com unchanged")
    );

    // alice may get Secret db (by name); bob may not. Both may write ConfigMaps.
    emu.apply_yaml(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmap-writer, namespace: default}
rules: [{apiGroups: [''], resources: [configmaps], verbs: [get, list, create, update, patch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: db-secret-reader, namespace: default}
rules: [{apiGroups: [''], resources: [secrets], resourceNames: [db], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: writers, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-writer}
subjects: [{kind: User, name: alice}, {kind: User, name: bob}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-reads-db, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: db-secret-reader}
subjects: [{kind: User, name: alice}]
",
    )
    .unwrap();
    let as_user = |name: &str| {
        let path = dir.path().join(format!("{name}.kubeconfig"));
        emu.write_kubeconfig(&path, &emu.token_for_user(name, &[]))
            .unwrap();
        Kubectl::new(&path)
    };
    let (alice, bob) = (as_user("alice"), as_user("bob"));
    let cm = write(
        dir.path(),
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: default}\ndata: {secret: db, mode: a}\n",
    );
    let cm = cm.to_str().unwrap();

    // bob: refused with the policy's message, worded as the API server's.
    let refused = bob.fails(&["apply", "-f", cm]).await;
    assert_eq!(
        refused.trim(),
        format!(
            "Error from server (Forbidden): error when creating \"{cm}\": configmaps \"app\" is forbidden: ValidatingAdmissionPolicy 'secret-refs.example.com' with binding 'secret-refs.example.com' denied request: bob may not get Secret db"
        ),
    );
    // alice: allowed (the authorizer honours resourceNames).
    assert!(
        alice
            .ok(&["apply", "-f", cm])
            .await
            .contains("configmap/app created")
    );
    // An update by bob is judged too: merge patch, server-side apply.
    let patched = bob
        .fails(&[
            "patch",
            "configmap",
            "app",
            "-p",
            "{\"data\":{\"mode\":\"b\"}}",
        ])
        .await;
    assert!(
        patched.contains("Error from server (Forbidden): configmaps \"app\" is forbidden: ValidatingAdmissionPolicy 'secret-refs.example.com' with binding 'secret-refs.example.com' denied request: bob may not get Secret db"),
        "{patched}"
    );
    let ssa = bob
        .fails(&["apply", "--server-side", "--force-conflicts", "-f", cm])
        .await;
    assert!(ssa.contains("bob may not get Secret db"), "{ssa}");
    // A ConfigMap naming no Secret: the match condition skips the policy.
    let plain = write(
        dir.path(),
        "plain.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain, namespace: default}\ndata: {mode: a}\n",
    );
    bob.ok(&["apply", "-f", plain.to_str().unwrap()]).await;
    assert_eq!(
        alice
            .ok(&["get", "configmap", "app", "-o", "jsonpath={.data.mode}"])
            .await,
        "a",
        "nothing bob sent was stored"
    );

    // Warn + Audit: the write goes through, kubectl prints the warning, the
    // audit entry carries the failure. The namespace selector picks
    // namespaces labelled audited=yes only.
    admin
        .ok(&["label", "namespace", "default", "audited=yes"])
        .await;
    let warned = alice
        .run(&[
            "create",
            "configmap",
            "unlabelled",
            "--from-literal",
            "mode=a",
        ])
        .await;
    assert!(warned.status.success(), "{warned:?}");
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(
        stderr.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'team-label' with binding 'team-label-warn': label team is missing"),
        "{stderr}"
    );
    // A refusal carries the warnings of the other bindings.
    let other = write(
        dir.path(),
        "other.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: default}\ndata: {secret: db}\n",
    );
    let both = bob.run(&["apply", "-f", other.to_str().unwrap()]).await;
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert!(
        !both.status.success()
            && stderr
                .contains("Warning: Validation failed for ValidatingAdmissionPolicy 'team-label'")
            && stderr.contains("bob may not get Secret db"),
        "{stderr}"
    );
    let entry = emu
        .audit_entries()
        .into_iter()
        .find(|e| {
            e.user == "alice"
                && e.verb == "create"
                && e.name.is_empty()
                && e.code == 201
                && !e.annotations.is_empty()
        })
        .expect("an audit entry with the failure");
    let failure: serde_json::Value = serde_json::from_str(
        &entry.annotations["validation.policy.admission.k8s.io/validation_failure"],
    )
    .unwrap();
    assert_eq!(failure[0]["policy"], "team-label");
    assert_eq!(failure[0]["message"], "label team is missing");

    // DELETE is judged too (object null, oldObject the stored one), also for
    // the admin; a validation without reason is Invalid (422), which
    // kubectl prints from the cause without a field: `is invalid: : …`, as
    // the Kubernetes documentation of ValidatingAdmissionPolicy shows it.
    admin
        .ok(&["label", "configmap", "app", "protected=yes"])
        .await;
    let protect = write(
        dir.path(),
        "protect.yaml",
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: keep-protected}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [''], apiVersions: [v1], operations: [DELETE], resources: [configmaps]}]
    objectSelector: {matchLabels: {protected: 'yes'}}
  validations:
  - expression: object != null
    messageExpression: \"'configmap ' + oldObject.metadata.name + ' is protected'\"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: keep-protected}
spec: {policyName: keep-protected, validationActions: [Deny]}
",
    );
    admin.ok(&["apply", "-f", protect.to_str().unwrap()]).await;
    let kept = admin.fails(&["delete", "configmap", "app"]).await;
    assert!(
        kept.contains("The configmaps \"app\" is invalid: : ValidatingAdmissionPolicy 'keep-protected' with binding 'keep-protected' denied request: configmap app is protected"),
        "{kept}"
    );
    admin.ok(&["delete", "configmap", "plain"]).await;

    // Parameters are not implemented: such a policy is refused, saying so.
    let with_params = write(
        dir.path(),
        "params.yaml",
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: with-params}\nspec:\n  paramKind: {apiVersion: v1, kind: ConfigMap}\n  matchConstraints: {resourceRules: [{apiGroups: [''], apiVersions: ['*'], operations: [CREATE], resources: [pods]}]}\n  validations: [{expression: 'true'}]\n",
    );
    let err = admin
        .fails(&["apply", "-f", with_params.to_str().unwrap()])
        .await;
    assert!(
        err.contains(
            "spec.paramKind: Forbidden: kube-emulator does not implement policy parameters"
        ),
        "{err}"
    );
    // And an expression that does not compile is refused at creation.
    let broken = write(
        dir.path(),
        "broken.yaml",
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: broken}\nspec:\n  matchConstraints: {resourceRules: [{apiGroups: [''], apiVersions: ['*'], operations: [CREATE], resources: [pods]}]}\n  validations: [{expression: 'object.spec.(('}]\n",
    );
    let err = admin
        .fails(&["apply", "-f", broken.to_str().unwrap()])
        .await;
    assert!(
        err.contains("spec.validations[0].expression: Invalid value")
            && err.contains("compilation failed"),
        "{err}"
    );
    // Deny and Warn together are refused, as by the API server.
    let both = write(
        dir.path(),
        "both.yaml",
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: both}\nspec: {policyName: team-label, validationActions: [Deny, Warn]}\n",
    );
    let err = admin.fails(&["apply", "-f", both.to_str().unwrap()]).await;
    assert!(err.contains("must not contain both Deny and Warn"), "{err}");
}
