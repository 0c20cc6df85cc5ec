#!/usr/bin/env bash
# Builds the tuna-operator OCI image here, pulling nothing from a container
# registry: the release binary and the root filesystem of the Dockerfile
# (scripts/image-rootfs.sh), committed by buildah from `scratch`. Then checks
# it: the image's user is 65532:65532 and it holds only the expected files;
# with podman (when this machine can run containers) the binary starts as that
# user with a read-only root filesystem, no capabilities and no privilege
# escalation, and serves its probes until it is stopped.
#
#   scripts/image.sh            # -> target/image/tuna-operator-<version>.oci.tar
#                               #    and target/image/tuna-operator.debug
#   scripts/image.sh --load DIR [--binary PATH]
#
# --load DIR imports the image into the containerd of the test node started
# by `scripts/test-cluster.sh start --node --dir DIR`, under the name and tag
# the chart's defaults use (image.repository:appVersion, so `helm install`
# with no image values runs it; no pull happens: the image is present), with
# the images the node suites use (scripts/node-images.sh: the echo backend);
# the node's pods are then the run check. --binary PATH puts PATH in the
# image instead of a release build: the node suites use the debug binary the
# test build made anyway (same code, `tuna-operator <version>`; the release
# build costs ~7 minutes on two cores).
#
# Needs buildah (and podman for the run check): apt-get install buildah podman.
set -euo pipefail
cd "$(dirname "$0")/.."
load="" binary=""
while [ $# -gt 0 ]; do
  case $1 in
    --load) load=$(cd "${2:?--load needs the test cluster DIR}" && pwd); shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    *) echo "usage: scripts/image.sh [--load DIR] [--binary PATH]" >&2; exit 2 ;;
  esac
done
if [ -n "$load" ]; then
  containerd_address="$(sed -n 's/^CONTAINERD_ADDRESS=//p' "$load/cluster.env" 2>/dev/null)"
  [ -n "$containerd_address" ] \
    || { echo "image: $load/cluster.env names no CONTAINERD_ADDRESS (scripts/test-cluster.sh start --node --dir $load)" >&2; exit 1; }
fi
target="${CARGO_TARGET_DIR:-target}"
version="$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/tuna-k8s-operator/Chart.yaml)"
repository="$(sed -n 's/^  repository: //p' charts/tuna-k8s-operator/values.yaml)"
image="$repository:$version"
out="$target/image"
mkdir -p "$out"

for tool in buildah; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "image: $tool not found: apt-get install buildah podman" >&2; exit 1
  fi
done
# Root in a container: no overlay mounts, no user namespaces.
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}" BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
# A private image store beside the output, removed on exit: nothing of a build
# stays in /var/lib/containers (each build would leave its image there).
store="$out/buildah"
buildah() { command buildah --root "$store/root" --runroot "$store/run" "$@"; }

if [ -z "$binary" ]; then
  echo "== cargo build --release (tuna-operator)"
  cargo build --release --locked -p tuna-operator --bin tuna-operator
  binary="$target/release/tuna-operator"
fi
# (Outputs captured, not piped into grep -q: with pipefail, grep's early exit
# would fail the pipeline.)
[ "$("$binary" --version)" = "tuna-operator $version" ] \
  || { echo "image: the binary is not version $version (Chart.yaml appVersion)" >&2; exit 1; }

echo "== root filesystem"
rootfs="$out/rootfs"
debug="$out/tuna-operator.debug"
scripts/image-rootfs.sh "$binary" "$rootfs" "$debug"
# Stripped, with its debug info beside it: no .debug_* section (but the
# loaded, 34-byte .debug_gdb_scripts) nor symbol table in the image's binary,
# a debuglink naming the kept file, and the line tables in that file.
shipped="$rootfs/usr/local/bin/tuna-operator"
left="$(readelf -SW "$shipped" | grep -E '\] \.(debug_|symtab)' | grep -v '\.debug_gdb_scripts' || true)"
[ -z "$left" ] || { echo "image: the image's binary is not stripped:" >&2; echo "$left" >&2; exit 1; }
link="$(readelf -p .gnu_debuglink "$shipped" 2>/dev/null | sed -n 's/^ *\[ *0\] *//p')"
[ "$link" = tuna-operator.debug ] || { echo "image: the binary's debuglink is '$link', not tuna-operator.debug" >&2; exit 1; }
sections="$(readelf -SW "$debug" 2>/dev/null || true)"
grep -q '\] \.debug_line ' <<<"$sections" || { echo "image: $debug holds no line tables" >&2; exit 1; }
echo "image: binary $(du -h "$binary" | cut -f1) built, $(du -h "$shipped" | cut -f1) shipped, debug info $(du -h "$debug" | cut -f1) in $debug"
(cd "$rootfs" && find . -type f | sort) > "$out/files.txt"
cat "$out/files.txt"
unexpected="$(grep -vE '^\./(usr/local/bin/tuna-operator|etc/(passwd|group|ssl/certs/ca-certificates\.crt)|(usr/)?lib(64|/x86_64-linux-gnu)/(ld-linux-x86-64\.so\.2|lib(c|m|gcc_s)\.so\.[0-9]+))$' "$out/files.txt" || true)"
if [ -n "$unexpected" ]; then
  echo "image: unexpected files in the image:" >&2; echo "$unexpected" >&2; exit 1
