#!/usr/bin/env bash
# The README's first command: builds tuna-operator and runs standalone mode with
# built-in demo backends and the manifests of examples/standalone. Prints the
# public URLs to open or curl. Extra arguments go to `tuna-operator standalone`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --locked --bin tuna-operator
exec target/debug/tuna-operator standalone --demo -f examples/standalone "$@"
