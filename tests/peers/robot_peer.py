#!/usr/bin/env python3
"""A robot on Eclipse Cyclone DDS for pi0d's interop tests.

It publishes joint states (100 Hz, best effort) that follow the commands it receives (a perfect
arm), rgb8 camera images (10 Hz), the task prompt, and optionally presses the e-stop; it reads
pi0d's JointTrajectory commands and writes a JSON report of what it got.

    robot_peer.py --domain D --duration S --report FILE [--estop-at S] [--bad-frames-at S]

With --bad-frames-at, it also sends, for a second from then on and among the good frames,
malformed images (empty, zero step, sizes that do not add up, an absurd width, an unsupported
encoding) on the raw camera topic, garbage on the compressed one and prompts pi0d must refuse,
and reports what it received after the last of them.
"""

import argparse
import io
import json
import math
import signal
import sys
import time
from pathlib import Path

from cyclonedds.core import Policy, Qos
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jtc_model import check_stream, interarrival, on_ticks, seconds  # noqa: E402
from ros_types import (  # noqa: E402
    Bool, CompressedImage, DiagnosticArray, Float64MultiArray, Header, Image, JointState, JointTrajectory,
    String, Time, TriggerRequest, TriggerResponse, GripperSendGoalRequest, GripperSendGoalResponse,
)

JOINTS = ["shoulder_pan", "shoulder_lift", "elbow", "wrist_1", "wrist_2", "wrist_3", "gripper"]
START = [0.0, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02]


CLOCK_OFFSET = 0.0


def stamp() -> Time:
    t = time.time() + CLOCK_OFFSET
    return Time(sec=int(t), nanosec=int((t - int(t)) * 1e9))


def bad_frames(w, h):
    """Images a camera driver (or a broken one) can send that pi0d must refuse."""
    frames = [
        dict(width=0, height=0, step=0, data=[]),  # not streaming yet
        dict(width=0, height=h, step=0, data=[]),
        dict(width=w, height=0, step=w * 3, data=[]),
        dict(width=w, height=h, step=0, data=[]),
        dict(width=w, height=h, step=w, data=[1] * (w * h)),  # step shorter than a row
        dict(width=w, height=h, step=w * 3, data=[1] * (w * h * 3 - 1)),  # one byte short
        dict(width=2**32 - 1, height=1, step=2**32 - 1, data=[1] * 16),
        dict(width=w, height=h, step=w * 2, data=[1] * (w * h * 2), encoding="16UC1"),
    ]
    return [Image(header=Header(stamp=stamp()), height=f["height"], width=f["width"],
                  encoding=f.get("encoding", "rgb8"), step=f["step"], data=f["data"]) for f in frames]


# Refused (control characters: a window title and a screen clear; 1 MiB long), then one taken
# but shown escaped in the log: a right-to-left override would make the line read backwards on a
# terminal. pi0d names one refusal of each kind per topic and counts the rest.
BAD_PROMPTS = ["\x1b]0;PWNED\x07stack\x1b[2J the blocks", "y" * (1 << 20),
               "\u202egnp.exe stack the blocks"]


def percentiles(seconds):
    if not seconds:
        return None
    s = sorted(seconds)
    at = lambda q: s[round((len(s) - 1) * q)] * 1e3  # noqa: E731
    return {"p50": at(0.5), "p99": at(0.99), "max": s[-1] * 1e3, "n": len(s)}


