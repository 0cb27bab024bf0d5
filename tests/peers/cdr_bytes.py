#!/usr/bin/env python3
"""Serializes a fixed set of ROS 2 messages with rosbags (pure-Python CDR, ROS 2 Jazzy type
store) and prints them as JSON {name: hex}. tests/it/cdr_rosbags.rs builds the same messages in
Rust and compares the bytes both ways."""

import json

import numpy as np
from rosbags.typesys import Stores, get_typestore, get_types_from_msg

ts = get_typestore(Stores.ROS2_JAZZY)
# control_msgs is not in the store: its definitions as control_msgs ships them.
ts.register(get_types_from_msg("float64 position\nfloat64 max_effort", "control_msgs/msg/GripperCommand"))
ts.register(get_types_from_msg("control_msgs/GripperCommand command", "control_msgs/action/GripperCommand_Goal"))
T = ts.types


def header(sec, nanosec, frame):
    return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec), frame_id=frame)


msgs = {
    "sensor_msgs/msg/JointState": T["sensor_msgs/msg/JointState"](
        header=header(1700000000, 123456789, "base_link"),
        name=["shoulder_pan", "elbow", "gripper"],
        position=np.array([0.5, -1.25, 0.02]),
        velocity=np.array([0.1, 0.0, -0.3]),
        effort=np.array([], dtype=np.float64),
    ),
    "trajectory_msgs/msg/JointTrajectory": T["trajectory_msgs/msg/JointTrajectory"](
        header=header(12, 5000, ""),
        joint_names=["a", "bb"],
        points=[
            T["trajectory_msgs/msg/JointTrajectoryPoint"](
                positions=np.array([1.0, 2.0]),
                velocities=np.array([0.5, -0.5]),
                accelerations=np.array([0.0, 0.25]),
                effort=np.array([], dtype=np.float64),
                time_from_start=T["builtin_interfaces/msg/Duration"](sec=0, nanosec=5000000),
            )
        ],
    ),
    "std_msgs/msg/Float64MultiArray": T["std_msgs/msg/Float64MultiArray"](
        layout=T["std_msgs/msg/MultiArrayLayout"](
            dim=[T["std_msgs/msg/MultiArrayDimension"](label="joints", size=3, stride=3)], data_offset=0
        ),
        data=np.array([0.1, 0.2, 0.3]),
    ),
    "sensor_msgs/msg/Image": T["sensor_msgs/msg/Image"](
        header=header(3, 4, "cam"),
        height=2, width=3, encoding="rgb8", is_bigendian=0, step=9,
        data=np.arange(18, dtype=np.uint8),
    ),
    "sensor_msgs/msg/CompressedImage": T["sensor_msgs/msg/CompressedImage"](
        header=header(9, 10, "wrist"), format="jpeg", data=np.array([255, 216, 255, 0, 1], dtype=np.uint8),
    ),
    "std_msgs/msg/String": T["std_msgs/msg/String"](data="stack the blocks"),
    "diagnostic_msgs/msg/DiagnosticArray": T["diagnostic_msgs/msg/DiagnosticArray"](
        header=header(7, 8, ""),
        status=[T["diagnostic_msgs/msg/DiagnosticStatus"](
            level=1, name="pi0d: control", message="holding", hardware_id="pi0d",
            values=[T["diagnostic_msgs/msg/KeyValue"](key="ticks", value="42")],
        )],
    ),
    "std_msgs/msg/Bool": T["std_msgs/msg/Bool"](data=True),
    # pi0d's commands for joints a, bb at (1, 2) rad, (0.5, -0.5) rad/s, stamped 12 s 5000 ns, as
    # a JointState and a Float64MultiArray (the JointTrajectory above is the third kind).
    "command/sensor_msgs/msg/JointState": T["sensor_msgs/msg/JointState"](
        header=header(12, 5000, ""),
        name=["a", "bb"],
        position=np.array([1.0, 2.0]),
        velocity=np.array([0.5, -0.5]),
        effort=np.array([], dtype=np.float64),
    ),
    "command/std_msgs/msg/Float64MultiArray": T["std_msgs/msg/Float64MultiArray"](
        layout=T["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0),
        data=np.array([1.0, 2.0]),
    ),
    # Joint a's position as a gripper_action_controller goal, max_effort 40.
    "command/control_msgs/action/GripperCommand_Goal": T["control_msgs/action/GripperCommand_Goal"](
        command=T["control_msgs/msg/GripperCommand"](position=1.0, max_effort=40.0),
    ),
}
print(json.dumps({name: ts.serialize_cdr(m, name.removeprefix("command/")).hex() for name, m in msgs.items()}))
