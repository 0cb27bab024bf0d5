#!/usr/bin/env bash
# The closed-loop HIL task (tests/hil_task.rs: 20 cube placements, the MuJoCo robot over
# Cyclone DDS) run with the trained model in f32 and quantized with each scheme, one after the
# other on the same placements; each also calibrated on recordings of the f32 episodes.
#
#   ./tools/hil_quant.sh [OUT_DIR]     (after ./tools/test.sh has made .venv; a quiet machine:
#                                       the robot renders and steps in real time)
#
# Prints each run's success line. About 2 minutes a run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-/tmp/pi0d-hil-quant}")
rm -rf "$out" && mkdir -p "$out/recordings"
model=models/hil-above-cube
cargo build --all-features --locked --bin pi0d -q
bin=target/debug/pi0d
run() { # label [env...]
    local label=$1; shift
    env "$@" cargo test --all-features --locked -q --test hil_task -- --nocapture --test-threads 1 \
        > "$out/$label.log" 2>&1 || echo "$label: the test failed (see $out/$label.log)"
    grep -h "^hil task (" "$out/$label.log" | sed "s/^/$label: /" || true
}
run f32 PI0D_HIL_RECORD="$out/recordings"
for scheme in w8 w8a8 w4; do
    rtn=(); [ "$scheme" = w4 ] && rtn=(--round-to-nearest)  # plain w4, beside the calibrated one below
    "$bin" quantize --checkpoint "$model" --out "$out/$scheme" --scheme "$scheme" "${rtn[@]}" > /dev/null
    run "$scheme" PI0D_HIL_CHECKPOINT="$out/$scheme"
done
# Calibrated (GPTQ) on the first five f32 episodes' recordings (the robot's camera and joints).
calibration=()
for f in $(ls "$out"/recordings/*.mcap | head -5); do calibration+=(--calibration "$f"); done
for scheme in w8 w8a8 w4; do
    "$bin" quantize --checkpoint "$model" --out "$out/$scheme-calibrated" --scheme "$scheme" "${calibration[@]}"
    run "$scheme-calibrated" PI0D_HIL_CHECKPOINT="$out/$scheme-calibrated"
done
