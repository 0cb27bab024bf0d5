//! CDR byte-equality with `rosbags` (pure-Python CDR, whose bytes equal Cyclone DDS's) for every
//! message type pi0d exchanges, both directions: our serialization equals theirs byte for byte,
//! and their bytes decode into the same message; and what the command publisher sends, for each
//! command type, equals theirs.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use byteorder::LittleEndian;
use ros2_client::{ActionTypeName, MessageTypeName, Name, QosProfile, ServiceTypeName};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::encode::CommandPublisher;
use super::msgs::*;
use super::transport::{Middleware, Msg, Op, Put, SendGoal, Serve, SrvMsg, Take, TransportError};
use super::RosError;
use crate::config::{CommandGroup, CommandType};
use crate::joints::{JointVector, MotionState};
use crate::robot::lookahead::Lookahead;
use crate::robot::{JointKind, JointLimits, RobotLimits};
use crate::test_dirs::{peer_python, repo_path};
use crate::time::MonoTime;

fn rosbags_bytes() -> HashMap<String, Vec<u8>> {
    let out = Command::new(peer_python())
        .arg(repo_path("tests/peers/cdr_bytes.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex: HashMap<String, String> = serde_json::from_slice(&out.stdout).unwrap();
    hex.into_iter()
        .map(|(k, v)| {
            let bytes = (0..v.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
                .collect();
            (k, bytes)
        })
        .collect()
}

fn header(sec: i32, nanosec: u32, frame: &str) -> Header {
    Header {
        stamp: Time { sec, nanosec },
        frame_id: frame.into(),
    }
}

fn both_ways<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    name: &str,
    ours: &T,
    theirs: &HashMap<String, Vec<u8>>,
) {
    let theirs = &theirs[name];
    // rosbags writes the 4-byte encapsulation header (CDR little-endian: 00 01 00 00) first.
    assert_eq!(&theirs[..4], &[0, 1, 0, 0], "{name}: encapsulation");
    let payload = &theirs[4..];
    let mine = cdr_encoding::to_vec::<T, LittleEndian>(ours).unwrap();
    // Trailing alignment padding is not part of the message.
    assert_eq!(&mine[..], &payload[..mine.len()], "{name}: bytes differ");
    assert!(
        payload[mine.len()..].iter().all(|b| *b == 0) && payload.len() - mine.len() < 8,
        "{name}: tail"
    );
    let (decoded, _) = cdr_encoding::from_bytes::<T, LittleEndian>(payload).unwrap();
    assert_eq!(&decoded, ours, "{name}: decoded differs");
}

#[test]
fn when_messages_serialized_expect_bytes_equal_to_rosbags_both_ways() {
    let theirs = rosbags_bytes();
    both_ways(
        "sensor_msgs/msg/JointState",
        &JointState {
            header: header(1_700_000_000, 123_456_789, "base_link"),
            name: vec!["shoulder_pan".into(), "elbow".into(), "gripper".into()],
            position: vec![0.5, -1.25, 0.02],
            velocity: vec![0.1, 0.0, -0.3],
            effort: vec![],
        },
        &theirs,
    );
    both_ways(
        "trajectory_msgs/msg/JointTrajectory",
        &JointTrajectory {
            header: header(12, 5000, ""),
            joint_names: vec!["a".into(), "bb".into()],
            points: vec![JointTrajectoryPoint {
                positions: vec![1.0, 2.0],
                velocities: vec![0.5, -0.5],
                accelerations: vec![0.0, 0.25],
                effort: vec![],
                time_from_start: Duration {
                    sec: 0,
                    nanosec: 5_000_000,
                },
            }],
        },
        &theirs,
    );
    both_ways(
        "std_msgs/msg/Float64MultiArray",
        &Float64MultiArray {
            layout: MultiArrayLayout {
                dim: vec![MultiArrayDimension {
                    label: "joints".into(),
                    size: 3,
                    stride: 3,
                }],
                data_offset: 0,
            },
            data: vec![0.1, 0.2, 0.3],
        },
        &theirs,
    );
    both_ways(
        "sensor_msgs/msg/Image",
        &Image {
            header: header(3, 4, "cam"),
            height: 2,
            width: 3,
            encoding: "rgb8".into(),
            is_bigendian: 0,
            step: 9,
            data: (0..18).collect(),
        },
        &theirs,
    );
    both_ways(
        "std_msgs/msg/String",
        &StringMsg {
            data: "stack the blocks".into(),
        },
        &theirs,
    );
    both_ways("std_msgs/msg/Bool", &BoolMsg { data: true }, &theirs);
    both_ways(
        "diagnostic_msgs/msg/DiagnosticArray",
        &DiagnosticArray {
            header: header(7, 8, ""),
            status: vec![DiagnosticStatus {
                level: 1,
                name: "pi0d: control".into(),
                message: "holding".into(),
                hardware_id: "pi0d".into(),
                values: vec![KeyValue {
                    key: "ticks".into(),
                    value: "42".into(),
                }],
            }],
        },
        &theirs,
    );
    both_ways(
        "sensor_msgs/msg/CompressedImage",
        &CompressedImage {
            header: header(9, 10, "wrist"),
            format: "jpeg".into(),
            data: vec![255, 216, 255, 0, 1],
        },
        &theirs,
    );
    assert_eq!(
        theirs.len(),
        11,
        "every message type pi0d uses is compared (and three commands)"
    );
}

/// A middleware that records what its publishers send, as CDR, with the advertised type.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Sent>>>);

/// The advertised type and the CDR bytes of one message.
type Sent = (String, Vec<u8>);

struct RecordingPut(Recorder, String);

impl<M: Msg> Put<M> for RecordingPut {
    fn put(&self, msg: M) -> Result<(), TransportError> {
        let bytes = cdr_encoding::to_vec::<M, LittleEndian>(&msg)
            .map_err(|e| TransportError::new(Op::Encode, e))?;
        (self.0).0.lock().unwrap().push((self.1.clone(), bytes));
        Ok(())
    }
}

fn unsupported(what: &str) -> RosError {
    RosError::Create {
        what: what.into(),
        source: "not recorded".into(),
    }
}

impl Middleware for Recorder {
    fn subscribe<M: Msg>(
        &mut self,
        _: &Name,
        _: MessageTypeName,
        _: &QosProfile,
    ) -> Result<Box<dyn Take<M>>, RosError> {
        Err(unsupported("subscription"))
    }

    fn advertise<M: Msg>(
        &mut self,
        _: &Name,
        ty: MessageTypeName,
        _: &QosProfile,
    ) -> Result<Box<dyn Put<M>>, RosError> {
        let ty = format!("{}/msg/{}", ty.package_name(), ty.type_name());
        Ok(Box::new(RecordingPut(self.clone(), ty)))
    }

    fn serve<Req: SrvMsg, Resp: SrvMsg>(
        &mut self,
        _: &Name,
        _: ServiceTypeName,
        _: &QosProfile,
    ) -> Result<Box<dyn Serve<Req, Resp>>, RosError> {
        Err(unsupported("service"))
    }

    /// Records each goal (the goal itself: the DDS client prefixes the goal id).
    fn action_client<G: SrvMsg, R: SrvMsg, F: SrvMsg>(
        &mut self,
        _: &Name,
        ty: ActionTypeName,
        _: &QosProfile,
    ) -> Result<Box<dyn SendGoal<G>>, RosError> {
        let ty = format!("{}/action/{}_Goal", ty.package_name(), ty.type_name());
        Ok(Box::new(RecordingPut(self.clone(), ty)))
    }
}

impl<G: Msg> SendGoal<G> for RecordingPut {
    fn send(&mut self, goal: G) -> Result<(), TransportError> {
        self.put(goal)
    }
    fn replies(&mut self) -> Result<(u64, u64), TransportError> {
        Ok((1, 0))
    }
}

/// One output for both joints, at the control rate (200 Hz).
fn group(kind: CommandType) -> CommandGroup {
    CommandGroup {
        joints: vec!["a".into(), "bb".into()],
        indices: vec![0, 1],
        topic: "/arm_controller/joint_trajectory".into(),
        kind,
        rate_hz: 200.0,
        max_effort: 0.0,
    }
}

/// Two joints with the limits a trajectory's braking tail keeps.
fn two_joints() -> RobotLimits {
    let joint = |name: &str| JointLimits {
        name: name.into(),
        kind: JointKind::Revolute,
        lower: -3.0,
        upper: 3.0,
        velocity: 1.0,
        acceleration: 2.0,
        jerk: 50.0,
        effort: 0.0,
        soft: None,
        max_step: f64::INFINITY,
    };
    RobotLimits::new(vec![joint("a"), joint("bb")])
}

#[test]
fn when_command_published_as_each_type_expect_bytes_equal_to_rosbags() {
    let theirs = rosbags_bytes();
    let cmd = MotionState {
        position: JointVector::from_slice(&[1.0, 2.0]),
        velocity: JointVector::from_slice(&[0.5, -0.5]),
        acceleration: JointVector::from_slice(&[0.0, 0.25]),
    };
    let topic = Name::new("/arm_controller", "joint_trajectory").unwrap();
    let lookahead = Lookahead::new(&two_joints(), 0.05);
    let tick = MonoTime::from_nanos(1_000_000);
    // A gripper_command goal for joint `a` (1.0), with max_effort 40.
    let mut mw = Recorder::default();
    let mut goals = CommandPublisher::advertise(
        &mut mw,
        &Name::new("/gripper_controller", "gripper_cmd").unwrap(),
        &CommandGroup {
            joints: vec!["a".into()],
            indices: vec![0],
            topic: "/gripper_controller/gripper_cmd".into(),
            kind: CommandType::GripperCommand,
            rate_hz: 20.0,
            max_effort: 40.0,
        },
        &QosProfile::publisher_default(),
        0.005,
        true,
    )
    .unwrap();
    assert!(goals
        .publish(tick, Time::default(), &cmd, 0.0, &lookahead)
        .unwrap());
    let sent = mw.0.lock().unwrap();
    assert_eq!(sent[0].0, "control_msgs/action/GripperCommand_Goal");
    let payload = &theirs["command/control_msgs/action/GripperCommand_Goal"][4..];
    assert_eq!(&sent[0].1[..], payload, "gripper goal: bytes differ");
    drop(sent);
    for (kind, theirs_name, ty) in [
        (
            CommandType::JointState,
            "command/sensor_msgs/msg/JointState",
            "sensor_msgs/msg/JointState",
        ),
        (
            CommandType::Float64MultiArray,
            "command/std_msgs/msg/Float64MultiArray",
            "std_msgs/msg/Float64MultiArray",
        ),
    ] {
        let mut mw = Recorder::default();
        let qos = QosProfile::publisher_default();
        let mut publisher =
            CommandPublisher::advertise(&mut mw, &topic, &group(kind), &qos, 0.005, true).unwrap();
        assert_eq!(publisher.kind(), kind);
        let stamp = Time {
            sec: 12,
            nanosec: 5000,
        };
        assert!(publisher
            .publish(tick, stamp, &cmd, 0.0, &lookahead)
            .unwrap());
        let sent = mw.0.lock().unwrap();
        assert_eq!(sent.len(), 1, "{kind:?}");
        assert_eq!(sent[0].0, ty, "{kind:?}");
        let payload = &theirs[theirs_name][4..];
        let mine = &sent[0].1;
        assert_eq!(&mine[..], &payload[..mine.len()], "{kind:?}: bytes differ");
        assert!(payload[mine.len()..].iter().all(|b| *b == 0), "{kind:?}");
    }
}

/// The JointTrajectory command (its CDR checked against rosbags above) as sent: stamp zero,
/// points on the command's line (the command due one period after its tick, less the time
/// it waited), then braking to rest.
#[test]
fn when_command_published_as_trajectory_expect_stamp_zero_and_a_tail_to_rest() {
    let cmd = MotionState {
        position: JointVector::from_slice(&[1.0, 2.0]),
        velocity: JointVector::from_slice(&[0.5, -0.5]),
        acceleration: JointVector::from_slice(&[0.0, 0.25]),
    };
    let names = ["a".to_string(), "bb".to_string()];
    let topic = Name::new("/arm_controller", "joint_trajectory").unwrap();
    let mut mw = Recorder::default();
    let mut publisher = CommandPublisher::advertise(
        &mut mw,
        &topic,
        &group(CommandType::JointTrajectory),
        &QosProfile::publisher_default(),
        0.005,
        true,
    )
    .unwrap();
    let lookahead = Lookahead::new(&two_joints(), 0.05);
    let stamp = Time {
        sec: 12,
        nanosec: 5000,
    };
    // Sent 2 ms after its tick: due 3 ms after receipt.
    let tick = MonoTime::from_nanos(1_000_000);
    assert!(publisher
        .publish(tick, stamp, &cmd, 0.002, &lookahead)
        .unwrap());
    let sent = mw.0.lock().unwrap();
    assert_eq!(sent[0].0, "trajectory_msgs/msg/JointTrajectory");
    let (t, _) = cdr_encoding::from_bytes::<JointTrajectory, LittleEndian>(&sent[0].1).unwrap();
    assert_eq!(t.header.stamp, Time::default(), "zero: start on receipt");
    assert_eq!(t.joint_names, names);
    // The end of the 50 ms coast after the command (due 3 ms after receipt), `bb` still
    // slowing at 0.25 rad/s².
    let first = &t.points[0];
    let (c, a) = (0.05, 0.25);
    assert_eq!(
        first.positions,
        [1.0 + 0.5 * c, 2.0 - 0.5 * c + 0.5 * a * c * c]
    );
    assert_eq!(first.velocities, [0.5, -0.5 + a * c]);
    assert_eq!(first.accelerations, [0.0, 0.25]);
    assert_eq!(
        (first.time_from_start.sec, first.time_from_start.nanosec),
        (0, 53_000_000)
    );
    let ns = |p: &JointTrajectoryPoint| {
        p.time_from_start.sec as i64 * 1_000_000_000 + p.time_from_start.nanosec as i64
    };
    assert!(t.points.windows(2).all(|w| ns(&w[1]) > ns(&w[0])));
    let last = t.points.last().unwrap();
    assert_eq!(last.velocities, [0.0, 0.0]);
    // 50 ms coasting, then braking at 2 rad/s² to rest.
    assert!(
        (last.positions[0] - (1.0 + 0.025 + 0.0625)).abs() < 1e-9,
        "{last:?}"
    );
    let v = -0.5 + a * 0.05;
    let coast = -0.5 * 0.05 + 0.5 * a * 0.05 * 0.05;
    let brake = -v * v / 4.0;
    assert!(
        (last.positions[1] - (2.0 + coast + brake)).abs() < 1e-9,
        "{last:?}"
    );
}

/// An output of some joints, slower than the loop: its joints only, in its order, and only
/// as often as its rate lets it.
#[test]
fn when_an_output_has_some_joints_and_a_lower_rate_expect_those_joints_at_that_rate() {
    let cmd = MotionState::at_rest(JointVector::from_slice(&[1.0, 2.0, 3.0]));
    let gripper = CommandGroup {
        joints: vec!["g".into(), "a".into()],
        indices: vec![2, 0],
        topic: "/gripper/commands".into(),
        kind: CommandType::Float64MultiArray,
        rate_hz: 50.0,
        max_effort: 0.0,
    };
    let mut mw = Recorder::default();
    let topic = Name::new("/gripper", "commands").unwrap();
    let limits = RobotLimits::new(
        ["a", "b", "g"]
            .iter()
            .map(|n| JointLimits {
                name: n.to_string(),
                ..two_joints().joints[0].clone()
            })
            .collect(),
    );
    let mut p = CommandPublisher::advertise(
        &mut mw,
        &topic,
        &gripper,
        &QosProfile::publisher_default(),
        0.005,
        true,
    )
    .unwrap();
    let lookahead = Lookahead::new(&limits, 0.05);
    // 200 Hz ticks for 100 ms: 50 Hz sends every 4th.
    let sent: usize = (0..20)
        .map(|i| {
            let tick = MonoTime::from_nanos(1_000_000_000 + i * 5_000_000);
            p.publish(tick, Time::default(), &cmd, 0.0, &lookahead)
                .unwrap() as usize
        })
        .sum();
    assert_eq!(sent, 5);
    let msgs = mw.0.lock().unwrap();
    let (m, _) = cdr_encoding::from_bytes::<Float64MultiArray, LittleEndian>(&msgs[0].1).unwrap();
    assert_eq!(m.data, [3.0, 1.0]);
}
