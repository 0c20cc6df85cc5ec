#!/usr/bin/env bash
# Proxy-core load test: the same wrk load, several rounds, against
#   (a) the backend directly, (b) nginx as a keep-alive reverse proxy,
#   (c) the tuna proxy core (proxy/examples/bench_proxy.rs),
# all in front of the same backend (an nginx serving a small static body),
# with keep-alive and connection-per-request clients. Reports req/s,
# p50/p99 latency and the proxy process's CPU time per request (from
# /proc/<pid>/stat, summed over nginx's master and workers).
#
# CPUs are split so that the load generator does not compete with the proxy
# under test: wrk and the backend run on LOAD_CPUS, nginx (as a proxy) and
# the tuna proxy on PROXY_CPUS, with one worker per proxy CPU each. On two
# cores that is one core for the load and one for the proxy.
#
# Usage: benches/proxy.sh   (env: ROUNDS=3 DURATION=10s CONNS=50 WRK_THREADS=1
#                             LOAD_CPUS=0 PROXY_CPUS=1-(n-1) PROXY_THREADS=<#PROXY_CPUS>
#                             PROXY_MODE=multi|per-core PROFILE=bench-lto)
set -euo pipefail

ncpu=$(nproc)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-50}
LOAD_CPUS=${LOAD_CPUS:-0}
PROXY_CPUS=${PROXY_CPUS:-$([ "$ncpu" -gt 1 ] && echo "1-$((ncpu - 1))" || echo 0)}
WRK_THREADS=${WRK_THREADS:-1}
PROXY_THREADS=${PROXY_THREADS:-$(taskset -c "$PROXY_CPUS" nproc)}
PROXY_MODE=${PROXY_MODE:-multi}
PROFILE=${PROFILE:-bench-lto}
HOST=bench.example.com

cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}

for tool in wrk nginx; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (apt-get install -y wrk nginx-light)" >&2; exit 1; }
done

echo "== building the proxy core (profile $PROFILE)"
cargo build --profile "$PROFILE" --locked -p tuna-proxy --example bench_proxy
bin="$CARGO_TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")/examples/bench_proxy"

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "error: nothing listens on port $1" >&2; exit 1
}

backend_port=$(free_port)
nginx_port=$(free_port)
tuna_port=$(free_port)

# nginx config shared by both nginx instances (backend and proxy).
nginx_conf() { # name workers server-block
  mkdir -p "$tmp/$1"
  cat > "$tmp/$1/nginx.conf" <<CONF
daemon off;
worker_processes $2;
pid $tmp/$1/nginx.pid;
error_log $tmp/$1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/$1/body;
  proxy_temp_path $tmp/$1/proxy;
  fastcgi_temp_path $tmp/$1/fastcgi;
  uwsgi_temp_path $tmp/$1/uwsgi;
  scgi_temp_path $tmp/$1/scgi;
  keepalive_requests 1000000;
  $3
}
CONF
}

nginx_conf backend 1 "server { listen 127.0.0.1:$backend_port; location / { return 200 'hello from the backend\n'; } }"
nginx_conf proxy "$PROXY_THREADS" "upstream backend { server 127.0.0.1:$backend_port; keepalive 128; }
  server { listen 127.0.0.1:$nginx_port;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_set_header X-Forwarded-Host \$host;
      proxy_set_header X-Forwarded-Proto \$scheme;
    } }"

taskset -c "$LOAD_CPUS" nginx -e "$tmp/backend/error.log" -c "$tmp/backend/nginx.conf" -p "$tmp/backend" & pids+=($!)
taskset -c "$PROXY_CPUS" nginx -e "$tmp/proxy/error.log" -c "$tmp/proxy/nginx.conf" -p "$tmp/proxy" & nginx_pid=$!; pids+=($nginx_pid)
mode_arg=(); [ "$PROXY_MODE" = per-core ] && mode_arg=(per-core)
taskset -c "$PROXY_CPUS" "$bin" "127.0.0.1:$tuna_port" "$HOST" "127.0.0.1:$backend_port" "$PROXY_THREADS" "${mode_arg[@]}" >/dev/null & tuna_pid=$!; pids+=($tuna_pid)
wait_port "$backend_port"; wait_port "$nginx_port"; wait_port "$tuna_port"

