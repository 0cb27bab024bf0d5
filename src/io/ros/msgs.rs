//! ROS 2 message types pi0d exchanges, laid out field by field as their IDL so that CDR
//! (de)serialization through serde matches what rclcpp / rclpy / Cyclone DDS put on the wire.

use serde::{Deserialize, Serialize};

/// builtin_interfaces/Time
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Time {
    pub sec: i32,
    pub nanosec: u32,
}

impl Time {
    /// Nanoseconds since the epoch to a stamp, saturating at the ends of the `i32` seconds
    /// range, so the stamp is always well formed (`nanosec` below 1e9).
    pub(crate) fn from_nanos(ns: i128) -> Time {
        const NS: i128 = 1_000_000_000;
        if ns >= (i32::MAX as i128 + 1) * NS {
            return Time {
                sec: i32::MAX,
                nanosec: 999_999_999,
            };
        }
        if ns < i32::MIN as i128 * NS {
            return Time {
                sec: i32::MIN,
                nanosec: 0,
            };
        }
        Time {
            sec: ns.div_euclid(NS) as i32,
            nanosec: ns.rem_euclid(NS) as u32,
        }
    }

    #[cfg(test)]
    pub(crate) fn as_seconds(&self) -> f64 {
        self.sec as f64 + self.nanosec as f64 * 1e-9
    }
}

/// builtin_interfaces/Duration
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Duration {
    pub sec: i32,
    pub nanosec: u32,
}

impl Duration {
    /// `s` (>= 0, finite) rounded to the nanosecond.
    pub(crate) fn from_seconds(s: f64) -> Duration {
        let ns = (s.max(0.0) * 1e9).round() as u64;
        Duration {
            sec: (ns / 1_000_000_000) as i32,
            nanosec: (ns % 1_000_000_000) as u32,
        }
    }
}

/// std_msgs/Header
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Header {
    pub stamp: Time,
    pub frame_id: String,
}

/// sensor_msgs/JointState
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct JointState {
    pub header: Header,
    pub name: Vec<String>,
    pub position: Vec<f64>,
    pub velocity: Vec<f64>,
    pub effort: Vec<f64>,
}

/// trajectory_msgs/JointTrajectoryPoint
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct JointTrajectoryPoint {
    pub positions: Vec<f64>,
    pub velocities: Vec<f64>,
    pub accelerations: Vec<f64>,
    pub effort: Vec<f64>,
    pub time_from_start: Duration,
}

/// trajectory_msgs/JointTrajectory
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct JointTrajectory {
    pub header: Header,
    pub joint_names: Vec<String>,
    pub points: Vec<JointTrajectoryPoint>,
}

/// std_msgs/MultiArrayDimension
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct MultiArrayDimension {
    pub label: String,
    pub size: u32,
    pub stride: u32,
}

/// std_msgs/MultiArrayLayout
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct MultiArrayLayout {
    pub dim: Vec<MultiArrayDimension>,
    pub data_offset: u32,
}

/// std_msgs/Float64MultiArray
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Float64MultiArray {
    pub layout: MultiArrayLayout,
    pub data: Vec<f64>,
}

/// sensor_msgs/Image
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Image {
    pub header: Header,
    pub height: u32,
    pub width: u32,
    pub encoding: String,
    pub is_bigendian: u8,
    pub step: u32,
    pub data: Vec<u8>,
}

/// sensor_msgs/CompressedImage (`format`: "jpeg", "png", or "rgb8; jpeg compressed bgr8"...)
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct CompressedImage {
    pub header: Header,
    pub format: String,
    pub data: Vec<u8>,
}

/// std_msgs/String
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct StringMsg {
    pub data: String,
}

/// std_msgs/Bool
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct BoolMsg {
    pub data: bool,
}

/// diagnostic_msgs/KeyValue
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeyValue {
    pub key: String,
    pub value: String,
}

/// diagnostic_msgs/DiagnosticStatus (`level`: 0 OK, 1 WARN, 2 ERROR, 3 STALE)
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct DiagnosticStatus {
    pub level: u8,
    pub name: String,
    pub message: String,
    pub hardware_id: String,
    pub values: Vec<KeyValue>,
}

/// diagnostic_msgs/DiagnosticArray
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct DiagnosticArray {
    pub header: Header,
    pub status: Vec<DiagnosticStatus>,
}

/// std_srvs/Trigger request (an empty message carries rosidl's placeholder byte).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct TriggerRequest {
    pub structure_needs_at_least_one_member: u8,
}

impl ros2_client::Message for TriggerRequest {}

/// std_srvs/Trigger response
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct TriggerResponse {
    pub success: bool,
    pub message: String,
}

impl ros2_client::Message for TriggerResponse {}

/// control_msgs/msg/GripperCommand
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct GripperCommand {
    pub(crate) position: f64,
    pub(crate) max_effort: f64,
}

/// control_msgs/action/GripperCommand's goal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct GripperCommandGoal {
    pub(crate) command: GripperCommand,
}

impl ros2_client::Message for GripperCommandGoal {}

/// control_msgs/action/GripperCommand's result (and, with the same fields, its feedback).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct GripperCommandResult {
    pub(crate) position: f64,
    pub(crate) effort: f64,
    pub(crate) stalled: bool,
    pub(crate) reached_goal: bool,
}

impl ros2_client::Message for GripperCommandResult {}

#[cfg(test)]
mod tests {
    use super::Time;

    #[test]
    fn when_nanoseconds_out_of_range_expect_stamp_saturated_and_well_formed() {
        let t = |sec, nanosec| Time { sec, nanosec };
        assert_eq!(Time::from_nanos(1_250_000_000), t(1, 250_000_000));
        assert_eq!(Time::from_nanos(-500_000_000), t(-1, 500_000_000));
        assert_eq!(Time::from_nanos(-1), t(-1, 999_999_999));
        let top = t(i32::MAX, 999_999_999);
        assert_eq!(
            Time::from_nanos((i32::MAX as i128 + 1) * 1_000_000_000 - 1),
            top
        );
        assert_eq!(Time::from_nanos(1_000_000_000_000_000_000_000), top);
        assert_eq!(
            Time::from_nanos(i32::MIN as i128 * 1_000_000_000),
            t(i32::MIN, 0)
        );
        assert_eq!(
            Time::from_nanos(-1_000_000_000_000_000_000_000),
            t(i32::MIN, 0)
        );
    }
}
