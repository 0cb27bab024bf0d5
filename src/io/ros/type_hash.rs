//! REP-2016 type hashes (`RIHS01_…`) of the ROS 2 types pi0d sends and receives, as ROS 2
//! Jazzy computes them. Made once by `tools/ros_type_hashes.py` from the message definitions
//! (it first reproduces published Jazzy hashes of other types); a unit test below checks this
//! table against the tool's output.

/// `(ROS type name, RIHS01 hash)`.
pub const TYPE_HASHES: &[(&str, &str)] = &[
    (
        "sensor_msgs/msg/JointState",
        "RIHS01_a13ee3a330e346c9d87b5aa18d24e11690752bd33a0350f11c5882bc9179260e",
    ),
    (
        "sensor_msgs/msg/Image",
        "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47",
    ),
    (
        "sensor_msgs/msg/CompressedImage",
        "RIHS01_15640771531571185e2efc8a100baf923961a4d15d5569652e6cb6691e8e371a",
    ),
    (
        "std_msgs/msg/String",
        "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18",
    ),
    (
        "std_msgs/msg/Bool",
        "RIHS01_feb91e995ff9ebd09c0cb3d2aed18b11077585839fb5db80193b62d74528f6c9",
    ),
    (
        "std_msgs/msg/Float64MultiArray",
        "RIHS01_1025ddc6b9552d191f89ef1a8d2f60f3d373e28b283d8891ddcc974e8c55397f",
    ),
    (
        "trajectory_msgs/msg/JointTrajectory",
        "RIHS01_179b33eba59d676f6d967ac71fe35e7ca2f64b2f3928f4a018cec115e213796e",
    ),
    (
        "diagnostic_msgs/msg/DiagnosticArray",
        "RIHS01_5a8a36efb05fb25070fa0fb3810290c0e6cd4862b54a8fb975a1ee8dc55a333e",
    ),
    (
        "std_srvs/srv/Trigger",
        "RIHS01_eeff2cd6fa5ad9d27cdf4dec64818317839b62f212a91e6b5304b634b2062c5f",
    ),
    (
        "control_msgs/action/GripperCommand_SendGoal",
        "RIHS01_6bf8cc4ce80cd499e7dd3258c03c50c3fa6672b469ff8355339ef1df77fcd212",
    ),
];

/// The hash of `ros_type` (`pkg/msg/Name`, `pkg/srv/Name` or an action's service
/// `pkg/action/Name_SendGoal`), if pi0d uses the type.
pub fn type_hash(ros_type: &str) -> Option<&'static str> {
    TYPE_HASHES
        .iter()
        .find(|(t, _)| *t == ros_type)
        .map(|(_, h)| *h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_well_formed_and_distinct() {
        for (i, (t, h)) in TYPE_HASHES.iter().enumerate() {
            let hex = h.strip_prefix("RIHS01_").expect(t);
            assert_eq!(hex.len(), 64, "{t}");
            assert!(hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(TYPE_HASHES[i + 1..].iter().all(|(_, o)| o != h), "{t}");
        }
        assert_eq!(type_hash("std_msgs/msg/Bool"), Some(TYPE_HASHES[4].1));
        assert_eq!(type_hash("std_msgs/msg/Int8"), None);
    }

    /// The table against `tools/ros_type_hashes.py`, which computes REP-2016 hashes from the
    /// message definitions (rosbags' Jazzy store) and, with `--check-known`, first reproduces
    /// published Jazzy hashes of other types.
    #[test]
    fn when_hashes_recomputed_from_definitions_expect_the_table() {
        let out = std::process::Command::new(crate::test_dirs::peer_python())
            .arg(crate::test_dirs::repo_path("tools/ros_type_hashes.py"))
            .arg("--check-known")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let computed: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(computed.len(), TYPE_HASHES.len());
        for (ty, hash) in TYPE_HASHES {
            assert_eq!(computed[*ty], *hash, "{ty}");
        }
    }
}
