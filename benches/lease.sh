#!/usr/bin/env bash
# The fleet's lease loop under a burst of attachments (a script, not a
# test): one replica on a throw-away PostgreSQL with `log_statement = all`,
# 1 000 tunnels attached at once, the lease loop's statements counted from
# the server's log; once with every change published on its own (the loop
# before coalescing) and once coalesced, in one run, with the ratio. See
# edge/examples/lease_bench.rs for what runs.
#
#   benches/lease.sh                     # TUNNELS=1000, a debug build
#   PROFILE=release benches/lease.sh     # the same from a release build
#
# Statement counts do not depend on the build; the debug build is the
# default so that the 2 shared cores of a developer machine are spared a
# release build.
set -euo pipefail
cd "$(dirname "$0")/.."

TUNNELS=${TUNNELS:-1000}
PROFILE=${PROFILE:-dev}
TARGET=${CARGO_TARGET_DIR:-target}

BIN=$(pg_config --bindir 2>/dev/null || true)
if [ ! -x "$BIN/initdb" ]; then
  BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
fi
[ -x "$BIN/initdb" ] || { echo "PostgreSQL server binaries not found: run scripts/setup.sh" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
  cargo build --release --config 'profile.release.lto="off"' --config 'profile.release.codegen-units=16' \
    -p tuna-edge --example lease_bench >&2
  BENCH="$TARGET/release/examples/lease_bench"
else
  cargo build -p tuna-edge --example lease_bench >&2
  BENCH="$TARGET/debug/examples/lease_bench"
fi

WORK=$(mktemp -d)
AS=()
if [ "$(id -u)" -eq 0 ]; then chown postgres: "$WORK"; AS=(runuser -u postgres --); fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
  [ -n "${KEEP_LOG:-}" ] && cp "$WORK/log" "$KEEP_LOG"
  "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"${AS[@]}" "$BIN/initdb" -D "$WORK/data" -A trust -U postgres --no-sync -E UTF8 >/dev/null
"${AS[@]}" "$BIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w \
  -o "-p $PORT -k $WORK -c listen_addresses=127.0.0.1 -c fsync=off -c log_statement=all" start >/dev/null
"$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE lease"

echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), profile $PROFILE, $TUNNELS tunnels"
"$BENCH" --store "postgres://postgres@127.0.0.1:$PORT/lease" --log "$WORK/log" --tunnels "$TUNNELS"
