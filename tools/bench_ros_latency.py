#!/usr/bin/env python3
"""ROS 2 latency of pi0d against the interop peers, on loopback:

* observation latency: a camera frame's capture stamp (set by the peer just before it sends)
  to the decoded frame ready on pi0d's blackboard, for 640x480 raw rgb8 (921 KB) and 640x480
  JPEG, as pi0d measures it and reports in /diagnostics (p50 / p99 / max over its last frames);
* command latency: a command's write (the DDS source timestamp, or rmw_zenoh's attachment
  timestamp) to its arrival at the peer;
* command timing: the interval between consecutive commands at the peer (p50 / p99 / max),
  with small frames and with the camera load of `--size` at `--fps`; on DDS also between
  pi0d's writes, which is pi0d's own timing without the Python peer's polling.

Over DDS (the Cyclone DDS peer) and, when pi0d was built with `--features zenoh`, over Zenoh
(the eclipse-zenoh peer). Run from the repository root after `./tools/test.sh` (it makes
.venv) and `cargo build --release [--features zenoh]`:

    .venv/bin/python tools/bench_ros_latency.py [--seconds 10] [--fps 30] [--size 640x480]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "pi0d"
PY = ROOT / ".venv" / "bin" / "python"


def config(middleware: str, domain: int, port: int) -> dict:
    cfg = tomllib.loads((ROOT / "config" / "sim.toml").read_text())
    cfg["robot"]["urdf"] = str(ROOT / "urdf" / "sim_arm.urdf")
    cfg["robot"]["io"] = "ros"
    cfg["policy"] = {"kind": "scripted", "action_joints": cfg["policy"]["action_joints"],
                     "amplitude": 0.3, "frequency_hz": 0.2, "latency_s": 0.08}
    cfg.pop("sim", None)
    cfg["safety"]["joint_state_timeout_s"] = 0.3
    ros = {"middleware": middleware, "domain_id": domain, "loopback_only": True,
           "cameras": ["/camera/image_raw", "/wrist/image_raw/compressed"]}
    if middleware == "zenoh":
        ros["zenoh_connect"] = [f"tcp/127.0.0.1:{port}"]
    cfg["ros"] = ros
    return cfg


def dump_toml(d: dict, prefix="") -> str:
    """A minimal TOML writer for the config above (tables, scalars, lists)."""
    lines, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    out = "\n".join(lines) + "\n"
    for k, v in tables:
        name = f"{prefix}{k}"
        out += f"\n[{name}]\n" + dump_toml(v, name + ".")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(middleware: str, seconds: float, fps: float, size: str, tmp: Path):
    domain, port = 90 + os.getpid() % 60, free_port()
    cfg_path = tmp / f"{middleware}.toml"
    cfg_path.write_text(dump_toml(config(middleware, domain, port)))
    report = tmp / f"{middleware}.json"
    common = ["--duration", str(seconds + 4), "--report", str(report), "--image-size", size, "--fps", str(fps)]
    if middleware == "dds":
        peer_cmd = [str(PY), str(ROOT / "tests/peers/robot_peer.py"), "--domain", str(domain), *common]
        env = dict(os.environ, CYCLONEDDS_URI=f"file://{ROOT / 'tests/peers/cyclone_loopback.xml'}")
    else:
        peer_cmd = [str(PY), str(ROOT / "tests/peers/zenoh_robot_peer.py"), "--domain", str(domain),
                    "--listen", f"tcp/127.0.0.1:{port}", *common]
        env = dict(os.environ)
    peer = subprocess.Popen(peer_cmd, env=env, stdout=subprocess.DEVNULL)
    if middleware == "zenoh":
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("the Zenoh peer never listened")
                time.sleep(0.05)
    daemon = subprocess.run([str(BIN), "run", "--quiet", "--duration", str(seconds), "--config", str(cfg_path)],
                            capture_output=True, text=True)
    peer.wait()
    if daemon.returncode != 0:
        sys.exit(f"pi0d failed ({middleware}):\n{daemon.stderr}")
    r = json.loads(report.read_text())
    running = [d for d in r["diagnostics"] if d["message"] == "running"]
    if not running:
        sys.exit(f"no diagnostics from pi0d ({middleware}): {r}")
    return running[-1]["values"], r["command_latency_ms"], r.get("interarrival_ms"), r.get("write_interval_ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--size", default="640x480")
    args = ap.parse_args()
    if not BIN.exists():
        sys.exit(f"{BIN} missing: cargo build --release [--features zenoh]")
    results, light = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mw in ["dds", "zenoh"]:
            try:
                results[mw] = run(mw, args.seconds, args.fps, args.size, Path(tmp))
                light[mw] = run(mw, args.seconds, 10.0, "64x48", Path(tmp))
            except SystemExit as e:
                if mw == "zenoh" and "zenoh` feature" in str(e):
                    print("zenoh: pi0d was built without the `zenoh` feature; skipped")
                    continue
                raise
    row = lambda mw, label, q: print(  # noqa: E731
        f"  {mw:8} {label:34} {q['p50']:8.2f} {q['p99']:8.2f} {q['max']:8.2f}") if q else None
    print(f"\n{args.size} frames at {args.fps:g} Hz, {args.seconds:g} s, loopback (ms):")
    print(f"  {'':8} {'input':34} {'p50':>8} {'p99':>8} {'max':>8}")
    for mw, (values, cmd, gaps, writes) in results.items():
        for cam, label in [(0, "raw rgb8 -> decoded"), (1, "JPEG -> decoded")]:
            v = [values.get(f"camera {cam} latency {q} (ms)", "n/a") for q in ("p50", "p99", "max")]
            print(f"  {mw:8} {label:34} {v[0]:>8} {v[1]:>8} {v[2]:>8}")
        row(mw, "command write -> peer", cmd)
        row(mw, f"command interval, {args.size} cameras", gaps)
        row(mw, f"command write interval, {args.size}", writes)
        _, cmd_l, gaps_l, writes_l = light[mw]
        row(mw, "command interval, 64x48 cameras", gaps_l)
        row(mw, "command write interval, 64x48", writes_l)


if __name__ == "__main__":
    main()
