#!/usr/bin/env bash
# Builds the images a test node runs besides the product's own, here, pulling
# nothing: each is one static binary committed by buildah from `scratch` and
# saved as a docker-archive (which keeps the name:tag `ctr images import`
# registers) under .tools/images/, with a stamp of its inputs: a later run
# with the same inputs does nothing.
#
#   scripts/node-images.sh        # prints the archives, one per line
#
#   localhost/pause:3.10             the pod sandbox (conformance/node/pause.c)
#   localhost/coredns:<version>      the cluster DNS (conformance/k8s/coredns)
#   localhost/tuna-test-echo:1       the tests' backend (conformance/node/echo)
#   localhost/kubectl:1.37           kubectl of the test cluster's pins, static
#                                    (the connector journey's workload)
#
# Used by scripts/test-cluster.sh --node (pause, CoreDNS) and scripts/image.sh
# --load (the echo backend). Needs buildah, gcc, go and the CoreDNS binary of
# conformance/k8s/build.sh --node.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/.tools/images"
mkdir -p "$out"
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

work=""
# buildah's network setup makes /etc/cni/net.d (with a lock) even for
# builds that run nothing: removed again if it was not there before.
# Likewise its blob-info cache in /var/lib/containers/cache, whatever --root says.
cni_made=""; [ -e /etc/cni ] || cni_made=1
containers_made=""; [ -e /var/lib/containers ] || containers_made=1
cleanup() {
  [ -z "$work" ] || rm -rf "$work"
  if [ -n "$cni_made" ]; then rm -f /etc/cni/net.d/cni.lock; rmdir /etc/cni/net.d /etc/cni 2>/dev/null || true; fi
  if [ -n "$containers_made" ]; then rm -rf /var/lib/containers; fi
}
trap cleanup EXIT
B=()
buildah_init() {
  [ -z "$work" ] || return 0
  work="$(mktemp -d)"
  # A private store: nothing of these builds stays in /var/lib/containers.
  B=(buildah --root "$work/root" --runroot "$work/run" --storage-driver vfs)
}

# image NAME:TAG BINARY USER STAMP: the archive of an image holding BINARY as
# /NAME's entrypoint, unless one from the same STAMP is there.
image() {
  local ref=$1 binary=$2 user=$3 stamp=$4 file ctr
  file="$out/$(echo "${ref#localhost/}" | tr ':/' '__').tar"
  if [ -f "$file" ] && [ "$(cat "$file.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$file"; return
  fi
  buildah_init
  ctr="$("${B[@]}" from scratch)"
  "${B[@]}" copy --quiet --chmod 0755 "$ctr" "$binary" "/$(basename "${ref%%:*}")" >/dev/null
  "${B[@]}" config --user "$user" --entrypoint "[\"/$(basename "${ref%%:*}")\"]" "$ctr"
  "${B[@]}" commit --quiet "$ctr" "$ref" >/dev/null
  "${B[@]}" rm "$ctr" >/dev/null
  rm -f "$file"
  "${B[@]}" push --quiet "$ref" "docker-archive:$file:$ref"
  echo "$stamp" >"$file.stamp"
  echo "node-images: built $ref" >&2
  echo "$file"
}

bin="$out/bin"
mkdir -p "$bin"
# pause: 15 lines of C, static (the sandbox must not need a libc in the image).
src="$root/conformance/node/pause.c"
gcc -O2 -static -o "$bin/pause" "$src"
image localhost/pause:3.10 "$bin/pause" 65535:65535 "$(sha256sum "$src" | cut -d' ' -f1)"

# CoreDNS, as conformance/k8s/build.sh --node built it.
coredns="$root/.tools/k8s/coredns/coredns"
[ -x "$coredns" ] || "$root/conformance/k8s/build.sh" --node >/dev/null
version="$(sed -n 's/^\tgithub.com\/coredns\/coredns \(v[^ ]*\).*/\1/p' "$root/conformance/k8s/coredns/go.mod")"
image "localhost/coredns:${version#v}" "$coredns" 65532:65532 "$(sha256sum "$coredns" | cut -d' ' -f1)"

# The tests' echo backend: Go's standard library only, static.
(cd "$root/conformance/node" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
  go build -trimpath -ldflags "-s -w" -o "$bin/echo" ./echo)
image localhost/tuna-test-echo:1 "$bin/echo" 65532:65532 "$(sha256sum "$bin/echo" | cut -d' ' -f1)"

# kubectl, from the 1.37 control plane's pins (conformance/k8s/1.37), static:
# the connector journey's workload runs it in a pod.
(cd "$root/conformance/k8s/1.37" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
  go build -trimpath -ldflags "-s -w" -o "$bin/kubectl" k8s.io/kubernetes/cmd/kubectl)
image localhost/kubectl:1.37 "$bin/kubectl" 65532:65532 "$(sha256sum "$bin/kubectl" | cut -d' ' -f1)"
