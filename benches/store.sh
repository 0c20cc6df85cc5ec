#!/usr/bin/env bash
# The control plane's store (a script, not a test): in one run, against
#   (a) redb, the embedded default (`<data-dir>/control.redb`),
#   (b) PostgreSQL, one control plane,
#   (c) PostgreSQL, two control planes (two replicas of a fleet) at once,
# reservations/s (one durable commit each), the fill rate up to DOMAINS
# domains + TOKENS tokens, list/lookup latencies in the filled store, the
# time to open (load) it, and (PostgreSQL) how long a token revoked on one
# replica takes to be announced on the other. Prints one JSON line per
# store, then a summary with the PostgreSQL/redb ratio.
#
#   benches/store.sh                        # THREADS=8 DOMAINS=10000 TOKENS=10000
#   FSYNC=off benches/store.sh              # PostgreSQL without WAL fsync
#
# PostgreSQL runs from Debian's server binaries (scripts/setup.sh), in a
# temporary directory on a free port, as the postgres user when run as root,
# with fsync on by default (both stores then sync every commit to disk).
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=${THREADS:-8}
DOMAINS=${DOMAINS:-10000}
TOKENS=${TOKENS:-10000}
RESERVATIONS=${RESERVATIONS:-2000}
FSYNC=${FSYNC:-on}
TARGET=${CARGO_TARGET_DIR:-target}

BIN=$(pg_config --bindir 2>/dev/null || true)
if [ ! -x "$BIN/initdb" ]; then
  BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
fi
[ -x "$BIN/initdb" ] || { echo "PostgreSQL server binaries not found: run scripts/setup.sh" >&2; exit 1; }

# Release without fat LTO: the figures are I/O- and round-trip-bound.
cargo build --release --config 'profile.release.lto="off"' --config 'profile.release.codegen-units=16' \
  -p tuna-edge --example store_bench >&2
BENCH="$TARGET/release/examples/store_bench"

WORK=$(mktemp -d)
AS=()
if [ "$(id -u)" -eq 0 ]; then chown postgres: "$WORK"; AS=(runuser -u postgres --); fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
  "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"${AS[@]}" "$BIN/initdb" -D "$WORK/data" -A trust -U postgres --no-sync -E UTF8 >/dev/null
"${AS[@]}" "$BIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w \
  -o "-p $PORT -k $WORK -c listen_addresses=127.0.0.1 -c fsync=$FSYNC" start >/dev/null
psql() { "$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres "$@"; }
psql -d postgres -c "CREATE DATABASE one" -c "CREATE DATABASE two"
PG_VERSION=$(psql -d postgres -tAc "SHOW server_version")

run() { # label, args…
  local dir; dir=$(mktemp -d -p "$WORK")
  "$BENCH" --data-dir "$dir" --threads "$THREADS" --reservations "$RESERVATIONS" \
    --domains "$DOMAINS" --tokens "$TOKENS" "$@" | tee -a "$WORK/figures.jsonl"
}
run
run --store "postgres://postgres@127.0.0.1:$PORT/one"
run --store "postgres://postgres@127.0.0.1:$PORT/two" --replicas 2

python3 - "$WORK/figures.jsonl" "$PG_VERSION" "$FSYNC" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
redb = rows[0]
print(f"\nPostgreSQL {sys.argv[2]} (fsync={sys.argv[3]}), {redb['threads']} threads, "
      f"{redb['domains']} domains + {redb['tokens']} tokens")
print("| store | replicas | reservations/s | vs redb | fill domains/s | fill tokens/s | list domains (med/p99) | list tokens | list tokens n=7 | get domain | authenticate token | open full store | revocation on the other replica (med/max) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
def lat(v, unit="us"):
    if unit == "ms":
        return f"{v['median_us']/1e3:.1f} / {v['p99_us']/1e3:.1f} ms"
    return f"{v['median_us']:.1f} / {v['p99_us']:.1f} µs"
for r in rows:
    prop = r["revocation_propagation"]
    prop = f"{prop['median_ms']:.1f} / {prop['max_ms']:.1f} ms" if prop else "—"
    print(f"| {r['store']} | {r['replicas']} | {r['reservations_per_s']:.0f} | "
          f"{r['reservations_per_s']/redb['reservations_per_s']:.2f}× | {r['fill_domains_per_s']:.0f} | "
          f"{r['fill_tokens_per_s']:.0f} | {lat(r['list_domains'], 'ms')} | {lat(r['list_tokens'], 'ms')} | "
          f"{lat(r['list_tokens_selector'], 'ms')} | {lat(r['get_domain'])} | {lat(r['authenticate_tunnel'])} | "
          f"{r['open_full_ms']:.0f} ms | {prop} |")
PY
