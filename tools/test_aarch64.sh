#!/usr/bin/env bash
# The SIMD kernels for the deployment target (aarch64: NEON, and the portable fallback),
# cross-compiled and run under qemu-user. Called by tools/test.sh; installs what it needs:
# the rustup target, and Debian's cross linker and qemu-user (pinned to Debian 12's versions).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target list --installed | grep -qx aarch64-unknown-linux-gnu \
  || rustup target add aarch64-unknown-linux-gnu
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "the aarch64 cross linker or qemu-user is missing: installing Debian's" \
    "gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user with ${sudo:-root} apt-get"
  $sudo apt-get update -q
  # qemu-user gets Debian security updates: pinned to its release, not its patch level.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
    gcc-aarch64-linux-gnu=4:12.2.0-3 libc6-dev-arm64-cross 'qemu-user=1:7.2+dfsg-7*'
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo clippy -p pi0d-kernels --target aarch64-unknown-linux-gnu --all-targets --locked -- -D warnings
# qemu's default CPU (max) has FEAT_DotProd and FEAT_I8MM: their int8 kernels must be tested.
PI0D_EXPECT_I8_KERNELS=I8mm,Dotprod,Neon \
  cargo test -p pi0d-kernels --target aarch64-unknown-linux-gnu --locked
