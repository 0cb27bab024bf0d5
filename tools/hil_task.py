#!/usr/bin/env python3
"""The closed-loop task of the hardware-in-the-loop suite, in the MuJoCo scene of
tests/hil/robot.py: move the tool above the red cube, whose position on the table varies per
episode and is visible only in the front camera. Run by hand in the reference environment
(tools/golden/setup.sh: Python 3.12, pinned lerobot 0.6.1 and mujoco):

    ~/venvs/golden/bin/python tools/hil_task.py collect --episodes 300 --out /tmp/hil-task-data

    ~/venvs/golden/bin/python tools/hil_task.py train --data /tmp/hil-task-data --steps 4000 \
        --batch-size 16 --resolution 112 --workers 2 --out models/hil-above-cube
    ~/venvs/golden/bin/python tools/hil_task.py rollout --checkpoint models/hil-above-cube \
        --episodes 20 --report models/hil-above-cube/rollout.json
    ~/venvs/golden/bin/python tools/hil_task.py golden --checkpoint models/hil-above-cube \
        --out tests/fixtures/cases/hil_above_cube_end_to_end

`collect` writes scripted demonstrations as a LeRobotDataset (lerobot's own writer): the
expert solves the tool position above the cube with damped least-squares IK on MuJoCo's
Jacobian (a few starting guesses, the collision-free solution nearest the start pose; a
placement with none is skipped) and moves there on a minimum-jerk joint path; 50 frames per second (the chunk step of
config/hil.toml), the front camera at the HIL robot's 160x120, the joint positions as the
state and the commanded joint positions as the action.

`train` trains a pi0 at the bundled tiny model's widths from scratch with lerobot's own
training loop (`lerobot.scripts.lerobot_train.train`) on the CPU, and writes the checkpoint
pi0d loads (weights, config, processors with the dataset's stats, arch.json, the bundled
tokenizer) with the training log.

`rollout` runs lerobot's own synchronous rollout of a checkpoint in the scene (observe, infer,
execute the chunk open loop, observe again) on cube placements the training never saw, and
reports the success rate: the reference for pi0d's closed loop over DDS.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests/hil"))
os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import lerobot_tiny  # noqa: E402
from robot import PHYSICS_DT, load_urdf, mjcf  # noqa: E402

FPS = 50
CAMERA = (160, 120)
# The HIL robot's camera runs at 10 Hz: a new frame every fifth step.
FRAME_EVERY = 5
START = [0.0, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02]
PROMPT = "move the gripper above the red cube"
# Where the cube may be (table top, m): in front of the arm and inside the camera's view.
CUBE_X = (0.32, 0.52)
CUBE_Y = (-0.18, 0.18)
CUBE_Z = 0.425
# The bowl (tests/hil/robot.py's scene) and how far the cube's centre stays from its centre:
# the bowl's radius, the cube's half diagonal and a centimetre.
BOWL_XY = (0.45, -0.15)
BOWL_CLEARANCE = 0.06 + 0.036 + 0.01
# The tool's goal above the cube, and what counts as there (m).
ABOVE = 0.09
SUCCESS_XY = 0.03
SUCCESS_Z = (0.04, 0.15)
MOVE_S = 2.0
# How far inside its URDF limits the expert keeps every joint (rad): the HIL config keeps
# pi0d 0.05 inside them and brakes the arm for a target that runs into that edge, so a
# demonstration there teaches the policy to drive the arm into its limits.
LIMIT_MARGIN = 0.15  # `collect --limit-margin`
EPISODE_S = 3.0


class Scene:
    """The HIL robot's scene without DDS: the same MJCF (urdf/sim_arm.urdf's chain, table,
    cube, bowl, front camera), stepped at the robot's physics rate."""

    def __init__(self):
        urdf = load_urdf(ROOT / "urdf/sim_arm.urdf")
        actuated = [j for j in urdf if j["type"] in ("revolute", "continuous", "prismatic")]
        self.names = [j["name"] for j in actuated]
        self.lower = np.array([j["lower"] if j["lower"] is not None else -np.pi for j in actuated])
        self.upper = np.array([j["upper"] if j["upper"] is not None else np.pi for j in actuated])
        self.m = mujoco.MjModel.from_xml_string(mjcf(urdf, CAMERA))
        self.d = mujoco.MjData(self.m)
        self.qadr = [self.m.jnt_qposadr[self.m.joint(n).id] for n in self.names]
        self.vadr = [self.m.jnt_dofadr[self.m.joint(n).id] for n in self.names]
        self.cube_adr = self.m.jnt_qposadr[self.m.body("cube").jntadr[0]]
        self.tool = self.m.body("tool0").id
        self.arm_root = self.m.body("base_link").id
        self.skipped = 0
        self.renderer = mujoco.Renderer(self.m, CAMERA[1], CAMERA[0])

    def reset(self, cube_xy):
        mujoco.mj_resetData(self.m, self.d)
        for a, v in zip(self.qadr, START):
            self.d.qpos[a] = v
        self.d.ctrl[:] = START
        c = self.cube_adr
        self.d.qpos[c:c + 3] = [cube_xy[0], cube_xy[1], CUBE_Z]
        self.d.qpos[c + 3:c + 7] = [1, 0, 0, 0]
        mujoco.mj_forward(self.m, self.d)

    def q(self):
        return np.array([self.d.qpos[a] for a in self.qadr])

    def step(self, target, seconds):
        """Position targets held for `seconds` of physics."""
        self.d.ctrl[:] = np.clip(target, self.lower, self.upper)
        for _ in range(round(seconds / PHYSICS_DT)):
            mujoco.mj_step(self.m, self.d)

    def image(self):
        self.renderer.update_scene(self.d, camera="front")
        return self.renderer.render().copy()

    def tool_pos(self, q=None):
        if q is not None:
            d = mujoco.MjData(self.m)
            d.qpos[:] = self.d.qpos
            for a, v in zip(self.qadr, q):
                d.qpos[a] = v
            mujoco.mj_kinematics(self.m, d)
            return d.xpos[self.tool].copy()
        return self.d.xpos[self.tool].copy()

    def cube_pos(self):
        return self.d.qpos[self.cube_adr:self.cube_adr + 3].copy()

    def arm_touches(self, contact):
        """A contact between a link of the arm and anything that is not the arm (the table, the
        pedestal, the cube, the bowl)."""
        arm = [self.m.body_rootid[self.m.geom_bodyid[g]] == self.arm_root for g in (contact.geom1, contact.geom2)]
        return arm[0] != arm[1]

    def placement(self, rng):
        """A random cube placement the expert can solve (the scene reset to it) and the joint
        positions above it; the placements drawn and passed over are counted in `skipped`."""
        while True:
            cube = random_cube(rng)
            self.reset(cube)
            goal, _ = self.solve_above(self.cube_pos())
            if goal is not None:
                return cube, goal
            self.skipped += 1

    def solve_above(self, cube):
        """Joint positions that put the tool `ABOVE` the cube with no link touching anything
        and every joint `LIMIT_MARGIN` inside its limits:
        damped least squares on the tool body's Jacobian from a few starting guesses, the
        collision-free solution closest to the start pose; the gripper stays as it is."""
        goal = np.array([cube[0], cube[1], cube[2] + ABOVE])
        d = mujoco.MjData(self.m)
        d.qpos[:] = self.d.qpos
        cols = [self.vadr[i] for i in range(6)]
        jac = np.zeros((3, self.m.nv))
        best = None
        yaw = float(np.arctan2(cube[1], cube[0]))
        for lift in (0.3, 0.8, 1.2):
            for elbow in (0.6, 1.2, 1.8):
                q = np.array(START, dtype=float)
                q[:3] = [yaw, lift, elbow]
                for _ in range(200):
                    for a, v in zip(self.qadr, q):
                        d.qpos[a] = v
                    mujoco.mj_kinematics(self.m, d)
                    mujoco.mj_comPos(self.m, d)
                    err = goal - d.xpos[self.tool]
                    if np.linalg.norm(err) < 1e-4:
                        break
                    mujoco.mj_jacBody(self.m, d, jac, None, self.tool)
                    J = jac[:, cols]
                    dq = J.T @ np.linalg.solve(J @ J.T + 1e-3 * np.eye(3), err)
                    q[:6] = np.clip(q[:6] + dq, self.lower[:6] + LIMIT_MARGIN, self.upper[:6] - LIMIT_MARGIN)
                mujoco.mj_forward(self.m, d)
                touching = any(self.arm_touches(c) for c in d.contact[:d.ncon] if c.dist < -1e-4)
                residual = float(np.linalg.norm(err))
                if residual < 1e-3 and not touching:
                    cost = float(np.abs(q[:6] - np.array(START[:6])).sum())
                    if best is None or cost < best[0]:
                        best = (cost, q.copy())
        if best is None:
            return None, float("inf")
        return best[1], 0.0


