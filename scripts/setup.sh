#!/usr/bin/env bash
# Installs what building and testing tuna-operator needs on a fresh Debian machine.
# Idempotent: does nothing when everything is already there.
# `scripts/setup.sh --fuzz` also installs cargo-fuzz (for scripts/fuzz.sh).
set -euo pipefail

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)          # pingora's zlib-ng build
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v nc >/dev/null 2>&1 || need_apt+=(netcat-openbsd)  # the README's TCP example
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found. Install Rust with rustup (https://rustup.rs), then re-run." >&2
  exit 1
fi

# The Kubernetes API emulator's suite drives the real kubectl (v1.32 is on the
# development machines). Debian only ships a far older client, so we don't guess.
if ! command -v kubectl >/dev/null 2>&1; then
  echo "setup: kubectl not found. Install kubectl v1.32 (https://kubernetes.io/docs/tasks/tools/)," >&2
  echo "       the emulator's kubectl tests fail without it." >&2
fi

if [ "${1:-}" = "--fuzz" ]; then
  if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "setup: fuzzing needs the nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
  fi
  if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "setup: cargo install cargo-fuzz" >&2
    # Built in cargo's own temporary dir, not the workspace's target dir.
    env -u CARGO_TARGET_DIR cargo install --locked cargo-fuzz
  fi
fi
