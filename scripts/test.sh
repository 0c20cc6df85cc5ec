#!/usr/bin/env bash
# The test command of the README: installs what the tests need, then runs the
# whole workspace's tests (unit, property, integration, end to end) in one build.
#
#   scripts/test.sh [--k8s MINOR] [cargo test arguments...]
#
# The cluster suites run on a real control plane of Kubernetes MINOR (1.37 by
# default, 1.34 the oldest supported; conformance/k8s/ pins both), started per
# test by scripts/test-cluster.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
k8s=${TUNA_TEST_K8S:-1.37}
if [ "${1:-}" = "--k8s" ]; then
  k8s=${2:?--k8s needs a minor version, e.g. 1.34}
  shift 2
fi
scripts/setup.sh --k8s "$k8s"
export RUST_BACKTRACE=1 TUNA_TEST_K8S="$k8s"
cargo test --workspace --locked "$@"
