#!/usr/bin/env bash
# Runs every test of dckpt. Installs what is missing first (idempotent:
# nothing is installed when it is already there), so it works on a fresh
# Debian/Ubuntu machine with a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "scripts/test.sh: cargo not found; install Rust (https://rustup.rs) first" >&2
    exit 1
fi
# System packages the build and the mpirun tests need.
packages=()
if command -v dpkg >/dev/null 2>&1; then
    for p in ${DCKPT_APT_PACKAGES:-}; do
        dpkg -s "$p" >/dev/null 2>&1 || packages+=("$p")
    done
    if [ ${#packages[@]} -gt 0 ]; then
        echo "installing: ${packages[*]}"
        sudo_cmd=""
        [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
        $sudo_cmd apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${packages[@]}" >/dev/null
    fi
fi

cargo build --release --all-targets
cargo test --release
