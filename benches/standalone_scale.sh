#!/usr/bin/env bash
# Standalone at scale: N http Tunnels served by one `tuna-operator standalone`
# process (embedded edge + agent + proxy core). Reports the time until every
# host is routed at the edge, the process's RSS, its open descriptors and its
# sockets — the figures the issue "many tunnels per connection" quotes as the
# before (1 000 Tunnels: 1 000 sessions, 2 013 descriptors, 193 MB).
#
#   benches/standalone_scale.sh            # N=1000
#   N=10000 benches/standalone_scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
N=${N:-1000}
cargo build --release --locked -p tuna-operator --bin tuna-operator
BIN=$TARGET/release/tuna-operator

work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/manifests" "$work/data"
# A backend that answers every request (python's http.server on port 0).
python3 - "$work/backend.port" <<'EOF' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1] + ".tmp", "w").write(str(s.server_address[1])); __import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
s.serve_forever()
EOF
until [ -s "$work/backend.port" ]; do sleep 0.05; done
backend=$(cat "$work/backend.port")
for i in $(seq 1 "$N"); do
  printf -- '---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {name: t%s}\nspec: {protocol: http, subdomain: t%s, upstream: {url: "http://127.0.0.1:%s"}}\n' "$i" "$i" "$backend"
done > "$work/manifests/tunnels.yaml"

# Port 0 is not offered by the flag: take one the kernel hands out now.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start=$(date +%s.%N)
RUST_LOG=warn "$BIN" standalone -f "$work/manifests" --data-dir "$work/data" \
  --http-listen "127.0.0.1:$port" > "$work/log" 2>&1 &
pid=$!
routed() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Host: t$1.localhost" "http://127.0.0.1:$port/" || true)" = 200 ]
}
# Timed: until the first and the last host answer 200 through the edge.
until routed 1 && routed "$N"; do
  if ! kill -0 "$pid" 2>/dev/null; then cat "$work/log"; exit 1; fi
  sleep 0.1
done
end=$(date +%s.%N)
# Untimed: every host answers (the route is live end to end).
for i in $(seq 1 "$N"); do
  until routed "$i"; do sleep 0.1; done
done
rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
fds=$(ls "/proc/$pid/fd" | wc -l)
sockets=$(find "/proc/$pid/fd" -lname 'socket:*' | wc -l)
printf '== standalone, %s http Tunnels, %s cores, load %s\n' "$N" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf 'first and last host routed in %.1f s, then all %s checked; RSS %d MiB; %d descriptors (%d sockets)\n' \
  "$(echo "$end - $start" | bc)" "$N" $((rss / 1024)) "$fds" "$sockets"
