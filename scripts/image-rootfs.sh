#!/usr/bin/env bash
# Lays out the root filesystem of the tuna-operator image in OUT: the binary,
# the shared libraries it links (ldd, with the dynamic loader), the CA bundle
# (the edge's certificate is checked against the system roots by default) and
# passwd/group entries for the non-root user 65532. Nothing else: no shell, no
# package manager, no writable path. Used by the Dockerfile and scripts/image.sh.
set -euo pipefail
bin="${1:?usage: image-rootfs.sh BINARY OUT}"
out="${2:?usage: image-rootfs.sh BINARY OUT}"
rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs"
install -m 0755 "$bin" "$out/usr/local/bin/tuna-operator"
# Every library ldd resolves, and the loader itself, at their own paths.
ldd "$bin" | awk '/=> \// { print $3 } /^[ \t]*\/[^ ]* \(0x/ { print $1 }' | sort -u | while read -r lib; do
  cp -L --parents "$lib" "$out/"
done
if ldd "$bin" | grep -q "not found"; then
  echo "image-rootfs: a library of $bin is not found:" >&2; ldd "$bin" >&2; exit 1
fi
cp -L /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/ca-certificates.crt"
echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > "$out/etc/passwd"
echo 'nonroot:x:65532:' > "$out/etc/group"
