#!/usr/bin/env bash
# Tunnel benchmark (a script, not a test): in one run, HTTP keep-alive and
# connection-per-request wrk loads and an iperf3 TCP stream through
#   (a) tuna edge + agent (tunnel_bench example, TLS between them),
#   (b) rathole 0.5 with its TLS transport (like for like) and plain TCP,
#   (c) direct (no tunnel).
# Reports req/s, Gbit/s and the tunnel processes' CPU (user+sys) per request
# / per GiB. Everything listens on 127.0.0.1.
#
#   benches/tunnel.sh              # DURATION=10 CONNS=64 by default
#   DURATION=20 CONNS=128 benches/tunnel.sh
#
# Needs: wrk, iperf3, nginx, openssl, python3, cargo (rathole is installed
# with `cargo install` into $TUNA_BENCH_CACHE on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
CACHE=${TUNA_BENCH_CACHE:-$HOME/.cache/tuna-bench}
TARGET=${CARGO_TARGET_DIR:-target}
BASE=${BASE_PORT:-17000}
NGINX_PORT=$((BASE + 80)) IPERF_PORT=$((BASE + 201))
TUNA_AGENT=$((BASE + 1)) TUNA_HTTP=$((BASE + 81)) TUNA_TCP=$((BASE + 202))
RH_CTRL=$((BASE + 2)) RH_HTTP=$((BASE + 82)) RH_TCP=$((BASE + 203))
HOST=bench.tuna.test
TOKEN=bench-token

WORK=$(mktemp -d)
chmod 755 "$WORK" # nginx workers run as an unprivileged user
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

for tool in wrk iperf3 nginx openssl python3; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done

echo "== building (release)"
cargo build --release -p tuna-edge --example tunnel_bench
BENCH_BIN=$TARGET/release/examples/tunnel_bench
if [ ! -x "$CACHE/rathole/bin/rathole" ]; then
  # Not --locked: rathole 0.5.0's lock pins a `time` that no longer builds on current Rust.
  echo "== installing rathole into $CACHE/rathole"
  cargo install rathole --root "$CACHE/rathole"
fi
RATHOLE=$CACHE/rathole/bin/rathole

# --- backends ---------------------------------------------------------------
mkdir -p "$WORK/nginx/html" "$WORK/nginx/logs"
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
mkdir -p "$WORK/nginx/tmp"
nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" & PIDS+=($!)
iperf3 -s -p "$IPERF_PORT" >/dev/null 2>&1 & PIDS+=($!)

wait_http() { # url host
  for _ in $(seq 1 200); do
    if curl -fsS -o /dev/null -H "Host: $2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "not ready: $1 (Host: $2)" >&2; return 1
}
wait_tcp() { # port
  for _ in $(seq 1 200); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "port $1 never opened" >&2; return 1
}

cpu_ticks() { # pids... -> utime+stime ticks summed
  local sum=0
  for p in "$@"; do
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
  local before after out rps
  before=$(cpu_ticks "$@")
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" -H "Host: $host" "${extra[@]}" "http://127.0.0.1:$port/1k.txt")
  after=$(cpu_ticks "$@")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  local errors
  errors=$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr '\n' ' ')
  printf '%s\t%s\t%s\t%s\t%s\n' "$setup" "$load" "$rps" "$(( after - before ))" "$errors" >> "$RESULTS"
  printf '  %-16s %-10s %10s req/s  tunnel cpu %5.2fs %s\n' "$setup" "$load" "$rps" \
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
  printf '  %-16s %-10s %10s Gbit/s tunnel cpu %5.2fs\n' "$setup" "iperf3" "$gbps" \
    "$(echo "$(( after - before )) / $TICKS" | bc -l)"
}

bench_setup() { # name http_port tcp_port pids...
  local name=$1 http=$2 tcp=$3; shift 3
  run_wrk "$name" keepalive "$http" "$HOST" "$@"
  run_wrk "$name" close "$http" "$HOST" "$@"
  run_iperf "$name" "$tcp" "$@"
}

