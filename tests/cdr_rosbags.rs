//! CDR byte-equality with `rosbags` (pure-Python CDR, whose bytes equal Cyclone DDS's) for every
//! message type pi0d exchanges, both directions: our serialization equals theirs byte for byte,
//! and their bytes decode into the same message.

mod common;

use std::collections::HashMap;
use std::process::Command;

use byteorder::LittleEndian;
use pi0d::io::ros::msgs::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn rosbags_bytes() -> HashMap<String, Vec<u8>> {
    let python = std::env::var("PI0D_PEER_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| common::root().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "{} missing: run ./tools/test.sh",
        python.display()
    );
    let out = Command::new(python)
        .arg(common::root().join("tests/peers/cdr_bytes.py"))
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
    assert_eq!(theirs.len(), 8, "every message type pi0d uses is compared");
}
