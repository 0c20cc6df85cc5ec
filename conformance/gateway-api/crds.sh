#!/usr/bin/env bash
# Copies the Gateway API standard-channel CRDs the cluster tests install
# (`config/crd/standard/*.yaml` of the `sigs.k8s.io/gateway-api` Go module)
# into `.tools/gateway-api-<version>/` and prints that directory.
#
# The version is pinned in one place, `conformance/gateway-api/go.mod`; the
# module comes from the Go module proxy and is checked against the committed
# go.sum (-mod=readonly: a download whose hash differs is an error, and so is
# a go.mod whose pin go.sum does not cover). A later run with the same pins
# does nothing. The chart does not ship these CRDs: clusters own them.
#
# Go is a test fixture only: nothing here is part of the product.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
module=sigs.k8s.io/gateway-api
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly"

if ! command -v go >/dev/null 2>&1; then
  echo "crds.sh: go not found (Go 1.26 or newer fetches the Gateway API CRDs)" >&2
  exit 1
fi

version=$(cd "$here" && go list -m -f '{{.Version}}' "$module")
dest="$root/.tools/gateway-api-$version"
stamp=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$dest/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$dest"; exit 0
fi

echo "crds.sh: fetching $module $version" >&2
dir=$(cd "$here" && go mod download -json "$module" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$dir" ] || [ ! -d "$dir/config/crd/standard" ]; then
  echo "crds.sh: $module $version has no config/crd/standard (download failed?)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
# The module cache is read-only; the copies are plain files.
install -m 0644 "$dir"/config/crd/standard/*.yaml "$dest/"
echo "$stamp" >"$dest/stamp"
echo "$dest"
