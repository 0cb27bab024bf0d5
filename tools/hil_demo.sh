#!/usr/bin/env bash
# Watch pi0d solve the hardware-in-the-loop task: the MuJoCo robot (tests/hil/robot.py) with the
# cube where you put it, pi0d on config/hil_task.toml (models/hil-above-cube) over Cyclone DDS on
# loopback, the run recorded; then the camera's frames as a GIF, a plot of the run, and where the
# tool ended against the cube.
#
#     tools/hil_demo.sh [--cube X,Y] [--out DIR] [--seconds S]
#
# X in 0.32..0.52 and Y in -0.18..0.18 (m, on the table, clear of the bowl) are the placements
# the model was trained on. Needs what the tests need: Python 3 with venv and PyPI (the robot's
# pinned venv is made on first use), the Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

cube="0.465,0.128"
out="hil-demo"
# The task's episode, as the test and lerobot's rollout judge it (models/hil-above-cube/rollout.json).
seconds="3"
while [ $# -gt 0 ]; do
  case "$1" in
    --cube) cube="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    *) echo "usage: $0 [--cube X,Y] [--out DIR] [--seconds S]" >&2; exit 2 ;;
  esac
done

./tools/peers_venv.sh
cargo build --release --quiet
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out/robot.ready" "$out/robot.json" "$out"/pi0d-*.mcap
export CYCLONEDDS_URI="file://$PWD/tests/peers/cyclone_loopback.xml" MUJOCO_GL="${MUJOCO_GL:-egl}"
domain=$(( 100 + RANDOM % 100 ))

echo "== the robot: cube at ($cube), an episode of $seconds s from the arm's first motion"
.venv/bin/python tests/hil/robot.py --domain "$domain" --duration 30 --report "$out/robot.json" \
  --ready-file "$out/robot.ready" --cube "$cube" --episode-s "$seconds" &
robot=$!
trap 'kill $robot 2>/dev/null || true' EXIT
for _ in $(seq 300); do [ -e "$out/robot.ready" ] && break; sleep 0.1; done
[ -e "$out/robot.ready" ] || { echo "the robot did not come up" >&2; exit 1; }

echo "== pi0d: config/hil_task.toml, recording to $out"
target/release/pi0d run --config config/hil_task.toml --duration 60 --summary "$out/summary.json" \
  --ros-args -p "ros.domain_id:=$domain" -p "record.path:=$out/" -p "record.camera_hz:=10" &
pi0d=$!
wait "$robot"
trap - EXIT
kill -TERM "$pi0d"
wait "$pi0d"

rec="$(ls "$out"/pi0d-*.mcap | head -1)"
.venv/bin/python tools/mcap_gif.py "$rec" "$out/camera.gif"
target/release/pi0d plot "$rec" --out "$out/run.png"
.venv/bin/python - "$out/robot.json" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
tool, cube = r["tool_final"], r["cube_final"]
xy = math.hypot(tool[0] - cube[0], tool[1] - cube[1])
dz = tool[2] - cube[2]
# The task's criteria (tools/hil_task.py): within 3 cm across, 4 to 15 cm above.
ok = xy < 0.03 and 0.04 < dz < 0.15
print(f"the tool ended {xy * 1e3:.0f} mm from the cube across the table and {dz * 1e3:.0f} mm above it: "
      f"{'solved' if ok else 'not solved'}")
PY
echo "look at: $out/camera.gif (what the policy saw), $out/run.png (the run per joint), $rec"
