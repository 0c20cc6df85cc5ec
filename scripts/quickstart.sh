#!/usr/bin/env bash
# The README's first command: builds tuna-operator and runs standalone mode with
# built-in demo backends and the manifests of examples/standalone. Prints the
# public URLs to open or curl. Extra arguments go to `tuna-operator standalone`.
#
# Standalone mode needs only the Rust build: setup.sh without --k8s installs no
# test fixture (the Kubernetes control plane takes ~10 min to build from source).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# `cargo run` runs the binary it built wherever CARGO_TARGET_DIR (or
# build.target-dir) puts it, and on Unix it execs it: signals reach the binary.
exec cargo run --locked --bin tuna-operator -- standalone --demo -f examples/standalone "$@"
