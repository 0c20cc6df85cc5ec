#!/usr/bin/env bash
# End-to-end benchmark (a script, not a test). In one run, the same loads through
#   (a) tuna: public client -> edge -> agent (TLS, h2 mux) -> proxy core -> backend,
#       i.e. the real `tuna-operator standalone` binary serving manifests
#       (Ingress -> Service for HTTP, TCPEndpoint + tcp Tunnel for iperf3);
#   (b) rathole 0.5 (server + client, TLS transport like for like, and plain TCP);
#   (c) nginx as a reverse proxy in front of the backend (one extra L7 hop, no tunnel);
#   (d) direct to the backend.
# Loads: wrk HTTP keep-alive and connection-per-request (1 KiB body from nginx),
# iperf3 TCP throughput. Reports req/s, Gbit/s, ratios against rathole and the
# CPU (user+sys) of the processes of each setup. Everything listens on 127.0.0.1.
#
#   benches/e2e.sh                      # DURATION=10 CONNS=64 by default
#   DURATION=20 CONNS=128 benches/e2e.sh
#
# Needs: wrk, iperf3, nginx, openssl, python3, bc, cargo (rathole is installed
# with `cargo install` into $TUNA_BENCH_CACHE on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
CACHE=${TUNA_BENCH_CACHE:-$HOME/.cache/tuna-bench}
TARGET=${CARGO_TARGET_DIR:-target}
BASE=${BASE_PORT:-26000}
NGINX_PORT=$((BASE + 80)) IPERF_PORT=$((BASE + 201)) NGINX_PROXY=$((BASE + 90))
TUNA_HTTP=$((BASE + 81)) TUNA_TCP=$((BASE + 202))
RH_CTRL=$((BASE + 2)) RH_HTTP=$((BASE + 82)) RH_TCP=$((BASE + 203))
HOST=bench.localhost
TOKEN=bench-token

WORK=$(mktemp -d)
# nginx workers drop privileges when started as root: let them read the files.
chmod 755 "$WORK"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

for tool in wrk iperf3 nginx openssl python3 bc; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done

echo "== building (release)"
cargo build --release -p tuna-operator
TUNA=$TARGET/release/tuna-operator
if [ ! -x "$CACHE/rathole/bin/rathole" ]; then
  echo "== installing rathole into $CACHE/rathole"
  # rathole 0.5.0's lock file pins time 0.3.29, which Rust >= 1.80 rejects:
  # without the lock, cargo resolves a compatible time.
  cargo install rathole --locked --root "$CACHE/rathole" ||
    cargo install rathole --root "$CACHE/rathole"
fi
RATHOLE=$CACHE/rathole/bin/rathole