fi
for required in usr/local/bin/tuna-operator lib64/ld-linux-x86-64.so.2 etc/ssl/certs/ca-certificates.crt etc/passwd; do
  grep -qx "./$required" "$out/files.txt" || { echo "image: $required is missing" >&2; exit 1; }
done

echo "== buildah from scratch"
# buildah's network setup makes /etc/cni/net.d (with a lock) even for a
# build that runs nothing: removed again if it was not there before.
# Likewise its blob-info cache in /var/lib/containers/cache, whatever --root says.
cni_made=""; [ -e /etc/cni ] || cni_made=1
containers_made=""; [ -e /var/lib/containers ] || containers_made=1
forget_cni() {
  if [ -n "$cni_made" ]; then rm -f /etc/cni/net.d/cni.lock; rmdir /etc/cni/net.d /etc/cni 2>/dev/null || true; fi
  if [ -n "$containers_made" ]; then rm -rf /var/lib/containers; fi
}
ctr="$(buildah from scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; forget_cni; rm -rf "$store"' EXIT
buildah copy --quiet "$ctr" "$rootfs/" / >/dev/null
buildah config \
  --user 65532:65532 \
  --entrypoint '["/usr/local/bin/tuna-operator"]' \
  --cmd '["--help"]' \
  --label org.opencontainers.image.title=tuna-operator \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.source=https://github.com/tuna-am/tuna-operator \
  "$ctr"
buildah commit --quiet "$ctr" "$image" >/dev/null
archive="$out/tuna-operator-$version.oci.tar"
rm -f "$archive"
buildah push --quiet "$image" "oci-archive:$archive:$image"
user="$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$image")"
[ "$user" = "65532:65532" ] || { echo "image: user is '$user', not 65532:65532" >&2; exit 1; }
echo "image: $image ($(du -h "$archive" | cut -f1)), user $user -> $archive"

if [ -n "$load" ]; then
  # A docker-archive keeps the name:tag that `ctr images import` registers.
  docker_archive="$out/tuna-operator-$version.docker.tar"
  rm -f "$docker_archive"
  buildah push --quiet "$image" "docker-archive:$docker_archive:$image"
  for f in "$docker_archive" $(scripts/node-images.sh); do
    ctr --address "$containerd_address" -n k8s.io images import "$f" >/dev/null
  done
  echo "image: loaded into the node of $load:"
  ctr --address "$containerd_address" -n k8s.io images ls -q | grep -v '^sha256:' | sed 's/^/  /'
  exit 0
fi

echo "== run check"
# The agent in the image, as the chart runs it: user 65532, read-only root,
# no capabilities, no privilege escalation, against a real control plane on
# this machine (scripts/test-cluster.sh; the edge is not there: the agent says
# so and serves anyway). Ready = its watches synced. With podman when
# containers can run here, else with scripts/image-run-check.py (mount
# namespace + chroot + setuid).
work="$(mktemp -d)"
scripts/test-cluster.sh start --version 1.37 --dir "$work/cluster" >/dev/null
name="tuna-image-check-$$"
agent=""
cleanup() {
  [ -n "$agent" ] && kill "$agent" 2>/dev/null
  command -v podman >/dev/null 2>&1 && podman --storage-driver "$STORAGE_DRIVER" rm -f "$name" >/dev/null 2>&1
  scripts/test-cluster.sh stop --dir "$work/cluster"
  buildah rm "$ctr" >/dev/null 2>&1
  forget_cni
  rm -rf "$store"
  rm -rf "$work"
  true
}
trap cleanup EXIT
export KUBECONFIG="$work/cluster/kubeconfig"
kubectl apply -f charts/tuna-k8s-operator/crds >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f charts/tuna-k8s-operator/crds >/dev/null
# The certificates inline: the container sees only this one file.
kubectl config view --raw --flatten > "$work/kubeconfig"
unset KUBECONFIG
chmod 0644 "$work/kubeconfig"
probe_port=$(( 20000 + RANDOM % 10000 ))
agent_args=(--log-format json agent --edge-api https://127.0.0.1:9 --edge-agent 127.0.0.1:9
  --cluster-id image-check --probe-listen "127.0.0.1:$probe_port" --metrics-listen "127.0.0.1:$(( probe_port + 1 ))")

