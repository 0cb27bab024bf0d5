//! The UR-class example end to end: `config/ur5e.toml` (UR5e-like URDF, the scaled
//! joint_trajectory_controller topic, a separately commanded gripper, a RealSense-style
//! compressed camera) run by the real binary against the Cyclone DDS peer playing that robot.
//! The peer checks every arm trajectory with its model of joint_trajectory_controller
//! (tests/peers/jtc_model.py, default parameters of humble, jazzy and rolling; the arm's six
//! joints are the controller's) and takes the gripper's Float64MultiArray at its own rate.
//! Only the policy differs from the example: the scripted motion, as no UR5e checkpoint ships.

mod common;

use std::process::Command;

use common::*;
use toml::Value;

const ARM: [&str; 6] = [
    "shoulder_pan_joint",
    "shoulder_lift_joint",
    "elbow_joint",
    "wrist_1_joint",
    "wrist_2_joint",
    "wrist_3_joint",
];
const GRIPPER: &str = "gripper_finger_joint";

fn example(domain: u16) -> toml::Table {
    let text = std::fs::read_to_string(root().join("config/ur5e.toml")).unwrap();
    let mut cfg: toml::Table = text.parse().unwrap();
    cfg["robot"]["urdf"] = Value::String(root().join("urdf/ur5e.urdf").display().to_string());
    let p = cfg["policy"].as_table_mut().unwrap();
    for key in ["checkpoint", "threads"] {
        p.remove(key);
    }
    p.insert("kind".into(), Value::String("scripted".into()));
    p.insert("amplitude".into(), Value::Float(0.3));
    p.insert("frequency_hz".into(), Value::Float(0.2));
    p.insert("latency_s".into(), Value::Float(0.08));
    let ros = cfg["ros"].as_table_mut().unwrap();
    ros.insert("domain_id".into(), Value::Integer(domain as i64));
    ros.insert("loopback_only".into(), Value::Boolean(true));
    // The Python peer publishes joint states at 100 Hz (the UR driver: 500 Hz).
    cfg["safety"]["joint_state_timeout_s"] = Value::Float(0.3);
    cfg
}

/// The Cyclone peer playing the UR5e (at most 9 s: ended once pi0d has exited; its six arm joints on the scaled JTC, the
/// gripper joint commanded as `gripper` says, the RealSense-style JPEG camera).
fn ur5e_peer(domain: u16, dir: &std::path::Path, gripper: &[&str]) -> std::process::Child {
    let joints: Vec<&str> = ARM.iter().copied().chain([GRIPPER]).collect();
    let joints = joints.join(",");
    let mut args = vec![
        "--duration",
        "9",
        "--joints",
        &joints,
        "--start",
        "0,-1.57,1.57,-1.57,-1.57,0,0.04",
        "--command-topic",
        "/scaled_joint_trajectory_controller/joint_trajectory",
        "--gripper-joints",
        GRIPPER,
        "--raw-topic",
        "",
        "--jpeg-topic",
        "/camera/camera/color/image_raw/compressed",
    ];
    args.extend(gripper);
    cyclone_peer(domain, &dir.join("peer.json"), &args)
}

