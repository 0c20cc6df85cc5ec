//! What the chart's tests share: the paths of the chart and of the tools
//! `scripts/setup.sh --k8s MINOR` installs under `.tools/` (a real Helm 4 and
//! kubernetes-validate), and `helm` runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `charts/tuna-k8s-operator`.
pub fn chart_dir() -> PathBuf {
    root().join("charts/tuna-k8s-operator")
}

/// The release and namespace of the product documentation's install command.
pub const RELEASE: &str = "tuna-operator";
pub const NAMESPACE: &str = "tuna-system";

fn tool(env: &str, relative: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(relative));
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh --k8s 1.37 (it installs it under .tools/), or set {env}",
        path.display()
    );
    path
}

/// The Helm 4 binary (`HELM` or `.tools/bin/helm`).
pub fn helm_bin() -> PathBuf {
    tool("HELM", ".tools/bin/helm")
}

/// kubernetes-validate (`KUBERNETES_VALIDATE` or `.tools/venv/bin/kubernetes-validate`).
pub fn kubernetes_validate_bin() -> PathBuf {
    tool("KUBERNETES_VALIDATE", ".tools/venv/bin/kubernetes-validate")
}

/// Runs helm with `args` in the directory `home`, its state (repositories,
/// cache) there too, never a default kubeconfig: without one it would talk
/// to localhost:8080.
pub fn helm(home: &Path, args: &[&str], kubeconfig: Option<&Path>) -> Output {
    let mut command = Command::new(helm_bin());
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(home)
        .stdin(Stdio::null());
    match kubeconfig {
        Some(k) => command.env("KUBECONFIG", k),
        None => command.env("KUBECONFIG", home.join("no-cluster.kubeconfig")),
    };
    command.output().expect("helm runs")
}

/// Output as text: stdout then stderr.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `helm template` of the chart as the documentation's release, with a
/// values file; Ok(stdout) or Err(stdout+stderr).
pub fn template(home: &Path, values: &str, extra: &[&str]) -> Result<String, String> {
    let file = home.join(format!("values-{}.yaml", rand_suffix()));
    std::fs::write(&file, values).unwrap();
    let chart = chart_dir();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        "1.32.0",
        "-f",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = helm(home, &args, None);
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(text(&out))
    }
}

fn rand_suffix() -> String {
    use rand::Rng;
    format!("{:08x}", rand::rng().random::<u32>())
}

/// The documents of a multi-document YAML render, as JSON values (nulls dropped).
pub fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(yaml)
        .expect("rendered YAML parses")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}
