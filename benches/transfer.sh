#!/usr/bin/env bash
# Bulk transfer through a TCP endpoint (a script, not a test): SIZE_MIB (256 by
# default) up through the real `tuna-operator standalone` (edge -> agent session
# over TLS + h2 -> proxy core -> an echo backend) and echoed back down, checked
# byte for byte with SHA-256 on both sides, timed. It replaces the test that did
# the same inside `cargo test` (edge/tests/edge/data_tunnel.rs,
# tcp_endpoint_echoes_and_carries_large_transfers): a timed bulk transfer is a
# benchmark. Everything listens on 127.0.0.1.
#
#   benches/transfer.sh                 # SIZE_MIB=256 ROUNDS=3
#   SIZE_MIB=1024 ROUNDS=1 benches/transfer.sh
#
# Needs: python3, cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=${SIZE_MIB:-256}
ROUNDS=${ROUNDS:-3}
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-target}
BASE=${BASE_PORT:-27000}
ECHO_PORT=$((BASE + 1)) TUNA_HTTP=$((BASE + 80)) TUNA_TCP=$((BASE + 200))

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== building (profile $PROFILE)"
cargo build --locked --profile "$PROFILE" -p tuna-operator
TUNA=$TARGET/$PROFILE/tuna-operator

# An echo server: every connection gets its bytes back, half-close kept.
cat > "$WORK/echo.py" <<'PY'
import socket, sys, threading
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
def serve(c):
    with c:
        while True:
            b = c.recv(1 << 20)
            if not b:
                c.shutdown(socket.SHUT_WR)
                return
            c.sendall(b)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
python3 "$WORK/echo.py" "$ECHO_PORT" & PIDS+=($!)

mkdir -p "$WORK/manifests"
cat > "$WORK/manifests/transfer.yaml" <<YAML
apiVersion: v1
kind: Service
metadata: {name: echo}
spec: {type: ExternalName, externalName: 127.0.0.1, ports: [{name: echo, port: $ECHO_PORT}]}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: TCPEndpoint
metadata: {name: echo}
spec: {alias: echo}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: echo}
spec: {protocol: tcp, portOrAlias: echo, upstream: {url: "tcp://echo:echo"}}
YAML
RUST_LOG=warn "$TUNA" standalone -f "$WORK/manifests" --http-listen "127.0.0.1:$TUNA_HTTP" \
  --tcp-port-range "$TUNA_TCP-$TUNA_TCP" --data-dir "$WORK/state" > "$WORK/tuna.txt" 2>&1 & TUNA_PID=$!
PIDS+=($TUNA_PID)

# The client: writes SIZE_MIB of a fixed pseudo-random pattern while reading
# the echo, hashes both directions, and fails unless they match byte for byte.
cat > "$WORK/client.py" <<'PY'
import hashlib, socket, sys, threading, time
port, size = int(sys.argv[1]), int(sys.argv[2]) << 20
block = hashlib.shake_256(b"tuna").digest(1 << 20)
for attempt in range(400):  # the endpoint opens once the tunnel is up
    try:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(block[:1]); first = s.recv(1)
        if first == block[:1]:
            break
        s.close()
    except OSError:
        pass
    time.sleep(0.05)
else:
    sys.exit("the TCP endpoint never echoed")
sent, got = hashlib.sha256(), hashlib.sha256()
def send():
    left = size
    while left:
        n = min(left, len(block))
        s.sendall(block[:n]); sent.update(block[:n]); left -= n
    s.shutdown(socket.SHUT_WR)
start = time.monotonic()
t = threading.Thread(target=send); t.start()
received = 0
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    got.update(b); received += len(b)
t.join()
elapsed = time.monotonic() - start
if received != size or sent.digest() != got.digest():
    sys.exit(f"echo mismatch: sent {size} bytes, got {received}")
print(f"{size >> 20} MiB up and back in {elapsed:.2f} s: {2 * size / elapsed / 2**20:.0f} MiB/s both ways, SHA-256 equal")
PY
echo "== $SIZE_MIB MiB through the TCP endpoint, $ROUNDS rounds (load $(cut -d' ' -f1-3 /proc/loadavg))"
for r in $(seq 1 "$ROUNDS"); do
  printf '  round %s: ' "$r"
  python3 "$WORK/client.py" "$TUNA_TCP" "$SIZE_MIB"
done