runtime="podman"
run=()
if command -v podman >/dev/null 2>&1; then
  podman --storage-driver "$STORAGE_DRIVER" load --quiet -i "$archive" >/dev/null
  run=(podman --storage-driver "$STORAGE_DRIVER" run --pull=never --rm --read-only --cap-drop=ALL
    --security-opt no-new-privileges --network host)
  if ! "${run[@]}" "$image" --version > "$out/run.log" 2>&1; then
    echo "image: podman cannot run containers on this machine: $(tail -1 "$out/run.log")" >&2
    runtime="image-run-check.py"
  fi
else
  runtime="image-run-check.py"
fi
if [ "$runtime" = podman ]; then
  "${run[@]}" -d --name "$name" -v "$work/kubeconfig:/etc/tuna/kubeconfig:ro" -e KUBECONFIG=/etc/tuna/kubeconfig \
    -e TUNA_API_KEY=image-check "$image" "${agent_args[@]}" > /dev/null
else
  TMPDIR="$work" python3 scripts/image-run-check.py "$archive" - -- --version > "$out/run.log" 2>&1
  TMPDIR="$work" IMAGE_ENV="TUNA_API_KEY=image-check" python3 scripts/image-run-check.py "$archive" "$work/kubeconfig" -- \
    "${agent_args[@]}" > "$out/agent.log" 2>&1 &
  agent=$!
fi
grep -qx "tuna-operator $version" "$out/run.log" || { echo "image: --version printed:" >&2; cat "$out/run.log" >&2; exit 1; }
ready=""
for _ in $(seq 300); do
  if curl -fsS "http://127.0.0.1:$probe_port/readyz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.1
done
if [ "$runtime" = podman ]; then
  podman --storage-driver "$STORAGE_DRIVER" logs "$name" > "$out/agent.log" 2>&1 || true
fi
if [ -z "$ready" ]; then
  echo "image: the agent in the image never became ready ($runtime):" >&2; cat "$out/agent.log" >&2; exit 1
fi
if [ "$runtime" = podman ]; then
  echo "image: agent ready in podman: $(podman --storage-driver "$STORAGE_DRIVER" inspect --format 'user={{.Config.User}} readOnlyRootfs={{.HostConfig.ReadonlyRootfs}} effectiveCaps={{.EffectiveCaps}}' "$name")"
  podman --storage-driver "$STORAGE_DRIVER" stop -t 10 "$name" >/dev/null
else
  # What the kernel says about the running process.
  uid="$(awk '/^Uid:/ {print $2}' "/proc/$agent/status")"
  caps="$(awk '/^CapEff:/ {print $2}' "/proc/$agent/status")"
  nnp="$(awk '/^NoNewPrivs:/ {print $2}' "/proc/$agent/status")"
  rootopts="$(awk '$5 == "/" {print $6}' "/proc/$agent/mountinfo" | tail -1)"
  echo "image: agent ready ($runtime): uid=$uid CapEff=$caps NoNewPrivs=$nnp root=$rootopts"
  [ "$uid" = 65532 ] && [ "$caps" = 0000000000000000 ] && [ "$nnp" = 1 ] && [[ "$rootopts" == ro* ]] \
    || { echo "image: the process is not confined as the chart asks" >&2; exit 1; }
  kill -TERM "$agent"
  wait "$agent" || true
  agent=""
fi
grep -q '"probes and metrics listening"' "$out/agent.log" && ! grep -qi "read-only file system" "$out/agent.log" \
  || { echo "image: unexpected agent log:" >&2; cat "$out/agent.log" >&2; exit 1; }
echo "image: run check passed ($runtime)"
