#!/usr/bin/env bash
# Lays out the root filesystem of the tuna-operator image in OUT: the binary,
# the shared libraries it links (ldd, with the dynamic loader), the CA bundle
# (the edge's certificate is checked against the system roots by default) and
# passwd/group entries for the non-root user 65532. Nothing else: no shell, no
# package manager, no writable path. Used by the Dockerfile and scripts/image.sh.
#
# The binary goes in stripped (line tables and symbols are most of a release
# binary, and nothing in the pod reads them); its debug info is kept in
# DEBUG (default: tuna-operator.debug next to OUT), which the stripped binary
# names in its .gnu_debuglink section: put the file next to the binary or
# under /usr/lib/debug and gdb, addr2line and Rust's own backtraces find it.
set -euo pipefail
usage="usage: image-rootfs.sh BINARY OUT [DEBUG]"
bin="${1:?$usage}"
out="${2:?$usage}"
debug="${3:-$(dirname "$out")/tuna-operator.debug}"
rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$(dirname "$debug")"
# The debuglink holds the debug file's name and CRC, so it is added from the
# final file; objcopy writes a new file and leaves the build's binary alone.
objcopy --only-keep-debug "$bin" "$debug"
chmod 0644 "$debug"
objcopy --strip-debug --strip-unneeded --add-gnu-debuglink="$debug" "$bin" "$out/usr/local/bin/tuna-operator"
chmod 0755 "$out/usr/local/bin/tuna-operator"
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
