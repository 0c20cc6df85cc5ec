#!/usr/bin/env bash
# The test command of the README: installs what the tests need, then runs the
# whole workspace's tests (unit, property, integration, end to end) in one build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export RUST_BACKTRACE=1
cargo test --workspace --locked "$@"
