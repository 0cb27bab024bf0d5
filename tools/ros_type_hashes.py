#!/usr/bin/env python3
"""REP-2016 type hashes (RIHS01) of the ROS 2 types pi0d sends and receives, computed from the
message definitions in rosbags' ROS 2 Jazzy type store (std_srvs from its .srv definition;
control_msgs' GripperCommand and its action's send_goal service, as rosidl generates every
action's, from their fields).

    .venv/bin/python tools/ros_type_hashes.py [--check-known]

Prints JSON {"pkg/msg/Type": "RIHS01_..."}; src/io/ros/type_hash.rs holds the same values and
tests/it/ros_type_hashes.rs compares them with this tool's output. The algorithm is
rosidl_generator_type_description's: the type description (fields with type ids, capacities,
nested type names; every referenced type, sorted by name; no default values, no constants)
as JSON with ", " / ": " separators, hashed with SHA-256. --check-known first reproduces
published Jazzy hashes of other types (std_msgs/String, rcl_interfaces/Log and ParameterEvent,
action_msgs/GoalStatusArray, example_interfaces/AddTwoInts, action_tutorials_interfaces'
Fibonacci action's send_goal service) and fails if any differs.
"""

import argparse
import hashlib
import json
import sys

from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.base import Nodetype

TS = get_typestore(Stores.ROS2_JAZZY)

# type_description_interfaces/msg/FieldType ids (a .msg `char` is IDL uint8; `byte` is octet).
BASE_IDS = {
    "int8": 2, "uint8": 3, "char": 3, "int16": 4, "uint16": 5, "int32": 6, "uint32": 7, "int64": 8, "uint64": 9,
    "float32": 10, "float64": 11, "bool": 15, "byte": 16, "string": 17, "wstring": 18,
}
NESTED = 1
BOUNDED_STRING, BOUNDED_WSTRING = 21, 22
ARRAY, BOUNDED_SEQUENCE, UNBOUNDED_SEQUENCE = 48, 96, 144

PI0D_TYPES = [
    "sensor_msgs/msg/JointState",
    "sensor_msgs/msg/Image",
    "sensor_msgs/msg/CompressedImage",
    "std_msgs/msg/String",
    "std_msgs/msg/Bool",
    "std_msgs/msg/Float64MultiArray",
    "trajectory_msgs/msg/JointTrajectory",
    "diagnostic_msgs/msg/DiagnosticArray",
]
PI0D_SERVICES = {"std_srvs/srv/Trigger": ("", "bool success\nstring message")}
# Actions pi0d sends goals to: each one's goal fields; pi0d uses its send_goal service.
PI0D_ACTIONS = {"control_msgs/action/GripperCommand": [("command", (Nodetype.NAME, "control_msgs/msg/GripperCommand"))]}

KNOWN = {
    "std_msgs/msg/String": "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18",
    "rcl_interfaces/msg/Log": "RIHS01_e28ce254ca8abc06abf92773b74602cdbf116ed34fbaf294fb9f81da9f318eac",
    "rcl_interfaces/msg/ParameterEvent": "RIHS01_043e627780fcad87a22d225bc2a037361dba713fca6a6b9f4b869a5aa0393204",
    "action_msgs/msg/GoalStatusArray": "RIHS01_6c1684b00f177d37438febe6e709fc4e2b0d4248dca4854946f9ed8b30cda83e",
}
KNOWN_SERVICES = {
    "example_interfaces/srv/AddTwoInts": (("int64 a\nint64 b", "int64 sum"),
                                          "RIHS01_e118de6bf5eeb66a2491b5bda11202e7b68f198d6f67922cf30364858239c81a"),
}
# An action's send_goal service: Jazzy's action_tutorials_interfaces/action/Fibonacci (goal
# `int32 order`), as ros2-client 0.12 locks it from the installed Jazzy type descriptions.
KNOWN_ACTIONS = {
    "action_tutorials_interfaces/action/Fibonacci": ([("order", (Nodetype.BASE, ("int32", 0)))],
                                                     "RIHS01_a0603060ed69fe2dfbd1a6f3b982a1749957ef346e4a4d2b311a05e305ec37bb"),
}
# Types neither rosbags' store nor a .msg of pi0d's defines.
EXTRA_TYPES = {
    "control_msgs/msg/GripperCommand": [("position", (Nodetype.BASE, ("float64", 0))),
                                        ("max_effort", (Nodetype.BASE, ("float64", 0)))],
}


def field_type(node):
    """(type_id, capacity, string_capacity, nested_type_name) of a rosbags field node."""
    kind, details = node
    if kind == Nodetype.BASE:
        name, bound = details
        if name in ("string", "wstring") and bound:
            return (BOUNDED_STRING if name == "string" else BOUNDED_WSTRING), 0, bound, ""
        return BASE_IDS[name], 0, 0, ""
    if kind == Nodetype.NAME:
        return NESTED, 0, 0, details
    inner, size = details
    tid, _, strcap, nested = field_type(inner)
    if kind == Nodetype.ARRAY:
        return tid + ARRAY, size, strcap, nested
    if size:
        return tid + BOUNDED_SEQUENCE, size, strcap, nested
    return tid + UNBOUNDED_SEQUENCE, 0, strcap, nested


