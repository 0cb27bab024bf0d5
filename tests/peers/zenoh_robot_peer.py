#!/usr/bin/env python3
"""A robot speaking ROS 2 over Zenoh as rmw_zenoh does, for pi0d's interop tests.

Written against the eclipse-zenoh Python package and rosbags (CDR), not ros2-client: key
expressions `<domain>/<topic>/<dds type>/<type hash>`, CDR payloads with their encapsulation
header, and the 33-byte attachment (sequence number, source timestamp, GID) on every sample.
It listens on a loopback TCP endpoint (no multicast), publishes joint states (100 Hz) that
follow the commands it receives (a perfect arm), raw and JPEG camera images (10 Hz) and the
prompt, optionally presses the e-stop and calls the reset service, reads pi0d's
JointTrajectory commands and writes a JSON report. With --gripper-action it also plays
gripper_action_controller behind rmw_zenoh: a complete queryable on the action's send_goal
service key (as rmw_zenoh's ServiceData declares it), each request's attachment checked as
rmw_zenoh's take_request checks it, every goal accepted (each preempting the last) and its
position forwarded to the gripper joint, the reply carrying the request's sequence number and
the client's GID (rmw_zenoh's send_response).

    zenoh_robot_peer.py --listen tcp/127.0.0.1:PORT --domain D --duration S --report FILE
        [--estop-at S] [--reset-at S]
        [--gripper-action NAME [--refuse-goals-after S] [--garble-replies-after S]]
"""

import argparse
import io
import json
import math
import signal
import os
import struct
import threading
import time
from pathlib import Path

import sys

import numpy as np
import zenoh
from PIL import Image as PILImage
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

TS = get_typestore(Stores.ROS2_JAZZY)
# std_srvs is not in rosbags' store: Trigger's request and response from their definitions.
TS.register(get_types_from_msg("uint8 structure_needs_at_least_one_member", "std_srvs/msg/Trigger_Request"))
TS.register(get_types_from_msg("bool success\nstring message", "std_srvs/msg/Trigger_Response"))
# control_msgs/action/GripperCommand's send_goal service, from the definitions rosidl generates.
TS.register(get_types_from_msg("float64 position\nfloat64 max_effort", "control_msgs/msg/GripperCommand"))
TS.register(get_types_from_msg("control_msgs/GripperCommand command", "control_msgs/action/GripperCommand_Goal"))
TS.register(get_types_from_msg("unique_identifier_msgs/UUID goal_id\ncontrol_msgs/action/GripperCommand_Goal goal",
                                "control_msgs/action/GripperCommand_SendGoal_Request"))
TS.register(get_types_from_msg("bool accepted\nbuiltin_interfaces/Time stamp",
                                "control_msgs/action/GripperCommand_SendGoal_Response"))
T = TS.types
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import ros_type_hashes  # noqa: E402  (REP-2016 hashes from the message definitions)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from jtc_model import check_stream, on_ticks  # noqa: E402

JOINTS = ["shoulder_pan", "shoulder_lift", "elbow", "wrist_1", "wrist_2", "wrist_3", "gripper"]
START = [0.0, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02]
# A sender names the type's real REP-2016 hash, as rmw_zenoh does (--humble: its Humble build).
HASHES = {}
HUMBLE = False


TRAJ, STR, DIAG = "trajectory_msgs/msg/JointTrajectory", "std_msgs/msg/String", "diagnostic_msgs/msg/DiagnosticArray"
TRIGGER = "std_srvs/srv/Trigger"


def type_hash(ros_type):
    if HUMBLE:
        return "TypeHashNotSupported"  # rmw_zenoh on Humble writes this where a hash goes
    if ros_type not in HASHES:
        HASHES[ros_type] = (ros_type_hashes.service_hash(ros_type, *ros_type_hashes.PI0D_SERVICES[ros_type])
                            if "/srv/" in ros_type else ros_type_hashes.message_hash(ros_type))
    return HASHES[ros_type]


def dds_type(ros_type: str) -> str:
    pkg, kind, name = ros_type.split("/")
    return f"{pkg}::{kind}::dds_::{name}_"


def stamp():
    t = time.time()
    return T["builtin_interfaces/msg/Time"](sec=int(t), nanosec=int((t - int(t)) * 1e9))


def header():
    return T["std_msgs/msg/Header"](stamp=stamp(), frame_id="")