# --- backends: nginx serving 1 KiB, iperf3 server; nginx reverse proxy ---------
mkdir -p "$WORK/nginx/html" "$WORK/nginx/logs" "$WORK/nginx/tmp"
head -c 1024 /dev/zero | tr '\0' 'x' > "$WORK/nginx/html/1k.txt"
cat > "$WORK/nginx/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
error_log $WORK/nginx/logs/error.log warn;
pid $WORK/nginx/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $WORK/nginx/tmp;
  proxy_temp_path $WORK/nginx/tmp;
  fastcgi_temp_path $WORK/nginx/tmp;
  uwsgi_temp_path $WORK/nginx/tmp;
  scgi_temp_path $WORK/nginx/tmp;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    root $WORK/nginx/html;
  }
}
NGINX
# The reverse proxy runs as its own nginx (one worker, like the backend) so its
# CPU is measured apart from the backend's.
mkdir -p "$WORK/proxy/logs" "$WORK/proxy/tmp"
cat > "$WORK/proxy/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
error_log $WORK/proxy/logs/error.log warn;
pid $WORK/proxy/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $WORK/proxy/tmp;
  proxy_temp_path $WORK/proxy/tmp;
  fastcgi_temp_path $WORK/proxy/tmp;
  uwsgi_temp_path $WORK/proxy/tmp;
  scgi_temp_path $WORK/proxy/tmp;
  upstream backend { server 127.0.0.1:$NGINX_PORT; keepalive 128; }
  server {
    listen 127.0.0.1:$NGINX_PROXY;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
NGINX
nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" & PIDS+=($!)
nginx -c "$WORK/proxy/nginx.conf" -p "$WORK/proxy" & PROXY_PID=$!; PIDS+=($PROXY_PID)
iperf3 -s -p "$IPERF_PORT" >/dev/null 2>&1 & PIDS+=($!)

wait_http() { # url host
  for _ in $(seq 1 400); do
    if curl -fsS -o /dev/null -H "Host: $2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "not ready: $1 (Host: $2)" >&2; return 1
}
wait_tcp() { # port
  for _ in $(seq 1 400); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "port $1 never opened" >&2; return 1
}

cpu_ticks() { # pids... -> utime+stime ticks of them and their children, summed
  local sum=0 all=()
  for p in "$@"; do all+=("$p"); while read -r c; do all+=("$c"); done < <(pgrep -P "$p" || true); done
  for p in "${all[@]}"; do
    if [ -r "/proc/$p/stat" ]; then
      sum=$((sum + $(awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$p/stat")))
    fi
  done
  echo "$sum"
}
TICKS=$(getconf CLK_TCK)

RESULTS=$WORK/results.tsv
: > "$RESULTS"

run_wrk() { # setup load port host pids...
  local setup=$1 load=$2 port=$3 host=$4; shift 4
  local extra=()
  [ "$load" = "close" ] && extra=(-H "Connection: close")
  local before after out rps errors
  before=$(cpu_ticks "$@")
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" -H "Host: $host" "${extra[@]}" "http://127.0.0.1:$port/1k.txt")
  after=$(cpu_ticks "$@")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  errors=$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr '\n' ' ')
  printf '%s\t%s\t%s\t%s\t%s\n' "$setup" "$load" "$rps" "$(( after - before ))" "$errors" >> "$RESULTS"
  printf '  %-14s %-10s %10s req/s  cpu %6.2fs %s\n' "$setup" "$load" "$rps" \
    "$(echo "$(( after - before )) / $TICKS" | bc -l)" "$errors"
}

run_iperf() { # setup port pids...
  local setup=$1 port=$2; shift 2
  local before after gbps
  before=$(cpu_ticks "$@")
  gbps=$(iperf3 -c 127.0.0.1 -p "$port" -t "$DURATION" -J | python3 -c \
    'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))')
  after=$(cpu_ticks "$@")
  printf '%s\t%s\t%s\t%s\t\n' "$setup" "iperf3" "$gbps" "$(( after - before ))" >> "$RESULTS"
  printf '  %-14s %-10s %10s Gbit/s cpu %6.2fs\n' "$setup" "iperf3" "$gbps" \
    "$(echo "$(( after - before )) / $TICKS" | bc -l)"
}

bench_http() { # name port pids...
  local name=$1 port=$2; shift 2
  run_wrk "$name" keepalive "$port" "$HOST" "$@"
  run_wrk "$name" close "$port" "$HOST" "$@"
}

wait_tcp "$NGINX_PORT"; wait_tcp "$IPERF_PORT"; wait_tcp "$NGINX_PROXY"
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); wrk -t$THREADS -c$CONNS -d${DURATION}s, 1 KiB body"

echo "== direct"
bench_http direct "$NGINX_PORT"
run_iperf direct "$IPERF_PORT"

echo "== nginx reverse proxy"
bench_http nginx-proxy "$NGINX_PROXY" "$PROXY_PID"

# --- (a) tuna: the standalone binary ----------------------------------------------
echo "== tuna (tuna-operator standalone: edge + agent + proxy core)"
mkdir -p "$WORK/tuna/manifests"
cat > "$WORK/tuna/manifests/bench.yaml" <<YAML
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {type: ExternalName, externalName: 127.0.0.1, ports: [{name: http, port: $NGINX_PORT}]}
---
apiVersion: v1
kind: Service
metadata: {name: iperf}
spec: {type: ExternalName, externalName: 127.0.0.1, ports: [{name: iperf, port: $IPERF_PORT}]}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {name: bench}
spec: {subdomain: bench}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: bench}
spec:
  ingressClassName: tuna
  rules:
  - host: $HOST
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: TCPEndpoint
metadata: {name: iperf}
spec: {alias: iperf}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: iperf}
spec: {protocol: tcp, portOrAlias: iperf, upstream: {url: "tcp://iperf:iperf"}}
YAML
RUST_LOG=warn "$TUNA" standalone -f "$WORK/tuna/manifests" --http-listen "127.0.0.1:$TUNA_HTTP" \
  --tcp-port-range "$TUNA_TCP-$TUNA_TCP" --data-dir "$WORK/tuna/state" > "$WORK/tuna/out.txt" 2>&1 & TUNA_PID=$!; PIDS+=($TUNA_PID)
wait_http "http://127.0.0.1:$TUNA_HTTP/1k.txt" "$HOST"
wait_tcp "$TUNA_TCP"
bench_http tuna "$TUNA_HTTP" "$TUNA_PID"
run_iperf tuna "$TUNA_TCP" "$TUNA_PID"
kill "$TUNA_PID"; wait "$TUNA_PID" 2>/dev/null || true

