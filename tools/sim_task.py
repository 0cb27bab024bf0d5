#!/usr/bin/env python3
"""The bundled demo model (models/sim-reach): a tiny pi0 trained to move the tool over the red
target that pi0d's built-in simulator draws (config/sim.toml's [sim.task]). Run by hand in the
reference environment (tools/golden/setup.sh: Python 3.12, pinned lerobot 0.6.1):

    ~/venvs/golden/bin/python tools/sim_task.py collect --episodes 400 --out /tmp/sim-reach-data
    ~/venvs/golden/bin/python tools/sim_task.py train --data /tmp/sim-reach-data --steps 3000 \\
        --batch-size 16 --resolution 112 --out models/sim-reach

`collect` has the simulator itself write scripted demonstrations (`cargo run --release
--example sim_demos`: the same scene, camera and arm dynamics pi0d runs; the expert heads for
each target's pose from wherever the arm is) and turns them into a LeRobotDataset with
lerobot's own writer: 50 frames per second (the chunk step), the camera above the table as
configured, the joint positions as the state and the commanded positions as the action.

`train` trains a pi0 at the bundled tiny model's widths from scratch with lerobot's own
training loop on the CPU and writes the checkpoint pi0d loads, with the training log.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np

import lerobot_tiny

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config/sim.toml"
FPS = 50


def collect(args):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from safetensors.numpy import load_file

    cfg = tomllib.loads(Path(args.config).read_text())
    names = cfg["robot"]["joints"]
    prompt = cfg["policy"]["prompt"]
    raw = Path(args.out).with_name(Path(args.out).name + "-raw")
    if raw.exists():
        shutil.rmtree(raw)
    subprocess.run(["cargo", "run", "--release", "--quiet", "--example", "sim_demos", "--",
                    str(args.config), str(args.episodes), str(args.seed), str(raw), str(args.episode_s)],
                   cwd=ROOT, check=True)
    files = sorted(raw.glob("episode_*.safetensors"))
    first = load_file(files[0])
    image_keys = [k for k in first if k.startswith("observation.images.")]
    features = {k: {"dtype": "image", "shape": first[k].shape[1:], "names": ["height", "width", "channels"]}
                for k in image_keys}
    for k in ("observation.state", "action"):
        features[k] = {"dtype": "float32", "shape": (len(names),), "names": names}
    out = Path(args.out)
    ds = LeRobotDataset.create(repo_id="pi0d/sim-reach", fps=FPS, features=features, root=out,
                               robot_type="sim_arm", use_videos=False, image_writer_threads=2)
    for i, f in enumerate(files):
        ep = load_file(f)
        for k in range(len(ep["action"])):
            frame = {key: ep[key][k] for key in features}
            frame["task"] = prompt
            ds.add_frame(frame)
        ds.save_episode()
        f.unlink()
        if i % 50 == 0:
            print(f"episode {i} of {len(files)}", flush=True)
    ds.finalize()
    shutil.rmtree(raw)
    summary = {"episodes": len(files), "episode_s": args.episode_s, "seed": args.seed, "prompt": prompt,
               "config": str(Path(args.config).resolve().relative_to(ROOT))}
    (out / "collect.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="scripted demonstrations from pi0d's simulator")
    c.add_argument("--config", default=str(CONFIG), help="a configuration with [sim.task]")
    c.add_argument("--episodes", type=int, default=400)
    c.add_argument("--episode-s", type=float, default=3.0)
    c.add_argument("--seed", type=int, default=0, help="the targets' (the demo's config uses another)")
    c.add_argument("--out", required=True, help="the dataset's root (must not exist)")
    t = sub.add_parser("train", help="train the tiny pi0 with lerobot's training loop")
    t.add_argument("--data", required=True, help="the dataset `collect` wrote")
    t.add_argument("--out", required=True, help="where the checkpoint goes")
    t.add_argument("--work", default="/tmp/sim-reach-train", help="lerobot's output directory (replaced)")
    t.add_argument("--steps", type=int, default=3000)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--resolution", type=int, default=112)
    t.add_argument("--workers", type=int, default=1)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--save-every", type=int, default=500)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--init", default=None, help="start from this checkpoint's weights (a second round)")
    args = ap.parse_args()
    if args.cmd == "collect":
        collect(args)
    else:
        lerobot_tiny.train(args, "sim-reach")


if __name__ == "__main__":
    sys.exit(main())