def timeline_error(written_at):
    """How far each written message's first point is due off the ticks' timeline: the write time
    plus the first point's time should advance by one control period per message; what does
    not is the delay between pi0d measuring a command's age and writing it (percentiles of the
    deviation from the median step, ms)."""
    due = [w + seconds(m.points[0].time_from_start) for w, _, m in sorted(written_at, key=lambda r: r[0])]
    steps = sorted(b - a for a, b in zip(due, due[1:]))
    if not steps:
        return None
    mid = steps[len(steps) // 2]
    # A tick whose command was replaced before it went out (the next one's newer) is a skip,
    # not a timing error: deviations are taken from whole periods.
    ticks = [max(round(s / mid), 1) for s in steps]
    out = percentiles([abs(s - k * mid) for s, k in zip(steps, ticks)])
    out["skipped_ticks"] = sum(k - 1 for k in ticks)
    return out


# SIGTERM received (the test's end of the run).
STOP = []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--estop-at", type=float, default=None)
    ap.add_argument("--reset-at", type=float, default=None, help="release the e-stop and call the reset service")
    ap.add_argument("--clock-offset", type=float, default=0.0, help="stamp with a skewed clock (s)")
    ap.add_argument("--image-size", default="64x48", help="camera frames WxH (the JPEG one too)")
    ap.add_argument("--fps", type=float, default=10.0, help="camera rate")
    ap.add_argument("--joint-states-topic", default="/joint_states")
    ap.add_argument("--joints", default=",".join(JOINTS), help="the robot's joints, comma-separated")
    ap.add_argument("--start", default=",".join(map(str, START)), help="their start positions")
    ap.add_argument("--command-topic", default="/arm_controller/joint_trajectory",
                    help="JointTrajectory commands (its controller's joints: all but --gripper-joints)")
    ap.add_argument("--gripper-topic", default=None, help="Float64MultiArray commands for --gripper-joints")
    ap.add_argument("--gripper-joints", default="")
    ap.add_argument("--gripper-action", default=None,
                    help="serve control_msgs/action/GripperCommand goals for --gripper-joints here, "
                         "as gripper_action_controller does (each accepted goal preempts the last)")
    ap.add_argument("--refuse-goals-after", type=float, default=None,
                    help="from then on, refuse every goal (a controller that is not active)")
    ap.add_argument("--impostor", action="store_true",
                    help="also open a writer on pi0d's command topic (a second source of commands)")
    ap.add_argument("--raw-topic", default="/camera/image_raw", help="raw camera ('' for none)")
    ap.add_argument("--jpeg-topic", default="/wrist/image_raw/compressed", help="JPEG camera ('' for none)")
    ap.add_argument("--shadow-topic", default="/pi0d/dry_run/arm_controller/joint_trajectory",
                    help="also count trajectories here (a dry run's commands)")
    ap.add_argument("--bad-frames-at", type=float, default=None,
                    help="send malformed images and prompts for a second from then on")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: STOP.append(True))
    global CLOCK_OFFSET
    CLOCK_OFFSET = args.clock_offset

    dp = DomainParticipant(args.domain)
    reliable = Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.History.KeepLast(10))
    # What the report judges, every message pi0d wrote: a reader that keeps them all until this
    # peer takes them. With KeepLast(10) a peer the host did not schedule for 50 ms (10 commands
    # at 200 Hz) lost the older ones, and its stream showed gaps pi0d never left.
    lossless = Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.History.KeepAll)
    best_effort = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(1))
    js_w = DataWriter(dp, Topic(dp, "rt" + args.joint_states_topic, JointState), qos=best_effort)
    img_w = DataWriter(dp, Topic(dp, "rt" + args.raw_topic, Image), qos=best_effort) if args.raw_topic else None
    jpeg_w = (DataWriter(dp, Topic(dp, "rt" + args.jpeg_topic, CompressedImage), qos=best_effort)
              if args.jpeg_topic else None)
    joints = args.joints.split(",")
    index = {n: i for i, n in enumerate(joints)}
    gripper_joints = [g for g in args.gripper_joints.split(",") if g]
    arm_joints = [n for n in joints if n not in gripper_joints]
    grip_r = (DataReader(dp, Topic(dp, "rt" + args.gripper_topic, Float64MultiArray), qos=lossless)
              if args.gripper_topic else None)
    gripper_commands, gripper_last = 0, None
    goal_r = goal_w = None
    if args.gripper_action:
        base = args.gripper_action + "/_action/send_goal"
        goal_r = DataReader(dp, Topic(dp, "rq" + base + "Request", GripperSendGoalRequest), qos=lossless)
        goal_w = DataWriter(dp, Topic(dp, "rr" + base + "Reply", GripperSendGoalResponse), qos=reliable)
    goals = []  # (arrival, position, max_effort, accepted)
    goal_ids = set()
    duplicate_goal_ids = 0
    prompt_w = DataWriter(dp, Topic(dp, "rt/pi0d/prompt", String), qos=reliable)
    estop_w = DataWriter(dp, Topic(dp, "rt/pi0d/estop", Bool), qos=reliable)
    cmd_r = DataReader(dp, Topic(dp, "rt" + args.command_topic, JointTrajectory), qos=lossless)
    impostor_w = (DataWriter(dp, Topic(dp, "rt" + args.command_topic, JointTrajectory), qos=reliable)
                  if args.impostor else None)
    shadow_r = DataReader(dp, Topic(dp, "rt" + args.shadow_topic, JointTrajectory), qos=lossless)
    status_r = DataReader(dp, Topic(dp, "rt/pi0d/status", String), qos=lossless)
    diag_r = DataReader(dp, Topic(dp, "rt/diagnostics", DiagnosticArray), qos=lossless)
    req_w = DataWriter(dp, Topic(dp, "rq/pi0d/resetRequest", TriggerRequest), qos=reliable)
    rep_r = DataReader(dp, Topic(dp, "rr/pi0d/resetReply", TriggerResponse), qos=reliable)
    my_guid = [1, 2, 3, 4, 5, 6, 7, 8]
    reset_sent, reset_reply = False, None
    diagnostics = []

    position = [float(x) for x in args.start.split(",")]
    commands, names_seen, first, last = 0, None, None, None
    nonfinite, statuses, shadow = 0, 0, 0
    w, h = (int(x) for x in args.image_size.split("x"))
    jw, jh = (160, 120) if args.image_size == "64x48" else (w, h)
    raw_data = [128] * (w * h * 3)  # made once: building a large list per frame is slow in Python
    command_latency = []
    received = []  # (arrival, wall clock, message) for the controller model
    written_at = []  # the same on pi0d's write times: the stream without this peer's polling
    bad_sent, next_bad, bad_done = 0, 0.0, False
    commands_after_bad, at_bad_end = 0, None
    t0 = time.time()
    next_js, next_img, prompt_sent, estop_sent = t0, t0, False, False
    # The test ends this peer with SIGTERM once pi0d has exited (--duration only bounds it): the
    # loop then runs one whole pass begun after the signal, taking what arrived before it, and
    # the report is written as after --duration.
    while time.time() - t0 < args.duration:
        stopping = bool(STOP)
        now = time.time()
        for msg in cmd_r.take(N=100):
            if not isinstance(msg, JointTrajectory):
                continue  # instance-state notices (a writer left), not data
            commands += 1
            if bad_done:
                commands_after_bad += 1
            arrival = time.time()
            # Write (source timestamp) to arrival: the stamp itself is zero ("start now").
            command_latency.append(arrival - msg.sample_info.source_timestamp * 1e-9)
            written = msg.sample_info.source_timestamp * 1e-9
            received.append((arrival, arrival + CLOCK_OFFSET, msg))
            written_at.append((written, arrival + CLOCK_OFFSET, msg))
            names_seen = list(msg.joint_names)
            p = list(msg.points[0].positions)
            if not all(math.isfinite(x) for x in p):
                nonfinite += 1
                continue
            first = first or p
            last = p
            for n, x in zip(msg.joint_names, p):  # a perfect arm
                position[index[n]] = x
        if grip_r is not None:
            for msg in grip_r.take(N=100):
                if isinstance(msg, Float64MultiArray):
                    gripper_commands += 1
                    gripper_last = list(msg.data)
                    for n, x in zip(gripper_joints, msg.data):
                        position[index[n]] = x
        if goal_r is not None:
            for req in goal_r.take(N=100):
                if not isinstance(req, GripperSendGoalRequest):
                    continue
                gid = bytes(req.goal_id)
                # rclcpp_action refuses a goal id it already has.
                accepted = gid not in goal_ids and (
                    args.refuse_goals_after is None or now - t0 < args.refuse_goals_after)
                duplicate_goal_ids += gid in goal_ids
                goal_ids.add(gid)
                c = req.goal.command
                goals.append((now - t0, c.position, c.max_effort, accepted))
                if accepted and math.isfinite(c.position):
                    # The position adapter forwards the goal's position to the joint.
                    position[index[gripper_joints[0]]] = c.position
                    gripper_last = [c.position]
                goal_w.write(GripperSendGoalResponse(guid=req.guid, seq_high=req.seq_high, seq_low=req.seq_low,
                                                     accepted=accepted, stamp=stamp()))
        shadow += sum(isinstance(m, JointTrajectory) for m in shadow_r.take(N=100))
        statuses += sum(isinstance(m, String) for m in status_r.take(N=100))
        for d in diag_r.take(N=10):
            if isinstance(d, DiagnosticArray) and d.status:
                st = d.status[0]
                diagnostics.append({"level": int(st.level), "message": st.message,
                                    "values": {kv.key: kv.value for kv in st.values}})
        if now >= next_js:
            next_js += 0.01
            js_w.write(JointState(header=Header(stamp=stamp()), name=joints, position=position))
        if now >= next_img:
            next_img += 1.0 / args.fps
            shade = int(now * 50) % 256
            buf = io.BytesIO()
            PILImage.new("RGB", (jw, jh), (shade, 40, 200)).save(buf, format="JPEG", quality=80)
            jpeg = list(buf.getvalue())
            # Stamped just before each write: pi0d's camera latency is transport + decoding.
            if img_w is not None:
                img_w.write(Image(header=Header(stamp=stamp()), height=h, width=w, encoding="rgb8",
                                  step=w * 3, data=raw_data))
            if jpeg_w is not None:
                jpeg_w.write(CompressedImage(header=Header(stamp=stamp()), format="jpeg", data=jpeg))
        bad_at = args.bad_frames_at
        if bad_at is not None and not bad_done and now - t0 > bad_at and now >= next_bad:
            if now - t0 > bad_at + 1.0:
                bad_done, at_bad_end = True, list(position)
            else:
                # Between the good frames (10 Hz), every 25 ms, all kinds in turn.
                next_bad = now + 0.025
                frames = bad_frames(w, h)
                img_w.write(frames[bad_sent % len(frames)])
                jpeg_w.write(CompressedImage(header=Header(stamp=stamp()), format="jpeg",
                                             data=[255, 216, 255, 224, 0, 16] + [7] * 50))
                if bad_sent < len(BAD_PROMPTS):
                    prompt_w.write(String(data=BAD_PROMPTS[bad_sent]))
                bad_sent += 1
        if not prompt_sent and now - t0 > 1.0:
            prompt_w.write(String(data="stack the blocks"))
            prompt_sent = True
        if args.estop_at is not None and not estop_sent and now - t0 > args.estop_at:
            estop_w.write(Bool(data=True))
            estop_sent = time.time()
        if args.reset_at is not None and not reset_sent and now - t0 > args.reset_at:
            estop_w.write(Bool(data=False))
            time.sleep(0.05)
            req_w.write(TriggerRequest(guid=my_guid, seq_high=0, seq_low=1))
            reset_sent = time.time()
        for rep in rep_r.take(N=10):
            if isinstance(rep, TriggerResponse) and list(rep.guid) == my_guid and rep.seq_low == 1:
                reset_reply = {"success": bool(rep.success), "message": rep.message, "at": now - t0}
        if stopping:
            break
        time.sleep(0.002)
    report = {"commands": commands, "shadow_commands": shadow, "joint_names": names_seen, "first": first, "last": last,
              "nonfinite": nonfinite, "statuses": statuses, "diagnostics": diagnostics,
              "reset_reply": reset_reply, "command_latency_ms": percentiles(command_latency),
              "interarrival_ms": interarrival([r[0] for r in received]),
              # Every message through each distribution's controller checks, and the motion
              # the controller makes of the stream, whole and with every 7th message lost.
              "jtc": check_stream(received, arm_joints),
              "jtc_lossy": check_stream(received, arm_joints, drop_every=7),
              "jtc_written": check_stream(written_at, arm_joints),
              "jtc_written_lossy": check_stream(written_at, arm_joints, drop_every=7),
              # The same on pi0d's own timeline (its ticks, from the points it wrote): what the
              # controller makes of pi0d's points whatever the host did to the writes.
              "jtc_ticks": check_stream(on_ticks(written_at), arm_joints),
              "jtc_ticks_lossy": check_stream(on_ticks(written_at), arm_joints, drop_every=7),
              "gripper_commands": gripper_commands, "gripper_last": gripper_last,
              "gripper_goals": [{"at": a, "position": p, "max_effort": e, "accepted": ok}
                                for a, p, e, ok in goals],
              "duplicate_goal_ids": duplicate_goal_ids,
              "final_position": position,
              "write_interval_ms": interarrival([r[0] for r in written_at]),
              "timeline_error_ms": timeline_error(written_at),
              # On the controller model's time axis (s after the first command was written).
              "estop_sent_s": estop_sent - written_at[0][0] if estop_sent and written_at else None,
              "reset_sent_s": reset_sent - written_at[0][0] if reset_sent and written_at else None,
              "bad_sent": bad_sent,
              "bad_prompts_sent": min(bad_sent, len(BAD_PROMPTS)),
              "commands_after_bad": commands_after_bad,
              "moved_after_bad": None if at_bad_end is None or last is None
              else sum(abs(a - b) for a, b in zip(at_bad_end, last))}
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