class Sender:
    """One rmw_zenoh-style publisher: concrete key, CDR payload, attachment."""

    def __init__(self, session, domain, topic, ros_type):
        self.key = f"{domain}/{topic.strip('/')}/{dds_type(ros_type)}/{type_hash(ros_type)}"
        self.ros_type = ros_type
        self.pub = session.declare_publisher(self.key)
        self.seq = 0
        self.gid = os.urandom(16)

    def send(self, msg):
        self.seq += 1
        attachment = struct.pack("<qq", self.seq, time.time_ns()) + bytes([16]) + self.gid
        self.pub.put(bytes(TS.serialize_cdr(msg, self.ros_type)), attachment=attachment)


def percentiles(seconds):
    if not seconds:
        return None
    s = sorted(seconds)
    return {"p50": s[round((len(s) - 1) * 0.5)] * 1e3, "p99": s[round((len(s) - 1) * 0.99)] * 1e3,
            "max": s[-1] * 1e3, "n": len(s)}


# SIGTERM received (the test's end of the run).
STOP = []


def flood(session, d, args, state):
    """Sends the four floodable inputs in turn at --flood-hz for --flood-s, from --flood-at."""
    estop = Sender(session, d, "/pi0d/estop", "std_msgs/msg/Bool")
    reset = Sender(session, d, "/pi0d/reset", "std_msgs/msg/Bool")
    prompt = Sender(session, d, "/pi0d/prompt", "std_msgs/msg/String")
    # A std_msgs/String whose 4 bytes end without the NUL terminator CDR requires.
    malformed = bytes([0, 1, 0, 0]) + struct.pack("<I", 4) + b"abcd"
    true = T["std_msgs/msg/Bool"](data=True)
    time.sleep(args.flood_at)
    t0, sent = time.time(), 0
    while time.time() - t0 < args.flood_s and not STOP:
        # Bursts of 10 every 10 / rate seconds: Python's sleep is too coarse for one by one.
        for _ in range(10):
            k = sent % 4
            if k == 0:
                estop.send(true)
            elif k == 1:
                reset.send(true)
            elif k == 2:
                prompt.send(T["std_msgs/msg/String"](data=f"prompt {sent}"))
            else:
                prompt.seq += 1
                attachment = struct.pack("<qq", prompt.seq, time.time_ns()) + bytes([16]) + prompt.gid
                prompt.pub.put(malformed, attachment=attachment)
            sent += 1
        behind = t0 + sent / args.flood_hz - time.time()
        if behind > 0:
            time.sleep(behind)
    state["flooded"] = sent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--joint-states-topic", default="/joint_states")
    ap.add_argument("--domain", type=int, default=0)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--estop-at", type=float, default=None)
    ap.add_argument("--reset-at", type=float, default=None)
    ap.add_argument("--image-size", default="64x48", help="camera frames WxH (the JPEG one too)")
    ap.add_argument("--fps", type=float, default=10.0, help="camera rate")
    ap.add_argument("--liveliness-at", type=float, default=3.0, help="when to list liveliness tokens (s)")
    ap.add_argument("--gripper-action", default=None,
                    help="serve control_msgs/action/GripperCommand goals for the gripper joint on this action")
    ap.add_argument("--refuse-goals-after", type=float, default=None,
                    help="refuse every goal from this time on (s): a controller that went inactive")
    ap.add_argument("--humble", action="store_true",
                    help="rmw_zenoh on Humble: TypeHashNotSupported in every key, subscriptions and "
                         "the send_goal queryable on exactly those keys")
    ap.add_argument("--bad-reset-first", action="store_true",
                    help="before the reset call, call the reset service once without an attachment")
    ap.add_argument("--garble-replies-after", type=float, default=None,
                    help="from this time on (s), answer goals with 3 bytes that are no send_goal response")
    ap.add_argument("--flood-at", type=float, default=None,
                    help="from this time on (s), flood pi0d's inputs for --flood-s: e-stop pressed, "
                         "reset requested, a new prompt and a string without its NUL terminator "
                         "(malformed CDR), in turn, --flood-hz messages a second in all")
    ap.add_argument("--flood-s", type=float, default=3.0)
    ap.add_argument("--impostor", action="store_true",
                    help="also declare, as rmw_zenoh would, a node named /pi0d and a publisher on "
                         "pi0d's command topic (someone else on pi0d's names)")
    ap.add_argument("--implausible-at", type=float, default=None,
                    help="from this time on (s), for 2 s, joint states say shoulder_pan is at 1e308 "
                         "(a broken encoder), alternating with -1e308")
    ap.add_argument("--flood-hz", type=float, default=10000.0)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: STOP.append(True))
    global HUMBLE
    HUMBLE = args.humble
    # Subscriptions, the send_goal queryable and the reset call name the exact hash (or Humble's
    # placeholder), as rmw_zenoh's entities do: a key with another hash matches nothing.
    want = type_hash

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("listen/endpoints", json.dumps([args.listen]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    session = zenoh.open(conf)
    d = args.domain

    lock = threading.Lock()
    state = {"position": list(START), "commands": 0, "names": None, "first": None, "last": None,
             "nonfinite": 0, "attachments": set(), "seqs": [], "keys": set(), "undecodable": 0,
             "statuses": 0, "status_keys": set(), "diagnostics": [], "latency": [],
             "arrivals": [], "written": [], "goals": [], "goal_ids": set(), "duplicate_goal_ids": 0,
             "goal_keys": set(), "goal_attachments": set(), "bad_goal_requests": 0, "gripper_last": None}

    def on_command(sample):
        with lock:
            state["keys"].add(str(sample.key_expr))
            att = sample.attachment.to_bytes() if sample.attachment is not None else b""
            state["attachments"].add(len(att))
            if len(att) == 33:
                state["seqs"].append(struct.unpack("<q", att[:8])[0])
            try:
                msg = TS.deserialize_cdr(sample.payload.to_bytes(), "trajectory_msgs/msg/JointTrajectory")
            except Exception:  # noqa: BLE001 - counted and reported
                state["undecodable"] += 1
                return
            # Write (the attachment's source timestamp) to arrival: the stamp itself is zero
            # ("start now") for joint_trajectory_controller.
            arrival = time.time()
            if len(att) == 33:
                written = struct.unpack("<q", att[8:16])[0] * 1e-9
                state["latency"].append(arrival - written)
                state["written"].append((written, arrival, msg))
            state["arrivals"].append(arrival)
            state["commands"] += 1
            state["names"] = list(msg.joint_names)
            p = [float(x) for x in msg.points[0].positions]
            if not all(math.isfinite(x) for x in p):
                state["nonfinite"] += 1
                return
            state["first"] = state["first"] or p
            state["last"] = p
            for n, x in zip(msg.joint_names, p):  # a perfect arm
                state["position"][JOINTS.index(n)] = x

    def on_status(sample):
        with lock:
            state["statuses"] += 1
            state["status_keys"].add(str(sample.key_expr))

    def on_diagnostics(sample):
        msg = TS.deserialize_cdr(sample.payload.to_bytes(), "diagnostic_msgs/msg/DiagnosticArray")
        with lock:
            for st in msg.status:
                state["diagnostics"].append({"level": int(st.level), "message": st.message,
                                             "values": {kv.key: kv.value for kv in st.values}})

    goal_type = "control_msgs/action/GripperCommand_SendGoal"
    t0 = time.time()  # set again as the loop starts; a goal before that still has a time
    served = []

    def on_goal(query):
        """A send_goal request, as rmw_zenoh's ServiceData takes and answers it."""
        now = time.time() - t0
        att = query.attachment.to_bytes() if query.attachment is not None else b""
        with lock:
            state["goal_keys"].add(str(query.key_expr))
            state["goal_attachments"].add(len(att))
            if len(att) != 33 or att[16] != 16:
                state["bad_goal_requests"] += 1  # take_request: no attachment, no request
                return
            seq, written = struct.unpack("<qq", att[:16])
            if seq < 0 or written < 0 or (att[17:], seq) in served:
                state["bad_goal_requests"] += 1  # negative or duplicate sequence numbers
                return
            served.append((att[17:], seq))
            try:
                req = TS.deserialize_cdr(query.payload.to_bytes(), f"{goal_type}_Request")
            except Exception:  # noqa: BLE001 - counted and reported
                state["bad_goal_requests"] += 1
                return
            gid = bytes(req.goal_id.uuid)
            # rclcpp_action refuses a goal id it already has.
            accepted = gid not in state["goal_ids"] and (
                args.refuse_goals_after is None or now < args.refuse_goals_after)
            state["duplicate_goal_ids"] += gid in state["goal_ids"]
            state["goal_ids"].add(gid)
            c = req.goal.command
            state["goals"].append({"at": now, "position": c.position, "max_effort": c.max_effort,
                                   "accepted": accepted})
            if accepted and math.isfinite(c.position):
                # The position adapter forwards the goal's position to the joint.
                state["position"][JOINTS.index("gripper")] = c.position
                state["gripper_last"] = c.position
        resp = bytes(TS.serialize_cdr(T[f"{goal_type}_Response"](accepted=accepted, stamp=stamp()),
                                      f"{goal_type}_Response"))
        if args.garble_replies_after is not None and now >= args.garble_replies_after:
            resp = resp[:3]
        query.reply(query.key_expr, resp,
                    attachment=struct.pack("<qq", seq, time.time_ns()) + bytes([16]) + att[17:])

    queryables = []
    if args.gripper_action:
        hash_ = ("TypeHashNotSupported" if HUMBLE else ros_type_hashes.send_goal_hash(
            "control_msgs/action/GripperCommand", ros_type_hashes.PI0D_ACTIONS["control_msgs/action/GripperCommand"]))
        key = f"{d}/{args.gripper_action.strip('/')}/_action/send_goal/{dds_type(goal_type)}/{hash_}"
        queryables.append(session.declare_queryable(key, on_goal, complete=True))
    subs = [
        session.declare_subscriber(f"{d}/arm_controller/joint_trajectory/{dds_type(TRAJ)}/{want(TRAJ)}", on_command),
        session.declare_subscriber(f"{d}/pi0d/status/{dds_type(STR)}/{want(STR)}", on_status),
        session.declare_subscriber(f"{d}/diagnostics/{dds_type(DIAG)}/{want(DIAG)}", on_diagnostics),
    ]
    js = Sender(session, d, args.joint_states_topic, "sensor_msgs/msg/JointState")
    raw = Sender(session, d, "/camera/image_raw", "sensor_msgs/msg/Image")
    jpeg = Sender(session, d, "/wrist/image_raw/compressed", "sensor_msgs/msg/CompressedImage")
    prompt = Sender(session, d, "/pi0d/prompt", "std_msgs/msg/String")
    estop = Sender(session, d, "/pi0d/estop", "std_msgs/msg/Bool")

    impostor_tokens = []
    if args.impostor:
        zid = str(session.info.zid())
        traj_hash = type_hash(TRAJ)
        for key in [f"@ros2_lv/{d}/{zid}/7/7/NN/%/%/pi0d",
                    f"@ros2_lv/{d}/{zid}/7/8/MP/%/%/pi0d/%arm_controller%joint_trajectory/"
                    f"{dds_type(TRAJ)}/{traj_hash}/1:2:1,10:,:,:,,"]:
            impostor_tokens.append(session.liveliness().declare_token(key))

    if args.flood_at is not None:
        threading.Thread(target=flood, args=(session, d, args, state), daemon=True).start()

    w, h = (int(x) for x in args.image_size.split("x"))
    jw, jh = (160, 120) if args.image_size == "64x48" else (w, h)
    t0 = time.time()
    next_js, next_img = t0, t0
    prompt_sent = estop_sent = reset_sent = False
    reset_reply = None
    bad_reset_replies = None
    tokens = None
    # The test ends this peer with SIGTERM once pi0d has exited (--duration only bounds it): the
    # loop then runs one whole pass begun after the signal, taking what arrived before it, and
    # the report is written as after --duration.
    while time.time() - t0 < args.duration:
        stopping = bool(STOP)
        now = time.time()
        if tokens is None and now - t0 > args.liveliness_at:
            # Discovery as rmw_zenoh sees it: liveliness tokens of pi0d's node and entities.
            tokens = [str(r.ok.key_expr) for r in session.liveliness().get(f"@ros2_lv/{d}/**", timeout=1.0)
                      if r.ok is not None]
        if now >= next_js:
            next_js += 0.01
            with lock:
                pos = list(state["position"])
            if args.implausible_at is not None and 0 <= now - t0 - args.implausible_at < 2.0:
                pos[0] = 1e308 if int(now * 100) % 2 else -1e308
                state["implausible"] = state.get("implausible", 0) + 1
            js.send(T["sensor_msgs/msg/JointState"](
                header=header(), name=JOINTS, position=np.array(pos), velocity=np.array([], dtype=np.float64),
                effort=np.array([], dtype=np.float64)))
        if now >= next_img:
            next_img += 1.0 / args.fps
            shade = int(now * 50) % 256
            buf = io.BytesIO()
            PILImage.new("RGB", (jw, jh), (shade, 40, 200)).save(buf, format="JPEG", quality=80)
            # Stamped just before each send: pi0d's camera latency is transport + decoding.
            raw.send(T["sensor_msgs/msg/Image"](
                header=header(), height=h, width=w, encoding="rgb8", is_bigendian=0, step=w * 3,
                data=np.full(w * h * 3, shade, dtype=np.uint8)))
            jpeg.send(T["sensor_msgs/msg/CompressedImage"](
                header=header(), format="jpeg", data=np.frombuffer(buf.getvalue(), dtype=np.uint8)))
        if not prompt_sent and now - t0 > 1.0:
            prompt.send(T["std_msgs/msg/String"](data="stack the blocks"))
            prompt_sent = True
        if args.estop_at is not None and not estop_sent and now - t0 > args.estop_at:
            estop.send(T["std_msgs/msg/Bool"](data=True))
            estop_sent = True
        if args.reset_at is not None and not reset_sent and now - t0 > args.reset_at:
            estop.send(T["std_msgs/msg/Bool"](data=False))
            time.sleep(0.05)
            # A service call is a query on the service's key with the request as payload.
            request = bytes(TS.serialize_cdr(T["std_srvs/msg/Trigger_Request"](structure_needs_at_least_one_member=0),
                                             "std_srvs/msg/Trigger_Request"))
            key = f"{d}/pi0d/reset/{dds_type(TRIGGER)}/{want(TRIGGER)}"
            if args.bad_reset_first:
                # A call without rmw_zenoh's attachment: its server drops it, answering nothing.
                replies = [r for r in session.get(key, payload=request, timeout=1.0) if r.ok is not None]
                bad_reset_replies = len(replies)
            attachment = struct.pack("<qq", 1, time.time_ns()) + bytes([16]) + os.urandom(16)
            for reply in session.get(key, payload=request,
                                     attachment=attachment, timeout=5.0):
                if reply.ok is not None:
                    resp = TS.deserialize_cdr(reply.ok.payload.to_bytes(), "std_srvs/msg/Trigger_Response")
                    reset_reply = {"success": bool(resp.success), "message": resp.message, "at": time.time() - t0}
            reset_sent = True
        if stopping:
            break
        time.sleep(0.002)

    for s in subs + queryables:
        s.undeclare()
    with lock:
        report = {"commands": state["commands"], "joint_names": state["names"], "first": state["first"],
                  "last": state["last"], "nonfinite": state["nonfinite"], "undecodable": state["undecodable"],
                  "attachment_lengths": sorted(state["attachments"]),
                  "seq_increasing": all(b > a for a, b in zip(state["seqs"], state["seqs"][1:])),
                  "keys": sorted(state["keys"]), "statuses": state["statuses"],
                  "status_keys": sorted(state["status_keys"]), "sent_hashes": HASHES,
                  "diagnostics": state["diagnostics"][-3:], "reset_reply": reset_reply,
                  "bad_reset_replies": bad_reset_replies, "flooded": state.get("flooded", 0),
                  "implausible": state.get("implausible", 0),
                  "liveliness": tokens, "command_latency_ms": percentiles(state["latency"]),
                  "interarrival_ms": percentiles([b - a for a, b in zip(state["arrivals"], state["arrivals"][1:])]),
                  # The controller model over the stream as pi0d wrote it (attachment stamps).
                  "jtc_written": check_stream(state["written"], JOINTS),
                  "jtc_written_lossy": check_stream(state["written"], JOINTS, drop_every=7),
                  # On pi0d's own timeline (jtc_model.on_ticks): what is asserted.
                  "jtc_ticks": check_stream(on_ticks(state["written"]), JOINTS),
                  "jtc_ticks_lossy": check_stream(on_ticks(state["written"]), JOINTS, drop_every=7),
                  "gripper_goals": state["goals"], "duplicate_goal_ids": state["duplicate_goal_ids"],
                  "goal_keys": sorted(state["goal_keys"]), "goal_attachments": sorted(state["goal_attachments"]),
                  "bad_goal_requests": state["bad_goal_requests"], "gripper_last": state["gripper_last"]}
    session.close()
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
