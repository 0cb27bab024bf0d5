#!/usr/bin/env python3
"""A robot for pi0d's hardware-in-the-loop tests: the arm of urdf/sim_arm.urdf (six joints and a
gripper, the URDF's kinematics and limits) in MuJoCo, on a table with a cube and a bowl, behind
Cyclone DDS as a ros2_control robot would be.

* Physics at 500 Hz in real time, the loop at SCHED_FIFO 50 as ros2_control's controller
  manager runs (where the process may); position actuators (kp 150, kv 12 on ~1 kg links,
  gravity compensated as an industrial arm's drives do).
* sensor_msgs/JointState at 250 Hz on /joint_states, stamped with the time of the state.
* Cameras rendered off-screen (MUJOCO_GL=egl) in a process of their own, so rendering never
  stalls the physics: `front` (over the table, facing the arm) and, with `--cameras front,wrist`,
  `wrist` (on the tool, looking along it). Each as sensor_msgs/Image rgb8 on
  /camera/image_raw (front) or /<name>_camera/image_raw, and the same frame as JPEG on
  .../image_raw/compressed (image_transport's compressed topic).
* trajectory_msgs/JointTrajectory on /arm_controller/joint_trajectory, executed as
  joint_trajectory_controller executes it (tests/peers/jtc_model.py's sampling; a new message
  starts from the last setpoint, interpolate_from_desired_state as pi0d's docs/ros2.md recommends, or
  with --start-from measured from the measured state, the default), std_msgs/Float64MultiArray on
  /gripper_position_controller/commands (forward_command_controller).
* Its own driver watchdog, as real drivers have: no command for 100 ms, it holds where it is and
  reports when.

    robot.py --domain D --duration S --report FILE [--camera WxH@HZ] [--cameras front,wrist]
             [--watchdog-ms MS] [--cube X,Y] [--episode-s S]

With --episode-s the run is one episode of the closed-loop task: it ends S seconds after the
arm's setpoint first moved, and the report says where the tool and the cube were then.

The report (JSON, written at the end or on SIGTERM) has the rates it kept, what it received, the
watchdog's holds, the largest jerk of the setpoints it executed (apart: within 20 ms of a step
this loop ran late, when a message is installed behind pi0d's course, which a real-time
controller does not do) and of the measured motion, how far any joint went past its limits,
and a timeline (wall-clock seconds) of when the arm moved.
"""

import argparse
import io
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/peers"))

PHYSICS_DT = 0.002
JOINT_STATE_EVERY = 2  # physics steps: 250 Hz
# Physics steps after one this loop ran late whose setpoint jerk is counted apart (20 ms).
LATE_SETTLE_STEPS = 10
ARM_TOPIC = "/arm_controller/joint_trajectory"
GRIPPER_TOPIC = "/gripper_position_controller/commands"
# The arm stands on a pedestal at the table's height, as a bench-mounted arm does.
BASE_Z = 0.4


def load_urdf(path):
    """Joints in chain order: name, type, parent, child, origin xyz, axis, limits."""
    root = ET.parse(path).getroot()
    joints = []
    for j in root.findall("joint"):
        o = j.find("origin")
        a = j.find("axis")
        lim = j.find("limit")
        joints.append({
            "name": j.get("name"), "type": j.get("type"),
            "parent": j.find("parent").get("link"), "child": j.find("child").get("link"),
            "xyz": o.get("xyz", "0 0 0") if o is not None else "0 0 0",
            "rpy": o.get("rpy", "0 0 0") if o is not None else "0 0 0",
            "axis": a.get("xyz", "1 0 0") if a is not None else "1 0 0",
            "lower": float(lim.get("lower")) if lim is not None and lim.get("lower") else None,
            "upper": float(lim.get("upper")) if lim is not None and lim.get("upper") else None,
        })
    return joints