#[test]
fn when_the_ur5e_example_runs_against_a_peer_playing_that_robot_expect_both_controllers_fed() {
    let domain = 20 + ((std::process::id() + 23) % 150) as u16;
    let cfg = example(domain);
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("ur5e");
    let peer = ur5e_peer(
        domain,
        &dir,
        &["--gripper-topic", "/gripper_position_controller/commands"],
    );
    let x = run_beside_peer(&dir, &cfg, peer, 5.0);
    let (s, r) = (&x.summary, &x.report);
    assert_eq!(s["limit_violations"], 0, "{s}");
    assert_eq!(s["limits_scale"], 0.25);
    assert!(
        s["chunks_accepted"].as_u64().unwrap() >= 3,
        "{s}\n{}",
        x.stderr
    );
    // The arm's controller: its six joints, every trajectory accepted and smooth. Limits are
    // the example's, scaled by 0.25: 1 rad/s² and 20 rad/s³.
    assert_eq!(strings(&r["joint_names"]), ARM);
    assert!(r["commands"].as_u64().unwrap() >= 300, "{r}");
    assert_controller_accepts(r, 1.0, 20.0);
    // The gripper's forward controller: its one joint at 50 Hz, not 200.
    let grip = r["gripper_commands"].as_u64().unwrap();
    let arm = r["commands"].as_u64().unwrap();
    assert!(grip >= 100 && grip * 3 < arm, "gripper {grip}, arm {arm}");
    assert_eq!(r["gripper_last"].as_array().unwrap().len(), 1);
    // The arm and the gripper moved.
    assert!(moved(r) > 0.01, "{r}");
    let g = r["gripper_last"][0].as_f64().unwrap();
    assert!(
        (0.002..=0.083).contains(&g) && (g - 0.04).abs() > 1e-4,
        "gripper at {g}"
    );
    // The RealSense-style camera reached the model's camera `front`.
    let diags = r["diagnostics"].as_array().unwrap();
    let running = diags
        .iter()
        .find(|d| d["message"] == "running")
        .unwrap_or_else(|| panic!("{r}"));
    let age: f64 = running["values"]["camera 0 age (s)"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.0..0.5).contains(&age), "camera age {age}");
}

#[test]
fn when_the_ur5e_example_is_checked_expect_it_valid_with_both_outputs_and_the_scaled_limits() {
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["check", "--config"])
        .arg(root().join("config/ur5e.toml"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for needle in [
        "on /scaled_joint_trajectory_controller/joint_trajectory at 200 Hz",
        "gripper_finger_joint as Float64MultiArray on /gripper_position_controller/commands at 50 Hz",
        "scaled to 0.25",
        "policy: pi0 loaded",
    ] {
        assert!(text.contains(needle), "`{needle}` not in:\n{text}");
    }
}

/// The example with its gripper behind gripper_action_controller instead: `gripper_command`
/// goals on `/gripper_controller/gripper_cmd` (rmw_cyclonedds's request layout, as the peer
/// serves it). The peer plays the controller: it accepts every goal with a new id, each
/// preempting the last, forwards the goal's position to the joint, and from 4.5 s on refuses
/// every goal (a controller that went inactive), which pi0d must report.
#[test]
fn when_the_gripper_is_behind_gripper_action_controller_expect_goals_it_accepts_and_refusals_reported(
) {
    let domain = 20 + ((std::process::id() + 61) % 150) as u16;
    let mut cfg = example(domain);
    let ros = cfg["ros"].as_table_mut().unwrap();
    ros.insert("service_mapping".into(), Value::String("cyclone".into()));
    let grip = ros["commands"].as_array_mut().unwrap()[1]
        .as_table_mut()
        .unwrap();
    grip.insert(
        "topic".into(),
        Value::String("/gripper_controller/gripper_cmd".into()),
    );
    grip.insert("type".into(), Value::String("gripper_command".into()));
    grip.remove("rate_hz");
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("ur5e-gripper-action");
    let peer = ur5e_peer(
        domain,
        &dir,
        &[
            "--gripper-action",
            "/gripper_controller/gripper_cmd",
            "--refuse-goals-after",
            "4.5",
        ],
    );
    let x = run_beside_peer(&dir, &cfg, peer, 6.0);
    let (s, r) = (&x.summary, &x.report);
    assert_eq!(s["limit_violations"], 0, "{s}");
    assert_controller_accepts(r, 1.0, 20.0);
    // Every goal: a fresh id, the URDF's effort limit (235 N), a position within the joint's
    // limits less its margin, at most ~20 a second; the refusals after 4.5 s reported.
    let accepted = assert_gripper_goals(
        r,
        &x.stderr,
        "/gripper_controller/gripper_cmd",
        235.0,
        0.002..=0.083,
        20,
    );
    // The gripper followed the accepted goals.
    let last = *accepted.last().unwrap();
    assert!((last - 0.04).abs() > 1e-4, "gripper stayed at {last}");
    assert_eq!(r["gripper_last"][0].as_f64().unwrap(), last);
}
