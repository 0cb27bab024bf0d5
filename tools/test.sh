#!/usr/bin/env bash
# Installs what the tests need and runs every test. `.ci/run` calls exactly this.
# Everything installed here is pinned; nothing is assumed to be on the machine but the Rust
# toolchain, python3 and, where tools are missing, apt-get (as root, or through sudo).
# Each stage prints its time and the total so far; a table of stages ends the run. A failing
# check does not stop the later ones (one failure must not hide another); the exit status is
# non-zero if anything failed. A failing setup stage stops the run (nothing after it can pass).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never
# A clean build (CI, a fresh clone) gains nothing from incremental caches: they cost build time
# and gigabytes of disk. A developer who wants them keeps them with CARGO_INCREMENTAL=1.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$target_dir"
target_dir="$(cd "$target_dir" && pwd)"

# Everything the run writes to a temporary directory (tests, their peers, rustc, pip) goes to a
# fresh directory that is removed at the end, so the run leaves nothing in /tmp. Under the
# target dir when its path is short: tests bind Unix sockets there (108-byte path limit).
run_tmp="$target_dir/tmp-run"
if [ "${#run_tmp}" -gt 40 ]; then
  run_tmp="$(mktemp -d "${TMPDIR:-/tmp}/pi0d-test.XXXXXX")"
else
  rm -rf "$run_tmp" && mkdir -p "$run_tmp"
fi
export TMPDIR="$run_tmp"
test_log="$target_dir/test-run.log"

t0=$SECONDS
failed=0
stage_names=()
stage_secs=()
stage_results=()

# stage NAME COMMAND...: runs COMMAND as one stage, prints its time and the total so far.
# Returns COMMAND's status; the caller decides whether the run goes on.
stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "== $name"
  "$@" || rc=$?
  local secs=$((SECONDS - start)) result=ok
  [ "$rc" -eq 0 ] || result="FAILED (exit $rc)"
  stage_names+=("$name")
  stage_secs+=("$secs")
  stage_results+=("$result")
  echo "== $name: $result in ${secs}s (total $((SECONDS - t0))s)"
  return "$rc"
}

# The slowest test binaries, from cargo's "Running" lines and libtest's "finished in" lines.
slowest_binaries() {
  [ -s "$test_log" ] || return 0
  echo "Slowest test binaries (seconds, as libtest reports them):"
  awk '/^ *Running /{bin=($2 == "unittests") ? $3 : $2} /^test result:/{t=$NF; sub(/s$/,"",t); print t, bin}' "$test_log" \
    | sort -rn | head -15 | awk '{printf "  %8.1f  %s\n", $1, $2}'
}

summary() {
  local rc=$?
  local left
  left="$(find "$run_tmp" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
  rm -rf "$run_tmp"
  echo
  slowest_binaries
  echo "Stages:"
  local i
  for i in "${!stage_names[@]}"; do
    printf '  %-52s %6ss  %s\n' "${stage_names[$i]}" "${stage_secs[$i]}" "${stage_results[$i]}"
  done
  printf '  %-52s %6ss\n' "total" "$((SECONDS - t0))"
  echo "Entries the run left in its temporary directory (removed now): $left"
  if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "FAILED"
    [ "$rc" -ne 0 ] || exit 1
  fi
}
trap summary EXIT

# systemd-analyze checks the service unit: Debian 12's systemd, installed into the system (not
# a venv) with apt-get, as root or through sudo, only when systemd-analyze is missing. The
# package list is printed first; at a terminal the run asks before apt touches the system
# (declining stops the run: the unit checks cannot pass without it), elsewhere (CI, .ci/run,
# stdin not a terminal) it goes ahead without asking, so it never waits for an answer.
system_packages=('systemd=252.*')
install_systemd() {
  if command -v systemd-analyze >/dev/null; then
    echo "systemd-analyze: $(command -v systemd-analyze)"
    return 0
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "systemd-analyze is missing (tests/it/systemd_notify.rs verifies systemd/pi0d.service with it)."
  echo "System packages to install with ${sudo:-root} apt-get (apt-get update first):"
  printf '  %s\n' "${system_packages[@]}"
  if [ -t 0 ]; then
    local answer=""
    read -r -p "Install them into the system now? [y/N] " answer || answer=""
    case "$answer" in
      y | Y | yes | YES) ;;
      *)
        echo "Not installed. Install them yourself (or run non-interactively, e.g. < /dev/null) and run again."
        return 1
        ;;
    esac
  else
    echo "stdin is not a terminal: installing without asking"
  fi
  $sudo apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
      "${system_packages[@]}"
}

# Setup: the interop tests' independent peers (Cyclone DDS, rosbags, MuJoCo, ...), pinned
# wheels in a project venv (.venv); then systemd-analyze.
stage "peers venv (.venv)" ./tools/peers_venv.sh || exit 1
stage "systemd-analyze (apt if missing)" install_systemd || exit 1

# One profile for the whole run: dev, dependencies optimized (Cargo.toml).
stage "cargo fmt --check" cargo fmt --all -- --check || failed=1

# Clippy with every feature lints while the tests are built: clippy's driver compiles the
# workspace's crates (as `cargo clippy` runs it, through RUSTC_WORKSPACE_WRAPPER), so the
# dependencies are built once instead of checked for clippy and built again for the tests
# (that check and a second one with default features cost a third of the run). The same
# environment for the test run, or cargo would rebuild. `tools/lint.sh` also lints the code
# as the default features build it; run it before committing.
clippy_driver="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)"
if [ -z "$clippy_driver" ]; then
  echo "clippy-driver not found: install clippy (rustup component add clippy)" >&2
  exit 1
fi
with_clippy() {
  RUSTC_WORKSPACE_WRAPPER="$clippy_driver" \
    CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" "$@"
}
# The compute kernels for the aarch64 board (NEON), under qemu-user (own target dir subtree:
# only the kernels and their few dependencies are cross-built).
stage "aarch64 kernels (cross, qemu-user)" ./tools/test_aarch64.sh || failed=1
# Every feature that can run here is tested (onnx: ONNX Runtime from the venv's wheel). Built
# first as a stage of its own so that the build and the run are timed apart. The benches and
# examples are built (and so linted) too; they have no doctests to run. `--lib` builds the
# model of AscendCL (tools/ascendcl-model, a shared library the acl backend's tests load).
test_targets=(--workspace --all-features --locked --lib --bins --tests)
build_and_lint() {
  with_clippy cargo test "${test_targets[@]}" --no-run \
    && with_clippy cargo build --workspace --all-features --locked --lib --benches --examples
}
stage "cargo test build + clippy (all features, all targets)" build_and_lint || failed=1
run_tests() { with_clippy cargo test "${test_targets[@]}" --no-fail-fast 2>&1 | tee "$test_log"; }
stage "cargo test run (all features)" run_tests || failed=1
[ "$failed" -eq 0 ]
