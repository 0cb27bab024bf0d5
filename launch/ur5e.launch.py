"""Starts pi0d for the UR5e example (config/ur5e.toml) beside ur_robot_driver.

    ros2 launch launch/ur5e.launch.py [config:=config/ur5e.toml] [dry_run:=true] [binary:=pi0d]

The driver (ur_robot_driver's ur_control.launch.py with ur_type:=ur5e), the gripper's
forward_command_controller and realsense2_camera run from their own launch files; this one
starts pi0d against them. `dry_run:=true` publishes pi0d's commands on /pi0d/dry_run/... only.
"""

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration

HERE = os.path.dirname(os.path.abspath(__file__))


def generate_launch_description():
    config = LaunchConfiguration("config")
    binary = LaunchConfiguration("binary")
    dry_run = LaunchConfiguration("dry_run")
    base = [binary, "run", "--config", config, "--quiet"]
    ros_args = ["--ros-args", "-r", "__node:=pi0d"]
    return LaunchDescription(
        [
            DeclareLaunchArgument("config", default_value=os.path.join(HERE, "..", "config", "ur5e.toml")),
            DeclareLaunchArgument("binary", default_value="pi0d"),
            DeclareLaunchArgument("dry_run", default_value="false"),
            ExecuteProcess(
                cmd=base + ["--dry-run"] + ros_args,
                condition=IfCondition(dry_run),
                output="screen",
                sigterm_timeout="10",
            ),
            ExecuteProcess(
                cmd=base + ros_args,
                condition=UnlessCondition(dry_run),
                output="screen",
                sigterm_timeout="10",
            ),
        ]
    )
