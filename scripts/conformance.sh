#!/usr/bin/env bash
# The official Gateway API conformance suite (sigs.k8s.io/gateway-api
# v1.6.1, pinned with its go.sum in conformance/gateway-api/) against
# tuna-operator on a real node, pulling nothing:
#
#   scripts/conformance.sh [--k8s MINOR] [--keep DIR] [--binary PATH] [-- SUITE-FLAGS...]
#
# 1. what the node needs (scripts/setup.sh --node), this checkout's debug
#    binary, the suite's test binary and its echo backend
#    (conformance/echo-basic of the same module);
# 2. the backend images under the names the suite's base manifests use
#    (registry.k8s.io/gateway-api/echo-basic:v1.5.1, :v1.6.0-dev.2,
#    :v1.6.0-dev.3, registry.k8s.io/coredns/coredns:v1.12.2), each one static
#    binary committed by buildah from `scratch` (the CoreDNS one is the
#    node's own CoreDNS build, run as root since a file capability cannot be
#    set in such an image and the manifest binds port 53);
# 3. a node (scripts/test-cluster.sh start --node), the Gateway API CRDs,
#    the product's image (scripts/image.sh --load), the self-hosted edge on
#    the host with a Gateway address pool (127.0.100.0/24: each Gateway gets
#    an address of its own there, which the suite on the host dials), and the
#    chart installed with helm as the node journey does;
# 4. the suite, profiles GATEWAY-HTTP and GATEWAY-TCP against GatewayClass
#    `tuna`, its supported features inferred by the suite from the class's
#    status.supportedFeatures (no feature flags, no skip list). The report
#    goes unmodified to conformance/reports/<channel>-<version>-default-report.yaml.
#
# --binary PATH runs that tuna-operator binary (edge and image) instead of
# this checkout's debug build.
# SUITE-FLAGS are passed to the suite after ours (e.g.
# -timeout-config-overrides=GatewayMustHaveAddress:30, -run-test=NAME).
# The node is stopped at the end whatever happens (--keep DIR keeps the
# logs, the edge's data and the suite's output there). Root only; one node
# per machine: run it under `flock /work/node.lock` where several share one.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
k8s=1.37 keep="" binary=""
while [ $# -gt 0 ]; do
  case $1 in
    --k8s) k8s=${2:?--k8s needs a minor version}; shift 2 ;;
    --keep) keep=${2:?--keep needs a directory}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: scripts/conformance.sh [--k8s MINOR] [--keep DIR] [--binary PATH] [-- SUITE-FLAGS...]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "conformance: a node needs root" >&2; exit 1; }
log() { echo "conformance: $*" >&2; }

scripts/setup.sh --node --k8s "$k8s"
if [ -n "$binary" ]; then
  bin="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"
else
  target="${CARGO_TARGET_DIR:-target}"
  cargo build --locked --bin tuna-operator
  bin="$(cd "$target/debug" && pwd)/tuna-operator"
fi

if [ -n "$keep" ]; then mkdir -p "$keep"; work="$(cd "$keep" && pwd)"; else work="$(mktemp -d)"; fi
cluster="$work/cluster"
edge_pid=""
cleanup() {
  if [ -s "$cluster/kubeconfig" ]; then
    # What a failed run needs to be understood, before the node goes.
    kubectl --kubeconfig "$cluster/kubeconfig" -n tuna-system logs deploy/tuna-operator-agent >"$work/agent.log" 2>&1 || true
    kubectl --kubeconfig "$cluster/kubeconfig" get gatewayclass,gateway,httproute,tcproute -A -o yaml >"$work/gateway-api.yaml" 2>&1 || true
  fi
  [ -z "$edge_pid" ] || kill "$edge_pid" 2>/dev/null || true
  "$root/scripts/test-cluster.sh" stop --dir "$cluster" >/dev/null 2>&1 || true
  [ -n "$keep" ] || rm -rf "$work"
}
trap cleanup EXIT

# 1. The suite and its echo backend, from the pinned module.
suite_dir="$root/conformance/gateway-api"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
(cd "$suite_dir" && go test -c -o "$work/gateway-api.test" .)
(cd "$suite_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/echo-basic" \
  sigs.k8s.io/gateway-api/conformance/echo-basic)
gw_version=$(cd "$suite_dir" && go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api)