# CPU ticks (utime+stime) of a process and its children processes (nginx
# workers are children of the master).
cpu_ticks() { # pid
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    total=$(( total + $(awk '{print $14 + $15}' "/proc/$p/stat") ))
  done
  echo "$total"
}
tck=$(getconf CLK_TCK)

to_ms() { # wrk latency like 512.00us / 1.20ms / 1.01s
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
    else { sub(/s$/, "", v); printf "%.3f", v * 1000 } }'
}

results="$tmp/results.tsv"
run() { # target port pid mode round
  local target=$1 port=$2 pid=$3 mode=$4 round=$5 extra=() before after out
  [ "$mode" = close ] && extra=(-H "Connection: close")
  before=$([ "$pid" = - ] && echo 0 || cpu_ticks "$pid")
  out=$(taskset -c "$LOAD_CPUS" wrk -t"$WRK_THREADS" -c"$CONNS" -d"$DURATION" --latency -H "Host: $HOST" "${extra[@]}" "http://127.0.0.1:$port/")
  after=$([ "$pid" = - ] && echo 0 || cpu_ticks "$pid")
  local rps p50 p99 reqs errs cpu
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  p50=$(to_ms "$(awk '$1 == "50%" {print $2}' <<<"$out")")
  p99=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
  errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
  if [ "$pid" = - ]; then cpu=-; else
    cpu=$(awk -v t=$(( after - before )) -v n="$reqs" -v hz="$tck" 'BEGIN { printf "%.1f", t / hz / n * 1e6 }'); fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$target" "$round" "$rps" "$p50" "$p99" "$cpu" "$errs" >> "$results"
  printf '  %-10s %-8s round %s: %10s req/s  p50 %7s ms  p99 %7s ms  cpu/req %6s us %s\n' \
    "$mode" "$target" "$round" "$rps" "$p50" "$p99" "$cpu" "$errs"
}

echo "== wrk -t$WRK_THREADS -c$CONNS -d$DURATION, $ROUNDS rounds, $ncpu cores;" \
  "load on CPUs $LOAD_CPUS, proxies on CPUs $PROXY_CPUS ($PROXY_THREADS workers, tuna $PROXY_MODE); $(uptime)"
# Warm up pools and caches.
for port in "$backend_port" "$nginx_port" "$tuna_port"; do
  wrk -t1 -c4 -d1s -H "Host: $HOST" "http://127.0.0.1:$port/" >/dev/null
done
for mode in keepalive close; do
  for round in $(seq 1 "$ROUNDS"); do
    run direct "$backend_port" - "$mode" "$round"
    run nginx "$nginx_port" "$nginx_pid" "$mode" "$round"
    run tuna "$tuna_port" "$tuna_pid" "$mode" "$round"
  done
done

echo
echo "== medians over $ROUNDS rounds"
python3 - "$results" <<'PY'
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
def med(mode, target, col):
    vals = [float(r[col]) for r in rows if r[0] == mode and r[1] == target and r[col] != "-"]
    return statistics.median(vals) if vals else float("nan")
print(f"| load | target | req/s | p50 ms | p99 ms | proxy CPU µs/req |")
print(f"|---|---|---:|---:|---:|---:|")
for mode in ("keepalive", "close"):
    for t in ("direct", "nginx", "tuna"):
        print(f"| {mode} | {t} | {med(mode,t,3):.0f} | {med(mode,t,4):.3f} | {med(mode,t,5):.3f} | "
              + ("-" if t == "direct" else f"{med(mode,t,6):.1f}") + " |")
print()
for mode in ("keepalive", "close"):
    rps = med(mode, "tuna", 3) / med(mode, "nginx", 3)
    d = med(mode, "direct", 4)
    added_tuna, added_nginx = med(mode, "tuna", 4) - d, med(mode, "nginx", 4) - d
    cpu = med(mode, "tuna", 6) / med(mode, "nginx", 6)
    print(f"{mode}: tuna/nginx req/s = {rps:.2f}x; added p50 tuna {added_tuna:.3f} ms vs nginx {added_nginx:.3f} ms "
          f"(diff {added_tuna - added_nginx:+.3f} ms); CPU/req tuna/nginx = {cpu:.2f}x")
PY