wait_tcp "$IPERF_PORT"; wait_http "http://127.0.0.1:$NGINX_PORT/1k.txt" "$HOST"
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); wrk -t$THREADS -c$CONNS -d${DURATION}s, 1 KiB body"

# --- (c) direct ---------------------------------------------------------------
echo "== direct"
bench_setup direct "$NGINX_PORT" "$IPERF_PORT"

# --- (a) tuna edge + agent ------------------------------------------------------
echo "== tuna edge + agent"
"$BENCH_BIN" edge --agent "127.0.0.1:$TUNA_AGENT" --http "127.0.0.1:$TUNA_HTTP" --tcp-port "$TUNA_TCP" \
  --ca-out "$WORK/tuna-ca.pem" --token "$TOKEN" --host "$HOST" & EDGE_PID=$!; PIDS+=($EDGE_PID)
wait_tcp "$TUNA_AGENT"
"$BENCH_BIN" agent --edge "127.0.0.1:$TUNA_AGENT" --ca "$WORK/tuna-ca.pem" --token "$TOKEN" --host "$HOST" \
  --tcp-port "$TUNA_TCP" --http-upstream "127.0.0.1:$NGINX_PORT" --tcp-upstream "127.0.0.1:$IPERF_PORT" \
  & AGENT_PID=$!; PIDS+=($AGENT_PID)
wait_http "http://127.0.0.1:$TUNA_HTTP/1k.txt" "$HOST"
bench_setup tuna "$TUNA_HTTP" "$TUNA_TCP" "$EDGE_PID" "$AGENT_PID"
kill "$EDGE_PID" "$AGENT_PID"

# --- (b) rathole ------------------------------------------------------------------
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
  bench_setup "rathole-$transport" "$RH_HTTP" "$RH_TCP" "$RS" "$RC"
  kill "$RS" "$RC"; wait "$RS" "$RC" 2>/dev/null || true
done

# --- summary --------------------------------------------------------------------
echo
echo "== summary (markdown)"
python3 - "$RESULTS" "$DURATION" "$TICKS" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
duration, ticks = float(sys.argv[2]), float(sys.argv[3])
val = {(r[0], r[1]): (float(r[2] or 0), float(r[3]) / ticks, r[4] if len(r) > 4 else "") for r in rows}
setups = [s for s in ["direct", "tuna", "rathole-tls", "rathole-tcp"] if (s, "iperf3") in val]
loads = [("keepalive", "HTTP keep-alive (req/s)"), ("close", "HTTP conn-per-request (req/s)"), ("iperf3", "iperf3 TCP (Gbit/s)")]
print("| load | " + " | ".join(setups) + " | tuna / rathole-tls | tuna / rathole-tcp |")
print("|---|" + "---|" * (len(setups) + 2))
for key, label in loads:
    cells = [f"{val[(s, key)][0]:,.0f}" if key != "iperf3" else f"{val[(s, key)][0]:.2f}" for s in setups]
    ratio = lambda other: f"{val[('tuna', key)][0] / val[(other, key)][0]:.2f}x" if (other, key) in val and val[(other, key)][0] else "-"
    print(f"| {label} | " + " | ".join(cells) + f" | {ratio('rathole-tls')} | {ratio('rathole-tcp')} |")
print()
print("| tunnel CPU (edge+agent / server+client) | " + " | ".join(s for s in setups if s != "direct") + " |")
print("|---|" + "---|" * (len(setups) - 1))
for key, label in loads:
    cells = []
    for s in setups:
        if s == "direct":
            continue
        amount, cpu, _ = val[(s, key)]
        if key == "iperf3":
            gib = amount * 1e9 * duration / 8 / 2**30
            cells.append(f"{cpu:.1f} s = {cpu / gib:.3f} s/GiB")
        else:
            cells.append(f"{cpu:.1f} s = {cpu * 1e6 / (amount * duration):.0f} µs/req")
    print(f"| {label} | " + " | ".join(cells) + " |")
PY
