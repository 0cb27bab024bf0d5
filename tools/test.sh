#!/usr/bin/env bash
# Installs what the tests need and runs every test. `.ci/run` calls exactly this.
# Everything installed here is pinned; nothing is assumed to be on the machine but the Rust
# toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never

# The interop tests' independent peers (Cyclone DDS, rosbags, MuJoCo, ...), pinned, in a
# project venv.
echo "== peers venv (.venv)"
./tools/peers_venv.sh
# systemd-analyze checks the service unit (Debian 12's systemd).
if ! command -v systemd-analyze >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends 'systemd=252.*'
fi
# One profile for the whole run: tests in dev with optimized dependencies (Cargo.toml).
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (all targets, default and all features, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# The compute kernels for the aarch64 board (NEON), under qemu-user.
echo "== aarch64 kernels (cross-compiled, qemu-user)"
./tools/test_aarch64.sh
# Every feature that can run here is tested (onnx: ONNX Runtime from the venv's wheel).
echo "== cargo test (all features)"
cargo test --workspace --all-features --locked --no-fail-fast
