//! A real control plane for the benchmark examples: `scripts/test-cluster.sh`
//! (etcd, kube-apiserver, kube-controller-manager), stopped on drop. Shared
//! by `operator_bench` and `connector_bench` with `#[path]`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A control plane of `scripts/test-cluster.sh` in `dir`, stopped on drop.
pub struct TestCluster {
    dir: PathBuf,
}

impl TestCluster {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster.sh")
    }

    /// Starts Kubernetes `version` (`1.37`, `1.34`) in `dir`; returns once
    /// it is ready (the script waits on `/readyz`).
    pub fn start(version: &str, dir: &Path) -> Self {
        let out = Command::new(Self::script())
            .args(["start", "--version", version, "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .expect("scripts/test-cluster.sh runs");
        assert!(
            out.status.success(),
            "scripts/test-cluster.sh start failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            dir: dir.to_owned(),
        }
    }

    /// The admin kubeconfig the script wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// A client acting as the cluster's admin.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(self.kubeconfig()).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("kube config");
        kube::Client::try_from(config).expect("kube client")
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new(Self::script())
            .arg("stop")
            .arg("--dir")
            .arg(&self.dir)
            .status();
    }
}
