"""Starts pi0d from a ROS 2 launch file.

    ros2 launch launch/pi0d.launch.py config:=/etc/pi0d/pi0d.toml

pi0d is a plain executable (not an ament package), so it is started with ExecuteProcess.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration


def generate_launch_description():
    config = LaunchConfiguration("config")
    binary = LaunchConfiguration("binary")
    return LaunchDescription(
        [
            DeclareLaunchArgument("config", default_value="/etc/pi0d/pi0d.toml"),
            DeclareLaunchArgument("binary", default_value="pi0d"),
            ExecuteProcess(
                cmd=[binary, "run", "--config", config, "--quiet"],
                output="screen",
                sigterm_timeout="10",
            ),
        ]
    )
