//! Shared by the emulator's test binaries: the Widget test kind, an emulator with it loaded,
//! and a kubectl runner that fails loudly when kubectl is missing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use kube::CustomResource;
use kube_emulator::{Emulator, EmulatorHandle, Options};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The test CRD (status subresource, printer columns, CEL rules incl. a transition rule).
pub const WIDGET_CRD: &str = include_str!("../widget-crd.yaml");

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[kube(
    group = "example.com",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    pub size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema, PartialEq)]
pub struct WidgetStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema, PartialEq)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

pub fn widget(name: &str, size: &str, replicas: i64) -> Widget {
    let mut w = Widget::new(
        name,
        WidgetSpec {
            size: size.into(),
            replicas: Some(replicas),
            color: Some("red".into()),
        },
    );
    w.metadata.namespace = Some("default".into());
    w
}

/// An emulator (TLS, random port) with the Widget CRD loaded.
pub async fn emulator() -> EmulatorHandle {
    emulator_with(Options::default()).await
}

pub async fn emulator_with(opts: Options) -> EmulatorHandle {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let emu = Emulator::start(opts).await.expect("emulator starts");
    emu.apply_yaml(WIDGET_CRD).expect("widget CRD loads");
    emu
}

/// The kubectl binary. Missing kubectl is a failure, never a silent pass.
pub fn kubectl_bin() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "kubectl not found in PATH. These tests drive the real kubectl and must not pass without it. Install kubectl v1.32: \
             curl -fsSLo /usr/local/bin/kubectl https://dl.k8s.io/release/v1.32.4/bin/linux/amd64/kubectl && chmod +x /usr/local/bin/kubectl"
        )
    })
}

/// Runs kubectl against `kubeconfig` with a private discovery cache.
pub struct Kubectl {
    pub kubeconfig: PathBuf,
    pub cache: tempfile::TempDir,
}

impl Kubectl {
    pub fn new(kubeconfig: &Path) -> Self {
        Kubectl {
            kubeconfig: kubeconfig.to_path_buf(),
            cache: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(kubectl_bin());
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args);
        c.kill_on_drop(true);
        c
    }

    /// Builds the command at once so that several runs can be joined concurrently.
    pub fn run(&self, args: &[&str]) -> impl std::future::Future<Output = Output> + use<> {
        let mut c = self.command(args);
        async move { c.output().await.expect("kubectl runs") }
    }

    /// Runs and requires success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> impl std::future::Future<Output = String> + use<> {
        let label = format!("{args:?}");
        let run = self.run(args);
        async move {
            let out = run.await;
            assert!(
                out.status.success(),
                "kubectl {label} failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    }

    /// `kubectl create --validate=false -f PATH -o json` (a review, say: the
    /// server's answer is the object), parsed.
    pub async fn create_json(&self, path: &Path) -> serde_json::Value {
        let path = path.to_str().expect("UTF-8 path");
        let out = self
            .ok(&["create", "--validate=false", "-f", path, "-o", "json"])
            .await;
        serde_json::from_str(&out).expect("kubectl printed JSON")
    }

    /// Runs and requires failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> impl std::future::Future<Output = String> + use<> {
        let label = format!("{args:?}");
        let run = self.run(args);
        async move {
            let out = run.await;
            assert!(
                !out.status.success(),
                "kubectl {label} unexpectedly succeeded: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            String::from_utf8_lossy(&out.stderr).into_owned()
        }
    }
}

/// Writes `text` to a file in `dir` and returns its path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write manifest");
    p
}