def mjcf(urdf_joints, camera_wh):
    """The MJCF scene: the URDF's chain with masses added (URDFs without inertials cannot be
    simulated as they are), a table, a cube and a bowl, and the cameras. Shadows from a
    1024-pixel map: MuJoCo's default 4096 made a 160x120 frame cost 140 ms of a core in Mesa's
    software renderer (32 ms now), for images within 0.02 of 255 per pixel on average."""
    by_parent = {}
    for j in urdf_joints:
        by_parent.setdefault(j["parent"], []).append(j)

    def body(link, depth):
        out = []
        for j in by_parent.get(link, []):
            kids = by_parent.get(j["child"], [])
            # A link drawn as a capsule towards its first child.
            seg = kids[0]["xyz"] if kids else "0 0 0"
            mass = f'{max(1.2 - 0.15 * depth, 0.2):.2f}'
            if sum(abs(float(x)) for x in seg.split()) > 1e-3:
                inner = [f'<geom type="capsule" fromto="0 0 0 {seg}" size="0.025" mass="{mass}" rgba="0.6 0.6 0.65 1"/>']
            else:
                inner = [f'<geom type="sphere" size="0.03" mass="{mass}" rgba="0.6 0.6 0.65 1"/>']
            if j["type"] in ("revolute", "continuous"):
                rng = (f' limited="true" range="{j["lower"]} {j["upper"]}"'
                       if j["type"] == "revolute" else ' limited="false"')
                inner.insert(0, f'<joint name="{j["name"]}" type="hinge" axis="{j["axis"]}"{rng} armature="0.05" damping="1.0"/>')
            elif j["type"] == "prismatic":
                inner.insert(0, f'<joint name="{j["name"]}" type="slide" axis="{j["axis"]}" limited="true" range="{j["lower"]} {j["upper"]}" armature="0.01" damping="5"/>')
                inner[-1] = '<geom type="box" size="0.01 0.02 0.03" mass="0.1" rgba="0.2 0.2 0.2 1"/>'
            if j["child"] == "tool0":
                # The wrist camera looks along the tool (a camera looks down its -z).
                inner.append('<camera name="wrist" pos="0 0.04 0.035" euler="3.14159 0 0" fovy="75"/>')
            inner.extend(body(j["child"], depth + 1))
            out.append(f'<body name="{j["child"]}" pos="{j["xyz"]}" euler="{j["rpy"]}" gravcomp="1">{"".join(inner)}</body>')
        return out

    actuated = [j for j in urdf_joints if j["type"] in ("revolute", "continuous", "prismatic")]
    actuators = "".join(
        f'<position joint="{j["name"]}" kp="{600 if j["type"] == "prismatic" else 150}" '
        f'kv="{30 if j["type"] == "prismatic" else 12}"/>' for j in actuated)
    w, h = camera_wh
    return f"""<mujoco model="pi0d_hil">
  <compiler angle="radian" eulerseq="XYZ"/>
  <option timestep="{PHYSICS_DT}" gravity="0 0 -9.81"/>
  <visual><global offwidth="{max(w, 64)}" offheight="{max(h, 64)}"/><quality shadowsize="1024"/></visual>
  <worldbody>
    <light pos="0.5 0 1.5" dir="-0.3 0 -1"/>
    <geom type="plane" size="2 2 0.1" rgba="0.85 0.85 0.8 1"/>
    <geom name="table" type="box" pos="0.45 0 0.2" size="0.25 0.35 0.2" rgba="0.55 0.4 0.25 1"/>
    <body name="cube" pos="0.4 0.1 0.425"><freejoint/><geom type="box" size="0.025 0.025 0.025" mass="0.05" rgba="0.85 0.1 0.1 1"/></body>
    <body name="bowl" pos="0.45 -0.15 0.41"><geom type="cylinder" size="0.06 0.01" rgba="0.1 0.3 0.8 1"/></body>
    <camera name="front" pos="1.2 0 0.9" xyaxes="0 1 0 -0.55 0 0.85"/>
    <geom name="pedestal" type="cylinder" pos="0 0 {BASE_Z / 2}" size="0.08 {BASE_Z / 2}" rgba="0.3 0.3 0.3 1"/>
    <body name="base_link" pos="0 0 {BASE_Z}">{"".join(body("base_link", 0))}</body>
  </worldbody>
  <actuator>{actuators}</actuator>
</mujoco>"""


def camera_topic(camera):
    """The image topic of a camera: /camera/image_raw for the front one (the name the other
    tests and config/hil.toml use), /<name>_camera/image_raw for the others."""
    return "/camera/image_raw" if camera == "front" else f"/{camera}_camera/image_raw"


