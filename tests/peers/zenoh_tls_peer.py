#!/usr/bin/env python3
"""A peer on the robot's Zenoh network that tries to steer pi0d (eclipse-zenoh, rmw_zenoh's wire
format): it connects over TLS with the certificate it is given (or none), then publishes the
e-stop released, a reset and a prompt --count times over a second, and calls the reset
service. For tests/zenoh_policy.rs: only a peer whose certificate the session file allows may
be heard. Prints JSON: whether a link came up, and what the reset service answered."""

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

import zenoh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zenoh_robot_peer import TS, T, Sender, dds_type, type_hash  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", default=None)
    ap.add_argument("--key", default=None)
    ap.add_argument("--domain", type=int, default=0)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--count", type=int, default=10)
    args = ap.parse_args()

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("connect/endpoints", json.dumps([args.connect]))
    conf.insert_json5("listen/endpoints", "[]")
    conf.insert_json5("scouting/multicast/enabled", "false")
    conf.insert_json5("transport/link/tls/root_ca_certificate", json.dumps(args.ca))
    if args.cert:
        conf.insert_json5("transport/link/tls/connect_certificate", json.dumps(args.cert))
        conf.insert_json5("transport/link/tls/connect_private_key", json.dumps(args.key))
        conf.insert_json5("transport/link/tls/enable_mtls", "true")
    session = zenoh.open(conf)
    d = args.domain
    # A link comes up within a second or never (a refused handshake is retried in the background).
    linked = False
    for _ in range(20):
        if list(session.info.peers_zid()):
            linked = True
            break
        time.sleep(0.1)
    estop = Sender(session, d, "/pi0d/estop", "std_msgs/msg/Bool")
    reset = Sender(session, d, "/pi0d/reset", "std_msgs/msg/Bool")
    prompt = Sender(session, d, "/pi0d/prompt", "std_msgs/msg/String")
    time.sleep(0.3)
    for _ in range(args.count):
        estop.send(T["std_msgs/msg/Bool"](data=False))
        reset.send(T["std_msgs/msg/Bool"](data=True))
        prompt.send(T["std_msgs/msg/String"](data=args.prompt))
        time.sleep(1.0 / args.count)
    request = bytes(TS.serialize_cdr(T["std_srvs/msg/Trigger_Request"](structure_needs_at_least_one_member=0),
                                     "std_srvs/msg/Trigger_Request"))
    trigger = "std_srvs/srv/Trigger"
    key = f"{d}/pi0d/reset/{dds_type(trigger)}/{type_hash(trigger)}"
    attachment = struct.pack("<qq", 1, time.time_ns()) + bytes([16]) + os.urandom(16)
    answers = []
    for reply in session.get(key, payload=request, attachment=attachment, timeout=1.0):
        if reply.ok is not None:
            resp = TS.deserialize_cdr(reply.ok.payload.to_bytes(), "std_srvs/msg/Trigger_Response")
            answers.append(resp.message)
    print(json.dumps({"linked": linked, "reset_answers": answers}), flush=True)
    session.close()


if __name__ == "__main__":
    main()
