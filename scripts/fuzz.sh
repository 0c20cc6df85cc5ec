#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: `scripts/fuzz.sh SECONDS` (default
# 60 s per target). One build (nightly, cargo-fuzz, release with debug
# assertions, address sanitizer) serves every target of fuzz/ — the HTTP/1
# codec's heads and chunked decoder, the tunnel's frame decoder, the
# operator's upstream URLs and the control plane's label selectors. The
# corpora persist in fuzz/corpus/ (untracked; seeded from fuzz/seeds/), so a
# later run goes on from there. A crash fails the run; the input that made it
# is in fuzz/artifacts/<target>/.
#
# Needs the nightly toolchain and cargo-fuzz: `scripts/setup.sh --fuzz`
# installs cargo-fuzz if it is missing and checks for nightly.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
scripts/setup.sh --fuzz

# cargo-fuzz builds in fuzz/target: the instrumented build cannot share the
# workspace's target dir.
unset CARGO_TARGET_DIR
# cargo-fuzz compiles release builds with one codegen unit, so the operator
# crate compiles on one core; cargo-fuzz's own help suggests 16 for faster
# builds at the price of somewhat slower runs, the right trade for CI's short
# runs. FUZZ_CODEGEN_UNITS=1 for a long campaign. `run` is given the same
# flags as `build`, or it would build everything again.
flags=(--fuzz-dir fuzz -O --codegen-units "${FUZZ_CODEGEN_UNITS:-16}")
start=$(date +%s)
echo "== fuzz: building every target"
# cargo-fuzz has no --locked: check fuzz/Cargo.lock first, so that a lock
# file that fell behind a manifest fails here instead of being rewritten.
cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null
cargo +nightly fuzz build "${flags[@]}"
for target in $(cargo +nightly fuzz list --fuzz-dir fuzz); do
  mkdir -p "fuzz/corpus/$target"
  seeds=()
  [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
  echo "== fuzz: $target for ${secs} s"
  cargo +nightly fuzz run "${flags[@]}" "$target" "fuzz/corpus/$target" "${seeds[@]}" -- \
    -max_total_time="$secs" -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 2>&1 |
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|==[0-9]+==|SUMMARY|thread .* panicked|Test unit written)' || true
  # `grep` ate the exit status: a crash leaves an artifact behind.
  if compgen -G "fuzz/artifacts/$target/[clot][reoi][amk]*-*" >/dev/null; then
    echo "fuzz: $target found a crash: $(ls fuzz/artifacts/"$target"/)" >&2
    exit 1
  fi
done
echo "fuzz: every target ran ${secs} s without a crash ($(( $(date +%s) - start )) s in all)"
