#!/usr/bin/env bash
# Scale benchmark of the operator's roles (a script, not a test), against the
# real binaries on loopback: a real Kubernetes control plane
# (scripts/test-cluster.sh; K8S=1.34 for the older one), tuna-operator edge,
# controller and agent. See benches/operator_bench.rs for what each scenario measures.
#
#   benches/operator.sh                 # the issue's figures (takes minutes)
#   COUNT=200 benches/operator.sh       # a quick run
#
# Release builds (the workspace's release profile: fat LTO).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
COUNT=${COUNT:-1000}
BIG=${BIG:-10000}
CHANGES=${CHANGES:-100}

echo "== building (release)"
cargo build --release --locked -p tuna-operator --bin tuna-operator --example operator_bench
scripts/setup.sh --k8s "${K8S:-1.37}"
BENCH=$TARGET/release/examples/operator_bench
RUN=("$BENCH" --k8s "${K8S:-1.37}" --operator "$TARGET/release/tuna-operator")

echo "== $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"${RUN[@]}" --scenario controller --count "$COUNT"
"${RUN[@]}" --scenario tunnels --count "$COUNT"
"${RUN[@]}" --scenario ingress-latency --count "$COUNT" --changes "$CHANGES"
if [ "$BIG" -gt 0 ]; then
  "${RUN[@]}" --scenario tunnels --count "$BIG"
fi
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