# 2. The backend images (as scripts/node-images.sh builds the node's own).
images="$root/.tools/images/gateway-api-$gw_version"
mkdir -p "$images"
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
store="$work/buildah"
B=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
archives=()
# image NAME:TAG BINARY USER: an archive of an image holding BINARY as its
# entrypoint, rebuilt only when BINARY changed.
image() {
  local ref=$1 binary=$2 user=$3 file ctr stamp
  file="$images/$(echo "$ref" | tr ':/' '__').tar"
  stamp="$(sha256sum "$binary" | cut -d' ' -f1) $user"
  if [ ! -f "$file" ] || [ "$(cat "$file.stamp" 2>/dev/null)" != "$stamp" ]; then
    ctr="$("${B[@]}" from scratch)"
    "${B[@]}" copy --quiet --chmod 0755 "$ctr" "$binary" "/$(basename "$binary")" >/dev/null
    "${B[@]}" config --user "$user" --entrypoint "[\"/$(basename "$binary")\"]" "$ctr"
    "${B[@]}" commit --quiet "$ctr" "$ref" >/dev/null
    "${B[@]}" rm "$ctr" >/dev/null
    rm -f "$file"
    "${B[@]}" push --quiet "$ref" "docker-archive:$file:$ref"
    echo "$stamp" >"$file.stamp"
    log "built $ref"
  fi
  archives+=("$file")
}
for tag in v1.5.1 v1.6.0-dev.2 v1.6.0-dev.3; do
  image "registry.k8s.io/gateway-api/echo-basic:$tag" "$work/echo-basic" 65532:65532
done
coredns="$root/.tools/k8s/coredns/coredns"
[ -x "$coredns" ] || conformance/k8s/build.sh --node >/dev/null
image registry.k8s.io/coredns/coredns:v1.12.2 "$coredns" 0:0

# 3. The node, the CRDs, the product, the edge, the chart.
t0=$SECONDS
scripts/test-cluster.sh start --version "$k8s" --node --dir "$cluster" >"$work/node-start.log" 2>&1 \
  || { cat "$work/node-start.log" >&2; exit 1; }
log "node started in $((SECONDS - t0)) s"
# shellcheck disable=SC1091
. "$cluster/cluster.env"
export KUBECONFIG="$cluster/kubeconfig"
kubectl apply --server-side -f "$(conformance/gateway-api/crds.sh)" >/dev/null
CARGO_TARGET_DIR="$work/image" scripts/image.sh --load "$cluster" --binary "$bin" >"$work/image.log" 2>&1 \
  || { cat "$work/image.log" >&2; exit 1; }
for a in "${archives[@]}"; do
  ctr --address "$CONTAINERD_ADDRESS" -n k8s.io images import "$a" >/dev/null
done

edge_data="$work/edge-data"
mkdir -p "$edge_data"
key=$("$bin" edge keys create --account default --scope tunnels:write --scope tunnels:connect --data-dir "$edge_data")
"$bin" edge --data-dir "$edge_data" --base-domain a.2na.am \
  --http-listen 127.0.0.1:0 --https-listen 127.0.0.1:0 \
  --agent-listen "$HOST_ADDRESS:0" --api-listen "$HOST_ADDRESS:0" \
  --tcp-bind 127.0.0.1 --tcp-port-range 31000-31019 \
  --gateway-addresses 127.0.100.0/24 --quota-gateway-addresses 128 \
  --addresses-file "$work/edge-addresses.json" >"$work/edge.log" 2>&1 &
edge_pid=$!
for _ in $(seq 600); do [ -s "$work/edge-addresses.json" ] && break; sleep 0.1; done
[ -s "$work/edge-addresses.json" ] || { cat "$work/edge.log" >&2; exit 1; }
field() { # the string field $1 of the edge's addresses file, or fail
  local v
  v=$(sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" "$work/edge-addresses.json")
  [ -n "$v" ] || { echo "conformance: no $1 in $work/edge-addresses.json" >&2; exit 1; }
  echo "$v"
}
api=$(field api); agent=$(field agent); ca_file=$(field caFile)
helm_home="$work/helm"
mkdir -p "$helm_home"
HOME="$helm_home" "${HELM:-$root/.tools/bin/helm}" install tuna-operator charts/tuna-k8s-operator -n tuna-system --create-namespace \
  --set "credentials.apiKey=$key" --set "edge.apiUrl=https://$api" \
  --set "edge.agentAddress=$agent" --set-file "edge.ca.pem=$ca_file" \
  --wait --timeout 180s >"$work/helm.log" 2>&1 || { cat "$work/helm.log" >&2; exit 1; }
kubectl wait --for=condition=Accepted gatewayclass/tuna --timeout=120s >/dev/null
log "product installed; GatewayClass tuna supports: $(kubectl get gatewayclass tuna -o jsonpath='{.status.supportedFeatures[*].name}')"

# 4. The suite.
version="$(sed -n 's/^version: //p' charts/tuna-k8s-operator/Chart.yaml)"
mkdir -p conformance/reports
report="$root/conformance/reports/standard-$version-default-report.yaml"
t0=$SECONDS
status=0
(cd "$suite_dir" && "$work/gateway-api.test" -test.run '^TestConformance$' -test.v -test.timeout 0 \
  -gateway-class=tuna -conformance-profiles=GATEWAY-HTTP,GATEWAY-TCP \
  -organization=tuna -project=tuna-operator -url=https://tuna.am -version="v$version" \
  -contact=https://tuna.am -report-output="$report" \
  -usable-address=127.0.100.254 -unusable-address=127.0.101.1 "$@") 2>&1 | tee "$work/suite.log" || status=$?
log "the suite took $((SECONDS - t0)) s; report: $report"
exit "$status"
