#!/usr/bin/env bash
# Builds the real Kubernetes control plane the cluster tests run on:
# kube-apiserver and kube-controller-manager of each minor version below, and
# etcd, from the Go module proxy, checksum-verified by the committed go.sum.
# With --node, also what a real node needs (scripts/test-cluster.sh --node):
# kubelet, kube-scheduler and kube-proxy of the same release, and CoreDNS.
#
#   conformance/k8s/build.sh [--node] [MINOR...]   (default: every minor directory)
#
# The pins live in one place each: `conformance/k8s/<minor>/go.mod` names the
# k8s.io/kubernetes release (and one `replace` per staging module, as upstream's
# own go.mod has them relative) for the control plane and the node alike,
# `conformance/k8s/etcd/go.mod` the etcd server, `conformance/k8s/coredns/go.mod`
# CoreDNS. The binaries go to `.tools/k8s/<release>/` (etcd to
# `.tools/k8s/etcd-<release>/`, CoreDNS to `.tools/k8s/coredns-<release>/`),
# with a stamp of the go.mod and go.sum they came from (`stamp` for the control
# plane, `stamp.node` for the node's): a later run with the same pins does
# nothing. When the node is asked for and the control plane is stale too, all
# five commands are built by ONE `go build` so that they share the compile.
#
# Go is a test fixture only: nothing here is part of the product.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/.tools/k8s"
# `local`: fail loudly rather than fetch another toolchain. No cgo, as
# upstream's release builds; -mod=readonly: go.mod and go.sum are the pins.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: go not found (Go 1.26 or newer builds the test control plane)" >&2
  exit 1
fi

stamp_of() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -d' ' -f1; }
module_version() { # dir module → the version go.mod selects
  (cd "$1" && go list -m -f '{{.Version}}' "$2")
}

build_etcd() {
  local dir="$here/etcd" version dest
  version=$(module_version "$dir" go.etcd.io/etcd/server/v3)
  dest="$out/etcd-$version"
  if [ "$(cat "$dest/stamp" 2>/dev/null)" = "$(stamp_of "$dir")" ] && [ -x "$dest/etcd" ]; then
    echo "$dest/etcd"; return
  fi
  echo "build.sh: building etcd $version" >&2
  mkdir -p "$dest"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$dest/etcd" go.etcd.io/etcd/server/v3)
  stamp_of "$dir" >"$dest/stamp"
  echo "$dest/etcd"
}

build_coredns() {
  local dir="$here/coredns" version dest
  version=$(module_version "$dir" github.com/coredns/coredns)
  dest="$out/coredns-$version"
  if [ "$(cat "$dest/stamp" 2>/dev/null)" = "$(stamp_of "$dir")" ] && [ -x "$dest/coredns" ]; then
    echo "$dest/coredns"; return
  fi
  echo "build.sh: building CoreDNS $version" >&2
  mkdir -p "$dest"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$dest/coredns" github.com/coredns/coredns)
  stamp_of "$dir" >"$dest/stamp"
  echo "$dest/coredns"
}

# fresh STAMPFILE DEST BINARY...: DEST's binaries exist and came from these pins.
fresh() {
  local stamp=$1 dest=$2; shift 2
  [ "$(cat "$dest/$stamp" 2>/dev/null)" = "$(stamp_of "$dir")" ] || return 1
  for b in "$@"; do [ -x "$dest/$b" ] || return 1; done
}

control_plane=(kube-apiserver kube-controller-manager)
node_commands=(kubelet kube-scheduler kube-proxy)

build_minor() {
  local minor=$1 dir="$here/$1" version dest ldflags="" etcd cmds=()
  version=$(module_version "$dir" k8s.io/kubernetes)
  dest="$out/$version"
  etcd=$(build_etcd)
  fresh stamp "$dest" "${control_plane[@]}" || cmds+=("${control_plane[@]}")
  if [ -n "$node" ]; then
    # Relative links: the tools folder may be shared by several checkouts.
    ln -sfn "$(basename "$(dirname "$(build_coredns)")")" "$out/coredns"
    fresh stamp.node "$dest" "${node_commands[@]}" || cmds+=("${node_commands[@]}")
  fi
  if [ "${#cmds[@]}" -eq 0 ]; then
    ln -sfn "../$(basename "$(dirname "$etcd")")/etcd" "$dest/etcd"
    ln -sfn "$version" "$out/$minor"
    return
  fi
  echo "build.sh: building ${cmds[*]} $version" >&2
  mkdir -p "$dest"
  # What upstream's hack/lib/version.sh stamps in, so /version tells the truth.
  local major=${version#v}; major=${major%%.*}
  local minor_num=${version#v*.}; minor_num=${minor_num%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=$major -X $p.gitMinor=$minor_num -X $p.gitTreeState=clean"
  done
  # One invocation for every command: the packages they share compile once.
  # Into a fresh folder first, then moved: a running cluster keeps its files.
  local tmp pkgs=()
  tmp=$(mktemp -d "$dest/.build.XXXXXX")
  for cmd in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  if ! (cd "$dir" && go build -trimpath -tags selinux,notest -ldflags "-s -w$ldflags" -o "$tmp/" "${pkgs[@]}"); then
    rm -rf "$tmp"; exit 1
  fi
  for cmd in "${cmds[@]}"; do mv -f "$tmp/$cmd" "$dest/$cmd"; done
  rmdir "$tmp"
  ln -sfn "../$(basename "$(dirname "$etcd")")/etcd" "$dest/etcd"
  case " ${cmds[*]} " in *" kube-apiserver "*) stamp_of "$dir" >"$dest/stamp" ;; esac
  case " ${cmds[*]} " in *" kubelet "*) stamp_of "$dir" >"$dest/stamp.node" ;; esac
  ln -sfn "$version" "$out/$minor"
}

node=""
if [ "${1:-}" = --node ]; then node=1; shift; fi
minors=("$@")
if [ "${#minors[@]}" -eq 0 ]; then
  for d in "$here"/1.*/; do minors+=("$(basename "$d")"); done
fi
for m in "${minors[@]}"; do
  [ -f "$here/$m/go.mod" ] || { echo "build.sh: no conformance/k8s/$m/go.mod (minors: $(cd "$here" && ls -d 1.* | tr '\n' ' '))" >&2; exit 1; }
  build_minor "$m"
done