def individual(name, fields):
    out = []
    for fname, node in fields:
        tid, cap, strcap, nested = field_type(node)
        out.append({"name": fname, "type": {"type_id": tid, "capacity": cap, "string_capacity": strcap,
                                            "nested_type_name": nested}})
    if not out:
        out.append({"name": "structure_needs_at_least_one_member",
                    "type": {"type_id": 3, "capacity": 0, "string_capacity": 0, "nested_type_name": ""}})
    return {"type_name": name, "fields": out}


def referenced(name, seen):
    for _, node in TS.fielddefs[name][1]:
        n = node
        while n[0] in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            n = n[1][0]
        if n[0] == Nodetype.NAME and n[1] not in seen:
            seen.add(n[1])
            referenced(n[1], seen)
    return seen


def rihs01(description):
    text = json.dumps(description, separators=(", ", ": "), ensure_ascii=True, allow_nan=False, sort_keys=False)
    return "RIHS01_" + hashlib.sha256(text.encode()).hexdigest()


def message_hash(name):
    refs = sorted(referenced(name, set()))
    return rihs01({
        "type_description": individual(name, TS.fielddefs[name][1]),
        "referenced_type_descriptions": [individual(r, TS.fielddefs[r][1]) for r in refs],
    })


def register(name, definition):
    # rosbags files `pkg/srv/X_Request` under its msg namespace; the hash uses the srv name.
    pkg, _, rest = name.split("/")
    alias = f"{pkg}/msg/{rest}"
    TS.register(get_types_from_msg(definition, alias))
    TS.fielddefs[name] = TS.fielddefs[alias]


def ensure_service_event_info():
    if "service_msgs/msg/ServiceEventInfo" not in TS.fielddefs:
        register("service_msgs/msg/ServiceEventInfo",
                 "uint8 event_type\nbuiltin_interfaces/Time stamp\nchar[16] client_gid\nint64 sequence_number")


def service_hash(name, request, response):
    register(f"{name}_Request", request)
    register(f"{name}_Response", response)
    return service_of(name)


def send_goal_hash(action, goal_fields):
    """The hash of `action`'s send_goal service (`<action>_SendGoal`), as rosidl generates it
    for every action: request `goal_id` and `goal`, response `accepted` and `stamp`."""
    for name, fields in EXTRA_TYPES.items():
        TS.fielddefs.setdefault(name, ([], fields))
    goal, name = f"{action}_Goal", f"{action}_SendGoal"
    TS.fielddefs[goal] = ([], goal_fields)
    TS.fielddefs[f"{name}_Request"] = ([], [("goal_id", (Nodetype.NAME, "unique_identifier_msgs/msg/UUID")),
                                            ("goal", (Nodetype.NAME, goal))])
    TS.fielddefs[f"{name}_Response"] = ([], [("accepted", (Nodetype.BASE, ("bool", 0))),
                                             ("stamp", (Nodetype.NAME, "builtin_interfaces/msg/Time"))])
    return service_of(name)


def service_of(name):
    """The hash of service `name` whose `_Request` and `_Response` are defined: with its
    `_Event` message, as rosidl describes every service since Iron."""
    ensure_service_event_info()
    req, resp, event = f"{name}_Request", f"{name}_Response", f"{name}_Event"
    TS.fielddefs[event] = ([], [
        ("info", (Nodetype.NAME, "service_msgs/msg/ServiceEventInfo")),
        ("request", (Nodetype.SEQUENCE, ((Nodetype.NAME, req), 1))),
        ("response", (Nodetype.SEQUENCE, ((Nodetype.NAME, resp), 1))),
    ])
    TS.fielddefs[name] = ([], [
        ("request_message", (Nodetype.NAME, req)),
        ("response_message", (Nodetype.NAME, resp)),
        ("event_message", (Nodetype.NAME, event)),
    ])
    return message_hash(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-known", action="store_true")
    args = ap.parse_args()
    if args.check_known:
        bad = {n: (message_hash(n), h) for n, h in KNOWN.items() if message_hash(n) != h}
        for n, ((req, resp), h) in KNOWN_SERVICES.items():
            got = service_hash(n, req, resp)
            if got != h:
                bad[n] = (got, h)
        for action, (fields, h) in KNOWN_ACTIONS.items():
            got = send_goal_hash(action, fields)
            if got != h:
                bad[f"{action}_SendGoal"] = (got, h)
        if bad:
            sys.exit(f"hashes differ from the published ones: {bad}")
    out = {n: message_hash(n) for n in PI0D_TYPES}
    for n, (req, resp) in PI0D_SERVICES.items():
        out[n] = service_hash(n, req, resp)
    for action, fields in PI0D_ACTIONS.items():
        out[f"{action}_SendGoal"] = send_goal_hash(action, fields)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
