#!/usr/bin/env bash
# An edge fleet under HTTP load (a script, not a test): three replicas on one
# throw-away PostgreSQL, in one run: keep-alive req/s spread over 1, 2 and 3
# replicas (agent attached to all), and through one replica for a tunnel
# attached there vs one attached to another replica (the internal hop), with
# the ratios. See edge/examples/fleet_bench.rs for what runs.
#
#   benches/fleet.sh                 # CONNS=32 SECONDS_EACH=5
#   PROFILE=dev benches/fleet.sh     # without the release build (figures of a debug build)
#
# PostgreSQL runs from Debian's server binaries (scripts/setup.sh), in a
# temporary directory on a free port, as the postgres user when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

CONNS=${CONNS:-32}
SECONDS_EACH=${SECONDS_EACH:-5}
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-target}

BIN=$(pg_config --bindir 2>/dev/null || true)
if [ ! -x "$BIN/initdb" ]; then
  BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
fi
[ -x "$BIN/initdb" ] || { echo "PostgreSQL server binaries not found: run scripts/setup.sh" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
  # As benches/store.sh: release without fat LTO.
  cargo build --release --config 'profile.release.lto="off"' --config 'profile.release.codegen-units=16' \
    -p tuna-edge --example fleet_bench >&2
  BENCH="$TARGET/release/examples/fleet_bench"
else
  cargo build -p tuna-edge --example fleet_bench >&2
  BENCH="$TARGET/debug/examples/fleet_bench"
fi

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
  -o "-p $PORT -k $WORK -c listen_addresses=127.0.0.1" start >/dev/null
"$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE fleet"

echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), profile $PROFILE, $CONNS connections, ${SECONDS_EACH} s per load"
"$BENCH" --store "postgres://postgres@127.0.0.1:$PORT/fleet" --conns "$CONNS" --seconds "$SECONDS_EACH"