def success(scene):
    tool, cube = scene.tool_pos(), scene.cube_pos()
    dz = tool[2] - cube[2]
    return bool(np.linalg.norm(tool[:2] - cube[:2]) < SUCCESS_XY and SUCCESS_Z[0] < dz < SUCCESS_Z[1])


def min_jerk(s):
    s = min(max(s, 0.0), 1.0)
    return 10 * s**3 - 15 * s**4 + 6 * s**5


def random_cube(rng):
    """A placement on the table clear of the bowl (a cube on the bowl's rim is another task)."""
    while True:
        xy = (rng.uniform(*CUBE_X), rng.uniform(*CUBE_Y))
        if np.hypot(xy[0] - BOWL_XY[0], xy[1] - BOWL_XY[1]) > BOWL_CLEARANCE:
            return xy


def collect(args):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    global LIMIT_MARGIN
    LIMIT_MARGIN = args.limit_margin

    names = Scene().names
    features = {
        "observation.images.front": {"dtype": "image", "shape": (CAMERA[1], CAMERA[0], 3),
                                     "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (len(names),), "names": names},
        "action": {"dtype": "float32", "shape": (len(names),), "names": names},
    }
    out = Path(args.out)
    ds = LeRobotDataset.create(repo_id="pi0d/hil-above-cube", fps=FPS, features=features,
                               root=out, robot_type="sim_arm", use_videos=False,
                               image_writer_threads=2)
    scene = Scene()
    rng = np.random.default_rng(args.seed)
    solved = []
    for ep in range(args.episodes):
        cube, goal = scene.placement(rng)
        start = np.array(START)
        for k in range(round(EPISODE_S * FPS)):
            t = k / FPS
            target = start + (goal - start) * min_jerk((t + 1.0 / FPS) / MOVE_S)
            # The camera at the HIL robot's rate: a frame holds until the next one, as the
            # newest frame does on the robot (and rendering is most of this loop's time).
            if k % FRAME_EVERY == 0:
                frame = scene.image()
            ds.add_frame({
                "observation.images.front": frame,
                "observation.state": scene.q().astype(np.float32),
                "action": target.astype(np.float32),
                "task": PROMPT,
            })
            scene.step(target, 1.0 / FPS)
        ok = success(scene)
        solved.append(ok)
        ds.save_episode()
        print(f"episode {ep}: cube at ({cube[0]:.3f}, {cube[1]:.3f}), "
              f"expert {'succeeded' if ok else 'FAILED'}", flush=True)
    ds.finalize()
    summary = {"episodes": len(solved), "skipped_unreachable": scene.skipped, "limit_margin_rad": LIMIT_MARGIN,
               "expert_success": sum(solved) / max(len(solved), 1), "seed": args.seed}
    (out / "collect.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


def train(args):
    lerobot_tiny.train(args, "hil-above-cube")


def rollout(args):
    """lerobot's own synchronous rollout of a checkpoint in the scene: observe, infer a chunk,
    execute its 50 steps open loop at 50 Hz, observe again (the reference for pi0d's closed
    loop)."""
    import torch

    fast = lerobot_tiny.tiny_pi0()
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    policy = PI0Policy.from_pretrained(args.checkpoint)
    if args.replan_steps:
        # Execute only the first N steps of each chunk before observing again.
        policy.config.n_action_steps = args.replan_steps
    policy.eval()
    pre, post = make_pre_post_processors(
        policy.config, pretrained_path=args.checkpoint,
        preprocessor_overrides={"tokenizer_processor": {"tokenizer": fast}})
    scene = Scene()
    rng = np.random.default_rng(args.seed)
    results = []
    for ep in range(args.episodes):
        cube, _ = scene.placement(rng)
        policy.reset()
        for k in range(round(EPISODE_S * FPS)):
            # The camera at 10 Hz, as in the data and on the HIL robot.
            if k % FRAME_EVERY == 0:
                frame = scene.image()
            obs = {
                "observation.images.front": torch.from_numpy(frame).permute(2, 0, 1).float()[None] / 255.0,
                "observation.state": torch.from_numpy(scene.q()).float()[None],
                "task": [PROMPT],
            }
            with torch.no_grad():
                action = post(policy.select_action(pre(obs)))
            scene.step(action[0].numpy().astype(float), 1.0 / FPS)
        ok = success(scene)
        tool, c = scene.tool_pos(), scene.cube_pos()
        results.append({"cube": list(cube), "tool": tool.tolist(), "cube_final": c.tolist(), "success": ok,
                        "xy_error": float(np.linalg.norm(tool[:2] - c[:2]))})
        print(f"episode {ep}: cube at ({cube[0]:.3f}, {cube[1]:.3f}), tool {np.round(tool, 3)}, "
              f"{'success' if ok else 'miss'} ({results[-1]['xy_error'] * 1e3:.0f} mm off)", flush=True)
    summary = {"episodes": len(results), "replan_steps": args.replan_steps or 50,
               "success_rate": sum(r["success"] for r in results) / len(results),
               "median_xy_error_m": float(np.median([r["xy_error"] for r in results])),
               # What the HIL test's closed loop repeats: the same placements, episode length,
               # prompt and criteria.
               "task": {"prompt": PROMPT, "episode_s": EPISODE_S, "success_xy_m": SUCCESS_XY,
                        "success_dz_m": list(SUCCESS_Z), "seed": args.seed},
               "results": results}
    if args.report:
        Path(args.report).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))


