//! The RIHS01 table in `src/io/ros/type_hash.rs` against `tools/ros_type_hashes.py`, which
//! computes REP-2016 hashes from the message definitions (rosbags' Jazzy store) and, with
//! `--check-known`, first reproduces published Jazzy hashes of other types.

use crate::common;

use std::process::Command;

use common::root;
use pi0d::testing::ros::TYPE_HASHES;

#[test]
fn when_hashes_recomputed_from_definitions_expect_the_table() {
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "run ./tools/test.sh: it makes the peers' venv"
    );
    let out = Command::new(python)
        .arg(root().join("tools/ros_type_hashes.py"))
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
