#!/usr/bin/env bash
# The connector proxy against direct access (a script, not a test):
# kubectl-shaped GETs through the connectors role's proxy (CONNECT, TLS
# intercepted, Authorization replaced, TokenReview cached) vs straight to the
# API server stand-in, in one run. See benches/connector_bench.rs.
#
#   benches/connector.sh                    # 10 s per run
#   SECONDS_PER_RUN=3 benches/connector.sh  # a quick run
#
# Release build (the workspace's release profile: fat LTO).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
RUN_SECONDS=${SECONDS_PER_RUN:-10}
CONNECTIONS=${CONNECTIONS:-16}
FRESH=${FRESH:-4}

echo "== building (release)"
cargo build --release --locked -p tuna-operator --example connector_bench
echo "== $(date -u +%FT%TZ)"
"$TARGET/release/examples/connector_bench" --seconds "$RUN_SECONDS" \
  --connections "$CONNECTIONS" --fresh-connections "$FRESH"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
