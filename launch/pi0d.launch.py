"""Starts pi0d from a ROS 2 launch file.

    ros2 launch launch/pi0d.launch.py config:=/etc/pi0d/pi0d.toml [params_file:=params.yaml] [node:=pi0d]

pi0d is a plain executable (not an ament package), so it is started with ExecuteProcess and
given the `--ros-args` a launch_ros Node would pass: the node name and a parameter file whose
`ros__parameters` are dotted paths into pi0d's configuration (e.g. `control.rate_hz: 500`,
`ros.domain_id: 3`, `policy.prompt: "..."`; see tests/config/params.yaml).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration, PythonExpression


def generate_launch_description():
    config = LaunchConfiguration("config")
    binary = LaunchConfiguration("binary")
    node = LaunchConfiguration("node")
    params = LaunchConfiguration("params_file")
    has_params = PythonExpression(["'", params, "' != ''"])
    base = [binary, "run", "--config", config, "--quiet", "--ros-args", "-r", ["__node:=", node]]
    return LaunchDescription(
        [
            DeclareLaunchArgument("config", default_value="/etc/pi0d/pi0d.toml"),
            DeclareLaunchArgument("binary", default_value="pi0d"),
            DeclareLaunchArgument("node", default_value="pi0d"),
            DeclareLaunchArgument("params_file", default_value=""),
            ExecuteProcess(
                cmd=base + ["--params-file", params],
                condition=IfCondition(has_params),
                output="screen",
                sigterm_timeout="10",
            ),
            ExecuteProcess(
                cmd=base,
                condition=UnlessCondition(has_params),
                output="screen",
                sigterm_timeout="10",
            ),
        ]
    )
