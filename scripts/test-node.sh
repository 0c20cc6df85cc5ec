#!/usr/bin/env bash
# The journeys on a real node (tests/node, issue 38), alone: builds what the
# node needs once (scripts/setup.sh --node: Debian's containerd, runc, CNI
# plugins, iptables, buildah; kubelet, kube-scheduler, kube-proxy and CoreDNS
# from the pins of conformance/k8s), then runs the `node` test target, which
# starts its own node (scripts/test-cluster.sh start --node), loads the
# product's image built from the test build's own binary (scripts/image.sh
# --load --binary) and stops the node at the end, leaving the host as it was.
#
#   scripts/test-node.sh [--k8s MINOR] [-- TEST-ARGS...]
#
# Root only (a bridge, iptables chains, cgroups); one node per machine.
set -euo pipefail
cd "$(dirname "$0")/.."
k8s=1.37
while [ $# -gt 0 ]; do
  case $1 in
    --k8s) k8s=${2:?--k8s needs a minor version}; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: scripts/test-node.sh [--k8s MINOR] [-- TEST-ARGS...]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "test-node: a node needs root" >&2; exit 1; }
t0=$SECONDS
scripts/setup.sh --node --k8s "$k8s"
echo "test-node: setup (node binaries, packages) $((SECONDS - t0)) s" >&2
t0=$SECONDS
TUNA_TEST_K8S="$k8s" cargo test --locked --test node -- --nocapture "$@"
echo "test-node: the node journeys $((SECONDS - t0)) s" >&2