def camera_process(xml, names, shared_q, domain, wh, hz, stop, paused, first_frame, cameras, rendered,
                   stamps_path):
    """Renders `cameras` at `hz` from the physics' joint positions (shared memory) and publishes
    raw rgb8 frames and JPEG; its own process, so the physics never waits for it. `paused` maps
    a camera to the event that stalls it; `rendered` counts the frames published and stamps the
    first and last (the rate the host let it reach); `stamps_path` gets every frame's capture stamp
    and the cameras it went out on, at the end."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    # Mesa's software rasterizer on one thread: a frame takes a little longer, but the camera
    # never takes both cores from pi0d and the physics at once.
    os.environ.setdefault("LP_NUM_THREADS", "1")
    import mujoco
    from cyclonedds.core import Policy, Qos
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.topic import Topic
    from PIL import Image as PILImage
    from ros_types import CompressedImage, Header, Image, Time

    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    renderer = mujoco.Renderer(m, wh[1], wh[0])
    dp = DomainParticipant(domain)
    best_effort = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(1))
    writers = {}
    for cam in cameras:
        topic = camera_topic(cam)
        # image_transport's compressed topic: the same frame as JPEG.
        writers[cam] = (DataWriter(dp, Topic(dp, "rt" + topic, Image), qos=best_effort),
                        DataWriter(dp, Topic(dp, "rt" + topic + "/compressed", CompressedImage), qos=best_effort))
    adr = [m.jnt_qposadr[m.joint(n).id] for n in names]
    next_t = time.time()
    stamps = []  # (capture stamp as sent, cameras it went out on)
    try:
        while not stop.is_set():
            now = time.time()
            if now < next_t:
                time.sleep(min(next_t - now, 0.01))
                continue
            next_t += 1.0 / hz
            live = [cam for cam in cameras if not paused[cam].is_set()]
            if not live:
                continue
            with shared_q.get_lock():
                q = list(shared_q[:len(names)])
                cube = list(shared_q[len(names):len(names) + 7])
            for a, v in zip(adr, q):
                d.qpos[a] = v
            c = m.jnt_qposadr[m.body("cube").jntadr[0]]
            d.qpos[c:c + 7] = cube
            mujoco.mj_forward(m, d)
            captured = time.time()
            stamp = Time(sec=int(captured), nanosec=int((captured % 1) * 1e9))
            for cam in live:
                renderer.update_scene(d, camera=cam)
                px = renderer.render()
                header = Header(stamp=stamp, frame_id=cam)
                raw, jpeg = writers[cam]
                raw.write(Image(header=header, height=wh[1], width=wh[0],
                                encoding="rgb8", step=wh[0] * 3, data=px.tobytes()))
                buf = io.BytesIO()
                PILImage.fromarray(px).save(buf, format="JPEG", quality=85)
                jpeg.write(CompressedImage(header=header, format="jpeg", data=buf.getvalue()))
            stamps.append((stamp.sec + stamp.nanosec * 1e-9, live))
            with rendered.get_lock():
                if rendered[0] == 0:
                    rendered[1] = captured
                rendered[0] += 1
                rendered[2] = captured
            first_frame.set()
    finally:
        renderer.close()
        Path(stamps_path).write_text(json.dumps(stamps))


def setpoint_jerk_on_ticks(written, arm_names, start_from, dt=PHYSICS_DT):
    """The largest setpoint jerk per arm joint of this robot's controller (the same sampling and
    start points as the loop in `main`, for a perfect arm) fed pi0d's trajectories on pi0d's own
    timeline (jtc_model.on_ticks): a deterministic function of what pi0d wrote, which a stall of
    this loop, of DDS or of pi0d's writes cannot change. As in `main`, only while the stream flows
    (a message within 20 ms)."""
    from jtc_model import Follower, on_ticks

    rows = [r for r in on_ticks(written) if list(r[2].joint_names) == arm_names]
    jerk = {n: 0.0 for n in arm_names}
    if len(rows) < 2:
        return jerk, len(rows)
    follower = Follower(start_from)
    first = rows[0][2].points[0]
    state = [(first.positions[j], 0.0, 0.0) for j in range(len(arm_names))]
    traj, k, last_at = None, 0, None
    window = []  # (tracking, setpoints) of the last four steps
    u = rows[0][0]
    while u <= rows[-1][0] + 0.02:
        new = None
        while k < len(rows) and rows[k][0] <= u:
            new, k = rows[k][2], k + 1
        if new is not None:
            if start_from == "measured" or traj is None:
                before, t_from = [(p, v, None) for p, v, _ in state], u
            else:
                before = [follower.sample(traj, j, u - dt) for j in range(len(arm_names))]
                t_from = u - dt
            traj, last_at = (new, u, t_from, before), u
        state = [follower.sample(traj, j, u) for j in range(len(arm_names))]
        window = (window + [(u - last_at <= 0.02, [s[0] for s in state])])[-4:]
        if len(window) == 4 and all(tr for tr, _ in window):
            for j, n in enumerate(arm_names):
                p0, p1, p2, p3 = (w[1][j] for w in window)
                jerk[n] = max(jerk[n], abs(p3 - 3 * p2 + 3 * p1 - p0) / dt**3)
        u += dt
    return jerk, len(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True, help="s (from readiness with --ready-file)")
    ap.add_argument("--report", required=True)
    ap.add_argument("--camera", default="160x120@10", help="WxH@HZ of every camera; 'none' for no camera")
    ap.add_argument("--cameras", default="front", help="the cameras rendered: front, or front,wrist")
    ap.add_argument("--watchdog-ms", type=float, default=100.0)
    ap.add_argument("--rt-priority", type=int, default=50,
                    help="SCHED_FIFO priority of the control loop (0: the normal scheduler)")
    ap.add_argument("--ready-file", default=None,
                    help="created once joint states flow and the camera has sent its first frame")
    ap.add_argument("--start", default="0,0.3,0.6,-0.4,0,0,0.02")
    ap.add_argument("--start-from", choices=["desired", "measured"], default="desired",
                    help="where a new trajectory starts: the last setpoint (interpolate_from_desired_state,"
                         " as pi0d's docs/ros2.md recommends) or the measured state (the controller's default)")
    ap.add_argument("--stall-joint-states", default=None, metavar="AT,FOR",
                    help="stop publishing joint states AT s after the first command, for FOR s (a stalled driver)")
    ap.add_argument("--stall-camera", default=None, metavar="AT,FOR[,NAME]",
                    help="stop a camera (NAME, or every camera) AT s after the first command, for FOR s")
    ap.add_argument("--estop-at", type=float, default=None, help="press pi0d's e-stop this long after the first command (s)")
    ap.add_argument("--reset-at", type=float, default=None,
                    help="release the e-stop and reset pi0d (/pi0d/reset) this long after the first command (s)")
    ap.add_argument("--moving-file", default=None,
                    help="created once the arm's setpoint first moved (pi0d is running)")
    ap.add_argument("--cube", default=None, metavar="X,Y", help="where the cube starts on the table (m)")
    ap.add_argument("--episode-s", type=float, default=None,
                    help="one episode of the closed-loop task: end this long after the setpoint first moved")
    args = ap.parse_args()

    import mujoco
    from cyclonedds.core import Policy, Qos
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic
    from cyclonedds.util import duration
    from jtc_model import Follower, seconds
    from ros_types import Bool, Float64MultiArray, Header, JointState, JointTrajectory, Time

    urdf = load_urdf(ROOT / "urdf/sim_arm.urdf")
    actuated = [j for j in urdf if j["type"] in ("revolute", "continuous", "prismatic")]
    names = [j["name"] for j in actuated]
    limits = {j["name"]: (j["lower"], j["upper"]) for j in actuated}
    gripper = [j["name"] for j in actuated if j["type"] == "prismatic"]
    wh, hz = (160, 120), 10.0
    if args.camera != "none":
        size, hz = args.camera.split("@")
        wh, hz = tuple(int(x) for x in size.split("x")), float(hz)
    xml = mjcf(urdf, wh)
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    qadr = [m.jnt_qposadr[m.joint(n).id] for n in names]
    vadr = [m.jnt_dofadr[m.joint(n).id] for n in names]
    act = [m.actuator(i).id for i in range(m.nu)]
    start = [float(x) for x in args.start.split(",")]
    for a, v in zip(qadr, start):
        d.qpos[a] = v
    d.ctrl[:] = start
    if args.cube:
        c = m.jnt_qposadr[m.body("cube").jntadr[0]]
        d.qpos[c:c + 2] = [float(x) for x in args.cube.split(",")]
    mujoco.mj_forward(m, d)

    # Spawned, not forked: the camera process gets a fresh EGL context and no DDS state.
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    shared_q = ctx.Array("d", len(names) + 7)
    cameras = [c for c in args.cameras.split(",") if c]
    unknown = [c for c in cameras if c not in ("front", "wrist")]
    if unknown:
        sys.exit(f"--cameras: no camera named {unknown} (front, wrist)")
    camera_paused = {c: ctx.Event() for c in cameras}
    first_frame = ctx.Event()
    rendered = ctx.Array("d", 3)  # frames, first and last capture (wall s)
    cam = None
    if args.camera != "none":
        cam = ctx.Process(
            target=camera_process,
            args=(xml, names, shared_q, args.domain, wh, hz, stop, camera_paused, first_frame, cameras, rendered,
                  args.report + ".camera.json"),
            daemon=True)
        cam.start()

    dp = DomainParticipant(args.domain)
    reliable = Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.History.KeepLast(10))
    best_effort = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(1))
    js_w = DataWriter(dp, Topic(dp, "rt/joint_states", JointState), qos=best_effort)
    arm_r = DataReader(dp, Topic(dp, "rt" + ARM_TOPIC, JointTrajectory), qos=reliable)
    grip_r = DataReader(dp, Topic(dp, "rt" + GRIPPER_TOPIC, Float64MultiArray), qos=reliable)
    estop_w = DataWriter(dp, Topic(dp, "rt/pi0d/estop", Bool), qos=reliable)
    reset_w = DataWriter(dp, Topic(dp, "rt/pi0d/reset", Bool), qos=reliable)
    estop_at = reset_at = released_at = None

    terminated = []
    # The control loop real-time, as ros2_control's controller manager runs (SCHED_FIFO 50):
    # this thread only (DDS's threads were started before, at their normal priority). Without
    # the privilege it runs as it is and says so.
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.rt_priority))
        realtime = args.rt_priority > 0
    except (PermissionError, OSError):
        realtime = False
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(time.time()))

    follower = Follower("measured")
    arm_names = [n for n in names if n not in gripper]
    traj = None  # (msg, start, t0, before) as jtc_model samples it
    grip_target = [start[names.index(g)] for g in gripper]
    target = list(start)
    last_command = first_command = None
    holding_since = None
    holds = []  # watchdog holds: wall time
    hold_causes = []  # per hold: since the last command (step clock), pi0d's last write stamp
    estop_written = None  # wall time the e-stop press was written
    commands = grip_commands = 0
    nonfinite = 0
    setpoints = []  # the last four setpoints, for jerk
    measured = []
    max_set_jerk = {n: 0.0 for n in names if n not in gripper}
    max_set_jerk_late = {n: 0.0 for n in names if n not in gripper}
    last_late_step = -LATE_SETTLE_STEPS - 1
    max_meas_jerk = {n: 0.0 for n in names}
    over_limit = {n: 0.0 for n in names}
    moving = []  # (wall, speed of the setpoint) at 50 Hz, for the reaction times
    js_times = []
    t0 = time.time()
    step = 0
    max_late, behind_steps = 0.0, 0
    worst_jerk_at = None
    # When pi0d's trajectories arrived: a message held up on its way (a busy host delays DDS's
    # threads) starts late, being stamped "start when received".
    last_arrival, arrival_gaps, worst_jerk_gap = None, [0.0, 0.0], None
    stalled_at = {}  # input -> wall time its stall began
    ready = False
    moved_at, last_arm_target = None, None  # the episode's start: the setpoint's first motion
    first_moved, first_target = None, None  # the setpoint's first motion (--moving-file)
    written = []  # (pi0d's write stamp, arrival, msg): every finite arm trajectory taken
    arm_idx = [names.index(n) for n in names if n not in gripper]
    at_last_command, tails = None, []  # the setpoint at the last command; its travel after it
    # With --ready-file, --duration counts from readiness (the camera's start-up varies).
    deadline = t0 + args.duration
    while time.time() < deadline and not terminated:
        # Everything runs on the step's own time: a late loop catches up step by step, each
        # step sampling the trajectory where that step is due.
        now = t0 + step * PHYSICS_DT
        delay = now - time.time()
        if delay > 0:
            time.sleep(delay)
        late = -delay
        max_late = max(max_late, late)
        # A real controller installs a message at the update after it arrived; a step run late
        # to catch up leaves new messages for the step that is on time.
        if late > PHYSICS_DT:
            behind_steps += 1
            last_late_step = step
            arm_msgs, grip_msgs = [], []
        else:
            arm_msgs, grip_msgs = arm_r.take(N=50), grip_r.take(N=50)
        # Events are timed from the first command: pi0d's start-up time does not shift them.
        since_first = now - first_command if first_command is not None else -1.0
        if args.estop_at is not None and estop_at is None and since_first >= args.estop_at:
            estop_w.write(Bool(data=True))
            estop_at = now
            # The press as published (the DDS source stamp is this write's wall time): what
            # pi0d's own stamps are judged against.
            estop_written = time.time()
        if args.reset_at is not None and reset_at is None and estop_at is not None:
            # The operator releases the button, then (a moment later: the two topics are not
            # ordered with each other) asks for a reset.
            if released_at is None and since_first >= args.reset_at - 0.2:
                estop_w.write(Bool(data=False))
                released_at = now
            if since_first >= args.reset_at:
                reset_w.write(Bool(data=True))
                reset_at = now
        if arm_msgs:
            if last_arrival is not None:
                arrival_gaps = [arrival_gaps[1], now - last_arrival]
            last_arrival = now
        for msg in arm_msgs:
            if not isinstance(msg, JointTrajectory) or not msg.points:
                continue
            commands += 1
            if not all(math.isfinite(x) for p in msg.points for x in p.positions):
                nonfinite += 1
                continue
            order = [list(msg.joint_names).index(n) for n in arm_names if n in msg.joint_names]
            if len(order) != len(arm_names):
                continue
            stamp = seconds(msg.header.stamp)
            if args.start_from == "measured" or traj is None:
                before = [(d.qpos[qadr[names.index(n)]], d.qvel[vadr[names.index(n)]], None)
                          for n in msg.joint_names]
                t_from = now
            else:
                # The running trajectory's state at the previous update.
                before = [follower.sample(traj, list(traj[0].joint_names).index(n), now - PHYSICS_DT)
                          for n in msg.joint_names]
                t_from = now - PHYSICS_DT
            traj = (msg, stamp if stamp != 0.0 else now, t_from, before)
            written.append((msg.sample_info.source_timestamp * 1e-9, now, msg))
            last_command = now
            first_command = first_command or now
        for msg in grip_msgs:
            if isinstance(msg, Float64MultiArray) and len(msg.data) == len(gripper):
                grip_commands += 1
                if all(math.isfinite(x) for x in msg.data):
                    grip_target = list(msg.data)
                    last_command = now
        # The driver's watchdog: commands stopped, the arm holds where it is.
        tracking = False
        if last_command is not None and now - last_command > args.watchdog_ms * 1e-3:
            if holding_since is None:
                holding_since = now
                holds.append(now)
                # Why it held, on this loop's own step clock (the watchdog's) and on pi0d's:
                # how long after the last command's arrival, and pi0d's write stamp of it.
                hold_causes.append({"after_last_command_s": now - last_command,
                                    "last_write": written[-1][0] if written else None})
                # One entry per hold (None before any arm command was tracked), so the two
                # lists stay index for index.
                tails.append(max(abs(a - b) for a, b in zip(target, at_last_command))
                             if at_last_command is not None else None)
                target = [d.qpos[a] for a in qadr]
                traj = None
        else:
            holding_since = None
            if traj is not None:
                msg = traj[0]
                for k, n in enumerate(msg.joint_names):
                    target[names.index(n)] = follower.sample(traj, k, now)[0]
                # While the stream flows (a message within 20 ms): once it stops, the last
                # trajectory's tail brings the arm to rest by design, harder than the limits.
                tracking = now - last_command <= 0.02
                if tracking:
                    at_last_command = list(target)
            for g, v in zip(gripper, grip_target):
                target[names.index(g)] = v
        for i, v in enumerate(target):
            d.ctrl[act[i]] = v
        mujoco.mj_step(m, d)
        step += 1
        q = [d.qpos[a] for a in qadr]
        # Jerk of the arm's setpoints while they follow pi0d's stream (the watchdog's own hold,
        # a stopped stream's tail and the gripper's forward command step by design), and of the
        # measured motion.
        # A message installed late (this loop ran behind: a real controller's loop does not)
        # starts its trajectory that much behind pi0d's course; the jerk of the catch-up is the
        # simulation's, counted apart.
        on_time = step - last_late_step > LATE_SETTLE_STEPS
        setpoints.append((tracking, on_time, list(target)))
        if first_moved is None:
            arm_target = [target[i] for i in arm_idx]
            if first_target is not None and max(abs(a - b) for a, b in zip(arm_target, first_target)) > 1e-6:
                first_moved = now
                if args.moving_file:
                    Path(args.moving_file).write_text("moving")
            first_target = arm_target
        if args.episode_s is not None and moved_at is None:
            arm_target = [target[i] for i in arm_idx]
            if last_arm_target is not None and max(abs(a - b) for a, b in zip(arm_target, last_arm_target)) > 1e-6:
                moved_at = now
                deadline = now + args.episode_s
            last_arm_target = arm_target
        measured.append(q)
        if len(setpoints) > 4:
            setpoints.pop(0)
            measured.pop(0)
            series = [(max_meas_jerk, measured, names)]
            if all(tr for tr, _, _ in setpoints):
                on_time = all(ok for _, ok, _ in setpoints)
                series.append((max_set_jerk if on_time else max_set_jerk_late, [p for _, _, p in setpoints], arm_names))
            for out, values, joints in series:
                for n in joints:
                    j = names.index(n)
                    p0, p1, p2, p3 = (values[i][j] for i in range(4))
                    jerk = abs(p3 - 3 * p2 + 3 * p1 - p0) / PHYSICS_DT**3
                    if out is max_set_jerk and jerk > max(out.values()):
                        worst_jerk_at = now
                        worst_jerk_gap = max(arrival_gaps)
                    out[n] = max(out[n], jerk)
        for j, n in enumerate(names):
            lo, hi = limits[n]
            if lo is not None:
                over_limit[n] = max(over_limit[n], lo - q[j], q[j] - hi)
        stalls = {}
        for key, spec in (("joint_states", args.stall_joint_states), ("camera", args.stall_camera)):
            if spec:
                at, span = (float(x) for x in spec.split(",")[:2])
                stalls[key] = at <= since_first < at + span
                if stalls[key] and key not in stalled_at:
                    stalled_at[key] = now
        if "camera" in stalls:
            named = args.stall_camera.split(",")[2:]
            for c, paused in camera_paused.items():
                if (not named or c in named) and stalls["camera"] != paused.is_set():
                    (paused.set if stalls["camera"] else paused.clear)()
        if args.ready_file and not ready and (cam is None or first_frame.is_set()) and js_times:
            Path(args.ready_file).write_text("ready")
            ready = True
            deadline = now + args.duration
        if step % JOINT_STATE_EVERY == 0 and not stalls.get("joint_states"):
            sec = int(now)
            js_w.write(JointState(header=Header(stamp=Time(sec=sec, nanosec=int((now - sec) * 1e9))),
                                  name=names, position=q, velocity=[d.qvel[a] for a in vadr]))
            js_times.append(now)
        if step % 10 == 0:
            c = m.jnt_qposadr[m.body("cube").jntadr[0]]
            with shared_q.get_lock():
                shared_q[:len(names)] = q
                shared_q[len(names):] = list(d.qpos[c:c + 7])
            # The setpoint's and the arm's speed at 50 Hz (largest over the joints): when the
            # arm held, for the reaction times.
            if moving:
                last_t, _, _, last_target = moving[-1]
                span = now - last_t
                set_speed = max(abs(a - b) for a, b in zip(target, last_target)) / span if span > 0 else 0.0
            else:
                set_speed = 0.0
            meas_speed = max(abs(d.qvel[a]) for a in vadr)
            moving.append((now, set_speed, meas_speed, list(target)))
    stop.set()
    if cam is not None:
        cam.join(timeout=3)
        if cam.is_alive():
            cam.terminate()
    gaps = sorted(b - a for a, b in zip(js_times, js_times[1:]))
    try:
        camera_stamps = json.loads(Path(args.report + ".camera.json").read_text())
        os.remove(args.report + ".camera.json")
    except (OSError, ValueError):
        camera_stamps = []
    written.sort(key=lambda r: r[0])
    write_times = [w for w, _, _ in written]
    on_ticks_jerk, judged = setpoint_jerk_on_ticks(written, arm_names, args.start_from)
    report = {
        "duration_s": time.time() - t0,
        "terminated": bool(terminated),
        "joint_state_rate_hz": len(js_times) / max(js_times[-1] - js_times[0], 1e-9) if len(js_times) > 1 else 0.0,
        "joint_state_gap_max_ms": gaps[-1] * 1e3 if gaps else None,
        # The rate the cameras were rendered and published at (below --camera's on a host that
        # took the cores away).
        "camera_frames": int(rendered[0]),
        "camera_rate_hz": (rendered[0] - 1) / (rendered[2] - rendered[1]) if rendered[0] > 1 else 0.0,
        # How far the Python loop fell behind real time, and the steps it ran late to catch up.
        "max_late_ms": max_late * 1e3, "late_steps": behind_steps, "realtime": realtime,
        "commands": commands, "gripper_commands": grip_commands, "nonfinite_commands": nonfinite,
        "first_command_at": first_command,
        "estop_at": estop_at,
        "reset_at": reset_at,
        "stalled_at": stalled_at,
        "watchdog_holds": holds,
        "watchdog_hold_causes": hold_causes,
        "estop_written": estop_written,
        "watchdog_s": args.watchdog_ms * 1e-3,
        "physics_dt_s": PHYSICS_DT,
        # Every arm trajectory taken: pi0d's write stamp (DDS source timestamp, wall s) and its
        # first point's positions, for judging pi0d's reactions on pi0d's own stamps.
        "arm_writes": [(w, list(msg.points[0].positions)) for w, _, msg in written],
        # Per hold: how far the setpoint travelled from the last command to the hold (rad or m).
        "travel_after_last_command": tails,
        "max_setpoint_jerk": max_set_jerk,
        # The same setpoints sampled on pi0d's own timeline (its ticks, from the times and values
        # it wrote; see setpoint_jerk_on_ticks): what pi0d's stream is judged by.
        "max_setpoint_jerk_on_ticks": on_ticks_jerk,
        # The arm trajectories taken (finite, every arm joint) and how many of them were judged.
        "written_commands": len(written), "judged_on_ticks": judged,
        # pi0d's write stamps of the arm trajectories: first, last, and every gap longer than
        # the watchdog (from, to), wall s.
        "first_write": write_times[0] if write_times else None,
        "last_write": write_times[-1] if write_times else None,
        "write_gaps_over_watchdog": [(a, b) for a, b in zip(write_times, write_times[1:])
                                     if b - a > args.watchdog_ms * 1e-3],
        # Every frame published (capture stamp, cameras), wall s.
        "camera_stamps": camera_stamps,
        # ... and within LATE_SETTLE_STEPS of a step this loop ran late (the simulation's).
        "max_setpoint_jerk_after_late_steps": max_set_jerk_late,
        "max_measured_jerk": max_meas_jerk,
        "worst_setpoint_jerk_at": worst_jerk_at,
        # The longest of the last two intervals between pi0d's trajectories arriving there (ms).
        "command_gap_at_worst_jerk_ms": worst_jerk_gap * 1e3 if worst_jerk_gap is not None else None,
        "over_limit": over_limit,
        # (wall s, setpoint speed, measured speed), every 20 ms.
        "motion": [(t, sp, ms) for t, sp, ms, _ in moving],
        "final_position": [d.qpos[a] for a in qadr],
        # The closed-loop episode (--episode-s): when the setpoint first moved, and whether the
        # episode ran its whole length (the tool and cube below are then at its end).
        "moved_at": moved_at,
        "episode_complete": moved_at is not None and not terminated,
        # For the closed-loop task: where the tool (flange) and the cube ended (m).
        "tool_final": list(d.xpos[m.body("tool0").id]),
        "cube_final": list(d.qpos[m.jnt_qposadr[m.body("cube").jntadr[0]]:][:3]),
        "names": names,
    }
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