def golden(args):
    """A raw observation of the scene (the front camera's first frame of a placement, the start
    pose) through lerobot's preprocessor, the checkpoint's model with fixed noise and the
    postprocessor: the fixture tests/it/pi0_pipeline.rs holds pi0d's whole path to."""
    import torch
    from safetensors.torch import save_file

    fast = lerobot_tiny.tiny_pi0()
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    policy = PI0Policy.from_pretrained(args.checkpoint)
    policy.eval()
    pre, post = make_pre_post_processors(
        policy.config, pretrained_path=args.checkpoint,
        preprocessor_overrides={"tokenizer_processor": {"tokenizer": fast}})
    scene = Scene()
    scene.placement(np.random.default_rng(args.seed))
    frame = torch.from_numpy(scene.image())
    state = torch.from_numpy(scene.q()).float()[None]
    noise = torch.randn(1, 50, 32, generator=torch.Generator().manual_seed(args.seed))
    batch = {"observation.images.front": frame.permute(2, 0, 1).float()[None] / 255.0,
             "observation.state": state, "task": PROMPT}
    processed = pre(batch)
    with torch.no_grad():
        actions = post(policy.predict_action_chunk(processed, noise=noise.clone()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"frame0": frame.contiguous(), "state": state[0].contiguous(), "noise": noise.contiguous(),
               "normalized_state": processed["observation.state"].contiguous(),
               "lang_tokens": processed["observation.language.tokens"].contiguous(),
               "lang_masks": processed["observation.language.attention_mask"].to(torch.uint8).contiguous()},
              str(out / "raw.safetensors"))
    save_file({"actions": actions.float().contiguous()}, str(out / "expected.safetensors"))
    (out / "case.json").write_text(json.dumps({"checkpoint": "../../models/hil-above-cube", "task": PROMPT}) + "\n")
    print(f"{out}: actions {tuple(actions.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="scripted demonstrations as a LeRobotDataset")
    c.add_argument("--episodes", type=int, default=120)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--limit-margin", type=float, default=LIMIT_MARGIN,
                   help="how far inside its limits the expert keeps every joint (rad)")
    c.add_argument("--out", required=True, help="the dataset's root (must not exist)")
    t = sub.add_parser("train", help="a tiny pi0 trained from scratch with lerobot's training loop")
    t.add_argument("--data", required=True, help="the dataset `collect` wrote")
    t.add_argument("--out", required=True, help="where the checkpoint goes")
    t.add_argument("--work", default="/tmp/hil-task-train", help="lerobot's output directory (replaced)")
    t.add_argument("--steps", type=int, default=3000)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--resolution", type=int, default=224,
                   help="the model's square image size (a multiple of the 14-pixel patch)")
    t.add_argument("--workers", type=int, default=1)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--save-every", type=int, default=250,
                   help="checkpoint this often (an interrupted run keeps its last one)")
    t.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("rollout", help="lerobot's synchronous rollout of a checkpoint in the scene")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--episodes", type=int, default=20)
    r.add_argument("--seed", type=int, default=1000, help="cube placements (not the training ones)")
    r.add_argument("--report", default=None)
    r.add_argument("--replan-steps", type=int, default=0,
                   help="observe again after this many steps of a chunk (default: the whole chunk)")
    g = sub.add_parser("golden", help="lerobot's actions for one raw observation (pi0d's fixture)")
    g.add_argument("--checkpoint", required=True)
    g.add_argument("--seed", type=int, default=7)
    g.add_argument("--out", required=True)
    args = ap.parse_args()
    {"collect": collect, "train": train, "rollout": rollout, "golden": golden}[args.cmd](args)


if __name__ == "__main__":
    main()
