use std::path::{Path, PathBuf};

use super::*;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn described(config: &str) -> Vec<String> {
    let cfg = Config::load(&repo(config)).unwrap_or_else(|e| panic!("{config}: {e}"));
    describe(&cfg)
}

fn line_with<'a>(lines: &'a [String], needle: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in {lines:#?}"))
}

#[test]
fn when_the_limits_table_is_printed_expect_each_joint_row_in_its_own_units() {
    let lines = described("config/sim.toml");
    let header = line_with(&lines, "joint                kind");
    assert!(header.ends_with("max_step  units"), "{header}");
    assert!(line_with(&lines, "limits in each joint's unit").contains("rad (revolute"));
    // sim_arm.urdf: a revolute shoulder, a prismatic gripper.
    let gripper = line_with(&lines, " prismatic ");
    assert!(gripper.ends_with("m, m/s, m/s², m/s³"), "{gripper}");
    let revolute = line_with(&lines, " revolute ");
    assert!(
        revolute.ends_with("rad, rad/s, rad/s², rad/s³"),
        "{revolute}"
    );
}

#[test]
fn when_the_io_is_ros_expect_every_input_and_output_topic_with_its_message_type() {
    let lines = described("config/ur5e.toml");
    for (what, ty) in [
        ("joint states on ", "sensor_msgs/msg/JointState"),
        ("input:  camera", "sensor_msgs/msg/"),
        ("prompt on ", "std_msgs/msg/String"),
        ("e-stop on ", "std_msgs/msg/Bool"),
        ("reset on ", "std_srvs/srv/Trigger"),
        ("output: commands for ", "_msgs/"),
        ("status on ", "diagnostic_msgs/msg/DiagnosticArray"),
    ] {
        let l = line_with(&lines, what);
        assert!(l.contains(ty), "{what:?} without {ty:?}: {l}");
    }
    // Each output names its topic as the configuration has it.
    let cfg = Config::load(&repo("config/ur5e.toml")).expect("ur5e.toml");
    let Io::Ros(r) = &cfg.io else {
        panic!("ur5e.toml is a ROS configuration")
    };
    for g in &r.commands {
        let l = line_with(
            &lines,
            &format!("output: commands for {}", g.joints.join(", ")),
        );
        assert!(l.contains(&format!(" on {} at ", g.topic)), "{l}");
        assert!(l.contains(command_type(g.kind)), "{l}");
    }
}

#[test]
fn when_the_io_is_sim_expect_no_ros_topics() {
    let lines = described("config/sim.toml");
    assert!(!lines.iter().any(|l| l.starts_with("input:")), "{lines:#?}");
}

#[test]
fn when_the_checkpoint_is_the_bundled_random_model_expect_it_said_and_a_trained_one_not() {
    let lines = described("config/ur5e.toml");
    let model = line_with(&lines, "model: ");
    assert!(model.contains("RANDOM weights"), "{model}");
    assert!(model.contains("tiny-pi0"), "{model}");
    for trained in ["config/hil_task.toml", "config/sim.toml"] {
        let lines = described(trained);
        let model = line_with(&lines, "model: ");
        assert!(model.contains("checkpoint"), "{trained}: {model}");
        assert!(!model.contains("RANDOM"), "{trained}: {model}");
    }
}

#[test]
fn when_the_simulator_has_a_task_expect_it_described_with_its_numbers() {
    let lines = described("config/sim.toml");
    let task = line_with(&lines, "sim task: ");
    assert!(
        task.contains("within 40 mm of it for 1 s, missed after 8 s"),
        "{task}"
    );
    let lines = described("config/hil.toml");
    assert!(
        !lines.iter().any(|l| l.starts_with("sim task")),
        "{lines:#?}"
    );
}

#[test]
fn when_a_checkpoint_carries_the_marker_expect_the_test_model_and_not_otherwise() {
    let dir = crate::test_dirs::TempDir::new("provenance");
    let ck = dir.join("ck");
    std::fs::create_dir_all(&ck).expect("mkdir");
    assert_eq!(provenance(&ck), Provenance::Checkpoint);
    assert_eq!(
        provenance(&ck.join("model.safetensors")),
        Provenance::Checkpoint
    );
    std::fs::write(ck.join(TEST_MODEL_MARKER), "random").expect("marker");
    assert_eq!(provenance(&ck), Provenance::BundledTestModel);
    // A bare .safetensors file beside the marker.
    assert_eq!(
        provenance(&ck.join("model.safetensors")),
        Provenance::BundledTestModel
    );
    assert_eq!(
        provenance(&repo("models/tiny-pi0")),
        Provenance::BundledTestModel
    );
    assert_eq!(
        provenance(&repo("models/hil-above-cube")),
        Provenance::Checkpoint
    );
}