# --- (b) rathole ----------------------------------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost" \
  -keyout "$WORK/rh.key" -out "$WORK/rh.crt" 2>/dev/null
openssl pkcs12 -export -out "$WORK/rh.pfx" -inkey "$WORK/rh.key" -in "$WORK/rh.crt" -passout pass:bench 2>/dev/null
for transport in tls tcp; do
  server_transport="" client_transport=""
  if [ "$transport" = tls ]; then
    server_transport=$'[server.transport]\ntype = "tls"\n[server.transport.tls]\npkcs12 = "'"$WORK/rh.pfx"$'"\npkcs12_password = "bench"'
    client_transport=$'[client.transport]\ntype = "tls"\n[client.transport.tls]\ntrusted_root = "'"$WORK/rh.crt"$'"\nhostname = "localhost"'
  fi
  cat > "$WORK/rh-server.toml" <<TOML
[server]
bind_addr = "127.0.0.1:$RH_CTRL"
default_token = "$TOKEN"
$server_transport
[server.services.http]
bind_addr = "127.0.0.1:$RH_HTTP"
[server.services.tcp]
bind_addr = "127.0.0.1:$RH_TCP"
TOML
  cat > "$WORK/rh-client.toml" <<TOML
[client]
remote_addr = "127.0.0.1:$RH_CTRL"
default_token = "$TOKEN"
$client_transport
[client.services.http]
local_addr = "127.0.0.1:$NGINX_PORT"
[client.services.tcp]
local_addr = "127.0.0.1:$IPERF_PORT"
TOML
  echo "== rathole ($transport transport)"
  RUST_LOG=error "$RATHOLE" -s "$WORK/rh-server.toml" & RS=$!; PIDS+=($RS)
  wait_tcp "$RH_CTRL"
  RUST_LOG=error "$RATHOLE" -c "$WORK/rh-client.toml" & RC=$!; PIDS+=($RC)
  wait_http "http://127.0.0.1:$RH_HTTP/1k.txt" "$HOST"
  bench_http "rathole-$transport" "$RH_HTTP" "$RS" "$RC"
  run_iperf "rathole-$transport" "$RH_TCP" "$RS" "$RC"
  kill "$RS" "$RC"; wait "$RS" "$RC" 2>/dev/null || true
done

# --- summary ----------------------------------------------------------------------
echo
echo "== summary (markdown)"
python3 - "$RESULTS" "$DURATION" "$TICKS" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
duration, ticks = float(sys.argv[2]), float(sys.argv[3])
val = {(r[0], r[1]): (float(r[2] or 0), float(r[3]) / ticks) for r in rows}
setups = [s for s in ["direct", "nginx-proxy", "tuna", "rathole-tls", "rathole-tcp"] if any(k[0] == s for k in val)]
loads = [("keepalive", "HTTP keep-alive (req/s)"), ("close", "HTTP conn-per-request (req/s)"), ("iperf3", "iperf3 TCP (Gbit/s)")]
def fmt(s, key):
    if (s, key) not in val:
        return "-"
    v = val[(s, key)][0]
    return f"{v:.2f}" if key == "iperf3" else f"{v:,.0f}"
def ratio(key, other):
    a, b = val.get(("tuna", key)), val.get((other, key))
    return f"{a[0] / b[0]:.2f}x" if a and b and b[0] else "-"
print("| load | " + " | ".join(setups) + " | tuna / rathole-tls | tuna / rathole-tcp | tuna / nginx-proxy |")
print("|---|" + "---|" * (len(setups) + 3))
for key, label in loads:
    print(f"| {label} | " + " | ".join(fmt(s, key) for s in setups)
          + f" | {ratio(key, 'rathole-tls')} | {ratio(key, 'rathole-tcp')} | {ratio(key, 'nginx-proxy')} |")
print()
print("| CPU of the setup's processes | " + " | ".join(s for s in setups if s != "direct") + " |")
print("|---|" + "---|" * (len(setups) - 1))
for key, label in loads:
    cells = []
    for s in setups:
        if s == "direct":
            continue
        if (s, key) not in val:
            cells.append("-")
            continue
        amount, cpu = val[(s, key)]
        if key == "iperf3":
            gib = amount * 1e9 * duration / 8 / 2**30
            cells.append(f"{cpu:.1f} s = {cpu / gib:.3f} s/GiB")
        else:
            cells.append(f"{cpu:.1f} s = {cpu * 1e6 / (amount * duration):.0f} µs/req")
    print(f"| {label} | " + " | ".join(cells) + " |")
PY
